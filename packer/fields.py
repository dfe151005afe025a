"""Per-sample fields beyond (image, label): declarations, their index columns, value encoding.

A dataset MAY declare **fields** (manifest member ``fields``, ``formats/SPEC.md`` §14): named,
typed per-sample values stored beside the main image. Four kinds:

* ``array``: numbers with a dtype and a shape. A fixed shape (``float32[4]``, a scalar
  ``float32``) is one flat index column of ``N * record_bytes`` bytes (O(1), zero-copy); a shape
  whose first dimension is variable (``float32[N,4]`` for boxes) is a blob with u64 offsets.
* ``classes``: a set of class ids per sample (multi-label), sorted and unique, stored as a
  variable ``int64`` array; names, when the source gave names, are the field's ``classes``.
* ``text``: a UTF-8 string per sample (captions), a blob with offsets.
* ``image``: a second image per sample (a mask, a depth map, another view) in its own shards,
  parallel to the main ones (same samples per shard, same shard numbers), so that a run of
  consecutive samples is one aligned block per field (§3.3).

This module owns the declarations (parsing the manifest member and the ``--field`` option),
the index column names and layouts of each kind, and turning a source value (JSON, a CSV cell)
into the stored bytes. ``packer.format`` validates the columns at open with these layouts.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from .errors import ManifestError, OptionError

__all__ = [
    "FIELD_KINDS", "DTYPES", "MAX_FIELDS", "MAX_FIELD_NAME_BYTES", "MAX_FIELD_DIMS", "MAX_RECORD_BYTES",
    "MAX_VALUE_BYTES", "RESERVED_NAMES", "READ_FIELDS", "IMAGE_COLUMNS",
    "FieldSpec", "FieldValueError", "parse_field_option", "parse_fields_schema", "parse_declarations",
    "encode_value", "decode_value", "ClassVocabulary",
]

FIELD_KINDS = ("array", "classes", "text", "image")
#: Array dtypes: name -> little-endian numpy type string of the stored values.
DTYPES = {"uint8": "|u1", "int8": "|i1", "uint16": "<u2", "int16": "<i2", "uint32": "<u4", "int32": "<i4",
          "uint64": "<u8", "int64": "<i8", "float16": "<f2", "float32": "<f4", "float64": "<f8", "bool": "|b1"}
MAX_FIELDS = 16
#: Field names are 1-12 characters, so every column name (``f_<name>__checksum``) fits the
#: container's 24 bytes.
MAX_FIELD_NAME_BYTES = 12
MAX_FIELD_DIMS = 4
#: One sample's fixed-shape array (a flat column of N of them): at most 1 MiB.
MAX_RECORD_BYTES = 1 << 20
#: One sample's variable value (an array, a caption, a class set): at most 16 MiB.
MAX_VALUE_BYTES = 16 << 20
#: Index columns left for fields: the container's 64 less the 13 of every index
#: (``format`` asserts the sum).
MAX_FIELD_COLUMNS = 51
#: Names a reader already uses for a sample's parts (``PackedDataset(fields=...)``).
RESERVED_NAMES = frozenset({"image", "label", "key", "index", "metadata", "shard", "fields", "target"})
#: The built-in names every reader's ``fields=`` takes besides a dataset's declared fields: one
#: vocabulary for ``packer.torch``, ``packer.grain``, ``packer.dali`` and ``packer.gpu`` (a reader
#: with no type for one refuses it by name: DALI and the GPU loaders refuse ``metadata``).
READ_FIELDS = ("image", "label", "index", "key", "metadata")
_NAME = re.compile(r"[a-z](?:[a-z0-9]|_(?!_))*")
#: Columns of an ``image`` field, after ``f_<name>__``: the same meaning as the main image's.
IMAGE_COLUMNS = {"offset": "<u8", "size": "<u8", "checksum": "<u8", "format": "|u1", "width": "<u4",
                 "height": "<u4", "channels": "|u1"}


class FieldValueError(ValueError):
    """A source value that does not fit its field's declaration (the row is rejected with it)."""


@dataclass(frozen=True)
class FieldSpec:
    """One declared field.

    Attributes:
        name: ``[a-z][a-z0-9_]*``, at most 12 characters, no ``__``, not a reserved name.
        kind: one of ``FIELD_KINDS``.
        dtype: for ``array``, a name from ``DTYPES``; ``int64`` for ``classes``; "" otherwise.
        shape: for ``array``: the dimensions, ``-1`` first for a variable count (``()`` = scalar).
        classes: for ``classes``: class names (id ``k`` is ``classes[k]``), empty when ids were given;
            for an integer ``array`` (per-box labels), optional names of its values ``0..len-1``.
        num_classes: for ``classes``: ids are ``0..num_classes-1`` (``len(classes)`` when names);
            for an ``array`` with ``classes``, their number.
        source: build only: where the values come from (a manifest column or JSON member, or a
            side-file suffix); defaults to ``name``. Recorded, informative.
        shards: for ``image``: the field's shard entries (``format.ShardEntry``), parallel to the
            manifest's shards. Filled by ``format.parse_manifest`` and the writer.
    """

    name: str
    kind: str
    dtype: str = ""
    shape: tuple[int, ...] = ()
    classes: tuple[str, ...] = ()
    num_classes: int = 0
    source: str = ""
    shards: tuple[Any, ...] = field(default=(), compare=False)

    # --- layout ---
    @property
    def variable(self) -> bool:
        """Whether values have a per-sample length (a blob with offsets) rather than a fixed width."""
        return self.kind in ("classes", "text") or (self.kind == "array" and bool(self.shape) and self.shape[0] == -1)

    @property
    def record_shape(self) -> tuple[int, ...]:
        """The shape of one record: the whole value when fixed, one row of it when variable."""
        if self.kind == "classes":
            return ()
        return self.shape[1:] if self.variable else self.shape

    @property
    def numpy_dtype(self) -> np.dtype:
        if self.kind in ("array", "classes"):
            return np.dtype(DTYPES[self.dtype or "int64"])
        return np.dtype("|u1")

    @property
    def record_bytes(self) -> int:
        """Bytes of one record (the value when fixed, one row when variable; 1 for text)."""
        return self.numpy_dtype.itemsize * math.prod(self.record_shape)

    @property
    def column(self) -> str:
        """The index column holding the values (``array``/``classes``/``text``)."""
        return f"f_{self.name}"

    @property
    def offsets_column(self) -> str:
        return f"f_{self.name}__offsets"

    def image_column(self, part: str) -> str:
        """An ``image`` field's column: ``part`` is a key of ``IMAGE_COLUMNS``."""
        return f"f_{self.name}__{part}"

    def columns(self) -> dict[str, tuple[str, str]]:
        """Index columns of this field: name -> (dtype, length rule) as in ``format.INDEX_COLUMNS``;
        ``"N*R"`` = one record per sample."""
        if self.kind == "image":
            return {self.image_column(part): (typestr, "N") for part, typestr in IMAGE_COLUMNS.items()}
        if self.variable:
            return {self.column: ("|u1", "blob"), self.offsets_column: ("<u8", "N+1")}
        return {self.column: ("|u1", "N*R")}

    # --- manifest ---
    def to_json(self) -> dict[str, Any]:
        """The manifest declaration (without shards: the writer adds them for ``image``)."""
        document: dict[str, Any] = {"name": self.name, "kind": self.kind}
        if self.kind == "array":
            document.update(dtype=self.dtype, shape=list(self.shape))
            if self.classes:  # an integer array whose values name classes (per-box labels)
                document["classes"] = list(self.classes)
        elif self.kind == "classes":
            document["num_classes"] = self.num_classes
            if self.classes:
                document["classes"] = list(self.classes)
        if self.source and self.source != self.name:
            document["source"] = self.source
        return document

    def describe(self) -> str:
        """``boxes: float32[N,4]``, ``tags: classes(80)``, ``caption: text``, ``mask: image``."""
        if self.kind == "array":
            dims = ",".join("N" if d == -1 else str(d) for d in self.shape)
            return f"{self.name}: {self.dtype}" + (f"[{dims}]" if self.shape else "")
        if self.kind == "classes":
            return f"{self.name}: classes({self.num_classes})"
        return f"{self.name}: {self.kind}"


def check_name(name: object, *, error: type[Exception] = OptionError, where: str = "field") -> str:
    if (not isinstance(name, str) or not name.isascii() or not 1 <= len(name) <= MAX_FIELD_NAME_BYTES
            or not _NAME.fullmatch(name) or name.endswith("_")):
        raise error(f"{where} name {name!r} must be 1-{MAX_FIELD_NAME_BYTES} characters of [a-z0-9_], starting "
                    f"with a letter, without '__' or a trailing '_'")
    if name in RESERVED_NAMES:
        raise error(f"{where} name {name!r} is reserved (a sample's {sorted(RESERVED_NAMES)} are built in)")
    return name


def _check_shape(shape: Sequence[Any], *, error: type[Exception], where: str) -> tuple[int, ...]:
    if len(shape) > MAX_FIELD_DIMS:
        raise error(f"{where} has {len(shape)} dimensions, at most {MAX_FIELD_DIMS}")
    dims = []
    for position, dim in enumerate(shape):
        if type(dim) is not int or not (dim >= 1 or (dim == -1 and position == 0)):
            raise error(f"{where} shape {list(shape)}: dimensions are positive integers, and only the first "
                        f"may be variable (N, stored as -1)")
        dims.append(dim)
    return tuple(dims)


def _finish_spec(spec: FieldSpec, *, error: type[Exception], where: str) -> FieldSpec:
    if spec.kind == "array" and spec.record_bytes > MAX_RECORD_BYTES:
        raise error(f"{where}: one record is {spec.record_bytes} bytes, over the {MAX_RECORD_BYTES} limit")
    return spec


# --- the --field option and schema files ------------------------------------------------------

_OPTION = re.compile(r"(?P<name>[^=]+)=(?:(?P<json>json):)?(?P<type>[^@]+?)(?:@(?P<source>.+))?")
_ARRAY_TYPE = re.compile(r"(?P<dtype>[a-z0-9]+)(?:\[(?P<dims>[^\]]*)\])?")


def parse_field_option(text: str) -> FieldSpec:
    """A ``--field`` option: ``NAME=[json:]TYPE[@SOURCE]``.

    TYPE is ``DTYPE``, ``DTYPE[d1,d2,...]`` (``N`` first for a variable count, e.g.
    ``float32[N,4]``), ``classes`` (multi-label; ``classes(80)`` fixes the id range),
    ``text`` or ``image``. SOURCE is the manifest column / JSON member (or, for side files, the
    suffix) the values come from; default NAME. ``json:`` is accepted for the issue-style
    spelling (``boxes=json:float32[N,4]``): CSV cells of array and classes fields are JSON anyway.

    Raises:
        OptionError: naming what is wrong and the accepted forms.
    """
    match = _OPTION.fullmatch(text.strip()) if isinstance(text, str) else None
    usage = ("expected NAME=TYPE[@SOURCE], TYPE one of DTYPE, DTYPE[N,4], classes, classes(80), text, image "
             "(e.g. boxes=float32[N,4], tags=classes, caption=text@txt, mask=image@mask.png)")
    if match is None:
        raise OptionError(f"--field {text!r}: {usage}")
    name = check_name(match["name"].strip(), where="--field")
    kind_text = match["type"].strip()
    source = (match["source"] or "").strip()
    if kind_text in ("text", "image"):
        spec = FieldSpec(name=name, kind=kind_text, source=source or name)
    elif kind_text == "classes" or kind_text.startswith("classes("):
        count = 0
        if kind_text != "classes":
            inner = re.fullmatch(r"classes\(([1-9][0-9]{0,9})\)", kind_text)
            if inner is None:
                raise OptionError(f"--field {text!r}: classes(K) takes a positive number of classes")
            count = int(inner[1])
        spec = FieldSpec(name=name, kind="classes", dtype="int64", num_classes=count, source=source or name)
    else:
        array = _ARRAY_TYPE.fullmatch(kind_text)
        if array is None or array["dtype"] not in DTYPES:
            raise OptionError(f"--field {text!r}: unknown type {kind_text!r}; dtypes: {', '.join(DTYPES)}; {usage}")
        dims: list[Any] = []
        if array["dims"] is not None:
            for position, part in enumerate(array["dims"].split(",")):
                part = part.strip()
                if part.upper() == "N" and position == 0:
                    dims.append(-1)
                elif part.isdigit() and part.isascii():
                    dims.append(int(part))
                else:
                    raise OptionError(f"--field {text!r}: dimension {part!r} must be a positive integer "
                                      f"(or N, first only)")
        spec = FieldSpec(name=name, kind="array", dtype=array["dtype"],
                         shape=_check_shape(dims, error=OptionError, where=f"--field {text!r}"), source=source or name)
    return _finish_spec(spec, error=OptionError, where=f"--field {text!r}")


def parse_fields_schema(document: object, *, where: str = "fields schema") -> tuple[FieldSpec, ...]:
    """Field declarations from a schema document: a JSON list of manifest-style declarations
    (``{"name", "kind", "dtype", "shape", "classes", "num_classes", "source"}``) or of
    ``--field`` strings.

    Raises:
        OptionError: a declaration a dataset could not hold.
    """
    if not isinstance(document, list):
        raise OptionError(f"{where} must be a JSON array of field declarations")
    specs = []
    for number, item in enumerate(document):
        if isinstance(item, str):
            specs.append(parse_field_option(item))
        else:
            specs.append(_declaration(item, error=OptionError, where=f"{where} entry {number}", build=True))
    return check_declarations(specs, error=OptionError)


def check_declarations(specs: Sequence[FieldSpec], *, error: type[Exception] = OptionError) -> tuple[FieldSpec, ...]:
    """Refuse too many fields, repeated names, or a set whose columns would not fit an index."""
    if len(specs) > MAX_FIELDS:
        raise error(f"{len(specs)} fields declared, at most {MAX_FIELDS}")
    names = [spec.name for spec in specs]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise error(f"field names must be unique, {repeated} repeated")
    columns = sum(len(spec.columns()) for spec in specs)
    if columns > MAX_FIELD_COLUMNS:
        raise error(f"these fields need {columns} index columns, over the {MAX_FIELD_COLUMNS} an index has "
                    f"room for beside its own (an image field takes {len(IMAGE_COLUMNS)})")
    return tuple(specs)


def _declaration(item: object, *, error: type[Exception], where: str, build: bool = False) -> FieldSpec:
    if not isinstance(item, dict):
        raise error(f"{where} must be an object")
    name = check_name(item.get("name"), error=error, where=where)
    kind = item.get("kind")
    if kind not in FIELD_KINDS:
        raise error(f"{where} ({name}) kind {kind!r} is not one of {list(FIELD_KINDS)}")
    source = item.get("source", name)
    if not isinstance(source, str) or not source:
        raise error(f"{where} ({name}) source must be a non-empty string")
    if kind == "array":
        dtype = item.get("dtype")
        if not isinstance(dtype, str) or dtype not in DTYPES:  # a list or an object is unhashable: check first
            raise error(f"{where} ({name}) dtype {dtype!r} is not one of {list(DTYPES)}")
        shape = item.get("shape", [])
        if not isinstance(shape, list):
            raise error(f"{where} ({name}) shape must be an array of integers")
        names = item.get("classes", [])
        if names and (not dtype.startswith(("int", "uint")) or not isinstance(names, list)
                      or not all(isinstance(c, str) for c in names) or len(set(names)) != len(names)):
            raise error(f"{where} ({name}) classes (names of the values) need an integer dtype and an array of "
                        f"unique strings")
        spec = FieldSpec(name=name, kind=kind, dtype=dtype,
                         shape=_check_shape(shape, error=error, where=f"{where} ({name})"), source=source,
                         classes=tuple(names), num_classes=len(names))
    elif kind == "classes":
        classes = item.get("classes", [])
        count = item.get("num_classes", len(classes) if isinstance(classes, list) else 0)
        if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
            raise error(f"{where} ({name}) classes must be an array of strings")
        if len(set(classes)) != len(classes):
            raise error(f"{where} ({name}) classes repeat a name")
        if type(count) is not int or count < 0 or count > (1 << 40) or (classes and count != len(classes)):
            raise error(f"{where} ({name}) num_classes must be an integer in 0..2^40 equal to the number of "
                        f"classes when names are given, got {count!r}")
        if count == 0 and not build:
            raise error(f"{where} ({name}) num_classes must be at least 1")
        spec = FieldSpec(name=name, kind=kind, dtype="int64", classes=tuple(classes), num_classes=count,
                         source=source)
    else:
        spec = FieldSpec(name=name, kind=kind, source=source)
    return _finish_spec(spec, error=error, where=f"{where} ({name})")


def parse_declarations(document: object, *, path: object = None) -> tuple[FieldSpec, ...]:
    """The manifest's ``fields`` member (absent: no fields), without the image fields' shards.

    Raises:
        ManifestError: a declaration that is not valid (R45).
    """
    if document is None:
        return ()
    if not isinstance(document, list):
        raise ManifestError("manifest 'fields' must be an array of field declarations", path=path)

    def error(message: str) -> ManifestError:
        return ManifestError(message, path=path)

    specs = [_declaration(item, error=error, where=f"manifest field {number}")  # type: ignore[arg-type]
             for number, item in enumerate(document)]
    return check_declarations(specs, error=error)  # type: ignore[arg-type]


# --- values: source -> stored bytes --------------------------------------------------------------

class ClassVocabulary:
    """Class names of one ``classes`` field while listing: given up front, or collected and
    renumbered in UTF-8 bytes order at the end (the rule labels follow)."""

    def __init__(self, spec: FieldSpec) -> None:
        self.spec = spec
        self.given = bool(spec.classes)
        self.ids: dict[str, int] = {name: i for i, name in enumerate(spec.classes)}
        self.saw_names = self.given
        self.saw_ints = False
        self.largest = -1

    def id_of(self, value: object) -> int:
        if isinstance(value, str):
            if self.saw_ints:
                raise FieldValueError(f"field {self.spec.name!r} mixes class names and integer ids")
            self.saw_names = True
            if self.given:
                if value not in self.ids:
                    raise FieldValueError(f"field {self.spec.name!r}: class {value!r} is not in its class list")
                return self.ids[value]
            return self.ids.setdefault(value, len(self.ids))
        if type(value) is int:
            if self.saw_names and not self.given:
                raise FieldValueError(f"field {self.spec.name!r} mixes class names and integer ids")
            self.saw_ints = True
            limit = self.spec.num_classes or (1 << 40)
            if not 0 <= value < limit:
                raise FieldValueError(f"field {self.spec.name!r}: class id {value} outside 0..{limit - 1}")
            self.largest = max(self.largest, value)
            return value
        raise FieldValueError(f"field {self.spec.name!r}: a class is a name or an integer id, got {value!r}")

    def finish(self, blob: np.ndarray, offsets: np.ndarray) -> tuple[FieldSpec, np.ndarray]:
        """The final declaration and the ids blob (renumbered to sorted names when collected).

        Args:
            blob: every sample's ids (``<i8`` bytes), in listing order.
            offsets: the byte offsets of each sample's ids in ``blob`` (N+1).
        """
        if self.saw_names and not self.given:
            names = tuple(sorted(self.ids, key=str.encode))
            remap = np.empty(len(self.ids), dtype=np.int64)
            for sorted_id, name in enumerate(names):
                remap[self.ids[name]] = sorted_id
            ids = np.frombuffer(blob.tobytes(), dtype="<i8")
            if len(ids):
                renumbered = remap[ids]
                # each sample's set is stored sorted: sort again inside samples after renumbering
                counts = np.diff(np.asarray(offsets, dtype=np.int64)) // 8
                owner = np.repeat(np.arange(len(counts)), counts)
                renumbered = renumbered[np.lexsort((renumbered, owner))]
                blob = renumbered.astype("<i8").view(np.uint8)
            return FieldSpec(name=self.spec.name, kind="classes", dtype="int64", classes=names,
                             num_classes=len(names), source=self.spec.source), blob
        count = self.spec.num_classes or (len(self.spec.classes) if self.given else self.largest + 1)
        return FieldSpec(name=self.spec.name, kind="classes", dtype="int64", classes=self.spec.classes,
                         num_classes=max(count, 1), source=self.spec.source), blob


def _parse_cell(spec: FieldSpec, value: object) -> object:
    """A CSV cell (always a string) as the JSON value it spells, for array and classes fields."""
    if isinstance(value, str) and spec.kind in ("array", "classes"):
        text = value.strip()
        if spec.kind == "classes" and text and text[0] not in "[":
            # "cat|dog" or "cat dog": the usual CSV spelling of a tag set
            return [part for part in re.split(r"[|;, ]+", text) if part]
        if spec.kind == "classes" and not text:
            return []
        try:
            return json.loads(text, parse_constant=_reject_constant)
        except (ValueError, RecursionError) as exc:
            raise FieldValueError(f"field {spec.name!r}: {value[:80]!r} is not a JSON value ({exc})") from None
    return value


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def encode_value(spec: FieldSpec, value: object, *, vocabulary: ClassVocabulary | None = None,
                 from_text: bool = False) -> bytes:
    """The stored bytes of one sample's value (not for ``image`` fields).

    Args:
        spec: the field.
        value: the source value (JSON: numbers, nested lists, strings), or a CSV cell with
            ``from_text`` (array and classes cells are JSON or, for classes, ``a|b|c``).
        vocabulary: the ``classes`` field's vocabulary (required for that kind).

    Raises:
        FieldValueError: the value does not fit the declaration (says what was expected).
    """
    if from_text:
        value = _parse_cell(spec, value)
    if spec.kind == "text":
        if not isinstance(value, str):
            raise FieldValueError(f"field {spec.name!r} is text, got {_json_kind(value)}")
        data = value.encode("utf-8", "surrogatepass")
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            raise FieldValueError(f"field {spec.name!r}: text is not valid Unicode (a lone surrogate)") from None
    elif spec.kind == "classes":
        if vocabulary is None:
            raise ValueError("a classes field needs its vocabulary")
        items = value if isinstance(value, list) else [value]
        ids = sorted({vocabulary.id_of(item) for item in items})
        data = np.asarray(ids, dtype="<i8").tobytes()
    elif spec.kind == "array":
        data = _encode_array(spec, value)
    else:
        raise ValueError(f"encode_value does not store {spec.kind} fields")
    if len(data) > MAX_VALUE_BYTES:
        raise FieldValueError(f"field {spec.name!r}: the value is {len(data)} bytes, over the {MAX_VALUE_BYTES} limit")
    return data


def _json_kind(value: object) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "an object", type(None): "null"}.get(type(value), type(value).__name__)


def _shape_fits(shape: tuple[int, ...], declared: tuple[int, ...]) -> bool:
    return len(shape) == len(declared) and all(d == -1 or d == got for got, d in zip(shape, declared))


def _encode_array(spec: FieldSpec, value: object) -> bytes:
    target = np.dtype(DTYPES[spec.dtype])
    if type(value) in (list, int, float):
        # The common JSON case first: plain numbers of the declared shape, converted in one step
        # (about 3x faster than the checks below, which then only run to say what is wrong).
        try:
            fast = np.array(value)
        except (ValueError, TypeError):
            fast = None
        # numpy turns true/false among numbers into 1/0, so a list holding a boolean takes the
        # slow path, which refuses it for a numeric field ("holds a boolean")
        if (fast is not None and fast.dtype.kind in "iuf" and _shape_fits(fast.shape, spec.shape)
                and not (type(value) is list and _holds_bool(value))):
            if target.kind == "f":
                with np.errstate(over="ignore", invalid="ignore"):
                    stored = fast.astype(target)
                if np.isfinite(stored).all():
                    return stored.tobytes()
            elif target.kind in "iu" and fast.dtype.kind in "iu" and not spec.classes and fast.size:
                info = np.iinfo(target)
                if int(fast.min()) >= info.min and int(fast.max()) <= info.max:
                    return fast.astype(target).tobytes()
    dims = "[" + ",".join("N" if d == -1 else str(d) for d in spec.shape) + "]" if spec.shape else " scalar"
    expected = f"{spec.dtype}{dims}"
    if isinstance(value, dict) or isinstance(value, str) or value is None:
        raise FieldValueError(f"field {spec.name!r} expects {expected}, got {_json_kind(value)}")
    try:
        array = np.array(value)
    except (ValueError, TypeError):
        raise FieldValueError(f"field {spec.name!r} expects {expected}, got a ragged nested list") from None
    if target.kind != "b" and type(value) is list and array.dtype.kind in "iuf" and _holds_bool(value):
        raise FieldValueError(f"field {spec.name!r} expects {expected}, holds a boolean")
    if array.dtype.kind not in "biuf" or spec.dtype == "bool":
        # strings, None, mixed: keep the original items, so the message quotes what is wrong
        array = np.empty(array.shape, dtype=object)
        array[...] = _nested_items(value, array.shape)
    if spec.shape and spec.shape[0] == -1 and array.size == 0 and array.ndim == 1:
        array = array.reshape((0, *spec.shape[1:]))  # [] is an empty variable array of any row shape
    want = tuple(array.shape[0] if (d == -1 and i == 0 and array.ndim) else d for i, d in enumerate(spec.shape))
    if array.shape != want:
        raise FieldValueError(f"field {spec.name!r} expects {expected}, got shape {list(array.shape)}")
    if array.size and array.dtype == object and not all(_is_number(x, spec.dtype) for x in array.flat):
        bad = next(x for x in array.flat if not _is_number(x, spec.dtype))
        raise FieldValueError(f"field {spec.name!r} expects {expected}, holds {_json_kind(bad)} {bad!r}")
    if array.size and array.dtype != object:
        if array.dtype.kind == "b" and target.kind != "b":
            raise FieldValueError(f"field {spec.name!r} expects {expected}, holds a boolean")
        if target.kind in "iu" and array.dtype.kind == "f" and not np.all(np.isfinite(array) & (array == np.floor(array))):
            bad = array.flat[int(np.argmax(~(np.isfinite(array) & (array == np.floor(array)))).ravel()[0])]
            raise FieldValueError(f"field {spec.name!r} expects {expected}, holds a number {float(bad)!r} that is "
                                  f"not an integer")
    if target.kind in "iu" and array.size:
        numbers = [int(x) for x in array.flat]
        if spec.classes and (min(numbers) < 0 or max(numbers) >= len(spec.classes)):
            raise FieldValueError(f"field {spec.name!r}: a value is not a class number 0..{len(spec.classes) - 1}")
        info = np.iinfo(target)
        if min(numbers) < info.min or max(numbers) > info.max:
            raise FieldValueError(f"field {spec.name!r}: a value is outside the {spec.dtype} range "
                                  f"{info.min}..{info.max}")
        return np.asarray(numbers, dtype=target).reshape(array.shape).tobytes()
    if target.kind == "f" and array.size:
        with np.errstate(over="ignore"):
            stored = np.asarray(array, dtype=np.float64).astype(target)
        if not np.all(np.isfinite(stored)):
            raise FieldValueError(f"field {spec.name!r}: a value overflows {spec.dtype}")
        return stored.tobytes()
    return np.asarray(array, dtype=target).tobytes()


def _holds_bool(value: list) -> bool:
    """Whether nested lists ``value`` hold a ``bool`` anywhere."""
    stack = [value]
    while stack:
        for item in stack.pop():
            if type(item) is list:
                stack.append(item)
            elif type(item) is bool:
                return True
    return False


def _nested_items(value: Any, shape: tuple[int, ...]) -> Any:
    """``value`` (nested lists of the rectangular ``shape``) as an object array's contents."""
    flat: list[Any] = []

    def walk(item: Any, depth: int) -> None:
        if depth == len(shape):
            flat.append(item)
        else:
            for child in item:
                walk(child, depth + 1)

    walk(value, 0)
    out = np.empty(len(flat), dtype=object)
    out[:] = flat
    return out.reshape(shape)


def _is_number(x: object, dtype: str) -> bool:
    if dtype == "bool":
        return isinstance(x, bool) or (type(x) is int and x in (0, 1))
    if isinstance(x, bool):
        return False
    if dtype.startswith(("int", "uint")):
        return type(x) is int or (isinstance(x, float) and x.is_integer()) or isinstance(x, np.integer)
    return isinstance(x, (int, float, np.integer, np.floating))


# --- values: stored bytes -> reader values ------------------------------------------------------

def decode_value(spec: FieldSpec, data: np.ndarray) -> Any:
    """A stored value as a reader returns it: an ndarray (array: the declared shape; classes:
    the sorted ids, int64) or a str (text). ``data`` is the value's bytes (``|u1``).

    Raises:
        FieldValueError: text that is not UTF-8 (a damaged index would have failed its checksum;
            a hand-made one can still hold it).
    """
    if spec.kind == "text":
        try:
            return data.tobytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FieldValueError(f"field {spec.name!r} holds bytes that are not UTF-8 ({exc.reason})") from None
    dtype = spec.numpy_dtype
    # a writable copy: the stored bytes are a read-only map, and torch.from_numpy warns on those
    values = np.frombuffer(bytearray(data.tobytes()), dtype=dtype) if data.size else np.zeros(0, dtype=dtype)
    if spec.kind == "classes":
        return values.astype(np.int64)
    if spec.variable:
        return values.reshape((-1, *spec.record_shape))
    return values.reshape(spec.shape)


def multi_hot(ids: np.ndarray, num_classes: int, dtype: Any = np.float32) -> np.ndarray:
    """A class-id set as a multi-hot vector of ``num_classes`` (the usual BCE target)."""
    vector = np.zeros(num_classes, dtype=dtype)
    vector[np.asarray(ids, dtype=np.int64)] = 1
    return vector


def specs_from_json(document: Sequence[Mapping[str, Any]]) -> tuple[FieldSpec, ...]:
    """Declarations saved by the builder (plan header): trusted, but checked all the same."""
    return tuple(_declaration(dict(item), error=OptionError, where="saved field", build=True) for item in document)
