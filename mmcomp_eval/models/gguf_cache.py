"""A disk cache of GGUF checkpoints converted to plain safetensors.

transformers de-quantises every tensor of a GGUF file each time it loads one
(about 18 s for SmolLM2-135M on two cores), which dominates a short run. The
converted model and tokenizer are saved once, keyed by the GGUF's content
hash, the dtype and the transformers version (the conversion code changes
between releases), and later loads read the safetensors in a few seconds.

Hashing a 100 MB file costs ~0.3 s, so the hash is itself cached, keyed by
path, size and mtime. Conversions are written to a temporary folder beside
the final one and renamed into place, so an interrupted conversion never
leaves a folder that looks complete.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from mmcomp_eval.runtime import atomic_files

log = logging.getLogger(__name__)

_CHUNK = 1 << 20
_HASHES = "gguf-hashes.json"
_META = "mmcomp_gguf.json"
_STALE_S = 24 * 3600


def cache_root() -> Path:
    """``$MMCOMP_CACHE_DIR``, else ``~/.cache/mmcomp_eval``."""
    env = os.environ.get("MMCOMP_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "mmcomp_eval"


def sha256_file(path: str | os.PathLike[str]) -> str:
    """The file's sha256, reusing the cached digest while size and mtime are unchanged."""
    path = Path(path).resolve()
    st = path.stat()
    stamp = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    index_file = cache_root() / _HASHES
    index = _read_json(index_file)
    entry = index.get(str(path))
    if isinstance(entry, dict) and all(entry.get(k) == v for k, v in stamp.items()) and entry.get("sha256"):
        return str(entry["sha256"])
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    sha = digest.hexdigest()
    index = _read_json(index_file)  # re-read: another process may have added entries meanwhile
    index[str(path)] = {**stamp, "sha256": sha}
    try:
        _write_json_atomic(index_file, index)
    except OSError as exc:  # a read-only cache only costs rehashing next time
        log.warning("could not record GGUF hash in %s: %s", index_file, exc)
    return sha


def converted_dir(sha256: str, dtype: str) -> Path:
    """Where the conversion of a GGUF with this hash, in this dtype, lives."""
    import transformers

    return cache_root() / "gguf" / f"{sha256[:24]}-{dtype}-tf{transformers.__version__}"


def lookup(gguf_path: str | os.PathLike[str], dtype: str) -> tuple[Path, str]:
    """The cache folder for ``gguf_path`` (which may not exist yet) and the file's sha256."""
    sha = sha256_file(gguf_path)
    return converted_dir(sha, dtype), sha


def ensure_converted(gguf_path: str | os.PathLike[str], dtype: str = "float32") -> tuple[Path | None, str, bool]:
    """Return ``(folder, sha256, converted_now)`` for ``gguf_path``.

    ``folder`` is ``None`` when the cache cannot be written (read-only disk,
    disk full): the caller then loads the GGUF directly, only more slowly.
    """
    gguf_path = Path(gguf_path).resolve()
    target, sha = lookup(gguf_path, dtype)
    if (target / _META).is_file():
        return target, sha, False
    log.info("converting %s to a transformers folder (once; cached in %s)", gguf_path.name, target)
    started = time.perf_counter()
    try:
        _convert(gguf_path, target, sha, dtype)
    except OSError as exc:
        log.warning("GGUF cache unavailable (%s); loading %s without it", exc, gguf_path.name)
        return None, sha, False
    log.info("converted %s into %s in %.1f s", gguf_path.name, target, time.perf_counter() - started)
    return target, sha, True


def _convert(gguf_path: Path, target: Path, sha: str, dtype: str) -> None:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(target.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}-{os.getpid()}-", dir=target.parent))
    try:
        os.chmod(tmp, atomic_files.folder_mode())  # mkdtemp's 0700 would make the shared cache private
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        model = AutoModelForCausalLM.from_pretrained(
            gguf_path.parent, gguf_file=gguf_path.name, dtype=getattr(torch, dtype)
        )
        # The weights are plain de-quantised tensors now; the GGUF quantizer
        # only marks the model unsaveable and would make the copy reload as GGUF.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        meta = {
            "source": str(gguf_path),
            "sha256": sha,
            "dtype": dtype,
            "transformers": transformers.__version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        (tmp / _META).write_text(json.dumps(meta, indent=1))
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / _META).is_file():
                raise
            # another process finished the same conversion first; keep theirs
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _remove_stale_temps(folder: Path) -> None:
    """Delete temporary folders left by conversions that were killed."""
    now = time.time()
    for entry in folder.glob(".tmp-*"):
        try:
            pid = int(entry.name.rsplit("-", 2)[-2])
        except (ValueError, IndexError):
            pid = -1
        try:
            stale = not _alive(pid) or now - entry.stat().st_mtime > _STALE_S
        except OSError:
            continue
        if stale:
            shutil.rmtree(entry, ignore_errors=True)


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_files.write_text(path, json.dumps(data, indent=1))
