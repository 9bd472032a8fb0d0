"""A wheel installed outside the source tree lists, validates and runs the built-in tasks it ships.

``pip install .`` is how users get the tool, and nothing in a source checkout
(where ``tasks/`` and ``prompts/`` sit next to the package) shows whether the
wheel carries them: only a wheel built, installed into a fresh folder and run
from elsewhere does.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import write_synthetic_ek100
from mmcomp_eval.tasks.index import TaskIndex

REPO = Path(__file__).resolve().parents[1]
#: What a wheel is built from (pyproject.toml names the README; MANIFEST.in carries tasks/ and prompts/ into an sdist).
BUILD_INPUTS = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "mmcomp_eval", "tasks", "prompts")
SOURCE_INDEX = TaskIndex.build()  # what the source checkout lists


@dataclass(frozen=True)
class Installed:
    wheel: Path
    target: Path  # the ``pip install --target`` folder
    root: Path  # a scratch folder outside the repository, holding both


def _run(cmd: list, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    root = tmp_path_factory.mktemp("wheel")
    assert REPO not in root.parents
    if shutil.which("git"):
        # An enclosing git repository that is not this project: results must not report its commit.
        _run(["git", "init", "-q", "."], root)
        _run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "x"], root)
    # Built from a copy because setuptools builds inside the source folder: a build/ left in the
    # checkout by an earlier build would put its stale files into this wheel.
    src = root / "src"
    src.mkdir()
    for name in BUILD_INPUTS:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(REPO / name, src / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    _run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "--no-cache-dir", "-w", root / "dist", src],
         root)
    (wheel,) = (root / "dist").glob("*.whl")
    target = root / "site"
    _run([*pip, "install", "--no-deps", "--no-index", "--no-compile", "--target", target, wheel], root)
    return Installed(wheel, target, root)


def test_wheel_holds_every_module_and_the_builtin_tasks_and_prompts(installed):
    with zipfile.ZipFile(installed.wheel) as z:
        names = set(z.namelist())
        for folder in ("tasks", "prompts"):
            sources = {p.relative_to(REPO / folder).as_posix(): p for p in (REPO / folder).rglob("*") if p.is_file()}
            prefix = f"mmcomp_eval/_builtin/{folder}/"
            assert {n[len(prefix):] for n in names if n.startswith(prefix)} == set(sources)
            for rel, path in sources.items():
                assert z.read(prefix + rel) == path.read_bytes(), rel
        entry_points = next(z.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
    modules = {p.relative_to(REPO).as_posix() for p in (REPO / "mmcomp_eval").rglob("*.py")}
    assert modules <= names, sorted(modules - names)  # a subpackage the package finder missed
    assert "mmcomp_eval/py.typed" in names
    assert "mmcomp-eval = mmcomp_eval.cli:main" in entry_points
    # nothing at the top level of site-packages but the package and its metadata
    assert {n.split("/")[0] for n in names} == {"mmcomp_eval", "mmcomp_eval-0.1.0.dist-info"}


def test_installed_wheel_lists_validates_and_runs_the_builtin_tasks(installed, tmp_path):
    site, work = installed.target, installed.root / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSAFEPATH")}
    env.update(PYTHONPATH=str(site), MMCOMP_CACHE_DIR=str(tmp_path / "cache"))
    python = [sys.executable]

    imported = _run([*python, "-c", "import mmcomp_eval; print(mmcomp_eval.__file__)"], work, env).stdout.strip()
    assert Path(imported) == site / "mmcomp_eval" / "__init__.py"  # not the source tree, not an editable install

    listing = _run([*python, "-m", "mmcomp_eval", "ls", "tasks"], work, env).stdout.splitlines()
    files = {line.split()[0]: Path(line.split()[-1]) for line in listing if not line.split()[1] == "group"}
    assert set(files) == set(SOURCE_INDEX.tasks)
    # the retrieval tasks sit in subfolders (tasks/retrieval/, tasks/retrieval/icsvr/), copied as they are
    assert all(f.is_relative_to(site / "mmcomp_eval" / "_builtin" / "tasks") and f.is_file() for f in files.values())
    assert {line.split()[0] for line in listing if line.split()[1] == "group"} == set(SOURCE_INDEX.groups)

    # Enough windows for the built-in tasks' full-size (8,766-instance) MCD split, over conftest's hand-made classes.
    ek100 = write_synthetic_ek100(tmp_path / "ek100", n_videos=480, clips=30)
    out = tmp_path / "out"
    # the console script pip installed, the way a user starts the tool
    _run([site / "bin" / "mmcomp-eval", "--model", "gold", "--tasks", "compact", "--limit", "10", "--ek100-dir", ek100,
          "--output-path", out, "--no-progress", "--no-cache"], work, env)
    results = json.loads((out / "results.json").read_text())
    assert results["git_commit"] is None  # an installed copy, inside a git repository that is not this project
    assert set(results["tasks"]) == {"compact_nup", "compact_verb", "compact_noun"}
    for name, task in results["tasks"].items():
        assert Path(task["config"]["source"]) == files[name]
        assert task["n_documents"] == 10 and task["n_skipped"] == 0
        assert {m: v["mean"] for m, v in task["metrics"].items()} == dict.fromkeys(task["metrics"], 100.0)
    assert set(results["tasks"]["compact_nup"]["metrics"]) == {"bleu", "exact_match", "category_accuracy", "bertscore"}
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 30 and all(s["prediction"] == s["target"] for s in samples)

    # the gold model needs no prompt; validate renders one from the shipped template (compact_llama2.jinja)
    shown = _run([*python, "-m", "mmcomp_eval", "validate", files["compact_nup"], "--shots", "2", "--ek100-dir", ek100],
                 work, env).stdout
    assert "task 'compact_nup' OK" in shown
    prompt = shown.split("---\n", 1)[1].split("\n--- target:")[0].splitlines()
    assert prompt[0] == "Predict the next narration given 3 sequential previous narrations from a cooking video"
    assert len(prompt) == 4 and all(" => " in line for line in prompt[1:3]) and prompt[3].rstrip().endswith(" =>")


def test_a_copy_without_its_builtin_tasks_says_so(monkeypatch, tmp_path):
    from mmcomp_eval.errors import UserError
    from mmcomp_eval.tasks import index

    monkeypatch.setattr(index, "BUILTIN_TASKS", tmp_path / "mmcomp_eval" / "_builtin" / "tasks")
    with pytest.raises(UserError, match=f"built-in tasks folder {tmp_path}/mmcomp_eval/_builtin/tasks is missing"):
        index.TaskIndex.build()
