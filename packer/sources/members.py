"""Where each listed member of an archive source lives, and reading it back by offset in any worker.

A folder source needs no table: a key is a path. An archive source (tar, tar of tars, zip,
WebDataset shards: ``sources/tar.py``, ``zip.py``, ``webdataset.py``) is listed once, in one pass, into this flat table, so
that packing workers read members **in parallel, by offset** (``os.pread``), without opening
the archive's index or decompressing anything but the member itself:

* ``container`` (u32): which file of ``containers`` holds the member;
* ``offset`` (u64): for tar, where the member's bytes start (an inner tar's member: the outer
  member's data offset plus the inner one's); for zip, where its local file header starts;
* ``stored`` (u64): bytes stored in the container (compressed size for zip);
* ``method`` (u8): ``RAW`` (``stored`` bytes at ``offset``, as they are), or a zip member
  ``ZIP_STORED`` / ``ZIP_DEFLATED`` / ``ZIP_BZIP2`` / ``ZIP_LZMA`` (local header, then data);
* ``crc`` (u32): the zip member's CRC-32, checked after reading (0 for tar).

A compressed tar cannot be read by offset: it is decompressed once, while listing, into an
uncompressed *spool* in the output's staging folder, and the table points into the spool.

A sample with an image field (``--field mask=image``, a WebDataset ``key.mask.png`` member) has
a second member per such field: ``fields`` holds one more table per image field, row i for
listing row i, over the same containers. Both members are read by offset from the archive (or
its spool) when the sample is packed; nothing is spooled again or held in memory, so a tar of a
million members costs these flat arrays (~25 bytes per member) whatever its image fields.

The table travels in the saved plan (``members_columns`` / ``members_from_columns``), so
``--resume``, ``--part`` and ``--engine ray`` workers read the same members. Each container's
size and modification time are recorded; a reused plan whose containers changed is refused
(``check_unchanged``), and a member whose bytes no longer match is rejected, never packed.
"""

from __future__ import annotations

import bz2
import json
import lzma
import os
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import BuildError

__all__ = ["MemberTable", "MemberBounds", "MemberReader", "RAW", "ZIP_STORED", "ZIP_DEFLATED", "ZIP_BZIP2",
           "ZIP_LZMA", "ZIP_LOCAL_HEADER_BYTES", "member_spans", "members_columns", "members_from_columns",
           "check_unchanged"]

RAW, ZIP_STORED, ZIP_DEFLATED, ZIP_BZIP2, ZIP_LZMA = 0, 1, 2, 3, 4
#: zipfile compression constant -> method value.
ZIP_METHODS = {0: ZIP_STORED, 8: ZIP_DEFLATED, 12: ZIP_BZIP2, 14: ZIP_LZMA}
_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")  # PK\3\4 ... name length, extra length (30 bytes)


@dataclass
class MemberTable:
    """The location of every listed member (row i belongs to listing row i)."""

    containers: tuple[str, ...]        # absolute paths of the files read (archives or spools)
    container_stats: tuple[tuple[int, int], ...]  # (size, mtime_ns) of each at listing time
    container: np.ndarray              # u32
    offset: np.ndarray                 # u64
    stored: np.ndarray                 # u64
    method: np.ndarray                 # u8
    crc: np.ndarray                    # u32
    #: image field name -> the location of each row's member for that field (same containers)
    fields: dict[str, "MemberTable"] = field(default_factory=dict)

    def select(self, rows: np.ndarray) -> "MemberTable":
        return MemberTable(self.containers, self.container_stats, self.container[rows], self.offset[rows],
                           self.stored[rows], self.method[rows], self.crc[rows],
                           {name: table.select(rows) for name, table in self.fields.items()})


#: The least a zip member occupies before its data: the fixed part of its local file header.
ZIP_LOCAL_HEADER_BYTES = 30


def member_spans(table: MemberTable) -> np.ndarray:
    """Bytes of the container each member occupies at least, from its ``offset`` (u64): its stored
    bytes, plus for a zip member the fixed part of its local header (the name and extra field
    that follow it are not counted: the span never claims more than the member holds, so members
    of a sound archive never seem to overlap)."""
    header = np.where(table.method == RAW, 0, ZIP_LOCAL_HEADER_BYTES).astype(np.uint64)
    stored = table.stored.astype(np.uint64)
    return np.where(stored > np.uint64((1 << 64) - 1 - ZIP_LOCAL_HEADER_BYTES), np.uint64((1 << 64) - 1),
                    stored + header)


@dataclass
class MemberBounds:
    """The byte range each listed member must stay inside: checked by the source contract
    (``contract.py``), never persisted (the plan holds only the members that passed).

    A member of an archive must lie inside that archive; a member of a tar inside a tar (a class
    tar) inside its outer member's bytes, so an inner header that lies about a size cannot
    reach the bytes of the members after it.

    Attributes:
        regions: ``(container, start, end)`` of each region; ``end`` -1 is the container's size.
        row_region: u32, the region of each listing row's member.
        field_region: image field name -> u32, the region of each row's member for that field.
    """

    regions: tuple[tuple[int, int, int], ...]
    row_region: np.ndarray
    field_region: dict[str, np.ndarray] = field(default_factory=dict)


_PARTS = ("container", "offset", "stored", "method", "crc")
_PART_TYPES = {"container": np.uint32, "offset": np.uint64, "stored": np.uint64, "method": np.uint8, "crc": np.uint32}


def members_columns(table: MemberTable) -> dict[str, np.ndarray]:
    """The table as plan columns (``members_header`` holds the container list).

    Image fields' members go in five more columns whatever their number (each the fields' rows
    one field after the other, in ``member_field_names`` order): a plan has at most 64 columns.
    """
    columns = {f"member_{part}": getattr(table, part).astype(_PART_TYPES[part]) for part in _PARTS}
    if table.fields:
        names = list(table.fields)
        columns["member_field_names"] = np.frombuffer(json.dumps(names).encode(), dtype=np.uint8)
        for part in _PARTS:
            columns[f"member_field_{part}"] = np.concatenate(
                [getattr(table.fields[name], part).astype(_PART_TYPES[part]) for name in names])
    return columns


def members_header(table: MemberTable) -> list[dict[str, Any]]:
    return [{"path": p, "size": s, "mtime_ns": m} for p, (s, m) in zip(table.containers, table.container_stats)]


def members_from_columns(columns: dict[str, np.ndarray], header: list[dict[str, Any]] | None) -> MemberTable | None:
    """Rebuild the table from a loaded plan; None for a folder or manifest plan."""
    if not header:
        return None
    containers = tuple(str(c["path"]) for c in header)
    stats = tuple((int(c["size"]), int(c["mtime_ns"])) for c in header)
    table = MemberTable(containers, stats, *(columns[f"member_{part}"] for part in _PARTS))
    if "member_field_names" in columns:
        names = json.loads(columns["member_field_names"].tobytes())
        rows = len(table.container)
        for number, name in enumerate(names):
            parts = [columns[f"member_field_{part}"] for part in _PARTS]
            if any(len(values) != rows * len(names) for values in parts):
                raise ValueError("plan member_field columns do not hold one row per sample and field")
            table.fields[str(name)] = MemberTable(containers, stats,
                                                  *(values[number * rows:(number + 1) * rows] for values in parts))
    return table


def container_stat(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def check_unchanged(table: MemberTable) -> None:
    """A reused plan must read the same containers: same size and modification time.

    Raises:
        BuildError: a container is missing or changed since the plan was made.
    """
    for path, expected in zip(table.containers, table.container_stats):
        try:
            actual = container_stat(path)
        except OSError:
            actual = (-1, -1)
        if actual != expected:
            raise BuildError(f"the unfinished build here was planned from {path} as (size, mtime) {expected}, "
                             f"now {'missing' if actual[0] < 0 else actual}; point SRC at the same archive, or "
                             f"start over without --resume", path=path)


class MemberReader:
    """Reads members by row; keeps one read-only descriptor per container open. Close it."""

    def __init__(self, table: MemberTable | None) -> None:
        self.table = table
        self._fds: dict[int, int] = {}

    def __enter__(self) -> "MemberReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def _fd(self, container: int) -> int:
        fd = self._fds.get(container)
        if fd is None:
            fd = self._fds[container] = os.open(self.table.containers[container], os.O_RDONLY)  # type: ignore[union-attr]
        return fd

    def read(self, row: int, size: int, *, field: str | None = None) -> tuple[bytes, str, str]:
        """Member ``row``'s bytes (``size`` = its listed, uncompressed size).

        Args:
            field: read the row's member of this image field instead of its image.

        Returns:
            ``(data, "", "")``, or ``(b"", reason, message)`` when the member cannot be read back
            as listed (an I/O error, a changed archive, a CRC mismatch, a damaged stream).
        """
        table = self.table
        if table is None:
            raise TypeError("MemberReader(None) reads nothing: the source is a folder")
        if field is not None:
            table = table.fields[field]
        container = int(table.container[row])
        offset, stored, method = int(table.offset[row]), int(table.stored[row]), int(table.method[row])
        try:
            fd = self._fd(container)
            if method != RAW:
                header = os.pread(fd, _LOCAL_HEADER.size, offset)
                if len(header) != _LOCAL_HEADER.size or header[:4] != b"PK\x03\x04":
                    return b"", "changed-during-build", "the zip member's local header is missing or damaged"
                fields = _LOCAL_HEADER.unpack(header)
                offset += _LOCAL_HEADER.size + fields[9] + fields[10]
            data = os.pread(fd, stored, offset)
        except OSError as exc:
            return b"", "unreadable", f"reading the archive failed: {exc.strerror or exc}"
        if len(data) != stored:
            return b"", "truncated", f"the archive ends {stored - len(data)} bytes before this member does"
        if method in (RAW, ZIP_STORED):
            out = data
        else:
            try:
                out = _inflate(data, method, size)
            except (zlib.error, OSError, EOFError, lzma.LZMAError, ValueError) as exc:
                return b"", "unreadable", f"the member's compressed data is damaged: {exc}"
        if len(out) != size:
            return b"", "changed-during-build", f"listed as {size} bytes, the member holds {len(out)}"
        if method != RAW and zlib.crc32(out) != int(table.crc[row]):
            return b"", "unreadable", "the member fails its CRC-32 check (damaged archive)"
        return out, "", ""


def _inflate(data: bytes, method: int, size: int) -> bytes:
    """Decompress at most ``size + 1`` bytes: a member that expands past its declared size is caught, not held."""
    if method == ZIP_DEFLATED:
        return zlib.decompressobj(-15).decompress(data, size + 1)
    if method == ZIP_BZIP2:
        return bz2.BZ2Decompressor().decompress(data, size + 1)
    if method == ZIP_LZMA:
        # zip's LZMA: 2 bytes version, 2 bytes properties size, the properties, then raw LZMA1 data
        psize = struct.unpack_from("<H", data, 2)[0]
        filters = [lzma._decode_filter_properties(lzma.FILTER_LZMA1, data[4:4 + psize])]  # noqa: SLF001 - as zipfile does
        return lzma.LZMADecompressor(lzma.FORMAT_RAW, filters=filters).decompress(data[4 + psize:], size + 1)
    raise ValueError(f"unknown member method {method}")
