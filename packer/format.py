"""The on-disk format, version 1: magics, versions, alignment math, headers, index and manifest.

This module is the only place that knows where a byte goes. The writer, the reader, ``verify``
and ``inspect`` ask it; nobody else computes an offset by hand. The normative description is
``formats/SPEC.md``; the "reader requirements" list there maps one to one onto the checks here
(each check is tagged with its requirement id, e.g. ``[R7]``).

Why one module of ~1,100 lines (the house guide is ~700): it is the model of the bytes (STYLE.md
"One module owns the bytes"), kept in step with SPEC.md rule by rule; split across files, the
layout math, the header structs and the checks that tag each rule would drift apart.

All integers are little-endian. A dataset is a folder::

    manifest.json                         commit record, written last
    index-<xxh3>.pki                      flat per-sample index (column file)
    shards/shard-<nnnnn>-<xxh3>.pks       shard files: header + aligned sample payloads
    build-report.jsonl                    informative: the build summary and every rejected file

``<xxh3>`` is the 16-hex-digit xxh3 of the whole file, ``<nnnnn>`` the planned shard number
(at least 5 digits). Checks run at open live here and in ``packer.dataset`` (file-system checks:
real paths, sizes on disk, the index checksum); both carry the spec's ``[Rn]`` tags.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import struct
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import xxhash

from . import fields as fieldspec
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
    "class_list_checksum",
    "FORMAT_NAME", "FORMAT_VERSION", "SUPPORTED_VERSIONS", "DEFAULT_ALIGNMENT", "MAX_ALIGNMENT",
    "MANIFEST_NAME", "REPORT_NAME", "SHARD_DIR", "SHARD_MAGIC", "INDEX_MAGIC", "PLAN_MAGIC",
    "HASHES_MAGIC", "HASHES_NAME", "VIEW_MAGIC",
    "SHARD_HEADER_SIZE", "SHARD_HEADER_RESERVED", "COLUMN_FILE_HEADER_SIZE", "COLUMN_ENTRY_SIZE", "COLUMN_ALIGNMENT",
    "CHECKSUM_ALGORITHM", "MAX_MANIFEST_BYTES", "MAX_SAMPLES", "MAX_SHARDS", "MAX_COLUMNS",
    "MAX_FILE_SIZE", "MAX_SHARD_NUMBER", "MAX_COLUMN_NAME_BYTES",
    "ImageFormat", "INDEX_COLUMNS",
    "align_up", "align_up_array", "check_alignment", "checksum", "checksum_hex", "Hasher", "parse_checksum_hex",
    "verify_checksum",
    "ShardHeader", "shard_data_offset", "shard_file_name", "index_file_name", "shard_number_of",
    "encode_column_file", "parse_column_file", "validate_index", "IndexColumns",
    "ShardEntry", "FileEntry", "Manifest", "MANIFEST_FIELDS", "parse_manifest", "dump_manifest",
    "check_relative_path", "field_shard_file_name", "FieldSpec",
    "LEGACY_OPTION_GROUPS", "BUILD_SETTINGS_GROUPS", "regroup_build_options", "recorded_build_settings",
]

FieldSpec = fieldspec.FieldSpec

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
#: Offsets, sample sizes and file sizes stay below 2^62, so ``offset + size + alignment - 1``
#: can never overflow a u64 (nor numpy's int64 when tables are converted).
MAX_FILE_SIZE = (1 << 62) - 1
#: Shard numbers are u32 in the shard header.
MAX_SHARD_NUMBER = (1 << 32) - 1
#: Column names are stored NUL-padded in a 24-byte field.
MAX_COLUMN_NAME_BYTES = 24

SHARD_MAGIC = b"PKSHARD\x00"
INDEX_MAGIC = b"PKINDEX\x00"
PLAN_MAGIC = b"PKPLAN\x00\x00"
#: The perceptual-hashes file beside the index (SPEC §16; its layout and checks are
#: ``packer.duplicates.sidecar``'s, as the tiled JPEG's are ``packer.codecs.tiles``').
HASHES_MAGIC = b"PKHASH\x00\x00"
HASHES_NAME = "perceptual-hashes.pkh"
#: A view file (SPEC §17): a subset of a dataset by sample number (layout and checks: ``packer.viewfile``).
VIEW_MAGIC = b"PKVIEW\x00\x00"

# --- shard header: 64 bytes, zero-padded up to the data offset -----------------------------
#   0  8s magic           SHARD_MAGIC
#   8  I  version         1
#  12  I  alignment       power of two, 1 .. MAX_ALIGNMENT
#  16  Q  data_offset     align_up(64, alignment): where the first payload starts
#  24  Q  sample_count    >= 1
#  32  Q  file_size       total size in bytes, a multiple of alignment
#  40  I  shard_number    planned shard number, the one in the file name
#  44  20x reserved (zero)
_SHARD_HEADER = struct.Struct("<8sIIQQQI20x")
SHARD_HEADER_SIZE = _SHARD_HEADER.size
#: The header's reserved bytes (44..63): written as zero, ignored by readers (a future field may
#: use them); ``verify`` reports nonzero ones, since a v1 writer never sets them.
SHARD_HEADER_RESERVED = slice(struct.calcsize("<8sIIQQQI"), SHARD_HEADER_SIZE)
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
_COLUMN_NAME = re.compile(r"[a-z_][a-z0-9_]*")


class ImageFormat:
    """Values of the ``image_format`` index column: what the payload bytes are.

    Values 8-38 name the other formats Pillow decodes (one per Pillow plugin) and 255 is
    ``OTHER`` (decoded by a Pillow plugin with no value here); 39-254 are reserved: a reader
    treats a value missing from ``NAMES`` as ``UNKNOWN`` and never refuses a dataset for it
    (new formats are a compatible addition).
    """

    UNKNOWN = 0
    JPEG = 1
    PNG = 2
    WEBP = 3
    GIF = 4
    BMP = 5
    TIFF = 6
    RAW = 7  # decoded uint8 pixels, HWC (codec "raw")
    # 8-63: other formats Pillow decodes, one value per Pillow plugin (SPEC.md §5, the table);
    # OTHER: a format some Pillow plugin decoded that has no value of its own (a decoder sniffs).
    OTHER = 255
    #: Values whose payload is decoded pixels, not an encoded image: no image decoder takes them,
    #: and their shape is the index's (and the codec's, ``packer.codecs``), never in the bytes.
    PIXEL_FORMATS = frozenset({RAW})

    NAMES = {0: "unknown", 1: "jpeg", 2: "png", 3: "webp", 4: "gif", 5: "bmp", 6: "tiff", 7: "raw",
             8: "ppm", 9: "jpeg2000", 10: "avif", 11: "heif", 12: "tga", 13: "ico", 14: "cur", 15: "psd",
             16: "qoi", 17: "dds", 18: "sgi", 19: "pcx", 20: "sun", 21: "xbm", 22: "xpm", 23: "icns",
             24: "fits", 25: "blp", 26: "dcx", 27: "fli", 28: "ftex", 29: "gbr", 30: "im", 31: "imt",
             32: "mcidas", 33: "msp", 34: "pcd", 35: "pixar", 36: "spider", 37: "xvthumb", 38: "dib",
             255: "other"}
    BY_PIL_NAME = {"JPEG": 1, "MPO": 1, "PNG": 2, "WEBP": 3, "GIF": 4, "BMP": 5, "TIFF": 6,
                   "PPM": 8, "JPEG2000": 9, "AVIF": 10, "HEIF": 11, "TGA": 12, "ICO": 13, "CUR": 14,
                   "PSD": 15, "QOI": 16, "DDS": 17, "SGI": 18, "PCX": 19, "SUN": 20, "XBM": 21, "XPM": 22,
                   "ICNS": 23, "FITS": 24, "BLP": 25, "DCX": 26, "FLI": 27, "FTEX": 28, "GBR": 29, "IM": 30,
                   "IMT": 31, "MCIDAS": 32, "MSP": 33, "PCD": 34, "PIXAR": 35, "SPIDER": 36, "XVTHUMB": 37,
                   "DIB": 38}


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
assert len(INDEX_COLUMNS) + fieldspec.MAX_FIELD_COLUMNS == MAX_COLUMNS


# --- alignment and checksums ------------------------------------------------------------------

def align_up(n: int, alignment: int) -> int:
    """Smallest multiple of ``alignment`` (a power of two) that is >= ``n``."""
    return (n + alignment - 1) & ~(alignment - 1)


def align_up_array(values: np.ndarray, alignment: int) -> np.ndarray:
    """``align_up`` of every element (non-negative integers below 2^62, ``alignment`` a power of two).

    Returns an array of the same dtype: uint64 columns stay uint64, int64 arithmetic stays int64.
    """
    values = np.asarray(values)
    mask = values.dtype.type(alignment - 1)
    return (values + mask) & ~mask


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


def class_list_checksum(classes: Any) -> str:
    """The checksum of a class list: xxh3-64 of each name's UTF-8 bytes followed by ``\n``, in
    label order, as 16 hex digits (informational: ``build.classes_checksum`` in the manifest)."""
    digest = xxhash.xxh3_64()
    for name in classes:
        digest.update(name.encode("utf-8", "surrogateescape"))
        digest.update(b"\n")
    return checksum_hex(digest.intdigest())


def parse_checksum_hex(text: object, *, path: object = None, what: str = "checksum") -> int:
    """The value of a manifest checksum spelling (exactly 16 lowercase hex digits).

    Raises:
        ManifestError: anything else (upper case, wrong length, not a string).
    """
    if not isinstance(text, str) or not re.fullmatch(r"[0-9a-f]{16}", text):
        raise ManifestError(f"{what} must be 16 lowercase hex digits, got {text!r}", path=path)
    return int(text, 16)


class Hasher:
    """Streaming xxh3-64 over a whole file (the per-shard and per-index checksum)."""

    def __init__(self) -> None:
        self._state = xxhash.xxh3_64()

    def update(self, data: Any) -> None:
        """Hash the next bytes of the file."""
        self._state.update(data)

    def intdigest(self) -> int:
        """The xxh3-64 of everything hashed so far."""
        return self._state.intdigest()


# --- shards -----------------------------------------------------------------------------------

def shard_data_offset(alignment: int) -> int:
    """Where a shard's first payload starts: the 64-byte header rounded up to the alignment."""
    return align_up(SHARD_HEADER_SIZE, alignment)


def shard_file_name(shard_number: int, content_checksum: int) -> str:
    """Relative path of a shard: ``shards/shard-<number, >= 5 digits>-<xxh3 hex>.pks``.

    The content checksum in the name means a rebuild never reuses the name of a file whose bytes
    differ, so a reader holding old tables never reads new bytes.

    Raises:
        ValueError: ``shard_number`` outside 0..MAX_SHARD_NUMBER (it is a u32 in the header).
    """
    if not 0 <= shard_number <= MAX_SHARD_NUMBER:
        raise ValueError(f"shard number {shard_number} outside 0..{MAX_SHARD_NUMBER}")
    return f"{SHARD_DIR}/shard-{shard_number:05d}-{checksum_hex(content_checksum)}.pks"


def index_file_name(content_checksum: int) -> str:
    """Relative path of an index: ``index-<xxh3 hex>.pki``."""
    return f"index-{checksum_hex(content_checksum)}.pki"


@dataclass(frozen=True)
class ShardHeader:
    """The 64-byte shard header (spec section 3.1)."""

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
        """Parse and validate the first 64 bytes of a shard (spec R21, R1-R3, R22, R23, R4, R5).

        Args:
            head: at least the first 64 bytes of the file (fewer if the file is shorter).
            path: the file, for error messages.
            actual_size: the size on disk; when given, it must equal ``file_size`` (R5).

        Raises:
            NotAPackerFileError, TruncatedFileError, UnsupportedVersionError, CorruptHeaderError.
        """
        if len(head) < SHARD_HEADER_SIZE:  # [R21]
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
        if data_offset != shard_data_offset(alignment):  # [R22]
            raise CorruptHeaderError(
                f"data_offset {data_offset} must be {shard_data_offset(alignment)} for alignment {alignment}",
                path=path)
        if count < 1 or count > MAX_SAMPLES:  # [R23]
            raise CorruptHeaderError(f"sample_count {count} outside 1..{MAX_SAMPLES}", path=path)
        if file_size % alignment or file_size < data_offset + 1 or file_size > MAX_FILE_SIZE:  # [R4]
            raise CorruptHeaderError(
                f"file_size {file_size} must be a multiple of {alignment}, hold at least one sample "
                f"and be below 2^62", path=path)
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

    Args:
        magic: ``INDEX_MAGIC`` or ``PLAN_MAGIC``.
        row_count: the file's ``row_count`` (``N``), 0..MAX_SAMPLES.
        columns: name -> 1-D array; names ASCII ``[a-z_][a-z0-9_]*`` of at most 24 bytes,
            dtypes ``<u8``, ``<i8``, ``<u4`` or ``|u1``.

    Raises:
        ValueError: a column count, name, dtype or row count a reader would refuse.
    """
    count = len(columns)
    if not 1 <= count <= MAX_COLUMNS:
        raise ValueError(f"a column file holds 1..{MAX_COLUMNS} columns, got {count}")
    if len(magic) != 8:
        raise ValueError(f"magic must be 8 bytes, got {magic!r}")
    if not 0 <= row_count <= MAX_SAMPLES:
        raise ValueError(f"row_count {row_count} outside 0..{MAX_SAMPLES}")
    for name in columns:
        # the same rule readers enforce [R27]: writing a name they would refuse is a bug here
        if (not isinstance(name, str) or not name.isascii() or len(name) > MAX_COLUMN_NAME_BYTES
                or not _COLUMN_NAME.fullmatch(name)):
            raise ValueError(f"column name {name!r} must be ASCII [a-z_][a-z0-9_]* of at most "
                             f"{MAX_COLUMN_NAME_BYTES} bytes")
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
    Checks, in order: R21, R1, R2, R5, R24, R25, R26, then per column R27, R28, R7, R6.

    Args:
        buf: the whole file (bytes-like).
        magic: the expected magic.
        path: the file, for error messages.
        kind: what the file is ("index", "plan"), for error messages.

    Raises:
        NotAPackerFileError, TruncatedFileError, UnsupportedVersionError, CorruptHeaderError,
        OverlappingRecordsError, OffsetOutOfBoundsError.
    """
    mv = memoryview(buf).cast("B")
    size = mv.nbytes
    if size < COLUMN_FILE_HEADER_SIZE:  # [R21]
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
    if not 1 <= count <= MAX_COLUMNS:  # [R24]
        raise CorruptHeaderError(f"column_count {count} outside 1..{MAX_COLUMNS}", path=path)
    if header_size != COLUMN_FILE_HEADER_SIZE + COLUMN_ENTRY_SIZE * count or header_size > size:  # [R25]
        raise CorruptHeaderError(f"header_size {header_size} does not match {count} columns", path=path)
    if rows > MAX_SAMPLES:  # [R26]
        raise CorruptHeaderError(f"row_count {rows} exceeds the limit {MAX_SAMPLES}", path=path)
    columns: dict[str, np.ndarray] = {}
    previous_end = header_size
    for i in range(count):
        entry_at = COLUMN_FILE_HEADER_SIZE + i * COLUMN_ENTRY_SIZE
        raw_name, raw_dtype, offset, length = _COLUMN_ENTRY.unpack_from(mv, entry_at)
        try:  # [R27]
            name = raw_name.rstrip(b"\x00").decode("ascii")
        except UnicodeDecodeError:
            raise CorruptHeaderError(f"column {i} has a non-ASCII name {raw_name!r}", path=path) from None
        if not _COLUMN_NAME.fullmatch(name) or name in columns:  # [R27]
            raise CorruptHeaderError(f"column {i} has an invalid or repeated name {name!r}", path=path)
        typestr = raw_dtype.rstrip(b"\x00").decode("ascii", "replace")
        if typestr not in _ALLOWED_DTYPES:  # [R28]
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
    #: The declared fields' columns (``FieldSpec.columns()`` names -> views), validated (§14).
    field_columns: Mapping[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.offset)


def validate_index(rows: int, columns: Mapping[str, np.ndarray], shards: "list[ShardEntry]",
                   alignment: int, *, path: object = None,
                   fields: "Sequence[FieldSpec]" = ()) -> IndexColumns:
    """Check an index's columns against the spec and the manifest's shard list.

    Checks, in order: R8, R9, then (when there are rows) R10, R11, R12, R29, R13, R14, and R15;
    then, for each declared field (§14), R46, R47 and, for image fields, R11-R14 on its own
    columns and shards (R48). Vectorised numpy passes over the columns (the whole open of a
    million-sample dataset takes 10-17 ms on the project VM: README, "Performance").

    Args:
        rows: the column file's ``row_count``.
        columns: name -> array, as returned by ``parse_column_file`` (unknown names are ignored).
        shards: the manifest's shard entries, in manifest order.
        alignment: the manifest's alignment.
        path: the index file, for error messages.
        fields: the manifest's field declarations (image fields with their shard entries).

    Returns:
        The index columns, as views of ``columns``.

    Raises:
        CorruptHeaderError, IndexMismatchError, OffsetOutOfBoundsError, OverlappingRecordsError,
        MisalignedRecordError: errors about one sample carry its number (``.sample``).
    """
    for name, (typestr, rule) in INDEX_COLUMNS.items():  # [R8]
        _check_column(columns, name, typestr, rule, rows, path=path, what="index")
    expected_rows = sum(s.sample_count for s in shards)
    if rows != expected_rows:  # [R9]
        raise IndexMismatchError(
            f"index holds {rows} samples but the manifest's shards hold {expected_rows}", path=path)
    ix_columns = {name: columns[name] for name in INDEX_COLUMNS}
    shard_col = columns["shard"]
    counts = np.array([s.sample_count for s in shards], dtype=np.int64)
    if rows:
        # [R10] samples are grouped by shard in manifest order, with the manifest's counts.
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
        check_packed_payloads(columns["offset"], columns["size"], counts, shards, alignment, path=path)
    for blob_name, offsets_name in (("keys", "key_offsets"), ("meta", "meta_offsets")):  # [R15]
        _check_blob_offsets(columns[offsets_name], columns[blob_name], rows, offsets_name, blob_name, path=path)
    field_columns: dict[str, np.ndarray] = {}
    for spec in fields:
        field_columns.update(_validate_field(spec, rows, columns, counts, alignment, path=path))
    return IndexColumns(**ix_columns, field_columns=field_columns)


def _check_column(columns: Mapping[str, np.ndarray], name: str, typestr: str, rule: str, rows: int, *,
                  path: object, what: str, record_bytes: int = 0) -> np.ndarray:
    """A required column is present with its dtype and length (R8, R46)."""
    if name not in columns:
        raise CorruptHeaderError(f"{what} lacks required column {name!r}", path=path)
    column = columns[name]
    if column.dtype.str != typestr:
        raise CorruptHeaderError(f"{what} column {name!r} has dtype {column.dtype.str}, expected {typestr}",
                                 path=path)
    want = {"N": rows, "N+1": rows + 1, "N*R": rows * record_bytes}.get(rule)
    if want is not None and len(column) != want:
        raise IndexMismatchError(f"{what} column {name!r} has {len(column)} entries, expected {want}", path=path)
    return column


def _check_blob_offsets(offsets: np.ndarray, blob: np.ndarray, rows: int, offsets_name: str, blob_name: str,
                        *, path: object, multiple: int = 1) -> None:
    """[R15]/[R47] An offsets column starts at 0, never decreases, ends at its blob's length
    (and, for a variable array, steps in whole records)."""
    if offsets[0] != 0 or offsets[-1] != len(blob) or (rows and np.any(offsets[1:] < offsets[:-1])):
        raise OverlappingRecordsError(
            f"index column {offsets_name!r} must start at 0, never decrease and end at the "
            f"{blob_name!r} length {len(blob)}", path=path)
    if multiple > 1 and np.any(offsets % np.uint64(multiple)):
        bad = int(np.argmax(offsets % np.uint64(multiple) != 0))
        raise OverlappingRecordsError(
            f"index column {offsets_name!r} entry {bad} = {int(offsets[bad])} is not a multiple of the "
            f"field's {multiple}-byte record", path=path, sample=max(bad - 1, 0))


def check_packed_payloads(offset: np.ndarray, size: np.ndarray, counts: np.ndarray, shards: "Sequence[ShardEntry]",
                          alignment: int, *, path: object = None, what: str = "") -> None:
    """R11, R12, R29, R13, R14: payloads are packed tightly, in order, at aligned offsets, and
    each shard's last one ends at the shard's size. ``rows > 0``; ``what`` prefixes messages
    (``"field 'mask': "``) when the payloads are an image field's."""
    rows = len(offset)
    if int(size.min()) < 1:  # [R11]
        bad = int(np.argmin(size))
        raise CorruptHeaderError(f"{what}has size 0; every sample holds at least one byte", path=path, sample=bad)
    if alignment > 1 and np.any(offset & np.uint64(alignment - 1)):  # [R12]
        bad = int(np.argmax(offset & np.uint64(alignment - 1)))
        raise MisalignedRecordError(f"{what}starts at {int(offset[bad])}, not a multiple of {alignment}",
                                    path=path, sample=bad)
    sizes_limit = np.uint64(MAX_FILE_SIZE + 1)
    if int(size.max()) >= int(sizes_limit) or int(offset.max()) >= int(sizes_limit):  # [R29]
        bad = int(np.argmax((size >= sizes_limit) | (offset >= sizes_limit)))
        raise OffsetOutOfBoundsError(f"{what}has an offset or size beyond 2^62", path=path, sample=bad)
    mask = np.uint64(~(alignment - 1) & ((1 << 64) - 1))
    aligned_end = (offset + size + np.uint64(alignment - 1)) & mask
    expected = np.empty(rows, dtype=np.uint64)
    expected[1:] = aligned_end[:-1]
    firsts = np.zeros(len(shards), dtype=np.int64)
    np.cumsum(counts[:-1], out=firsts[1:])
    expected[firsts] = shard_data_offset(alignment)
    # [R13] tight packing: each sample starts at the previous one's aligned end (a shard's
    # first at the data offset), so no gap, overlap or reordering can hide in the table.
    if not np.array_equal(offset, expected):
        bad = int(np.argmax(offset != expected))
        raise OverlappingRecordsError(
            f"{what}starts at {int(offset[bad])} but the layout requires {int(expected[bad])} "
            f"(samples must be packed in order at aligned offsets without overlap or gaps)",
            path=path, sample=bad)
    lasts = firsts + counts - 1
    ends = aligned_end[lasts]
    for shard_number, (entry, end) in enumerate(zip(shards, ends.tolist())):
        if end != entry.size:  # [R14]
            raise OffsetOutOfBoundsError(
                f"{what}shard {shard_number} ({entry.path}) is {entry.size} bytes but its samples end at {end}",
                path=path, sample=int(lasts[shard_number]))


def _validate_field(spec: FieldSpec, rows: int, columns: Mapping[str, np.ndarray], counts: np.ndarray,
                    alignment: int, *, path: object) -> dict[str, np.ndarray]:
    """A declared field's columns (R46), offsets (R47), class ids (R49) and image payloads (R48)."""
    what = f"index (field {spec.name!r})"
    found = {name: _check_column(columns, name, typestr, rule, rows, path=path, what=what,  # [R46]
                                 record_bytes=spec.record_bytes)
             for name, (typestr, rule) in spec.columns().items()}
    if spec.kind == "image":
        if rows:  # [R48] the field's payloads obey §3.2 in the field's own shards
            check_packed_payloads(found[spec.image_column("offset")], found[spec.image_column("size")], counts,
                                  spec.shards, alignment, path=path, what=f"field {spec.name!r}: ")
        return found
    if spec.variable:  # [R47] (a text field's record is one byte: any offset steps in records)
        _check_blob_offsets(found[spec.offsets_column], found[spec.column], rows, spec.offsets_column,
                            spec.column, path=path, multiple=spec.record_bytes)
    if spec.kind == "array" and spec.classes and len(found[spec.column]):  # [R49] named integer values
        # compared in the stored dtype: a cast to int64 would show a uint64 past 2^63 as negative
        values = found[spec.column].view(spec.numpy_dtype)
        if int(values.min()) < 0 or int(values.max()) >= len(spec.classes):
            at = int(np.argmax((values < 0) | (values >= len(spec.classes))))
            byte = at * spec.numpy_dtype.itemsize
            sample = (int(np.searchsorted(found[spec.offsets_column], byte, side="right")) - 1 if spec.variable
                      else byte // spec.record_bytes)
            raise IndexMismatchError(f"field {spec.name!r} holds value {int(values[at])}, not a class number "
                                     f"0..{len(spec.classes) - 1}", path=path, sample=sample)
    if spec.kind == "classes" and len(found[spec.column]):  # [R49]
        ids = found[spec.column].view("<i8")
        if int(ids.min()) < 0 or int(ids.max()) >= spec.num_classes:
            at = int(np.argmax((ids < 0) | (ids >= spec.num_classes)))
            sample = int(np.searchsorted(found[spec.offsets_column], at * 8, side="right")) - 1
            raise IndexMismatchError(f"field {spec.name!r} holds class id {int(ids[at])} outside "
                                     f"0..{spec.num_classes - 1}", path=path, sample=sample)
    return found


# --- the manifest ---------------------------------------------------------------------------

# Stored names are exactly what a writer produces (shard_file_name, index_file_name): the shard
# number spelt with at least 5 digits and no extra leading zero, then the file's xxh3. Nothing
# else can match, so no stored path can hold '/', '..' or a drive, and no two spellings exist.
_SHARD_PATH = re.compile(r"shards/shard-(\d{5}|[1-9]\d{5,9})-([0-9a-f]{16})\.pks")
_INDEX_PATH = re.compile(r"index-([0-9a-f]{16})\.pki")
#: An image field's shard (§14): ``shards/field-<name>-<number>-<xxh3>.pks``, the number being
#: the planned number of the main shard it runs parallel to.
_FIELD_SHARD_PATH = re.compile(r"shards/field-([a-z][a-z0-9_]{0,11})-(\d{5}|[1-9]\d{5,9})-([0-9a-f]{16})\.pks")
_HEX16 = re.compile(r"[0-9a-f]{16}")

#: Top-level manifest members this version knows; ``dump_manifest`` keeps any others.
MANIFEST_FIELDS = frozenset({
    "format", "format_version", "created_by", "checksum_algorithm", "alignment", "sample_count",
    "codec", "classes", "index", "shards", "build", "history", "limits", "fields"})


def check_relative_path(text: object, pattern: re.Pattern[str], *, what: str, path: object = None) -> str:
    """Return ``text`` if it matches ``pattern`` in full (and holds no ``..``), else raise.

    Raises:
        UnsafePathError: not a string, or not a path this format allows [R19].
    """
    if not isinstance(text, str) or not pattern.fullmatch(text) or ".." in text:  # [R19]
        raise UnsafePathError(f"{what} {text!r} is not a valid dataset path (expected "
                              f"{_describe_pattern(pattern)}, relative, inside the dataset)", path=path)
    return text


def _describe_pattern(pattern: re.Pattern[str]) -> str:
    if pattern is _SHARD_PATH:
        return "shards/shard-<number, at least 5 digits>-<16 hex digits>.pks"
    if pattern is _INDEX_PATH:
        return "index-<16 hex digits>.pki"
    if pattern is _FIELD_SHARD_PATH:
        return "shards/field-<field name>-<number, at least 5 digits>-<16 hex digits>.pks"
    return pattern.pattern


def field_shard_file_name(field_name: str, shard_number: int, content_checksum: int) -> str:
    """Relative path of an image field's shard: ``shards/field-<name>-<number>-<xxh3 hex>.pks``."""
    if not 0 <= shard_number <= MAX_SHARD_NUMBER:
        raise ValueError(f"shard number {shard_number} outside 0..{MAX_SHARD_NUMBER}")
    return f"{SHARD_DIR}/field-{field_name}-{shard_number:05d}-{checksum_hex(content_checksum)}.pks"


def shard_number_of(relative_path: str) -> int:
    """The planned shard number in a shard path (``shards/shard-00012-<hex>.pks`` -> 12).

    Raises:
        UnsafePathError: the path is not a shard path of this format.
    """
    match = _SHARD_PATH.fullmatch(relative_path) if isinstance(relative_path, str) else None
    if match is not None:
        return int(match.group(1))
    match = _FIELD_SHARD_PATH.fullmatch(relative_path) if isinstance(relative_path, str) else None
    if match is None:
        raise UnsafePathError(f"shard path {relative_path!r} is not a valid dataset path (expected "
                              f"{_describe_pattern(_SHARD_PATH)})")
    return int(match.group(2))


@dataclass(frozen=True)
class FileEntry:
    """A file the manifest lists: relative path, size in bytes, xxh3 of the whole file."""

    path: str
    size: int
    checksum: int


@dataclass(frozen=True)
class ShardEntry:
    """One entry of the manifest's ``shards`` list."""

    path: str
    size: int
    checksum: int
    sample_count: int

    @property
    def number(self) -> int:
        """The planned shard number from the file name (the header's ``shard_number``, R38)."""
        return shard_number_of(self.path)


@dataclass(frozen=True)
class Manifest:
    """The validated manifest.

    ``raw`` keeps the parsed JSON: for display (build options etc.) and so that ``dump_manifest``
    keeps top-level members this version does not know (forward compatibility).
    """

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
    #: ``limits.max_pixels``: the build's pixel limit when it differs from the readers' default
    #: (None: the default). Decoding readers use it, so every image the build accepted decodes.
    max_pixels: int | None = None
    #: Declared fields (§14), image fields with their shard entries; () for a dataset without.
    fields: tuple[FieldSpec, ...] = ()

    def field(self, name: str) -> FieldSpec:
        """The declaration of field ``name``.

        Raises:
            KeyError: no such field (a caller asking by name: ``PackedDataset`` turns it into an
                ``OptionError`` naming the fields there are).
        """
        for spec in self.fields:
            if spec.name == name:
                return spec
        raise KeyError(name)


def _need(obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...], *, where: str, path: object) -> Any:
    if key not in obj:
        raise ManifestError(f"{where} lacks required field {key!r}", path=path)
    value = obj[key]
    # JSON true/false parse as bool, a subclass of int: never accept them as numbers
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        name = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise ManifestError(f"{where} field {key!r} must be {_json_type(name)}, got "
                            f"{_json_type(type(value).__name__)}", path=path)
    return value


def _json_type(python_name: str) -> str:
    return {"int": "an integer", "str": "a string", "dict": "an object", "list": "an array",
            "bool": "a boolean", "float": "a number with a fraction or exponent",
            "NoneType": "null"}.get(python_name, python_name)


def _need_count(obj: Mapping[str, Any], key: str, *, where: str, path: object, low: int = 0,
                high: int = MAX_FILE_SIZE) -> int:
    value = _need(obj, key, int, where=where, path=path)
    if not low <= value <= high:
        raise ManifestError(f"{where} field {key!r} = {value} outside {low}..{high}", path=path)
    return value


def parse_manifest(data: bytes, *, path: object = None) -> Manifest:
    """Parse and validate manifest JSON bytes; stored paths are checked, not opened.

    Checks, in order: R30, R31, R32, R16, R33, R34, then R35 and R19 field by field (see the
    spec, section 8.3), R36, R18 (on the raw counts), then per shard entry R35, R19, R37, R17.

    Args:
        data: the bytes of ``manifest.json`` (read at most ``MAX_MANIFEST_BYTES + 1`` of them).
        path: the manifest file, for error messages.

    Raises:
        ManifestError, NotAPackerFileError, UnsupportedVersionError, UnsafePathError.
    """
    if len(data) > MAX_MANIFEST_BYTES:  # [R30]
        raise ManifestError(f"manifest is {len(data)} bytes, over the {MAX_MANIFEST_BYTES} limit", path=path)
    if not data.lstrip()[:1] == b"{":  # [R31]
        raise NotAPackerFileError(f"not a packer manifest (starts with {bytes(data[:16])!r})", path=path)
    try:  # [R32]
        obj = json.loads(bytes(data).decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ManifestError(f"manifest is not valid UTF-8 JSON: {exc}", path=path) from None
    if not isinstance(obj, dict):  # [R32]
        raise ManifestError("manifest must be a JSON object", path=path)
    if obj.get("format") != FORMAT_NAME:  # [R16]
        raise NotAPackerFileError(f"manifest format is {obj.get('format')!r}, expected {FORMAT_NAME!r}",
                                  path=path)
    version = _need(obj, "format_version", int, where="manifest", path=path)  # [R16]
    if version not in SUPPORTED_VERSIONS:  # [R16]
        raise UnsupportedVersionError(f"dataset format version {version} is not supported (this reader "
                                      f"accepts {sorted(SUPPORTED_VERSIONS)}); upgrade packer", path=path)
    algorithm = _need(obj, "checksum_algorithm", str, where="manifest", path=path)  # [R33]
    if algorithm != CHECKSUM_ALGORITHM:  # [R33]
        raise ManifestError(f"checksum_algorithm {algorithm!r} is not {CHECKSUM_ALGORITHM!r}", path=path)
    alignment = _need(obj, "alignment", int, where="manifest", path=path)  # [R34]
    try:
        check_alignment(alignment, path=path)  # [R34]
    except CorruptHeaderError as exc:
        raise ManifestError(exc.message, path=path) from None
    # [R35] field types and ranges, interleaved with [R19] for stored paths
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
        size=_need_count(index_obj, "size", where="manifest index", path=path, low=1),
        checksum=parse_checksum_hex(index_obj.get("checksum"), path=path, what="index checksum"))
    shard_list = _need(obj, "shards", list, where="manifest", path=path)
    if len(shard_list) > MAX_SHARDS:  # [R36]
        raise ManifestError(f"manifest lists {len(shard_list)} shards, over the {MAX_SHARDS} limit", path=path)
    if len(shard_list) > sample_count:  # [R36] every shard holds a sample: refuse before any entry is built
        raise ManifestError(f"manifest lists {len(shard_list)} shards for {sample_count} samples; every shard "
                            f"holds at least one sample", path=path)
    # [R18] from the raw entries, before any entry object is built: a crafted list whose counts
    # cannot add up is refused in one cheap pass (a 55 MiB manifest costs json.loads only). This
    # is the only R18 check: when a count is not a valid integer, R35 refuses its entry below.
    claimed, all_ints = 0, True
    for item in shard_list:
        count = item.get("sample_count") if type(item) is dict else None
        if type(count) is int and 1 <= count <= MAX_SAMPLES:  # else R35 names the entry below
            claimed += count
        else:
            all_ints = False
            break
    if all_ints and claimed != sample_count:  # [R18]
        raise ManifestError(f"sample_count {sample_count} differs from the sum of the shards' counts "
                            f"{claimed}", path=path)
    shards = []
    previous_number = -1
    new_entry = object.__new__  # a frozen dataclass's __init__ costs more than the checks themselves
    for i, item in enumerate(shard_list):
        # Fast path: the checks of the slow path below, inlined, for the common valid entry.
        if type(item) is dict:
            shard_path, size, count, digest = (item.get("path"), item.get("size"), item.get("sample_count"),
                                               item.get("checksum"))
            match = _SHARD_PATH.fullmatch(shard_path) if type(shard_path) is str else None
            if (match is not None and type(size) is int and type(count) is int and type(digest) is str
                    and 1 <= size <= MAX_FILE_SIZE and 1 <= count <= MAX_SAMPLES and size % alignment == 0
                    and _HEX16.fullmatch(digest)):
                number = int(match.group(1))
                if previous_number < number <= MAX_SHARD_NUMBER:
                    entry = new_entry(ShardEntry)
                    object.__setattr__(entry, "path", shard_path)
                    object.__setattr__(entry, "size", size)
                    object.__setattr__(entry, "checksum", int(digest, 16))
                    object.__setattr__(entry, "sample_count", count)
                    previous_number = number
                    shards.append(entry)
                    continue
        where = f"manifest shard {i}"
        entry = _shard_entry(item, _SHARD_PATH, alignment, where=where, label=f"shard {i}", path=path)
        # [R17] planned shard numbers strictly increase along the list (gaps are fine: a planned
        # shard whose files were all rejected is absent), so paths are unique too
        number = entry.number
        if number > MAX_SHARD_NUMBER:
            raise ManifestError(f"{where} ({entry.path}) has number {number}, over the u32 limit "
                                f"{MAX_SHARD_NUMBER}", path=path)
        if number <= previous_number:
            raise ManifestError(f"{where} ({entry.path}) is not numbered after the shard before it "
                                f"({previous_number}); shards must be listed in increasing number order",
                                path=path)
        previous_number = number
        shards.append(entry)
    build = obj.get("build", {})
    history = obj.get("history", [])
    if not isinstance(build, dict) or not isinstance(history, list) or not all(isinstance(h, dict) for h in history):
        raise ManifestError("manifest 'build' must be an object and 'history' a list of objects", path=path)  # [R35]
    created_by = obj.get("created_by", "")
    if not isinstance(created_by, str):  # [R35]
        raise ManifestError("manifest 'created_by' must be a string", path=path)
    max_pixels = None
    if "limits" in obj:  # [R35]
        limits = _need(obj, "limits", dict, where="manifest", path=path)
        if "max_pixels" in limits:
            max_pixels = _need_count(limits, "max_pixels", where="manifest limits", path=path, low=1)
    fields = _parse_fields(obj.get("fields"), shards, alignment, path=path)
    return Manifest(sample_count=sample_count, alignment=alignment, codec=codec, classes=tuple(classes),
                    index=index, shards=tuple(shards), build=build, history=tuple(history),
                    created_by=created_by, format_version=version, raw=obj, max_pixels=max_pixels,
                    fields=fields)


def _shard_entry(item: object, pattern: re.Pattern[str], alignment: int, *, where: str, label: str,
                 path: object) -> ShardEntry:
    """One shard entry of the manifest (main or image field), checked: R35, R19, R37."""
    if not isinstance(item, dict):  # [R35]
        raise ManifestError(f"{where} must be an object", path=path)
    entry = ShardEntry(
        path=check_relative_path(_need(item, "path", str, where=where, path=path), pattern,
                                 what=f"{label} path", path=path),
        size=_need_count(item, "size", where=where, path=path, low=1),
        checksum=parse_checksum_hex(item.get("checksum"), path=path, what=f"{label} checksum"),
        sample_count=_need_count(item, "sample_count", where=where, path=path, low=1, high=MAX_SAMPLES))
    if entry.size % alignment:  # [R37]
        raise ManifestError(f"{where} size {entry.size} is not a multiple of the alignment {alignment}",
                            path=path)
    return entry


def _parse_fields(document: object, shards: Sequence[ShardEntry], alignment: int, *,
                  path: object) -> tuple[FieldSpec, ...]:
    """The ``fields`` member (§14): declarations (R45) and each image field's shards (R50)."""
    specs = fieldspec.parse_declarations(document, path=path)  # [R45]
    result = []
    for number, spec in enumerate(specs):
        if spec.kind != "image":
            if isinstance(document[number], dict) and "shards" in document[number]:  # type: ignore[index]
                raise ManifestError(f"manifest field {number} ({spec.name}) is not an image field and "
                                    f"lists shards", path=path)
            result.append(spec)
            continue
        listed = document[number].get("shards")  # type: ignore[index]
        where = f"manifest field {number} ({spec.name})"
        if not isinstance(listed, list) or len(listed) != len(shards):  # [R50]
            raise ManifestError(f"{where} must list one shard per main shard ({len(shards)}), got "
                                f"{len(listed) if isinstance(listed, list) else type(listed).__name__}", path=path)
        entries = []
        for position, (item, main) in enumerate(zip(listed, shards)):
            at = f"{where} shard {position}"
            entry = _shard_entry(item, _FIELD_SHARD_PATH, alignment, where=at, label=at, path=path)  # [R19] [R37]
            field_name = _FIELD_SHARD_PATH.fullmatch(entry.path).group(1)  # type: ignore[union-attr]
            if field_name != spec.name or entry.number != main.number or entry.sample_count != main.sample_count:
                raise ManifestError(f"{at} ({entry.path}) must be the {spec.name!r} shard numbered "
                                    f"{main.number} with {main.sample_count} samples, like main shard "
                                    f"{position}", path=path)
            entries.append(entry)
        result.append(dataclasses.replace(spec, shards=tuple(entries)))
    return tuple(result)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _field_json(spec: FieldSpec) -> dict[str, Any]:
    document = spec.to_json()
    if spec.kind == "image":
        document["shards"] = [{"path": s.path, "size": s.size, "sample_count": s.sample_count,
                               "checksum": checksum_hex(s.checksum)} for s in spec.shards]
    return document


def dump_manifest(manifest: Manifest) -> bytes:
    """Canonical manifest bytes: sorted keys, two-space indent, UTF-8, trailing newline.

    Top-level members of ``manifest.raw`` that this version does not know are kept as they are
    (a tool that rewrites a manifest, e.g. ``append``, must not drop a newer writer's fields);
    the known members are always written from the typed fields.

    Raises:
        ValueError: a value JSON cannot hold (NaN, infinity, a non-serialisable object).
    """
    obj = {key: value for key, value in manifest.raw.items() if key not in MANIFEST_FIELDS}
    obj.update({
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
        # Informational: a hand-edited 1e400 or a too-deep value must not make a rewrite fail.
        "build": json_ready(manifest.build),
        "history": json_ready(list(manifest.history)),
    })
    if manifest.max_pixels is not None:
        obj["limits"] = {"max_pixels": manifest.max_pixels}
    if manifest.fields:
        obj["fields"] = [_field_json(spec) for spec in manifest.fields]
    obj = {key: (value if key in MANIFEST_FIELDS else json_ready(value)) for key, value in obj.items()}
    text = json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False)
    return (text + "\n").encode("utf-8")


#: Deepest nesting of stored JSON (sample metadata, informational manifest fields) that readers
#: decode or print; packer itself writes at most a few levels.
MAX_JSON_DEPTH = 64
# The closing quote is optional so that an unterminated string matches to the end in one pass
# (a required quote would rescan the rest from every later quote: quadratic on hostile input).
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"?', re.DOTALL)


def json_nesting_depth(data: bytes) -> int:
    """How deeply the arrays/objects of JSON text ``data`` nest, without parsing it (no recursion).

    Strings are blanked first, so brackets inside them do not count. Used before ``json.loads``
    so that hostile nesting is refused with a typed error instead of a ``RecursionError``.
    """
    stripped = _JSON_STRING.sub(b'""', bytes(data))
    if not stripped:
        return 0
    codes = np.frombuffer(stripped, dtype=np.uint8)
    step = ((codes == 0x5B) | (codes == 0x7B)).astype(np.int64) - ((codes == 0x5D) | (codes == 0x7D))
    return int(np.cumsum(step).max(initial=0))


def json_ready(value: Any, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``value`` as strict JSON can hold it: non-finite floats become None, deeper levels None.

    Applied to informational content (the ``build``/``history`` fields of a manifest, sample
    metadata) before it is written or printed, so every ``--json`` output and every manifest
    rewrite is strict JSON (RFC 8259 has no NaN or Infinity) whatever an edited file holds.
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (dict, list, tuple)):
        if max_depth <= 0:
            return None
        if isinstance(value, dict):
            return {str(k): json_ready(v, max_depth=max_depth - 1) for k, v in value.items()}
        return [json_ready(v, max_depth=max_depth - 1) for v in value]
    return value


def verify_checksum(data: Any, expected: int, *, path: object = None, sample: int | None = None,
                    offset: int | None = None, what: str = "sample") -> None:
    """Check that ``data`` hashes to ``expected`` (a sample read with checksums on, ``verify``).

    Raises:
        ChecksumMismatchError: the bytes are damaged [R41].
    """
    got = checksum(data)
    if got != expected:  # [R41]
        raise ChecksumMismatchError(f"{what} checksum mismatch: expected {checksum_hex(expected)}, "
                                    f"got {checksum_hex(got)} (the stored bytes are damaged)",
                                    path=path, sample=sample, offset=offset)


# --- the build record (informative) -----------------------------------------------------------

#: The flat build options that manifests before packer 0.2 recorded (``build.options``), by the
#: group of ``build.settings`` that holds each now (§6.1; ``codec`` is a member of its own).
LEGACY_OPTION_GROUPS = {"alignment": "layout", "shard_size": "layout", "shuffle": "layout", "seed": "layout",
                        "codec": "", "validate": "checks", "max_pixels": "checks", "max_file_size": "checks",
                        "normalize_formats": "checks", "classes": "labels", "label_type": "labels",
                        "fields": "labels"}
#: The groups of ``build.settings`` (§6.1), besides its ``codec`` string.
BUILD_SETTINGS_GROUPS = ("source", "layout", "checks", "labels")


def regroup_build_options(options: Mapping[str, Any], source_kind: Any = None) -> dict[str, Any]:
    """Flat build options (an old ``build.options``, or ``BuildOptions``) as nested build settings:
    each name under the group ``LEGACY_OPTION_GROUPS`` gives it (unknown names are dropped), and
    ``source_kind``, when given, as ``source.kind``. Values are moved, never checked."""
    nested: dict[str, Any] = {group: {} for group in BUILD_SETTINGS_GROUPS}
    for name, value in options.items():
        group = LEGACY_OPTION_GROUPS.get(name)
        if group == "":
            nested[name] = value
        elif group is not None:
            nested[group][name] = value
    if source_kind is not None:
        nested["source"]["kind"] = source_kind
    return nested


def recorded_build_settings(build: Any) -> dict[str, Any] | None:
    """The build settings a manifest's informative ``build`` record holds, nested as §6.1 says: its
    ``settings`` object, or the flat ``options`` (with ``source_kind``) that older builds wrote,
    regrouped (``regroup_build_options``). None when the record holds neither as an object.

    The values are as recorded (hand edits, other writers): whoever uses them checks them.
    """
    if not isinstance(build, Mapping):
        return None
    settings = build.get("settings")
    if isinstance(settings, dict):
        return settings
    options = build.get("options")
    if not isinstance(options, dict):
        return None
    return regroup_build_options(options, build.get("source_kind"))
