"""The flat listings: what every door returns (``RawListing``: entries with their labels *as
written*) and what the source contract turns it into (``SourceListing``: numbered labels, a class
list, only the entries that passed every rule), with the rejections and their reasons.

Paths are held in one UTF-8 blob plus offsets (not a Python list of strings), so listing ten
million files costs about 100 bytes per file, not a kilobyte of Python objects. The listing's
order is the input of the shard plan, so it is part of the determinism contract.
"""

from __future__ import annotations

import errno
import os
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import xxhash

from ..errors import BuildError, EmptySourceError
from ..fields import FieldSpec
from .._internal.names import listed_key
from .blobs import gather_blob
from .fieldvalues import FieldTable
from .members import MemberBounds, MemberTable

#: Every reason a source file can be rejected for (the build report's ``reason`` field).
REJECTION_REASONS = {
    "empty-file": "the file has zero bytes",
    "not-an-image": "the bytes are not an image Pillow can identify",
    "unsupported-format": "an image format Pillow identifies but cannot decode here (EPS without Ghostscript, stubs)",
    "truncated": "the image ends early, or an archive member's bytes run past the end of its archive (or its inner tar)",
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
    "duplicate-content": ("with --reject-duplicates: the same bytes as a file listed before it, or as a sample "
                          "already in the dataset appended to (the message names the sample kept)"),
    "undecodable-name": "a file name that is not valid UTF-8",
    "not-a-file": "a device, socket or FIFO",
    "bad-manifest-row": "a manifest row without a usable path or label",
    "bad-label": ("a label that cannot be read: not an integer in the signed 64-bit range spelled in plain ASCII "
                  "digits, nor a class name (a WebDataset .cls/.json label, a Parquet label column, a manifest "
                  "label that only looks like an integer, or any label that is not an integer with "
                  "--label-type int)"),
    "bad-metadata": "a manifest row whose metadata is not a JSON object of finite values",
    "unknown-class": ("a class folder or label that is not in the class list given (--classes, --classes-from, the "
                      "dataset appended to), or an integer label outside it or outside the source's own class names"),
    "unlabeled": ("a sample without a label in a build whose labels are class names (label -1 is not a class); "
                  "a source whose samples all lack labels builds an unlabeled dataset instead"),
    # archive sources (sources/archive_listing.py), checked by the source contract (sources/contract.py)
    "oversize-member": "an archive member larger than the member size limit",
    "decompression-bomb": "a zip member that declares far more bytes than it stores",
    "overlapping-member": ("an archive member whose bytes overlap another member's (a crafted archive: the "
                           "overlapping-member zip bomb)"),
    "unused-member": ("a WebDataset member, or an image folder's side file (--field), that is neither the "
                      "sample's image, nor taken by a declared field, nor .cls/.json/.txt metadata"),
    # declared fields (--field, packer/fields.py)
    "bad-field": "a declared field's value is missing or does not fit its declaration (dtype, shape, kind), "
                 "or its second image file is missing or not an image",
    "ambiguous-image": ("a sample of several files (side files, WebDataset) with more than one image that no "
                        "declared field takes"),
    # samples written from Python (packer.Writer, packer.pack: sources/python.py)
    "bad-sample": ("a value written from Python that is not a sample: an image that is not encoded bytes, a PIL "
                   "image, a uint8 HxWxC array or a uint8 CxHxW tensor, or a sample that is neither an image, "
                   "an (image, target) pair nor a dict with an 'image'"),
    "fn-error": "packer.pack's fn raised on this input (the input, the exception's type and message, its last frame)",
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


# --- what a door is given ------------------------------------------------------------------------

#: The source kinds a build records (``SourceSettings.kind`` once detected): every door of
#: ``detect.list_raw``, and ``"python"`` for samples written from Python (no door lists them).
RECORDED_KINDS = ("folder", "manifest", "tar", "zip", "webdataset", "parquet", "coco", "hf", "python")


@dataclass(frozen=True)
class SourceSettings:
    """What a build records about its source: the door's kind and the options that say how to read
    it (the ``source`` part of ``packer.BuildSettings``, in the manifest's build record).

    Attributes:
        kind: ``"auto"`` until the source is recognised by its bytes (``detect.detect_kind``, once
            per build), then the door's kind (``RECORDED_KINDS``); ``--source-kind``.
        root: the folder a manifest's or a COCO file's paths are relative to (default: its
            folder); ``--root``. Where the bytes are, not what they are: not compared when a
            build is resumed (the source probes check the files instead).
        label_field: the WebDataset ``.json`` member's field, or the Parquet / Hugging Face column,
            holding the label; ``--label-field``.
        image_column: the Parquet / Hugging Face column holding the images (default: found by its
            type); ``--image-column``.
    """

    kind: str = field(default="auto", metadata={"option": "--source-kind"})
    root: Path | None = field(default=None, compare=False, metadata={"option": "--root"})
    label_field: str = field(default="label", metadata={"option": "--label-field"})
    image_column: str | None = field(default=None, metadata={"option": "--image-column"})

    def __post_init__(self) -> None:
        if self.root is not None and not isinstance(self.root, Path):
            object.__setattr__(self, "root", Path(self.root))

    def to_json(self) -> dict[str, object]:
        return {"kind": self.kind, "root": None if self.root is None else os.fspath(self.root),
                "label_field": self.label_field, "image_column": self.image_column}


@dataclass(frozen=True)
class DoorOptions:
    """Everything a door may know: how to *read* the source, never the rules applied to it.

    The class list, ``--label-type``, the unlabeled rule and the size limits are the source
    contract's (``contract.SourceOptions``); no door receives them, so no door can apply its own.

    Attributes:
        source: the recorded source settings (kind, root, label field, image column), as given.
        fields: declared fields (``packer.fields``), for the doors whose samples carry them.
        spool_dir: where a compressed tar or Parquet images are copied to (the output's staging).
        progress: called with the running count of entries every 10,000 entries.
    """

    source: SourceSettings = SourceSettings()
    fields: tuple[FieldSpec, ...] = ()
    spool_dir: Path | None = None
    progress: Callable[[int], None] | None = field(default=None, compare=False)


# --- what a door returns -------------------------------------------------------------------------

#: How an entry's label is written in the source (``RawListing.label_kinds``).
NO_LABEL = 0      #: the entry has no label (no .cls, a null column, no label column)
INT_LABEL = 1     #: an integer the source types as one (a JSON number, an integer column, .cls digits)
TEXT_LABEL = 2    #: text that is either a class name or an integer, as ``--label-type`` says (a CSV cell)
NAME_LABEL = 3    #: a class name by the source's structure (a class folder, a class tar)


@dataclass
class RawListing:
    """A door's listing: every entry with its label *as written*, before any rule is applied.

    Flat arrays, one row per entry in listing order (no per-entry Python objects):

    Attributes:
        root: the folder keys are relative to (a folder, a manifest root, an archive).
        kind: the door (``folder``, ``manifest``, ``tar``, ``zip``, ``webdataset``, ``parquet``, ``coco``).
        key_blob / key_offsets: UTF-8 keys; key_hashes: their xxh3-64 (for the duplicate rule).
        sizes: each entry's size in bytes (an archive member's uncompressed size); stamps: its
            ``file_stamp`` at listing (0 = not recorded).
        label_kinds / label_values: ``NO_LABEL``, ``INT_LABEL`` (the value), ``TEXT_LABEL`` or
            ``NAME_LABEL`` (an index into ``label_texts``).
        label_texts: the distinct label strings, in order of first appearance.
        meta_blob / meta_offsets: canonical JSON metadata per entry (empty when none).
        rejected: entries the door could not list (a link, a bad row, an unreadable label).
        declared_classes: class names the source itself declares, even without entries (an
            empty class folder; a HuggingFace ``ClassLabel`` list).
        declared_numbering: the source numbers ``declared_classes``: its integer label ``k``
            means ``declared_classes[k]`` (``ClassLabel``); otherwise they only join the names found.
        declared_across_splits: ``declared_classes`` are the label strings of every split the
            source belongs to (a Hugging Face ``DatasetDict``), so each split numbers them alike.
        declared_unlabeled: the kind of source has no main labels at all (COCO: the objects'
            categories are a field), so a class list cannot apply to it.
        warnings: things the user should know before a long build.
        members / member_bounds: where each entry of an archive lives, and the byte range
            (container, start, end) each member must stay inside; None for files.
        fields: declared fields' values per entry; None without ``--field``.
        empty_what / empty_path / empty_hints: what the contract's error says if nothing is left.
    """

    root: Path
    kind: str
    key_blob: np.ndarray
    key_offsets: np.ndarray
    key_hashes: np.ndarray
    sizes: np.ndarray
    stamps: np.ndarray
    label_kinds: np.ndarray
    label_values: np.ndarray
    label_texts: tuple[str, ...]
    meta_blob: np.ndarray
    meta_offsets: np.ndarray
    rejected: list[Rejection] = field(default_factory=list)
    declared_classes: tuple[str, ...] = ()
    declared_numbering: bool = False
    declared_across_splits: bool = False
    declared_unlabeled: bool = False
    warnings: list[str] = field(default_factory=list)
    members: MemberTable | None = None
    member_bounds: MemberBounds | None = None
    fields: FieldTable | None = None
    empty_what: str = "the source lists nothing to pack"
    empty_path: Path | None = None
    empty_hints: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.sizes)

    def key(self, i: int) -> str:
        start, end = int(self.key_offsets[i]), int(self.key_offsets[i + 1])
        return self.key_blob[start:end].tobytes().decode("utf-8")


class RawListingBuilder:
    """Accumulates a door's entries into flat arrays (no per-entry Python objects kept).

    Labels are given as ``(kind, value)`` pairs made by ``text_label``, ``name_label``,
    ``int_label`` or ``NONE``; strings are interned once each (a class name is stored once,
    whatever the number of its entries).
    """

    #: The label of an entry without one.
    NONE = (NO_LABEL, 0)

    def __init__(self, progress: Callable[[int], None] | None = None) -> None:
        self.progress = progress  # called with the number of entries seen, every 10,000
        self.seen = 0
        self.key_blob = bytearray()
        self.key_offsets = array("Q", [0])
        self.key_hashes = array("Q")
        self.sizes = array("Q")
        self.stamps = array("Q")
        self.label_kinds = array("B")
        self.label_values = array("q")
        self.texts: dict[str, int] = {}
        self.meta_blob = bytearray()
        self.meta_offsets = array("Q", [0])
        self.rejected: list[Rejection] = []
        self.listed_folders: dict[tuple[int, int], str] = {}  # (st_dev, st_ino) -> first relative path

    def _tick(self) -> None:
        self.seen += 1
        if self.progress is not None and self.seen % 10_000 == 0:
            self.progress(self.seen)

    def _text_id(self, text: str) -> int:
        return self.texts.setdefault(text, len(self.texts))

    def text_label(self, text: str) -> tuple[int, int]:
        """A label written as text: a class name or an integer, as ``--label-type`` decides."""
        return TEXT_LABEL, self._text_id(text)

    def name_label(self, name: str) -> tuple[int, int]:
        """A class name given by the source's structure (a class folder)."""
        return NAME_LABEL, self._text_id(name)

    @staticmethod
    def int_label(value: int) -> tuple[int, int]:
        """An integer label (the caller checked it fits in int64)."""
        return INT_LABEL, value

    def add(self, key: bytes, size: int, label: tuple[int, int] = NONE, meta: bytes = b"", stamp: int = 0) -> None:
        if b"%" in key:  # a name holding an escape's spelling gets its one-to-one key (packer/_internal/names.py)
            key, meta = listed_key(key, meta)
        self._tick()
        self.key_blob += key
        self.key_offsets.append(len(self.key_blob))
        self.key_hashes.append(xxhash.xxh3_64_intdigest(key))
        self.sizes.append(size)
        self.stamps.append(stamp)
        self.label_kinds.append(label[0])
        self.label_values.append(label[1])
        self.meta_blob += meta
        self.meta_offsets.append(len(self.meta_blob))

    def reject(self, key: str, reason: str, message: str) -> None:
        self._tick()
        self.rejected.append(Rejection(key, reason, message))

    def __len__(self) -> int:
        return len(self.sizes)

    def finish(self, root: Path, kind: str, **extra: object) -> RawListing:
        """The listing; ``extra``: the other ``RawListing`` attributes (declared classes, members...)."""
        return RawListing(
            root=root, kind=kind,
            key_blob=np.frombuffer(bytes(self.key_blob), dtype=np.uint8),
            key_offsets=np.frombuffer(self.key_offsets, dtype=np.uint64).copy(),
            key_hashes=np.frombuffer(self.key_hashes, dtype=np.uint64).copy(),
            sizes=np.frombuffer(self.sizes, dtype=np.uint64).copy(),
            stamps=np.frombuffer(self.stamps, dtype=np.uint64).copy(),
            label_kinds=np.frombuffer(self.label_kinds, dtype=np.uint8).copy(),
            label_values=np.frombuffer(self.label_values, dtype=np.int64).copy(),
            label_texts=tuple(self.texts),
            meta_blob=np.frombuffer(bytes(self.meta_blob), dtype=np.uint8),
            meta_offsets=np.frombuffer(self.meta_offsets, dtype=np.uint64).copy(),
            rejected=self.rejected, **extra)  # type: ignore[arg-type]


# --- what the contract returns ---------------------------------------------------------------------

@dataclass
class SourceListing:
    """The entries of a source that passed the source contract, in listing order, as flat arrays.

    Attributes:
        root: the folder keys are relative to.
        kind: the door that listed it (``RawListing.kind``).
        classes: class names (label i is ``classes[i]``); empty for integer-labelled or unlabeled data.
        key_blob / key_offsets: UTF-8 relative paths, key i is ``key_blob[key_offsets[i]:key_offsets[i+1]]``.
        sizes: file sizes in bytes at listing time (uint64).
        labels: int64 labels (-1: unlabeled, only when ``classes`` is empty).
        meta_blob / meta_offsets: canonical JSON metadata per entry (empty when none).
        rejected: entries refused while listing (by the door or by the contract).
        label_type: ``"str"`` (labels are class numbers), ``"int"`` (integers as written) or
            ``"none"`` (no sample has a label).
        warnings: things the user should know before a long build (e.g. split folders as classes).
        stamps: per entry, ``file_stamp`` (its modification time) at listing (uint64; 0 = not
            recorded), so packing can tell a file rewritten or replaced since it was listed, even
            at the same size. Empty when the listing records none.
        members: where each entry lives inside an archive source (sources/members.py); None for
            a folder or manifest, whose keys are paths.
        class_order: for class-name labels, how ``classes`` were numbered:
            ``"given"`` (``--classes``, ``--classes-from``, an append's dataset), ``"source"`` (the
            source's own numbering, a ``ClassLabel``, kept in its order), ``"splits"`` (the label
            strings of every split of the source, sorted) or ``"sorted"`` (the names found here,
            sorted); None for integer labels, none, or a plan saved before it was recorded.
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
    #: Declared fields' values per entry (sources/fieldvalues.py); None without ``--field``.
    fields: FieldTable | None = None
    class_order: str | None = None

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


def file_stamp(st: os.stat_result) -> int:
    """A 64-bit stamp of a file's version: its modification time in nanoseconds (never 0).

    Packing compares the stamp of the descriptor it opened with the one listed, so a file
    rewritten or replaced since the listing is ``changed-during-build`` even when its size is
    the same. The inode and device are deliberately left out: they differ between machines that
    see one shared source (device numbers are per machine) and between copies of a source made
    with ``rsync -a``/``cp -p``, which keep the mtime.
    """
    return (st.st_mtime_ns & 0xFFFF_FFFF_FFFF_FFFF) or 1


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
    source kind) for the report."""
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
                         fields=listing.fields.select(rows) if listing.fields is not None else None,
                         class_order=listing.class_order)


def spool_write_error(exc: OSError, spool: Path, what: str) -> BuildError:
    """A write to the build's spool failed: the build's problem (exit 3), named as a write, never as
    a source that cannot be read. ``what``: what was being spooled ("decompressing the archive")."""
    if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return BuildError(f"the disk is full while {what} into the build's spool; free space and run again", path=spool)
    return BuildError(f"cannot write the build's spool: {exc.strerror or exc}", path=spool)
