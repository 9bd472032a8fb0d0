"""Result files: ``results.json`` and ``samples.jsonl``, always a complete pair.

A run never writes into them while it goes: its progress is visible in
``results.partial.json`` (rewritten atomically after every task) and
``samples.partial.jsonl`` (appended as each task's seed is scored). A run
that completes first publishes its own dated pair,
``results_<UTC time>.json`` and ``samples_<UTC time>.jsonl`` (as lm-eval
names its files, so reruns into one folder keep every earlier run), then
replaces ``results.json`` and ``samples.jsonl`` by hard links to (or copies
of) that pair: they always hold the latest complete run. A run that fails,
is killed or meets a full disk leaves the previous complete pairs as they
were, and ``compare`` never sees the results of one run next to the samples
of another. ``results.json`` records the SHA-256 of its ``samples.jsonl``
(``samples_sha256``) so that a pair split anyway (SIGKILL between two
renames, files copied by hand) is refused, not misread. The schema is
documented in ``docs/results.md``; bump ``SCHEMA_VERSION`` when a field
changes meaning.
"""

from __future__ import annotations

import datetime as dt
import errno
import hashlib
import json
import logging
import os
import platform
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from mmcomp_eval.version import __version__

from mmcomp_eval.runtime import atomic_files
from mmcomp_eval.errors import UserError
from mmcomp_eval.runtime.output_lock import OutputLock
from mmcomp_eval.paths import source_checkout

SCHEMA_VERSION = 1
RESULTS_FILE = "results.json"
SAMPLES_FILE = "samples.jsonl"
PARTIAL_RESULTS_FILE = "results.partial.json"
PARTIAL_SAMPLES_FILE = "samples.partial.jsonl"
#: a run's own pair, kept when later runs replace results.json/samples.jsonl
DATED_RESULTS = re.compile(r"results_(?P<stamp>\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d\.\d{6}(?:-\d+)?)\.json")

log = logging.getLogger(__name__)
VERSIONED_PACKAGES = ("torch", "transformers", "numpy", "bert-score", "accelerate", "gguf", "jinja2", "spacy")


def dated_names(stamp: str) -> tuple[str, str]:
    """(results file, samples file) of the run published at ``stamp``."""
    return f"results_{stamp}.json", f"samples_{stamp}.jsonl"


def samples_for(results: Path) -> Path:
    """The samples file published with a results file (dated, latest or partial)."""
    dated = DATED_RESULTS.fullmatch(results.name)
    if dated:
        return results.parent / dated_names(dated["stamp"])[1]
    return results.parent / (PARTIAL_SAMPLES_FILE if results.name == PARTIAL_RESULTS_FILE else SAMPLES_FILE)


def sha256_json(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, ensure_ascii=False, default=str).encode()).hexdigest()


def git_commit() -> str | None:
    """The commit of the source checkout this code runs from; None for an installed copy.

    Only a checkout that is itself the top of a git repository counts: an
    installed wheel (in a virtualenv inside some other repository, say) or a
    copy of the sources vendored into another repository would otherwise
    report a commit that says nothing about this code.
    """
    root = source_checkout()
    if root is None:
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--show-toplevel", "HEAD"],
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.splitlines()
    if out.returncode != 0 or len(lines) != 2 or Path(lines[0]).resolve() != root:
        return None
    return lines[1]


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
    #: compositional gaps, one per twin pair whose both tasks ran (``mmcomp_eval.evaluation.gap``), in the order they completed
    gaps: list = field(default_factory=list)
    created: str = field(default_factory=lambda: dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
    #: what the user typed; in a data-parallel run the launcher's command, not a process's own argv
    command: list[str] = field(default_factory=lambda: list(sys.argv))
    #: how many processes answered, and who started them (``mmcomp_eval.runtime.parallel.process_record``)
    processes: dict = field(default_factory=lambda: {"count": 1, "launcher": None})

    def as_dict(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION,
            "created": self.created,
            "command": self.command,
            "processes": self.processes,
            "git_commit": git_commit(),
            "versions": package_versions(),
            "model": self.model,
            "config": self.config,
            "tasks": self.tasks,
            "gaps": self.gaps,
            "cache": self.cache,
        }


class ResultWriter:
    """Writes a run into ``--output-path`` (a no-op when none was given); see the module docstring.

    Created before the model loads: it makes the folder, proves it writable
    and locks it against a second run (:class:`OutputLock`). Use it as a
    context manager: a block that ends normally publishes the run
    (:meth:`finish`); either way the lock is released, and a folder this
    writer created and left empty is removed.
    """

    def __init__(self, directory: Path | None):
        self.directory = Path(directory) if directory else None
        self.lock: OutputLock | None = None
        self._created: list[Path] = []  # folders made here, innermost first
        self._record: dict | None = None
        self._samples_started = False
        self._samples_sha256 = hashlib.sha256()
        if self.directory is None:
            return
        self._created = _make_folders(self.directory)
        try:
            self.lock = OutputLock.acquire(self.directory)
        except UserError:
            self.close()
            raise
        for pattern in (".results*.tmp", ".samples*.tmp"):  # of a run killed while writing; ours now we hold the lock
            for stale in self.directory.glob(pattern):
                stale.unlink(missing_ok=True)

    def __enter__(self) -> ResultWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self.finish()
        finally:
            self.close()

    def append_samples(self, rows: list[dict]) -> None:
        if self.directory is None:
            return
        data = "".join(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n" for row in rows).encode()
        with self._writing(PARTIAL_SAMPLES_FILE):
            if not self._samples_started:  # progress of an older, unfinished run is superseded
                (self.directory / PARTIAL_RESULTS_FILE).unlink(missing_ok=True)
            with (self.directory / PARTIAL_SAMPLES_FILE).open("ab" if self._samples_started else "wb") as f:
                f.write(data)
        self._samples_started = True
        self._samples_sha256.update(data)

    def write_results(self, record: RunRecord) -> None:
        """Record the run so far in results.partial.json; :meth:`finish` publishes the last one."""
        if self.directory is None:
            return
        self._record = record.as_dict()
        with self._writing(PARTIAL_RESULTS_FILE):
            atomic_files.write_text(self.directory / PARTIAL_RESULTS_FILE, _json(self._record), durable=False)

    def finish(self) -> None:
        """Publish this run's dated pair, then make results.json and samples.jsonl that pair.

        Each step renames two finished files with signals held back, so a
        reader finds either the previous latest pair or this one, and every
        dated pair is whole.
        """
        if self.directory is None or self._record is None:
            return
        samples = self.directory / PARTIAL_SAMPLES_FILE
        results_name, samples_name = dated_names(self._free_stamp())
        record = {**self._record, "samples_sha256": self._samples_sha256.hexdigest(),
                  "files": {"results": results_name, "samples": samples_name}}
        with self._writing(RESULTS_FILE):
            if not self._samples_started:
                samples.write_bytes(b"")
            atomic_files.fsync_file(samples)
            staged = atomic_files.stage_text(self.directory / results_name, _json(record))
        # samples first: the results file is the record that says which samples belong to it
        atomic_files.rename_together([(samples, self.directory / samples_name), (staged, self.directory / results_name)])
        with self._writing(RESULTS_FILE):
            latest = [(atomic_files.staged_link(self.directory / samples_name, self.directory / SAMPLES_FILE),
                       self.directory / SAMPLES_FILE),
                      (atomic_files.staged_link(self.directory / results_name, self.directory / RESULTS_FILE),
                       self.directory / RESULTS_FILE)]
        atomic_files.rename_together(latest)
        (self.directory / PARTIAL_RESULTS_FILE).unlink(missing_ok=True)
        log.info("results: %s (also %s), samples: %s", self.directory / RESULTS_FILE, results_name,
                 self.directory / SAMPLES_FILE)
        self._record = None

    def _free_stamp(self) -> str:
        """UTC now, to the microsecond, ':' written '-' (Windows file names); unique in the folder."""
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H-%M-%S.%f")
        candidate, n = stamp, 1
        while any((self.directory / name).exists() for name in dated_names(candidate)):
            n += 1
            candidate = f"{stamp}-{n}"
        return candidate

    def close(self) -> None:
        """Release the lock; remove the folders this writer created if nothing was written into them."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None
        for folder in self._created:
            try:
                folder.rmdir()
            except OSError:  # not empty: keep it and its parents
                break
        self._created = []

    @contextmanager
    def _writing(self, name: str) -> Iterator[None]:
        """Turn a failed write into one line; the previous complete pair is untouched, this run's progress dropped."""
        try:
            yield
        except OSError as exc:
            for partial in (PARTIAL_SAMPLES_FILE, PARTIAL_RESULTS_FILE):
                (self.directory / partial).unlink(missing_ok=True)  # half written; and it frees space
            fix = ("free space" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else
                   "raise the file size limit (ulimit -f)" if exc.errno == errno.EFBIG else "fix the folder")
            raise UserError(f"--output-path {self.directory}: cannot write {name} ({exc.strerror}); {fix} and rerun "
                            f"(the previous {RESULTS_FILE} and {SAMPLES_FILE} there are untouched)") from None


def _json(data: dict) -> str:
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False, default=str) + "\n"


def _make_folders(directory: Path) -> list[Path]:
    """Create ``directory`` and its missing parents; those it created, innermost first."""
    missing = []
    p = directory.absolute()
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UserError(f"--output-path {directory}: exists and is not a folder; name a folder") from None
    except OSError as exc:
        raise UserError(f"--output-path {directory}: cannot create the folder ({exc.strerror}); "
                        "name a folder that can be created") from None
    return missing
