"""The tar door (plain, gz, bz2, xz, zstd): ``class/file`` members as in an image folder, or a tar
of class tars (ImageNet's ``ILSVRC2012_img_train.tar``: one class per inner tar, named after it
without the extension). Keys are ``class/file`` in both cases; a file at the top level is
``not-in-class-folder``.

**Parallelism.** An uncompressed tar is listed by reading only headers (tarfile seeks past member
data), and workers then read members by offset in parallel (``members.MemberReader``). A
compressed tar is decompressed once, while listing, in one sequential pass that writes the
uncompressed stream to a spool file in the output's staging folder (``spool_dir``); packing then
reads the spool by offset in parallel. The cost is the decompressor's speed plus the spool's disk
space (removed with the staging folder when the build commits). A compressed stream expanding
more than ``MAX_EXPANSION`` times past 1 GiB is refused as a decompression bomb (``SourceError``).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import lzma
import os
import tarfile
import zlib
from pathlib import Path
from typing import IO, Any, Callable, Iterator

from ..errors import SourceError
from ..names import ESCAPED_FIELD, is_utf8
from .archive_listing import DEFAULT_MAX_MEMBER_SIZE, MAX_EXPANSION, _Listing, _member_name, _not_a_file
from .listing import SourceListing
from .members import container_stat
from .sniff import decompressor, is_tar_header, sniff_container


def _peek(archive: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    handle = archive.extractfile(member)
    return handle.read(512) if handle is not None else b""


# --- tar -----------------------------------------------------------------------------------------------

#: A compressed stream may expand past MAX_EXPANSION times only below this size.
_BOMB_FLOOR = 1 << 30


class _Tee(io.RawIOBase):
    """A read-only stream that copies what it reads into ``sink`` (the spool), counting bytes."""

    def __init__(self, source: IO[bytes], sink: IO[bytes], raw: IO[bytes], path: Path) -> None:
        self.source, self.sink, self.raw, self.path = source, sink, raw, path
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.source.read(len(buffer))
        n = len(data)
        buffer[:n] = data
        self.sink.write(data)
        self.count += n
        if self.count > _BOMB_FLOOR and self.count > MAX_EXPANSION * max(self.raw.tell(), 1):
            raise SourceError(f"the compressed archive expands more than {MAX_EXPANSION} times (over "
                              f"{self.count >> 20} MiB from {self.raw.tell() >> 20} MiB): a decompression bomb",
                              path=self.path)
        return n


class _Spooled:
    """Open a tar for listing: the file itself, or a decompressing tee into a spool file."""

    def __init__(self, path: Path, spool_dir: Path | None, out: _Listing, index: int) -> None:
        self.path = path
        kind = sniff_container(path)
        if kind is None or not kind.startswith("tar"):
            raise SourceError("not a tar archive (nor a compressed one)", path=path)
        self.compression = kind[4:] or None
        self.files: list[Any] = []
        if self.compression is None:
            self.container = out.add_container(str(path.resolve()))
            self.archive = tarfile.open(path, mode="r:")
            return
        if spool_dir is None:
            raise SourceError("a compressed tar needs a spool folder to decompress into (build it through "
                              "packer build, which uses the output's staging folder)", path=path)
        spool_dir.mkdir(parents=True, exist_ok=True)
        spool = spool_dir / f"spool-{index:05d}.tar"
        raw = open(path, "rb")
        stream = decompressor(path, self.compression, raw)
        sink = open(spool, "wb", buffering=8 << 20)
        self.files = [stream, sink, raw]
        self.spool, self.sink = spool, sink
        self.tee = _Tee(stream, sink, raw, path)
        self.archive = tarfile.open(fileobj=io.BufferedReader(self.tee, 1 << 20), mode="r|")
        self.container = out.add_container(str(spool.resolve()))  # its size is recorded once complete

    def finish(self, out: _Listing) -> int:
        """Complete the spool, and check the archive really ended where tarfile stopped.

        tarfile ends its member loop quietly at a header it cannot parse; a real end is zero
        blocks (or the end of the file), so anything else there is a damaged archive.
        """
        end = self.archive.offset
        self.archive.close()
        if self.compression is not None:
            while self.tee.read(1 << 20):  # the tar's end padding: the spool is the whole stream
                pass
            self.sink.flush()
            os.fsync(self.sink.fileno())
            for handle in self.files:
                handle.close()
            out.stats[self.container] = container_stat(str(self.spool.resolve()))
        with open(out.containers[self.container], "rb") as handle:
            handle.seek(end)
            tail = handle.read(1024)
        if tail.strip(b"\x00"):
            raise SourceError(f"the tar archive is damaged at offset {end}: a member header there cannot be "
                              f"read (the members before it were listed; nothing after it can be)", path=self.path)
        return self.container


def _tar_members(archive: tarfile.TarFile, path: Path) -> Iterator[tarfile.TarInfo]:
    """Members one at a time, keeping tarfile's member list empty (bounded memory)."""
    for member in archive:
        archive.members = []
        yield member


@contextlib.contextmanager
def _archive_errors(path: Path) -> Iterator[None]:
    """A damaged or truncated archive (or compressed stream) is an unusable source."""
    try:
        yield
    except tarfile.TarError as exc:
        raise SourceError(f"the tar archive is damaged or truncated: {exc}", path=path) from None
    except (EOFError, zlib.error, lzma.LZMAError, gzip.BadGzipFile) as exc:
        raise SourceError(f"the archive's compressed stream is damaged or truncated: {exc}", path=path) from None


def list_tar(path: Path, *, progress: Callable[[int], None] | None = None, spool_dir: Path | None = None,
             max_member_size: int = DEFAULT_MAX_MEMBER_SIZE) -> SourceListing:
    """List a tar of ``class/file`` members, of class tars, or both (see the module docstring).

    Raises:
        SourceError: not a tar, a damaged archive, a decompression bomb.
    """
    with _archive_errors(path):
        return _list_tar(path, progress, spool_dir, max_member_size)


def _file_members(archive: Any, path: Path, out: Any) -> Iterator[tuple[str, tarfile.TarInfo]]:
    """``(checked name, member)`` of a tar's regular-file members, in archive order; folders are
    skipped, bad names and members that are not files (links, devices) rejected with a reason."""
    for member in _tar_members(archive, path):
        if member.isdir():
            continue
        name = _member_name(member.name, out)
        if name is None:
            continue
        problem = _not_a_file(member)
        if problem is not None:
            out.reject(name, "not-a-file", problem)
            continue
        yield name, member


def _list_tar(path: Path, progress: Callable[[int], None] | None, spool_dir: Path | None,
              max_member_size: int) -> SourceListing:
    out = _Listing(progress)
    opened = _Spooled(path, spool_dir, out, 0)
    with opened.archive:
        for name, member in _file_members(opened.archive, path, out):
            if member.size > max_member_size:
                out.reject(name, "oversize-member", f"{member.size} bytes, over the limit of {max_member_size}")
                continue
            handle = opened.archive.extractfile(member)
            head = handle.read(512) if handle is not None and member.size >= 1024 else b""
            if is_tar_header(head):
                if opened.compression is None:  # seekable: the inner tar's headers alone are read
                    handle.seek(0)
                    inner: IO[bytes] = handle
                else:  # one pass through the spooling stream, the head already read
                    inner = io.BufferedReader(_Chain(head, handle), 1 << 16)
                _list_inner_tar(inner, member, name, out, opened.container, max_member_size,
                                seekable=opened.compression is None)
                continue
            if "/" not in name:
                out.reject(name, "not-in-class-folder", "members must sit inside a class folder (class/file), "
                                                         "or in a class tar")
                continue
            out.add(name, member.size, out.class_id(name.split("/", 1)[0]), opened.container, member.offset_data,
                    member.size, meta=_name_meta(member.name))
    opened.finish(out)
    return out.finish(path, "tar")


class _Chain(io.RawIOBase):
    """``head`` then the rest of ``handle``: a member whose first block was already read."""

    def __init__(self, head: bytes, handle: IO[bytes]) -> None:
        self.head, self.handle = head, handle

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.head:
            n = min(len(buffer), len(self.head))
            buffer[:n] = self.head[:n]
            self.head = self.head[n:]
            return n
        data = self.handle.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


def _name_meta(raw: str) -> bytes:
    """The metadata of a member whose name is not UTF-8: the ``packer.names`` marker."""
    return b"" if is_utf8(os.fsencode(raw)) else json.dumps({ESCAPED_FIELD: True}, separators=(",", ":")).encode()


def _list_inner_tar(handle: IO[bytes], member: tarfile.TarInfo, name: str, out: _Listing, container: int,
                    max_member_size: int, *, seekable: bool) -> None:
    """One member tar is one class: its name without the extension."""
    class_name = name.rsplit("/", 1)[-1]
    class_name = class_name.split(".", 1)[0] or class_name
    label = out.class_id(class_name)
    base = member.offset_data
    try:
        with tarfile.open(fileobj=handle, mode="r:" if seekable else "r|") as inner:
            for item in inner:
                inner.members = []
                if item.isdir():
                    continue
                inner_name = _member_name(item.name, out)
                if inner_name is None:
                    continue
                key = f"{class_name}/{inner_name}"
                problem = _not_a_file(item)
                if problem is not None:
                    out.reject(key, "not-a-file", problem)
                elif item.size > max_member_size:
                    out.reject(key, "oversize-member", f"{item.size} bytes, over the limit of {max_member_size}")
                else:
                    out.add(key, item.size, label, container, base + item.offset_data, item.size,
                            meta=_name_meta(item.name))
    except tarfile.ReadError as exc:
        out.reject(name, "unreadable", f"the class tar is damaged or truncated: {exc}")
