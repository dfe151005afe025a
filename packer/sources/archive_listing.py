"""What the archive doors (tar, zip, WebDataset, Parquet) share: the listing being built with each
member's location (container, offset, stored size, method, CRC) and the byte range it must stay
inside, and the member-name checks.

Every member is accounted for: directories are structure, and anything else not listed is a
rejection in the build report (``not-a-file`` for links, devices and sparse members,
``outside-root`` for ``../x`` or absolute names, ``hidden-file``). The rules on what is listed
(duplicates, member bounds and overlaps, sizes, decompression bombs, labels) are the source
contract's (``contract.py``), applied to every door alike. A name that is not UTF-8 gets the
escaped key of ``packer._internal.names``. Listing order is archive order.

Memory is flat arrays in the number of members: tarfile's member list is emptied after every
member. Exception: a zip's central directory is read whole by ``zipfile`` (~0.5 KB a member, for
the listing step only).
"""

from __future__ import annotations

import json
import os
import re
import tarfile
from array import array
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..fields import FieldSpec
from .._internal.names import ESCAPED_FIELD, escape_name, is_plain
from .fieldvalues import FieldRowBuilder
from .listing import RawListing, RawListingBuilder
from .members import RAW, MemberBounds, MemberTable, container_stat
from .sidefiles import MAX_TEXT_MEMBER_BYTES, TEXT_EXTENSIONS

#: Listing kinds whose members live in archives (``SourceListing.kind``).
ARCHIVE_KINDS = frozenset({"tar", "zip", "webdataset", "parquet", "hf"})
#: Members larger than this are rejected (``oversize-member``) before anything is read.
DEFAULT_MAX_MEMBER_SIZE = 1 << 30
#: Largest accepted ratio of uncompressed to compressed bytes (decompression-bomb guard).
MAX_EXPANSION = 1000


# WebDataset: IMAGE_EXTENSIONS (lower case, last part) make a member the sample's image;
# .cls/.json/.txt members (TEXT_EXTENSIONS) up to MAX_TEXT_MEMBER_BYTES are read as label and metadata.
META_EXTENSIONS = TEXT_EXTENSIONS
META_LIMIT = MAX_TEXT_MEMBER_BYTES


# --- the listing being built ---------------------------------------------------------------------

class ArchiveListing:
    """Flat arrays for keys, labels as written, sizes, member locations and their bounds."""

    def __init__(self, progress: Callable[[int], None] | None, fields: Sequence[FieldSpec] = ()) -> None:
        self.out = RawListingBuilder(progress)
        #: declared fields' values (WebDataset with --field), and each image field's member locations
        self.field_rows = FieldRowBuilder(fields) if fields else None
        self.field_members = {spec.name: (array("I"), array("Q"), array("Q"), array("I")) for spec in fields
                              if spec.kind == "image"}
        self.read_limits: dict[str, int] = {}  # member suffix -> sidefiles.read_limit
        self.container = array("I")
        self.offset = array("Q")
        self.stored = array("Q")
        self.method = array("B")
        self.crc = array("I")
        self.region = array("I")
        self.regions: list[tuple[int, int, int]] = []  # (container, start, end); end -1: the whole container
        self.whole: list[int] = []  # container -> the region of its whole extent
        self.containers: list[str] = []
        self.stats: list[tuple[int, int]] = []
        self.declared_classes: tuple[str, ...] = ()  # class names a source declares (HF ClassLabel)
        self.declared_numbering = False
        self.declared_across_splits = False  # declared_classes are every split's label strings (HF)

    # labels, as the door reads them (the contract types and numbers them)
    def name_label(self, name: str) -> tuple[int, int]:
        return self.out.name_label(name)

    def text_label(self, text: str) -> tuple[int, int]:
        return self.out.text_label(text)

    def add_container(self, path: str) -> int:
        """A file members are read from; its whole extent is region number ``container``'s."""
        self.containers.append(path)
        self.stats.append(container_stat(path))
        self.whole.append(len(self.regions))
        self.regions.append((len(self.containers) - 1, 0, -1))
        return len(self.containers) - 1

    def container_region(self, container: int) -> int:
        return self.whole[container]

    def add_region(self, container: int, start: int, end: int) -> int:
        """A part of a container (an inner tar's bytes) that the members listed in it must stay inside."""
        self.regions.append((container, start, end))
        return len(self.regions) - 1

    def add(self, key: str, size: int, label: tuple[int, int], container: int, offset: int, stored: int,
            method: int = RAW, crc: int = 0, meta: bytes = b"", field_values: Sequence[Any] = (),
            field_members: dict[str, tuple[int, int, int]] | None = None, region: int | None = None) -> None:
        """One sample; with fields, its encoded values and its image fields' (container, offset,
        size) of uncompressed tar members."""
        encoded = key.encode("utf-8")
        if self.field_rows is not None:
            self.field_rows.add(field_values)
            for name, (containers, offsets, sizes, regions) in self.field_members.items():
                where = field_members[name]  # type: ignore[index]
                containers.append(where[0])
                offsets.append(where[1])
                sizes.append(where[2])
                regions.append(self.container_region(where[0]))
        self.out.add(encoded, size, label, meta)
        self.container.append(container)
        self.offset.append(offset)
        self.stored.append(stored)
        self.method.append(method)
        self.crc.append(crc)
        self.region.append(self.container_region(container) if region is None else region)

    def reject(self, key: str, reason: str, message: str) -> None:
        self.out.reject(key, reason, message)

    def finish(self, root: Path, kind: str) -> RawListing:
        members = MemberTable(
            tuple(self.containers), tuple(self.stats),
            np.frombuffer(self.container, dtype=np.uint32).copy(), np.frombuffer(self.offset, dtype=np.uint64).copy(),
            np.frombuffer(self.stored, dtype=np.uint64).copy(), np.frombuffer(self.method, dtype=np.uint8).copy(),
            np.frombuffer(self.crc, dtype=np.uint32).copy())
        bounds = MemberBounds(tuple(self.regions), np.frombuffer(self.region, dtype=np.uint32).copy())
        extra: dict[str, Any] = {}
        if self.field_rows is not None:
            extra["fields"] = self.field_rows.finish()
            count = len(self.out)
            for name, (containers, offsets, sizes, regions) in self.field_members.items():
                # tar members (or a spool's): raw bytes, no method, no CRC
                members.fields[name] = MemberTable(
                    tuple(self.containers), tuple(self.stats), np.frombuffer(containers, dtype=np.uint32).copy(),
                    np.frombuffer(offsets, dtype=np.uint64).copy(), np.frombuffer(sizes, dtype=np.uint64).copy(),
                    np.full(count, RAW, dtype=np.uint8), np.zeros(count, dtype=np.uint32))
                bounds.field_region[name] = np.frombuffer(regions, dtype=np.uint32).copy()
        return self.out.finish(root, kind, members=members, member_bounds=bounds,
                               declared_classes=self.declared_classes, declared_numbering=self.declared_numbering,
                               declared_across_splits=self.declared_across_splits,
                               empty_what="the archive holds no packable members", empty_path=root, **extra)


# --- member names ----------------------------------------------------------------------------------

def member_name(raw: str, out: ArchiveListing) -> str | None:
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


def not_a_file(member: tarfile.TarInfo) -> str | None:
    if member.isfile() and not member.issparse():
        return None
    if member.issym() or member.islnk():
        return f"a {'symbolic' if member.issym() else 'hard'} link to {member.linkname!r} (links inside archives " \
               f"are not followed)"
    if member.issparse():
        return "a sparse member (not supported)"
    return "not a regular file (device, FIFO or unknown member type)"


def name_meta(raw: str) -> bytes:
    """The metadata of a member whose name is not plain (not UTF-8, or holding ``%XX``): the
    ``packer._internal.names`` marker."""
    return b"" if is_plain(os.fsencode(raw)) else json.dumps({ESCAPED_FIELD: True}, separators=(",", ":")).encode()
