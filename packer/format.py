"""The on-disk format, version 1: magics, versions, alignment math, headers, index and manifest.

This module is the only place that knows where a byte goes. The writer, the reader, ``verify``
and ``inspect`` ask it; nobody else computes an offset by hand. The normative description is
``formats/SPEC.md``; the "reader requirements" list there maps one to one onto the checks here
(each check is tagged with its requirement id, e.g. ``[R7]``).

All integers are little-endian. A dataset is a folder::

    manifest.json                         commit record, written last
    index-<xxh3>.pki                      flat per-sample index (column file)
    shards/shard-<nnnnn>-<xxh3>.pks       shard files: header + aligned sample payloads
    build-report.jsonl                    every source file: packed or rejected, with the reason
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import xxhash

from .errors import (
    ChecksumMismatchError,
    CorruptHeaderError,
    IndexMismatchError,
    ManifestError,
    MisalignedRecordError,
    NotAPackerFileError,
    OffsetOutOfBoundsError,
    OverlappingRecordsError,
    TruncatedFileError,
    UnsafePathError,
    UnsupportedVersionError,
)

__all__ = [
    "FORMAT_NAME", "FORMAT_VERSION", "SUPPORTED_VERSIONS", "DEFAULT_ALIGNMENT", "MAX_ALIGNMENT",
    "MANIFEST_NAME", "REPORT_NAME", "SHARD_MAGIC", "INDEX_MAGIC", "PLAN_MAGIC",
    "SHARD_HEADER_SIZE", "COLUMN_FILE_HEADER_SIZE", "COLUMN_ENTRY_SIZE", "CHECKSUM_ALGORITHM",
    "ImageFormat", "INDEX_COLUMNS",
    "align_up", "check_alignment", "checksum", "checksum_hex", "Hasher", "parse_checksum_hex",
    "ShardHeader", "shard_data_offset", "shard_file_name", "index_file_name",
    "encode_column_file", "parse_column_file", "validate_index", "IndexColumns",
    "ShardEntry", "FileEntry", "Manifest", "parse_manifest", "dump_manifest", "check_relative_path",
]

FORMAT_NAME = "packer-dataset"
FORMAT_VERSION = 1
#: Versions this reader accepts. A reader MUST refuse others (spec R2).
SUPPORTED_VERSIONS = frozenset({1})
DEFAULT_ALIGNMENT = 4096
#: Largest alignment accepted: 16 MiB (GPUDirect wants 4 KiB; nobody needs more than a huge page).
MAX_ALIGNMENT = 1 << 24
CHECKSUM_ALGORITHM = "xxh3_64"

MANIFEST_NAME = "manifest.json"
REPORT_NAME = "build-report.jsonl"
SHARD_DIR = "shards"
#: A manifest larger than this is refused before parsing (a 100 M-sample dataset needs ~3 MB).
MAX_MANIFEST_BYTES = 64 << 20
#: Caps that bound allocations before any table is trusted.
MAX_SAMPLES = 1 << 40
MAX_SHARDS = 1 << 24
MAX_COLUMNS = 64

SHARD_MAGIC = b"PKSHARD\x00"
INDEX_MAGIC = b"PKINDEX\x00"
PLAN_MAGIC = b"PKPLAN\x00\x00"

# --- shard header: 64 bytes, zero-padded up to the data offset -----------------------------
#   0  8s magic           SHARD_MAGIC
#   8  I  version         1
#  12  I  alignment       power of two, 1 .. MAX_ALIGNMENT
#  16  Q  data_offset     align_up(64, alignment): where the first payload starts
#  24  Q  sample_count    >= 1
#  32  Q  file_size       total size in bytes, a multiple of alignment
#  40  I  shard_number    position of this shard in the manifest's shard list
#  44  20x reserved (zero)
_SHARD_HEADER = struct.Struct("<8sIIQQQI20x")
SHARD_HEADER_SIZE = _SHARD_HEADER.size
assert SHARD_HEADER_SIZE == 64

# --- column file (index and plan): 64-byte header, then 64-byte column entries ---------------
#   0  8s magic
#   8  I  version          1
#  12  I  header_size      64 + 64 * column_count, rounded up to 64 (it already is)
#  16  Q  file_size        total size in bytes
#  24  Q  row_count        N
#  32  I  column_count     1 .. MAX_COLUMNS
#  36  28x reserved (zero)
_COLUMN_FILE_HEADER = struct.Struct("<8sIIQQI28x")
COLUMN_FILE_HEADER_SIZE = _COLUMN_FILE_HEADER.size
#   0  24s name    ASCII, NUL-padded
#  24  8s  dtype   numpy type string, e.g. b"<u8", NUL-padded
#  32  Q   offset  from the start of the file, a multiple of 64
#  40  Q   length  number of elements
#  48  16x reserved (zero)
_COLUMN_ENTRY = struct.Struct("<24s8sQQ16x")
COLUMN_ENTRY_SIZE = _COLUMN_ENTRY.size
#: Columns start at multiples of this, so numpy views of a mapped file are aligned.
COLUMN_ALIGNMENT = 64
assert COLUMN_FILE_HEADER_SIZE == 64 and COLUMN_ENTRY_SIZE == 64

_ALLOWED_DTYPES = {"<u8", "<i8", "<u4", "|u1"}


class ImageFormat:
    """Values of the ``image_format`` index column: what the payload bytes are."""

    UNKNOWN = 0
    JPEG = 1
    PNG = 2
    WEBP = 3
    GIF = 4
    BMP = 5
    TIFF = 6
    RAW = 7  # decoded uint8 pixels, HWC (codec "raw")

    NAMES = {0: "unknown", 1: "jpeg", 2: "png", 3: "webp", 4: "gif", 5: "bmp", 6: "tiff", 7: "raw"}
    BY_PIL_NAME = {"JPEG": 1, "MPO": 1, "PNG": 2, "WEBP": 3, "GIF": 4, "BMP": 5, "TIFF": 6}


# Index v1 columns: name -> (dtype, length rule). "N" = one per sample, "N+1" = blob offsets,
# "blob" = variable-length bytes addressed by the matching *_offsets column.
INDEX_COLUMNS: dict[str, tuple[str, str]] = {
    "shard": ("<u4", "N"),
    "offset": ("<u8", "N"),
    "size": ("<u8", "N"),
    "checksum": ("<u8", "N"),
    "label": ("<i8", "N"),
    "width": ("<u4", "N"),
    "height": ("<u4", "N"),
    "channels": ("|u1", "N"),
    "image_format": ("|u1", "N"),
    "key_offsets": ("<u8", "N+1"),
    "keys": ("|u1", "blob"),
    "meta_offsets": ("<u8", "N+1"),
    "meta": ("|u1", "blob"),
}


# --- alignment and checksums ------------------------------------------------------------------

def align_up(n: int, alignment: int) -> int:
    """Smallest multiple of ``alignment`` (a power of two) that is >= ``n``."""
    return (n + alignment - 1) & ~(alignment - 1)


def check_alignment(alignment: object, *, path: object = None) -> int:
    """Return ``alignment`` if it is an int power of two in [1, MAX_ALIGNMENT], else raise."""
    if (not isinstance(alignment, int) or isinstance(alignment, bool) or alignment < 1
            or alignment > MAX_ALIGNMENT or alignment & (alignment - 1)):
        raise CorruptHeaderError(
            f"alignment must be a power of two between 1 and {MAX_ALIGNMENT}, got {alignment!r}",
            path=path)
    return alignment


def checksum(data: Any) -> int:
    """xxh3-64 of a bytes-like object, as an unsigned int (seed 0)."""
    return xxhash.xxh3_64_intdigest(data)


def checksum_hex(value: int) -> str:
    """The manifest spelling of a checksum: 16 lowercase hex digits."""
    return f"{value:016x}"


def parse_checksum_hex(text: object, *, path: object = None, what: str = "checksum") -> int:
    if not isinstance(text, str) or not re.fullmatch(r"[0-9a-f]{16}", text):
        raise ManifestError(f"{what} must be 16 lowercase hex digits, got {text!r}", path=path)
    return int(text, 16)


class Hasher:
    """Streaming xxh3-64 over a whole file (the per-shard and per-index checksum)."""

    def __init__(self) -> None:
        self._state = xxhash.xxh3_64()

    def update(self, data: Any) -> None:
        self._state.update(data)

    def intdigest(self) -> int:
        return self._state.intdigest()


# --- shards -----------------------------------------------------------------------------------

def shard_data_offset(alignment: int) -> int:
    """Where a shard's first payload starts: the 64-byte header rounded up to the alignment."""
    return align_up(SHARD_HEADER_SIZE, alignment)


def shard_file_name(shard_number: int, content_checksum: int) -> str:
    """Relative path of a shard. The content checksum in the name means a rebuild never reuses
    the name of a file whose bytes differ, so a reader holding old tables never reads new bytes."""
    return f"{SHARD_DIR}/shard-{shard_number:05d}-{checksum_hex(content_checksum)}.pks"


def index_file_name(content_checksum: int) -> str:
    return f"index-{checksum_hex(content_checksum)}.pki"


@dataclass(frozen=True)
class ShardHeader:
    alignment: int
    sample_count: int
    file_size: int
    shard_number: int
    version: int = FORMAT_VERSION

    @property
    def data_offset(self) -> int:
        return shard_data_offset(self.alignment)

    def encode(self) -> bytes:
        """The header region: 64 header bytes, zero-padded to ``data_offset``."""
        head = _SHARD_HEADER.pack(SHARD_MAGIC, self.version, self.alignment, self.data_offset,
                                  self.sample_count, self.file_size, self.shard_number)
        return head + bytes(self.data_offset - SHARD_HEADER_SIZE)

    @classmethod
    def parse(cls, head: bytes, *, path: object = None, actual_size: int | None = None) -> "ShardHeader":
        """Parse and validate the first 64 bytes of a shard (spec R1-R5)."""
        if len(head) < SHARD_HEADER_SIZE:
            if head[: len(SHARD_MAGIC)] != SHARD_MAGIC[: len(head)] or not head:
                raise NotAPackerFileError(f"not a packer shard (starts with {bytes(head[:8])!r})", path=path)
            raise TruncatedFileError(
                f"shard is {len(head)} bytes, shorter than its {SHARD_HEADER_SIZE}-byte header", path=path)
        magic, version, alignment, data_offset, count, file_size, number = _SHARD_HEADER.unpack_from(head)
        if magic != SHARD_MAGIC:  # [R1]
            raise NotAPackerFileError(f"not a packer shard (starts with {bytes(magic)!r})", path=path)
        if version not in SUPPORTED_VERSIONS:  # [R2]
            raise UnsupportedVersionError(
                f"shard format version {version} is not supported (this reader accepts "
                f"{sorted(SUPPORTED_VERSIONS)}); upgrade packer", path=path)
        check_alignment(alignment, path=path)  # [R3]
        if data_offset != shard_data_offset(alignment):
            raise CorruptHeaderError(
                f"data_offset {data_offset} must be {shard_data_offset(alignment)} for alignment {alignment}",
                path=path)
        if count < 1 or count > MAX_SAMPLES:
            raise CorruptHeaderError(f"sample_count {count} outside 1..{MAX_SAMPLES}", path=path)
        if file_size % alignment or file_size < data_offset + 1:  # [R4]
            raise CorruptHeaderError(
                f"file_size {file_size} must be a multiple of {alignment} and hold at least one sample",
                path=path)
        if actual_size is not None and actual_size != file_size:  # [R5]
            raise TruncatedFileError(
                f"shard is {actual_size} bytes on disk but its header says {file_size}"
                f" ({'truncated' if actual_size < file_size else 'extended'})", path=path)
        return cls(alignment=alignment, sample_count=count, file_size=file_size,
                   shard_number=number, version=version)


# --- column files (index, plan) ---------------------------------------------------------------

def encode_column_file(magic: bytes, row_count: int, columns: Mapping[str, np.ndarray]) -> list[bytes | memoryview]:
    """Serialise named 1-D arrays into a column file; returns the pieces to write in order.

    Columns are written in the given order, each starting at a multiple of 64, zero padding
    between them. The caller hashes and writes the pieces (no large concatenation in memory).
    """
    count = len(columns)
    if not 1 <= count <= MAX_COLUMNS:
        raise ValueError(f"a column file holds 1..{MAX_COLUMNS} columns, got {count}")
    header_size = COLUMN_FILE_HEADER_SIZE + COLUMN_ENTRY_SIZE * count
    pos = align_up(header_size, COLUMN_ALIGNMENT)
    entries, bodies = [], []
    for name, array in columns.items():
        array = np.ascontiguousarray(array)
        typestr = array.dtype.str
        if array.ndim != 1 or typestr not in _ALLOWED_DTYPES:
            raise ValueError(f"column {name!r}: need a 1-D array of {sorted(_ALLOWED_DTYPES)}, got {typestr}")
        entries.append(_COLUMN_ENTRY.pack(name.encode("ascii"), typestr.encode("ascii"), pos, array.size))
        bodies.append((pos, array))
        pos = align_up(pos + array.nbytes, COLUMN_ALIGNMENT)
    file_size = pos
    header = _COLUMN_FILE_HEADER.pack(magic, FORMAT_VERSION, header_size, file_size, row_count, count)
    pieces: list[bytes | memoryview] = [header + b"".join(entries)]
    cursor = header_size
    for start, array in bodies:
        if start > cursor:
            pieces.append(bytes(start - cursor))
        pieces.append(memoryview(array.view(np.uint8)))
        cursor = start + array.nbytes
    if file_size > cursor:
        pieces.append(bytes(file_size - cursor))
    return pieces


def parse_column_file(buf: Any, magic: bytes, *, path: object = None, kind: str = "index"
                      ) -> tuple[int, dict[str, np.ndarray]]:
    """Validate a column file's header and table, and return (row_count, name -> array view).

    The arrays are zero-copy views of ``buf`` (e.g. an mmap). Nothing is allocated in
    proportion to any stored count before that count has been checked against the file size.
    """
    mv = memoryview(buf)
    size = mv.nbytes
    if size < COLUMN_FILE_HEADER_SIZE:
        if size == 0 or bytes(mv[: min(size, 8)]) != magic[: min(size, 8)]:
            raise NotAPackerFileError(f"not a packer {kind} file (starts with {bytes(mv[:8])!r})", path=path)
        raise TruncatedFileError(f"{kind} file is {size} bytes, shorter than its 64-byte header", path=path)
    got_magic, version, header_size, file_size, rows, count = _COLUMN_FILE_HEADER.unpack_from(mv)
    if got_magic != magic:  # [R1]
        raise NotAPackerFileError(f"not a packer {kind} file (starts with {bytes(got_magic)!r})", path=path)
    if version not in SUPPORTED_VERSIONS:  # [R2]
        raise UnsupportedVersionError(
            f"{kind} format version {version} is not supported (this reader accepts "
            f"{sorted(SUPPORTED_VERSIONS)}); upgrade packer", path=path)
    if file_size != size:  # [R5]
        raise TruncatedFileError(
            f"{kind} file is {size} bytes on disk but its header says {file_size}"
            f" ({'truncated' if size < file_size else 'extended'})", path=path)
    if not 1 <= count <= MAX_COLUMNS:
        raise CorruptHeaderError(f"column_count {count} outside 1..{MAX_COLUMNS}", path=path)
    if header_size != COLUMN_FILE_HEADER_SIZE + COLUMN_ENTRY_SIZE * count or header_size > size:
        raise CorruptHeaderError(f"header_size {header_size} does not match {count} columns", path=path)
    if rows > MAX_SAMPLES:
        raise CorruptHeaderError(f"row_count {rows} exceeds the limit {MAX_SAMPLES}", path=path)
    columns: dict[str, np.ndarray] = {}
    previous_end = header_size
    for i in range(count):
        raw_name, raw_dtype, offset, length = _COLUMN_ENTRY.unpack_from(mv, COLUMN_FILE_HEADER_SIZE + i * COLUMN_ENTRY_SIZE)
        try:
            name = raw_name.rstrip(b"\x00").decode("ascii")
            typestr = raw_dtype.rstrip(b"\x00").decode("ascii")
        except UnicodeDecodeError:
            raise CorruptHeaderError(f"column {i} has a non-ASCII name or dtype", path=path) from None
        if not re.fullmatch(r"[a-z_][a-z0-9_]*", name) or name in columns:
            raise CorruptHeaderError(f"column {i} has an invalid or repeated name {name!r}", path=path)
        if typestr not in _ALLOWED_DTYPES:
            raise CorruptHeaderError(f"column {name!r} has unsupported dtype {typestr!r}", path=path)
        itemsize = np.dtype(typestr).itemsize
        if offset % COLUMN_ALIGNMENT or offset < previous_end:  # [R7]
            raise OverlappingRecordsError(
                f"column {name!r} starts at {offset}: must be a multiple of {COLUMN_ALIGNMENT} "
                f"at or after {previous_end}", path=path)
        if length > (size - offset) // itemsize:  # overflow-free bound check [R6]
            raise OffsetOutOfBoundsError(
                f"column {name!r} ({length} x {itemsize} bytes at {offset}) runs past the end ({size})",
                path=path)
        end = offset + length * itemsize
        columns[name] = np.frombuffer(mv, dtype=np.dtype(typestr), count=length, offset=offset)
        previous_end = end
    return rows, columns


# --- the index ------------------------------------------------------------------------------

@dataclass(frozen=True)
class IndexColumns:
    """The validated per-sample arrays of an index (views of the mapped file)."""

    shard: np.ndarray
    offset: np.ndarray
    size: np.ndarray
    checksum: np.ndarray
    label: np.ndarray
    width: np.ndarray
    height: np.ndarray
    channels: np.ndarray
    image_format: np.ndarray
    key_offsets: np.ndarray
    keys: np.ndarray
    meta_offsets: np.ndarray
    meta: np.ndarray

    def __len__(self) -> int:
        return len(self.offset)


def validate_index(rows: int, columns: Mapping[str, np.ndarray], shards: "list[ShardEntry]",
                   alignment: int, *, path: object = None) -> IndexColumns:
    """Check an index's columns against the spec and the manifest's shard list (R8-R14).

    Vectorised: about 10 ms per million samples.
    """
    for name, (typestr, rule) in INDEX_COLUMNS.items():  # [R8]
        if name not in columns:
            raise CorruptHeaderError(f"index lacks required column {name!r}", path=path)
        column = columns[name]
        if column.dtype.str != typestr:
            raise CorruptHeaderError(f"index column {name!r} has dtype {column.dtype.str}, expected {typestr}",
                                     path=path)
        want = {"N": rows, "N+1": rows + 1}.get(rule)
        if want is not None and len(column) != want:
            raise IndexMismatchError(f"index column {name!r} has {len(column)} entries, expected {want}",
                                     path=path)
    expected_rows = sum(s.sample_count for s in shards)
    if rows != expected_rows:  # [R9]
        raise IndexMismatchError(
            f"index holds {rows} samples but the manifest's shards hold {expected_rows}", path=path)
    ix = IndexColumns(**{name: columns[name] for name in INDEX_COLUMNS})
    shard_col, offset, size = ix.shard, ix.offset, ix.size
    if rows:
        # [R10] samples are grouped by shard in manifest order, with the manifest's counts.
        counts = np.array([s.sample_count for s in shards], dtype=np.int64)
        if int(shard_col.max()) >= len(shards):
            bad = int(np.argmax(shard_col >= len(shards)))
            raise OffsetOutOfBoundsError(f"names shard {int(shard_col[bad])} but the manifest lists "
                                         f"{len(shards)}", path=path, sample=bad)
        expected_shard = np.repeat(np.arange(len(shards), dtype=np.uint32), counts)
        if not np.array_equal(shard_col, expected_shard):
            bad = int(np.argmax(shard_col != expected_shard))
            raise OverlappingRecordsError(
                f"is in shard {int(shard_col[bad])} but the manifest's per-shard counts place it in "
                f"shard {int(expected_shard[bad])}", path=path, sample=bad)
        # [R11] sizes: at least 1 byte, and below the file size of their shard.
        if int(size.min()) < 1:
            bad = int(np.argmin(size))
            raise CorruptHeaderError("has size 0; every sample holds at least one byte", path=path, sample=bad)
        # [R12] offsets aligned; [R13] tight packing: each sample starts where the previous one's
        # aligned end is (or at the data offset for a shard's first); [R14] the last one ends in the file.
        if alignment > 1 and np.any(offset & np.uint64(alignment - 1)):
            bad = int(np.argmax(offset & np.uint64(alignment - 1)))
            raise MisalignedRecordError(f"starts at {int(offset[bad])}, not a multiple of {alignment}",
                                        path=path, sample=bad)
        sizes_limit = np.uint64(1 << 62)
        if int(size.max()) >= int(sizes_limit) or int(offset.max()) >= int(sizes_limit):
            bad = int(np.argmax((size >= sizes_limit) | (offset >= sizes_limit)))
            raise OffsetOutOfBoundsError("has an offset or size beyond 2^62", path=path, sample=bad)
        mask = np.uint64(~(alignment - 1) & ((1 << 64) - 1))
        aligned_end = (offset + size + np.uint64(alignment - 1)) & mask
        expected = np.empty(rows, dtype=np.uint64)
        expected[1:] = aligned_end[:-1]
        firsts = np.zeros(len(shards), dtype=np.int64)
        np.cumsum(counts[:-1], out=firsts[1:])
        expected[firsts] = shard_data_offset(alignment)
        if not np.array_equal(offset, expected):
            bad = int(np.argmax(offset != expected))
            raise OverlappingRecordsError(
                f"starts at {int(offset[bad])} but the layout requires {int(expected[bad])} "
                f"(samples must be packed in order at aligned offsets without overlap or gaps)",
                path=path, sample=bad)
        lasts = firsts + counts - 1
        ends = aligned_end[lasts]
        for shard_number, (entry, end) in enumerate(zip(shards, ends.tolist())):
            if end != entry.size:
                raise OffsetOutOfBoundsError(
                    f"shard {shard_number} ({entry.path}) is {entry.size} bytes but its samples end at {end}",
                    path=path, sample=int(lasts[shard_number]))
    for blob_name, offsets_name in (("keys", "key_offsets"), ("meta", "meta_offsets")):  # [R15]
        offsets, blob = columns[offsets_name], columns[blob_name]
        if offsets[0] != 0 or offsets[-1] != len(blob) or (rows and np.any(offsets[1:] < offsets[:-1])):
            raise OverlappingRecordsError(
                f"index column {offsets_name!r} must start at 0, never decrease and end at the "
                f"{blob_name!r} length {len(blob)}", path=path)
    return ix


# --- the manifest ---------------------------------------------------------------------------

_SHARD_PATH = re.compile(r"shards/[A-Za-z0-9_][A-Za-z0-9._-]{0,200}\.pks")
_INDEX_PATH = re.compile(r"index-[A-Za-z0-9._-]{1,200}\.pki")


def check_relative_path(text: object, pattern: re.Pattern[str], *, what: str, path: object = None) -> str:
    """A stored path must match its pattern exactly: relative, no '..', no separators beyond it."""
    if not isinstance(text, str) or not pattern.fullmatch(text) or ".." in text:
        raise UnsafePathError(f"{what} {text!r} is not a safe relative path inside the dataset "
                              f"(expected {pattern.pattern})", path=path)
    return text


@dataclass(frozen=True)
class FileEntry:
    path: str
    size: int
    checksum: int


@dataclass(frozen=True)
class ShardEntry:
    path: str
    size: int
    checksum: int
    sample_count: int


@dataclass(frozen=True)
class Manifest:
    """The validated manifest. ``raw`` keeps the parsed JSON for display (build options etc.)."""

    sample_count: int
    alignment: int
    codec: dict[str, Any]
    classes: tuple[str, ...]
    index: FileEntry
    shards: tuple[ShardEntry, ...]
    build: dict[str, Any]
    history: tuple[dict[str, Any], ...]
    created_by: str
    format_version: int = FORMAT_VERSION
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


def _need(obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...], *, where: str, path: object) -> Any:
    if key not in obj:
        raise ManifestError(f"{where} lacks required field {key!r}", path=path)
    value = obj[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        name = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise ManifestError(f"{where} field {key!r} must be {name}, got {type(value).__name__}", path=path)
    return value


def _need_count(obj: Mapping[str, Any], key: str, *, where: str, path: object, low: int = 0,
                high: int = MAX_SAMPLES << 24) -> int:
    value = _need(obj, key, int, where=where, path=path)
    if isinstance(value, bool) or not low <= value <= high:
        raise ManifestError(f"{where} field {key!r} = {value} outside {low}..{high}", path=path)
    return value


def parse_manifest(data: bytes, *, path: object = None) -> Manifest:
    """Parse and validate manifest JSON bytes (spec R16-R20). Paths are checked, not opened."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"manifest is {len(data)} bytes, over the {MAX_MANIFEST_BYTES} limit", path=path)
    if not data.lstrip()[:1] == b"{":
        raise NotAPackerFileError(f"not a packer manifest (starts with {data[:16]!r})", path=path)
    try:
        obj = json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ManifestError(f"manifest is not valid UTF-8 JSON: {exc}", path=path) from None
    if not isinstance(obj, dict):
        raise ManifestError("manifest must be a JSON object", path=path)
    if obj.get("format") != FORMAT_NAME:  # [R16]
        raise NotAPackerFileError(f"manifest format is {obj.get('format')!r}, expected {FORMAT_NAME!r}",
                                  path=path)
    version = _need(obj, "format_version", int, where="manifest", path=path)
    if version not in SUPPORTED_VERSIONS:
        raise UnsupportedVersionError(f"dataset format version {version} is not supported (this reader "
                                      f"accepts {sorted(SUPPORTED_VERSIONS)}); upgrade packer", path=path)
    algorithm = _need(obj, "checksum_algorithm", str, where="manifest", path=path)
    if algorithm != CHECKSUM_ALGORITHM:
        raise ManifestError(f"checksum_algorithm {algorithm!r} is not {CHECKSUM_ALGORITHM!r}", path=path)
    alignment = _need(obj, "alignment", int, where="manifest", path=path)
    try:
        check_alignment(alignment, path=path)
    except CorruptHeaderError as exc:
        raise ManifestError(exc.message, path=path) from None
    sample_count = _need_count(obj, "sample_count", where="manifest", path=path, high=MAX_SAMPLES)
    codec = _need(obj, "codec", dict, where="manifest", path=path)
    _need(codec, "name", str, where="manifest codec", path=path)
    classes = _need(obj, "classes", list, where="manifest", path=path)
    if not all(isinstance(c, str) for c in classes):
        raise ManifestError("manifest classes must all be strings", path=path)
    index_obj = _need(obj, "index", dict, where="manifest", path=path)
    index = FileEntry(
        path=check_relative_path(_need(index_obj, "path", str, where="manifest index", path=path),
                                 _INDEX_PATH, what="index path", path=path),
        size=_need_count(index_obj, "size", where="manifest index", path=path),
        checksum=parse_checksum_hex(index_obj.get("checksum"), path=path, what="index checksum"))
    shard_list = _need(obj, "shards", list, where="manifest", path=path)
    if len(shard_list) > MAX_SHARDS:
        raise ManifestError(f"manifest lists {len(shard_list)} shards, over the {MAX_SHARDS} limit", path=path)
    shards = []
    seen = set()
    for i, item in enumerate(shard_list):
        where = f"manifest shard {i}"
        if not isinstance(item, dict):
            raise ManifestError(f"{where} must be an object", path=path)
        entry = ShardEntry(
            path=check_relative_path(_need(item, "path", str, where=where, path=path), _SHARD_PATH,
                                     what=f"shard {i} path", path=path),
            size=_need_count(item, "size", where=where, path=path, low=1),
            checksum=parse_checksum_hex(item.get("checksum"), path=path, what=f"shard {i} checksum"),
            sample_count=_need_count(item, "sample_count", where=where, path=path, low=1, high=MAX_SAMPLES))
        if entry.size % alignment:
            raise ManifestError(f"{where} size {entry.size} is not a multiple of the alignment {alignment}",
                                path=path)
        if entry.path in seen:  # [R17]
            raise ManifestError(f"{where} repeats the path {entry.path!r}", path=path)
        seen.add(entry.path)
        shards.append(entry)
    if sum(s.sample_count for s in shards) != sample_count:  # [R18]
        raise ManifestError(f"sample_count {sample_count} differs from the sum of the shards' counts "
                            f"{sum(s.sample_count for s in shards)}", path=path)
    build = obj.get("build", {})
    history = obj.get("history", [])
    if not isinstance(build, dict) or not isinstance(history, list) or not all(isinstance(h, dict) for h in history):
        raise ManifestError("manifest 'build' must be an object and 'history' a list of objects", path=path)
    created_by = obj.get("created_by", "")
    if not isinstance(created_by, str):
        raise ManifestError("manifest 'created_by' must be a string", path=path)
    return Manifest(sample_count=sample_count, alignment=alignment, codec=codec, classes=tuple(classes),
                    index=index, shards=tuple(shards), build=build, history=tuple(history),
                    created_by=created_by, format_version=version, raw=obj)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def dump_manifest(manifest: Manifest) -> bytes:
    """Canonical manifest bytes: sorted keys, two-space indent, trailing newline."""
    obj = {
        "format": FORMAT_NAME,
        "format_version": manifest.format_version,
        "created_by": manifest.created_by,
        "checksum_algorithm": CHECKSUM_ALGORITHM,
        "alignment": manifest.alignment,
        "sample_count": manifest.sample_count,
        "codec": manifest.codec,
        "classes": list(manifest.classes),
        "index": {"path": manifest.index.path, "size": manifest.index.size,
                  "checksum": checksum_hex(manifest.index.checksum)},
        "shards": [{"path": s.path, "size": s.size, "sample_count": s.sample_count,
                    "checksum": checksum_hex(s.checksum)} for s in manifest.shards],
        "build": manifest.build,
        "history": list(manifest.history),
    }
    return (json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def verify_checksum(data: Any, expected: int, *, path: object = None, sample: int | None = None,
                    offset: int | None = None, what: str = "sample") -> None:
    """Raise ChecksumMismatchError when ``data`` does not hash to ``expected``."""
    got = checksum(data)
    if got != expected:
        raise ChecksumMismatchError(f"{what} checksum mismatch: expected {checksum_hex(expected)}, "
                                    f"got {checksum_hex(got)} (the stored bytes are damaged)",
                                    path=path, sample=sample, offset=offset)
