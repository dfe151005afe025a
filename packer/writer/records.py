"""Shard records: what a packed shard left for ``finish`` (per-sample rows, rejections, codec notes).

A record is written atomically after its shard file is committed; ``finish``, ``--resume`` and
parts trust a shard only through its record (same plan fingerprint, shard file present and of the
recorded size).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .. import format as fmt
from ..errors import PackerError
from ..fields import IMAGE_COLUMNS
from .._internal.files import read_capped
from .._internal.atomic import write_atomic
from .staging import RECORD_DIR, STAGING_DIR

__all__ = ["RECORD_COLUMNS", "HASH_COLUMNS", "record_columns", "record_path", "write_record", "read_record"]

#: A record holds one shard's rows (48 bytes a sample): far below this for any shard.
MAX_RECORD_BYTES = 4 << 30
RECORD_COLUMNS = ("source", "offset", "size", "checksum", "width", "height", "channels", "image_format")
#: With ``--hash perceptual``: each packed sample's perceptual hash (two words) and its status
#: (``duplicates.phash``), computed by the worker that packed it; ``finish`` writes them to the
#: hashes file beside the index.
HASH_COLUMNS = ("phash_lo", "phash_hi", "phash_status")
_DTYPES = {"phash_lo": np.uint64, "phash_hi": np.uint64, "phash_status": np.uint8,
           "source": np.uint64, "offset": np.uint64, "size": np.uint64, "checksum": np.uint64,
           "width": np.uint32, "height": np.uint32, "channels": np.uint8, "image_format": np.uint8,
           "format": np.uint8}


def record_columns(image_fields: Sequence[Any] = (), *, hashes: bool = False) -> tuple[str, ...]:
    """A record's per-sample columns: the main image's, then ``<field>__<part>`` per image field
    (``part`` as in ``fields.IMAGE_COLUMNS``), then the perceptual hash's when ``hashes``."""
    return (RECORD_COLUMNS + tuple(f"{spec.name}__{part}" for spec in image_fields for part in IMAGE_COLUMNS)
            + (HASH_COLUMNS if hashes else ()))


def record_path(out: Path, shard: int) -> Path:
    return out / STAGING_DIR / RECORD_DIR / f"shard-{shard:05d}.pkr"



def write_record(path: Path, header: dict[str, Any], rows: dict[str, list[int]]) -> None:
    columns = {name: np.asarray(values, dtype=_DTYPES[name.rpartition("__")[2]]) for name, values in rows.items()}
    columns["header"] = np.frombuffer(json.dumps(header, sort_keys=True).encode(), dtype=np.uint8)
    write_atomic(path, fmt.encode_column_file(fmt.PLAN_MAGIC, len(columns["source"]), columns))


def read_record(path: Path, fingerprint: int, out: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    """A shard record, if present, from this plan, and its shard file is still there intact in size."""
    if not path.exists() and not path.is_symlink():
        return None
    try:
        # Inside OUT, a regular file, bounded: a FIFO or a link out planted here is not waited on.
        data = read_capped(path.parent, path.name, MAX_RECORD_BYTES)
        if data is None:
            return None
        _, columns = fmt.parse_column_file(data, fmt.PLAN_MAGIC, path=path, kind="shard record")
        header = json.loads(columns.pop("header").tobytes())
    except (PackerError, KeyError, ValueError, RecursionError):
        return None  # a damaged record is redone, not trusted
    if (not isinstance(header, dict) or header.get("plan") != fmt.checksum_hex(fingerprint)
            or type(header.get("sample_count")) is not int or not isinstance(header.get("rejected"), list)):
        return None
    if header["sample_count"]:
        if not isinstance(header.get("path"), str) or type(header.get("size")) is not int:
            return None
        try:
            fmt.shard_number_of(header["path"])  # a shard path of this format, nothing else
        except PackerError:
            return None
        files = [(header["path"], header["size"])]
        field_files = header.get("fields", {})
        if not isinstance(field_files, dict):
            return None
        for entry in field_files.values():
            if not isinstance(entry, dict) or not isinstance(entry.get("path"), str) or type(entry.get("size")) is not int:
                return None
            try:
                fmt.shard_number_of(entry["path"])  # a field shard path of this format
            except PackerError:
                return None
            files.append((entry["path"], entry["size"]))
        for relative, size in files:
            try:
                if (out / relative).stat().st_size != size:
                    return None
            except OSError:
                return None
    return header, columns


