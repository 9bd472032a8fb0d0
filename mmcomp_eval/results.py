"""Result files: ``results.json`` (one per run) and ``samples.jsonl``.

Both are written as the run goes: samples are appended as soon as a task's
seed is scored, and ``results.json`` is rewritten (atomically) after every
task, so a run that dies on its third task keeps the first two.
The schema is documented in ``docs/results.md``; bump ``SCHEMA_VERSION``
when a field changes meaning.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from mmcomp_eval import __version__
from mmcomp_eval.errors import UserError
from mmcomp_eval.paths import REPO_ROOT

SCHEMA_VERSION = 1
VERSIONED_PACKAGES = ("torch", "transformers", "numpy", "bert-score", "accelerate", "gguf", "jinja2", "spacy")


def sha256_json(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, ensure_ascii=False, default=str).encode()).hexdigest()


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version(), "mmcomp-eval": __version__}
    for name in VERSIONED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


@dataclass
class RunRecord:
    """Everything ``results.json`` holds; ``tasks`` fills in as tasks finish."""

    model: dict
    config: dict
    tasks: dict = field(default_factory=dict)
    #: the response store: path, model key, hits and misses (``{"enabled": false}`` with --no-cache)
    cache: dict = field(default_factory=lambda: {"enabled": False})
    #: compositional gaps, one per twin pair whose both tasks ran (``mmcomp_eval.gap``), in the order they completed
    gaps: list = field(default_factory=list)
    created: str = field(default_factory=lambda: dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
    command: list[str] = field(default_factory=lambda: list(sys.argv))

    def as_dict(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION,
            "created": self.created,
            "command": self.command,
            "git_commit": git_commit(),
            "versions": package_versions(),
            "model": self.model,
            "config": self.config,
            "tasks": self.tasks,
            "gaps": self.gaps,
            "cache": self.cache,
        }


class ResultWriter:
    """Writes into ``--output-path``; a no-op when none was given."""

    def __init__(self, directory: Path | None):
        self.directory = Path(directory) if directory else None
        # The previous run's samples.jsonl is replaced at the first append, not
        # here: a run that fails its checks must leave the old files as they were.
        self._started = False
        if self.directory is not None:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise UserError(f"--output-path {self.directory}: cannot create the folder ({exc.strerror}); "
                                "name a folder that can be created") from None

    def append_samples(self, rows: list[dict]) -> None:
        if self.directory is None:
            return
        mode = "a" if self._started else "w"
        self._started = True
        with (self.directory / "samples.jsonl").open(mode, encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")

    def write_results(self, record: RunRecord) -> None:
        if self.directory is None:
            return
        target = self.directory / "results.json"
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".results-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(record.as_dict(), f, indent=2, sort_keys=True, ensure_ascii=False, default=str)
            f.write("\n")
        os.replace(tmp, target)
