"""On-disk cache of keyframes, so that a second run decodes nothing.

A keyframe is stored as a lossless PNG under
``<cache>/keyframes/<k[:2]>/<k>.png`` where ``k`` is the SHA-256 of the
source's identity (resolved path, size and modification time of the video,
tar or each frame file used), the frame numbers, the strategy with its
options, and the resize setting. Changing any of them makes a new entry;
replacing a video in place changes its size or mtime and therefore its key.

Models always read keyframes back from the cache (first run included), so a
cached run sees exactly the pixels a fresh run sees. Writes go to a
temporary file first and are renamed into place, so a crash or a concurrent
run never leaves a half-written keyframe.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

from mmcomp_eval import paths

from mmcomp_eval.runtime import atomic_files

if TYPE_CHECKING:
    from PIL import Image

#: bump when the way keyframes are made changes (resampling, colour conversion)
CACHE_VERSION = 1


class KeyframeCache:
    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root is not None else paths.cache_dir() / "keyframes"
        self.hits = 0
        self.misses = 0

    @staticmethod
    def key(identity: list, frames: list[int], strategy: dict, resize: int) -> str:
        blob = json.dumps({"v": CACHE_VERSION, "source": identity, "frames": list(frames),
                           "strategy": strategy, "resize": resize}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.png"

    def get(self, key: str) -> Path | None:
        p = self.path(key)
        if p.is_file() and p.stat().st_size > 0:
            self.hits += 1
            return p
        self.misses += 1
        return None

    def put(self, key: str, image: Image.Image) -> Path:
        p = self.path(key)
        p.parent.mkdir(parents=True, exist_ok=True)
        with atomic_files.replacing(p, "wb", durable=False) as f:  # a lost keyframe is decoded again
            image.save(f, format="PNG")
        return p


def load_image(path: Path) -> Image.Image:
    """A cached keyframe as an RGB image (fully read, file closed)."""
    from PIL import Image

    with Image.open(path) as im:
        im.load()
        return im.convert("RGB")
