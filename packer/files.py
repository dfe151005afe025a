"""Opening the files of a dataset: inside its folder, regular files only, reads bounded by a cap.

Every reader of a dataset file (the index and shards at open, ``verify``, the manifest, the
informational build report) goes through here, so a symlink out of the folder, a FIFO or device
planted in place of a file, or a file far larger than it should be is refused the same way
everywhere, with a typed error, and never hangs or exhausts memory.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, Iterator

from .errors import DatasetChangedError, NotAPackerFileError, TruncatedFileError, UnsafePathError

__all__ = ["open_inside", "open_dataset_file", "read_capped", "open_nonblocking", "read_fd_capped",
           "iter_json_lines", "MAX_REPORT_BYTES", "MAX_REPORT_LINE"]

#: How much of an informational JSON-lines file (the build report) is read: it lists every
#: rejected file, so it may be large, but it is streamed line by line and never trusted.
MAX_REPORT_BYTES = 4 << 30
#: Longest line kept (a rejection is a few hundred bytes; a longer line is skipped, not parsed).
MAX_REPORT_LINE = 1 << 20

_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
# O_NONBLOCK: opening a FIFO planted in place of a dataset file must not block; the descriptor is
# switched back to blocking once fstat has shown a regular file.
_PROBE_FLAGS = _OPEN_FLAGS | getattr(os, "O_NONBLOCK", 0)


def open_nonblocking(path: str | os.PathLike[str], *, follow_links: bool = True) -> tuple[int, os.stat_result]:
    """Open ``path`` for reading without blocking on a FIFO, and ``fstat`` the open descriptor.

    The descriptor is switched back to blocking only if it is a regular file; the caller decides
    what a non-regular file means (and must close the descriptor either way). The stat result
    describes what was opened, not what a path lookup saw earlier, so a file swapped after it
    was listed is seen for what it is now.

    Args:
        path: the file to open.
        follow_links: False adds ``O_NOFOLLOW``: a symlink in the last component is refused
            (``OSError`` with ``ELOOP``).

    Returns:
        ``(fd, stat)``: a close-on-exec descriptor and the ``fstat`` of it.

    Raises:
        OSError: the open failed (``FileNotFoundError``, ``PermissionError``, ``ELOOP``...).
    """
    flags = _PROBE_FLAGS | (0 if follow_links else getattr(os, "O_NOFOLLOW", 0))
    fd = os.open(path, flags)
    try:
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def read_fd_capped(fd: int, cap: int, size_hint: int) -> bytes | None:
    """Read ``fd`` to its end, but never more than ``cap + 1`` bytes; None if it holds more than ``cap``.

    ``size_hint`` (what ``fstat`` said) sizes the first read, so a file of the expected size
    costs one read plus the end-of-file read, and a file that grows meanwhile is caught by the
    ``cap + 1``-th byte instead of being read without bound.

    Raises:
        OSError: a read failed.
    """
    chunks, total = [], 0
    while total <= cap:
        chunk = os.read(fd, min(max(size_hint - total, 0) + 1, cap + 1 - total) or 1)
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return None if total > cap else (chunks[0] if len(chunks) == 1 else b"".join(chunks))


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
        fd, info = open_nonblocking(real)
    except FileNotFoundError:  # [R43]
        raise DatasetChangedError(f"{relative} is missing: the dataset was replaced or deleted while in use, "
                                  f"or the copy is incomplete", path=full) from None
    except OSError as exc:
        raise TruncatedFileError(f"cannot open {relative}: {exc.strerror or exc}", path=full) from None
    if not stat.S_ISREG(info.st_mode):  # [R44] a folder, FIFO or device would fail later, or hang
        os.close(fd)
        raise NotAPackerFileError(f"{relative} is not a regular file", path=full)
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
        return read_fd_capped(fd, cap, size)
    except OSError as exc:
        raise TruncatedFileError(f"cannot read {relative}: {exc.strerror or exc}", path=Path(root) / relative) from None
    finally:
        os.close(fd)


def iter_json_lines(root: str | os.PathLike[str], relative: str, *, must_contain: bytes = b"",
                    max_bytes: int = MAX_REPORT_BYTES, max_line: int = MAX_REPORT_LINE) -> Iterator[dict[str, Any]]:
    """The JSON objects of an informational JSON-lines file, read with the same rules as any dataset file.

    The file must lie inside ``root`` and be a regular file (``open_inside``: a FIFO or a link to
    ``/dev/zero`` is refused at once, never read). At most ``max_bytes`` are read, a line longer
    than ``max_line`` is skipped without being parsed, and so is a line that is not valid UTF-8
    JSON, nests deeper than ``format.MAX_JSON_DEPTH``, or is not an object: informational
    content is ignored when it is not what the writer writes, never trusted. A missing file or
    one that cannot be opened yields nothing.

    Args:
        must_contain: skip lines without these bytes before parsing them (a cheap filter).
    """
    from .errors import PackerError
    from .format import MAX_JSON_DEPTH, json_nesting_depth

    try:
        fd, _ = open_inside(root, relative)
    except PackerError:
        return
    with os.fdopen(fd, "rb") as handle:
        consumed = 0
        while consumed < max_bytes:
            try:
                line = handle.readline(max_line + 1)
            except OSError:
                return
            if not line:
                return
            consumed += len(line)
            if len(line) > max_line:
                while line and not line.endswith(b"\n") and consumed < max_bytes:  # skip the rest of it
                    line = handle.readline(max_line + 1)
                    consumed += len(line)
                continue
            if must_contain and must_contain not in line:
                continue
            if json_nesting_depth(line) > MAX_JSON_DEPTH:
                continue
            try:
                entry = json.loads(line.decode("utf-8"))
            except (UnicodeDecodeError, ValueError, RecursionError):
                continue
            if isinstance(entry, dict):
                yield entry
