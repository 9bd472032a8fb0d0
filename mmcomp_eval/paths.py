"""Where mmcomp-eval keeps caches, finds reference data and finds its own built-in files."""

from __future__ import annotations

import os
import re
from pathlib import Path

from mmcomp_eval.errors import UserError

#: The folder holding the ``mmcomp_eval`` package: the repository root in a
#: source checkout or an editable install, but ``site-packages`` (or a
#: ``pip install --target`` folder) once installed from a wheel, where other
#: distributions' files sit next to it. Ask :func:`source_checkout` before
#: treating it as this project's repository.
PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent

#: Where a wheel carries the top-level ``tasks/`` and ``prompts/`` (copied by setup.py).
SHIPPED_SUBDIR = "_builtin"

_PROJECT_NAME = re.compile(r'^name\s*=\s*"mmcomp-eval"\s*$', re.MULTILINE)


def source_checkout() -> Path | None:
    """``REPO_ROOT`` when the package runs from this project's source tree, else None.

    Recognised by the project's own ``pyproject.toml`` next to the package, so
    that an installed copy never mistakes a neighbouring ``tasks/`` folder or
    an enclosing git repository for its own.
    """
    try:
        text = (REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8")
    except OSError:
        return None
    return REPO_ROOT if _PROJECT_NAME.search(text) else None


def builtin_dir(name: str) -> Path:
    """The built-in ``tasks`` or ``prompts`` folder.

    A source checkout or an editable install reads the top-level folders
    directly, so an edit there takes effect without a rebuild; an installed
    wheel has copies inside the package (``mmcomp_eval/_builtin/``). When
    neither exists the shipped path is returned, and whoever lists the folder
    reports it missing (:meth:`mmcomp_eval.tasks.index.TaskIndex.build`).
    Real paths, not ``importlib.resources`` handles: task files ``include:``
    their neighbours and find templates next to themselves, and errors name
    files.
    """
    checkout = source_checkout()
    if checkout is not None and (checkout / name).is_dir():
        return checkout / name
    return PACKAGE_DIR / SHIPPED_SUBDIR / name


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
