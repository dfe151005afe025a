"""An index seen through a selection of its rows: the columns of a view (``packer.viewfile``).

``SelectedColumns`` has the attributes of ``format.IndexColumns`` (``shard``, ``offset``, ...,
``keys`` with ``key_offsets``, ``field_columns``), each the base column gathered at the selected
rows, so a ``Dataset`` over a view hands every reader plain index arrays of the view's rows; the
shards are the base's, read at the base's offsets. A column is gathered the first time it is
asked for, then kept: opening a view costs nothing per column, and a DataLoader worker forked
after the parent gathered a column shares its pages. The four columns every read touches
(``shard``, ``offset``, ``size``, ``label``) are gathered together, so the parent's block order
(which measures blocks from the offsets before the workers start) leaves none of them to a worker.

Blobs (keys, metadata, variable fields) are gathered as ``(offsets, bytes)`` pairs, bounded in
temporary memory (``_CHUNK`` rows at a time).
"""

from __future__ import annotations

import threading
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from . import format as fmt

__all__ = ["SelectedColumns", "gather_blob"]

#: Rows gathered per step of a blob (bounds the int64 position array to a few MB).
_CHUNK = 1 << 16


def gather_blob(offsets: np.ndarray, blob: np.ndarray, rows: np.ndarray, *,
                record_bytes: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``rows`` of a blob column: ``(new_offsets, new_blob)`` with the same meaning.

    ``offsets`` are byte offsets into ``blob`` (``N + 1`` of them); a field's offsets count records
    of ``record_bytes`` bytes in units of bytes already (SPEC §14.2), so they gather alike.
    """
    starts = offsets[rows].astype(np.int64)
    lengths = offsets[rows + 1].astype(np.int64) - starts
    new_offsets = np.zeros(len(rows) + 1, dtype=np.uint64)
    np.cumsum(lengths, out=new_offsets[1:])
    out = np.empty(int(new_offsets[-1]), dtype=blob.dtype)
    for first in range(0, len(rows), _CHUNK):
        part = slice(first, first + _CHUNK)
        length = lengths[part]
        total = int(length.sum())
        if not total:
            continue
        at = int(new_offsets[first])
        shift = np.repeat(starts[part] - (new_offsets[first:first + len(length)].astype(np.int64) - at), length)
        out[at:at + total] = blob[np.arange(total, dtype=np.int64) + shift]
    return new_offsets, out


class LazyColumns:
    """Index columns made on first use, once, whichever thread asks first (a subclass's
    ``_gather(name)`` makes one; it may also fill ``_cache`` with columns made alongside)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: dict[str, np.ndarray] = {}

    def _column(self, name: str) -> np.ndarray:
        column = self._cache.get(name)
        if column is None:
            with self._lock:
                column = self._cache.get(name)
                if column is None:
                    column = self._gather(name)
                    self._cache[name] = column
        return column

    def _gather(self, name: str) -> np.ndarray:
        raise NotImplementedError


class SelectedColumns(LazyColumns):
    """The columns of ``base`` (``IndexColumns``) at rows ``rows`` (int64, ascending, in range)."""

    _PLAIN = ("shard", "offset", "size", "checksum", "label", "width", "height", "channels", "image_format")
    #: What every read touches (where the bytes are, and the label).
    _HOT = ("shard", "offset", "size", "label")

    def __init__(self, base: fmt.IndexColumns, rows: np.ndarray, fields: Sequence[fmt.FieldSpec] = ()) -> None:
        super().__init__()
        self._base = base
        self.rows = rows
        self._fields = tuple(fields)
        self.field_columns: Mapping[str, np.ndarray] = _SelectedFields(self)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def base(self) -> fmt.IndexColumns:
        """The whole index the rows are taken from."""
        return self._base

    def _gather(self, name: str) -> np.ndarray:
        base = self._base
        if name in self._HOT:
            # Gathered together: a parent process that orders by blocks (offsets) gets the labels
            # too, so forked DataLoader workers share all four instead of copying the labels.
            for other in self._HOT:
                if other != name:
                    self._cache[other] = getattr(base, other)[self.rows]
            return getattr(base, name)[self.rows]
        if name in self._PLAIN:
            return getattr(base, name)[self.rows]
        if name in ("key_offsets", "keys"):
            self._cache["key_offsets"], self._cache["keys"] = gather_blob(base.key_offsets, base.keys, self.rows)
            return self._cache[name]
        if name in ("meta_offsets", "meta"):
            self._cache["meta_offsets"], self._cache["meta"] = gather_blob(base.meta_offsets, base.meta, self.rows)
            return self._cache[name]
        return self._gather_field(name)

    def _gather_field(self, name: str) -> np.ndarray:
        columns = self._base.field_columns
        for spec in self._fields:
            kinds = spec.columns()
            if name not in kinds:
                continue
            if spec.kind == "image":
                return columns[name][self.rows]
            if spec.variable:
                key_offsets, key_blob = f"@{spec.offsets_column}", f"@{spec.column}"
                pair = gather_blob(columns[spec.offsets_column], columns[spec.column], self.rows)
                self._cache[key_offsets], self._cache[key_blob] = pair
                return pair[0] if name == spec.offsets_column else pair[1]
            size = spec.record_bytes
            return columns[name].reshape(-1, size)[self.rows].reshape(-1) if size else columns[name][:0]
        return columns[name]  # a column no declared field names: the base's, unselected

    def __getattr__(self, name: str) -> np.ndarray:
        if name.startswith("_") or name not in (*self._PLAIN, "key_offsets", "keys", "meta_offsets", "meta"):
            raise AttributeError(name)
        return self._column(name)


class _SelectedFields(Mapping[str, np.ndarray]):
    """``field_columns`` of a selection: each field column gathered on first use."""

    def __init__(self, owner: SelectedColumns) -> None:
        self._owner = owner

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._owner._base.field_columns:
            raise KeyError(name)
        cache = self._owner._cache
        marked = f"@{name}"
        column = cache.get(marked)
        if column is None:
            with self._owner._lock:
                column = cache.get(marked)
                if column is None:
                    column = self._owner._gather_field(name)
                    cache[marked] = column
        return column

    def __iter__(self) -> Iterator[str]:
        return iter(self._owner._base.field_columns)

    def __len__(self) -> int:
        return len(self._owner._base.field_columns)

    def __contains__(self, name: Any) -> bool:
        return name in self._owner._base.field_columns
