"""A crash-safe store of model responses, shared by every run on this machine.

An evaluation on a shared GPU can die at any moment (preempted, killed,
out of memory). Every response is therefore committed to SQLite the moment
the model produces it, and a rerun asks the model only for what is not in the
store yet. Keys are content addresses, never run or process identities:

* the model key hashes the adapter's ``fingerprint()`` (checkpoint, revision,
  weights checksum, dtype, library versions...) plus the mmcomp-eval version,
  because answer post-processing lives in the adapter code;
* the request key hashes the request's content (rendered prompt or chat
  messages, media ids, continuations, generation settings including the
  seed), not its ``request_id``: few-shot choices are in the prompt text, and
  two tasks asking the very same thing share one answer.

So a run written by 4 processes resumes in 1, and a store can be copied
between machines. WAL mode lets several processes read while one writes;
each response is its own tiny transaction, so a SIGKILL loses at most the
responses still inside the model. ``synchronous=NORMAL`` survives process
crashes (what happens on shared GPUs); only an OS crash or power cut can drop
the last few commits, which are then simply asked again. SQLite's locking
does not work on network file systems: keep ``--cache-dir`` on a local disk.

A store in trouble (a damaged page, a full disk, an I/O error, a folder
that cannot be written) is reported as one line that says what to do,
never as a traceback, and nothing already stored is touched: committed
answers survive a failed write and are found by the rerun. Damage is looked
for when the store opens with ``PRAGMA quick_check``, which reads the whole
file (100k generated answers, 20 MB: 0.04 s in the page cache, 0.3 s from
disk; 100k log-likelihood lists, 468 MB: 0.4 s and 8.5 s; ``python
bench/bench_faults.py --check-cost``). So the check is
skipped when the file is exactly as the last run that checked it left it
(inode, size and modification time, kept next to the store in
``responses.sqlite.checked``); any other change to the file, a copy
included, brings the full check back. Damage the check did not see is
reported as the same one line when a damaged page is read.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

from mmcomp_eval.version import __version__

from mmcomp_eval.runtime import atomic_files
from mmcomp_eval.errors import UserError

STORE_FILE = "responses.sqlite"
#: (inode, size, mtime) of the store when a process that had checked it closed it
CHECKED_FILE = STORE_FILE + ".checked"
SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS models (
    model_key TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL            -- canonical JSON, for people inspecting the store
);
CREATE TABLE IF NOT EXISTS responses (
    model_key TEXT NOT NULL,
    request_key TEXT NOT NULL,
    kind TEXT NOT NULL,                  -- 'generate' | 'loglikelihood'
    response TEXT NOT NULL,              -- JSON: a string, or a list of floats
    created REAL NOT NULL,               -- unix time; never part of any result
    PRIMARY KEY (model_key, request_key)
) WITHOUT ROWID;
"""


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


def _sha(obj: Any) -> str:
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()


def model_key(fingerprint: dict) -> str:
    """The store's name for a model: everything that can change its answers."""
    return _sha({"fingerprint": fingerprint, "mmcomp_eval": __version__})


def request_key(kind: str, request: Any, media: list[str] | None = None) -> str:
    """The store's name for a request: its content without its id, plus its images' identities."""
    body = asdict(request) if is_dataclass(request) else dict(request)
    body.pop("request_id", None)
    key = {"kind": kind, "request": body}
    if media is not None:
        key["media"] = media
    return _sha(key)


class ResponseStore:
    """One SQLite file; safe to open from several processes at once.

    ``check``: look for damage on opening (see the module docstring); the
    helper processes of a data-parallel run leave that to process 0.
    """

    def __init__(self, directory: Path, check: bool = True):
        self.directory = Path(directory).expanduser().resolve()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"--cache-dir {self.directory}: cannot create it ({exc.strerror}); "
                            "pick another --cache-dir or pass --no-cache") from None
        self.path = self.directory / STORE_FILE
        self._db: sqlite3.Connection | None = None
        #: this process checked the store (or found it as a check left it) and met no trouble since
        self._vouched = False
        before = self._file_state()
        deadline = time.monotonic() + 120
        while True:
            try:
                found = self._open()
                break
            except sqlite3.OperationalError as exc:
                # Several processes creating the store at once: switching to WAL
                # needs a moment alone with the file and does not wait for it.
                if self._db is not None:
                    self._db.close()
                if "locked" not in str(exc) and "busy" not in str(exc) or time.monotonic() > deadline:
                    raise self._problem(exc) from None
                time.sleep(0.05)
            except sqlite3.DatabaseError as exc:
                if self._db is not None:
                    self._db.close()
                raise self._problem(exc) from None
        try:
            if found != str(SCHEMA_VERSION):
                raise UserError(f"response store {self.path} has schema {found}, this mmcomp-eval writes "
                                f"{SCHEMA_VERSION}; pick another --cache-dir")
            if check:
                self._check(before)
        except UserError:
            self._db.close()
            raise

    def _open(self) -> str:
        """Connect, make sure of WAL mode and the schema; the stored schema version."""
        self._db = sqlite3.connect(self.path, timeout=120, isolation_level=None, check_same_thread=False)
        if self._db.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":  # persistent once set
            self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        # a write even when the row exists: a store that cannot be written fails here, not mid-run
        self._db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        return self._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0]

    def _file_state(self) -> list[int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return [st.st_ino, st.st_size, st.st_mtime_ns]

    def _check(self, before: list[int] | None) -> None:
        stamp = self.directory / CHECKED_FILE
        try:
            unchanged = before is not None and json.loads(stamp.read_text()) == before
        except (OSError, ValueError):
            unchanged = False
        if not unchanged:
            with self._guarded():
                problems = [row[0] for row in self._db.execute("PRAGMA quick_check(1)")]
            if problems != ["ok"]:
                stamp.unlink(missing_ok=True)
                detail = " ".join(problems[0].replace("*** in database main ***", "").split())[:160]
                raise self._damaged(f"quick_check: {detail}")
        self._vouched = True

    @contextmanager
    def _guarded(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            self._vouched = False
            raise self._problem(exc) from None

    def _problem(self, exc: sqlite3.Error) -> UserError:
        """One line for an SQLite error: what happened and what to do, answers already stored kept."""
        code = getattr(exc, "sqlite_errorname", "") or ""
        text = str(exc)
        if code.startswith("SQLITE_FULL") or "is full" in text:
            return UserError(f"response store {self.path}: the disk is full ({text}); free space on "
                             f"{self.directory} and rerun: the answers stored so far are kept and not asked again")
        if code.startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_PERM", "SQLITE_AUTH")) or "readonly" in text:
            return UserError(f"--cache-dir {self.directory}: cannot write the response store ({text}); make the "
                             "folder writable, pick another --cache-dir or pass --no-cache")
        if code.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")) or "malformed" in text or "not a database" in text:
            return self._damaged(text)
        if code.startswith("SQLITE_IOERR") or "I/O error" in text:
            return UserError(f"response store {self.path}: {text}; check free space and the disk under "
                             f"{self.directory}, then rerun: the answers stored so far are kept")
        return UserError(f"response store {self.path} is unusable ({text}); move it away or pick another --cache-dir")

    def _damaged(self, detail: str) -> UserError:
        self._vouched = False
        return UserError(f"response store {self.path} is damaged ({detail}); move it away (mv {self.path} "
                         f"{self.path}.damaged) and rerun with a fresh store; docs/results.md says how to salvage "
                         "its answers")

    def register_model(self, key: str, fingerprint: dict) -> None:
        with self._guarded():
            self._db.execute("INSERT OR IGNORE INTO models VALUES (?, ?)", (key, canonical_json(fingerprint)))

    def get_many(self, model: str, keys: Sequence[str]) -> dict[str, Any]:
        """The stored responses among ``keys`` (missing keys are absent)."""
        out: dict[str, Any] = {}
        unique = list(dict.fromkeys(keys))
        with self._guarded():
            for start in range(0, len(unique), 500):
                chunk = unique[start : start + 500]
                marks = ",".join("?" * len(chunk))
                rows = self._db.execute(
                    f"SELECT request_key, response FROM responses WHERE model_key=? AND request_key IN ({marks})",
                    (model, *chunk),
                )
                for k, v in rows:
                    try:
                        out[k] = json.loads(v)
                    except (TypeError, ValueError):
                        raise self._damaged(f"the answer stored under {k[:12]}... is not JSON") from None
        return out

    def put(self, model: str, key: str, kind: str, response: Any) -> None:
        """Commit one response now; the first answer stored for a key wins."""
        with self._guarded():
            self._db.execute(
                "INSERT OR IGNORE INTO responses VALUES (?, ?, ?, ?, ?)",
                (model, key, kind, json.dumps(response, ensure_ascii=False), time.time()),
            )

    def count(self, model: str | None = None) -> int:
        with self._guarded():
            if model is None:
                return self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]
            return self._db.execute("SELECT COUNT(*) FROM responses WHERE model_key=?", (model,)).fetchone()[0]

    def missing(self, model: str, keys: Iterable[str]) -> list[str]:
        keys = list(dict.fromkeys(keys))
        have = self.get_many(model, keys)
        return [k for k in keys if k not in have]

    def close(self) -> None:
        """Close; a process that vouched for the store records the file's state so the next open skips the check."""
        if self._db is None:
            return
        try:
            self._db.close()  # the last connection checkpoints the WAL into the file: stamp after
        except sqlite3.Error:
            self._vouched = False
        self._db = None
        stamp = self.directory / CHECKED_FILE
        try:
            state = self._file_state() if self._vouched else None
            if state is None:
                stamp.unlink(missing_ok=True)
            else:
                atomic_files.write_text(stamp, json.dumps(state), durable=False)
        except OSError:
            pass  # no stamp only means a full check next time
