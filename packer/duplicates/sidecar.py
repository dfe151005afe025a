"""The perceptual-hashes file beside a dataset's index: its bytes, its checks, and where it lives.

Layout (formats/SPEC.md §16 is normative; all integers little-endian)::

     0  8s  magic            b"PKHASH\\0\\0"
     8  I   version          1
    12  I   algorithm        1 = dct-sign-128 (packer.duplicates.phash)
    16  Q   sample_count     N, equal to the dataset's
    24  Q   index_checksum   xxh3 of the dataset's index file (the manifest's index.checksum)
    32  Q   table_checksum   xxh3 of every byte after the header
    40  I   hash_words       2 (u64 words per hash)
    44  20x reserved         zero
    64  N * 2 u64            the hashes, sample by sample (word 0, word 1)
        N u8                 the status of each sample: 0 hashed, 1 flat, 2 unreadable
        zero bytes up to a multiple of 8

Identity. The index pins every payload (its per-sample xxh3 and size), so a hashes file whose
``index_checksum`` and ``sample_count`` are the dataset's describes exactly these payloads; any
other (an older generation before an ``append``, a rebuild, a copy of another dataset) is stale:
``load_or_compute`` recomputes and replaces it, never trusting it. A damaged or foreign file at the
name is replaced the same way, with a warning naming what was wrong.

Where. Beside the index in the dataset folder, written atomically (a unique temp name, fsync,
rename); readers of the dataset ignore it (SPEC §1: only listed files are read), and ``packer
verify`` never looks at it. For a dataset at a URL it goes in the node cache's folder of the
manifest generation (``v1/<dataset>/<generation>/``, beside the cached index): the dataset's
bytes in the store are never written (the store may be read-only and shared), the next run on the
same node reuses it, and a new generation gets a new folder. A folder that cannot be written
(read-only media) is not an error: the hashes are computed for the run and not kept.
"""

from __future__ import annotations

import logging
import os
import stat
import struct
from pathlib import Path
from typing import Any

import numpy as np

from .. import format as fmt
from .._internal.atomic import write_atomic
from ..errors import (ChecksumMismatchError, CorruptHeaderError, FormatError, IndexMismatchError,
                      NotAPackerFileError, TruncatedFileError, UnsupportedVersionError)
from .phash import ALGORITHM, HASH_WORDS, STATUS_NAMES, HashTable, hash_dataset

__all__ = ["HEADER", "VERSION", "SUPPORTED_VERSIONS", "encode_hashes", "parse_hashes", "hashes_path",
           "load_or_compute", "file_size"]

_log = logging.getLogger(__name__)

VERSION = 1
SUPPORTED_VERSIONS = frozenset({1})
SUPPORTED_ALGORITHMS = frozenset({ALGORITHM})
_HEADER = struct.Struct("<8sIIQQQI20x")
HEADER = _HEADER.size
assert HEADER == 64


def file_size(count: int) -> int:
    """Bytes of a hashes file of ``count`` samples."""
    return HEADER + 8 * HASH_WORDS * count + fmt.align_up(count, 8)


def encode_hashes(table: HashTable, index_checksum: int) -> bytes:
    """The bytes of a hashes file for ``table`` (hashes of non-hashed samples written as zero)."""
    count = len(table)
    hashes = np.where((table.status == 0)[:, None], table.hashes, np.uint64(0)).astype("<u8")
    body = hashes.tobytes() + table.status.astype(np.uint8).tobytes() + bytes(fmt.align_up(count, 8) - count)
    head = _HEADER.pack(fmt.HASHES_MAGIC, VERSION, ALGORITHM, count, index_checksum, fmt.checksum(body), HASH_WORDS)
    return head + body


def parse_hashes(data: Any, *, path: object = None, index_checksum: int | None = None,
                 sample_count: int | None = None) -> HashTable:
    """Validate a hashes file (SPEC §16, H1-H9, in that order) and return its table.

    Args:
        data: the whole file.
        path: the file, for messages.
        index_checksum, sample_count: the dataset's identity; when given, a file for another
            index or count is refused as stale (H9).

    Raises:
        NotAPackerFileError, TruncatedFileError, UnsupportedVersionError, CorruptHeaderError,
        ChecksumMismatchError, IndexMismatchError.
    """
    view = memoryview(data).cast("B")
    magic = fmt.HASHES_MAGIC
    if len(view) < HEADER:  # [H1]
        if not len(view) or bytes(view[:len(magic)]) != magic[:len(view)]:
            raise NotAPackerFileError(f"not a packer hashes file (starts with {bytes(view[:8])!r})", path=path)
        raise TruncatedFileError(f"hashes file is {len(view)} bytes, shorter than its {HEADER}-byte header",
                                 path=path)
    got, version, algorithm, count, checksum, table_checksum, words = _HEADER.unpack(view[:HEADER])
    if got != magic:  # [H2]
        raise NotAPackerFileError(f"not a packer hashes file (starts with {got!r})", path=path)
    if version not in SUPPORTED_VERSIONS:  # [H3]
        raise UnsupportedVersionError(f"hashes file version {version}; this packer reads versions "
                                      f"{sorted(SUPPORTED_VERSIONS)}", path=path)
    if algorithm not in SUPPORTED_ALGORITHMS:  # [H4]
        raise UnsupportedVersionError(f"hash algorithm {algorithm}; this packer computes algorithm {ALGORITHM} "
                                      f"(dct-sign-128)", path=path)
    if words != HASH_WORDS or count > fmt.MAX_SAMPLES:  # [H5]
        raise CorruptHeaderError(f"hashes file header says {count} samples of {words} words; expected at most "
                                 f"{fmt.MAX_SAMPLES} samples of {HASH_WORDS} words", path=path)
    expected = file_size(count)
    if len(view) != expected:  # [H6]
        raise TruncatedFileError(f"hashes file is {len(view)} bytes but its header's {count} samples need "
                                 f"{expected} ({'truncated' if len(view) < expected else 'extended'})", path=path)
    body = view[HEADER:]
    if fmt.checksum(body) != table_checksum:  # [H7]
        raise ChecksumMismatchError(f"hashes table checksum mismatch: header says {fmt.checksum_hex(table_checksum)}, "
                                    f"the table hashes to {fmt.checksum_hex(fmt.checksum(body))}", path=path)
    hashes = np.frombuffer(body, dtype="<u8", count=HASH_WORDS * count).reshape(count, HASH_WORDS).astype(np.uint64)
    status = np.frombuffer(body, dtype=np.uint8, count=count, offset=8 * HASH_WORDS * count).copy()
    if count and int(status.max()) >= len(STATUS_NAMES):  # [H8]
        bad = int(np.argmax(status >= len(STATUS_NAMES)))
        raise CorruptHeaderError(f"status {int(status[bad])} is not one of {sorted(STATUS_NAMES)}", path=path,
                                 sample=bad)
    if (index_checksum is not None and checksum != index_checksum) or (
            sample_count is not None and count != sample_count):  # [H9]
        raise IndexMismatchError(
            f"stale hashes: computed for index {fmt.checksum_hex(checksum)} ({count} samples), the dataset's index "
            f"is {fmt.checksum_hex(index_checksum if index_checksum is not None else checksum)} "
            f"({sample_count if sample_count is not None else count} samples)", path=path)
    return HashTable(hashes=hashes, status=status)


def hashes_path(dataset: Any) -> Path:
    """Where ``dataset``'s hashes file lives: beside its index, in its place's local folder (a
    dataset folder, or a URL's generation folder in the node cache)."""
    return Path(dataset.place.folder) / fmt.HASHES_NAME


def load_or_compute(dataset: Any, *, workers: int = 1, progress: bool = False, store: bool = True
                    ) -> tuple[HashTable, str]:
    """The dataset's hashes: from its hashes file when it is valid and for this index, else
    computed (and stored, when ``store`` and the folder allows).

    Returns:
        ``(table, source)``: ``source`` says where the hashes came from, for the report
        (``"stored"``, ``"computed"``, ``"computed (replaced a stale file: ...)"``, ...).
    """
    path = hashes_path(dataset)
    if getattr(dataset, "is_view", False):
        return _view_hashes(dataset, path, workers=workers, progress=progress)
    identity = {"index_checksum": dataset.manifest.index.checksum, "sample_count": len(dataset)}
    replaced = None
    try:
        data = _read(path)
    except OSError as exc:
        data, replaced = None, f"unreadable: {exc.strerror or exc}"
    if data is not None:
        try:
            return parse_hashes(data, path=path, **identity), "stored"
        except FormatError as exc:
            replaced = str(exc)
            _log.warning("ignoring %s and recomputing: %s", path, exc)
    table = hash_dataset(dataset, workers=workers, progress=progress)
    source = "computed" if replaced is None else f"computed (replaced: {replaced})"
    if store:
        try:
            write_atomic(path, [encode_hashes(table, identity["index_checksum"])])
            source += f"; stored in {path}"
        except OSError as exc:
            source += f"; not stored ({exc.strerror or exc})"
            _log.warning("could not store the hashes in %s: %s", path, exc.strerror or exc)
    return table, source


def _view_hashes(view: Any, path: Path, *, workers: int, progress: bool) -> tuple[HashTable, str]:
    """A view's hashes: its rows of the dataset's hashes file when that file is valid for the
    dataset's index, else computed for the view's samples alone and not stored (the file beside the
    index is the whole dataset's: a view never replaces it)."""
    rows = view.base_rows
    try:
        data = _read(path)
        if data is not None:
            whole = parse_hashes(data, path=path, index_checksum=view.manifest.index.checksum)
            if len(whole.status) > int(rows.max(initial=-1)):
                return HashTable(hashes=whole.hashes[rows], status=whole.status[rows]), "stored (the dataset's)"
    except (OSError, FormatError) as exc:
        _log.warning("not using %s for the view: %s", path, getattr(exc, "strerror", None) or exc)
    return hash_dataset(view, workers=workers, progress=progress), "computed (a view's samples; not stored)"


def _read(path: Path) -> bytes | None:
    """The file's bytes, or None when there is none (a folder or FIFO in its place is unreadable)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise OSError(0, "not a regular file")
        return handle.read()

