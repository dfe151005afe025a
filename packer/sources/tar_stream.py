"""Reading tar streams, shared by the doors that hold tars (``tar``, ``webdataset``).

A tar is opened as it is, or, compressed, through a decompressing tee into a spool file that the
build's workers then read by offset (``SpooledTar``); every part of a multi-part tar is walked
(``all_file_members``); a stream that ends inside a member, expands like a bomb or fills the disk
is named for what it is (``archive_errors``). The doors decide what the members mean.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import io
import lzma
import os
import tarfile
import zlib
from pathlib import Path
from typing import IO, Any, Iterator

from ..errors import BuildError, PackerError, SourceError
from .archive_listing import MAX_EXPANSION, ArchiveListing, member_name, not_a_file
from .listing import spool_write_error
from .members import container_stat
from .sniff import decompressor, is_tar_header, sniff_container

__all__ = ["BLOCK", "SpooledTar", "ChainedMember", "peek_member", "tar_members", "archive_errors",
           "all_file_members"]


def peek_member(archive: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    handle = archive.extractfile(member)
    return handle.read(512) if handle is not None else b""


#: A compressed stream may expand past MAX_EXPANSION times only below this size.
_BOMB_FLOOR = 1 << 30
#: Reads at the end of a stream after which tarfile is stopped: its stream mode skips a member by
#: reading, and past the end it reads nothing again and again toward a size a header lied about
#: (some 100,000 empty reads, seconds, for a 1 GiB claim) before failing on its own.
_READS_PAST_END = 8
BLOCK = 512


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


class SpooledTar:
    """Open a tar for listing: the file itself, or a decompressing tee into a spool file."""

    def __init__(self, path: Path, spool_dir: Path | None, out: ArchiveListing, index: int) -> None:
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

    def complete(self, out: ArchiveListing) -> None:
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
        start = position + (len(chunk) - len(stripped)) // BLOCK * BLOCK
        handle.seek(start)
        if is_tar_header(handle.read(BLOCK)):
            return start
        raise SourceError(f"the tar archive is damaged at offset {start}: a member header there cannot be read "
                          f"(the members before it were listed; nothing after it can be)", path=path)


def _parts(opened: SpooledTar, out: ArchiveListing) -> Iterator[tuple[tarfile.TarFile, bool]]:
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


def tar_members(archive: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    """Members one at a time, keeping tarfile's member list empty (bounded memory)."""
    for member in archive:
        archive.members = []
        yield member


@contextlib.contextmanager
def archive_errors(path: Path) -> Iterator[None]:
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


def _file_members(archive: Any, out: Any) -> Iterator[tuple[str, tarfile.TarInfo]]:
    """``(checked name, member)`` of a tar's regular-file members, in archive order; folders are
    skipped, bad names and members that are not files (links, devices) rejected with a reason."""
    for member in tar_members(archive):
        if member.isdir():
            continue
        name = member_name(member.name, out)
        if name is None:
            continue
        problem = not_a_file(member)
        if problem is not None:
            out.reject(name, "not-a-file", problem)
            continue
        yield name, member


def all_file_members(opened: SpooledTar, out: ArchiveListing) -> Iterator[tuple[tarfile.TarFile, bool, str, tarfile.TarInfo]]:
    """``(archive, seekable, name, member)`` of every file member of every part, in archive order."""
    for archive, seekable in _parts(opened, out):
        for name, member in _file_members(archive, out):
            yield archive, seekable, name, member


class ChainedMember(io.RawIOBase):
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


