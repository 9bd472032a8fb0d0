"""Writing files so that a reader finds the old content or the new, never half of either.

Every file mmcomp-eval publishes (result files, caches) is written to a
temporary file in the target's own folder (a rename is atomic only within
one file system), flushed to disk, given the permissions the user's umask
asks for, and renamed over the target. A run that is killed or meets a full
disk therefore leaves the previous file whole, plus at most a hidden
temporary file that the next write replaces.

``mkstemp`` creates files 0600 and ``mkdtemp`` folders 0700 whatever the
umask says; renamed into place as they are, results on a shared server
would be private to their owner while everything else the user writes
follows the umask. So both get ``0o666``/``0o777`` minus the umask first.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO


def make_folder(path: Path, what: str) -> Path:
    """Create ``path`` (and parents) for output, or say in one line why not (``what``: the flag that named it)."""
    from mmcomp_eval.errors import UserError

    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{what} {path}: cannot create this folder ({exc.strerror or exc}); "
                        "give a folder you can write to") from None
    return path


def current_umask() -> int:
    """The process umask, read without changing it where Linux allows."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)  # elsewhere the only way to read it is to set it
    os.umask(old)
    return old


def file_mode() -> int:
    """What ``open(path, "w")`` would give a new file."""
    return 0o666 & ~current_umask()


def folder_mode() -> int:
    """What ``mkdir`` would give a new folder."""
    return 0o777 & ~current_umask()


@contextmanager
def replacing(target: Path, mode: str = "w", durable: bool = True) -> Iterator[IO]:
    """A file whose content replaces ``target`` when the block ends without an exception.

    ``durable``: fsync before the rename, so that the new content, not an
    empty file, is what survives a power cut; caches that are cheap to
    recompute skip it.
    """
    target = Path(target)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8") as f:
            yield f
            _seal(f, durable)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def stage_text(target: Path, text: str) -> Path:
    """A finished, durable temporary copy of ``target`` holding ``text``, to pass to :func:`rename_together`."""
    target = Path(target)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            _seal(f, durable=True)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def _seal(f: IO, durable: bool) -> None:
    """Flush (and fsync) a finished temporary file and give it the umask's permissions."""
    f.flush()
    if durable:
        os.fsync(f.fileno())
    os.fchmod(f.fileno(), file_mode())


def write_text(target: Path, text: str, durable: bool = True) -> None:
    with replacing(target, "w", durable) as f:
        f.write(text)


@contextmanager
def replacing_folder(target: Path) -> Iterator[Path]:
    """A fresh folder whose content replaces the folder ``target`` when the block ends without an exception.

    A non-empty folder cannot be renamed over another, so the old one is
    moved aside first and removed after: readers may miss ``target`` for
    the instant between the two renames, but never see it half written.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        os.chmod(tmp, folder_mode())
        yield tmp
        old = None
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
            os.replace(target, old / "x")
        os.replace(tmp, target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def staged_link(source: Path, target: Path) -> Path:
    """A temporary name next to ``target`` with ``source``'s content, to pass to :func:`rename_together`.

    A hard link where the file system has them (Linux, macOS, NTFS: no extra
    space, and no symbolic link, which Windows grants only to some users and
    some copy tools drop), else a durable copy with the umask's permissions.
    """
    source, target = Path(source), Path(target)
    tmp = target.parent / f".{target.name}.{secrets.token_hex(6)}.tmp"
    try:
        os.link(source, tmp)
    except OSError:
        try:
            shutil.copyfile(source, tmp)
            fsync_file(tmp)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    return tmp


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_HELD_BACK = ("SIGINT", "SIGTERM", "SIGHUP")


def rename_together(moves: Sequence[tuple[Path, Path]]) -> None:
    """Rename each (source, target) in order, with SIGINT/SIGTERM/SIGHUP held back until all are done.

    Files that belong together (``results.json`` and its ``samples.jsonl``)
    cannot be replaced in one atomic step; holding back the signals a user
    or a scheduler sends leaves only SIGKILL or a power cut able to split
    them, and readers check the pair anyway (``samples_sha256``).
    """
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        for src, dst in moves:
            os.replace(src, dst)
        return
    caught: list[int] = []
    saved = {}
    for name in _HELD_BACK:
        sig = getattr(signal, name, None)
        if sig is not None:
            saved[sig] = signal.signal(sig, lambda signum, _frame: caught.append(signum))
    try:
        for src, dst in moves:
            os.replace(src, dst)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(caught):
            signal.raise_signal(sig)
