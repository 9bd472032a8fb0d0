"""The ``gold`` model: reference answers must score every metric's maximum on every built-in task."""

from __future__ import annotations

import json

import pytest

from mmcomp_eval.tasks.index import TaskIndex
from user_task import make_user_tasks, run_cli

#: gold answers text; the retrieval tasks rank embeddings and are run in tests/test_retrieval_tasks.py
BUILTIN = sorted(name for name, t in TaskIndex.build().tasks.items() if t.output_type != "retrieval")


def test_every_builtin_task_is_covered():
    # compact_nup_idefics needs no keyframes here: gold answers from the document, never a prompt
    assert {"compact_nup", "compact_verb", "compact_noun", "compact_nup_random", "compact_verb_random",
            "compact_noun_random", "compact_nup_idefics"} <= set(BUILTIN)


@pytest.mark.data
def test_gold_scores_100_on_every_builtin_task(reference_ek100, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MMCOMP_MEDIA_DIR", raising=False)  # no frames anywhere
    out_dir = tmp_path / "gold"
    rc, out, err = run_cli(capsys, "--model", "gold", "--tasks", ",".join(BUILTIN), "--ek100-dir",
                           str(reference_ek100), "--output-path", str(out_dir), "--no-progress", "--no-cache")
    assert rc == 0, err
    results = json.loads((out_dir / "results.json").read_text())["tasks"]
    assert sorted(results) == BUILTIN
    for task, record in results.items():
        assert record["n_documents"] > 2000 and record["n_skipped"] == 0, task
        for metric, values in record["metrics"].items():
            assert values["mean"] == 100.0 and values["stderr"] == 0.0, (task, metric)
        ca = record["metric_details"]["category_accuracy"]
        # the identity rule is what lifts CA from the map's ceiling (12 test texts carry a minority pair) to 100
        assert ca["scored"] == record["n_documents"] and ca["unmapped"] == 0
        assert ca["right_by_identity_only"] < 0.01 * ca["scored"], task
    samples = [json.loads(line) for line in (out_dir / "samples.jsonl").read_text().splitlines()]
    assert all(s["prediction"] == s["target"] and set(s["scores"].values()) == {100.0} for s in samples)
    n_test = results["compact_nup"]["n_documents"]
    assert f"| compact_nup | test | {n_test} | 0 | bleu | 100.00 | 0.00 | 0.00 | 1 |" in out  # mean, stderr, std


def test_gold_on_a_user_task_and_refuses_prompts(tmp_path, capsys):
    from mmcomp_eval.api.request import GenerationRequest, GenerationSettings
    from mmcomp_eval.errors import UserError
    from mmcomp_eval.models import create_model

    user_tasks = make_user_tasks(tmp_path)
    rc, _, err = run_cli(capsys, "--model", "gold", "--tasks", "echo_task", "--include-path", str(user_tasks),
                         "--output-path", str(tmp_path / "o"), "--no-progress", "--seeds", "2")
    assert rc == 0, err
    task = json.loads((tmp_path / "o" / "results.json").read_text())["tasks"]["echo_task"]
    assert {m: v["per_seed"] for m, v in task["metrics"].items()} == {"exact_match": [100.0, 100.0],
                                                                      "bleu": [100.0, 100.0]}
    with pytest.raises(UserError, match="model 'gold' answers from documents"):
        create_model("gold").generate([GenerationRequest("d", "prompt", GenerationSettings())])
