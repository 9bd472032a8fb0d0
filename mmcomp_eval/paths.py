"""Where mmcomp-eval keeps caches and finds reference data."""

from __future__ import annotations

import os
from pathlib import Path

from mmcomp_eval.errors import UserError

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
    """``$MMCOMP_DATA_DIR``: a folder laid out like the project's reference data.

    Set but missing is an error, not a fallback: whoever set it expects those
    files to be read, and silently downloading or failing later hides a typo.
    """
    env = os.environ.get("MMCOMP_DATA_DIR")
    if not env:
        return None
    d = Path(env).expanduser()
    if not d.is_dir():
        raise UserError(f"MMCOMP_DATA_DIR={env}: no such folder; point it at the reference data folder "
                        "(holding ek100/, msrvtt/, ...) or unset it")
    return d


def is_offline() -> bool:
    return any(os.environ.get(v, "").lower() in {"1", "true", "yes"}
               for v in ("MMCOMP_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
