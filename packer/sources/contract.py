"""The source contract: the one place that turns any door's listing into what the writer packs.

A door (``folder``, ``manifest``, ``tar``, ``zip``, ``webdataset``, ``parquet``, ``coco``, and any
door added later) only *lists*: a ``RawListing`` of entries with their labels as written, the
class names the source itself declares, where archive members live, field values, and what it
could not list. It never sees the options below. ``apply_contract`` applies, in this order and
the same way for every door:

1. **Declared classes**: the names a source declares (class folders, a ``ClassLabel`` list) are
   unique, non-empty Unicode text, or the source is refused (``SourceError``).
2. **Duplicates**: a key listed twice is packed once (the first); the rest are ``duplicate-entry``
   when they are the same bytes (a manifest or COCO file naming one file twice, an archive holding
   one member twice). Two archive members (or spooled rows) under one key that hold *different*
   bytes are a key collision: the build is refused (``SourceError`` naming the key), never
   finished with one of them silently dropped. (Checked after the bounds below, on members that
   lie inside their container and under the size bounds; one that does not stays a duplicate.)
3. **Member bounds** (archives): every member's bytes lie inside its container (an inner tar's
   members inside their outer member), else ``truncated``; no two members share a byte, else
   ``overlapping-member`` (the later one); a compressed member expands at most ``MAX_EXPANSION``
   times, else ``decompression-bomb``; and the members of one container expand to at most
   ``MAX_EXPANSION`` times its size plus 1 GiB in total, else the source is refused.
4. **Per-sample memory bounds**: an archive member (or its image field's member) over
   ``max_member_size`` (stored or expanded) is ``oversize-member``; any entry over
   ``max_file_size`` is ``file-too-large``; metadata over ``MAX_META_BYTES`` is ``bad-metadata``.
   Nothing a worker reads is larger.
5. **Labels** (``--label-type``, the class list, the unlabeled rule):

   * ``--label-type`` types text labels: ``str`` makes every label a class name (an integer
     ``3`` is the name ``"3"``); ``int`` wants plain ASCII integers (anything else is
     ``bad-label``); ``auto`` reads text of plain ASCII digits as an integer and other text as
     a class name, and refuses text that only looks like an integer (``" 1"``, ``1_0``,
     ``007``: ``bad-label``). With a class list given, ``auto`` reads text as class names.
     A label, text or a class name given by the source's structure, that is empty or not Unicode
     text (an unpaired surrogate escape) is ``bad-label``.
     A source that numbers its own classes (``ClassLabel``) has its integers read as those names.
   * Integers and class names never mix in one build (``SourceError``); nor in an ``append`` to
     a dataset with class names, where text of plain digits that is not one of its names would
     otherwise become a new class named like an integer (``auto`` only).
   * The class list: a given one (``--classes``, ``--classes-from``, the dataset ``append``
     adds to) numbers the names, and an integer label ``k`` means its ``k``-th class; a name not
     in it, or an integer outside it, is ``unknown-class`` (``append`` without a fixed list adds
     new names after the old ones instead). Without one, the names found plus the names the
     source declares, sorted by their UTF-8 bytes; or the source's own numbered list; or none
     (integer labels as written).
   * **Unlabeled samples**: when the build has class names, a sample without a label is
     ``unlabeled`` (label -1 is no class: a dataset holding it would not open, SPEC R40). When
     labels are integers without names, it keeps -1 (unlabeled, SPEC §5). A source whose
     samples all lack labels builds an unlabeled dataset; giving it a class list is an error.
   * With ``on_error="fail"`` any ``unknown-class`` or ``unlabeled`` sample refuses the build.

6. **Empty source**: nothing left is an ``EmptySourceError`` naming the top reasons.

The result is a ``SourceListing`` (labels numbered, the class list, ``label_type``), with every
rejection, door's and contract's, in its ``rejected`` list for the build report. Memory stays
flat: every rule is a numpy pass over the listing's arrays, and only rejected rows (and each
distinct label string) become Python objects.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..classes import load_class_list
from ..errors import OptionError, SourceError
from ..fields import MAX_VALUE_BYTES, FieldSpec, check_declarations, parse_field_option, specs_from_json
from .archive_listing import ARCHIVE_KINDS, DEFAULT_MAX_MEMBER_SIZE, MAX_EXPANSION
from .blobs import gather_blob
from .detect import list_raw
from .labels import INT64, STRICT_INT, check_label_type, loose_int
from .listing import (INT_LABEL, NAME_LABEL, TEXT_LABEL, DoorOptions, RawListing, Rejection, SourceListing,
                      SourceSettings, empty_source_error)
from .members import RAW, member_spans

__all__ = ["SourceOptions", "LabelSettings", "APPEND_ORIGIN", "apply_contract", "list_source", "field_declaration",
           "MAX_META_BYTES", "ON_ERROR"]

#: A sample's metadata (JSON) is at most this long: more is ``bad-metadata``.
MAX_META_BYTES = MAX_VALUE_BYTES
#: ``SourceOptions.on_error``: ``skip`` rejects a sample with a reason, ``fail`` refuses the build.
ON_ERROR = ("skip", "fail")
#: ``SourceOptions.new_classes``: a name outside a given list is ``unknown-class`` (``reject``),
#: or gets the next label (``extend``: ``packer append`` to a dataset built without a fixed list).
NEW_CLASSES = ("reject", "extend")
#: A compressed member smaller than this is not held to ``MAX_EXPANSION`` (tiny members of zeros).
_RATIO_FLOOR = 1 << 20
#: The members of one container may expand past ``MAX_EXPANSION`` times its size only by this much.
_TOTAL_FLOOR = 1 << 30


#: ``LabelSettings.classes_origin`` of the class list ``packer append`` gives: the dataset's own.
APPEND_ORIGIN = "the class list of the dataset appended to"


@dataclass(frozen=True)
class LabelSettings:
    """What a build records about its labels (the ``labels`` part of ``packer.BuildSettings``).

    Attributes:
        classes: a fixed class list (label ``i`` is ``classes[i]``), or None to number the classes
            found; ``()`` means the labels must be integers (an ``append`` to a dataset without
            names). Also accepts what ``--classes`` does (a file of names, or ``"a,b,c"``), read
            once here.
        classes_origin: where the list came from, as the user gave it (``"--classes"``,
            ``"--classes-from /data/train"``): every message about the list names it. Provenance,
            not content: not compared when a build is resumed.
        label_type: how labels written as text are read: ``"auto"``, ``"int"`` or ``"str"``
            (``labels.LABEL_TYPES``; ``--label-type``).
        fields: declared fields (``packer/fields.py``) as manifest-style declarations; also
            accepts ``--field`` strings and ``FieldSpec`` objects, normalised here.
    """

    classes: tuple[str, ...] | None = field(default=None, metadata={"option": "--classes"})
    classes_origin: str = field(default="--classes", compare=False)
    label_type: str = field(default="auto", metadata={"option": "--label-type"})
    fields: tuple[dict[str, Any], ...] = field(default=(), metadata={"option": "--field"})

    def __post_init__(self) -> None:
        if self.fields:
            object.__setattr__(self, "fields", tuple(field_declaration(item) for item in self.fields))
        if self.classes_origin is None:  # a record of a build without a class list
            object.__setattr__(self, "classes_origin", "--classes")
        if isinstance(self.classes, list):  # from JSON (a saved plan, a manifest's build record)
            object.__setattr__(self, "classes", tuple(self.classes))
        elif isinstance(self.classes, (str, os.PathLike)):
            object.__setattr__(self, "classes", load_class_list(self.classes))

    @property
    def field_specs(self) -> tuple[FieldSpec, ...]:
        """The declared fields as ``FieldSpec`` objects (before listing: a ``classes`` field
        without names has no class list yet)."""
        return specs_from_json(self.fields)

    def check(self) -> "LabelSettings":
        """Refuse a label type, class list or field declaration no rule knows.

        Raises:
            OptionError: naming the option (``--label-type``, the class list's origin, ``--field``).
        """
        check_label_type(self.label_type)
        if self.classes is not None:
            load_class_list(self.classes, what=self.classes_origin)  # an empty list, duplicates, non-strings
        check_declarations(self.field_specs)
        return self

    def to_json(self) -> dict[str, Any]:
        return {"classes": None if self.classes is None else list(self.classes),
                "classes_origin": self.classes_origin if self.classes is not None else None,
                "label_type": self.label_type, "fields": [dict(item) for item in self.fields]}


def field_declaration(item: Any) -> dict[str, Any]:
    """One declared field, given as a ``--field`` string, a ``FieldSpec`` or a declaration object,
    as its canonical declaration.

    Raises:
        OptionError: anything else, or a declaration that does not parse.
    """
    if isinstance(item, str):
        return parse_field_option(item).to_json()
    if isinstance(item, FieldSpec):
        return item.to_json()
    if isinstance(item, dict):
        return specs_from_json([item])[0].to_json()
    raise OptionError(f"a field is declared by a --field string, a FieldSpec or a declaration object, "
                      f"got {item!r}")


@dataclass(frozen=True)
class SourceOptions:
    """What a build asks of its source: how to read it (handed to the door, ``door``) and the
    rules the contract applies (never handed to a door).

    Attributes:
        source: the source settings (kind, root, label field, image column): the door's.
        labels: the label settings (class list and its origin, label type, declared fields):
            the contract's, except the declared fields, which the door also receives.
        spool_dir, progress: for the door (``listing.DoorOptions``).
        new_classes: ``"reject"`` or ``"extend"`` (see ``NEW_CLASSES``).
        on_error: ``"skip"`` or ``"fail"`` (``ON_ERROR``).
        max_member_size: an archive member larger than this is ``oversize-member``.
        max_file_size: any entry larger than this is ``file-too-large`` (None: no limit).
    """

    source: SourceSettings = SourceSettings()
    labels: LabelSettings = LabelSettings()
    spool_dir: Path | None = None
    progress: Callable[[int], None] | None = field(default=None, compare=False)
    new_classes: str = "reject"
    on_error: str = "skip"
    max_member_size: int = DEFAULT_MAX_MEMBER_SIZE
    max_file_size: int | None = None

    @property
    def door(self) -> DoorOptions:
        """The part a door receives."""
        return DoorOptions(source=self.source, fields=self.labels.field_specs, spool_dir=self.spool_dir,
                           progress=self.progress)

    def check(self) -> "SourceOptions":
        """Raises OptionError for a value no rule knows."""
        check_label_type(self.labels.label_type)
        if self.on_error not in ON_ERROR:
            raise OptionError(f"--on-error must be 'skip' or 'fail', got {self.on_error!r}")
        if self.new_classes not in NEW_CLASSES:
            raise OptionError(f"new_classes must be one of {', '.join(NEW_CLASSES)}, got {self.new_classes!r}")
        if not isinstance(self.max_member_size, int) or self.max_member_size < 1:
            raise OptionError(f"max_member_size must be a positive number of bytes, got {self.max_member_size!r}")
        return self


def list_source(source: str | os.PathLike[str], options: SourceOptions = SourceOptions()) -> SourceListing:
    """List ``source`` with its door and apply the contract: what ``packer build`` and ``packer
    append`` pack.

    Raises:
        SourceError, EmptySourceError, OptionError, MissingDependencyError, BuildError (a full
        disk while spooling): see ``detect.list_raw`` and ``apply_contract``.
    """
    options.check()
    return apply_contract(list_raw(source, options.door), options)


def apply_contract(raw: RawListing, options: SourceOptions = SourceOptions()) -> SourceListing:
    """Apply every rule of the module docstring to a door's listing.

    Raises:
        SourceError: declared classes that repeat, labels mixing integers and names, names
            appended to a dataset of integers, a container whose members expand without bound,
            or (``on_error="fail"``) a sample outside the class list or without a label.
        OptionError: a class list given to a source none of whose samples has a label.
        EmptySourceError: no entry is left.
    """
    options.check()
    count = len(raw)
    keep = np.ones(count, dtype=bool)
    rows: list[tuple[int, str, str]] = []  # (row, reason, message) of the rows the contract rejects
    declared = _checked_declared(raw)
    repeats = _duplicates(raw, keep, rows)
    _member_bounds(raw, keep, rows)
    _sizes(raw, options, keep, rows)
    _collisions(raw, options, keep, repeats)
    classes, labels, label_type = _labels(raw, options, declared, keep, rows)
    class_order = None if label_type != "str" else (
        "given" if options.labels.classes else "source" if raw.declared_numbering
        else "splits" if raw.declared_across_splits else "sorted")
    rejected = list(raw.rejected) + [Rejection(raw.key(row), reason, message) for row, reason, message in sorted(rows)]
    if options.on_error == "fail":
        strict = [(row, reason, message) for row, reason, message in sorted(rows)
                  if reason in ("unknown-class", "unlabeled")]
        if strict:
            row, reason, message = strict[0]
            what = "are not in the class list" if reason == "unknown-class" else "have no label"
            raise SourceError(f"{len(strict)} sample(s) {what} (--on-error fail), e.g. {raw.key(row)}: {message}",
                              path=raw.empty_path or raw.root)
    selected = np.flatnonzero(keep)
    if not len(selected):
        raise empty_source_error(raw.empty_what, rejected, path=raw.empty_path or raw.root,
                                 hints=raw.empty_hints, source_kind=raw.kind)
    if len(selected) == len(raw):  # nothing rejected (the common case): the door's arrays as they are
        return SourceListing(root=raw.root, kind=raw.kind, classes=classes, key_blob=raw.key_blob,
                             key_offsets=raw.key_offsets, sizes=raw.sizes, labels=labels, meta_blob=raw.meta_blob,
                             meta_offsets=raw.meta_offsets, rejected=rejected, label_type=label_type,
                             warnings=list(raw.warnings), stamps=raw.stamps, members=raw.members, fields=raw.fields,
                             class_order=class_order)
    keys, key_offsets = gather_blob(raw.key_blob, raw.key_offsets, selected)
    meta, meta_offsets = gather_blob(raw.meta_blob, raw.meta_offsets, selected)
    return SourceListing(root=raw.root, kind=raw.kind, classes=classes, key_blob=keys, key_offsets=key_offsets,
                         sizes=raw.sizes[selected], labels=labels[selected], meta_blob=meta,
                         meta_offsets=meta_offsets, rejected=rejected, label_type=label_type,
                         warnings=list(raw.warnings), stamps=raw.stamps[selected],
                         members=raw.members.select(selected) if raw.members is not None else None,
                         fields=raw.fields.select(selected) if raw.fields is not None else None,
                         class_order=class_order)


# --- 1. declared classes ------------------------------------------------------------------------------

def _text_problem(name: str) -> str | None:
    if not name:
        return "is empty"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "holds an unpaired surrogate escape (not Unicode text)"
    return None


def _checked_declared(raw: RawListing) -> tuple[str, ...]:
    names = tuple(raw.declared_classes)
    for name in names:
        problem = _text_problem(name) if isinstance(name, str) else "is not a string"
        if problem:
            raise SourceError(f"the source declares a class name that {problem}: {name!r}", path=raw.root)
    if len(set(names)) != len(names):
        seen: set[str] = set()
        repeated: set[str] = set()
        for name in names:
            (repeated if name in seen else seen).add(name)
        raise SourceError(f"the source declares class names more than once ({', '.join(map(repr, sorted(repeated)[:5]))}): "
                          f"two classes would share one name and be merged", path=raw.root)
    return names


# --- 2. duplicates ------------------------------------------------------------------------------------

_DUPLICATE = {
    "manifest": "the manifest lists this path more than once",
    "coco": "the COCO file lists this file_name more than once; the first is packed",
    "folder": "the folder lists this key more than once (a name escaped to the same key); the first is packed",
    "python": "two samples were written with this key (an fn's \"key\"); the first is packed",
}


def _duplicates(raw: RawListing, keep: np.ndarray, rows: list[tuple[int, str, str]]) -> list[tuple[int, int]]:
    """Every repeat of a key is rejected; the first in listing order is packed. Hashes first
    (a stable sort of u64), then the keys themselves only where a hash repeats.

    Returns:
        ``(first row, repeated row)`` for each repeat of a member listing (archives, spools), whose
        bytes ``_collisions`` compares; a file listing's repeats name one file (none returned).
    """
    hashes = raw.key_hashes
    if len(hashes) < 2:
        return []
    order = np.argsort(hashes, kind="stable")
    sorted_hashes = hashes[order]
    repeated = np.flatnonzero(sorted_hashes[1:] == sorted_hashes[:-1]) + 1
    if not len(repeated):
        return []
    message = _DUPLICATE.get(raw.kind, "the archive holds this name more than once; the first is packed")
    seen: dict[int, dict[str, int]] = {}
    pairs: list[tuple[int, int]] = []
    for position in repeated.tolist():
        value = int(sorted_hashes[position])
        group = seen.get(value)
        if group is None:  # position - 1 holds this hash's first row in listing order (stable sort)
            first = int(order[position - 1])
            group = seen[value] = {raw.key(first): first}
        row = int(order[position])
        key = raw.key(row)
        if key in group:
            keep[row] = False
            rows.append((row, "duplicate-entry", message))
            if raw.members is not None:
                pairs.append((group[key], row))
        else:
            group[key] = row
    return pairs


def _collisions(raw: RawListing, options: SourceOptions, keep: np.ndarray, pairs: list[tuple[int, int]]) -> None:
    """Refuse the build if a repeated key names other bytes than the row packed under it (module
    docstring, rule 2). Only members inside their container and under the size bounds are read."""
    members = raw.members
    if members is None or not pairs:
        return
    from .members import MemberReader

    sizes = [int(size) for size, _ in members.container_stats]
    spans = member_spans(members)
    limit = options.max_member_size

    def readable(row: int) -> bool:
        end = int(members.offset[row]) + int(spans[row])
        return (end <= sizes[int(members.container[row])] and int(members.stored[row]) <= limit
                and int(raw.sizes[row]) <= limit)

    collided: list[tuple[str, str]] = []
    with MemberReader(members) as reader:
        for first, row in pairs:
            if not keep[first] or not readable(first) or not readable(row):
                continue
            if int(raw.sizes[first]) != int(raw.sizes[row]):
                collided.append((raw.key(row), f"{int(raw.sizes[first])} and {int(raw.sizes[row])} bytes"))
                continue
            one, why_one, _ = reader.read(first, int(raw.sizes[first]))
            other, why_other, _ = reader.read(row, int(raw.sizes[row]))
            if not why_one and not why_other and one != other:
                collided.append((raw.key(row), f"{len(one)} bytes each, different"))
    if collided:
        examples = "; ".join(f"{key!r} ({what})" for key, what in collided[:3])
        raise SourceError(f"{len(collided)} key(s) name two different images (a key collision: packer keys samples "
                          f"by name, and one of each pair would be lost), e.g. {examples}; rename them, or build "
                          f"the parts as separate datasets", path=raw.root)


# --- 3. member bounds -----------------------------------------------------------------------------------

def _member_bounds(raw: RawListing, keep: np.ndarray, rows: list[tuple[int, str, str]]) -> None:
    """Each member inside its region, none overlapping another, none (and no container) a bomb."""
    members, bounds = raw.members, raw.member_bounds
    if members is None or bounds is None:  # a listing of files: no member has bounds to check
        return
    sizes = [int(size) for size, _ in members.container_stats]
    region_start = np.array([start for _, start, _ in bounds.regions], dtype=np.uint64)
    region_end = np.array([sizes[c] if end < 0 else end for c, _, end in bounds.regions], dtype=np.uint64)
    tables = [("", members, bounds.row_region)] + [
        (name, table, bounds.field_region[name]) for name, table in members.fields.items()]
    spans_all, starts_all, containers_all, owners_all = [], [], [], []
    for name, table, region in tables:
        what = f"its {name!r} member" if name else "the member"
        spans = member_spans(table)
        start, end = region_start[region], region_end[region]
        offset = table.offset.astype(np.uint64)
        inside = (offset >= start) & (offset <= end)
        inside &= spans <= np.where(inside, end - np.minimum(offset, end), np.uint64(0))
        for row in np.flatnonzero(~inside & keep).tolist():
            keep[row] = False
            reg = int(region[row])
            where = ("the archive" if bounds.regions[reg][2] < 0 else
                     f"its class tar (bytes {int(region_start[reg])}..{int(region_end[reg])})")
            rows.append((row, "truncated", f"{what} claims bytes {int(offset[row])}..{int(offset[row]) + int(spans[row])}"
                                           f", past the end of {where} ({int(region_end[reg])})"))
        if table.method.size and (table.method != RAW).any():
            expanded = (table.stored.astype(np.uint64) * np.uint64(MAX_EXPANSION))
            bomb = (table.method != RAW) & (table.stored.astype(np.uint64) < np.uint64(1 << 50))
            bomb &= (_expanded_sizes(raw, name) > np.uint64(_RATIO_FLOOR)) & (_expanded_sizes(raw, name) > expanded)
            for row in np.flatnonzero(bomb & keep).tolist():
                keep[row] = False
                rows.append((row, "decompression-bomb", f"{what}: {int(table.stored[row])} compressed bytes declare "
                                                        f"{int(_expanded_sizes(raw, name)[row])} bytes (over "
                                                        f"{MAX_EXPANSION}x)"))
        spans_all.append(spans)
        starts_all.append(offset)
        containers_all.append(table.container.astype(np.int64))
        owners_all.append(np.arange(len(offset), dtype=np.int64))
    # overlaps: by container, then offset, then listing row; a member starting before the end of
    # any member earlier in that order shares its bytes (the later one is rejected). Every live
    # member now ends inside its container, so shifting each container's offsets past the sizes
    # of the containers before it makes one running maximum serve every container at once.
    spans = np.concatenate(spans_all)
    starts = np.concatenate(starts_all)
    containers = np.concatenate(containers_all)
    owners = np.concatenate(owners_all)
    live = keep[owners]
    spans, starts, containers, owners = spans[live], starts[live], containers[live], owners[live]
    if len(owners) > 1:
        base = np.concatenate([[0], np.cumsum(np.array(sizes, dtype=np.uint64), dtype=np.uint64)])[:-1]
        order = np.lexsort((owners, starts, containers))
        shifted_starts = starts[order] + base[containers[order]]
        shifted_ends = shifted_starts + spans[order]
        reach = np.maximum.accumulate(shifted_ends)
        overlapping = np.zeros(len(order), dtype=bool)
        overlapping[1:] = (shifted_starts[1:] < reach[:-1]) & (spans[order][1:] > 0)
        for position in np.flatnonzero(overlapping).tolist():
            row = int(owners[order[position]])
            if keep[row]:
                keep[row] = False
                rows.append((row, "overlapping-member", f"its bytes (from offset {int(starts[order[position]])}) "
                                                        f"overlap another member's: a crafted archive (the "
                                                        f"overlapping-member zip bomb)"))
    # the total: every member of a container, expanded, against the container's size
    totals = np.zeros(len(sizes), dtype=np.float64)  # float64: exact to 8 PiB, plenty for a bound
    for name, table, _ in tables:
        totals += np.bincount(table.container[keep].astype(np.int64), minlength=len(sizes),
                              weights=_expanded_sizes(raw, name)[keep].astype(np.float64))[:len(sizes)]
    for container in np.flatnonzero(totals > MAX_EXPANSION * np.array(sizes, dtype=np.float64) + _TOTAL_FLOOR):
        raise SourceError(f"the archive's members expand to {int(totals[container])} bytes from "
                          f"{sizes[container]}: over {MAX_EXPANSION} times its size, a decompression bomb",
                          path=members.containers[int(container)])


def _expanded_sizes(raw: RawListing, field_name: str) -> np.ndarray:
    """Uncompressed sizes of the main members (``""``) or of an image field's members (u64)."""
    if not field_name:
        return raw.sizes.astype(np.uint64)
    return raw.members.fields[field_name].stored.astype(np.uint64)  # type: ignore[union-attr]  (tar: raw bytes)


# --- 4. per-sample memory bounds ------------------------------------------------------------------------

def _sizes(raw: RawListing, options: SourceOptions, keep: np.ndarray, rows: list[tuple[int, str, str]]) -> None:
    limit = options.max_member_size
    sizes = raw.sizes.astype(np.uint64)
    if raw.kind in ARCHIVE_KINDS and raw.members is not None:
        # what a worker allocates: the stored bytes and the expanded ones (a little slack for
        # incompressible data stored deflated)
        stored_limit = np.uint64(limit + (limit >> 6) + 65536)
        tables = [("", raw.members)] + list(raw.members.fields.items())
        for name, table in tables:
            expanded = _expanded_sizes(raw, name)
            over = ((expanded > np.uint64(limit)) | (table.stored.astype(np.uint64) > stored_limit)) & keep
            for row in np.flatnonzero(over).tolist():
                keep[row] = False
                what = f"its {name!r} member is " if name else ""
                rows.append((row, "oversize-member", f"{what}{int(expanded[row])} bytes ({int(table.stored[row])} "
                                                     f"stored), over the limit of {limit}"))
    if options.max_file_size is not None:
        for row in np.flatnonzero((sizes > np.uint64(options.max_file_size)) & keep).tolist():
            keep[row] = False
            rows.append((row, "file-too-large", f"is {int(sizes[row])} bytes; the limit (--max-file-size) is "
                                                f"{options.max_file_size}"))
    meta_lengths = np.diff(raw.meta_offsets.astype(np.int64))
    for row in np.flatnonzero((meta_lengths > MAX_META_BYTES) & keep).tolist():
        keep[row] = False
        rows.append((row, "bad-metadata", f"the sample's metadata is {int(meta_lengths[row])} bytes, over the "
                                          f"{MAX_META_BYTES} a sample may hold"))


# --- 5. labels ------------------------------------------------------------------------------------------

_TYPED_NONE, _TYPED_INT, _TYPED_NAME, _TYPED_BAD = 0, 1, 2, 3


def _type_text(text: str, label_type: str, names_given: bool) -> tuple[int, int | str, str]:
    """(typed kind, value, message) of a text label under ``--label-type``."""
    problem = _text_problem(text)
    if problem:
        return _TYPED_BAD, 0, f"label {text[:80]!r} {problem}"
    if label_type == "str" or (label_type == "auto" and names_given):
        return _TYPED_NAME, text, ""
    if STRICT_INT.match(text):
        integer = int(text) if len(text) <= 20 else None
        if integer is None or integer not in INT64:
            return _TYPED_BAD, 0, f"label {text[:40]} does not fit in a signed 64-bit integer"
        return _TYPED_INT, integer, ""
    if label_type == "int":
        return _TYPED_BAD, 0, (f"label {text[:80]!r} is not an integer (--label-type int: plain ASCII digits with an "
                               f"optional '-', nothing else)")
    if loose_int(text):
        return _TYPED_BAD, 0, (f"label {text[:80]!r} looks like an integer but is not plain ASCII digits (spaces, '_', "
                               f"'+', leading zeros or non-ASCII digits): packer reads labels strictly; fix it, or "
                               f"pass --label-type str to use every label as a class name")
    return _TYPED_NAME, text, ""


def _labels(raw: RawListing, options: SourceOptions, declared: tuple[str, ...], keep: np.ndarray,
            rows: list[tuple[int, str, str]]) -> tuple[tuple[str, ...], np.ndarray, str]:
    """(class list, int64 label per raw row, label type); rejects rows by the label rules."""
    kinds, values, texts = raw.label_kinds, raw.label_values, raw.label_texts
    given = options.labels.classes
    names_given = bool(given)
    count = len(raw)
    # every row typed as: none, an integer (value), a name (index into `names`), or bad (a message)
    typed = np.full(count, _TYPED_NONE, dtype=np.uint8)
    value = np.zeros(count, dtype=np.int64)
    names: list[str] = []
    name_id: dict[str, int] = {}
    messages: list[str] = []

    def intern(name: str) -> int:
        number = name_id.get(name)
        if number is None:
            number = name_id[name] = len(names)
            names.append(name)
        return number

    # text and structural names: each distinct string typed once
    text_kind = np.zeros(len(texts), dtype=np.uint8)
    text_value = np.zeros(len(texts), dtype=np.int64)
    for number, text in enumerate(texts):
        kind, result, message = _type_text(text, options.labels.label_type, names_given)
        text_kind[number] = kind
        if kind == _TYPED_NAME:
            text_value[number] = intern(str(result))
        elif kind == _TYPED_INT:
            text_value[number] = int(result)
        elif kind == _TYPED_BAD:
            messages.append(message)
            text_value[number] = len(messages) - 1
    is_text = kinds == TEXT_LABEL
    typed[is_text] = text_kind[values[is_text]]
    value[is_text] = text_value[values[is_text]]
    is_name = kinds == NAME_LABEL
    if is_name.any():
        name_ids = np.array([intern(text) for text in texts], dtype=np.int64)
        typed[is_name] = _TYPED_NAME
        value[is_name] = name_ids[values[is_name]]
        for number, text in enumerate(texts):  # a door's class name that is not Unicode text: as for text
            problem = _text_problem(text)
            if problem:
                bad = is_name & (values == number)
                messages.append(f"label {text[:80]!r} {problem}")
                typed[bad] = _TYPED_BAD
                value[bad] = len(messages) - 1
        if options.labels.label_type == "int":
            messages.append("the label is a class name (the source's folder or class tar), not an integer "
                            "(--label-type int)")
            typed[is_name] = _TYPED_BAD
            value[is_name] = len(messages) - 1
    is_int = kinds == INT_LABEL
    typed[is_int] = _TYPED_INT
    value[is_int] = values[is_int]
    integers = typed == _TYPED_INT  # from the source's integers and from text read as one
    if raw.declared_numbering and integers.any():
        # the source numbers its classes (ClassLabel): integer k is its k-th name
        inside = integers & (value >= 0) & (value < len(declared))
        declared_ids = np.array([intern(name) for name in declared], dtype=np.int64)
        value[inside] = declared_ids[value[inside]] if len(declared) else 0
        typed[inside] = _TYPED_NAME
        for row in np.flatnonzero(integers & ~inside & keep).tolist():
            keep[row] = False
            rows.append((row, "unknown-class", f"label {int(value[row])} is outside the {len(declared)} class names "
                                               f"the source declares (ClassLabel)"))
    elif integers.any() and options.labels.label_type == "str":  # every label a class name: 3 is "3"
        distinct, inverse = np.unique(value[integers], return_inverse=True)
        value[integers] = np.array([intern(str(integer)) for integer in distinct.tolist()], dtype=np.int64)[inverse]
        typed[integers] = _TYPED_NAME
    for row in np.flatnonzero((typed == _TYPED_BAD) & keep).tolist():
        keep[row] = False
        rows.append((row, "bad-label", messages[int(value[row])]))

    live_int = np.flatnonzero((typed == _TYPED_INT) & keep)
    live_name = np.flatnonzero((typed == _TYPED_NAME) & keep)
    if len(live_int) and len(live_name):
        first_int, first_name = int(live_int[0]), int(live_name[0])
        raise SourceError(f"labels mix integers (first: {int(value[first_int])}) and class names (first: "
                          f"{names[int(value[first_name])]!r}): {raw.key(first_int)} and {raw.key(first_name)}; "
                          f"use one kind, or pass --label-type str to read every label as a class name",
                          path=raw.empty_path or raw.root)
    unlabeled = (typed == _TYPED_NONE) & keep
    labels = np.full(count, -1, dtype=np.int64)

    if given is not None and len(given) == 0:  # append to a dataset of integer labels
        if len(live_name):
            raise SourceError(f"the dataset has integer labels (no class names), but the source labels its samples "
                              f"by class name (first: {names[int(value[live_name[0]])]!r} at "
                              f"{raw.key(int(live_name[0]))}); label them by integer", path=raw.root)
        labels[live_int] = value[live_int]
        return (), labels, "int" if len(live_int) else "none"

    if given:
        labelless = raw.declared_unlabeled or (not len(live_int) and not len(live_name) and unlabeled.any())
        if labelless and options.new_classes == "reject" and options.labels.classes_origin != APPEND_ORIGIN:
            coco = "; the objects' categories are the 'labels' field" if raw.kind == "coco" else ""
            raise OptionError(f"{options.labels.classes_origin} does not apply to a {_KIND_NAMES.get(raw.kind, raw.kind)} source: its "
                              f"samples have no main label (-1){coco}")
        classes = list(given)
        position = {name: i for i, name in enumerate(classes)}
        if options.new_classes == "extend" and options.labels.label_type == "auto":
            _refuse_integers_as_new_names(raw, names, value, live_name[is_text[live_name]], position)
        if options.new_classes == "extend":
            for name in sorted({names[i] for i in value[live_name].tolist()} - set(position), key=str.encode):
                position[name] = len(classes)
                classes.append(name)
        name_to_label = np.array([position.get(name, -1) for name in names], dtype=np.int64)
        labels[live_name] = name_to_label[value[live_name]] if len(names) else -1
        for row in live_name[labels[live_name] < 0].tolist():
            keep[row] = False
            rows.append((row, "unknown-class", f"class {names[int(value[row])]!r} is not in the class list "
                                               f"({options.labels.classes_origin})"))
        in_range = (value[live_int] >= 0) & (value[live_int] < len(given))
        labels[live_int[in_range]] = value[live_int[in_range]]
        for row in live_int[~in_range].tolist():
            keep[row] = False
            rows.append((row, "unknown-class", f"label {int(value[row])} is outside the {len(given)} classes given "
                                               f"({options.labels.classes_origin})"))
        _reject_unlabeled(raw, unlabeled, keep, rows)
        return tuple(classes), labels, "str"

    if raw.declared_numbering:
        classes = list(declared)
        position = {name: i for i, name in enumerate(classes)}
        name_to_label = np.array([position.get(name, -1) for name in names], dtype=np.int64)
        labels[live_name] = name_to_label[value[live_name]] if len(names) else -1
        for row in live_name[labels[live_name] < 0].tolist():
            keep[row] = False
            rows.append((row, "unknown-class", f"class {names[int(value[row])]!r} is not one of the class names the "
                                               f"source declares (ClassLabel)"))
        if classes:
            _reject_unlabeled(raw, unlabeled, keep, rows)
            return tuple(classes), labels, "str"
        return (), labels, "none"

    if len(live_name):
        found = {names[i] for i in np.unique(value[live_name]).tolist()}
        classes = sorted(found | set(declared), key=str.encode)
        position = {name: i for i, name in enumerate(classes)}
        name_to_label = np.array([position.get(name, -1) for name in names], dtype=np.int64)
        labels[live_name] = name_to_label[value[live_name]]
        _reject_unlabeled(raw, unlabeled, keep, rows)
        return tuple(classes), labels, "str"
    if len(live_int):
        labels[live_int] = value[live_int]
        return (), labels, "int"
    # no label at all: an unlabeled dataset (a folder of only empty class folders lists nothing)
    return (), labels, "none"


def _refuse_integers_as_new_names(raw: RawListing, names: list[str], value: np.ndarray, text_rows: np.ndarray,
                                  known: dict[str, int]) -> None:
    """``append`` (``--label-type auto``) to a dataset with class names: a text label of plain
    digits that is not one of its names would become a new class named like an integer, while a
    build without a class list reads that text as an integer and never mixes it with names. So it
    is refused, as in a build (a dataset built with ``--label-type str`` takes it as a name)."""
    digits = [number for number, name in enumerate(names) if name not in known and STRICT_INT.match(name)]
    if not digits or not len(text_rows):
        return
    found = text_rows[np.isin(value[text_rows], np.asarray(digits, dtype=np.int64))]
    if len(found):
        row = int(found[0])
        name = names[int(value[row])]
        raise SourceError(f"the dataset has class names, but the source labels {raw.key(row)} with the integer "
                          f"{name}: appending would add a class named {name!r}; label the new source by class "
                          f"name (a dataset built with --label-type str reads every label as a name)",
                          path=raw.empty_path or raw.root)


def _reject_unlabeled(raw: RawListing, unlabeled: np.ndarray, keep: np.ndarray,
                      rows: list[tuple[int, str, str]]) -> None:
    for row in np.flatnonzero(unlabeled & keep).tolist():
        keep[row] = False
        rows.append((row, "unlabeled", "the sample has no label, and this build's labels are class names (-1 is no "
                                       "class)"))


_KIND_NAMES = {"coco": "COCO", "webdataset": "WebDataset", "parquet": "Parquet"}
