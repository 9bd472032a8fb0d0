"""The command line end to end: real runs, user tasks, and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from user_task import USER_TASK, make_user_tasks, run_cli


@pytest.fixture
def user_tasks(tmp_path):
    return make_user_tasks(tmp_path)


def test_user_task_from_include_path_runs_end_to_end(user_tasks, tiny_llama_dir, tmp_path, capsys):
    out_dir = tmp_path / "out"
    rc, out, err = run_cli(capsys, "--model", "hf", "--model-args", f"pretrained={tiny_llama_dir},batch_size=4",
                        "--tasks", "echo_task", "--include-path", str(user_tasks), "--output-path", str(out_dir),
                        "--no-progress", "--seeds", "2")
    assert rc == 0, err
    assert "| echo_task | test | 6 | 2 | exact_match |" in out
    results = json.loads((out_dir / "results.json").read_text())
    task = results["tasks"]["echo_task"]
    assert task["n_documents"] == 6 and task["shots"] == 2 and task["seeds"] == [0, 1]
    assert set(task["metrics"]) == {"exact_match", "bleu"}
    assert len(task["metrics"]["bleu"]["per_seed"]) == 2
    assert results["model"]["fingerprint"]["pretrained"] == str(tiny_llama_dir)
    samples = [json.loads(line) for line in (out_dir / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 12
    first = samples[0]
    assert first["prompt"] == "Repeat the word.\nword: plate => plate\nword: onion => onion\nword: knife =>"
    assert first["shot_ids"] == ["w1", "w2"]  # "first" sampler skips the query itself
    assert first["target"] == "knife"
    assert first["prediction"] == first["prediction"].strip()
    assert set(first["scores"]) == {"exact_match", "bleu"}


def test_ls_and_validate(user_tasks, capsys):
    rc, out, _ = run_cli(capsys, "ls", "tasks", "--include-path", str(user_tasks))
    assert rc == 0 and "echo_task" in out and "compact_nup" in out
    rc, out, _ = run_cli(capsys, "ls", "models")
    assert rc == 0 and "smollm2-135m" in out and "mrh" in out
    rc, out, _ = run_cli(capsys, "ls", "metrics")
    assert rc == 0 and "bleu" in out and "category_accuracy" in out
    rc, out, _ = run_cli(capsys, "validate", str(user_tasks / "echo_task.yaml"))
    assert rc == 0
    assert "word: plate => plate\nword: onion => onion\nword: knife =>" in out


@pytest.mark.parametrize("argv, fragment", [
    (["--model", "mrh", "--tasks", "compact_nupp"], "unknown task 'compact_nupp' (did you mean 'compact_nup'?)"),
    (["--model", "smolm2-135m", "--tasks", "echo_task"], "unknown model 'smolm2-135m'"),
    (["--model", "mrh", "--tasks", "echo_task", "--limit", "-3"], "--limit -3"),
    (["--model", "hf", "--model-args", "pretrained=x,,", "--tasks", "echo_task"], "model-args"),
])
def test_bad_input_is_one_line_exit_2(user_tasks, capsys, argv, fragment):
    rc, out, err = run_cli(capsys, *argv, "--include-path", str(user_tasks), "--no-progress")
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mmcomp-eval: error:"), err
    assert fragment in lines[0]


def test_shots_larger_than_pool(user_tasks, tiny_llama_dir, capsys):
    rc, _, err = run_cli(capsys, "--model", "hf", "--model-args", f"pretrained={tiny_llama_dir}", "--tasks", "echo_task",
                      "--shots", "9", "--include-path", str(user_tasks), "--no-progress")
    assert rc == 2 and "--shots 9 is larger than the few-shot pool (6 documents, the query excluded)" in err


def test_bad_task_files_are_one_line_errors(user_tasks, capsys):
    (user_tasks / "echo_task.yaml").write_text(USER_TASK.replace("target_field", "target_feild"))
    rc, _, err = run_cli(capsys, "ls", "tasks", "--include-path", str(user_tasks))
    assert rc == 2 and "unknown key 'target_feild' (did you mean 'target_field'?)" in err
    (user_tasks / "echo_task.yaml").write_text(USER_TASK)
    (user_tasks / "echo.jinja").write_text("{{ doc.wrd }}")
    rc, _, err = run_cli(capsys, "validate", str(user_tasks / "echo_task.yaml"))
    assert rc == 2 and "wrd" in err and len(err.strip().splitlines()) == 1


def test_console_script_exit_code_without_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("task: [oops\n")
    proc = subprocess.run([sys.executable, "-m", "mmcomp_eval", "validate", str(bad)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "malformed YAML" in proc.stderr


def test_smollm2_five_shot_compact_nup(reference_ek100, tmp_path, capsys):
    """The README's main job, on 6 documents: real model, real data, offline, deterministic."""
    runs = []
    for name in ("a", "b"):
        out_dir = tmp_path / name
        rc, out, err = run_cli(capsys, "--model", "smollm2-135m", "--tasks", "compact_nup", "--shots", "5",
                            "--limit", "6", "--offline", "--no-progress", "--ek100-dir", str(reference_ek100),
                            "--output-path", str(out_dir), "--no-cache")  # b must really run the model again
        assert rc == 0, err
        runs.append(out_dir)
    res = json.loads((runs[0] / "results.json").read_text())["tasks"]["compact_nup"]
    assert set(res["metrics"]) == {"bleu", "exact_match", "category_accuracy", "bertscore"}
    assert res["n_documents"] == 6 and res["shots"] == 5
    assert 0 < res["metrics"]["bertscore"]["mean"] <= 100
    samples = [json.loads(line) for line in (runs[0] / "samples.jsonl").read_text().splitlines()]
    assert all(len(s["shot_ids"]) == 5 and s["doc_id"] not in s["shot_ids"] for s in samples)
    assert samples[0]["prompt"].startswith("Predict the next narration given 3 sequential previous narrations")
    assert samples[0]["prompt"].endswith("=>")
    assert all(s["prediction"] == s["prediction"].strip() for s in samples)
    assert any(s["prediction"] for s in samples)
    assert (runs[0] / "samples.jsonl").read_text() == (runs[1] / "samples.jsonl").read_text()


def test_mrh_through_the_evaluator_matches_the_builder(reference_ek100, tmp_path, capsys):
    from mmcomp_eval.data.compact_build import build_compact, load_split
    from mmcomp_eval.models.mrh import mrh_atom_scores

    expected = mrh_atom_scores(load_split(build_compact(reference_ek100).directory, "compositional", "test"))
    rc, _, err = run_cli(capsys, "--model", "mrh", "--tasks", "compact_verb,compact_noun", "--no-progress",
                      "--ek100-dir", str(reference_ek100), "--output-path", str(tmp_path / "o"))
    assert rc == 0, err
    tasks = json.loads((tmp_path / "o" / "results.json").read_text())["tasks"]
    assert tasks["compact_verb"]["metrics"]["exact_match"]["mean"] == pytest.approx(expected["verb_em"], abs=0.006)
    # CA of a text prediction maps the text to a class; the builder takes the clip's annotated class.
    # They differ where a clip's class is not the one its text maps to: on the builder-3 test split
    # 3 verbs ("tip" annotated 20, "get" 12, "turn" 22) and 3 nouns ("cookies_packet" 104, "spinach"
    # 62, "chilli" 54), a net one document each (0.05 points).
    assert tasks["compact_verb"]["metrics"]["category_accuracy"]["mean"] == pytest.approx(expected["verb_ca"], abs=0.15)
    assert tasks["compact_noun"]["metrics"]["exact_match"]["mean"] == pytest.approx(expected["noun_em"], abs=0.006)
    assert tasks["compact_noun"]["metrics"]["category_accuracy"]["mean"] == pytest.approx(expected["noun_ca"], abs=0.15)


RANK_TASK = """
task: rank_verbs
dataset:
  name: jsonl
  options:
    files: {test: docs.jsonl, train: docs.jsonl}
target_field: answer
answer_kind: verb
output_type: rank_choices
choices: ek100_verb_classes
prompt: {template: echo.jinja, instruction: "Which verb?"}
fewshot: {sampler: none, k: 0}
metrics: [exact_match]
"""


def test_atom_classification_by_ranking_class_names(user_tasks, tiny_llama_dir, tiny_ek100, tmp_path, capsys):
    """rank_choices scores every EK-100 class name and predicts the most likely one."""
    from conftest import VERB_CLASSES

    (user_tasks / "rank_verbs.yaml").write_text(RANK_TASK)
    out_dir = tmp_path / "rank"
    rc, out, err = run_cli(capsys, "--model", "hf", "--model-args", f"pretrained={tiny_llama_dir}", "--tasks",
                        "rank_verbs", "--include-path", str(user_tasks), "--ek100-dir", str(tiny_ek100),
                        "--output-path", str(out_dir), "--no-progress")
    assert rc == 0, err
    samples = [json.loads(line) for line in (out_dir / "samples.jsonl").read_text().splitlines()]
    class_names = {key.replace("-", " ") for _, key, _, _ in VERB_CLASSES}
    assert len(samples) == 6
    assert all(s["prediction"] in class_names for s in samples)


def test_review_fixes_bad_inputs_are_one_line_errors(user_tasks, tmp_path, capsys):
    # two metrics with one name would overwrite each other's results
    (user_tasks / "echo_task.yaml").write_text(USER_TASK.replace("metrics: [exact_match, bleu]",
                                                                 "metrics: [bleu, {name: bleu, options: {max_n: 4}}]"))
    rc, _, err = run_cli(capsys, "ls", "tasks", "--include-path", str(user_tasks))
    assert rc == 2 and "metric 'bleu' is listed twice" in err
    (user_tasks / "echo_task.yaml").write_text(USER_TASK)
    # a JSONL line that is JSON but not an object
    (user_tasks / "docs.jsonl").write_text('{"id": "a", "word": "x", "answer": "x"}\n5\n')
    rc, _, err = run_cli(capsys, "validate", str(user_tasks / "echo_task.yaml"))
    assert rc == 2 and "docs.jsonl:2: expected a JSON object per line, got int" in err
    # mrh on documents without context + target lists
    (user_tasks / "docs.jsonl").write_text('{"id": "a", "word": "x", "answer": "x", "verbs": ["v"], "nouns": ["n"]}\n')
    rc, _, err = run_cli(capsys, "--model", "mrh", "--tasks", "echo_task", "--include-path", str(user_tasks),
                      "--no-progress", "--no-cache")
    assert rc == 2 and "has no 'verbs'/'nouns' lists" in err


def test_failed_checks_keep_previous_result_files(user_tasks, tmp_path, capsys):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "samples.jsonl").write_text("previous run\n")
    rc, _, err = run_cli(capsys, "--model", "mrh", "--tasks", "echo_task", "--include-path", str(user_tasks),
                      "--split", "tst", "--output-path", str(out_dir), "--no-progress")
    assert rc == 2
    assert (out_dir / "samples.jsonl").read_text() == "previous run\n"
    afile = tmp_path / "afile"
    afile.write_text("")
    rc, _, err = run_cli(capsys, "--model", "mrh", "--tasks", "echo_task", "--include-path", str(user_tasks),
                      "--output-path", str(afile), "--no-progress")
    assert rc == 2 and "--output-path" in err and "Traceback" not in err
