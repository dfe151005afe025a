"""Opening the files of a dataset: inside its folder, regular files only, reads bounded by a cap.

Every reader of a dataset file (the index and shards at open, ``verify``, the manifest, the
informational build report) goes through here, so a symlink out of the folder, a FIFO or device
planted in place of a file, or a file far larger than it should be is refused the same way
everywhere, with a typed error, and never hangs or exhausts memory.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import DatasetChangedError, NotAPackerFileError, TruncatedFileError, UnsafePathError

__all__ = ["open_inside", "open_dataset_file", "read_capped"]

_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
# O_NONBLOCK: opening a FIFO planted in place of a dataset file must not block; the descriptor is
# switched back to blocking once fstat has shown a regular file.
_PROBE_FLAGS = _OPEN_FLAGS | getattr(os, "O_NONBLOCK", 0)


def open_inside(root: str | os.PathLike[str], relative: str) -> tuple[int, str]:
    """Open ``root/relative`` for reading if it really lies inside ``root`` and is a regular file.

    Returns:
        ``(fd, real_path)``: a blocking, close-on-exec descriptor the caller must close.

    Raises:
        UnsafePathError: the path resolves outside ``root`` (a symlink out) [R19].
        DatasetChangedError: the file does not exist (replaced or deleted while in use) [R43].
        NotAPackerFileError: not a regular file (a folder, FIFO, device) [R44].
        TruncatedFileError: any other failure to open it (permissions, I/O).
    """
    root_path = Path(root)
    full = root_path / relative
    real_root = os.path.realpath(root_path)
    real = os.path.realpath(full)
    if os.path.commonpath([real_root, real]) != real_root:  # [R19]
        raise UnsafePathError(f"{relative!r} resolves outside the dataset folder (to {real})", path=root_path)
    try:
        fd = os.open(real, _PROBE_FLAGS)
    except FileNotFoundError:  # [R43]
        raise DatasetChangedError(f"{relative} is missing: the dataset was replaced or deleted while in use, "
                                  f"or the copy is incomplete", path=full) from None
    except OSError as exc:
        raise TruncatedFileError(f"cannot open {relative}: {exc.strerror or exc}", path=full) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # [R44] a folder, FIFO or device would fail later, or hang
        os.close(fd)
        raise NotAPackerFileError(f"{relative} is not a regular file", path=full)
    os.set_blocking(fd, True)
    return fd, real


def open_dataset_file(root: str | os.PathLike[str], relative: str, expected_size: int) -> tuple[int, str]:
    """``open_inside``, and the file must have the size the manifest records [R20].

    Raises:
        TruncatedFileError: the size on disk differs (truncated or extended), besides the
            errors of ``open_inside``.
    """
    fd, real = open_inside(root, relative)
    size = os.fstat(fd).st_size
    if size != expected_size:  # [R20]
        os.close(fd)
        raise TruncatedFileError(f"is {size} bytes on disk but the manifest says {expected_size}"
                                 f" ({'truncated' if size < expected_size else 'extended'})",
                                 path=Path(root) / relative)
    return fd, real


def read_capped(root: str | os.PathLike[str], relative: str, cap: int) -> bytes | None:
    """The whole of ``root/relative`` if it is at most ``cap`` bytes; None if it is larger.

    For files whose size the manifest does not record (the manifest itself, the build report):
    the read allocates what ``fstat`` says (capped), not the cap, and never reads past the cap
    even if the file grows meanwhile.

    Raises:
        the errors of ``open_inside``.
    """
    fd, _ = open_inside(root, relative)
    try:
        size = os.fstat(fd).st_size
        if size > cap:
            return None
        chunks, total = [], 0
        while total <= cap:
            chunk = os.read(fd, min(max(size - total, 0) + 1, cap + 1 - total) or 1)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except OSError as exc:
        raise TruncatedFileError(f"cannot read {relative}: {exc.strerror or exc}", path=Path(root) / relative) from None
    finally:
        os.close(fd)
    return None if total > cap else b"".join(chunks)
