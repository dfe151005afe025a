"""The build's working folder ``OUT/.packer-build``: its names, the output lock, I/O error mapping."""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from ..errors import BuildError, BuildLockedError

__all__ = ["STAGING_DIR", "LOCK_NAME", "PLAN_NAME", "RECORD_DIR", "TEMP_DIR", "SPOOL_DIR", "APPEND_SPOOL_DIR", "build_lock", "io_error"]

STAGING_DIR = ".packer-build"
LOCK_NAME = ".packer.lock"
PLAN_NAME = "plan.pkp"
RECORD_DIR = "done"
TEMP_DIR = "tmp"
SPOOL_DIR = "spool"  # compressed tar sources, decompressed once while listing (sources/tar.py)
APPEND_SPOOL_DIR = ".packer-append-spool"  # the same for packer append (its staging is made after listing)


class build_lock:
    """An ``flock`` on ``OUT/.packer.lock``: exclusive for a build or finish, shared for a part.

    Two builds into one folder cannot both run; the second fails at once with BuildLockedError.
    The kernel drops the lock when the process dies, so a killed build never leaves it held.
    """

    def __init__(self, out: Path, *, shared: bool = False) -> None:
        self.path = out / LOCK_NAME
        self.shared = shared
        self._fd: int | None = None

    def __enter__(self) -> "build_lock":
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise BuildError(f"cannot create the lock file: {exc.strerror}", path=self.path) from None
        try:
            fcntl.flock(self._fd, (fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            self._fd = None
            raise BuildLockedError("another packer build is writing this output folder; wait for it "
                                   "or stop it", path=self.path.parent) from None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None



def io_error(exc: OSError, what: str, path: object) -> BuildError:
    if exc.errno == errno.ENOSPC:
        return BuildError(f"the disk is full while {what}; free space and run again with --resume", path=path)
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return BuildError(f"permission denied while {what} (is the output folder writable?)", path=path)
    return BuildError(f"I/O error while {what}: {exc.strerror or exc}", path=path)

