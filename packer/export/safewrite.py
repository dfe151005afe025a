"""The one safe writer of every export target: a stage beside OUT, written through directory descriptors, published atomically.

Every byte an export writes goes through ``StagedOutput``:

* **Beside OUT, under an unpredictable name.** The stage is ``.<OUT name>.packer-export-<16 hex
  digits from secrets>`` in OUT's parent folder (the same file system, so publishing is a
  rename), created exclusively (``mkdir``, or ``O_CREAT | O_EXCL | O_NOFOLLOW`` for a file): a
  name planted in advance is never written through, and the stage is never an existing file.
* **Relative to open folder descriptors, no symlink followed.** OUT's parent is opened once;
  the stage and every folder inside it are opened with ``O_DIRECTORY | O_NOFOLLOW`` relative to
  their parent's descriptor, and every file is created with ``O_CREAT | O_EXCL | O_NOFOLLOW``
  relative to its folder's descriptor (``SafeTree``). Nothing is ever written inside an existing
  OUT: a symlink planted in it (``OUT/cat -> /etc``) is replaced with the rest of OUT, never
  followed. The final component OUT itself is only ever renamed or exchanged (``renameat``
  works on the link, not its target).
* **Published atomically.** A new OUT (or an empty folder) is replaced by one ``rename`` of the
  stage; an existing OUT (``overwrite``) by one ``renameat2(RENAME_EXCHANGE)`` where the kernel
  and file system have it, else by moving OUT aside and renaming the stage in its place. A
  killed export leaves the old OUT or, between those two renames only, nothing: never a part.
  Before publishing, a file stage is fsynced (``fsync``) and a folder stage's file system synced
  once (``syncfs``: one call instead of one ``fsync`` per exported file).
* **Leftovers are found again.** The stage holds an ``flock`` while in use. An export to OUT
  first removes every ``.<OUT name>.packer-export-*`` entry whose lock it can take (a stage or
  a moved-aside old OUT of an export that was killed), and leaves those another export holds.

``checkpoint(point)`` is called at each step (``stage-created``, ``file-written``,
``before-publish``, ``moved-aside``, ``published``): a no-op the crash tests replace to kill
the process at exactly that point.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import secrets
import stat
from collections import OrderedDict
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import OptionError, OutputExistsError

__all__ = ["StagedOutput", "SafeTree", "checkpoint", "remove_entry", "STAGE_MARK"]

#: What every stage and moved-aside old target is named after: ``.<OUT name>`` + this + a token.
STAGE_MARK = b".packer-export-"

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW | _CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
_RENAME_NOREPLACE, _RENAME_EXCHANGE = 1, 2
#: Open folder descriptors a ``SafeTree`` keeps (least recently used closed first).
_OPEN_FOLDERS = 32


def checkpoint(point: str) -> None:
    """A step of an export (module docstring); replaced by the crash tests, a no-op otherwise."""


def _libc() -> Any:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _renameat2(dir_fd: int, source: bytes, target: bytes, flags: int) -> bool:
    """``renameat2`` within ``dir_fd``: True when done, False when this kernel, C library or file
    system does not offer ``flags`` (the caller falls back); other failures raise ``OSError``."""
    call = getattr(_libc(), "renameat2", None)
    if call is None:
        return False
    if call(dir_fd, source, dir_fd, target, flags) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EPERM):
        return False
    raise OSError(code, os.strerror(code), os.fsdecode(target))


def _syncfs(fd: int) -> None:
    """Flush the file system holding ``fd`` (one ``syncfs``; ``sync`` where there is none)."""
    call = getattr(_libc(), "syncfs", None)
    if call is None or call(fd) != 0:
        os.sync()


def remove_entry(dir_fd: int, name: bytes) -> None:
    """Remove entry ``name`` of ``dir_fd`` whatever it is, following no symlink.

    Iterative, one folder descriptor open at a time (an export may be 2,000 folders deep: no
    recursion, no descriptor per level): it goes down into the first sub-folder left, removes
    the files, and comes back up through ``..`` of the folder it holds open.
    """
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(info.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return
    fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    below: list[str] = []  # the names from ``name`` down to the folder ``fd`` holds
    try:
        while True:
            child_fd = -1
            for child in os.listdir(fd):
                try:
                    if stat.S_ISDIR(os.stat(child, dir_fd=fd, follow_symlinks=False).st_mode):
                        child_fd = os.open(child, _DIR_FLAGS, dir_fd=fd)
                        below.append(child)
                        break
                    os.unlink(child, dir_fd=fd)
                except FileNotFoundError:  # removed meanwhile (another export cleaning the same leftover)
                    continue
            if child_fd >= 0:
                os.close(fd)
                fd = child_fd
                continue
            if not below:
                break
            parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = parent
            try:
                os.rmdir(below.pop(), dir_fd=fd)
            except FileNotFoundError:
                pass
    finally:
        os.close(fd)
    try:
        os.rmdir(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


class SafeTree:
    """Creates folders and new files under one open folder descriptor (the stage), following no
    symlink: every component is opened ``O_NOFOLLOW`` relative to its parent's descriptor.

    Names are relative ``bytes`` paths whose components the export plan checked (no ``..``, no
    empty part, no NUL); a component that exists as a file, or a file that exists already, is an
    error (``OptionError``: the plan promised unique names, so something raced it or the file
    system folds names the plan told apart, e.g. by case).
    """

    def __init__(self, root_fd: int) -> None:
        self._root = root_fd
        self._folders: OrderedDict[bytes, int] = OrderedDict()
        self.files = 0

    def _folder(self, folder: bytes) -> int:
        """The open descriptor of stage folder ``folder``, made (and opened) one component at a time
        from its deepest ancestor already open: iterative, whatever the depth."""
        if not folder:
            return self._root
        fd = self._folders.get(folder)
        if fd is not None:
            self._folders.move_to_end(folder)
            return fd
        start = folder
        parent = self._root
        while True:  # the deepest open ancestor
            start = start.rpartition(b"/")[0]
            if not start:
                break
            cached = self._folders.get(start)
            if cached is not None:
                parent = cached
                break
        path = start
        for name in folder[len(start) + 1 if start else 0:].split(b"/"):
            path = path + b"/" + name if path else name
            try:
                os.mkdir(name, 0o777, dir_fd=parent)
            except FileExistsError:
                pass
            try:
                parent = os.open(name, _DIR_FLAGS, dir_fd=parent)
            except OSError as exc:  # ELOOP / ENOTDIR: a link or a file where a folder goes
                raise OptionError(f"cannot create the folder {os.fsdecode(path)!r} in the export: "
                                  f"{exc.strerror} (a file or link is in its place)") from None
            self._folders[path] = parent  # the newest: never the one evicted below
            while len(self._folders) > _OPEN_FOLDERS:
                _, old = self._folders.popitem(last=False)
                os.close(old)
        return parent

    def create(self, relative: bytes) -> int:
        """A new file at ``relative``: a write-only descriptor the caller closes."""
        folder, _, name = relative.rpartition(b"/")
        try:
            fd = os.open(name, _NEW_FILE_FLAGS, 0o666, dir_fd=self._folder(folder))
        except FileExistsError:
            raise OptionError(f"{os.fsdecode(relative)!r} would be written twice (the file system treats two "
                              f"exported names as one, e.g. by case)") from None
        self.files += 1
        return fd

    def write(self, relative: bytes, body: Any) -> None:
        """Write ``body`` (any bytes-like object) to the new file ``relative``."""
        fd = self.create(relative)
        try:
            view = memoryview(body).cast("B")
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        checkpoint("file-written")

    def close(self) -> None:
        for fd in self._folders.values():
            os.close(fd)
        self._folders.clear()


class StagedOutput:
    """One export target, written into a stage beside ``out`` and published atomically.

    Use as a context manager; ``tree()`` (a folder stage) or ``open_file()`` (a file stage) to
    write, then ``publish()``. Leaving without publishing removes the stage.

    Args:
        out: the target path; its parent folder is created when missing (the user named it).
        folder: a folder target (folder, WebDataset shards), else one file (tar).
        overwrite: an existing ``out`` may be replaced (after ``check_replaceable``).
        check_replaceable: called with the ``os.stat_result`` of an existing ``out`` (not
            followed) and an open descriptor of it when it is a real folder (else None); raises
            to refuse replacing it.

    Raises:
        OutputExistsError: ``out`` exists (and is not an empty folder, for a folder target)
            without ``overwrite``.
        OptionError: ``out`` has no name of its own (``.``, ``..``, ``/``).
    """

    def __init__(self, out: str | os.PathLike[str], *, folder: bool, overwrite: bool,
                 check_replaceable: Any = None) -> None:
        self.out = Path(out)
        self.folder = folder
        self.overwrite = overwrite
        self.check_replaceable = check_replaceable
        self.name = os.fsencode(self.out.name)
        if self.name in (b"", b".", b".."):
            raise OptionError(f"the export target {str(out)!r} must name a new file or folder")
        self._parent = -1
        self._stage = b""
        self._stage_fd = -1
        self._file: BinaryIO | None = None
        self._tree: SafeTree | None = None
        self._published = False

    # --- opening ---
    def __enter__(self) -> "StagedOutput":
        parent = self.out.parent
        parent.mkdir(parents=True, exist_ok=True)
        self._parent = os.open(parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC)
        try:
            self._remove_leftovers()
            self._check_existing(self._parent)
            self._stage = b"." + self.name + STAGE_MARK + secrets.token_hex(8).encode()
            if self.folder:
                os.mkdir(self._stage, 0o777, dir_fd=self._parent)
                self._stage_fd = os.open(self._stage, _DIR_FLAGS, dir_fd=self._parent)
            else:
                self._stage_fd = os.open(self._stage, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC,
                                         0o666, dir_fd=self._parent)
            fcntl.flock(self._stage_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            checkpoint("stage-created")
        except BaseException:
            self._discard()
            raise
        return self

    def preflight(self) -> None:
        """The checks of opening (``out`` exists, may be replaced), without creating anything."""
        try:
            parent = os.open(self.out.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC)
        except FileNotFoundError:
            return  # created when the export opens: nothing is in the way
        try:
            self._check_existing(parent)
        finally:
            os.close(parent)

    def _check_existing(self, parent: int) -> None:
        try:
            info = os.stat(self.name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return
        if self.folder and stat.S_ISDIR(info.st_mode) and not self.overwrite:
            fd = os.open(self.name, _DIR_FLAGS, dir_fd=parent)
            try:
                empty = not os.listdir(fd)
            finally:
                os.close(fd)
            if empty:
                return
        if not self.overwrite:
            raise OutputExistsError("the export target exists; pass --overwrite to replace it (it is replaced "
                                    "as a whole, never written into) or choose a new path", path=self.out)
        if self.check_replaceable is not None:
            fd = os.open(self.name, _DIR_FLAGS, dir_fd=parent) if stat.S_ISDIR(info.st_mode) else None
            try:
                self.check_replaceable(info, fd)
            finally:
                if fd is not None:
                    os.close(fd)

    def _remove_leftovers(self) -> None:
        """Remove stages (and moved-aside targets) of killed exports to this ``out``; keep those in use."""
        prefix = b"." + self.name + STAGE_MARK
        for entry in os.listdir(self._parent):
            name = os.fsencode(entry)
            if not name.startswith(prefix):
                continue
            try:
                fd = os.open(name, os.O_RDONLY | _NOFOLLOW | _CLOEXEC | getattr(os, "O_NONBLOCK", 0),
                             dir_fd=self._parent)
            except OSError:  # a link or something else planted under our name: removed, not followed
                remove_entry(self._parent, name)
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # another export is writing it
                remove_entry(self._parent, name)
            finally:
                os.close(fd)

    # --- writing ---
    def tree(self) -> SafeTree:
        """The folder stage's writer (a folder target)."""
        if self._tree is None:
            self._tree = SafeTree(self._stage_fd)
        return self._tree

    def open_file(self) -> BinaryIO:
        """The file stage, open for writing (a file target)."""
        if self._file is None:
            self._file = os.fdopen(os.dup(self._stage_fd), "wb")
        return self._file

    # --- publishing ---
    def publish(self) -> None:
        """Make the stage OUT (module docstring); after this the stage is gone."""
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None
        elif self.folder:
            _syncfs(self._stage_fd)
        if self._tree is not None:
            self._tree.close()
        checkpoint("before-publish")
        try:
            old = self._swap_in()
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
                raise
            # another process (a second export to OUT) published between the check at the start and now
            raise OutputExistsError("the export target appeared while this export ran (another export wrote it); "
                                    "it was left as it is: pass --overwrite to replace it", path=self.out) from None
        self._published = True
        os.fsync(self._parent)
        checkpoint("published")
        if old is not None:
            remove_entry(self._parent, old)

    def _swap_in(self) -> bytes | None:
        """Put the stage at OUT; returns where a replaced OUT went (removed after), or None.

        Without ``overwrite`` nothing another process put at OUT since the check at the start is
        ever replaced: a new OUT goes in with ``RENAME_NOREPLACE`` (or, without it, a folder by a
        rename that cannot replace a non-empty folder, a file by ``link``, which cannot replace
        anything); the empty folder checked at the start by a rename, which fails once it is not
        empty. Those failures raise ``OSError`` (EEXIST, ENOTEMPTY, ...), which ``publish`` names.
        """
        parent, stage, name = self._parent, self._stage, self.name
        try:
            info = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            info = None
        if info is None:
            try:
                if _renameat2(parent, stage, name, _RENAME_NOREPLACE):
                    return None
            except OSError as exc:
                if not self.overwrite or exc.errno != errno.EEXIST:
                    raise
                return self._replace()  # it appeared since the stat: replaced, as asked
            if self.folder or self.overwrite:
                os.rename(stage, name, src_dir_fd=parent, dst_dir_fd=parent)
            else:
                os.link(stage, name, src_dir_fd=parent, dst_dir_fd=parent, follow_symlinks=False)
                os.unlink(stage, dir_fd=parent)
            return None
        if not self.overwrite:
            if not (self.folder and stat.S_ISDIR(info.st_mode)):  # not the empty folder checked at the start
                raise OSError(errno.EEXIST, "exists", os.fsdecode(name))
            os.rename(stage, name, src_dir_fd=parent, dst_dir_fd=parent)  # ENOTEMPTY once filled
            return None
        return self._replace()

    def _replace(self) -> bytes | None:
        """Replace OUT as a whole (``overwrite``): exchanged with the stage, or moved aside first."""
        parent, stage, name = self._parent, self._stage, self.name
        if not self.folder:
            os.rename(stage, name, src_dir_fd=parent, dst_dir_fd=parent)  # a file over a file: atomic
            return None
        if _renameat2(parent, stage, name, _RENAME_EXCHANGE):
            return stage  # the stage's name now holds the old OUT
        old = b"." + name + STAGE_MARK + secrets.token_hex(8).encode()
        os.rename(name, old, src_dir_fd=parent, dst_dir_fd=parent)
        checkpoint("moved-aside")
        os.rename(stage, name, src_dir_fd=parent, dst_dir_fd=parent)
        return old

    # --- closing ---
    def _discard(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tree is not None:
            self._tree.close()
        if self._stage_fd >= 0:
            os.close(self._stage_fd)
            self._stage_fd = -1
        if self._stage and not self._published and self._parent >= 0:
            remove_entry(self._parent, self._stage)
        if self._parent >= 0:
            os.close(self._parent)
            self._parent = -1

    def __exit__(self, *exc: object) -> None:
        self._discard()
