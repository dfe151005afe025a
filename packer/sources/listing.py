"""The flat listing every source returns: keys, sizes, labels, metadata and member locations as
flat arrays, the rejections with their reasons, and the helpers that select and deduplicate rows.

Paths are held in one UTF-8 blob plus offsets (not a Python list of strings), so listing ten
million files costs about 100 bytes per file, not a kilobyte of Python objects. The listing's
order is the input of the shard plan, so it is part of the determinism contract.
"""

from __future__ import annotations

import os
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..errors import EmptySourceError
from .blobs import gather_blob
from .fieldvalues import FieldTable
from .members import MemberTable

#: Every reason a source file can be rejected for (the build report's ``reason`` field).
REJECTION_REASONS = {
    "empty-file": "the file has zero bytes",
    "not-an-image": "the bytes are not an image Pillow can identify",
    "unsupported-format": "an image format Pillow identifies but cannot decode here (EPS without Ghostscript, stubs)",
    "truncated": "the image ends early",
    "decode-failed": ("the image could not be decoded (--validate full), or a header field has an invalid "
                      "type, count or value"),
    "too-many-pixels": "width x height over the pixel limit (decompression-bomb guard)",
    "unreadable": "the file could not be read (permissions, I/O error)",
    "dangling-symlink": "a symlink whose target does not exist",
    "symlink-loop": "a symlinked folder that leads back to one of its parents",
    "missing": "a manifest entry whose file does not exist",
    "changed-during-build": "the file changed (size, or no longer a regular file) between listing and packing",
    "file-too-large": "the file is larger than --max-file-size",
    "hidden-file": "a name starting with '.' (e.g. .DS_Store)",
    "not-in-class-folder": "a file at the top level of an image folder, outside any class folder",
    "outside-root": "a manifest path that leads outside the root",
    "duplicate-entry": "a manifest path listed more than once",
    "undecodable-name": "a file name that is not valid UTF-8",
    "not-a-file": "a device, socket or FIFO",
    "bad-manifest-row": "a manifest row without a usable path or label",
    "bad-label": ("a WebDataset sample whose .cls or .json label is not an integer in the signed 64-bit range "
                  "spelled in plain ASCII digits, nor a class name"),
    "bad-metadata": "a manifest row whose metadata is not a JSON object of finite values",
    "unknown-class": "a class folder or label that is not in the class list given (--classes)",
    # archive sources (build/archives.py)
    "oversize-member": "an archive member larger than the member size limit",
    "decompression-bomb": "a zip member that declares far more bytes than it stores",
    "unused-member": ("a WebDataset member, or an image folder's side file (--field), that is neither the "
                      "sample's image, nor taken by a declared field, nor .cls/.json/.txt metadata"),
    # declared fields (--field, packer/fields.py)
    "bad-field": "a declared field's value is missing or does not fit its declaration (dtype, shape, kind), "
                 "or its second image file is missing or not an image",
    "ambiguous-image": ("a sample of several files (side files, WebDataset) with more than one image that no "
                        "declared field takes"),
    "bad-annotation": ("a COCO annotation that is malformed (box, area, iscrowd, category) or names an image "
                       "or category the file does not have"),
}


@dataclass(frozen=True)
class Rejection:
    """One source entry that was not packed, and why."""

    key: str
    reason: str
    message: str

    def to_json(self) -> dict[str, str]:
        return {"key": self.key, "reason": self.reason, "message": self.message}


@dataclass
class SourceListing:
    """The candidate files of a source, in listing order, as flat arrays.

    Attributes:
        root: the folder keys are relative to.
        kind: ``"folder"`` or ``"manifest"``.
        classes: class names (label i is ``classes[i]``); empty for integer-labelled manifests.
        key_blob / key_offsets: UTF-8 relative paths, key i is ``key_blob[key_offsets[i]:key_offsets[i+1]]``.
        sizes: file sizes in bytes at listing time (uint64).
        labels: int64 labels.
        meta_blob / meta_offsets: canonical JSON metadata per entry (empty when none).
        rejected: entries refused while listing.
        label_type: ``"str"`` (labels are class names) or ``"int"`` (integer manifest labels).
        warnings: things the user should know before a long build (e.g. split folders as classes).
        stamps: per entry, ``file_stamp`` (its modification time) at listing (uint64; 0 = not
            recorded), so packing can tell a file rewritten or replaced since it was listed, even
            at the same size. Empty when the listing records none.
        members: where each entry lives inside an archive source (build/members.py); None for
            a folder or manifest, whose keys are paths.
    """

    root: Path
    kind: str
    classes: tuple[str, ...]
    key_blob: np.ndarray
    key_offsets: np.ndarray
    sizes: np.ndarray
    labels: np.ndarray
    meta_blob: np.ndarray
    meta_offsets: np.ndarray
    rejected: list[Rejection] = field(default_factory=list)
    label_type: str = "str"
    warnings: list[str] = field(default_factory=list)
    stamps: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.uint64))
    members: MemberTable | None = None
    #: Declared fields' values per entry (build/fieldvalues.py); None without ``--field``.
    fields: FieldTable | None = None

    def stamp(self, i: int) -> int:
        """Entry ``i``'s ``file_stamp`` at listing time, 0 when not recorded."""
        return int(self.stamps[i]) if len(self.stamps) == len(self.sizes) else 0

    def __len__(self) -> int:
        return len(self.sizes)

    def key(self, i: int) -> str:
        start, end = int(self.key_offsets[i]), int(self.key_offsets[i + 1])
        return self.key_blob[start:end].tobytes().decode("utf-8")

    def metadata(self, i: int) -> bytes:
        start, end = int(self.meta_offsets[i]), int(self.meta_offsets[i + 1])
        return self.meta_blob[start:end].tobytes()


class _ListingBuilder:
    """Accumulates entries into flat arrays (no per-entry Python objects kept)."""

    def __init__(self, progress: Callable[[int], None] | None = None) -> None:
        self.progress = progress  # called with the number of entries seen, every 10,000
        self.seen = 0
        self.key_blob = bytearray()
        self.key_offsets = array("Q", [0])
        self.sizes = array("Q")
        self.stamps = array("Q")
        self.labels = array("q")
        self.meta_blob = bytearray()
        self.meta_offsets = array("Q", [0])
        self.rejected: list[Rejection] = []
        self.listed_folders: dict[tuple[int, int], str] = {}  # (st_dev, st_ino) -> first relative path

    def _tick(self) -> None:
        self.seen += 1
        if self.progress is not None and self.seen % 10_000 == 0:
            self.progress(self.seen)

    def add(self, key: bytes, size: int, label: int, meta: bytes = b"", stamp: int = 0) -> None:
        self._tick()
        self.key_blob += key
        self.key_offsets.append(len(self.key_blob))
        self.sizes.append(size)
        self.stamps.append(stamp)
        self.labels.append(label)
        self.meta_blob += meta
        self.meta_offsets.append(len(self.meta_blob))

    def reject(self, key: str, reason: str, message: str) -> None:
        self._tick()
        self.rejected.append(Rejection(key, reason, message))

    def finish(self, root: Path, kind: str, classes: tuple[str, ...]) -> SourceListing:
        return SourceListing(
            root=root, kind=kind, classes=classes,
            key_blob=np.frombuffer(bytes(self.key_blob), dtype=np.uint8),
            key_offsets=np.frombuffer(self.key_offsets, dtype=np.uint64).copy(),
            sizes=np.frombuffer(self.sizes, dtype=np.uint64).copy(),
            stamps=np.frombuffer(self.stamps, dtype=np.uint64).copy(),
            labels=np.frombuffer(self.labels, dtype=np.int64).copy(),
            meta_blob=np.frombuffer(bytes(self.meta_blob), dtype=np.uint8),
            meta_offsets=np.frombuffer(self.meta_offsets, dtype=np.uint64).copy(),
            rejected=self.rejected)


def file_stamp(st: os.stat_result) -> int:
    """A 64-bit stamp of a file's version: its modification time in nanoseconds (never 0).

    Packing compares the stamp of the descriptor it opened with the one listed, so a file
    rewritten or replaced since the listing is ``changed-during-build`` even when its size is
    the same. The inode and device are deliberately left out: they differ between machines that
    see one shared source (device numbers are per machine) and between copies of a source made
    with ``rsync -a``/``cp -p``, which keep the mtime.
    """
    return (st.st_mtime_ns & 0xFFFF_FFFF_FFFF_FFFF) or 1


#: The listing builder, public for the archive listers (build/archives.py).
ListingBuilder = _ListingBuilder


def rejection_summary(rejected: Sequence[Rejection], *, top: int = 3) -> str:
    """"240 rejected: 200 unknown-class (e.g. 'wolf/1.jpg': ...), 40 missing (e.g. ...)"."""
    by_reason: dict[str, list[Rejection]] = {}
    for r in rejected:
        by_reason.setdefault(r.reason, []).append(r)
    ranked = sorted(by_reason.items(), key=lambda item: (-len(item[1]), item[0]))
    parts = [f"{len(rows)} {reason} (e.g. {rows[0].key}: {rows[0].message})" for reason, rows in ranked[:top]]
    if len(ranked) > top:
        parts.append(f"{sum(len(rows) for _, rows in ranked[top:])} for {len(ranked) - top} other reason(s)")
    return f"{len(rejected)} rejected: " + "; ".join(parts) if rejected else "nothing was listed"


def empty_source_error(what: str, rejected: list[Rejection], *, path: Path,
                       hints: Sequence[str] = (), source_kind: str | None = None) -> EmptySourceError:
    """An EmptySourceError naming the top rejection reasons, carrying the rejections (and the
    source kind, when it is not a folder or manifest) for the report."""
    summary = rejection_summary(rejected)
    fresh = [hint for hint in hints if hint not in summary]  # the example row may already say it
    fix = f"; to fix: {'; '.join(fresh)}" if fresh else ""
    error = EmptySourceError(f"{what} ({summary}){fix}", path=path)
    error.rejected = list(rejected)  # type: ignore[attr-defined]  (the build writes them to its report)
    error.source_kind = source_kind  # type: ignore[attr-defined]
    return error


def select_rows(listing: SourceListing, keep: np.ndarray) -> SourceListing:
    """The listing restricted to the rows where ``keep`` is true (order kept)."""
    rows = np.flatnonzero(keep)
    keys, key_offsets = gather_blob(listing.key_blob, listing.key_offsets, rows)
    meta, meta_offsets = gather_blob(listing.meta_blob, listing.meta_offsets, rows)
    return SourceListing(root=listing.root, kind=listing.kind, classes=listing.classes, key_blob=keys,
                         key_offsets=key_offsets, sizes=listing.sizes[rows], labels=listing.labels[rows],
                         meta_blob=meta, meta_offsets=meta_offsets, rejected=listing.rejected,
                         label_type=listing.label_type, warnings=listing.warnings,
                         stamps=listing.stamps[rows] if len(listing.stamps) == len(listing.sizes)
                         else np.zeros(0, dtype=np.uint64),
                         members=listing.members.select(rows) if listing.members is not None else None,
                         fields=listing.fields.select(rows) if listing.fields is not None else None)


def drop_duplicate_keys(listing: SourceListing, key_hashes: np.ndarray) -> SourceListing:
    """Reject every repeat of a key (the first occurrence is packed)."""
    if len(key_hashes) < 2:
        return listing
    order = np.argsort(key_hashes, kind="stable")  # stable: equal keys stay in manifest order
    sorted_hashes = key_hashes[order]
    repeats = np.flatnonzero(sorted_hashes[1:] == sorted_hashes[:-1]) + 1
    if not len(repeats):
        return listing
    keep = np.ones(len(listing), dtype=bool)
    group_start = -1
    seen: set[str] = set()
    for position in repeats.tolist():  # only rows whose hash repeats: compare the keys themselves
        if group_start < 0 or sorted_hashes[position] != sorted_hashes[group_start]:
            group_start = position - 1
            seen = {listing.key(int(order[group_start]))}
        row = int(order[position])
        key = listing.key(row)
        if key in seen:
            keep[row] = False
            listing.rejected.append(Rejection(key, "duplicate-entry", "the manifest lists this path more than once"))
        seen.add(key)
    return select_rows(listing, keep) if not keep.all() else listing
