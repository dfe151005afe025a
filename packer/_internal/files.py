"""Opening files packer did not write itself: a dataset's files (inside its folder), and every file a
user names (``--fields``, ``--classes``, a manifest, a COCO file): regular files only, reads bounded
by a cap, JSON depth checked without recursion.

Every reader of a dataset file (the index and shards at open, ``verify``, the manifest, the
informational build report) and of a user-named file goes through here, so a symlink out of the
folder, a FIFO or device planted in place of a file (``--fields /dev/zero``), a file far larger
than it should be, or JSON nested ten thousand levels deep is refused the same way everywhere,
with a typed error, and never hangs, exhausts memory or ends in a ``RecursionError``.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import IO, Any, Iterator

import numpy as np

from ..errors import (DatasetChangedError, NotAPackerFileError, OptionError, PackerError, TruncatedFileError,
                     UnsafePathError)

__all__ = ["open_inside", "open_dataset_file", "read_capped", "open_nonblocking", "read_fd_capped", "FolderReader",
           "iter_json_lines", "MAX_REPORT_BYTES", "MAX_REPORT_LINE", "open_user_file", "read_user_file",
           "read_user_json", "json_depth_exceeds", "MAX_USER_FILE_BYTES", "MAX_USER_JSON_DEPTH"]

#: How much of an informational JSON-lines file (the build report) is read: it lists every
#: rejected file, so it may be large, but it is streamed line by line and never trusted.
MAX_REPORT_BYTES = 4 << 30
#: Longest line kept (a rejection is a few hundred bytes; a longer line is skipped, not parsed).
MAX_REPORT_LINE = 1 << 20

_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
# O_NONBLOCK: opening a FIFO planted in place of a dataset file must not block; the descriptor is
# switched back to blocking once fstat has shown a regular file.
_PROBE_FLAGS = _OPEN_FLAGS | getattr(os, "O_NONBLOCK", 0)


def open_nonblocking(path: str | os.PathLike[str], *, follow_links: bool = True,
                     dir_fd: int | None = None) -> tuple[int, os.stat_result]:
    """Open ``path`` for reading without blocking on a FIFO, and ``fstat`` the open descriptor.

    The descriptor is switched back to blocking only if it is a regular file; the caller decides
    what a non-regular file means (and must close the descriptor either way). The stat result
    describes what was opened, not what a path lookup saw earlier, so a file swapped after it
    was listed is seen for what it is now.

    Args:
        path: the file to open.
        follow_links: False adds ``O_NOFOLLOW``: a symlink in the last component is refused
            (``OSError`` with ``ELOOP``).
        dir_fd: a directory descriptor ``path`` is relative to (``openat``).

    Returns:
        ``(fd, stat)``: a close-on-exec descriptor and the ``fstat`` of it.

    Raises:
        OSError: the open failed (``FileNotFoundError``, ``PermissionError``, ``ELOOP``...).
    """
    flags = _PROBE_FLAGS | (0 if follow_links else getattr(os, "O_NOFOLLOW", 0))
    fd = os.open(path, flags, dir_fd=dir_fd)
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


# O_PATH: a directory handle that only serves to open what is in it (no read permission needed,
# nothing read); O_NOFOLLOW: a component that is a symlink is refused (ELOOP), not followed.
_FOLDER_FLAGS = (os.O_RDONLY | getattr(os, "O_PATH", 0) | getattr(os, "O_DIRECTORY", 0)
                 | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
_CAN_OPEN_AT = os.open in os.supports_dir_fd and hasattr(os, "O_NOFOLLOW") and hasattr(os, "O_DIRECTORY")


class FolderReader:
    """Opens files under one root through directory handles, never following a link on that way.

    ``open(relative)`` walks ``relative`` one component at a time from a handle on the root, each
    folder opened with ``O_NOFOLLOW`` (handles kept in a small cache, so a file costs one
    ``openat`` beside its siblings), and opens the file itself with ``O_NOFOLLOW`` too. A file
    reached that way lies inside the root by construction: no path is resolved (the
    ``realpath`` + ``commonpath`` check costs one ``lstat`` per component per file). When a
    component is a symlink (or anything else goes wrong: a missing file, a permission), the file
    is opened by its path as before, following links as the listing did, and ``inside`` is None:
    whether it lies inside the root is then answered by ``resolves_inside`` when asked (only a
    rejection that would quote the file's bytes asks).

    Close it (or use it as a context manager): it holds up to ``max_folders`` descriptors.
    """

    def __init__(self, root: str | os.PathLike[str], *, max_folders: int = 128) -> None:
        self.root = os.fspath(root)
        self.max_folders = max_folders
        self._folders: dict[str, int] = {}
        self._root_fd: int | None = None
        if _CAN_OPEN_AT:
            try:
                self._root_fd = os.open(self.root, _FOLDER_FLAGS & ~getattr(os, "O_NOFOLLOW", 0))
            except OSError:
                self._root_fd = None  # every file by its path, as before

    def open(self, relative: str) -> tuple[int, os.stat_result, bool | None]:
        """Open ``root/relative`` for reading, without blocking on a FIFO (``open_nonblocking``).

        Returns:
            ``(fd, fstat, inside)``: ``inside`` is True when the file was reached from the root
            without a link, None when it was opened by its path (links followed).

        Raises:
            OSError: opening by the path failed (``FileNotFoundError``, ``PermissionError``...).
        """
        if self._root_fd is not None:
            folder, _, name = relative.rpartition("/")
            folder_fd = self._folder(folder) if folder else self._root_fd
            if folder_fd is not None and name not in ("", ".", ".."):
                try:
                    fd, info = open_nonblocking(name, follow_links=False, dir_fd=folder_fd)
                    return fd, info, True
                except OSError:
                    pass  # a link, or a failure: the path says what it is, as before
        fd, info = open_nonblocking(os.path.join(self.root, relative))
        return fd, info, None

    def resolves_inside(self, relative: str) -> bool:
        """Whether ``root/relative`` resolves (links followed) to a path inside the resolved root."""
        real_root = os.path.realpath(self.root)
        return os.path.commonpath([real_root, os.path.realpath(os.path.join(self.root, relative))]) == real_root

    def _folder(self, folder: str) -> int | None:
        fd = self._folders.get(folder)
        if fd is not None:
            return fd
        names = folder.split("/")
        if len(names) > self.max_folders or any(name in ("", ".", "..") for name in names):
            return None
        if len(self._folders) + len(names) > self.max_folders:
            self._drop_folders()  # never while walking: a handle in use stays open
        fd, here = self._root_fd, ""
        for name in names:  # iterative: a folder nested thousands deep is no recursion
            here = f"{here}/{name}" if here else name
            cached = self._folders.get(here)
            if cached is None:
                try:
                    cached = os.open(name, _FOLDER_FLAGS, dir_fd=fd)
                except OSError:
                    return None  # a link (ENOTDIR, ELOOP) or gone: its files are opened by their paths
                self._folders[here] = cached
            fd = cached
        return fd

    def _drop_folders(self) -> None:
        for fd in self._folders.values():
            os.close(fd)
        self._folders.clear()

    def close(self) -> None:
        """Close every handle (idempotent)."""
        self._drop_folders()
        if self._root_fd is not None:
            os.close(self._root_fd)
            self._root_fd = None

    def __enter__(self) -> "FolderReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
    from ..errors import PackerError
    from ..format import MAX_JSON_DEPTH, json_nesting_depth

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


# --- files a user names --------------------------------------------------------------------------------

#: Default cap on a small file a user names (``--fields``, ``--classes``): far above any real one.
MAX_USER_FILE_BYTES = 64 << 20
#: Deepest JSON nesting accepted in a file a user names (a schema, a class list, a COCO document).
MAX_USER_JSON_DEPTH = 64


def open_user_file(path: str | os.PathLike[str], *, what: str,
                   error: type[PackerError] = OptionError) -> tuple[IO[bytes], os.stat_result]:
    """Open a file a user named, for reading: a regular file or a typed refusal, never a hang.

    A FIFO (which would block the open or the read), a device (``/dev/zero``: endless), a
    folder or a socket is refused before a byte is read.

    Args:
        what: how the user named it, for messages (``"--fields schema.json"``).
        error: the ``PackerError`` class to raise (``OptionError`` for an option's file,
            ``SourceError`` for a source).

    Returns:
        ``(handle, stat)``: a binary file object (close it) and the ``fstat`` of what was opened.

    Raises:
        ``error``: missing, unreadable, or not a regular file.
    """
    try:
        fd, info = open_nonblocking(path)
    except FileNotFoundError:
        raise error(f"{what}: no such file", path=path) from None
    except OSError as exc:
        raise error(f"{what}: cannot open it ({exc.strerror or exc})", path=path) from None
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        kind = ("a folder" if stat.S_ISDIR(info.st_mode) else "a FIFO" if stat.S_ISFIFO(info.st_mode)
                else "a device" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode) else "not a regular file")
        raise error(f"{what}: {kind}, not a regular file", path=path)
    return os.fdopen(fd, "rb"), info


def read_user_file(path: str | os.PathLike[str], *, what: str, cap: int = MAX_USER_FILE_BYTES,
                   error: type[PackerError] = OptionError) -> bytes:
    """The bytes of a file a user named: a regular file of at most ``cap`` bytes (``open_user_file``).

    Raises:
        ``error``: not a regular file, unreadable, or larger than ``cap`` (even if it grows while read).
    """
    handle, info = open_user_file(path, what=what, error=error)
    with handle:
        if info.st_size > cap:
            raise error(f"{what}: {info.st_size} bytes, over the {cap} bytes such a file may hold", path=path)
        try:
            data = read_fd_capped(handle.fileno(), cap, info.st_size)
        except OSError as exc:
            raise error(f"{what}: cannot read it ({exc.strerror or exc})", path=path) from None
    if data is None:
        raise error(f"{what}: grew past {cap} bytes while it was read", path=path)
    return data


def json_depth_exceeds(data: bytes, limit: int, *, chunk: int = 4 << 20) -> bool:
    """True when the arrays/objects of JSON text ``data`` nest deeper than ``limit`` (no parse, no
    recursion; brackets inside strings do not count).

    Scans ``chunk`` bytes at a time with numpy, carrying the state across chunks (inside a
    string or not, a pending run of backslashes, the depth), so a 500 MB COCO file costs a few
    arrays of one chunk, not eight bytes per byte of the file. (In text that is not JSON a
    backslash outside a string may be read as an escape: such text fails to parse anyway.)
    """
    depth = 0
    in_string = 0
    backslashes = 0  # the run of backslashes that ended the previous chunk
    for start in range(0, len(data), chunk):
        codes = np.frombuffer(data, dtype=np.uint8, count=min(chunk, len(data) - start), offset=start)
        count = len(codes)
        is_bs = codes == 0x5C
        quotes = np.flatnonzero(codes == 0x22)
        if len(quotes) and (backslashes or is_bs.any()):
            last_other = np.maximum.accumulate(np.where(is_bs, -1, np.arange(count)))
            before = quotes - 1
            prior = np.where(before >= 0, last_other[np.maximum(before, 0)], -1)
            run = before - prior + np.where(prior < 0, backslashes, 0)  # backslashes right before each quote
            quotes = quotes[run % 2 == 0]  # unescaped quotes toggle "inside a string"
        brackets = np.flatnonzero((codes == 0x5B) | (codes == 0x7B) | (codes == 0x5D) | (codes == 0x7D))
        if len(brackets):
            if len(quotes) or in_string:
                # quotes before each bracket (+ the carried state): odd means the bracket is in a string
                inside = (np.searchsorted(quotes, brackets) + in_string) % 2 == 1
                brackets = brackets[~inside]
            steps = np.where((codes[brackets] == 0x5B) | (codes[brackets] == 0x7B), 1, -1)
            if len(steps):
                running = np.cumsum(steps, dtype=np.int64) + depth
                if int(running.max()) > limit:
                    return True
                depth = int(running[-1])
        in_string = (in_string + len(quotes)) % 2
        others = np.flatnonzero(~is_bs)
        tail = count - 1 - int(others[-1]) if len(others) else count  # backslashes ending this chunk
        backslashes = tail + backslashes if tail == count else tail
    return False


def read_user_json(path: str | os.PathLike[str], *, what: str, cap: int = MAX_USER_FILE_BYTES,
                   error: type[PackerError] = OptionError, max_depth: int = MAX_USER_JSON_DEPTH) -> Any:
    """The JSON value of a file a user named: read by ``read_user_file``, its nesting checked
    (``json_depth_exceeds``) before ``json.loads`` is asked to parse it.

    Raises:
        ``error``: the file's problems, not UTF-8, nested deeper than ``max_depth``, not JSON.
    """
    data = read_user_file(path, what=what, cap=cap, error=error)
    if json_depth_exceeds(data, max_depth):
        raise error(f"{what}: nests arrays or objects deeper than {max_depth} levels", path=path)
    try:
        return json.loads(data.decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise error(f"{what}: not UTF-8 text ({exc.reason} at byte {exc.start})", path=path) from None
    except RecursionError:  # json_depth_exceeds counts what json nests: kept as a second guard
        raise error(f"{what}: nests arrays or objects too deeply", path=path) from None
    except ValueError as exc:
        raise error(f"{what}: not JSON ({exc})", path=path) from None
