"""lm-evaluation-harness habits: its flag spellings, --tasks list, globs, fractional --limit, --predict-only,
stage lines, kept earlier results and the stderr column."""

from __future__ import annotations

import json
import re

import pytest

from mmcomp_eval import evaluate
from mmcomp_eval.api.model import Model
from mmcomp_eval.errors import UserError

from user_task import make_user_tasks, run_cli


@pytest.fixture
def user_tasks(tmp_path):
    return make_user_tasks(tmp_path)


class CountingEcho(Model):
    """Answers the query word (right on every echo document) and counts the requests it was asked."""

    name = "counting-echo"

    def __init__(self):
        self.asked = 0

    def generate(self, requests, progress=None):
        self.asked += len(requests)
        return [" " + r.prompt.rsplit("word: ", 1)[1].split(" =>")[0] for r in requests]


@pytest.fixture
def echo_adapter(monkeypatch):
    from mmcomp_eval.models import MODELS

    monkeypatch.setitem(MODELS._items, CountingEcho.name, CountingEcho)


def _config_and_samples(out_dir):
    results = json.loads((out_dir / "results.json").read_text())
    samples = [json.loads(line) for line in (out_dir / "samples.jsonl").read_text().splitlines()]
    return results, samples


def test_lm_eval_spellings_run_the_same_evaluation(user_tasks, tiny_llama_dir, tmp_path, capsys):
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    rc, _, err = run_cli(capsys, "--model", "hf", "--model-args", f"pretrained={tiny_llama_dir},batch_size=2",
                         "--tasks", "echo_task", "--include-path", str(user_tasks), "--shots", "1",
                         "--gen-kwargs", "max_new_tokens=3", "--output-path", str(ours), "--batch-size", "3",
                         "--device", "cpu", "--seed", "4", "--system-instruction", "Be brief.", "--no-progress")
    assert rc == 0, err
    # lm-eval's underscores, space-separated model args and the no-op --log_samples
    rc, _, err = run_cli(capsys, "--model", "hf", "--model_args", f"pretrained={tiny_llama_dir}", "batch_size=2",
                         "--tasks", "echo_task", "--include_path", str(user_tasks), "--num_fewshot", "1",
                         "--gen_kwargs", "max_new_tokens=3", "--output_path", str(theirs), "--batch_size", "3",
                         "--device", "cpu", "--seed", "4", "--system_instruction", "Be brief.", "--log_samples",
                         "--no-progress")
    assert rc == 0, err
    (r1, s1), (r2, s2) = _config_and_samples(ours), _config_and_samples(theirs)
    assert r1["config"] == r2["config"] and r1["model"]["args"] == r2["model"]["args"]
    assert str(r1["model"]["args"]["batch_size"]) == "3" and r1["model"]["args"]["device"] == "cpu"
    assert r1["tasks"]["echo_task"]["shots"] == 1 and r1["tasks"]["echo_task"]["seeds"] == [4]
    assert r1["tasks"]["echo_task"]["generation"]["max_new_tokens"] == 3
    assert [s["prompt"] for s in s1] == [s["prompt"] for s in s2]
    assert s1[0]["prompt"].startswith("Be brief.\n\nRepeat the word.\nword: ")
    assert [s["raw_output"] for s in s1] == [s["raw_output"] for s in s2]


def test_chat_template_flags_take_lm_eval_forms(user_tasks, echo_adapter, capsys):
    rc, _, err = run_cli(capsys, "--model", "counting-echo", "--tasks", "echo_task", "--include-path", str(user_tasks),
                         "--fewshot_as_multiturn")
    assert rc == 2 and "--fewshot_as_multiturn needs --apply-chat-template" in err
    rc, _, err = run_cli(capsys, "--model", "counting-echo", "--tasks", "echo_task", "--apply_chat_template", "chatml")
    assert rc == 2 and "named templates are not supported" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("flag, suggestion", [
    ("--num_fewshots", "--num_fewshot"), ("--num-fewshots", "--num-fewshot"), ("--modelargs", "--model-args"),
    ("--outptu_path", "--output_path"), ("--verbose", "--verbosity"),
])
def test_unknown_flag_gets_a_did_you_mean(user_tasks, echo_adapter, capsys, flag, suggestion):
    rc, out, err = run_cli(capsys, "--model", "counting-echo", "--tasks", "echo_task", flag, "1")
    assert rc == 2 and out == ""
    assert err.strip().splitlines() == [
        f"mmcomp-eval: error: unrecognized argument '{flag}' (did you mean '{suggestion}'?); "
        "see `mmcomp-eval run --help`"]


def test_tasks_list_and_ls_tasks_show_output_type_and_description(user_tasks, capsys):
    rc, listed, _ = run_cli(capsys, "--tasks", "list", "--include_path", str(user_tasks))
    assert rc == 0
    rc, ls, _ = run_cli(capsys, "ls", "tasks", "--include-path", str(user_tasks))
    assert rc == 0 and ls == listed
    nup = next(line for line in ls.splitlines() if line.startswith("compact_nup "))
    assert nup.split()[1] == "generate" and "CompAct next utterance prediction" in nup
    assert next(line for line in ls.splitlines() if line.startswith("echo_task ")).split()[1] == "generate"
    assert re.search(r"^compact +group +compact_nup, ", ls, re.M)
    assert all("(no description)" not in line for line in ls.splitlines() if line.startswith("compact"))
    assert "(no description)" in next(line for line in ls.splitlines() if line.startswith("echo_task "))


def test_ls_models_lists_every_preset_with_its_description(capsys):
    from mmcomp_eval.models import MODELS

    rc, out, _ = run_cli(capsys, "ls", "models")
    assert rc == 0
    lines = {line.split()[0]: line for line in out.splitlines()}
    for name, spec in MODELS.presets().items():
        assert "preset of " + spec.adapter in lines[name]
        assert " ".join(spec.description.split()) in lines[name]
    assert set(lines) == set(MODELS) | set(MODELS.presets())
    assert "retrieval preset of clip" in lines["clip-b32"] and "retrieval" not in lines["smollm2-135m"]
    assert "retrieval adapter" in lines["fusion"] and "retrieval" not in lines["hf_vlm"]
    assert "(no description)" not in out


def test_glob_patterns_and_fractional_limit(user_tasks, tmp_path):
    results = evaluate(CountingEcho(), ["echo_*"], include_paths=[user_tasks], limit=0.5, no_cache=True,
                       progress=False)
    assert list(results["tasks"]) == ["echo_task"] and results["tasks"]["echo_task"]["n_documents"] == 3
    results = evaluate(CountingEcho(), "echo_task", include_paths=[user_tasks], limit=0.1, no_cache=True,
                       progress=False)
    assert results["tasks"]["echo_task"]["n_documents"] == 1  # ceil(6 * 0.1), as lm-eval rounds
    compact = [t for t in evaluate.__globals__["TaskIndex"].build(()).resolve(["compact_*"])]
    assert {"compact_nup", "compact_verb", "compact_noun"} <= {t.task for t in compact}
    assert all(t.task.startswith("compact_") for t in compact)
    with pytest.raises(UserError, match="task pattern 'nope_\\*' matches no task"):
        evaluate(CountingEcho(), "nope_*", include_paths=[user_tasks], no_cache=True)
    with pytest.raises(UserError, match="--limit 1.5"):
        evaluate(CountingEcho(), "echo_task", include_paths=[user_tasks], limit=1.5, no_cache=True)


def test_limit_fraction_on_the_command_line(user_tasks, echo_adapter, capsys):
    rc, out, err = run_cli(capsys, "--model", "counting-echo", "--tasks", "echo_task", "--include-path", str(user_tasks),
                           "--limit", "0.34", "--no-progress", "--no-cache")
    assert rc == 0 and "| echo_task | test | 3 | 2 | exact_match | 100.00 |" in out, err  # ceil(6 * 0.34)


def test_predict_only_stores_answers_and_a_rerun_scores_them(user_tasks, tmp_path):
    store, model = tmp_path / "store", CountingEcho()
    first = evaluate(model, "echo_task", include_paths=[user_tasks], cache_dir=store, predict_only=True,
                     output_path=tmp_path / "out", progress=False)
    task = first["tasks"]["echo_task"]
    assert model.asked == 6 and task["scored"] is False and task["metrics"] == {}
    assert first["config"]["predict_only"] is True and first["gaps"] == []
    samples = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    assert [s["prediction"] for s in samples] == ["knife", "plate", "onion", "board", "pan", "spoon"]
    assert all(s["scores"] == {} for s in samples)
    from mmcomp_eval.evaluation.report import markdown_table

    assert "| echo_task | test | 6 | 2 | (not scored: --predict-only;" in markdown_table(first)

    fresh = CountingEcho()
    second = evaluate(fresh, "echo_task", include_paths=[user_tasks], cache_dir=store, progress=False)
    assert fresh.asked == 0  # every answer from the store
    assert second["cache"]["hits"] == 6 and second["cache"]["misses"] == 0
    assert second["tasks"]["echo_task"]["scored"] is True
    assert second["tasks"]["echo_task"]["metrics"]["exact_match"]["mean"] == 100.0


def test_compare_refuses_a_predict_only_run(user_tasks, tmp_path, capsys):
    evaluate(CountingEcho(), "echo_task", include_paths=[user_tasks], no_cache=True, predict_only=True,
             output_path=tmp_path / "p", progress=False)
    rc, _, err = run_cli(capsys, "compare", str(tmp_path / "p"), str(tmp_path / "p"))
    assert rc == 2 and "a --predict-only run, with answers but no scores" in err


def test_reruns_keep_earlier_results_and_compare_reads_the_latest(user_tasks, tmp_path, capsys):
    out = tmp_path / "out"
    evaluate(CountingEcho(), "echo_task", include_paths=[user_tasks], no_cache=True, output_path=out, limit=2,
             progress=False)
    evaluate(CountingEcho(), "echo_task", include_paths=[user_tasks], no_cache=True, output_path=out, limit=4,
             progress=False)
    dated = sorted(out.glob("results_*.json"))
    assert len(dated) == 2 and len(sorted(out.glob("samples_*.jsonl"))) == 2
    earlier, latest = (json.loads(p.read_text()) for p in dated)
    assert earlier["tasks"]["echo_task"]["n_documents"] == 2 and latest["tasks"]["echo_task"]["n_documents"] == 4
    assert (out / "results.json").read_bytes() == dated[1].read_bytes()
    assert latest["files"] == {"results": dated[1].name, "samples": dated[1].name.replace("results_", "samples_")
                               .replace(".json", ".jsonl")}
    assert (out / "samples.jsonl").read_bytes() == (out / latest["files"]["samples"]).read_bytes()
    rc, report, err = run_cli(capsys, "compare", str(out), str(dated[1]))
    assert rc == 0, err  # results.json and the dated file it points at are the same run


def test_runs_say_what_they_do_and_verbosity_quietens_them(user_tasks, echo_adapter, tmp_path, capsys):
    argv = ["--model", "counting-echo", "--tasks", "echo_task", "--include-path", str(user_tasks), "--no-progress",
            "--cache-dir", str(tmp_path / "store"), "--output-path", str(tmp_path / "out")]
    rc, out, err = run_cli(capsys, *argv)
    assert rc == 0, err
    for stage in ("task echo_task: 6 test documents, 2 shots, metrics exact_match, bleu", "loading model counting-echo",
                  "task echo_task seed 0: 6 generate requests", "0 of 6 answers from the response store",
                  "task echo_task seed 0: scoring", "results: "):
        assert stage in err, stage
    # the bootstrap standard error is in the table, as lm-eval prints it
    assert re.search(r"\| echo_task \| test \| 6 \| 2 \| exact_match \| 100\.00 \| 0\.00 \| 0\.00 \| 1 \|", out), out
    assert "stderr: bootstrap standard error" in out
    rc, _, err = run_cli(capsys, *argv, "--verbosity", "WARNING")
    assert rc == 0 and err == ""
    rc, _, err = run_cli(capsys, *argv, "--verbosity", "loud")
    assert rc == 2 and "--verbosity" in err and len(err.strip().splitlines()) == 1


def test_compact_runs_say_where_the_splits_come_from(reference_ek100, tmp_path, capsys):
    rc, out, err = run_cli(capsys, "--model", "gold", "--tasks", "compact_verb", "--limit", "2", "--ek100-dir",
                           str(reference_ek100), "--offline", "--no-progress", "--no-cache")
    assert rc == 0, err
    assert "CompAct splits from the cache: " in err or "building CompAct from the EK-100 annotations" in err
    assert "task compact_verb seed 0: gold reads 2 documents" in err
    assert "| compact_verb | test | 2 | 0 | exact_match | 100.00 | 0.00 | 0.00 | 1 |" in out  # gold: no prompt, no shots


def test_greedy_as_lm_eval_writes_it_and_run_options_checked_for_every_task(user_tasks, tmp_path, capsys):
    run = dict(include_paths=[user_tasks], no_cache=True, progress=False)
    # lm-eval's greedy: temperature=0 (its HF model samples only above 0), alone or with do_sample=false
    for gen in ("temperature=0", "do_sample=false,temperature=0"):
        results = evaluate(CountingEcho(), "echo_task", gen_kwargs=gen, **run)
        assert results["tasks"]["echo_task"]["generation"]["do_sample"] is False
        assert results["tasks"]["echo_task"]["generation"]["temperature"] == 1.0  # the built-in default, unused
    # an unknown sampler or a negative seed is refused even where no task draws shots with it
    with pytest.raises(UserError, match="unknown few-shot sampler 'bogus'"):
        evaluate(CountingEcho(), "echo_task", sampler="bogus", **run)
    with pytest.raises(UserError, match="--seed -5: expected a whole number, 0 or more"):
        evaluate(CountingEcho(), "echo_task", seeds=[-5], **run)
    # lm-eval's --use_cache names the folder of answers kept between runs: ours is the response store
    store = tmp_path / "lm_eval_cache"
    rc, _, err = run_cli(capsys, "--model", "hf", "--model-args", f"pretrained={tmp_path / 'missing'}",
                         "--tasks", "echo_task", "--include-path", str(user_tasks), "--use_cache", str(store),
                         "--no-progress")
    assert rc == 2 and "does not exist" in err and store.is_dir()  # the store was opened there before the load
