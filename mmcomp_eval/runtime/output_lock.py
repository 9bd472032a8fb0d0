"""One run at a time per ``--output-path``.

Two runs writing into one folder used to both exit 0 with their samples
interleaved. Each run therefore takes an exclusive ``flock`` on
``OUT/.mmcomp-eval.lock`` before its model loads, and a second run is
refused with the first one's pid and command. ``flock`` belongs to the open
file, so the kernel drops it when its holder dies, SIGKILL included: a lock
never outlives its run and never needs clearing by hand. (It does not work
across machines on some network file systems; where the file system refuses
locks outright the run goes on with a warning, unprotected against a
second run, though the result files are still replaced whole.)

``--num-processes N`` takes the lock in the launcher and hands the open file
to its process 0 (the only one that writes results), so the lock is held as
long as either lives. The holder deletes the file while still holding the
lock; a run that opened the file just before checks after locking that the
name still points to what it locked.
"""

from __future__ import annotations

import datetime as dt
import errno
import fcntl
import json
import logging
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from mmcomp_eval.errors import UserError

log = logging.getLogger(__name__)

LOCK_FILE = ".mmcomp-eval.lock"
#: how a launcher tells its process 0 which open file holds the lock
INHERITED_FD = "MMCOMP_OUTPUT_LOCK_FD"


@dataclass
class OutputLock:
    path: Path
    fd: int
    #: False in a process that was handed the lock by its launcher: the launcher removes the file
    owner: bool = True

    @classmethod
    def acquire(cls, folder: Path) -> OutputLock | None:
        """The lock on ``folder``; None where its file system has no locks (with a warning)."""
        path = Path(folder) / LOCK_FILE
        inherited = _inherited(path)
        if inherited is not None:
            return cls(path, inherited, owner=False)
        while True:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
            except OSError as exc:
                raise UserError(f"--output-path {folder}: cannot write there ({exc.strerror}); "
                                "make it writable or pick another --output-path") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = _describe_holder(fd)
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise UserError(f"--output-path {folder} is in use by another mmcomp-eval run ({holder}); "
                                    "wait for it to finish or pick another --output-path") from None
                path.unlink(missing_ok=True)
                log.warning("--output-path %s: cannot lock it (%s); a second run writing there at the same time "
                            "would not be noticed", folder, exc.strerror)
                return None
            if _same_file(path, fd):
                break
            os.close(fd)  # the previous holder removed it after we opened it: lock the new one
        try:
            info = {"pid": os.getpid(), "host": socket.gethostname(), "command": sys.argv,
                    "started": dt.datetime.now().isoformat(timespec="seconds")}
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(info).encode(), 0)
        except OSError as exc:
            path.unlink(missing_ok=True)
            os.close(fd)
            raise UserError(f"--output-path {folder}: cannot write there ({exc.strerror}); "
                            "free space or pick another --output-path") from None
        return cls(path, fd)

    def child_env(self) -> dict[str, str]:
        """Variables that let a child started with ``pass_fds=[self.fd]`` adopt this lock."""
        return {INHERITED_FD: str(self.fd)}

    def release(self) -> None:
        if self.fd < 0:
            return
        if self.owner:
            self.path.unlink(missing_ok=True)  # while still locked: see the module docstring
        os.close(self.fd)
        self.fd = -1


def _same_file(path: Path, fd: int) -> bool:
    try:
        a, b = os.stat(path), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _inherited(path: Path) -> int | None:
    """The lock's file descriptor when a launcher handed it to this process, else None."""
    value = os.environ.get(INHERITED_FD)
    if not value or not value.isdigit():
        return None
    fd = int(value)
    try:
        return fd if _same_file(path, fd) else None
    except OSError:  # not an open file here
        return None


def _describe_holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 65536, 0))
        command = " ".join(info["command"])
        command = command if len(command) <= 200 else command[:197] + "..."
        return f"pid {info['pid']} on {info['host']} since {info['started']}: {command}"
    except (OSError, ValueError, KeyError, TypeError):
        return "it has not said which yet"
