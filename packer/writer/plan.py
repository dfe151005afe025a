"""The shard plan: which listed file goes to which shard, in which order, fixed before packing.

The plan is a pure function of the source listing and the build options (seed included). It is
saved in the output's staging folder as a column file (magic ``PKPLAN``), so every part of a
split build (``--part K/N``), a resumed build and the final ``--finish`` step work from the same
bytes. Its fingerprint (the xxh3 of the file) is stamped on every finished shard record, so
parts built from a different plan are refused instead of mixed.

Shards are filled greedily in pack order by the files' listed sizes, each sample rounded up to
the alignment: a shard closes before the sample that would push it over the target size, and a
sample larger than the target gets a shard of its own. Planned shard ``i`` is written with
``shard_number = i``; a planned shard whose every file is rejected is simply absent.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import format as fmt
from ..imageinfo import DEFAULT_MAX_PIXELS
from .atomic import write_atomic
from ..classes import load_class_list
from ..errors import BuildError, DatasetChangedError, FormatError, OptionError, PackerError
from ..sources.members import members_columns, members_from_columns, members_header
from ..fields import FieldSpec, check_declarations, parse_field_option, specs_from_json
from ..sources.fieldvalues import FieldTable
from ..sources import Rejection, SourceListing, check_label_type

__all__ = ["BuildOptions", "BuildPlan", "make_plan", "plan_shards", "save_plan", "load_plan",
           "DEFAULT_SHARD_SIZE", "DEFAULT_MAX_FILE_SIZE"]

#: Default target shard size: large enough for GPUDirect-sized reads and few files, small
#: enough that a damaged or re-built shard is cheap to replace.
DEFAULT_SHARD_SIZE = 512 << 20
#: Default per-file size cap: far above any real photo or scan (a 150 Mpx 16-bit PNG is under
#: 1 GiB), low enough that one sparse or runaway file cannot exhaust a worker's memory.
DEFAULT_MAX_FILE_SIZE = 1 << 30


@dataclass(frozen=True)
class BuildOptions:
    """Everything that changes the bytes of a build (and nothing that does not, like workers)."""

    alignment: int = fmt.DEFAULT_ALIGNMENT
    shard_size: int = DEFAULT_SHARD_SIZE
    shuffle: bool = True
    seed: int = 0
    codec: str = "passthrough"
    validate: str = "header"
    max_pixels: int = DEFAULT_MAX_PIXELS
    #: A fixed class list (label i is classes[i]), or None to number the classes found. Also
    #: accepts what ``--classes`` does (a file of names, or ``"a,b,c"``), read once here.
    classes: tuple[str, ...] | None = None
    #: How manifest labels are read: "auto", "int" or "str" (see ``sources.LABEL_TYPES``).
    label_type: str = "auto"
    max_file_size: int = DEFAULT_MAX_FILE_SIZE
    normalize_formats: bool = False  # convert images not in JPEG/PNG/WEBP to PNG (pillowformats)
    #: Declared fields (packer/fields.py), as manifest-style declarations; also accepts
    #: ``--field`` strings and ``FieldSpec`` objects, normalised here.
    fields: tuple[dict[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if self.fields:
            object.__setattr__(self, "fields", tuple(_field_declaration(item) for item in self.fields))
        if isinstance(self.classes, list):  # from JSON (a saved plan, a manifest's build options)
            object.__setattr__(self, "classes", tuple(self.classes))
        elif isinstance(self.classes, (str, os.PathLike)):
            object.__setattr__(self, "classes", load_class_list(self.classes))

    def to_json(self) -> dict[str, Any]:
        document = asdict(self)
        # Options added later are written only when set: a dataset built before they existed
        # records the same options as one built now with the defaults (so --resume matches it).
        if document["classes"] is None:
            del document["classes"]
        else:
            document["classes"] = list(document["classes"])
        if document["label_type"] == "auto":
            del document["label_type"]
        if not document["normalize_formats"]:
            del document["normalize_formats"]
        if document["fields"]:
            document["fields"] = [dict(item) for item in document["fields"]]
        else:
            del document["fields"]
        return document

    @property
    def field_specs(self) -> tuple[FieldSpec, ...]:
        """The declared fields as ``FieldSpec`` objects (before listing: a ``classes`` field
        without names has no class list yet)."""
        return specs_from_json(self.fields)

    def check(self) -> "BuildOptions":
        """Refuse impossible options before anything is written (exit code 2, like any usage error).

        Raises:
            OptionError: naming the option and what is allowed.
        """
        from ..codecs import get_codec

        try:
            fmt.check_alignment(self.alignment)  # the format's rule, one place
        except FormatError as exc:
            raise OptionError(f"--{exc.message}") from None  # "--alignment must be a power of two ..."
        if not isinstance(self.shard_size, int) or not self.alignment <= self.shard_size < fmt.MAX_FILE_SIZE:
            raise OptionError(f"--shard-size must be at least the alignment ({self.alignment} bytes) and below "
                              f"2^62, got {self.shard_size}")
        if not isinstance(self.max_pixels, int) or self.max_pixels < 1:
            raise OptionError(f"--max-pixels must be a positive number of pixels, got {self.max_pixels}")
        if (not isinstance(self.max_file_size, int) or isinstance(self.max_file_size, bool)
                or not 1 <= self.max_file_size < fmt.MAX_FILE_SIZE):
            raise OptionError(f"--max-file-size must be between 1 byte and 2^62, got {self.max_file_size}")
        if not isinstance(self.normalize_formats, bool):
            raise OptionError(f"normalize_formats must be True or False, got {self.normalize_formats!r}")
        if self.validate not in ("header", "full"):
            raise OptionError(f"--validate must be 'header' or 'full', got {self.validate!r}")
        get_codec(self.codec)  # an unknown codec, option or value is an OptionError naming it
        check_label_type(self.label_type)
        if self.classes is not None:
            load_class_list(self.classes)  # refuses an empty list, duplicates, non-strings
        check_declarations(self.field_specs)
        return self


def _field_declaration(item: Any) -> dict[str, Any]:
    """One entry of ``BuildOptions.fields`` as its canonical declaration."""
    if isinstance(item, str):
        return parse_field_option(item).to_json()
    if isinstance(item, FieldSpec):
        return item.to_json()
    if isinstance(item, dict):
        return specs_from_json([item])[0].to_json()
    raise OptionError(f"a field is declared by a --field string, a FieldSpec or a declaration object, "
                      f"got {item!r}")


@dataclass
class BuildPlan:
    """A listing, the options, the pack order and the planned shard boundaries."""

    listing: SourceListing
    options: BuildOptions
    order: np.ndarray          # int64 listing indices, in pack order
    shard_starts: np.ndarray   # int64 positions in ``order`` where planned shard i starts; len = shards + 1
    fingerprint: int = 0       # xxh3 of the saved plan file (0 until saved or loaded)
    source: str = ""           # how the source was given (informative)
    first_shard_number: int = 0  # planned shard i is written as shard number first + i (append continues)

    @property
    def shard_count(self) -> int:
        return len(self.shard_starts) - 1

    def shard_members(self, shard: int) -> np.ndarray:
        """Listing indices of planned shard ``shard``, in pack order."""
        return self.order[self.shard_starts[shard]:self.shard_starts[shard + 1]]


def plan_shards(sizes: np.ndarray, alignment: int, shard_size: int) -> np.ndarray:
    """Greedy shard boundaries over ``sizes`` (already in pack order); returns starts, len = shards + 1.

    O(shards * log n) with a cumulative sum, so ten million entries plan in well under a second.
    """
    count = len(sizes)
    if count == 0:
        return np.zeros(1, dtype=np.int64)
    padded = (sizes.astype(np.uint64) + np.uint64(alignment - 1)) & np.uint64(~(alignment - 1) & (2**64 - 1))
    cumulative = np.cumsum(padded, dtype=np.uint64)
    capacity = max(shard_size - fmt.shard_data_offset(alignment), 1)
    starts = [0]
    start = 0
    while start < count:
        before = int(cumulative[start - 1]) if start else 0
        # np.uint64 needle: a Python int would make numpy convert the whole array on every call.
        end = int(np.searchsorted(cumulative, np.uint64(before + capacity), side="right"))
        end = max(end, start + 1)  # an oversize sample gets a shard of its own
        starts.append(end)
        start = end
    return np.asarray(starts, dtype=np.int64)


def make_plan(listing: SourceListing, options: BuildOptions, *, source: str = "",
              first_shard_number: int = 0) -> BuildPlan:
    """Order the listing (a seeded permutation unless ``shuffle`` is off) and cut it into shards."""
    fmt.check_alignment(options.alignment)
    if options.shard_size < options.alignment:
        raise BuildError(f"shard size {options.shard_size} is smaller than the alignment {options.alignment}")
    count = len(listing)
    if options.shuffle:
        order = np.random.Generator(np.random.PCG64(options.seed)).permutation(count).astype(np.int64)
    else:
        order = np.arange(count, dtype=np.int64)
    from ..codecs import get_codec  # a re-encoding codec changes payload sizes: plan by its estimate

    estimated = get_codec(options.codec).estimate_sizes(listing.sizes[order])
    starts = plan_shards(estimated, options.alignment, options.shard_size)
    return BuildPlan(listing=listing, options=options, order=order, shard_starts=starts, source=source,
                     first_shard_number=first_shard_number)


def _plan_header(plan: BuildPlan) -> bytes:
    header = {
        "options": plan.options.to_json(),
        "kind": plan.listing.kind,
        "classes": list(plan.listing.classes),
        "rejected": [r.to_json() for r in plan.listing.rejected],
        "source": plan.source,
        "first_shard_number": plan.first_shard_number,
        "label_type": plan.listing.label_type,
        "warnings": plan.listing.warnings,
    }
    if plan.listing.members is not None:  # an archive source: where its members live
        header["members"] = members_header(plan.listing.members)
    if plan.listing.fields is not None:  # the final declarations (a classes field's names)
        header["fields"] = [spec.to_json() for spec in plan.listing.fields.specs]
    # ASCII with \u escapes: a rejected key may hold a lone surrogate (a COCO file_name escaping a
    # non-UTF-8 byte), which strict UTF-8 encoding refuses; json.loads gives back the same str.
    return json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def save_plan(plan: BuildPlan, path: Path) -> int:
    """Write the plan atomically to ``path``; returns (and records) its fingerprint."""
    listing = plan.listing
    columns = {
        "key_offsets": listing.key_offsets, "keys": listing.key_blob,
        "sizes": listing.sizes, "labels": listing.labels,
        "meta_offsets": listing.meta_offsets, "meta": listing.meta_blob,
        "order": plan.order.astype(np.uint64), "shard_starts": plan.shard_starts.astype(np.uint64),
        "header": np.frombuffer(_plan_header(plan), dtype=np.uint8),
    }
    if len(listing.stamps) == len(listing.sizes):
        columns["stamps"] = listing.stamps
    if listing.members is not None:
        columns.update(members_columns(listing.members))
    if listing.fields is not None:
        columns.update(listing.fields.plan_columns())
    pieces = fmt.encode_column_file(fmt.PLAN_MAGIC, len(listing), columns)
    plan.fingerprint = write_atomic(path, pieces)  # a full disk leaves no partial plan behind
    return plan.fingerprint


def load_plan(path: Path, root: Path) -> BuildPlan:
    """Read a saved plan (validated like any packer file: it may be stale or damaged)."""
    from ..files import read_capped

    try:
        # Inside OUT, a regular file (a FIFO planted here must not hang --resume), bounded.
        data = read_capped(path.parent, path.name, fmt.MAX_FILE_SIZE)
    except DatasetChangedError:  # files.open_inside's word for a missing file: here, no saved plan
        raise BuildError("cannot read the build plan: No such file or directory", path=path) from None
    except PackerError as exc:
        raise BuildError(f"cannot read the build plan: {exc.message}", path=path) from None
    try:
        rows, columns = fmt.parse_column_file(data, fmt.PLAN_MAGIC, path=path, kind="plan")
        header = json.loads(columns["header"].tobytes())
        options = BuildOptions(**header["options"])
        listing = SourceListing(
            root=root, kind=header["kind"], classes=tuple(header["classes"]),
            key_blob=columns["keys"], key_offsets=columns["key_offsets"], sizes=columns["sizes"],
            labels=columns["labels"], meta_blob=columns["meta"], meta_offsets=columns["meta_offsets"],
            rejected=[Rejection(**r) for r in header["rejected"]],
            label_type=header.get("label_type", "str"), warnings=list(header.get("warnings", [])),
            stamps=columns.get("stamps", np.zeros(0, dtype=np.uint64)),
            members=members_from_columns(columns, header.get("members")))
        if "fields" in header:
            listing.fields = FieldTable.from_plan_columns(specs_from_json(header["fields"]), columns, rows)
        order = columns["order"].astype(np.int64)
        starts = columns["shard_starts"].astype(np.int64)
    except PackerError as exc:
        raise BuildError(f"the saved build plan is damaged ({exc}); delete {path.parent} to start over",
                         path=path) from None
    except (KeyError, TypeError, ValueError, OptionError) as exc:
        raise BuildError(f"the saved build plan is unusable ({exc!r}); delete {path.parent} to start over",
                         path=path) from None
    n = len(listing.sizes)
    if (rows != n or len(order) != n or len(listing.key_offsets) != n + 1 or len(listing.labels) != n
            or len(listing.stamps) not in (0, n)
            or len(starts) < 1 or starts[0] != 0 or starts[-1] != n or np.any(np.diff(starts) < 0)
            or (n and (order.min() < 0 or order.max() >= n))):
        raise BuildError(f"the saved build plan is inconsistent; delete {path.parent} to start over", path=path)
    return BuildPlan(listing=listing, options=options, order=order, shard_starts=starts,
                     fingerprint=fmt.checksum(data), source=header.get("source", ""),
                     first_shard_number=int(header.get("first_shard_number", 0)))
