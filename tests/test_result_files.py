"""Result files: a failed, killed, full-disk or concurrent run never costs the previous complete run."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mmcomp_eval.runtime import atomic_files
from mmcomp_eval.api.model import Model
from mmcomp_eval.errors import UserError
from mmcomp_eval.evaluation.evaluator import RunOptions, run
from mmcomp_eval.evaluation.results import ResultWriter
from mmcomp_eval.tasks.index import TaskIndex

from disk_faults import fill, read_only_folder, small_disk
from user_task import USER_TASK, USER_TEMPLATE, WORDS, run_cli

TASKS = ("echo_a", "echo_b", "echo_c")


class Crash(Exception):
    pass


class Echo(Model):
    """Repeats the query word (padded with ``pad`` characters); raises on the task whose instruction names ``crash_on``."""

    name = "echo"

    def __init__(self, pad: int = 0, crash_on: str | None = None):
        self.pad = pad
        self.crash_on = crash_on

    def generate(self, requests, progress=None):
        if self.crash_on and any(f"task {self.crash_on}." in r.prompt for r in requests):
            raise Crash
        return [" " + r.prompt.split("=>")[-2].split()[-1] + "x" * self.pad for r in requests]


@pytest.fixture
def tasks(tmp_path) -> tuple[Path, TaskIndex]:
    d = tmp_path / "tasks"
    d.mkdir()
    for name in TASKS:
        (d / f"{name}.yaml").write_text(USER_TASK.replace("task: echo_task", f"task: {name}")
                                        .replace("Repeat the word.", f"Repeat the word for task {name}."))
    (d / "echo.jinja").write_text(USER_TEMPLATE)
    (d / "docs.jsonl").write_text("".join(json.dumps({"id": f"w{i}", "word": w, "answer": w}) + "\n"
                                          for i, w in enumerate(WORDS)))
    return d, TaskIndex.build((d,))


def evaluate(tasks, out: Path, model: Model, progress: bool = False) -> None:
    folder, index = tasks
    opts = RunOptions(seeds=(0,), include_paths=(folder,), progress=progress)
    with ResultWriter(out) as writer:
        run(index.resolve(list(TASKS)), model, {"name": model.name}, opts, index, writer)


def pair(out: Path) -> tuple[bytes, bytes]:
    return (out / "results.json").read_bytes(), (out / "samples.jsonl").read_bytes()


def listing(out: Path) -> list[str]:
    """The folder's file names, each run's time written <time>."""
    return sorted(re.sub(r"_\d{4}-\d\d-\d\dT[\d.-]+\.", "_<time>.", p.name) for p in out.iterdir())


#: a folder after one complete run, and after two
ONE_RUN = ["results.json", "results_<time>.json", "samples.jsonl", "samples_<time>.jsonl"]
TWO_RUNS = ["results.json", "results_<time>.json", "results_<time>.json", "samples.jsonl", "samples_<time>.jsonl",
            "samples_<time>.jsonl"]


def test_run_dying_on_its_third_task_keeps_the_previous_pair_and_shows_its_progress(tasks, tmp_path, capsys):
    out = tmp_path / "out"
    evaluate(tasks, out, Echo(pad=1))
    previous = pair(out)
    with pytest.raises(Crash):
        evaluate(tasks, out, Echo(crash_on="echo_c"))
    assert pair(out) == previous  # the previous complete run, byte for byte
    progress = json.loads((out / "results.partial.json").read_text())
    assert list(progress["tasks"]) == ["echo_a", "echo_b"]
    rows = [json.loads(line) for line in (out / "samples.partial.jsonl").read_text().splitlines()]
    assert [r["task"] for r in rows] == ["echo_a"] * 6 + ["echo_b"] * 6
    assert not (out / ".mmcomp-eval.lock").exists()

    # compare sees the previous complete run, and says a newer one did not finish
    rc, table, err = run_cli(capsys, "compare", str(out))
    assert rc == 0 and "| echo_c | exact_match | 0.00" in table
    assert "also holds the progress of a run that is going or did not finish (results.partial.json)" in err
    rc, table, err = run_cli(capsys, "compare", str(out / "results.partial.json"))
    assert rc == 0 and "| echo_b | exact_match | 100.00" in table and "echo_c" not in table

    (out / ".results.json.k1ll3d.tmp").write_text("{")  # left by a run killed while writing results.json
    evaluate(tasks, out, Echo())
    assert listing(out) == TWO_RUNS  # the first run's pair is kept, dated
    results = json.loads((out / "results.json").read_text())
    assert list(results["tasks"]) == list(TASKS)
    assert results["samples_sha256"] == hashlib.sha256((out / "samples.jsonl").read_bytes()).hexdigest()


def test_compare_refuses_a_results_json_next_to_another_runs_samples(tasks, tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    evaluate(tasks, a, Echo())
    evaluate(tasks, b, Echo(pad=2))
    (a / "samples.jsonl").write_bytes((b / "samples.jsonl").read_bytes())  # a pair split by hand or by SIGKILL
    rc, _, err = run_cli(capsys, "compare", str(a), str(b))
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert f"{a / 'samples.jsonl'}: does not belong to {a / 'results.json'}" in err


def test_full_disk_keeps_the_previous_pair_and_says_free_space(tasks, tmp_path):
    with small_disk(tmp_path / "disk", 512) as disk:
        out = disk / "out"
        evaluate(tasks, out, Echo())
        previous = pair(out)
        filler = fill(disk, 48 * 1024)
        with pytest.raises(UserError) as err:  # 3 tasks x 6 samples x 5 kB do not fit in 48 kB
            evaluate(tasks, out, Echo(pad=5000))
        assert "cannot write samples.partial.jsonl (No space left on device); free space and rerun" in str(err.value)
        assert "the previous results.json and samples.jsonl there are untouched" in str(err.value)
        assert pair(out) == previous
        assert listing(out) == ONE_RUN  # no temp, lock, partial
        filler.unlink()
        evaluate(tasks, out, Echo(pad=5000))
        assert json.loads((out / "samples.jsonl").read_text().splitlines()[0])["raw_output"].endswith("x" * 5000)


@pytest.fixture
def holder(tmp_path):
    """Another process holding the lock on tmp_path/out, as a running evaluation would."""
    code = ("import sys; from mmcomp_eval.runtime.output_lock import OutputLock; from pathlib import Path; "
            "Path(sys.argv[1]).mkdir(); OutputLock.acquire(Path(sys.argv[1])); print('locked', flush=True); "
            "sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "out"), "--pretend", "evaluation"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "locked\n"
    yield proc
    proc.kill()
    proc.wait()


def test_second_run_on_one_output_path_is_refused_before_its_model_loads(tasks, holder, tmp_path, capsys):
    folder, _ = tasks
    # a model that cannot load: reaching it would print a different error
    argv = ["--model", "hf", "--model-args", f"pretrained={tmp_path / 'no_model'}", "--tasks", "echo_a",
            "--include-path", str(folder), "--output-path", str(tmp_path / "out"), "--no-progress"]
    rc, _, err = run_cli(capsys, *argv)
    assert rc == 2 and "no_model" not in err
    assert f"--output-path {tmp_path / 'out'} is in use by another mmcomp-eval run (pid {holder.pid} on " in err
    assert "--pretend evaluation); wait for it to finish or pick another --output-path" in err
    rc, _, err = run_cli(capsys, *argv, "--num-processes", "2")  # the launcher checks before starting processes
    assert rc == 2 and f"(pid {holder.pid} on " in err

    holder.kill()  # SIGKILL: the kernel drops the lock with its holder
    holder.wait()
    rc, _, err = run_cli(capsys, *argv)
    assert rc == 2 and "in use" not in err and "no_model" in err  # past the lock, failing at the model


def test_failed_run_leaves_no_folder_it_created(tasks, tmp_path, capsys):
    folder, _ = tasks
    argv = ["--model", "hf", "--model-args", f"pretrained={tmp_path / 'no_model'}", "--tasks", "echo_a",
            "--include-path", str(folder), "--no-progress", "--no-cache"]
    rc, _, _ = run_cli(capsys, *argv, "--output-path", str(tmp_path / "new" / "deeper"))
    assert rc == 2 and not (tmp_path / "new").exists()
    (tmp_path / "mine").mkdir()
    rc, _, _ = run_cli(capsys, *argv, "--output-path", str(tmp_path / "mine"))
    assert rc == 2 and (tmp_path / "mine").is_dir() and not any((tmp_path / "mine").iterdir())


@pytest.mark.parametrize("flag", ["--output-path", "--cache-dir"])
def test_unwritable_output_or_cache_folder_is_found_before_the_model_loads(tasks, tmp_path, capsys, flag):
    folder, _ = tasks
    with read_only_folder(tmp_path / "ro") as ro:
        other = "--cache-dir" if flag == "--output-path" else "--output-path"
        rc, _, err = run_cli(capsys, "--model", "hf", "--model-args", f"pretrained={tmp_path / 'no_model'}",
                             "--tasks", "echo_a", "--include-path", str(folder), "--no-progress",
                             flag, str(ro), other, str(tmp_path / "fine"))
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "no_model" not in err
    assert f"{flag} {ro}" in err and ("Read-only file system" in err or "Permission denied" in err
                                      or "readonly" in err or "unable to open" in err)


@pytest.mark.parametrize("umask, file_mode, folder_mode", [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700)])
def test_result_files_follow_the_umask(tasks, tmp_path, umask, file_mode, folder_mode):
    old = os.umask(umask)
    try:
        evaluate(tasks, tmp_path / "out", Echo())
        with atomic_files.replacing_folder(tmp_path / "cache_entry") as entry:
            (entry / "x").write_text("x")
    finally:
        os.umask(old)
    files = sorted((tmp_path / "out").iterdir())
    assert len(files) == 4  # results.json, samples.jsonl and the run's dated pair
    for path in files:
        assert path.stat().st_mode & 0o777 == file_mode, path.name
    assert (tmp_path / "cache_entry").stat().st_mode & 0o777 == folder_mode


def test_presentation_options_stay_out_of_the_record(tasks, tmp_path):
    evaluate(tasks, tmp_path / "bar", Echo(), progress=True)
    evaluate(tasks, tmp_path / "quiet", Echo(), progress=False)
    bar, quiet = (json.loads((tmp_path / d / "results.json").read_text()) for d in ("bar", "quiet"))
    assert "progress" not in bar["config"]
    for volatile in ("created", "files"):
        bar.pop(volatile), quiet.pop(volatile)
    assert bar == quiet
    assert (tmp_path / "bar" / "samples.jsonl").read_bytes() == (tmp_path / "quiet" / "samples.jsonl").read_bytes()
