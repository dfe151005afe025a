"""Declared fields while building: each listed row's field values, as flat arrays.

A source with declared fields (``--field``, ``--fields``) gives every listed row one value per
field. Value fields (``array``, ``classes``, ``text``) are encoded when the row is listed (a row
whose value does not fit is rejected then, with the reason ``bad-field``) and kept as one blob
plus offsets per field, like the keys. Image fields keep the relative path and size of each
row's second image file; packing reads and checks it beside the main image.

The table travels with the listing: through duplicate removal (``select``), into the saved plan
(``plan_columns`` / ``from_plan_columns``: so ``--resume`` and ``--part`` see the same values),
and into the index (``index_columns``).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, replace
from typing import Any, Callable, Container, Mapping, Sequence

import numpy as np

from .blobs import gather_blob
from ..fields import ClassVocabulary, FieldSpec, FieldValueError, encode_value

__all__ = ["FieldTable", "FieldRowBuilder", "FIELD_REJECTION"]

#: The build report's reason for a row whose field value does not fit its declaration.
FIELD_REJECTION = "bad-field"


@dataclass
class FieldTable:
    """Every listed row's field values.

    Attributes:
        specs: the declarations (``classes`` fields with their final class list).
        blobs / offsets: value fields: name -> bytes of every row's value, and row ``i``'s value
            is ``blobs[name][offsets[name][i]:offsets[name][i + 1]]``.
        image_keys / image_key_offsets / image_sizes: image fields: name -> the second image's
            path relative to the source root (UTF-8 blob + offsets) and its size at listing.
    """

    specs: tuple[FieldSpec, ...]
    blobs: dict[str, np.ndarray]
    offsets: dict[str, np.ndarray]
    image_keys: dict[str, np.ndarray]
    image_key_offsets: dict[str, np.ndarray]
    image_sizes: dict[str, np.ndarray]

    @property
    def image_specs(self) -> tuple[FieldSpec, ...]:
        return tuple(spec for spec in self.specs if spec.kind == "image")

    def image_key(self, name: str, row: int) -> str:
        offsets = self.image_key_offsets[name]
        return self.image_keys[name][int(offsets[row]):int(offsets[row + 1])].tobytes().decode("utf-8")

    def select(self, rows: np.ndarray) -> "FieldTable":
        """The table restricted to listing rows ``rows`` (in that order)."""
        blobs, offsets, keys, key_offsets = {}, {}, {}, {}
        for name in self.blobs:
            blobs[name], offsets[name] = gather_blob(self.blobs[name], self.offsets[name], rows)
        for name in self.image_keys:
            keys[name], key_offsets[name] = gather_blob(self.image_keys[name], self.image_key_offsets[name], rows)
        return FieldTable(self.specs, blobs, offsets, keys, key_offsets,
                          {name: sizes[rows] for name, sizes in self.image_sizes.items()})

    # --- the saved plan: column names stay short and fixed (fv3, fo3, ik3, io3, is3) ---
    def plan_columns(self) -> dict[str, np.ndarray]:
        columns: dict[str, np.ndarray] = {}
        for number, spec in enumerate(self.specs):
            if spec.kind == "image":
                columns.update({f"ik{number}": self.image_keys[spec.name], f"io{number}": self.image_key_offsets[spec.name],
                                f"is{number}": self.image_sizes[spec.name]})
            else:
                columns.update({f"fv{number}": self.blobs[spec.name], f"fo{number}": self.offsets[spec.name]})
        return columns

    @classmethod
    def from_plan_columns(cls, specs: Sequence[FieldSpec], columns: Mapping[str, np.ndarray], rows: int
                          ) -> "FieldTable":
        """Rebuild the table from a saved plan's columns.

        Raises:
            KeyError, ValueError: a column missing or of the wrong length (the plan is damaged).
        """
        table = cls(tuple(specs), {}, {}, {}, {}, {})
        for number, spec in enumerate(specs):
            if spec.kind == "image":
                table.image_keys[spec.name] = columns[f"ik{number}"]
                table.image_key_offsets[spec.name] = columns[f"io{number}"]
                table.image_sizes[spec.name] = columns[f"is{number}"]
                offsets = table.image_key_offsets[spec.name]
                blob = table.image_keys[spec.name]
                if len(table.image_sizes[spec.name]) != rows:
                    raise ValueError(f"plan field {spec.name!r}: {len(table.image_sizes[spec.name])} sizes for {rows} rows")
            else:
                blob, offsets = columns[f"fv{number}"], columns[f"fo{number}"]
                table.blobs[spec.name], table.offsets[spec.name] = blob, offsets
            if len(offsets) != rows + 1 or (rows and (int(offsets[-1]) != len(blob) or np.any(np.diff(offsets.astype(np.int64)) < 0))):
                raise ValueError(f"plan field {spec.name!r}: offsets do not match the values")
        return table

    # --- the index ---
    def index_columns(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """The value fields' index columns for listing rows ``rows`` (the packed samples, in order)."""
        columns: dict[str, np.ndarray] = {}
        for spec in self.specs:
            if spec.kind == "image":
                continue
            blob, offsets = gather_blob(self.blobs[spec.name], self.offsets[spec.name], rows)
            columns[spec.column] = blob
            if spec.variable:
                columns[spec.offsets_column] = offsets
        return columns


class FieldRowBuilder:
    """Encodes each listed row's field values and accumulates them (no per-row Python objects kept).

    Use: ``values = builder.encode(get)`` for a row (raises ``FieldValueError``), then, once the
    row is accepted, ``builder.add(values)``; ``builder.finish()`` at the end.
    """

    def __init__(self, specs: Sequence[FieldSpec]) -> None:
        self.specs = tuple(specs)
        self.vocabularies = {spec.name: ClassVocabulary(spec) for spec in specs if spec.kind == "classes"}
        self.blobs = {spec.name: bytearray() for spec in specs if spec.kind != "image"}
        self.offsets = {spec.name: array("Q", [0]) for spec in specs if spec.kind != "image"}
        self.image_keys = {spec.name: bytearray() for spec in specs if spec.kind == "image"}
        self.image_key_offsets = {spec.name: array("Q", [0]) for spec in specs if spec.kind == "image"}
        self.image_sizes = {spec.name: array("Q") for spec in specs if spec.kind == "image"}

    def encode(self, get: Callable[[FieldSpec], Any], *, from_text: bool = False,
               text_fields: Container[str] = (),
               resolve_image: Callable[[FieldSpec, Any], tuple[str, int]] | None = None) -> list[Any]:
        """One row's values, in declaration order.

        Args:
            get: the row's source value for a field (raise ``FieldValueError`` when it is missing).
            from_text: values are CSV cells (strings).
            text_fields: names of the fields whose value, this row, is text spelled like a CSV
                cell (a side file's ``.txt``/``.cls`` member) while the others are JSON values.
            resolve_image: (spec, value) -> (key, size) of an image field's file; raises
                ``FieldValueError`` naming what is wrong (missing, outside the root).

        Raises:
            FieldValueError: a value that does not fit its field.
        """
        values: list[Any] = []
        for spec in self.specs:
            value = get(spec)
            if spec.kind == "image":
                if resolve_image is None:
                    raise FieldValueError(f"field {spec.name!r}: this source has no second image files")
                values.append(resolve_image(spec, value))
            else:
                values.append(encode_value(spec, value, vocabulary=self.vocabularies.get(spec.name),
                                           from_text=(from_text or spec.name in text_fields)
                                           and not isinstance(value, (list, dict))))
        return values

    def add(self, values: Sequence[Any]) -> None:
        for spec, value in zip(self.specs, values):
            if spec.kind == "image":
                key, size = value
                self.image_keys[spec.name] += key.encode("utf-8")
                self.image_key_offsets[spec.name].append(len(self.image_keys[spec.name]))
                self.image_sizes[spec.name].append(size)
            else:
                self.blobs[spec.name] += value
                self.offsets[spec.name].append(len(self.blobs[spec.name]))

    def finish(self) -> FieldTable:
        specs = []
        blobs: dict[str, np.ndarray] = {}
        offsets: dict[str, np.ndarray] = {}
        for spec in self.specs:
            if spec.kind != "image":
                blob = np.frombuffer(bytes(self.blobs[spec.name]), dtype=np.uint8)
                offsets[spec.name] = np.frombuffer(self.offsets[spec.name], dtype=np.uint64).copy()
                if spec.kind == "classes":
                    spec, blob = self.vocabularies[spec.name].finish(blob, offsets[spec.name])
                blobs[spec.name] = blob
            specs.append(spec)
        return FieldTable(
            tuple(specs), blobs, offsets,
            {name: np.frombuffer(bytes(blob), dtype=np.uint8) for name, blob in self.image_keys.items()},
            {name: np.frombuffer(o, dtype=np.uint64).copy() for name, o in self.image_key_offsets.items()},
            {name: np.frombuffer(s, dtype=np.uint64).copy() for name, s in self.image_sizes.items()})


def specs_with_shards(specs: Sequence[FieldSpec], shards: Mapping[str, Sequence[Any]]) -> tuple[FieldSpec, ...]:
    """The declarations for the manifest: image fields carry their shard entries."""
    return tuple(replace(spec, shards=tuple(shards.get(spec.name, ()))) if spec.kind == "image" else spec
                 for spec in specs)
