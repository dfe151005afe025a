"""``find_duplicates``: exact and near-duplicate groups within and across datasets, and the report.

One call does the whole job: open each dataset (a folder or a URL), group exact duplicates by the
index's xxh3 and confirm them by bytes (``exact``), load or compute each dataset's perceptual
hashes (``sidecar``, ``phash``), find the pairs within the threshold in all datasets at once
(``search``), and join pairs into groups (connected components). A group with members in two
datasets is a *leak* (a test image with a copy in training); leaks come first.

The report is the one value later tools take: ``DuplicateReport.drop(name)`` says which sample
numbers of one dataset to leave out so that none of its samples has a duplicate in the others (a
view excluding the leaked samples), and ``DuplicateReport.redundant(name)`` which samples repeat an
earlier one of the same dataset (keeping the first of each group).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ..errors import OptionError
from .exact import exact_groups
from .phash import ALGORITHM_NAME, HASH_BITS, HASHED, HashTable
from .search import MAX_EXACT, Pairs, near_pairs

__all__ = ["DEFAULT_THRESHOLD", "REPORT_VERSION", "Member", "DuplicateGroup", "DuplicateReport", "find_duplicates"]

#: Bits of 128 two images may differ in and still be near-duplicates. Chosen on the benchmark
#: corpus (benchmarks/bench_duplicates.py; docs/guides/duplicates.md has the curve): the
#: smallest threshold at the best recall before precision drops (recall 0.977, precision 0.994).
DEFAULT_THRESHOLD = 20
#: Version of the report's JSON layout (``duplicates.version``).
REPORT_VERSION = 1


@dataclass(frozen=True, order=True)
class Member:
    """One sample of one dataset: its position in ``DuplicateReport.datasets`` and its number."""

    dataset: int
    sample: int


@dataclass(frozen=True)
class DuplicateGroup:
    """Samples that are copies of each other.

    Attributes:
        kind: ``"exact"`` (byte-identical) or ``"near"`` (perceptual hashes within the threshold).
        members: sorted.
        pairs: the pairs that joined the group: ``(a, b, distance, mirrored)`` with ``a``, ``b``
            indices into ``members`` (an exact group lists none: every member equals every other).
    """

    kind: str
    members: tuple[Member, ...]
    pairs: tuple[tuple[int, int, int, bool], ...] = ()

    @property
    def datasets(self) -> tuple[int, ...]:
        """The datasets the group touches, sorted."""
        return tuple(sorted({m.dataset for m in self.members}))

    @property
    def leak(self) -> bool:
        """Whether the group crosses datasets (a copy in another split)."""
        return len(self.datasets) > 1


@dataclass
class DatasetEntry:
    """A dataset of the report: its name (unique in the report), location and size, its labels
    and class names (for the per-class counts), and where its hashes came from."""

    name: str
    location: str
    samples: int
    hashes: dict[str, int] = field(default_factory=dict)
    hashes_source: str = "not computed"
    labels: np.ndarray | None = None
    classes: tuple[str, ...] = ()
    #: The keys of the samples in some group (read before the dataset is closed).
    keys: dict[int, str] = field(default_factory=dict)

    def class_of(self, sample: int) -> str:
        label = int(self.labels[sample]) if self.labels is not None else -1
        if 0 <= label < len(self.classes):
            return self.classes[label]
        return "unlabeled" if label < 0 else f"label {label}"


@dataclass
class DuplicateReport:
    """What ``find_duplicates`` found.

    Attributes:
        datasets: the datasets compared, in the order given (the first is "the dataset", the others
            what it was checked ``against``).
        groups: leaks first, then larger groups, then by first member.
        threshold, flips, near: the settings of the search.
    """

    datasets: list[DatasetEntry]
    groups: list[DuplicateGroup]
    threshold: int
    flips: bool
    near: bool

    def position(self, name: str | int) -> int:
        """A dataset's position from its name (or position).

        Raises:
            OptionError: no dataset of the report has that name.
        """
        if isinstance(name, (int, np.integer)) and not isinstance(name, bool):
            if 0 <= name < len(self.datasets):
                return int(name)
        else:
            for position, entry in enumerate(self.datasets):
                if entry.name == name:
                    return position
        raise OptionError(f"no dataset {name!r} in the report; its datasets are "
                          f"{[entry.name for entry in self.datasets]}")

    def drop(self, name: str | int, against: Iterable[str | int] | None = None) -> np.ndarray:
        """Sample numbers of dataset ``name`` that have a copy (exact or near) in another dataset
        of the report (or only in those named by ``against``): what a view leaves out so that
        ``name`` shares no image with them. Sorted int64."""
        mine = self.position(name)
        others = ({self.position(o) for o in against} if against is not None
                  else set(range(len(self.datasets)))) - {mine}
        found = {m.sample for group in self.groups if mine in group.datasets and others & set(group.datasets)
                 for m in group.members if m.dataset == mine}
        return np.array(sorted(found), dtype=np.int64)

    def redundant(self, name: str | int, *, kinds: tuple[str, ...] = ("exact",)) -> dict[int, int]:
        """Samples of dataset ``name`` that repeat an earlier sample of the same dataset, each
        mapped to the sample kept (the group's smallest number in that dataset). By default exact
        copies only (what a build refuses as ``duplicate-content``)."""
        mine = self.position(name)
        repeats: dict[int, int] = {}
        for group in self.groups:
            if group.kind not in kinds:
                continue
            numbers = sorted(m.sample for m in group.members if m.dataset == mine)
            for number in numbers[1:]:
                repeats.setdefault(number, numbers[0])
        return dict(sorted(repeats.items()))

    # --- counts and JSON ---
    def counts(self) -> dict[str, Any]:
        """Groups, pairs and samples per kind; per pair of datasets (a dataset with itself
        included); per class."""
        by_kind = {kind: {"groups": 0, "pairs": 0, "samples": 0} for kind in ("exact", "near")}
        by_split: dict[tuple[int, int], dict[str, int]] = {}
        by_class: dict[str, dict[str, int]] = {}
        for group in self.groups:
            entry = by_kind[group.kind]
            entry["groups"] += 1
            entry["samples"] += len(group.members)
            for a, b in _group_pairs(group):
                entry["pairs"] += 1
                first, second = sorted((group.members[a].dataset, group.members[b].dataset))
                split = by_split.setdefault((first, second), {"exact_pairs": 0, "near_pairs": 0})
                split[f"{group.kind}_pairs"] += 1
            for member in group.members:
                name = self.datasets[member.dataset].class_of(member.sample)
                per = by_class.setdefault(name, {"exact": 0, "near": 0, "leaked": 0})
                per[group.kind] += 1
                per["leaked"] += int(group.leak)
        splits = [{"a": self.datasets[a].name, "b": self.datasets[b].name, **numbers}
                  for (a, b), numbers in sorted(by_split.items(), key=lambda item: (item[0][0] == item[0][1], item[0]))]
        leaks = [g for g in self.groups if g.leak]
        return {"exact": by_kind["exact"], "near": by_kind["near"],
                "leaks": {"groups": len(leaks), "samples": {entry.name: int(len(self.drop(p)))
                                                            for p, entry in enumerate(self.datasets)}
                          if len(self.datasets) > 1 else {}},
                "by_split_pair": splits, "by_class": dict(sorted(by_class.items()))}

    def to_json(self, *, groups_shown: int | None = None) -> dict[str, Any]:
        """The report as one JSON-ready dict (``packer inspect --duplicates --json``)."""
        shown = self.groups if groups_shown is None else self.groups[:groups_shown]
        return {
            "version": REPORT_VERSION, "algorithm": ALGORITHM_NAME, "hash_bits": HASH_BITS,
            "threshold": self.threshold, "exact_search_up_to": MAX_EXACT, "flips": self.flips, "near": self.near,
            "datasets": [{"name": e.name, "location": e.location, "samples": e.samples, "hashes": e.hashes,
                          "hashes_source": e.hashes_source} for e in self.datasets],
            "counts": self.counts(),
            "groups": [self._group_json(g) for g in shown],
            "groups_total": len(self.groups), "groups_shown": len(shown),
        }

    def describe(self, member: Member) -> dict[str, Any]:
        """One member as the report shows it: dataset name, sample, key, label and class."""
        entry = self.datasets[member.dataset]
        label = int(entry.labels[member.sample]) if entry.labels is not None else -1
        key = entry.keys.get(member.sample)
        return {"dataset": entry.name, "sample": member.sample, "key": key, "label": label,
                "class": entry.class_of(member.sample)}

    def _group_json(self, group: DuplicateGroup) -> dict[str, Any]:
        return {"kind": group.kind, "leak": group.leak, "members": [self.describe(m) for m in group.members],
                "pairs": [{"a": a, "b": b, "distance": d, "mirrored": m} for a, b, d, m in group.pairs]}

    def format_text(self, *, groups_shown: int = 20) -> str:
        """The report for people (``packer inspect --duplicates``)."""
        counts = self.counts()
        lines = [f"duplicates among {', '.join(f'{e.name} ({e.samples:,} samples)' for e in self.datasets)}"]
        near = (f"near: perceptual hashes within {self.threshold} of {HASH_BITS} bits"
                f"{', mirror images included' if self.flips else ''}" if self.near else "near: not searched")
        lines.append(f"  exact: byte-identical (xxh3, then bytes compared); {near}")
        for e in self.datasets:
            hashes = ", ".join(f"{n:,} {k}" for k, n in e.hashes.items() if n) or "none"
            lines.append(f"  {e.name}: hashes {hashes} ({e.hashes_source})" if self.near else f"  {e.name}")
        for kind in ("exact", "near"):
            c = counts[kind]
            lines.append(f"{kind:>5}: {c['groups']:,} group(s), {c['pairs']:,} pair(s), {c['samples']:,} sample(s)")
        if len(self.datasets) > 1:
            leaked = ", ".join(f"{name}: {n:,}" for name, n in counts["leaks"]["samples"].items())
            lines.append(f"leaks: {counts['leaks']['groups']:,} group(s) across datasets; samples with a copy "
                         f"in another dataset: {leaked}")
        for split in counts["by_split_pair"]:
            lines.append(f"  {split['a']} ~ {split['b']}: {split['exact_pairs']:,} exact, {split['near_pairs']:,} "
                         f"near pair(s)")
        for group in self.groups[:groups_shown]:
            tag = "LEAK " if group.leak else ""
            lines.append(f"{tag}{group.kind} group of {len(group.members)}:")
            for member in group.members:
                d = self.describe(member)
                lines.append(f"    {d['dataset']}[{d['sample']}] {d['key']} ({d['class']})")
            for a, b, distance, mirrored in group.pairs[:10]:
                lines.append(f"    {a} ~ {b}: {distance} bit(s){' (mirrored)' if mirrored else ''}")
        if len(self.groups) > groups_shown:
            lines.append(f"... {len(self.groups) - groups_shown:,} more group(s): --json lists every one")
        return "\n".join(lines)


def _group_pairs(group: DuplicateGroup) -> list[tuple[int, int]]:
    """The pairs a group counts: every pair of an exact group, the joining pairs of a near one."""
    if group.kind == "exact":
        n = len(group.members)
        return [(a, b) for a in range(n) for b in range(a + 1, n)]
    return [(a, b) for a, b, _, _ in group.pairs]


def _names(locations: Sequence[str]) -> list[str]:
    """Short unique names: each dataset's folder name, or more of its path where two collide."""
    parts = [[p for p in str(loc).rstrip("/").replace("\\", "/").split("/") if p] or [str(loc)] for loc in locations]
    depth = [1] * len(parts)
    while True:
        names = ["/".join(p[-d:]) for p, d in zip(parts, depth)]
        clash = {n for n in names if names.count(n) > 1}
        if not clash:
            return names
        grown = False
        for k, n in enumerate(names):
            if n in clash and depth[k] < len(parts[k]):
                depth[k] += 1
                grown = True
        if not grown:
            return [f"{n}#{k}" if n in clash else n for k, n in enumerate(names)]


def find_duplicates(dataset: Any, against: Sequence[Any] | Mapping[str, Any] = (), *,
                    threshold: int = DEFAULT_THRESHOLD, flips: bool = False, near: bool = True,
                    workers: int | None = None, progress: bool = False, store_hashes: bool = True,
                    remote: Any = None) -> DuplicateReport:
    """Exact and near-duplicate groups within ``dataset`` and across it and ``against``.

    Args:
        dataset: a dataset folder, URL or open ``Dataset``.
        against: other datasets (e.g. the validation and test splits), or a mapping of name to
            dataset; their copies of ``dataset``'s samples are leaks.
        threshold: near-duplicates differ in at most this many of the 128 hash bits.
        flips: also count a horizontally mirrored copy as a near-duplicate (off by default:
            mirror images of different photos of symmetric scenes cost precision; turn it on
            when training augments with flips, where a mirrored test image is a leak).
        near: look for near-duplicates at all (``False``: exact copies only, no image decoded).
        workers: threads decoding images when hashes are computed, and searching (default: the
            usable cores).
        progress: a bar on stderr while hashing.
        store_hashes: keep computed hashes beside each index for the next run.
        remote: ``RemoteOptions`` (or a dict) for datasets at URLs.

    Returns:
        A ``DuplicateReport``.

    Raises:
        OptionError: a threshold outside 0..128.
        PackerError: a dataset cannot be opened or read.
    """
    from ..dataset import Dataset, open_dataset
    from .._internal.machine import available_cpus
    from .sidecar import load_or_compute

    if isinstance(threshold, bool) or not isinstance(threshold, (int, np.integer)) or not 0 <= threshold <= HASH_BITS:
        raise OptionError(f"threshold must be a number of bits from 0 to {HASH_BITS}, got {threshold!r}")
    items = list(against.items()) if isinstance(against, Mapping) else [(None, other) for other in against]
    given = [(None, dataset)] + items
    opened: list[Any] = []
    owned: list[Any] = []
    try:
        for _, item in given:
            if isinstance(item, Dataset):
                opened.append(item)
            else:
                ds = open_dataset(os.fspath(item) if isinstance(item, Path) else item, remote=remote)
                opened.append(ds)
                owned.append(ds)
        names = _names([ds.location for ds in opened])
        names = [name if name is not None else auto for (name, _), auto in zip(given, names)]
        if len(set(names)) != len(names):
            raise OptionError(f"dataset names must be unique, got {names}")
        entries = [DatasetEntry(name=n, location=ds.location, samples=len(ds), labels=np.asarray(ds.labels),
                                classes=tuple(ds.classes)) for n, ds in zip(names, opened)]
        groups = [DuplicateGroup("exact", tuple(Member(p, s) for p, s in members))
                  for members in exact_groups(opened)]
        if near:
            tables: list[HashTable] = []
            for entry, ds in zip(entries, opened):
                table, source = load_or_compute(ds, workers=workers or available_cpus(), progress=progress,
                                                store=store_hashes)
                entry.hashes, entry.hashes_source = table.counts(), source
                tables.append(table)
            groups += _near_groups(tables, groups, threshold, flips, workers or available_cpus())
        groups.sort(key=lambda g: (not g.leak, -len(g.members), g.kind != "exact", g.members))
        for group in groups:
            for member in group.members:
                entries[member.dataset].keys[member.sample] = opened[member.dataset].key(member.sample)
        return DuplicateReport(datasets=entries, groups=groups, threshold=int(threshold), flips=flips, near=near)
    finally:
        for ds in owned:
            ds.close()


def _near_groups(tables: list[HashTable], exact: list[DuplicateGroup], threshold: int, flips: bool,
                 workers: int) -> list[DuplicateGroup]:
    """Near pairs over every dataset's hashed samples at once, less the byte-identical pairs,
    joined into groups (connected components)."""
    owner = np.concatenate([np.full(len(t), k, dtype=np.int64) for k, t in enumerate(tables)])
    sample = np.concatenate([np.arange(len(t), dtype=np.int64) for t in tables])
    hashes = np.concatenate([t.hashes for t in tables])
    hashed = np.flatnonzero(np.concatenate([t.status for t in tables]) == HASHED)
    pairs: Pairs = near_pairs(hashes[hashed], threshold, flips=flips, workers=workers)
    first, second = hashed[pairs.first], hashed[pairs.second]
    # byte-identical pairs are reported as exact: leave them out of the near groups
    same_bytes: dict[tuple[int, int], int] = {}
    for number, group in enumerate(exact):
        for member in group.members:
            same_bytes[(member.dataset, member.sample)] = number
    keep = [k for k in range(len(first))
            if same_bytes.get((int(owner[first[k]]), int(sample[first[k]])), -1)
            != same_bytes.get((int(owner[second[k]]), int(sample[second[k]])), -2)]
    parent: dict[int, int] = {}

    def root(x: int) -> int:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for k in keep:
        a, b = root(int(first[k])), root(int(second[k]))
        if a != b:
            parent[max(a, b)] = min(a, b)
    components: dict[int, list[int]] = {}
    for k in keep:
        components.setdefault(root(int(first[k])), []).append(k)
    groups = []
    for edges in components.values():
        rows = sorted({int(first[k]) for k in edges} | {int(second[k]) for k in edges})
        members = tuple(Member(int(owner[r]), int(sample[r])) for r in rows)
        at = {r: position for position, r in enumerate(rows)}
        joined = tuple(sorted((at[int(first[k])], at[int(second[k])], int(pairs.distance[k]), bool(pairs.mirrored[k]))
                              for k in edges))
        groups.append(DuplicateGroup("near", members, joined))
    return groups
