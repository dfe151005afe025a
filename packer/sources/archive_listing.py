"""What the archive doors (tar, zip, WebDataset, Parquet) share: the listing being built with each
member's location (container, offset, stored size, method, CRC), member-name checks, size limits
and the duplicate rule (the first in archive order is packed).

Every member is accounted for: directories are structure, and anything else not packed is a
rejection in the build report (``not-a-file`` for links, devices and sparse members,
``outside-root`` for ``../x`` or absolute names, ``hidden-file``, ``duplicate-entry``,
``oversize-member`` over ``max_member_size``, ``decompression-bomb`` for a zip member expanding
more than ``MAX_EXPANSION`` times). A name that is not UTF-8 gets the escaped key of
``packer.names``. Listing order is archive order; class names are sorted by their UTF-8 bytes.

Memory is flat arrays in the number of members: tarfile's member list is emptied after every
member. Exception: a zip's central directory is read whole by ``zipfile`` (~0.5 KB a member, for
the listing step only).
"""

from __future__ import annotations

import os
import re
import tarfile
from array import array
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import xxhash

from ..errors import SourceError
from ..fields import FieldSpec
from ..names import escape_name
from .fieldvalues import FieldRowBuilder
from .listing import ListingBuilder, Rejection, SourceListing, empty_source_error, select_rows
from .members import RAW, MemberTable, container_stat
from .sidefiles import MAX_TEXT_MEMBER_BYTES, TEXT_EXTENSIONS

#: Listing kinds whose members live in archives (``SourceListing.kind``).
ARCHIVE_KINDS = frozenset({"tar", "zip", "webdataset", "parquet", "hf"})
#: Members larger than this are rejected (``oversize-member``) before anything is read.
DEFAULT_MAX_MEMBER_SIZE = 1 << 30
#: Largest accepted ratio of uncompressed to compressed bytes (decompression-bomb guard).
MAX_EXPANSION = 1000


# WebDataset: IMAGE_EXTENSIONS (lower case, last part) make a member the sample's image;
# .cls/.json/.txt members (TEXT_EXTENSIONS) up to MAX_TEXT_MEMBER_BYTES are read as label and metadata.
_META_EXTENSIONS = TEXT_EXTENSIONS
_META_LIMIT = MAX_TEXT_MEMBER_BYTES




# --- the listing being built ---------------------------------------------------------------------

class _Listing:
    """Flat arrays for keys, labels, sizes and member locations, plus class names as first seen."""

    def __init__(self, progress: Callable[[int], None] | None, fields: Sequence[FieldSpec] = ()) -> None:
        self.out = ListingBuilder(progress)
        #: declared fields' values (WebDataset with --field), and each image field's member locations
        self.field_rows = FieldRowBuilder(fields) if fields else None
        self.field_members = {spec.name: (array("I"), array("Q"), array("Q")) for spec in fields
                              if spec.kind == "image"}
        self.read_limits: dict[str, int] = {}  # member suffix -> sidefiles.read_limit
        self.container = array("I")
        self.offset = array("Q")
        self.stored = array("Q")
        self.method = array("B")
        self.crc = array("I")
        self.hashes = array("Q")
        self.class_ids: dict[str, int] = {}
        #: "int" and/or "name" -> the first label of that kind (for the message when they mix)
        self.label_kinds: dict[str, str] = {}
        self.containers: list[str] = []
        self.stats: list[tuple[int, int]] = []
        self.fixed_classes: tuple[str, ...] = ()  # class names a source declares (HF ClassLabel)

    def add_container(self, path: str) -> int:
        self.containers.append(path)
        self.stats.append(container_stat(path))
        return len(self.containers) - 1

    def class_id(self, name: str) -> int:
        self.label_kinds.setdefault("name", name)
        return self.class_ids.setdefault(name, len(self.class_ids))

    def add(self, key: str, size: int, label: int, container: int, offset: int, stored: int,
            method: int = RAW, crc: int = 0, meta: bytes = b"", field_values: Sequence[Any] = (),
            field_members: dict[str, tuple[int, int, int]] | None = None) -> None:
        """One sample; with fields, its encoded values and its image fields' (container, offset,
        size) of uncompressed tar members."""
        encoded = key.encode("utf-8")
        if self.field_rows is not None:
            self.field_rows.add(field_values)
            for name, (containers, offsets, sizes) in self.field_members.items():
                where = field_members[name]  # type: ignore[index]
                containers.append(where[0])
                offsets.append(where[1])
                sizes.append(where[2])
        self.out.add(encoded, size, label, meta)
        self.hashes.append(xxhash.xxh3_64_intdigest(encoded))
        self.container.append(container)
        self.offset.append(offset)
        self.stored.append(stored)
        self.method.append(method)
        self.crc.append(crc)

    def reject(self, key: str, reason: str, message: str) -> None:
        self.out.reject(key, reason, message)

    def finish(self, root: Path, kind: str) -> SourceListing:
        if len(self.label_kinds) > 1:
            raise SourceError(f"labels mix integers (first: {self.label_kinds['int']}) and class names (first: "
                              f"{self.label_kinds['name']!r}); use one kind", path=root)
        classes: tuple[str, ...] = self.fixed_classes
        labels = np.frombuffer(self.out.labels, dtype=np.int64).copy()
        if "name" in self.label_kinds:
            classes = tuple(sorted(self.class_ids, key=str.encode))
            remap = np.empty(len(classes), dtype=np.int64)
            for sorted_id, name in enumerate(classes):
                remap[self.class_ids[name]] = sorted_id
            named = labels >= 0
            labels[named] = remap[labels[named]]
        self.out.labels = array("q", labels.tobytes())
        listing = self.out.finish(root, kind, classes)
        if "int" in self.label_kinds and not classes:
            listing.label_type = "int"  # .cls / .json / column integers, kept as written
        listing.members = MemberTable(
            tuple(self.containers), tuple(self.stats),
            np.frombuffer(self.container, dtype=np.uint32).copy(), np.frombuffer(self.offset, dtype=np.uint64).copy(),
            np.frombuffer(self.stored, dtype=np.uint64).copy(), np.frombuffer(self.method, dtype=np.uint8).copy(),
            np.frombuffer(self.crc, dtype=np.uint32).copy())
        if self.field_rows is not None:
            listing.fields = self.field_rows.finish()
            count = len(listing.sizes)
            for name, (containers, offsets, sizes) in self.field_members.items():
                # tar members (or a spool's): raw bytes, no method, no CRC
                listing.members.fields[name] = MemberTable(
                    tuple(self.containers), tuple(self.stats), np.frombuffer(containers, dtype=np.uint32).copy(),
                    np.frombuffer(offsets, dtype=np.uint64).copy(), np.frombuffer(sizes, dtype=np.uint64).copy(),
                    np.full(count, RAW, dtype=np.uint8), np.zeros(count, dtype=np.uint32))
        listing = _drop_duplicates(listing, np.frombuffer(self.hashes, dtype=np.uint64))
        if len(listing) == 0:
            raise empty_source_error("the archive holds no packable members", listing.rejected, path=root,
                                     source_kind=kind)
        return listing


def _drop_duplicates(listing: SourceListing, hashes: np.ndarray) -> SourceListing:
    """Reject every repeat of a key (the first in archive order is packed)."""
    if len(hashes) < 2:
        return listing
    order = np.argsort(hashes, kind="stable")
    sorted_hashes = hashes[order]
    repeated = np.flatnonzero(sorted_hashes[1:] == sorted_hashes[:-1]) + 1
    if not len(repeated):
        return listing
    keep = np.ones(len(listing), dtype=bool)
    seen: dict[int, set[str]] = {}  # only hashes that repeat: their keys, compared for real
    for position in repeated.tolist():
        value = int(sorted_hashes[position])
        group = seen.get(value)
        if group is None:  # position - 1 holds this hash's first row in archive order (stable sort)
            group = seen[value] = {listing.key(int(order[position - 1]))}
        row = int(order[position])
        key = listing.key(row)
        if key in group:
            keep[row] = False
            listing.rejected.append(Rejection(key, "duplicate-entry", "the archive holds this name more than once; "
                                                                      "the first is packed"))
        group.add(key)
    return listing if keep.all() else select_rows(listing, keep)  # keeps the member table too


# --- member names ----------------------------------------------------------------------------------

def _member_name(raw: str, out: _Listing) -> str | None:
    """The member's key (``/``-separated, escaped if not UTF-8), or None after rejecting it."""
    key = escape_name(os.fsencode(raw))
    if raw.startswith("/") or re.match(r"^[A-Za-z]:[\\/]", raw):
        out.reject(key, "outside-root", "an absolute member name (it would be written outside any folder)")
        return None
    parts = [p for p in key.replace("\\", "/").split("/") if p not in ("", ".")]
    if ".." in parts:
        out.reject(key, "outside-root", "a member name with '..' (it leads outside the archive's folder)")
        return None
    if not parts:
        out.reject(key or "(empty name)", "bad-manifest-row", "a member with an empty name")
        return None
    clean = "/".join(parts)
    if any(p.startswith(".") for p in parts):
        out.reject(clean, "hidden-file", "hidden entries are not packed")
        return None
    return clean


def _not_a_file(member: tarfile.TarInfo) -> str | None:
    if member.isfile() and not member.issparse():
        return None
    if member.issym() or member.islnk():
        return f"a {'symbolic' if member.issym() else 'hard'} link to {member.linkname!r} (links inside archives " \
               f"are not followed)"
    if member.issparse():
        return "a sparse member (not supported)"
    return "not a regular file (device, FIFO or unknown member type)"
