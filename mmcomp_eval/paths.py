"""Where mmcomp-eval keeps caches and finds reference data."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def cache_dir() -> Path:
    """``$MMCOMP_CACHE_DIR``, else ``$XDG_CACHE_HOME/mmcomp_eval``, else ``~/.cache/mmcomp_eval``."""
    env = os.environ.get("MMCOMP_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "mmcomp_eval"


def data_dir() -> Path | None:
    """``$MMCOMP_DATA_DIR``: a folder laid out like the project's reference data."""
    env = os.environ.get("MMCOMP_DATA_DIR")
    return Path(env).expanduser() if env else None


def is_offline() -> bool:
    return any(os.environ.get(v, "").lower() in {"1", "true", "yes"}
               for v in ("MMCOMP_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
