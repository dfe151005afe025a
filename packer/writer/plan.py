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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import format as fmt
from .._internal.atomic import write_atomic
from ..errors import BuildError, DatasetChangedError, OptionError, PackerError
from ..sources.members import members_columns, members_from_columns, members_header
from ..fields import specs_from_json
from ..sources.fieldvalues import FieldTable
from ..sources import Rejection, SourceListing, SourceSettings
from .settings import ALIGNMENT_AUTO, DEFAULT_MAX_FILE_SIZE, DEFAULT_SHARD_SIZE, BuildOptions, BuildSettings

__all__ = ["BuildOptions", "BuildPlan", "make_plan", "plan_shards", "choose_alignment", "SMALL_RECORD_ALIGNMENTS", "save_plan", "load_plan",
           "DEFAULT_SHARD_SIZE", "DEFAULT_MAX_FILE_SIZE"]

@dataclass
class BuildPlan:
    """A listing, the build settings, the pack order and the planned shard boundaries."""

    listing: SourceListing
    settings: BuildSettings    # with the source kind as detected (the listing's)
    order: np.ndarray          # int64 listing indices, in pack order
    shard_starts: np.ndarray   # int64 positions in ``order`` where planned shard i starts; len = shards + 1
    #: The dataset's alignment: ``settings.layout.alignment``, or what ``choose_alignment`` made of
    #: ``"auto"`` (settings keep what was asked, so a resume asking ``"auto"`` again matches).
    alignment: int
    fingerprint: int = 0       # xxh3 of the saved plan file (0 until saved or loaded)
    source: str = ""           # how the source was given (informative)
    first_shard_number: int = 0  # planned shard i is written as shard number first + i (append continues)
    #: A spread of the source's files and their sizes (``probes.source_probes``): the finished
    #: dataset records them, so ``--resume`` on it tells this source from another. None: not taken.
    source_probes: dict[str, int] | None = field(default=None)

    @property
    def shard_count(self) -> int:
        return len(self.shard_starts) - 1

    def shard_members(self, shard: int) -> np.ndarray:
        """Listing indices of planned shard ``shard``, in pack order."""
        return self.order[self.shard_starts[shard]:self.shard_starts[shard + 1]]


#: The alignments ``"auto"`` chooses from, largest first: a 4 KiB page (every sample one aligned
#: O_DIRECT / GPUDirect read), a cache line, a word, none. Runs of small records are still read
#: as whole pages (formats/SPEC.md §3.4).
SMALL_RECORD_ALIGNMENTS = (fmt.DEFAULT_ALIGNMENT, 64, 8, 1)
#: ``"auto"`` keeps an alignment while its padding is at most this share of the payload bytes.
MAX_PADDING_SHARE = 1 / 16


def choose_alignment(sizes: np.ndarray, shard_size: int) -> int:
    """The alignment ``"auto"`` gives payloads of these sizes (formats/SPEC.md §3.4).

    The largest of ``SMALL_RECORD_ALIGNMENTS`` (and at most ``shard_size``) whose padding, summed
    over every sample, is at most 1/16 of the payload bytes: ~100 KB photos keep 4096 (2 % of
    padding), 32x32 raw pixels (3,072 bytes) and 2 KB PNGs get 64, records of a few hundred
    bytes 8. A pure function of the sizes, so every part of a split build and a resume choose
    the same; an empty listing keeps 4096.
    """
    sizes = np.asarray(sizes, dtype=np.uint64)
    payload = int(sizes.sum(dtype=np.uint64))
    for alignment in SMALL_RECORD_ALIGNMENTS[:-1]:  # the last, 1, pads nothing: where the others fail
        if alignment > shard_size:
            continue
        padding = int((-sizes % np.uint64(alignment)).sum(dtype=np.uint64))
        if padding <= payload * MAX_PADDING_SHARE:
            return alignment
    return SMALL_RECORD_ALIGNMENTS[-1]


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


def make_plan(listing: SourceListing, settings: BuildSettings, *, source: str = "",
              first_shard_number: int = 0, source_probes: dict[str, int] | None = None,
              existing: Any = None) -> BuildPlan:
    """Order the listing (a seeded permutation unless ``shuffle`` is off) and cut it into shards.

    The plan records ``settings`` with the listing's kind (the door that listed it). With
    ``checks.reject_duplicates``, files whose bytes an earlier file (or a sample of ``existing``,
    the open dataset an append extends) has are rejected first (``writer.dedupe``): every door
    plans through here, so every door applies it."""
    layout = settings.layout
    if layout.alignment != ALIGNMENT_AUTO:
        fmt.check_alignment(layout.alignment)
        if layout.shard_size < layout.alignment:
            raise BuildError(f"shard size {layout.shard_size} is smaller than the alignment {layout.alignment}")
    if settings.checks.reject_duplicates:
        from .dedupe import reject_duplicate_content

        listing = reject_duplicate_content(listing, max_file_size=settings.checks.max_file_size, existing=existing)
    count = len(listing)
    if layout.shuffle:
        order = np.random.Generator(np.random.PCG64(layout.seed)).permutation(count).astype(np.int64)
    else:
        order = np.arange(count, dtype=np.int64)
    from ..codecs import get_codec  # a re-encoding codec changes payload sizes: plan by its estimate

    estimated = get_codec(settings.codec).estimate_sizes(listing.sizes[order])
    alignment = (choose_alignment(estimated, layout.shard_size) if layout.alignment == ALIGNMENT_AUTO
                 else layout.alignment)
    starts = plan_shards(estimated, alignment, layout.shard_size)
    return BuildPlan(listing=listing, settings=settings.detected(listing.kind), order=order, shard_starts=starts,
                     alignment=alignment,
                     source=source, first_shard_number=first_shard_number, source_probes=source_probes)


def _plan_header(plan: BuildPlan) -> bytes:
    header = {
        "settings": plan.settings.to_json(),
        "kind": plan.listing.kind,
        "classes": list(plan.listing.classes),
        "rejected": [r.to_json() for r in plan.listing.rejected],
        "source": plan.source,
        "first_shard_number": plan.first_shard_number,
        "alignment": plan.alignment,
        "label_type": plan.listing.label_type,
        "warnings": plan.listing.warnings,
    }
    if plan.listing.class_order is not None:  # how the class names were numbered (the build's summary says)
        header["class_order"] = plan.listing.class_order
    if plan.source_probes is not None:
        header["source_probes"] = plan.source_probes
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
    plan.fingerprint = write_atomic(path, pieces).digest  # a full disk leaves no partial plan behind
    return plan.fingerprint


def load_plan(path: Path, root: Path, *, source: SourceSettings | None = None) -> BuildPlan:
    """Read a saved plan (validated like any packer file: it may be stale or damaged).

    Args:
        root: the folder the listing's keys are relative to (``sources.source_root`` of the
            source given to this run and the plan's kind).
        source: the source settings asked now: a plan saved before the source settings were
            recorded (flat ``options``) takes the door options from here.
    """
    from .._internal.files import read_capped

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
        if "settings" in header:
            settings = BuildSettings.from_json(header["settings"])
        else:  # a plan saved by packer 0.1: flat options, the kind beside them
            settings = BuildSettings.from_json(fmt.regroup_build_options(header["options"]),
                                               unrecorded_source=source)
            unknown = set(header["options"]) - set(fmt.LEGACY_OPTION_GROUPS)
            if unknown:
                raise OptionError(f"unknown options {sorted(unknown)}")
        settings = settings.detected(header["kind"])
        probes = header.get("source_probes")
        listing = SourceListing(
            root=root, kind=header["kind"], classes=tuple(header["classes"]),
            key_blob=columns["keys"], key_offsets=columns["key_offsets"], sizes=columns["sizes"],
            labels=columns["labels"], meta_blob=columns["meta"], meta_offsets=columns["meta_offsets"],
            rejected=[Rejection(**r) for r in header["rejected"]],
            label_type=header.get("label_type", "str"), warnings=list(header.get("warnings", [])),
            class_order=header.get("class_order") if isinstance(header.get("class_order"), str) else None,
            stamps=columns.get("stamps", np.zeros(0, dtype=np.uint64)),
            members=members_from_columns(columns, header.get("members")))
        if "fields" in header:
            listing.fields = FieldTable.from_plan_columns(specs_from_json(header["fields"]), columns, rows)
        order = columns["order"].astype(np.int64)
        starts = columns["shard_starts"].astype(np.int64)
        # what "auto" chose (a plan saved before "auto" existed has the number in its settings)
        alignment = fmt.check_alignment(header.get("alignment", settings.layout.alignment), path=path)
    except OptionError as exc:  # (a PackerError: before the clause below) the saved settings do not parse
        raise BuildError(f"the saved build plan is unusable ({exc!r}); delete {path.parent} to start over",
                         path=path) from None
    except PackerError as exc:
        raise BuildError(f"the saved build plan is damaged ({exc}); delete {path.parent} to start over",
                         path=path) from None
    except (KeyError, TypeError, ValueError) as exc:
        raise BuildError(f"the saved build plan is unusable ({exc!r}); delete {path.parent} to start over",
                         path=path) from None
    n = len(listing.sizes)
    if (rows != n or len(order) != n or len(listing.key_offsets) != n + 1 or len(listing.labels) != n
            or len(listing.stamps) not in (0, n)
            or len(starts) < 1 or starts[0] != 0 or starts[-1] != n or np.any(np.diff(starts) < 0)
            or (n and (order.min() < 0 or order.max() >= n))):
        raise BuildError(f"the saved build plan is inconsistent; delete {path.parent} to start over", path=path)
    return BuildPlan(listing=listing, settings=settings, order=order, shard_starts=starts, alignment=alignment,
                     fingerprint=fmt.checksum(data), source=header.get("source", ""),
                     first_shard_number=int(header.get("first_shard_number", 0)),
                     source_probes=probes if isinstance(probes, dict) else None)
