"""On-disk cache of per-video (and per-audio) embeddings.

Decoding frames and running an image tower is by far the most expensive part
of a retrieval run, and it is the same for the original captions and every
perturbed caption set, and for reruns. So each item's embedding is stored as
one ``.npy`` file under ``$MMCOMP_CACHE_DIR/retrieval/<model key>/``, where

* the model key hashes the model's fingerprint (checkpoint identity, pooling,
  frame count), so another checkpoint or ``n_frames`` never reuses an entry;
* the item key hashes the source file's identity: absolute path, size and
  modification time (a content hash would cost a full read of every video).
  Replacing a file changes its size or mtime and so misses the cache.

Writes are atomic (temporary file + rename), so an interrupted run never
leaves a truncated entry that a later run would trust.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from mmcomp_eval.runtime import atomic_files
from mmcomp_eval.paths import cache_dir
from mmcomp_eval.evaluation.results import sha256_json


def file_identity(path: str | Path) -> dict[str, Any]:
    """What makes a file 'the same file' for the cache: resolved path, size, mtime (ns)."""
    p = Path(path).resolve()
    st = p.stat()
    return {"path": str(p), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


class EmbeddingCache:
    """Embeddings keyed by (model fingerprint, item key); counts hits and misses."""

    def __init__(self, fingerprint: dict[str, Any], *, enabled: bool = True, root: Path | None = None):
        self.model_key = sha256_json(fingerprint)[:24]
        self.enabled = enabled
        self.directory = (root or cache_dir() / "retrieval") / self.model_key
        self.hits = 0
        self.misses = 0

    def key(self, path: str | Path, **extra: Any) -> str:
        return sha256_json({**file_identity(path), **extra})

    def _file(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.npy"

    def get(self, key: str) -> np.ndarray | None:
        if not self.enabled:
            return None
        f = self._file(key)
        try:
            value = np.load(f, allow_pickle=False)
        except (OSError, ValueError):  # absent, or unreadable: recompute and overwrite
            self.misses += 1
            return None
        self.hits += 1
        return value

    def put(self, key: str, value: np.ndarray) -> None:
        if not self.enabled:
            return
        f = self._file(key)
        f.parent.mkdir(parents=True, exist_ok=True)
        with atomic_files.replacing(f, "wb", durable=False) as out:  # a lost entry is recomputed
            np.save(out, np.asarray(value, dtype=np.float32), allow_pickle=False)
