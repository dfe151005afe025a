"""Reading a listed source file's bytes as packing does: bounded, checked against the listing.

``read_listed`` is the one read of a source file under a build's root (packing, and
``--reject-duplicates`` before the plan); ``read_source`` reads one listing row, a file or an
archive member, whichever the listing holds.
"""

from __future__ import annotations

import os
import stat
from typing import Any

from .._internal.files import FolderReader, read_fd_capped
from .._internal.names import source_name
from ..sources import Rejection, file_stamp
from ..sources.members import MemberReader

__all__ = ["read_listed", "read_opened", "read_source"]


def read_source(listing: Any, row: int, archive: MemberReader, files: FolderReader) -> bytes | None:
    """The listed bytes of listing row ``row`` (a file under the root, or an archive member read by
    offset), read with the packing's checks (bounded, the listed size and stamp); None when they
    cannot be read now: packing then rejects the file with the reason."""
    size = int(listing.sizes[row])
    if listing.members is not None:
        data, reason, _ = archive.read(row, size)
        return None if reason else data
    key = listing.key(row)
    name = source_name(key, listing.metadata(row)) if "%" in key else None
    stamp = int(listing.stamps[row]) if len(listing.stamps) == len(listing.sizes) else 0
    data, _ = read_listed(files, key if name is None else os.fsdecode(name), key, size, stamp)
    return None if isinstance(data, Rejection) else data


def read_listed(files: FolderReader, relative: str, key: str, listed_size: int, listed_stamp: int = 0
                 ) -> tuple[bytes | Rejection, bool | None]:
    """The file's bytes if it is still the regular file of ``listed_size`` bytes that was listed,
    and whether it was reached inside the source without a link (``FolderReader.open``).

    The read is bounded whatever the file has become since it was listed (normal with
    ``--plan-only`` then ``--part``, ``--resume``, or a long listing): opened with ``O_NONBLOCK``
    so a FIFO swapped in cannot hang the worker, checked with ``fstat`` on the open descriptor
    (a link to ``/dev/zero`` is a device, not a regular file), and read for at most
    ``listed_size + 1`` bytes so a file that grows, or lies about its size, is never read without
    bound. When the listing recorded the file's stamp (its mtime: image-folder listings do), a
    file rewritten or replaced since, even at the same size, is refused too. Symlinks are
    followed on purpose: the listing follows them, and the checks apply to what the descriptor
    refers to, wherever the link points.

    The read asks for ``listed_size + 1`` bytes at once: a regular file that returns exactly
    ``listed_size`` has ended (a local file reads short only at its end), so the usual second
    read that sees the end costs nothing; a shorter read goes on as ``files.read_fd_capped`` does.
    """
    try:
        fd, info, inside = files.open(relative)
    except FileNotFoundError:
        return Rejection(key, "missing", "the file vanished after it was listed"), None
    except PermissionError as exc:
        return Rejection(key, "unreadable", f"permission denied: {exc.strerror}"), None
    except OSError as exc:
        return Rejection(key, "unreadable", f"open failed: {exc.strerror or exc}"), None
    return read_opened(fd, info, key, listed_size, listed_stamp), inside


def read_opened(fd: int, info: os.stat_result, key: str, listed_size: int, listed_stamp: int) -> bytes | Rejection:
    """``_read_listed`` once the file is open (closes ``fd``)."""
    try:
        if not stat.S_ISREG(info.st_mode):
            return Rejection(key, "changed-during-build",
                             f"was a regular file of {listed_size} bytes when listed, is now "
                             f"{_file_kind(info.st_mode)}")
        if info.st_size != listed_size:
            return Rejection(key, "changed-during-build",
                             f"listed as {listed_size} bytes, is now {info.st_size} bytes")
        if listed_stamp and file_stamp(info) != listed_stamp:
            return Rejection(key, "changed-during-build",
                             "rewritten or replaced since it was listed (another modification time, "
                             "same size)")
        data = os.read(fd, listed_size + 1)
        if 0 < len(data) < listed_size:  # a short read: the rest, capped as ever
            rest = read_fd_capped(fd, listed_size - len(data), listed_size - len(data))
            data = None if rest is None else data + rest
    except PermissionError as exc:
        return Rejection(key, "unreadable", f"permission denied: {exc.strerror}")
    except OSError as exc:
        return Rejection(key, "unreadable", f"read failed: {exc.strerror or exc}")
    finally:
        os.close(fd)
    if data is None or len(data) > listed_size:
        return Rejection(key, "changed-during-build",
                         f"listed as {listed_size} bytes, but it grew while it was read")
    if len(data) != listed_size:
        return Rejection(key, "changed-during-build",
                         f"listed as {listed_size} bytes, read {len(data)} bytes")
    return data


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a folder"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"
