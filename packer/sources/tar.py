"""The tar door (plain, gz, bz2, xz, zstd): ``class/file`` members as in an image folder, or a tar
of class tars (ImageNet's ``ILSVRC2012_img_train.tar``: one class per inner tar, named after it
without the extension). Keys are ``class/file`` in both cases; a file at the top level is
``not-in-class-folder``.

**Every part is listed.** Tars stored one after another (``cat a.tar b.tar``, or a ``.tar.gz``
of several gzip members) are one source: after each end-of-archive marker the rest of the file
is read, and a further tar header starts the next part (zero blocks between parts are padding).
Anything else after a marker is damage, and a ``SourceError``: a part is never dropped quietly.

**Parallelism.** An uncompressed tar is listed by reading only headers (tarfile seeks past member
data), and workers then read members by offset in parallel (``members.MemberReader``). A
compressed tar is decompressed once, while listing, in one sequential pass that writes the
uncompressed stream to a spool file in the output's staging folder (``spool_dir``); packing then
reads the spool by offset in parallel. The cost is the decompressor's speed plus the spool's disk
space (removed with the staging folder when the build commits, or when the build fails). A
compressed stream expanding more than ``MAX_EXPANSION`` times past 1 GiB is refused as a
decompression bomb (``SourceError``).

A member of a class tar is listed with the outer member's byte range as its bounds, so a header
that lies about a size is caught by the source contract instead of packing the bytes of the
members after it.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import io
import json
import lzma
import os
import tarfile
import zlib
from pathlib import Path
from typing import IO, Any, Iterator

from ..errors import BuildError, PackerError, SourceError
from ..names import ESCAPED_FIELD, is_plain
from .archive_listing import MAX_EXPANSION, _Listing, _member_name, _not_a_file
from .listing import DoorOptions, RawListing, spool_write_error
from .members import container_stat
from .sniff import decompressor, is_tar_header, sniff_container


def _peek(archive: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    handle = archive.extractfile(member)
    return handle.read(512) if handle is not None else b""


# --- tar -----------------------------------------------------------------------------------------------

#: A compressed stream may expand past MAX_EXPANSION times only below this size.
_BOMB_FLOOR = 1 << 30
#: Reads at the end of a stream after which tarfile is stopped: its stream mode skips a member by
#: reading, and past the end it reads nothing again and again toward a size a header lied about
#: (some 100,000 empty reads, seconds, for a 1 GiB claim) before failing on its own.
_READS_PAST_END = 8
_BLOCK = 512


class _Tee(io.RawIOBase):
    """A read-only stream that copies what it reads into ``sink`` (the spool), counting bytes."""

    def __init__(self, source: IO[bytes], sink: IO[bytes], raw: IO[bytes], path: Path) -> None:
        self.source, self.sink, self.raw, self.path = source, sink, raw, path
        self.count = 0
        self.ended = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.source.read(len(buffer))
        n = len(data)
        if not n:
            self.ended += 1
            if self.ended > _READS_PAST_END:
                raise SourceError("the compressed tar ends inside a member: a header claims more bytes than the "
                                  "archive holds", path=self.path)
        buffer[:n] = data
        try:
            self.sink.write(data)
        except OSError as exc:  # the spool's write failed, not the archive's read
            raise spool_write_error(exc, Path(self.sink.name), "decompressing the archive") from None
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
        self.files.append(raw)
        stream = decompressor(path, self.compression, raw)
        self.files.insert(0, stream)
        sink = open(spool, "wb", buffering=8 << 20)
        self.files.insert(1, sink)
        self.spool, self.sink = spool, sink
        self.tee = _Tee(stream, sink, raw, path)
        self.archive = tarfile.open(fileobj=io.BufferedReader(self.tee, 1 << 20), mode="r|")
        self.container = out.add_container(str(spool.resolve()))  # its size is recorded once complete

    def close(self) -> None:
        """Close every handle (the spool stays, in the staging folder, for the workers)."""
        for handle in self.files:
            with contextlib.suppress(OSError):
                handle.close()
        self.files = []

    def complete(self, out: _Listing) -> None:
        """The whole (decompressed) stream is in the container: a compressed tar's spool is drained
        to the stream's end (the first part's padding, then any further parts), flushed and synced."""
        if self.compression is not None:
            while self.tee.read(1 << 20):
                pass
            try:
                self.sink.flush()
                os.fsync(self.sink.fileno())
            except OSError as exc:
                raise spool_write_error(exc, self.spool, "decompressing the archive") from None
            self.close()
            out.stats[self.container] = container_stat(str(self.spool.resolve()))


def _next_part(handle: IO[bytes], end: int, path: Path) -> int | None:
    """Where the next tar stored after the end-of-archive marker at ``end`` starts, or None.

    Zero blocks are the marker and the record padding; the first block that is not zero must be
    a tar header (another part) or the archive is damaged: tarfile ends its member loop quietly
    at a header it cannot parse, so this is where a damaged archive is told from a finished one.
    """
    handle.seek(end)
    position = end
    while True:
        chunk = handle.read(1 << 16)
        if not chunk:
            return None
        stripped = chunk.lstrip(b"\x00")
        if not stripped:
            position += len(chunk)
            continue
        start = position + (len(chunk) - len(stripped)) // _BLOCK * _BLOCK
        handle.seek(start)
        if is_tar_header(handle.read(_BLOCK)):
            return start
        raise SourceError(f"the tar archive is damaged at offset {start}: a member header there cannot be read "
                          f"(the members before it were listed; nothing after it can be)", path=path)


def _parts(opened: _Spooled, out: _Listing) -> Iterator[tuple[tarfile.TarFile, bool]]:
    """``(archive, seekable)`` for each tar stored in the container, one after another."""
    try:
        with opened.archive:
            yield opened.archive, opened.compression is None
            end = opened.archive.offset
        opened.complete(out)
    finally:
        opened.close()
    with open(out.containers[opened.container], "rb") as handle:
        while True:
            start = _next_part(handle, end, opened.path)
            if start is None:
                return
            handle.seek(start)
            with tarfile.open(fileobj=handle, mode="r:") as archive:
                yield archive, True
                end = archive.offset
            if end <= start:  # a header that looks like one but does not parse
                raise SourceError(f"the tar archive is damaged at offset {start}: the member header there cannot "
                                  f"be read", path=opened.path)


def _tar_members(archive: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    """Members one at a time, keeping tarfile's member list empty (bounded memory)."""
    for member in archive:
        archive.members = []
        yield member


@contextlib.contextmanager
def _archive_errors(path: Path) -> Iterator[None]:
    """A damaged or truncated archive (or compressed stream) is an unusable source; a full disk
    while spooling it is the build's problem (``BuildError``), not the source's."""
    try:
        yield
    except PackerError:
        raise
    except (tarfile.TarError, ValueError, OverflowError, UnicodeError) as exc:
        # tarfile parses hostile headers with int()/decode(): whatever it trips on is damage
        raise SourceError(f"the tar archive is damaged or truncated: {exc}", path=path) from None
    except (EOFError, zlib.error, lzma.LZMAError, gzip.BadGzipFile) as exc:
        raise SourceError(f"the archive's compressed stream is damaged or truncated: {exc}", path=path) from None
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
            raise BuildError("the disk is full while decompressing the archive into the build's spool; free "
                             "space and run again", path=path) from None
        raise SourceError(f"cannot read the archive: {exc.strerror or exc}", path=path) from None
    except Exception as exc:
        if type(exc).__module__.split(".")[0] == "zstandard":  # ZstdError: not an OSError
            raise SourceError(f"the archive's compressed stream is damaged or truncated: {exc}", path=path) from None
        raise


def list_tar(path: Path, door: DoorOptions = DoorOptions()) -> RawListing:
    """List a tar of ``class/file`` members, of class tars, or both (see the module docstring).

    Raises:
        SourceError: not a tar, a damaged archive, a decompression bomb.
        BuildError: the disk filled while decompressing into the spool.
    """
    with _archive_errors(path):
        return _list_tar(path, door)


def _file_members(archive: Any, out: Any) -> Iterator[tuple[str, tarfile.TarInfo]]:
    """``(checked name, member)`` of a tar's regular-file members, in archive order; folders are
    skipped, bad names and members that are not files (links, devices) rejected with a reason."""
    for member in _tar_members(archive):
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


def all_file_members(opened: _Spooled, out: _Listing) -> Iterator[tuple[tarfile.TarFile, bool, str, tarfile.TarInfo]]:
    """``(archive, seekable, name, member)`` of every file member of every part, in archive order."""
    for archive, seekable in _parts(opened, out):
        for name, member in _file_members(archive, out):
            yield archive, seekable, name, member


def _list_tar(path: Path, door: DoorOptions) -> RawListing:
    out = _Listing(door.progress)
    opened = _Spooled(path, door.spool_dir, out, 0)
    for archive, seekable, name, member in all_file_members(opened, out):
        handle = archive.extractfile(member)
        head = handle.read(_BLOCK) if handle is not None and member.size >= 2 * _BLOCK else b""
        if is_tar_header(head):
            if seekable:  # the inner tar's headers alone are read
                handle.seek(0)  # type: ignore[union-attr]
                inner: IO[bytes] = handle  # type: ignore[assignment]
            else:  # one pass through the spooling stream, the head already read
                inner = io.BufferedReader(_Chain(head, handle), 1 << 16)  # type: ignore[arg-type]
            _list_inner_tar(inner, member, name, out, opened.container, seekable=seekable)
            continue
        if "/" not in name:
            out.reject(name, "not-in-class-folder", "members must sit inside a class folder (class/file), "
                                                     "or in a class tar")
            continue
        out.add(name, member.size, out.name_label(name.split("/", 1)[0]), opened.container, member.offset_data,
                member.size, meta=_name_meta(member.name))
    return out.finish(path, "tar")


class _Chain(io.RawIOBase):
    """``head`` then the rest of ``handle``: a member whose first block was already read. Reading
    on at its end is an error, not an endless run of empty reads (tarfile's stream mode skips a
    member by reading, and would spin past the end, empty read after empty read, toward a size a
    header lied about)."""

    def __init__(self, head: bytes, handle: IO[bytes]) -> None:
        self.head, self.handle = head, handle
        self.ended = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.head:
            n = min(len(buffer), len(self.head))
            buffer[:n] = self.head[:n]
            self.head = self.head[n:]
            return n
        data = self.handle.read(len(buffer))
        if not data:
            self.ended += 1
            if self.ended > _READS_PAST_END:
                raise tarfile.ReadError("the class tar ends inside a member: a header claims more bytes than it holds")
        buffer[:len(data)] = data
        return len(data)


def _name_meta(raw: str) -> bytes:
    """The metadata of a member whose name is not plain (not UTF-8, or holding ``%XX``): the
    ``packer.names`` marker."""
    return b"" if is_plain(os.fsencode(raw)) else json.dumps({ESCAPED_FIELD: True}, separators=(",", ":")).encode()


def _list_inner_tar(handle: IO[bytes], member: tarfile.TarInfo, name: str, out: _Listing, container: int, *,
                    seekable: bool) -> None:
    """One member tar is one class: its name without the extension. Its members must stay inside
    the outer member's bytes (a region the contract checks)."""
    class_name = name.rsplit("/", 1)[-1]
    class_name = class_name.split(".", 1)[0] or class_name
    label = out.name_label(class_name)
    base = member.offset_data
    region = out.add_region(container, base, base + member.size)
    try:
        with tarfile.open(fileobj=handle, mode="r:" if seekable else "r|") as inner:
            for item in _tar_members(inner):
                if item.isdir():
                    continue
                inner_name = _member_name(item.name, out)
                if inner_name is None:
                    continue
                key = f"{class_name}/{inner_name}"
                problem = _not_a_file(item)
                if problem is not None:
                    out.reject(key, "not-a-file", problem)
                else:
                    out.add(key, item.size, label, container, base + item.offset_data, item.size,
                            meta=_name_meta(item.name), region=region)
    except (tarfile.TarError, ValueError, OverflowError, UnicodeError, EOFError) as exc:
        out.reject(name, "unreadable", f"the class tar is damaged or truncated: {exc}")
