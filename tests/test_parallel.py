"""Data parallel on CPU: 2 processes give the results of 1, and their store resumes in 1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from mmcomp_eval.cli import main
from mmcomp_eval.runtime.parallel import ProcessInfo, current

from user_task import USER_TASK, USER_TEMPLATE


def test_process_info_from_launcher_variables(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("LOCAL_RANK", "2")
    assert current() == ProcessInfo(2, 4, 2) and not current().is_main


@pytest.fixture(scope="module")
def setup(tiny_llama_dir, tmp_path_factory):
    """A 9-document task (odd: the two shards differ in size) and its single-process run, sampled.

    Sampling makes the two seeds ask different requests (greedy decoding would
    answer seed 1 from seed 0's prompts) and checks that what is drawn does
    not depend on which process answers.
    """
    d = tmp_path_factory.mktemp("parallel")
    tasks = d / "tasks"
    tasks.mkdir()
    (tasks / "echo_task.yaml").write_text(USER_TASK)
    (tasks / "echo.jinja").write_text(USER_TEMPLATE)
    words = ["knife", "plate", "onion", "board", "pan", "spoon", "cup", "fork", "bowl"]
    (tasks / "docs.jsonl").write_text("".join(json.dumps({"id": f"w{i}", "word": w, "answer": w}) + "\n"
                                              for i, w in enumerate(words)))
    common = ["--model", "hf", "--model-args", f"pretrained={tiny_llama_dir},batch_size=2", "--tasks", "echo_task",
              "--include-path", str(tasks), "--no-progress", "--seeds", "2",
              "--gen-kwargs", "do_sample=true,temperature=1.5,top_k=0"]  # sampled answers must not depend on processes
    assert main([*common, "--cache-dir", str(d / "store1"), "--output-path", str(d / "one")]) == 0
    return SimpleNamespace(dir=d, common=common, one=json.loads((d / "one" / "results.json").read_text()),
                           samples=(d / "one" / "samples.jsonl").read_bytes(), model_dir=str(tiny_llama_dir))


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}


def test_num_processes_2_matches_1_and_resumes_in_1(setup, capsys):
    d, common = setup.dir, setup.common
    argv = [*common, "--num-processes", "2", "--cache-dir", str(d / "store2"), "--output-path", str(d / "two")]
    proc = subprocess.run([sys.executable, "-m", "mmcomp_eval", *argv], capture_output=True, text=True, timeout=300,
                          env=_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("| echo_task | test | 9 |") == 2  # one table (two metrics), printed once
    two = json.loads((d / "two" / "results.json").read_text())
    assert two["tasks"] == setup.one["tasks"]
    assert (d / "two" / "samples.jsonl").read_bytes() == setup.samples
    # the record says what the user typed, not what process 0 was started with, and how many processes answered
    assert two["command"][0].endswith("__main__.py") and two["command"][1:] == argv
    assert two["processes"] == {"count": 2, "launcher": "mmcomp-eval"}
    assert setup.one["processes"] == {"count": 1, "launcher": None}
    # every request was looked up once, by the process whose share it was: every other distinct request, counted
    # over both seeds' 18 (9 each); the counts are those of one process, summed
    assert (two["cache"]["hits"], two["cache"]["misses"]) == (0, 18) == (setup.one["cache"]["hits"],
                                                                         setup.one["cache"]["misses"])
    assert two["cache"]["processes"] == [{"rank": 0, "hits": 0, "misses": 9}, {"rank": 1, "hits": 0, "misses": 9}]
    assert not list((d / "store2" / "shards").iterdir())  # the helpers' reports are read and removed

    # the store written by 2 processes resumes in 1: nothing is asked again
    assert main([*common, "--cache-dir", str(d / "store2"), "--output-path", str(d / "again")]) == 0
    again = json.loads((d / "again" / "results.json").read_text())
    assert (again["cache"]["hits"], again["cache"]["misses"]) == (18, 0) and again["tasks"] == setup.one["tasks"]
    capsys.readouterr()


def test_accelerate_launch_matches_1(setup):
    d = setup.dir
    proc = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                           "-m", "mmcomp_eval", *setup.common, "--cache-dir", str(d / "store3"),
                           "--output-path", str(d / "accel")], capture_output=True, text=True, timeout=300, env=_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    accel = json.loads((d / "accel" / "results.json").read_text())
    assert accel["tasks"] == setup.one["tasks"] and (d / "accel" / "samples.jsonl").read_bytes() == setup.samples
    assert accel["cache"]["processes"] == [{"rank": 0, "hits": 0, "misses": 9}, {"rank": 1, "hits": 0, "misses": 9}]
    assert accel["processes"] == {"count": 2, "launcher": "torchrun"}
    # the launcher's command line (the parent of every worker), not a worker's argv
    assert accel["command"][1:3] == ["-m", "accelerate.commands.launch"] and accel["command"][-4:] == [
        "--cache-dir", str(d / "store3"), "--output-path", str(d / "accel")]


def test_evaluate_with_num_processes_returns_process_0s_record(setup):
    """The Python entry point starts the processes itself and hands back the record process 0 wrote."""
    from mmcomp_eval import evaluate

    d = setup.dir
    results = evaluate("hf", "echo_task", model_args={"pretrained": setup.model_dir, "batch_size": 2},
                       include_paths=[d / "tasks"], seeds=[0, 1], progress=False, num_processes=2,
                       gen_kwargs={"do_sample": True, "temperature": 1.5, "top_k": 0},
                       cache_dir=d / "store4", output_path=d / "api")
    written = json.loads((d / "api" / "results.json").read_text())
    assert results["tasks"] == written["tasks"] == setup.one["tasks"]
    assert [(p["hits"], p["misses"]) for p in results["cache"]["processes"]] == [(0, 9), (0, 9)]
    assert results["command"] == sys.argv and results["processes"]["count"] == 2
