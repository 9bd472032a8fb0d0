"""Real disk faults for tests: a small file system that fills up, a folder that cannot be written.

Both need the kernel's help: a tmpfs mount (root, or a container allowed to
mount) for a full disk, and for a read-only folder either a normal user
(chmod 0555) or, for root (who ignores permissions), a read-only tmpfs.
Where neither is possible the test is skipped, saying why.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def _mount_tmpfs(path: Path, options: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip() or r.returncode}); needs root")


def _unmount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


@contextmanager
def small_disk(path: Path, size_kb: int) -> Iterator[Path]:
    """A real file system of ``size_kb`` KiB at ``path``."""
    _mount_tmpfs(path, f"size={size_kb}k,mode=0777")
    try:
        yield path
    finally:
        _unmount(path)


def fill(disk: Path, leave_bytes: int) -> Path:
    """Fill ``disk`` with one file until about ``leave_bytes`` are free; delete the file to free the space."""
    st = os.statvfs(disk)
    free = st.f_bavail * st.f_frsize
    filler = disk / "filler"
    filler.write_bytes(b"\0" * max(0, free - leave_bytes))
    return filler


@contextmanager
def read_only_folder(path: Path) -> Iterator[Path]:
    """An existing folder this process cannot create files in."""
    if os.geteuid() != 0:
        path.mkdir(parents=True)
        path.chmod(0o555)
        try:
            yield path
        finally:
            path.chmod(0o755)
        return
    _mount_tmpfs(path, "ro,size=64k")
    try:
        yield path
    finally:
        _unmount(path)
