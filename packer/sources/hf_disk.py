"""The Hugging Face ``save_to_disk`` door: a ``datasets`` folder (Arrow files listed by
``state.json``, features in ``dataset_info.json``), one sample per row, its columns kept as
declared fields where their types map; the image bytes are copied once into a spool.

Layout read (written by ``datasets.Dataset.save_to_disk``)::

    SRC/state.json           {"_data_files": [{"filename": "data-00000-of-00002.arrow"}, ...], ...}
    SRC/dataset_info.json    {"features": {"image": {"_type": "Image"}, "label": {"_type": "ClassLabel",
                              "names": [...]}, ...}, ...}
    SRC/data-0000K-of-0000N.arrow   Arrow IPC streams, rows in file order

A ``DatasetDict`` (``dataset_dict.json`` naming its splits, one such folder per split) is built
one split at a time (``packer build SRC/train OUT-train``): building its root is refused with
the commands to run. Every split gets the same class list: the ``ClassLabel`` names (which the
splits must share), or, for a string label column, the sorted names found in *all* the splits.

Columns:

* the **image**: ``image_column``, else the first ``Image`` feature (``image``/``img`` first),
  else a binary or ``{bytes, path}`` column. A null image is ``not-an-image``.
* the **key** of a row, one-to-one with the rows (``row_keys``): its image ``path`` when set, else
  ``<row>`` (9 digits, counted across the data files), when every row's is distinct. An
  ``imagefolder`` saved with ``save_to_disk`` stores bare file names (``cat/0.jpg`` and
  ``dog/0.jpg`` both hold ``"0.jpg"``): then every key is ``<label>/<path>`` (the class name, or
  the label as written), the source folder's own layout; if keys still repeat,
  ``<row>/<path>``. Before, rows sharing a name were dropped as duplicates and a class lost.
* the **label**: ``door.source.label_field`` (default ``label``), absent: no label; a ``ClassLabel``
  declares its names (the source numbers its classes), an integer column gives integers, a
  string column class names. HF's -1 (or null) is "no label": what happens to an unlabeled row
  is the source contract's rule, the same for every door (``contract.py``: rejected as
  ``unlabeled`` when the labels are class names).
* every **other column** whose type maps becomes a declared field of the same name
  (``formats/SPEC.md`` §14): a number or bool ``Value`` an ``array`` scalar of its dtype;
  ``Value("string")`` ``text``; a ``List``/``Sequence`` of numbers ``DTYPE[N]`` (or ``[L]`` with
  a fixed length), of fixed-length lists ``DTYPE[N,K]``; a ``ClassLabel`` ``int64`` with its
  names; a list of ``ClassLabel`` a ``classes`` field with its names; another ``Image`` an
  ``image`` field. A column that does not map (a struct, audio, a name packer cannot store) is
  left out, with a warning naming it. A row whose value does not fit is ``bad-field``.

Like every door it only lists (labels as written, the names the source declares, where each
image lies in the spool); the class list, the unlabeled rule, sizes and bounds are applied by
the source contract.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping


from ..errors import MissingDependencyError, SourceError
from ..fields import MAX_FIELDS, FieldSpec, FieldValueError, check_declarations, check_name
from .._internal.files import read_user_json
from .archive_listing import ArchiveListing
from .fieldvalues import FIELD_REJECTION
from .labels import LABEL_REJECTION
from .listing import DoorOptions, RawListing, spool_write_error
from .members import container_stat
from .parquet import parquet_label

__all__ = ["hf_disk_folder", "list_hf_disk", "row_keys", "column_plan", "ColumnPlan", "HF_STATE", "HF_INFO",
           "HF_DICT"]

logger = logging.getLogger("packer.build")

HF_STATE = "state.json"
HF_INFO = "dataset_info.json"
HF_DICT = "dataset_dict.json"
#: The small JSON files are read whole: anything larger is not a ``save_to_disk`` folder's.
_MAX_JSON_BYTES = 16 << 20
_VALUE_DTYPES = {"bool": "bool", "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64",
                 "uint8": "uint8", "uint16": "uint16", "uint32": "uint32", "uint64": "uint64",
                 "float16": "float16", "float32": "float32", "float64": "float64", "float": "float32",
                 "double": "float64"}
_TEXT_DTYPES = ("string", "large_string")
_LIST_TYPES = ("List", "Sequence", "LargeList")


def _read_json(path: Path) -> Any:
    """A small ``datasets`` JSON file: bounded, regular-file-only, depth checked (``files.read_user_json``)."""
    return read_user_json(path, what=path.name, cap=_MAX_JSON_BYTES, error=SourceError)


def _is_dataset_folder(path: Path) -> bool:
    return (path / HF_STATE).is_file() and (path / HF_INFO).is_file()


def hf_disk_folder(path: Path) -> bool:
    """Whether ``path`` is a ``save_to_disk`` folder: a dataset (``state.json`` and
    ``dataset_info.json``) or a ``DatasetDict`` root (``dataset_dict.json``)."""
    return path.is_dir() and (_is_dataset_folder(path) or (path / HF_DICT).is_file())


def _splits(root: Path) -> list[str]:
    document = _read_json(root / HF_DICT)
    splits = document.get("splits") if isinstance(document, dict) else None
    if not isinstance(splits, list) or not splits or not all(isinstance(s, str) and s for s in splits):
        raise SourceError(f"{HF_DICT} must hold {{\"splits\": [names]}}, got {str(document)[:120]}", path=root / HF_DICT)
    for split in splits:
        if "/" in split or "\\" in split or split in (".", "..") or not _is_dataset_folder(root / split):
            raise SourceError(f"split {split!r} is not a dataset folder ({HF_STATE} and {HF_INFO}) inside the "
                              f"DatasetDict", path=root)
    return splits


def _data_files(folder: Path) -> list[Path]:
    state = _read_json(folder / HF_STATE)
    files = state.get("_data_files") if isinstance(state, dict) else None
    if not isinstance(files, list) or not files:
        raise SourceError(f"{HF_STATE} lists no _data_files", path=folder / HF_STATE)
    paths = []
    for entry in files:
        name = entry.get("filename") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name or "/" in name or "\\" in name or name.startswith("."):
            raise SourceError(f"{HF_STATE}: a data file must be a plain file name in the folder, got {entry!r}",
                              path=folder / HF_STATE)
        if not (folder / name).is_file():
            raise SourceError(f"{HF_STATE} lists {name!r}, which is not in the folder", path=folder)
        paths.append(folder / name)
    return paths


def _features(folder: Path) -> dict[str, Any]:
    info = _read_json(folder / HF_INFO)
    features = info.get("features") if isinstance(info, dict) else None
    if not isinstance(features, dict):
        raise SourceError(f"{HF_INFO} holds no features", path=folder / HF_INFO)
    return features


def _kind(feature: Any) -> str:
    if isinstance(feature, dict):
        return str(feature.get("_type", "struct"))
    if isinstance(feature, list):
        return "List"  # the old spelling of a list: [feature]
    return "?"


def _inner(feature: Any) -> Any:
    return feature[0] if isinstance(feature, list) and feature else feature.get("feature")


def _class_names(feature: Any) -> tuple[str, ...] | None:
    if _kind(feature) != "ClassLabel":
        return None
    names = feature.get("names")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        return None
    return tuple(names)


def _field_of(name: str, feature: Any) -> FieldSpec | str:
    """The field a column becomes, or why it does not become one."""
    try:
        check_name(name, error=ValueError, where="column")
    except ValueError as exc:
        return str(exc)
    kind = _kind(feature)
    source = f"hf:{name}"
    if kind == "Value":
        dtype = feature.get("dtype")
        if dtype in _TEXT_DTYPES:
            return FieldSpec(name, "text", "", (), source=source)
        if dtype in _VALUE_DTYPES:
            return FieldSpec(name, "array", _VALUE_DTYPES[dtype], (), source=source)
        return f"a Value of dtype {dtype!r}"
    if kind == "ClassLabel":
        names = _class_names(feature)
        if names is None:
            return "a ClassLabel without names"
        return FieldSpec(name, "array", "int64", (), classes=names, num_classes=len(names), source=source)
    if kind == "Image":
        return FieldSpec(name, "image", "", (), source=source)
    if kind in _LIST_TYPES:
        inner = _inner(feature)
        length = feature.get("length", -1) if isinstance(feature, dict) else -1
        length = length if isinstance(length, int) and length > 0 else -1
        names = _class_names(inner)
        if names is not None and length == -1:
            return FieldSpec(name, "classes", "int64", (), classes=names, num_classes=len(names), source=source)
        if _kind(inner) == "Value" and inner.get("dtype") in _VALUE_DTYPES:
            return FieldSpec(name, "array", _VALUE_DTYPES[inner["dtype"]], (length,), source=source)
        if _kind(inner) in _LIST_TYPES and length == -1:
            deeper = _inner(inner)
            width = inner.get("length", -1) if isinstance(inner, dict) else -1
            if isinstance(width, int) and width > 0 and _kind(deeper) == "Value" and deeper.get("dtype") in _VALUE_DTYPES:
                return FieldSpec(name, "array", _VALUE_DTYPES[deeper["dtype"]], (-1, width), source=source)
        return "a list of something other than numbers, fixed-length lists of numbers or class labels"
    return f"a {kind} column"


def _pick_image(features: Mapping[str, Any], wanted: str | None, folder: Path) -> str:
    images = [name for name, feature in features.items() if _kind(feature) == "Image"]
    if wanted is not None:
        if wanted not in features:
            raise SourceError(f"--image-column {wanted!r}: no such column (columns: {', '.join(features)})",
                              path=folder)
        return wanted
    for name in ("image", "img"):
        if name in images:
            return name
    if images:
        return images[0]
    raise SourceError(f"no Image column (features: {', '.join(f'{n}: {_kind(f)}' for n, f in features.items())}); "
                      f"name the column holding image bytes with --image-column", path=folder)


def _pyarrow() -> Any:
    try:
        import pyarrow as pa
        import pyarrow.ipc  # noqa: F401
    except ImportError:
        raise MissingDependencyError("reading a Hugging Face save_to_disk folder needs pyarrow: "
                                     "pip install 'packer-shards[hf]'") from None
    return pa


def _batches(pa: Any, path: Path, columns: list[str]) -> Any:
    """The record batches of one Arrow data file (a stream, as ``datasets`` writes; or a file)."""
    try:
        source = pa.memory_map(str(path))
        try:
            reader = pa.ipc.open_stream(source)
        except pa.ArrowInvalid:
            reader = pa.ipc.open_file(source)
            for k in range(reader.num_record_batches):
                yield reader.get_batch(k).select(columns)
            return
        for batch in reader:
            yield batch.select(columns)
    except SourceError:
        raise
    except Exception as exc:  # noqa: BLE001 - pyarrow raises ArrowInvalid, OSError, KeyError, ...
        raise SourceError(f"the Arrow data file is damaged or not Arrow: {exc}", path=path) from None


def _string_labels(folders: list[Path], column: str) -> set[str]:
    """Every string label of ``column`` in these dataset folders (for one class list across splits)."""
    pa = _pyarrow()
    names: set[str] = set()
    for folder in folders:
        for path in _data_files(folder):
            for batch in _batches(pa, path, [column]):
                names.update(v for v in batch.column(0).to_pylist() if isinstance(v, str) and v)
    return names


def _image_value(value: Any) -> tuple[bytes | None, str | None]:
    if isinstance(value, dict):
        return value.get("bytes"), value.get("path")
    return value, None


def _clean_key(name: str | None) -> str | None:
    if not isinstance(name, str) or not name:
        return None
    key = name.replace("\\", "/").lstrip("/")
    parts = [p for p in key.split("/") if p not in ("", ".")]
    if not parts or ".." in parts or any(p.startswith(".") for p in parts):
        return None
    return "/".join(parts)


@dataclass(frozen=True)
class ColumnPlan:
    """What a ``datasets`` table's columns become: the ``image`` column, the ``label`` column (None:
    there is none), the label's ``ClassLabel`` names (``classes``, empty when it has none) and the
    ``fields`` the other columns map to (module docstring)."""

    image: str
    label: str | None
    classes: tuple[str, ...]
    fields: tuple[FieldSpec, ...]


def column_plan(features: Mapping[str, Any], *, image_column: str | None, label_column: str,
                where: Any) -> ColumnPlan:
    """The columns' roles, from the features (``dataset_info.json``'s, or ``Features.to_dict()`` of a
    ``datasets.Dataset`` in memory): the rules of the module docstring, for this door and for
    ``packer.pack(dataset)``. A column that does not map is left out with a warning.

    Raises:
        SourceError: no image column (or the one named is missing); columns that do not fit one index.
    """
    image = _pick_image(features, image_column, where)
    specs: list[FieldSpec] = []
    for name, feature in features.items():
        if name in (image, label_column):
            continue
        spec = _field_of(name, feature)
        if isinstance(spec, str):
            logger.warning("column %r is not stored (%s)", name, spec)
        elif len(specs) == MAX_FIELDS:
            logger.warning("column %r is not stored (at most %d fields)", name, MAX_FIELDS)
        else:
            specs.append(spec)
    try:
        check_declarations(specs, error=SourceError)
    except SourceError as exc:
        raise SourceError(f"the columns do not fit one index: {exc.message}", path=where) from None
    return ColumnPlan(image, label_column if label_column in features else None,
                      _class_names(features.get(label_column)) or (), tuple(specs))


def list_hf_disk(path: Path, door: DoorOptions = DoorOptions()) -> RawListing:
    """List a Hugging Face ``save_to_disk`` dataset folder (see the module docstring).

    Raises:
        SourceError: a DatasetDict root (build a split), no image column, unreadable files,
            splits with different ClassLabel names. MissingDependencyError: no pyarrow.
    """
    pa = _pyarrow()
    if not _is_dataset_folder(path):
        splits = _splits(path)
        commands = "; ".join(f"packer build {path / s} OUT-{s}" for s in splits)
        raise SourceError(f"a DatasetDict with splits {', '.join(splits)}: build each split on its own ({commands}); "
                          f"the splits share one class list", path=path)
    if door.spool_dir is None:
        raise SourceError("a Hugging Face source needs a spool folder (build it through packer build)", path=path)
    label_column = door.source.label_field
    features = _features(path)
    files = _data_files(path)
    columns_plan = column_plan(features, image_column=door.source.image_column, label_column=label_column, where=path)
    image, specs = columns_plan.image, list(columns_plan.fields)
    siblings: list[Path] = []
    if (path.parent / HF_DICT).is_file() and path.name in _splits(path.parent):
        siblings = [path.parent / s for s in _splits(path.parent) if s != path.name]

    label_feature = features.get(label_column)
    names = _class_names(label_feature)

    out = ArchiveListing(door.progress, specs)
    string_labels = (label_feature is not None and _kind(label_feature) == "Value"
                     and label_feature.get("dtype") in _TEXT_DTYPES)
    if names:
        for sibling in siblings:
            other = _class_names(_features(sibling).get(label_column))
            if other != names:
                raise SourceError(f"split {sibling.name!r} names the classes of {label_column!r} {list(other or ())}, "
                                  f"this one {list(names)}: one class list is needed across the splits", path=path)
        out.declared_classes = names  # the ClassLabel numbers them: label k is names[k]
        out.declared_numbering = True
    elif string_labels and siblings:
        # one class list across the splits: every split declares the names found in all of them
        out.declared_classes = tuple(sorted(_string_labels([path, *siblings], label_column), key=str.encode))
        out.declared_across_splits = True

    spool_dir = door.spool_dir
    spool_dir.mkdir(parents=True, exist_ok=True)
    spool = spool_dir / "spool-hf.bin"
    try:
        container = _spool_rows(pa, files, out, spool, image, label_column, features, names, specs, string_labels)
    except OSError as exc:  # the Arrow files' read errors are SourceErrors (_batches): this is the spool's write
        raise spool_write_error(exc, spool, "copying the Hugging Face images") from None
    out.stats[container] = container_stat(str(spool.resolve()))
    return out.finish(path, "hf")


def _spool_rows(pa: Any, files: list[Path], out: ArchiveListing, spool: Path, image: str, label_column: str,
                features: Mapping[str, Any], names: tuple[str, ...] | None, specs: list[FieldSpec],
                string_labels: bool) -> int:
    """Every row's image (and image fields) into the spool, each row listed or rejected."""
    spool.write_bytes(b"")
    container = out.add_container(str(spool.resolve()))
    images = {spec.name for spec in specs if spec.kind == "image"}
    columns = [image] + ([label_column] if label_column in features else []) + [spec.name for spec in specs]
    keys = row_keys(pa, files, image, label_column if label_column in features else None, names)
    position = 0
    row = 0
    with open(spool, "wb", buffering=8 << 20) as sink:
        for data_file in files:
            for batch in _batches(pa, data_file, columns):
                values = {name: batch.column(k).to_pylist() for k, name in enumerate(columns)}
                for j in range(batch.num_rows):
                    data, _name = _image_value(values[image][j])
                    key = keys[row]
                    row += 1
                    if not data or not isinstance(data, bytes):
                        out.reject(key, "not-an-image", "the row's image has no bytes")
                        continue
                    written = values[label_column][j] if label_column in values else None
                    if names and written == -1:  # a ClassLabel's -1 is HF's "no label"
                        written = None
                    if string_labels and isinstance(written, str) and written:
                        label: tuple[int, int] | None = out.name_label(written)
                    else:
                        label, why = parquet_label(written, out, label_column)
                        if label is None:
                            out.reject(key, LABEL_REJECTION, why)
                            continue
                    try:
                        field_values, field_bytes = _row_fields(out, specs, values, j, key)
                    except FieldValueError as exc:
                        out.reject(key, FIELD_REJECTION, str(exc))
                        continue
                    sink.write(data)
                    start, position = position, position + len(data)
                    members = {}
                    for field in images:
                        sink.write(field_bytes[field])
                        members[field] = (container, position, len(field_bytes[field]))
                        position += len(field_bytes[field])
                    out.add(key, len(data), label, container, start, len(data), field_values=field_values,
                            field_members=members)
        sink.flush()
        os.fsync(sink.fileno())
    return container


def row_keys(pa: Any, files: list[Path], image: str, label_column: str | None,
             names: tuple[str, ...] | None) -> list[str]:
    """Every row's key, distinct (module docstring): a first pass over the image paths and labels
    only (Arrow reads the struct's ``path`` child without the image bytes)."""
    bases: list[str] = []
    labels: list[Any] = []
    columns = [image] + ([label_column] if label_column else [])
    for data_file in files:
        for batch in _batches(pa, data_file, columns):
            column = batch.column(0)
            if pa.types.is_struct(column.type) and column.type.get_field_index("path") >= 0:
                paths = column.field("path").to_pylist()
            else:
                paths = [None] * batch.num_rows
            for name in paths:
                bases.append(_clean_key(name) or f"{len(bases):09d}")
            labels.extend(batch.column(1).to_pylist() if label_column else [None] * batch.num_rows)
    if len(set(bases)) == len(bases):
        return bases
    by_label = [f"{_label_text(label, names)}/{base}" for label, base in zip(labels, bases)]
    if len(set(by_label)) == len(by_label):
        return by_label
    return [f"{row:09d}/{base}" for row, base in enumerate(bases)]


def _label_text(label: Any, names: tuple[str, ...] | None) -> str:
    """A label as a key's folder: its class name, the text or integer written, else ``unlabeled``."""
    if names and isinstance(label, int) and not isinstance(label, bool) and 0 <= label < len(names):
        return _clean_key(names[label]) or f"class-{label}"
    if isinstance(label, str) and _clean_key(label):
        return _clean_key(label)  # type: ignore[return-value]
    if isinstance(label, int) and not isinstance(label, bool) and label >= 0:
        return str(label)
    return "unlabeled"


def _row_fields(out: ArchiveListing, specs: list[FieldSpec], values: Mapping[str, list[Any]], j: int,
                key: str) -> tuple[list[Any], dict[str, bytes]]:
    """One row's encoded field values, and its image fields' bytes."""
    if out.field_rows is None:
        return [], {}
    field_bytes: dict[str, bytes] = {}

    def get(spec: FieldSpec) -> Any:
        value = values[spec.name][j]
        if spec.kind == "image":
            data, name = _image_value(value)
            if not data:
                raise FieldValueError(f"field {spec.name!r}: the row's image has no bytes")
            field_bytes[spec.name] = data
            return _clean_key(name) or f"{key}#{spec.name}"
        if value is None:
            raise FieldValueError(f"field {spec.name!r} is null")
        return value

    encoded = out.field_rows.encode(get, resolve_image=lambda spec, name: (name, len(field_bytes[spec.name])))
    return encoded, field_bytes
