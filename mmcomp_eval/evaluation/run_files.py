"""Reading a run's result files back (for ``compare``), trusting nothing.

A results.json may be another tool's, hand-edited, cut short by a copy, or
from a run killed while it replaced its files. Every field ``compare`` uses
is checked before any number is read, and a file that does not fit is one
line naming the file and the field, never a KeyError deep in a table. The
samples are checked against the ``samples_sha256`` their results.json
records, so a results.json is never paired with another run's samples.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mmcomp_eval.errors import UserError
from mmcomp_eval.evaluation.results import PARTIAL_RESULTS_FILE, RESULTS_FILE, samples_for

_NOT_OURS = "is it a file written by `mmcomp-eval run`?"


def results_path(path: Path) -> Path:
    """The results file a command-line argument names: a run folder's results.json, or the file itself."""
    path = Path(path)
    if not path.is_dir():
        return path
    if not (path / RESULTS_FILE).exists() and (path / PARTIAL_RESULTS_FILE).exists():
        raise UserError(f"{path}: no {RESULTS_FILE}, only the progress of an unfinished run ({PARTIAL_RESULTS_FILE}); "
                        f"rerun that run to finish it, or give {path / PARTIAL_RESULTS_FILE} to compare its progress")
    return path / RESULTS_FILE


def samples_path(results: Path) -> Path:
    """The samples file that goes with ``results`` (``results_<time>.json`` -> ``samples_<time>.jsonl``)."""
    return samples_for(results)


def read_results(path: Path) -> dict:
    """results.json, checked field by field."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise UserError(f"{path}: not found; give a run's --output-path folder or its results.json") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read it ({exc.strerror})") from None
    data = _parse_json(raw, str(path))
    check_results(data, path)
    return data


def _parse_json(raw: bytes, where: str) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{where}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
                        f"{_NOT_OURS}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{where}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _integer(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _require(path: Path, field: str, value: Any, ok: Callable[[Any], bool], expected: str) -> None:
    if not ok(value):
        got = "nothing" if value is _MISSING else f"{type(value).__name__} {json.dumps(value, default=str)[:40]}"
        raise UserError(f"{path}: field {field}: expected {expected}, got {got}; {_NOT_OURS}")


_MISSING = object()


def check_results(data: Any, path: Path) -> None:
    """Refuse, naming the field, a results.json whose fields ``compare`` uses are absent or of the wrong type."""
    _require(path, "(top level)", data, lambda v: isinstance(v, dict), "an object")
    _require(path, "tasks", data.get("tasks", _MISSING), lambda v: isinstance(v, dict), "an object of tasks")
    if isinstance(data.get("config"), dict) and data["config"].get("predict_only"):
        raise UserError(f"{path}: a --predict-only run, with answers but no scores; rerun its command without "
                        "--predict-only (the answers come from the response store) and compare that")
    _require(path, "samples_sha256", data.get("samples_sha256"), lambda v: v is None or isinstance(v, str), "a string")
    for name, task in data["tasks"].items():
        at = f"tasks.{name}"
        _require(path, at, task, lambda v: isinstance(v, dict), "an object")
        seeds = task.get("seeds", _MISSING)
        _require(path, f"{at}.seeds", seeds, lambda v: isinstance(v, list) and v and all(map(_integer, v)),
                 "a non-empty list of integers")
        for key, ok, expected in (("documents_sha256", lambda v: isinstance(v, str), "a string"),
                                  ("n_documents", _integer, "an integer"),
                                  ("prompts_sha256", lambda v: isinstance(v, dict), "an object"),
                                  ("config", lambda v: isinstance(v, dict), "an object")):
            if key in task:
                _require(path, f"{at}.{key}", task[key], ok, expected)
        metric_configs = task.get("config", {}).get("metrics", [])
        _require(path, f"{at}.config.metrics", metric_configs,
                 lambda v: isinstance(v, list) and all(isinstance(m, str) or isinstance(m, dict) and
                                                       isinstance(m.get("name"), str) for m in v),
                 "a list of metric names or {name, options}")
        _require(path, f"{at}.metrics", task.get("metrics", _MISSING), lambda v: isinstance(v, dict),
                 "an object of metrics")
        for metric, m in task["metrics"].items():
            mat = f"{at}.metrics.{metric}"
            _require(path, mat, m, lambda v: isinstance(v, dict), "an object")
            _require(path, f"{mat}.mean", m.get("mean", _MISSING), _number, "a number")
            for key in ("std", "stderr"):
                if key in m:
                    _require(path, f"{mat}.{key}", m[key], lambda v: v is None or _number(v), "a number or null")
            _require(path, f"{mat}.per_seed", m.get("per_seed", _MISSING),
                     lambda v: isinstance(v, list) and len(v) == len(seeds) and all(map(_number, v)),
                     f"a list of {len(seeds)} numbers, one per seed")
        if task.get("config", {}).get("output_type") == "retrieval":  # what the retrieval report reads
            info = task.get("retrieval", _MISSING)
            _require(path, f"{at}.retrieval", info, lambda v: isinstance(v, dict), "an object")
            for key in ("gallery", "settings", "perturbation", "n_queries"):
                if info.get(key) is not None:
                    _require(path, f"{at}.retrieval.{key}", info[key], lambda v: isinstance(v, dict), "an object")
            _require(path, f"{at}.config.dataset", task["config"].get("dataset", _MISSING),
                     lambda v: isinstance(v, dict) and isinstance(v.get("name"), str), "an object with a name")


def read_samples(path: Path, expected_sha256: str | None, results: Path) -> dict[tuple[str, int], dict[str, dict]]:
    """(task, seed) -> doc id -> row, every row checked; the file's SHA-256 must be ``expected_sha256`` when given."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise UserError(f"{path}: not found; significance tests need each run's {path.name}") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read it ({exc.strerror})") from None
    if expected_sha256 is not None and hashlib.sha256(raw).hexdigest() != expected_sha256:
        raise UserError(f"{path}: does not belong to {results} (its SHA-256 is not the samples_sha256 recorded "
                        "there): a run was stopped while replacing both, or the files were mixed up; rerun that "
                        "run (answers already computed come from the response store)")
    out: dict = {}
    for n, line in enumerate(raw.split(b"\n"), 1):
        if not line.strip():
            continue
        row = _parse_json(line, f"{path}:{n}")
        if not isinstance(row, dict):
            raise UserError(f"{path}:{n}: expected a JSON object per line, got {type(row).__name__}")
        for key, ok, expected in (("task", lambda v: isinstance(v, str), "a string"),
                                  ("seed", _integer, "an integer"),
                                  ("doc_id", lambda v: isinstance(v, str), "a string"),
                                  ("prediction", lambda v: isinstance(v, str), "a string"),
                                  ("target", lambda v: isinstance(v, str), "a string"),
                                  ("scores", lambda v: isinstance(v, dict) and all(map(_number, v.values())),
                                   "an object of numbers")):
            _require(Path(f"{path}:{n}"), key, row.get(key, _MISSING), ok, expected)
        out.setdefault((row["task"], row["seed"]), {})[row["doc_id"]] = row
    return out
