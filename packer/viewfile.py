"""The view file (``.pkview``): a subset of a dataset by sample number, its bytes and its checks.

A view is a small file naming a dataset (its *base*) and a sorted selection of its sample
numbers; ``packer.open_dataset(view_file)`` opens the base and gives a dataset of the selected
samples only (``packer.dataset``: the index columns are gathered through the selection, the
shards are the base's), so every reader reads a view without knowing it is one. Not a byte of
the base is copied or changed.

Layout (formats/SPEC.md §17 is normative; all integers little-endian)::

     0  8s  magic              b"PKVIEW\\0\\0"
     8  I   version            1
    12  I   reserved           zero
    16  Q   base_samples       N: the base's sample count when the view was made
    24  Q   rows_checksum      xxh3 of the identity of the base's rows 0..N-1 (``rows_checksum``)
    32  Q   index_checksum     the base manifest's index.checksum then (informative)
    40  Q   selected_count     M <= N
    48  Q   description_bytes  D <= MAX_DESCRIPTION_BYTES
    56  Q   checksum           xxh3 of every byte after the header
    64  M u64                  the selected sample numbers, strictly ascending, each < N
        D bytes                the description: a UTF-8 JSON object {"base": ..., "selectors": [...]}
        zero bytes up to a multiple of 8

Identity. ``append`` only adds rows at the end of a dataset, so the base's first N rows are the
same samples after any number of appends: a view stays exact. What the view checks at open is
that those rows are still the ones it was made of: the checksum of their payload checksums and
keys (``rows_checksum``), never the whole index's (which every append changes). A rebuild that
reorders, or another dataset at the base's location, is refused (V9), naming the view and what
differs.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from . import format as fmt
from .errors import (ChecksumMismatchError, CorruptHeaderError, IndexMismatchError, NotAPackerFileError,
                     TruncatedFileError, UnsupportedVersionError)

__all__ = ["ViewFile", "encode_view", "parse_view", "rows_checksum", "check_base", "is_view_file",
           "VERSION", "SUPPORTED_VERSIONS", "HEADER", "MAX_DESCRIPTION_BYTES", "SUFFIX"]

VERSION = 1
SUPPORTED_VERSIONS = frozenset({1})
_HEADER = struct.Struct("<8sIIQQQQQQ")
HEADER = _HEADER.size
assert HEADER == 64
#: The description (base location and selectors) is small: a cap before it is parsed.
MAX_DESCRIPTION_BYTES = 1 << 20
#: The suffix ``packer view`` gives the files it writes (a view opens whatever its name).
SUFFIX = ".pkview"


@dataclass(frozen=True)
class ViewFile:
    """A parsed view file.

    Attributes:
        base: the base dataset's location as written (a URL, or a path: relative paths are
            relative to the view file's folder).
        base_samples: the base's sample count when the view was made.
        rows_checksum: the identity of those rows (``rows_checksum``).
        index_checksum: the base's index checksum when the view was made (informative: an
            ``append`` changes it and the view stays valid).
        selected: the selected sample numbers of the base (uint64, strictly ascending).
        selectors: what chose them (JSON objects, for ``packer inspect``).
        checksum: the file's checksum (its identity in a saved reader state).
    """

    base: str
    base_samples: int
    rows_checksum: int
    index_checksum: int
    selected: np.ndarray
    selectors: tuple[dict[str, Any], ...] = ()
    checksum: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.selected)

    def base_location(self, view_path: str | os.PathLike[str] | None) -> str:
        """The base's location for ``parse_location``: a relative path joined to the view's folder."""
        if "://" in self.base or os.path.isabs(self.base) or view_path is None:
            return self.base
        return os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(view_path)), self.base))


def file_size(selected_count: int, description_bytes: int) -> int:
    """Bytes of a view file of ``selected_count`` numbers and a ``description_bytes`` description."""
    return HEADER + 8 * selected_count + fmt.align_up(description_bytes, 8)


def rows_checksum(index: Any, rows: int) -> int:
    """The identity of rows ``0..rows-1`` of an index (``IndexColumns``): xxh3-64 over their payload
    checksums (u64 little-endian), then their key offsets ``0..rows`` (u64), then their key bytes.

    A row is the same sample when its key and payload checksum are: ``append`` keeps every row of
    the dataset before it, so this is unchanged by appends.
    """
    # The columns are hashed in place (views of the mapped index: no copy of a million rows).
    digest = xxhash.xxh3_64()
    digest.update(np.ascontiguousarray(index.checksum[:rows], dtype="<u8"))
    offsets = np.ascontiguousarray(index.key_offsets[:rows + 1], dtype="<u8")
    digest.update(offsets)
    end = int(offsets[-1]) if len(offsets) else 0
    digest.update(np.ascontiguousarray(index.keys[:end]))
    return digest.intdigest()


def encode_view(view: ViewFile) -> bytes:
    """The bytes of a view file (``checksum`` of ``view`` is ignored: computed here)."""
    selected = np.ascontiguousarray(view.selected, dtype="<u8")
    description = json.dumps({**view.extra, "base": view.base, "selectors": list(view.selectors)},
                              sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    body = selected.tobytes() + description + bytes(fmt.align_up(len(description), 8) - len(description))
    head = _HEADER.pack(fmt.VIEW_MAGIC, VERSION, 0, view.base_samples, view.rows_checksum, view.index_checksum,
                        len(selected), len(description), fmt.checksum(body))
    return head + body


def is_view_file(path: Path) -> bool:
    """Whether ``path`` is a regular file that starts with the view magic (a folder never is)."""
    try:
        if not path.is_file():
            return False
        with open(path, "rb") as handle:
            return handle.read(len(fmt.VIEW_MAGIC)) == fmt.VIEW_MAGIC
    except OSError:
        return False


def read_view(path: Path) -> bytes:
    """A view file's bytes, bounded by what its header can describe."""
    with open(path, "rb") as handle:
        head = handle.read(HEADER)
        if len(head) == HEADER:
            selected_count, description_bytes = struct.unpack_from("<QQ", head, 40)
            limit = file_size(min(selected_count, fmt.MAX_SAMPLES), min(description_bytes, MAX_DESCRIPTION_BYTES))
            return head + handle.read(limit - HEADER + 1)  # one byte more: an extended file is seen
        return head


def parse_view(data: Any, *, path: object = None) -> ViewFile:
    """Validate a view file (SPEC §17, V1-V8, in that order) and return it.

    Args:
        data: the whole file.
        path: the file, for messages.

    Raises:
        NotAPackerFileError, TruncatedFileError, UnsupportedVersionError, CorruptHeaderError,
        ChecksumMismatchError.
    """
    view = memoryview(data).cast("B")
    magic = fmt.VIEW_MAGIC
    if len(view) < HEADER:  # [V1]
        if not len(view) or bytes(view[:len(magic)]) != magic[:len(view)]:
            raise NotAPackerFileError(f"not a packer view file (starts with {bytes(view[:8])!r})", path=path)
        raise TruncatedFileError(f"view file is {len(view)} bytes, shorter than its {HEADER}-byte header", path=path)
    (got, version, reserved, base_samples, rows_sum, index_sum, count, description_bytes,
     checksum) = _HEADER.unpack(view[:HEADER])
    if got != magic:  # [V2]
        raise NotAPackerFileError(f"not a packer view file (starts with {got!r})", path=path)
    if version not in SUPPORTED_VERSIONS:  # [V3]
        raise UnsupportedVersionError(f"view file version {version}; this packer reads versions "
                                      f"{sorted(SUPPORTED_VERSIONS)}", path=path)
    if reserved or base_samples > fmt.MAX_SAMPLES or count > base_samples or description_bytes > MAX_DESCRIPTION_BYTES:  # [V4]
        raise CorruptHeaderError(
            f"view file header says {count} of {base_samples} samples, a {description_bytes}-byte description and "
            f"reserved {reserved}; expected at most as many selected as base samples (at most {fmt.MAX_SAMPLES}), "
            f"a description of at most {MAX_DESCRIPTION_BYTES} bytes and reserved 0", path=path)
    expected = file_size(count, description_bytes)
    if len(view) != expected:  # [V5]
        raise TruncatedFileError(f"view file is {len(view)} bytes but its header's {count} samples and "
                                 f"{description_bytes}-byte description need {expected} "
                                 f"({'truncated' if len(view) < expected else 'extended'})", path=path)
    body = view[HEADER:]
    if fmt.checksum(body) != checksum:  # [V6]
        raise ChecksumMismatchError(f"view file checksum mismatch: header says {fmt.checksum_hex(checksum)}, its "
                                    f"bytes hash to {fmt.checksum_hex(fmt.checksum(body))}", path=path)
    # The numbers stay a read-only view of the file's bytes (little-endian u64 is numpy's uint64 here).
    selected = np.frombuffer(body, dtype="<u8", count=count)
    if count:  # [V7]
        backwards = selected[1:] <= selected[:-1]
        if backwards.any():
            bad = int(np.argmax(backwards)) + 1
            raise CorruptHeaderError(f"selected sample numbers must be strictly ascending: entry {bad} is "
                                     f"{int(selected[bad])} after {int(selected[bad - 1])}", path=path)
        if int(selected[-1]) >= base_samples:
            raise CorruptHeaderError(f"selects sample {int(selected[-1])} of a base of {base_samples} samples",
                                     path=path)
    raw = bytes(body[8 * count:8 * count + description_bytes])
    padding = bytes(body[8 * count + description_bytes:])
    description, problem = _description(raw, padding)
    if problem:  # [V8]
        raise CorruptHeaderError(f"view file description is not a JSON object with a base location and a list of "
                                 f"selectors followed by zero padding ({problem})", path=path)
    extra = {key: value for key, value in description.items() if key not in ("base", "selectors")}
    return ViewFile(base=description["base"], base_samples=base_samples, rows_checksum=rows_sum,
                    index_checksum=index_sum, selected=selected, selectors=tuple(description["selectors"]),
                    checksum=checksum, extra=extra)


def _description(raw: bytes, padding: bytes) -> tuple[Any, str]:
    """The description's JSON value, and what is wrong with it ("" when nothing)."""
    try:
        description = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        return None, str(exc)
    if padding.strip(b"\x00"):
        return None, "padding is not zero"
    if not (isinstance(description, dict) and isinstance(description.get("base"), str) and description["base"]
            and isinstance(description.get("selectors"), list)
            and all(isinstance(item, dict) for item in description["selectors"])):
        return None, "not an object with a base and a list of selectors"
    return description, ""


def check_base(view: ViewFile, index: Any, sample_count: int, *, path: object, base: str) -> None:
    """V9: the base opened for ``view`` still holds the rows the view was made of.

    Args:
        index: the base's ``IndexColumns``; sample_count: its sample count.
        path: the view file; base: the base's location, for the message.

    Raises:
        IndexMismatchError: the base has fewer samples than the view was made of, or its first rows
            are other samples (a rebuild, another dataset).
    """
    if sample_count < view.base_samples:  # [V9]
        raise IndexMismatchError(f"view of {base} was made of its {view.base_samples} samples, but the dataset now "
                                 f"holds {sample_count} (rebuilt or replaced: make the view again)", path=path)
    got = rows_checksum(index, view.base_samples)
    if got != view.rows_checksum:  # [V9]
        raise IndexMismatchError(
            f"view of {base} was made of samples whose keys and checksums hash to "
            f"{fmt.checksum_hex(view.rows_checksum)}, but the dataset's first {view.base_samples} samples hash to "
            f"{fmt.checksum_hex(got)} (rebuilt or another dataset: make the view again)", path=path)
