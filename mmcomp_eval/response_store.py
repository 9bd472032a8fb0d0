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
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

from mmcomp_eval import __version__
from mmcomp_eval.errors import UserError

STORE_FILE = "responses.sqlite"
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
    """One SQLite file; safe to open from several processes at once."""

    def __init__(self, directory: Path):
        self.directory = Path(directory).expanduser().resolve()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"--cache-dir {self.directory}: cannot create it ({exc.strerror})") from None
        self.path = self.directory / STORE_FILE
        self._db: sqlite3.Connection | None = None
        deadline = time.monotonic() + 120
        while True:
            try:
                found = self._open()
                break
            except sqlite3.OperationalError as exc:
                # Several processes creating the store at once: switching to WAL
                # needs a moment alone with the file and does not wait for it.
                if "locked" not in str(exc) and "busy" not in str(exc) or time.monotonic() > deadline:
                    raise UserError(f"response store {self.path} is unusable ({exc}); "
                                    "move it away or pick another --cache-dir") from None
                if self._db is not None:
                    self._db.close()
                time.sleep(0.05)
            except sqlite3.DatabaseError as exc:
                raise UserError(f"response store {self.path} is unusable ({exc}); "
                                "move it away or pick another --cache-dir") from None
        if found != str(SCHEMA_VERSION):
            raise UserError(f"response store {self.path} has schema {found}, this mmcomp-eval writes "
                            f"{SCHEMA_VERSION}; pick another --cache-dir")

    def _open(self) -> str:
        """Connect, make sure of WAL mode and the schema; the stored schema version."""
        self._db = sqlite3.connect(self.path, timeout=120, isolation_level=None, check_same_thread=False)
        if self._db.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":  # persistent once set
            self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self._db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        return self._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0]

    def register_model(self, key: str, fingerprint: dict) -> None:
        self._db.execute("INSERT OR IGNORE INTO models VALUES (?, ?)", (key, canonical_json(fingerprint)))

    def get_many(self, model: str, keys: Sequence[str]) -> dict[str, Any]:
        """The stored responses among ``keys`` (missing keys are absent)."""
        out: dict[str, Any] = {}
        unique = list(dict.fromkeys(keys))
        for start in range(0, len(unique), 500):
            chunk = unique[start : start + 500]
            marks = ",".join("?" * len(chunk))
            rows = self._db.execute(
                f"SELECT request_key, response FROM responses WHERE model_key=? AND request_key IN ({marks})",
                (model, *chunk),
            )
            out.update((k, json.loads(v)) for k, v in rows)
        return out

    def put(self, model: str, key: str, kind: str, response: Any) -> None:
        """Commit one response now; the first answer stored for a key wins."""
        self._db.execute(
            "INSERT OR IGNORE INTO responses VALUES (?, ?, ?, ?, ?)",
            (model, key, kind, json.dumps(response, ensure_ascii=False), time.time()),
        )

    def count(self, model: str | None = None) -> int:
        if model is None:
            return self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]
        return self._db.execute("SELECT COUNT(*) FROM responses WHERE model_key=?", (model,)).fetchone()[0]

    def missing(self, model: str, keys: Iterable[str]) -> list[str]:
        keys = list(dict.fromkeys(keys))
        have = self.get_many(model, keys)
        return [k for k in keys if k not in have]

    def close(self) -> None:
        self._db.close()
