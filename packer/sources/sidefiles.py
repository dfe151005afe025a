"""Samples made of several files that share a key: which one is the image, which feed the declared fields.

An image folder built with ``--field`` declarations and a WebDataset shard group their files the
same way, by the WebDataset rule: a sample is every file whose path up to the first ``.`` of its
file name is the same (its *key*); the rest of the file name is the member's *suffix*.
``cat/001.jpg``, ``cat/001.mask.png`` and ``cat/001.json`` are one sample, key ``cat/001``,
suffixes ``jpg``, ``mask.png`` and ``json``. Suffixes are compared in lower case. With fields:

* An ``image`` field with source ``S`` (``--field mask=image@mask.png``; ``S`` defaults to the
  field's name) takes the member whose suffix is ``S`` when ``S`` ends in an image extension
  (``IMAGE_EXTENSIONS``), else the member whose suffix is ``S.<image extension>`` (``mask``
  finds ``mask.png`` or ``mask.jpg``). Exactly one must match: none, or several, rejects the
  sample (``bad-field``). Its bytes are packed as they are (``formats/SPEC.md`` §14.3).
* The sample's **image** is the one member whose suffix ends in an image extension and that no
  field took; its name is the sample's key in the dataset. None rejects the sample
  (``not-an-image``), several reject it too (``ambiguous-image``: declare a field for the others).
* A value field (``array``, ``classes``, ``text``) with source ``S`` reads the member whose
  suffix is ``S`` when the sample has one (``caption=text@txt``, ``boxes=float32[N,4]@boxes.json``):
  a member ending in ``.json`` holds the value as JSON; any other is UTF-8 text (a ``text``
  value without its trailing line ends; an ``array`` or ``classes`` value spelled as in a CSV
  cell: JSON, or ``a|b|c`` for classes). Otherwise it reads member ``S`` of the object in the
  sample's ``.json`` member (``boxes``, ``tags`` ...). A sample member wins over a JSON key of
  the same name. Missing, or not fitting the declaration: ``bad-field``.
* What no field took stays with the sample as metadata, keyed by suffix as WebDataset samples
  keep it: ``{"json": {the keys no field read}, "txt": "...", "cls": "..."}`` (a key a field
  read is stored in the field only, not twice). Any other member that no field took (a second
  ``.png`` nobody declared, a ``.npy``) is rejected on its own as ``unused-member``; the sample
  is packed without it.

Text members (``.json``, ``.txt``, ``.cls``) are read while listing, at most
``MAX_TEXT_MEMBER_BYTES`` each for metadata and ``MAX_SIDE_MEMBER_BYTES`` for a member a field
may read (a larger one a field needs rejects the sample). Side JSON is strict (no NaN,
Infinity or ``1e400``: ``build/strictjson.py``). Image members are not read while listing: the
listing keeps their name and size (and, in an archive, their offset), and packing reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from ..fields import MAX_VALUE_BYTES, FieldSpec, FieldValueError
from .fieldvalues import FIELD_REJECTION, FieldRowBuilder
from .strictjson import MAX_JSON_DEPTH, json_depth_ok, parse_strict_json

__all__ = ["IMAGE_EXTENSIONS", "TEXT_EXTENSIONS", "MAX_TEXT_MEMBER_BYTES", "MAX_SIDE_MEMBER_BYTES",
           "MAX_SAMPLE_METADATA_BYTES",
           "SideMember", "SampleParts", "split_key", "extension", "read_limit", "assemble_sample"]

#: Extensions (the last part of a suffix, lower case) that make a member an image.
IMAGE_EXTENSIONS = frozenset({"jpg", "jpeg", "png", "webp", "gif", "bmp", "tif", "tiff", "ppm", "pgm", "pbm",
                              "pnm", "jp2", "j2k", "avif", "heic", "heif", "tga", "ico", "qoi", "psd"})
#: Extensions of members read as text while listing: labels and metadata (``.cls``, ``.json``, ``.txt``).
TEXT_EXTENSIONS = frozenset({"cls", "json", "txt"})
#: A text member kept as metadata is read up to this size (a larger one is ``unused-member``).
MAX_TEXT_MEMBER_BYTES = 1 << 20
#: A member a value field may read (the ``.json``, or one a field names) is read up to this
#: size: a field's value is at most ``MAX_VALUE_BYTES`` stored, and its text is not much smaller.
MAX_SIDE_MEMBER_BYTES = MAX_VALUE_BYTES
#: A sample's metadata (the text members no field took) holds at most this much text; a member
#: past it is ``unused-member`` (one sample's metadata is one record, read whole by a reader).
MAX_SAMPLE_METADATA_BYTES = 4 << 20


def split_key(name: str) -> tuple[str, str]:
    """``("cat/001", "mask.png")`` for ``"cat/001.mask.png"``: the key and the suffix (as written)."""
    folder, _, base = name.rpartition("/")
    stem, _, suffix = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), suffix


def extension(suffix: str) -> str:
    """The last part of a suffix, lower case: ``"png"`` for ``"mask.PNG"``."""
    return suffix.rsplit(".", 1)[-1].lower()


def read_limit(suffix: str, specs: Sequence[FieldSpec]) -> int:
    """How many bytes of a member with ``suffix`` a lister reads while listing; -1: none (an image)."""
    lower = suffix.lower()
    values = [spec for spec in specs if spec.kind != "image"]
    if any(spec.source.lower() == lower for spec in values) or (lower == "json" and values):
        return MAX_SIDE_MEMBER_BYTES
    return MAX_TEXT_MEMBER_BYTES if extension(lower) in TEXT_EXTENSIONS else -1


@dataclass
class SideMember:
    """One file of a sample.

    Attributes:
        name: its name (a path relative to the source, or the archive member's name); the
            build report names it.
        suffix: the part of its file name after the first ``.``.
        size: its size in bytes.
        data: its bytes when the lister read it (``read_limit``), else None.
        handle: the lister's own reference to it (a listing row, a ``TarInfo``).
    """

    name: str
    suffix: str
    size: int
    data: bytes | None = None
    handle: Any = None


@dataclass
class SampleParts:
    """How one sample's members were used (``assemble_sample``).

    Attributes:
        image: the sample's image member (None when rejected for having none, or several).
        values: the encoded field values, for ``FieldRowBuilder.add`` once the sample is accepted.
        field_members: image field name -> its member.
        metadata: what no field took (``{"json": ..., "txt": ...}``), to store as the sample's metadata.
        json_object: the parsed ``.json`` member, whole (for a label lookup); None when absent or invalid.
        cls_text: the ``.cls`` member's text, stripped; None when absent.
        unused: ``(name, reason, message)`` of members rejected on their own (the sample is kept).
        rejection: ``(key, reason, message)`` when the whole sample is rejected.
    """

    image: SideMember | None = None
    values: list[Any] = field(default_factory=list)
    field_members: dict[str, SideMember] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    json_object: Any = None
    cls_text: str | None = None
    unused: list[tuple[str, str, str]] = field(default_factory=list)
    rejection: tuple[str, str, str] | None = None


def _image_candidates(source: str, by_suffix: dict[str, SideMember]) -> list[SideMember]:
    wanted = source.lower()
    if extension(wanted) in IMAGE_EXTENSIONS:  # "mask.png", or "png": that suffix exactly
        return [by_suffix[wanted]] if wanted in by_suffix else []
    return [member for suffix, member in sorted(by_suffix.items())
            if suffix.rpartition(".")[0] == wanted and extension(suffix) in IMAGE_EXTENSIONS]


def _text(member: SideMember, limit: int) -> str:
    """A text member's contents; raises ValueError naming the problem."""
    if member.data is None:
        raise ValueError(f"{member.name} is {member.size} bytes, over the {limit} bytes read from a side file")
    try:
        return member.data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{member.name} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def _json(member: SideMember, limit: int) -> Any:
    """A JSON member's value (strict JSON); raises ValueError naming the problem."""
    text = _text(member, limit)
    if not json_depth_ok(text):
        raise ValueError(f"{member.name} nests brackets deeper than {MAX_JSON_DEPTH} levels")
    try:
        return parse_strict_json(text)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"{member.name} is not strict JSON: {exc}") from None


def assemble_sample(key: str, members: Sequence[SideMember], builder: FieldRowBuilder, *,
                    max_image_size: int | None = None) -> SampleParts:
    """Apply the module's rules to one sample: its image, its encoded field values, its metadata.

    Args:
        key: the sample's key (the shared path up to the first dot), for messages.
        members: its files, in listing order (text members with their ``data`` read).
        builder: the listing's field values; ``builder.add(parts.values)`` is the caller's,
            once it accepts the sample.
        max_image_size: an image member larger than this rejects the sample (archives:
            ``oversize-member`` for the image, ``bad-field`` for a field's).

    Returns:
        The sample's parts; ``rejection`` set when the sample cannot be packed (then
        ``values`` is empty).
    """
    parts = SampleParts()
    by_suffix: dict[str, SideMember] = {}
    for member in members:
        lower = member.suffix.lower()
        if lower in by_suffix:  # cat/1.JPG beside cat/1.jpg: one sample cannot hold both
            parts.unused.append((member.name, "duplicate-entry",
                                 f"the sample already has a .{lower} member ({by_suffix[lower].name})"))
        else:
            by_suffix[lower] = member
    problems: list[str] = []
    claimed: set[str] = set()
    for spec in builder.specs:
        if spec.kind == "image":
            found = _image_candidates(spec.source, by_suffix)
            wanted = spec.source if extension(spec.source) in IMAGE_EXTENSIONS else f"{spec.source}.<image extension>"
            claimed.update(member.suffix.lower() for member in found)  # never the image, even when ambiguous
            if len(found) == 1:
                parts.field_members[spec.name] = found[0]
            elif not found:
                problems.append(f"field {spec.name!r}: the sample has no member {key}.{wanted}")
            else:
                problems.append(f"field {spec.name!r}: several members match {key}.{wanted} "
                                f"({', '.join(m.name for m in found)}); name one with @SUFFIX")
        elif spec.source.lower() in by_suffix:
            claimed.add(spec.source.lower())
    images = [m for suffix, m in by_suffix.items() if extension(suffix) in IMAGE_EXTENSIONS and suffix not in claimed]
    if len(images) != 1:
        suffixes = ", ".join(m.suffix for m in members)
        if images:
            parts.rejection = (key, "ambiguous-image",
                               f"the sample has {len(images)} image members no field takes "
                               f"({', '.join(m.name for m in images)}): declare a field for the others "
                               f"(--field NAME=image@SUFFIX)")
        else:
            parts.rejection = (key, "not-an-image", f"the sample has no image member (suffixes {suffixes})")
        return parts
    parts.image = image = images[0]
    if max_image_size is not None and image.size > max_image_size:
        parts.rejection = (image.name, "oversize-member", f"{image.size} bytes, over the limit of {max_image_size}")
        return parts
    if problems:
        parts.rejection = (image.name, FIELD_REJECTION, "; ".join(problems))
        return parts

    json_member = by_suffix.get("json")
    json_value: list[Any] = []  # parsed once, on first use: [value] or [ValueError]
    consumed: set[str] = set()
    text_fields: set[str] = set()

    def sample_json() -> Any:
        if not json_value:
            try:
                json_value.append(_json(json_member, MAX_SIDE_MEMBER_BYTES))  # type: ignore[arg-type]
            except ValueError as exc:
                json_value.append(exc)
        return json_value[0]

    def get(spec: FieldSpec) -> Any:
        if spec.kind == "image":
            return parts.field_members[spec.name]
        member = by_suffix.get(spec.source.lower())
        try:
            if member is not None:
                if extension(member.suffix) == "json":
                    return _json(member, MAX_SIDE_MEMBER_BYTES)
                text_fields.add(spec.name)
                text = _text(member, MAX_SIDE_MEMBER_BYTES)
                return text.rstrip("\r\n") if spec.kind == "text" else text
        except ValueError as exc:
            raise FieldValueError(f"field {spec.name!r}: {exc}") from None
        if json_member is None:
            raise FieldValueError(f"field {spec.name!r}: the sample has no member {key}.{spec.source} and no "
                                  f"{key}.json holding {spec.source!r}")
        document = sample_json()
        if isinstance(document, ValueError):
            raise FieldValueError(f"field {spec.name!r}: {document}")
        if not isinstance(document, dict) or spec.source not in document:
            raise FieldValueError(f"field {spec.name!r}: {json_member.name} has no member {spec.source!r} (and the "
                                  f"sample no member {key}.{spec.source})")
        consumed.add(spec.source)
        return document[spec.source]

    def resolve_image(spec: FieldSpec, member: SideMember) -> tuple[str, int]:
        if member.size == 0:
            raise FieldValueError(f"field {spec.name!r}: {member.name} is an empty file")
        if max_image_size is not None and member.size > max_image_size:
            raise FieldValueError(f"field {spec.name!r}: {member.name} is {member.size} bytes, over the member "
                                  f"size limit of {max_image_size}")
        return member.name, member.size

    try:
        parts.values = builder.encode(get, text_fields=text_fields, resolve_image=resolve_image)
    except FieldValueError as exc:
        parts.rejection = (image.name, FIELD_REJECTION, str(exc))
        parts.values = []
        return parts
    _leftovers(parts, by_suffix, claimed | {image.suffix.lower()}, json_member, sample_json, consumed)
    return parts


def _leftovers(parts: SampleParts, by_suffix: dict[str, SideMember], claimed: set[str],
               json_member: SideMember | None, sample_json: Any, consumed: set[str]) -> None:
    """Metadata from the members no field took; the rest rejected as ``unused-member``."""
    if "cls" in by_suffix and by_suffix["cls"].data is not None:
        try:
            parts.cls_text = _text(by_suffix["cls"], MAX_TEXT_MEMBER_BYTES).strip()
        except ValueError:
            parts.cls_text = None
    if json_member is not None and json_member.data is not None:
        document = sample_json()
        parts.json_object = None if isinstance(document, ValueError) else document
    kept = 0  # text bytes kept as metadata so far
    for suffix, member in by_suffix.items():
        if suffix in claimed:
            continue
        if extension(suffix) in TEXT_EXTENSIONS and member is not json_member and member.data is not None \
                and kept + len(member.data) > MAX_SAMPLE_METADATA_BYTES:
            parts.unused.append((member.name, "unused-member",
                                 f"the sample's metadata already holds {kept} bytes of text; a further "
                                 f"{len(member.data)} would pass the {MAX_SAMPLE_METADATA_BYTES} a sample keeps "
                                 f"(not packed)"))
            continue
        if extension(suffix) not in TEXT_EXTENSIONS:
            parts.unused.append((member.name, "unused-member",
                                 "a member of the sample that is neither its image nor taken by a declared field "
                                 "(--field), nor .json/.txt/.cls metadata (not packed)"))
            continue
        try:
            if member is json_member:
                document = sample_json()
                if isinstance(document, ValueError):
                    raise document
                if isinstance(document, dict):
                    document = {k: v for k, v in document.items() if k not in consumed}
                    if not document:
                        continue  # every key went into a field
            elif extension(suffix) == "json":
                document = _json(member, MAX_TEXT_MEMBER_BYTES)
            else:
                document = _text(member, MAX_TEXT_MEMBER_BYTES)
                document = document.strip() if extension(suffix) == "cls" else document
            kept += len(member.data or b"")
        except ValueError as exc:
            too_large = member.data is None
            parts.unused.append((member.name, "unused-member" if too_large else "bad-metadata",
                                 f"{exc} (not packed)"))
            continue
        parts.metadata[suffix] = document
