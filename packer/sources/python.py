"""The Python door: samples written from Python (``packer.Writer``, ``packer.pack``), spooled to
files and listed like archive members.

Nothing written from Python is packed where it is written. Each sample's image bytes (and its
image fields' bytes) are appended to a *spool* file in the output's staging folder, and its row
(key, where its bytes lie, its label *as written*, its field values as canonical JSON) goes into
flat growing arrays (``SampleSpool``; no per-sample Python object is kept). When the writing
ends, the spools are listed in order (``python_listing``) into the same ``RawListing`` every
other door returns, members located by (spool, offset, size), so the source contract, the
seeded shard plan, the per-file checks and the codec of ``packer build`` apply unchanged; the
packing workers read the spooled bytes back by offset (``members.MemberReader``).

Labels as written: ``None`` is no label, an ``int`` an integer (a class number when a class list
is given or the source declares its names), a ``str`` a class name. Field values are checked
and encoded while listing, as for every door (a value that does not fit is ``bad-field``).

A spool's rows can be saved beside it (``SpoolRows.save``, a ``.npz`` of plain arrays, read back
without pickle): ``packer.pack`` writes one spool per chunk of inputs and its rows file last, so
the rows file is the chunk's *done* marker and ``resume=True`` skips the chunks that have one.
"""

from __future__ import annotations

import io
import json
import os
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import xxhash

from .._internal.atomic import write_atomic
from ..fields import FieldSpec, FieldValueError
from .blobs import gather_blob
from .fieldvalues import FIELD_REJECTION, FieldRowBuilder
from .labels import INT64
from .listing import INT_LABEL, NAME_LABEL, NO_LABEL, RawListing, Rejection
from .members import RAW, MemberBounds, MemberTable, container_stat

__all__ = ["SampleSpool", "SpoolRows", "SampleValueError", "python_listing", "written_label", "PYTHON_KIND",
           "SPOOL_SUFFIX", "ROWS_SUFFIX"]

#: The source kind every sample written from Python records.
PYTHON_KIND = "python"
SPOOL_SUFFIX = ".spool"
ROWS_SUFFIX = ".rows.npz"
#: Version of a saved rows file: a rows file of another version is not a done marker.
_ROWS_VERSION = 1


class SampleValueError(ValueError):
    """A value written from Python that cannot be a sample: ``reason`` (a build report reason,
    ``sources.REJECTION_REASONS``) and the message the rejection carries."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def written_label(value: Any) -> tuple[int, Any]:
    """A label as written from Python: ``(NO_LABEL, None)``, ``(INT_LABEL, int)`` or ``(NAME_LABEL, str)``.

    Raises:
        SampleValueError: ``bad-label``: a bool, a float, an integer outside int64, anything else.
    """
    if value is None:
        return NO_LABEL, None
    if isinstance(value, str):
        return NAME_LABEL, value
    if isinstance(value, bool) or isinstance(value, np.bool_):
        raise SampleValueError("bad-label", f"a label is an int, a class name (str) or None, got the bool {value!r}")
    if isinstance(value, (int, np.integer)):
        number = int(value)
        if number not in INT64:
            raise SampleValueError("bad-label", f"label {number} does not fit in a signed 64-bit integer")
        return INT_LABEL, number
    item = getattr(value, "item", None)  # a 0-d numpy array or torch tensor of an integer type
    if callable(item) and getattr(value, "ndim", None) == 0 and "int" in str(getattr(value, "dtype", "")):
        return written_label(item())
    raise SampleValueError("bad-label", f"a label is an int, a class name (str) or None, got {type(value).__name__} "
                                        f"{_short(value)}")


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


@dataclass
class SpoolRows:
    """The rows of one finished spool: flat arrays, one row per spooled sample, in write order.

    Attributes:
        spool: the spool file (absolute path) and its size when it was closed.
        key_blob / key_offsets: UTF-8 keys.
        offsets / sizes: where each sample's image lies in the spool.
        label_kinds / label_values: as written (``listing.NO_LABEL``, ``INT_LABEL`` with the
            value, ``NAME_LABEL`` with an index into ``label_texts``).
        values_blob / values_offsets: each row's field values, one canonical JSON object (empty
            without value fields).
        image_offsets / image_sizes: image field name -> where each row's second image lies.
        rejected: the samples refused while writing (an image of the wrong type, a bad label).
        inputs: ``packer.pack``: the inputs this spool covers (first, end), else (0, 0).
    """

    spool: str
    spool_size: int
    key_blob: np.ndarray
    key_offsets: np.ndarray
    offsets: np.ndarray
    sizes: np.ndarray
    label_kinds: np.ndarray
    label_values: np.ndarray
    label_texts: tuple[str, ...]
    values_blob: np.ndarray
    values_offsets: np.ndarray
    image_offsets: dict[str, np.ndarray] = field(default_factory=dict)
    image_sizes: dict[str, np.ndarray] = field(default_factory=dict)
    rejected: list[Rejection] = field(default_factory=list)
    inputs: tuple[int, int] = (0, 0)

    def __len__(self) -> int:
        return len(self.sizes)

    def save(self, path: Path) -> None:
        """Write the rows to ``path`` (a temp name, then ``os.replace``: the file is the spool's
        done marker, so it appears whole or not at all)."""
        header = {"version": _ROWS_VERSION, "spool": self.spool, "spool_size": self.spool_size,
                  "label_texts": list(self.label_texts), "images": list(self.image_offsets),
                  "rejected": [r.to_json() for r in self.rejected], "inputs": list(self.inputs)}
        arrays = {"header": np.frombuffer(json.dumps(header, ensure_ascii=True).encode(), dtype=np.uint8),
                  "key_blob": self.key_blob, "key_offsets": self.key_offsets, "offsets": self.offsets,
                  "sizes": self.sizes, "label_kinds": self.label_kinds, "label_values": self.label_values,
                  "values_blob": self.values_blob, "values_offsets": self.values_offsets}
        for number, name in enumerate(self.image_offsets):
            arrays[f"image_offsets_{number}"] = self.image_offsets[name]
            arrays[f"image_sizes_{number}"] = self.image_sizes[name]
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        write_atomic(path, [buffer.getbuffer()], durable=False)  # a resume aid: checked when loaded

    @classmethod
    def load(cls, path: Path) -> "SpoolRows | None":
        """The rows saved at ``path``, or None when there are none that describe their spool as it
        is now (missing, damaged, of another version, or the spool's size changed)."""
        try:
            with np.load(path, allow_pickle=False) as saved:
                arrays = {name: saved[name] for name in saved.files}
            header = json.loads(arrays.pop("header").tobytes())
            if header.get("version") != _ROWS_VERSION or os.stat(header["spool"]).st_size != header["spool_size"]:
                return None
            images = list(header["images"])
            rows = cls(spool=header["spool"], spool_size=int(header["spool_size"]),
                       label_texts=tuple(header["label_texts"]),
                       rejected=[Rejection(**r) for r in header["rejected"]], inputs=tuple(header["inputs"]),
                       image_offsets={name: arrays[f"image_offsets_{n}"] for n, name in enumerate(images)},
                       image_sizes={name: arrays[f"image_sizes_{n}"] for n, name in enumerate(images)},
                       **{name: arrays[name] for name in ("key_blob", "key_offsets", "offsets", "sizes", "label_kinds",
                                                          "label_values", "values_blob", "values_offsets")})
        except (OSError, ValueError, KeyError, TypeError, json.JSONDecodeError):  # not done: do it again
            return None
        count = len(rows.sizes)
        if (len(rows.key_offsets) != count + 1 or len(rows.offsets) != count or len(rows.label_kinds) != count
                or len(rows.label_values) != count or len(rows.values_offsets) not in (0, count + 1)):
            return None
        return rows


class SampleSpool:
    """Appends samples to one spool file and keeps their rows in flat growing arrays.

    Use ``add`` for each sample (its image already bytes), ``reject`` for a value that is not
    one, then ``close`` for the ``SpoolRows``. Not thread-safe; one spool per writer.
    """

    def __init__(self, path: Path, *, image_fields: Sequence[str] = (), value_fields: bool = False) -> None:
        self.path = Path(path).resolve()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "wb", buffering=4 << 20)
        self.position = 0
        self.key_blob = bytearray()
        self.key_offsets = array("Q", [0])
        self.offsets = array("Q")
        self.sizes = array("Q")
        self.label_kinds = array("B")
        self.label_values = array("q")
        self.texts: dict[str, int] = {}
        self.value_fields = value_fields
        self.values_blob = bytearray()
        self.values_offsets = array("Q", [0])
        self.image_offsets = {name: array("Q") for name in image_fields}
        self.image_sizes = {name: array("Q") for name in image_fields}
        self.rejected: list[Rejection] = []
        self.closed = False

    def __len__(self) -> int:
        return len(self.sizes)

    def add(self, key: str, image: bytes, label: tuple[int, Any], values: bytes = b"",
            images: Mapping[str, bytes] | None = None) -> None:
        """Spool one sample.

        Args:
            key: its key (unique: the caller checks, or the contract rejects a repeat).
            image: its encoded image bytes.
            label: ``written_label``'s answer.
            values: its value fields as one canonical JSON object (``value_fields`` spools).
            images: image field name -> that field's encoded bytes.
        """
        write = self._file.write
        write(image)
        self.offsets.append(self.position)
        self.sizes.append(len(image))
        self.position += len(image)
        for name in self.image_offsets:
            data = images[name]  # type: ignore[index]  (the caller checked every image field is there)
            write(data)
            self.image_offsets[name].append(self.position)
            self.image_sizes[name].append(len(data))
            self.position += len(data)
        self.key_blob += key.encode("utf-8", "surrogatepass")
        self.key_offsets.append(len(self.key_blob))
        kind, value = label
        self.label_kinds.append(kind)
        self.label_values.append(self.texts.setdefault(value, len(self.texts)) if kind == NAME_LABEL
                                 else value if kind == INT_LABEL else 0)
        if self.value_fields:
            self.values_blob += values
            self.values_offsets.append(len(self.values_blob))

    def reject(self, key: str, reason: str, message: str) -> None:
        self.rejected.append(Rejection(key, reason, message))

    def abort(self) -> None:
        """Close the file without rows (the caller removes the spool)."""
        if not self.closed:
            self.closed = True
            self._file.close()

    def close(self, inputs: tuple[int, int] = (0, 0)) -> SpoolRows:
        """Flush the spool and return its rows (no fsync: a spool is scratch, rebuilt after a crash)."""
        if not self.closed:
            self.closed = True
            self._file.close()
        return SpoolRows(
            spool=str(self.path), spool_size=self.position,
            key_blob=np.frombuffer(bytes(self.key_blob), dtype=np.uint8),
            key_offsets=np.frombuffer(self.key_offsets, dtype=np.uint64).copy(),
            offsets=np.frombuffer(self.offsets, dtype=np.uint64).copy(),
            sizes=np.frombuffer(self.sizes, dtype=np.uint64).copy(),
            label_kinds=np.frombuffer(self.label_kinds, dtype=np.uint8).copy(),
            label_values=np.frombuffer(self.label_values, dtype=np.int64).copy(),
            label_texts=tuple(self.texts),
            values_blob=np.frombuffer(bytes(self.values_blob), dtype=np.uint8),
            values_offsets=(np.frombuffer(self.values_offsets, dtype=np.uint64).copy() if self.value_fields
                            else np.zeros(0, dtype=np.uint64)),
            image_offsets={name: np.frombuffer(v, dtype=np.uint64).copy() for name, v in self.image_offsets.items()},
            image_sizes={name: np.frombuffer(v, dtype=np.uint64).copy() for name, v in self.image_sizes.items()},
            rejected=list(self.rejected), inputs=inputs)


def python_listing(parts: Sequence[SpoolRows], root: Path, *, specs: Sequence[FieldSpec] = (),
                   declared_classes: tuple[str, ...] = (), declared_numbering: bool = False,
                   empty_what: str = "nothing was written") -> RawListing:
    """The door's listing: every spooled row of ``parts``, in order, as archive members of the spools.

    Field values are checked and encoded here, in listing order, as every door does while
    listing: a row whose value does not fit is ``bad-field`` (and is left out).

    Args:
        root: the folder the spools are in (the listing's root).
        specs: the declared fields.
        declared_classes / declared_numbering: class names the source declares (a Dataset
            object's ``.classes``, a ``ClassLabel``) and whether its integer label ``k`` is the
            ``k``-th of them.
    """
    counts = [len(part) for part in parts]
    total = sum(counts)
    texts: dict[str, int] = {}
    label_values = np.zeros(total, dtype=np.int64)
    label_kinds = np.concatenate([part.label_kinds for part in parts]) if parts else np.zeros(0, np.uint8)
    position = 0
    for part, count in zip(parts, counts):
        values = part.label_values
        if part.label_texts:  # each spool numbered its own names: renumber into one list
            remap = np.array([texts.setdefault(text, len(texts)) for text in part.label_texts], dtype=np.int64)
            named = part.label_kinds == NAME_LABEL
            values = values.copy()
            values[named] = remap[values[named]]
        label_values[position:position + count] = values
        position += count
    key_blob = np.concatenate([part.key_blob for part in parts]) if parts else np.zeros(0, np.uint8)
    key_offsets = _joined_offsets([part.key_offsets for part in parts])
    container = np.repeat(np.arange(len(parts), dtype=np.uint32), counts)
    offsets = np.concatenate([part.offsets for part in parts]) if parts else np.zeros(0, np.uint64)
    sizes = np.concatenate([part.sizes for part in parts]) if parts else np.zeros(0, np.uint64)
    raw_keys = key_blob.tobytes()
    bounds = key_offsets.tolist()
    hashes = np.fromiter((xxhash.xxh3_64_intdigest(raw_keys[bounds[i]:bounds[i + 1]]) for i in range(total)),
                         dtype=np.uint64, count=total)
    containers = tuple(part.spool for part in parts)
    stats = tuple(container_stat(path) for path in containers)
    members = MemberTable(containers, stats, container, offsets, sizes.copy(), np.full(total, RAW, dtype=np.uint8),
                          np.zeros(total, dtype=np.uint32))
    member_bounds = MemberBounds(tuple((number, 0, -1) for number in range(len(parts))), container.copy())
    image_specs = [spec for spec in specs if spec.kind == "image"]
    for spec in image_specs:
        members.fields[spec.name] = MemberTable(
            containers, stats, container.copy(), np.concatenate([part.image_offsets[spec.name] for part in parts]),
            np.concatenate([part.image_sizes[spec.name] for part in parts]), np.full(total, RAW, dtype=np.uint8),
            np.zeros(total, dtype=np.uint32))
        member_bounds.field_region[spec.name] = container.copy()
    rejected = [rejection for part in parts for rejection in part.rejected]
    raw = RawListing(root=root, kind=PYTHON_KIND, key_blob=key_blob, key_offsets=key_offsets, key_hashes=hashes,
                     sizes=sizes, stamps=np.zeros(total, dtype=np.uint64), label_kinds=label_kinds,
                     label_values=label_values, label_texts=tuple(texts), meta_blob=np.zeros(0, dtype=np.uint8),
                     meta_offsets=np.zeros(total + 1, dtype=np.uint64), rejected=rejected,
                     declared_classes=tuple(declared_classes), declared_numbering=declared_numbering,
                     members=members, member_bounds=member_bounds, empty_what=empty_what, empty_path=root)
    if specs:
        raw = _with_fields(raw, parts, specs, image_specs)
    return raw


def _joined_offsets(pieces: Sequence[np.ndarray]) -> np.ndarray:
    """Blob offsets (N+1 each) of consecutive blobs, as the offsets of their concatenation."""
    out = [np.zeros(1, dtype=np.uint64)]
    base = 0
    for offsets in pieces:
        out.append(offsets[1:].astype(np.uint64) + np.uint64(base))
        base += int(offsets[-1]) if len(offsets) else 0
    return np.concatenate(out)


def _with_fields(raw: RawListing, parts: Sequence[SpoolRows], specs: Sequence[FieldSpec],
                 image_specs: Sequence[FieldSpec]) -> RawListing:
    """Encode every row's field values (in listing order); rows whose values do not fit are rejected."""
    builder = FieldRowBuilder(specs)
    value_specs = [spec for spec in specs if spec.kind != "image"]
    keep = np.ones(len(raw), dtype=bool)
    row = 0
    for part in parts:
        blob = part.values_blob.tobytes()
        offsets = part.values_offsets.tolist()
        for i in range(len(part)):
            key = raw.key(row)
            try:
                document = json.loads(blob[offsets[i]:offsets[i + 1]]) if value_specs else {}
                if not isinstance(document, dict):
                    raise FieldValueError("the field values are not an object")

                def get(spec: FieldSpec, document: dict = document, key: str = key) -> Any:
                    if spec.kind == "image":
                        return f"{key}#{spec.name}"
                    if spec.name not in document or document[spec.name] is None:
                        raise FieldValueError(f"field {spec.name!r} is missing")
                    return document[spec.name]

                values = builder.encode(get, resolve_image=lambda spec, name, i=i, part=part: (
                    name, int(part.image_sizes[spec.name][i])))
            except (FieldValueError, ValueError) as exc:
                keep[row] = False
                raw.rejected.append(Rejection(key, FIELD_REJECTION, str(exc)))
            else:
                builder.add(values)
            row += 1
    fields = builder.finish()  # the kept rows' values
    if not keep.all():
        raw = _kept_rows(raw, keep)
    raw.fields = fields
    return raw


def _kept_rows(raw: RawListing, keep: np.ndarray) -> RawListing:
    """The listing without the rows whose field values were rejected (order kept)."""
    rows = np.flatnonzero(keep)
    keys, key_offsets = gather_blob(raw.key_blob, raw.key_offsets, rows)
    members = raw.members.select(rows)  # type: ignore[union-attr]
    bounds: MemberBounds = raw.member_bounds  # type: ignore[assignment]  (python_listing always sets it)
    kept_bounds = MemberBounds(bounds.regions, bounds.row_region[rows],
                               {name: region[rows] for name, region in bounds.field_region.items()})
    return RawListing(root=raw.root, kind=raw.kind, key_blob=keys, key_offsets=key_offsets,
                      key_hashes=raw.key_hashes[rows], sizes=raw.sizes[rows], stamps=raw.stamps[rows],
                      label_kinds=raw.label_kinds[rows], label_values=raw.label_values[rows],
                      label_texts=raw.label_texts, meta_blob=raw.meta_blob,
                      meta_offsets=np.zeros(len(rows) + 1, dtype=np.uint64), rejected=raw.rejected,
                      declared_classes=raw.declared_classes, declared_numbering=raw.declared_numbering,
                      members=members, member_bounds=kept_bounds, empty_what=raw.empty_what,
                      empty_path=raw.empty_path)
