"""Source discovery: turn an image folder or a manifest file into a sorted, flat listing.

The listing is the input of the shard plan, so its order is part of the determinism contract:

* Image folder (torchvision ImageFolder layout): every top-level sub-folder is a class; class
  names are sorted by their UTF-8 bytes and labelled 0..C-1. Files are listed depth-first with
  siblings sorted by the UTF-8 bytes of their names; files in nested sub-folders belong to the
  top-level class. Every file is a candidate whatever its extension: the packer decides what is
  an image by its bytes, so a ``.jpg`` that is really text is *rejected with a reason*, not
  skipped. Hidden entries (a leading ``.``) and files at the top level are rejected too.
  With declared fields (``--field``) the files are grouped into samples with their side files
  (``cat/1.jpg`` + ``cat/1.mask.png`` + ``cat/1.json``) by the rules of ``build/sidefiles.py``;
  a sample takes the place of its first file, and its key is its image's path.
* Symlinks are followed (files and folders); a dangling one or a loop is rejected with a reason.
  Each real folder is listed once: a second path to it (through a symlink) is rejected as a
  ``duplicate-entry``, which also keeps a fan-out of folder links from listing exponentially.
* Manifest input (CSV with a ``path,label[,...]`` header, or JSONL objects with ``path``,
  ``label`` and optional ``metadata``): listed in the manifest's order, paths relative to a root.
  Labels are read by ``--label-type`` (``LABEL_TYPES`` states the ``auto`` rule): string labels
  become sorted class names, integer labels are kept as they are. With declared fields, a
  row's field values are its columns (members); see ``list_manifest``.
* A class list given up front (``classes=``, ``--classes``) numbers the classes instead: a
  folder or label not in it is rejected per file as ``unknown-class``, a listed class with no
  files stays a class with 0 samples, so train and val built with one list agree on every label.

Paths are held in one UTF-8 blob plus offsets (not a Python list of strings), so listing ten
million files costs about 100 bytes per file, not a kilobyte of Python objects.
"""

from __future__ import annotations

import csv
import heapq
import json
import logging
import os
import re
import stat
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import xxhash

from ..classes import split_folder_warning
from ..errors import EmptySourceError, OptionError, SourceError
from ..names import ESCAPED_META, escape_name
from ..fields import FieldSpec, FieldValueError
from ..files import open_nonblocking, read_fd_capped
from .blobs import gather_blob
from .fieldvalues import FIELD_REJECTION, FieldRowBuilder, FieldTable
from .members import MemberTable
from .sidefiles import SideMember, assemble_sample, read_limit, split_key
from .strictjson import MAX_JSON_DEPTH, json_depth_ok, parse_strict_json

__all__ = ["Rejection", "SourceListing", "file_stamp", "list_image_folder", "list_manifest", "list_source",
           "REJECTION_REASONS", "LABEL_TYPES", "check_label_type", "rejection_summary", "empty_source_error",
           "header_hints", "parse_strict_json"]

logger = logging.getLogger("packer.build")

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


def _sorted_entries(folder: Path) -> list[os.DirEntry[str]]:
    with os.scandir(folder) as it:
        entries = list(it)
    entries.sort(key=lambda e: os.fsencode(e.name))
    return entries


def _utf8_name(relative: str) -> bytes | None:
    try:
        return relative.encode("utf-8")
    except UnicodeEncodeError:  # a surrogate-escaped byte: the name is not UTF-8
        return None


def _printable(relative: str) -> str:
    # The name's real bytes, an invalid one shown as \xff (not as the surrogate escape \udcff).
    return os.fsencode(relative).decode("utf-8", "backslashreplace")


def _walk_class(folder: Path, relative: str, label: int, out: _ListingBuilder,
                ancestors: frozenset[tuple[int, int]]) -> None:
    """Depth-first listing of one class folder, following symlinks with loop detection.

    Iterative (an explicit stack of folders being listed), so a class folder nested thousands of
    levels deep lists in the same order as a recursive walk would, without a RecursionError; a
    path too long for the OS is rejected as ``unreadable`` like any folder that cannot be listed.
    """
    stack: list[tuple[Iterator[os.DirEntry[str]], str, frozenset[tuple[int, int]]]] = []
    opened = _open_folder(folder, relative, out)
    if opened is not None:
        stack.append((opened, relative, ancestors))
    while stack:
        entries, here, parents = stack[-1]
        entry = next(entries, None)
        if entry is None:
            stack.pop()
            continue
        rel = f"{here}/{entry.name}"
        if entry.name.startswith("."):
            out.reject(_printable(rel), "hidden-file", "hidden entries are not packed")
            continue
        try:
            st = entry.stat(follow_symlinks=True)
        except FileNotFoundError:
            out.reject(_printable(rel), "dangling-symlink" if entry.is_symlink() else "missing",
                       "symlink target does not exist" if entry.is_symlink() else "vanished while listing")
            continue
        except OSError as exc:
            reason = "symlink-loop" if exc.errno == 40 else "unreadable"  # ELOOP
            out.reject(_printable(rel), reason, f"cannot stat: {exc.strerror}")
            continue
        if stat.S_ISDIR(st.st_mode):
            ident = (st.st_dev, st.st_ino)
            if ident in parents:
                out.reject(_printable(rel + "/"), "symlink-loop", "folder leads back to one of its parents")
                continue
            if ident in out.listed_folders:  # each real folder is listed once, whatever links reach it
                out.reject(_printable(rel + "/"), "duplicate-entry",
                           f"the same folder as {out.listed_folders[ident]}/ (reached again through a symlink)")
                continue
            out.listed_folders[ident] = _printable(rel)
            child = _open_folder(Path(entry.path), rel, out)
            if child is not None:
                stack.append((child, rel, parents | {ident}))
        elif stat.S_ISREG(st.st_mode):
            key = _utf8_name(rel)
            if key is None:  # not UTF-8: packed under its reversible escaped key (packer/names.py)
                out.add(escape_name(os.fsencode(rel)).encode(), st.st_size, label, ESCAPED_META)
                continue
            out.add(key, st.st_size, label, stamp=file_stamp(st))
        else:
            out.reject(_printable(rel), "not-a-file", "not a regular file (device, socket or FIFO)")


def _open_folder(folder: Path, relative: str, out: _ListingBuilder) -> Iterator[os.DirEntry[str]] | None:
    """The sorted entries of ``folder``, or None (and a rejection) if it cannot be listed."""
    try:
        return iter(_sorted_entries(folder))
    except OSError as exc:
        out.reject(_printable(relative + "/"), "unreadable", f"cannot list folder: {exc.strerror}")
        return None


def list_image_folder(root: str | os.PathLike[str], *, progress: Callable[[int], None] | None = None,
                      classes: Sequence[str] | None = None, fields: Sequence[FieldSpec] = ()) -> SourceListing:
    """List an ImageFolder-layout source (see the module docstring for the rules).

    Args:
        root: the folder of class sub-folders.
        progress: called with the running count of entries every 10,000 entries.
        classes: a fixed class list (label i is ``classes[i]``): every file of a class folder not
            in it is rejected as ``unknown-class``; a listed class without a folder has 0 samples.
        fields: declared fields: files are grouped into samples with their side files
            (``cat/001.jpg`` + ``cat/001.mask.png`` + ``cat/001.json``) by the rules of
            ``build/sidefiles.py``. Without fields every file is a candidate, as above.

    Raises:
        SourceError: the root is missing or not a folder.
        EmptySourceError: no class folder holds any file (naming the top rejection reasons).
    """
    root_path = Path(root)
    if not root_path.exists():
        raise SourceError("source folder does not exist", path=root_path)
    if not root_path.is_dir():
        raise SourceError("source is not a folder (give a folder of class sub-folders, or a .csv/.jsonl manifest)",
                          path=root_path)
    out = _ListingBuilder(progress)
    try:
        entries = _sorted_entries(root_path)
    except OSError as exc:
        raise SourceError(f"cannot list the source folder: {exc.strerror}", path=root_path) from None
    class_dirs: list[tuple[str, os.DirEntry[str]]] = []
    for entry in entries:
        if entry.name.startswith("."):
            out.reject(_printable(entry.name), "hidden-file", "hidden entries are not packed")
        elif entry.is_dir(follow_symlinks=True):
            if _utf8_name(entry.name) is None:
                out.reject(_printable(entry.name + "/"), "undecodable-name", "class folder name is not valid UTF-8")
            else:
                class_dirs.append((entry.name, entry))
        elif entry.is_symlink() and not os.path.exists(entry.path):
            out.reject(_printable(entry.name), "dangling-symlink", "symlink target does not exist")
        else:
            out.reject(_printable(entry.name), "not-in-class-folder",
                       "files must sit inside a class sub-folder (ImageFolder layout)")
    root_stat = root_path.stat()
    folder_names = [name for name, _ in class_dirs]
    warning = split_folder_warning(folder_names)
    if warning:
        logger.warning("%s: %s", root_path, warning)
    class_names = tuple(classes) if classes is not None else tuple(folder_names)
    class_ids = {name: i for i, name in enumerate(class_names)}
    for name, entry in class_dirs:
        label = class_ids.get(name, -1)
        if label < 0:
            _reject_unknown_class(Path(entry.path), name, out, root_stat)
            continue
        st = entry.stat(follow_symlinks=True)
        if (st.st_dev, st.st_ino) in out.listed_folders:
            out.reject(_printable(name + "/"), "duplicate-entry", f"the same folder as class "
                       f"{out.listed_folders[(st.st_dev, st.st_ino)]}/ (a symlink); this class stays empty")
            continue
        out.listed_folders[(st.st_dev, st.st_ino)] = _printable(name)
        _walk_class(Path(entry.path), name, label, out,
                    frozenset({(root_stat.st_dev, root_stat.st_ino), (st.st_dev, st.st_ino)}))
    listing = out.finish(root_path, "folder", class_names)
    listing.warnings = [warning] if warning else []
    if len(listing) == 0:
        raise empty_source_error(
            f"no files found under {len(class_dirs)} class folder(s)"
            f"{'' if class_dirs else ' (expected class sub-folders such as SRC/cat/1.jpg)'}",
            listing.rejected, path=root_path)
    if fields:
        listing = _group_side_files(listing, fields)
        if len(listing) == 0:
            raise empty_source_error(f"no sample under {len(class_dirs)} class folder(s) has its image and "
                                     f"declared fields", listing.rejected, path=root_path)
    return listing


def _group_side_files(listing: SourceListing, fields: Sequence[FieldSpec]) -> SourceListing:
    """The folder's files as samples of side files (``build/sidefiles.py``), in listing order.

    Files of one key are usually neighbours in the sorted walk, but not always (``1-a.jpg``
    sorts between ``1`` and ``1.jpg``; a sub-folder can sit between them), so they are grouped
    by a 64-bit hash of the key with a stable sort: flat arrays, not a dict of 100 M keys. A
    sample comes at the position of its first file; keys whose hashes collide are told apart
    by the keys themselves. Keys are handled as UTF-8 bytes (``/`` and ``.`` never occur inside
    a multi-byte character), sliced from one ``bytes`` copy of the key blob: the per-file cost
    is a few hundred nanoseconds beside the side file's read.
    """
    count = len(listing)
    blob = listing.key_blob.tobytes()
    offsets = listing.key_offsets.tolist()

    def stem(row: int) -> bytes:
        folder, slash, base = blob[offsets[row]:offsets[row + 1]].rpartition(b"/")
        return folder + slash + base.partition(b".")[0]

    hashes = np.fromiter((xxhash.xxh3_64_intdigest(stem(i)) for i in range(count)), dtype=np.uint64, count=count)
    order = np.lexsort((np.arange(count), hashes))  # by hash, then listing order inside a hash
    sorted_hashes = hashes[order]
    starts = np.flatnonzero(np.r_[True, sorted_hashes[1:] != sorted_hashes[:-1]])
    ends = np.r_[starts[1:], count]
    sizes, labels = listing.sizes.tolist(), listing.labels.tolist()
    escaped = (np.diff(listing.meta_offsets.astype(np.int64)) > 0).tolist()  # the walk's only metadata
    root = os.fspath(listing.root)
    limits: dict[str, int] = {}  # suffix -> read_limit: few distinct suffixes
    out = _ListingBuilder()
    out.rejected = list(listing.rejected)
    builder = FieldRowBuilder(fields)

    def sample(rows: list[int]) -> None:
        members = []
        for row in rows:
            name = blob[offsets[row]:offsets[row + 1]].decode("utf-8")
            if escaped[row]:
                out.reject(name, "undecodable-name", "with --field, files are grouped into samples by their "
                                                     "names, which must be UTF-8")
                continue
            suffix = name.rpartition("/")[2].partition(".")[2]
            limit = limits.get(suffix)
            if limit is None:
                limit = limits[suffix] = read_limit(suffix, fields)
            data = None
            if 0 <= sizes[row] <= limit:
                data = _read_side_file(os.path.join(root, name), sizes[row], limit)
                if isinstance(data, str):
                    out.reject(name, "unreadable", data)
                    continue
            members.append(SideMember(name, suffix, sizes[row], data, row))
        if members:
            _add_side_file_sample(members, builder, out, labels, listing)

    later: list[tuple[int, list[int]]] = []  # a colliding hash's other keys, by their first row (a heap)
    for run in np.argsort(order[starts], kind="stable").tolist():
        rows = order[starts[run]:ends[run]].tolist()
        while later and later[0][0] < rows[0]:
            sample(heapq.heappop(later)[1])
        if len(rows) > 1:
            groups: dict[bytes, list[int]] = {}
            for row in rows:
                groups.setdefault(stem(row), []).append(row)
            rows, *others = groups.values()
            for group in others:
                heapq.heappush(later, (group[0], group))
        sample(rows)
    while later:
        sample(heapq.heappop(later)[1])
    grouped = out.finish(listing.root, listing.kind, listing.classes)
    grouped.warnings = listing.warnings
    grouped.fields = builder.finish()
    return grouped


def _add_side_file_sample(members: list[SideMember], builder: FieldRowBuilder, out: _ListingBuilder,
                          labels: list[int], listing: SourceListing) -> None:
    """One sample of an image folder with fields (``members``: its files, in listing order)."""
    parts = assemble_sample(split_key(members[0].name)[0], members, builder)
    for name, reason, message in parts.unused:
        out.reject(name, reason, message)
    if parts.rejection is not None or parts.image is None:
        out.reject(*parts.rejection)  # type: ignore[misc]  (no image means a rejection)
        return
    builder.add(parts.values)
    image = parts.image
    meta = json.dumps(parts.metadata, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode() \
        if parts.metadata else b""
    out.add(image.name.encode("utf-8"), image.size, labels[image.handle], meta, stamp=listing.stamp(image.handle))


def _read_side_file(path: str, size: int, limit: int) -> bytes | str:
    """A side file's bytes (at most ``limit``), or a message saying why it cannot be read."""
    try:
        fd, info = open_nonblocking(path)
    except OSError as exc:
        return f"cannot open the side file: {exc.strerror or exc}"
    try:
        if not stat.S_ISREG(info.st_mode):
            return "the side file is no longer a regular file"
        data = read_fd_capped(fd, limit, size)
    except OSError as exc:
        return f"cannot read the side file: {exc.strerror or exc}"
    finally:
        os.close(fd)
    return data if data is not None else f"the side file grew past {limit} bytes while it was read"


def _reject_unknown_class(folder: Path, name: str, out: _ListingBuilder, root_stat: os.stat_result) -> None:
    """Reject every file of a class folder that is not in the given class list, one by one
    (the build report names each file, as for any other rejection)."""
    scratch = _ListingBuilder()
    scratch.listed_folders = out.listed_folders  # one folder reached twice is still a duplicate
    try:
        st = folder.stat()
    except OSError as exc:
        out.reject(_printable(name + "/"), "unreadable", f"cannot stat: {exc.strerror}")
        return
    _walk_class(folder, name, -1, scratch,
                frozenset({(root_stat.st_dev, root_stat.st_ino), (st.st_dev, st.st_ino)}))
    listing = scratch.finish(folder, "folder", ())
    for i in range(len(listing)):
        out.reject(listing.key(i), "unknown-class", f"class folder {name!r} is not in the class list (--classes)")
    for rejection in scratch.rejected:
        out.reject(rejection.key, rejection.reason, rejection.message)


#: JSONL limits: a row longer than this, or nested deeper, is rejected before it is parsed
#: (a row nested 100,000 brackets deep would otherwise end the build with RecursionError).
MAX_MANIFEST_ROW_BYTES = 1 << 20

#: Header names people give the path and label columns, and what to rename them to.
_PATH_ALIASES = ("file_name", "filename", "file", "filepath", "file_path", "image", "image_path", "img", "path ")
_LABEL_ALIASES = ("labels", "class", "class_name", "target", "category", "y", "label_id")


def header_hints(columns: list[str]) -> list[str]:
    """Suggested fixes for a manifest header (CSV columns or JSONL keys) without path/label."""
    hints = []
    stripped = {c.strip().lower(): c for c in columns if isinstance(c, str)}
    for wanted, aliases in (("path", _PATH_ALIASES), ("label", _LABEL_ALIASES)):
        if wanted in columns:
            continue
        if wanted in stripped:
            hints.append(f"column {stripped[wanted]!r} has spaces or capitals: name it exactly {wanted!r}")
            continue
        alias = next((stripped[a] for a in aliases if a in stripped), None)
        if alias is not None:
            origin = " (HuggingFace imagefolder metadata names it file_name)" if alias.strip() == "file_name" else ""
            hints.append(f"rename column {alias!r} to {wanted!r}{origin}")
        else:
            hints.append(f"no {wanted!r} column (columns: {', '.join(map(repr, columns[:10]))})")
    return hints


def _manifest_rows(path: Path, *, label_optional: bool = False
                   ) -> Iterator[tuple[int, dict[str, object] | None, str]]:
    """Yield (line number, row, error) from a CSV or JSONL manifest, streaming line by line.

    Raises:
        SourceError: not a manifest suffix, unreadable, not UTF-8, or a CSV header without a
            ``path`` and ``label`` column or with a repeated column (the fix is suggested).
    """
    suffix = path.suffix.lower()
    if suffix not in (".jsonl", ".ndjson", ".csv", ".tsv"):
        raise SourceError("manifest must be .csv, .tsv or .jsonl", path=path)
    try:
        handle = open(path, encoding="utf-8-sig", newline="")
    except OSError as exc:
        raise SourceError(f"cannot read the manifest: {exc.strerror}", path=path) from None
    try:
        with handle:
            if suffix in (".jsonl", ".ndjson"):
                yield from _jsonl_rows(handle)
            else:
                yield from _csv_rows(handle, path, "\t" if suffix == ".tsv" else ",", label_optional=label_optional)
    except UnicodeDecodeError as exc:
        raise SourceError(f"manifest is not UTF-8 text ({exc.reason})", path=path) from None
    except csv.Error as exc:
        raise SourceError(f"manifest is not valid CSV: {exc}", path=path) from None


def _jsonl_rows(handle: Any) -> Iterator[tuple[int, dict[str, object] | None, str]]:
    number = 0
    while True:
        # readline with a cap: a 10 GB line without a newline is read in bounded pieces
        line = handle.readline(MAX_MANIFEST_ROW_BYTES + 1)
        if not line:
            return
        number += 1
        if len(line) > MAX_MANIFEST_ROW_BYTES and not line.endswith("\n"):
            while line and not line.endswith("\n"):  # skip the rest of the oversize row
                line = handle.readline(MAX_MANIFEST_ROW_BYTES + 1)
            yield number, None, f"line is longer than {MAX_MANIFEST_ROW_BYTES} characters"
            continue
        if not line.strip():
            continue
        if not json_depth_ok(line):
            yield number, None, f"line nests brackets deeper than {MAX_JSON_DEPTH} levels"
            continue
        try:
            row = parse_strict_json(line)
        except (ValueError, RecursionError) as exc:
            yield number, None, f"line is not strict JSON: {exc}"
            continue
        yield (number, row, "") if isinstance(row, dict) else (number, None, "line is not a JSON object")


def _csv_rows(handle: Any, path: Path, delimiter: str, *, label_optional: bool = False
              ) -> Iterator[tuple[int, dict[str, object] | None, str]]:
    reader = csv.reader(handle, delimiter=delimiter)
    header = next(reader, None)
    if not header:
        raise SourceError("CSV manifest is empty (it needs a header row: path,label)", path=path)
    repeated = sorted({c for c in header if header.count(c) > 1})
    if repeated:  # csv.DictReader would silently keep the last of two 'path' columns
        raise SourceError(f"CSV manifest header repeats column(s) {repeated}: each column must appear once",
                          path=path)
    if "path" not in header or ("label" not in header and not label_optional):
        raise SourceError(f"CSV manifest needs a header row with 'path' and 'label' columns, got {header[:10]}: "
                          + "; ".join(header_hints(header)), path=path)
    if "metadata" in header:
        raise SourceError("a CSV column named 'metadata' would be stored as a string, not an object: rename "
                          "it (every column other than path and label is stored as a metadata field), or "
                          "use a JSONL manifest with a 'metadata' object", path=path)
    width = len(header)
    for values in reader:
        if not values:
            continue
        if len(values) != width:
            yield reader.line_num, None, f"row has {len(values)} fields, the header has {width}"
            continue
        yield reader.line_num, dict(zip(header, values)), ""


class _LabelReader:
    """Turns manifest labels into int64 labels, by ``label_type`` (see ``LABEL_TYPES``).

    Class names are numbered in order of first appearance while streaming and renumbered by
    sorted name at the end (``finish``), unless a class list was given: then the list numbers them.
    """

    def __init__(self, label_type: str, classes: tuple[str, ...] | None, manifest: Path) -> None:
        self.label_type = "str" if label_type == "auto" and classes is not None else label_type
        self.given = classes
        self.class_ids: dict[str, int] = {name: i for i, name in enumerate(classes)} if classes else {}
        self.manifest = manifest
        self.first_int: tuple[int, object] | None = None
        self.first_name: tuple[int, object] | None = None

    def read(self, label: object, number: int) -> tuple[int | None, str, str]:
        """(label value, rejection reason, message); value None when rejected."""
        if isinstance(label, list):
            return None, "bad-manifest-row", (f"label {label!r} is a list (multi-label): a sample has one "
                                              f"integer label; put the list in metadata")
        if label is None or label == "" or isinstance(label, (bool, float, dict)):
            return None, "bad-manifest-row", f"label must be an integer or a class name, got {label!r}"
        if self.label_type == "str":
            return self._name(str(label), number)
        integer = label if isinstance(label, int) else _strict_int(label)  # label is a str here
        if integer is None:
            if self.label_type == "int":
                return None, "bad-manifest-row", (f"label {label!r} is not an integer (--label-type int: plain "
                                                  f"ASCII digits with an optional '-', nothing else)")
            if loose_int(label):
                return None, "bad-manifest-row", (
                    f"label {label!r} looks like an integer but is not plain ASCII digits (spaces, '_', '+', "
                    f"leading zeros or non-ASCII digits): packer reads labels strictly; fix the row, or pass "
                    f"--label-type str to use every label as a class name")
            return self._name(label, number)
        if not -(1 << 63) <= integer < (1 << 63):
            return None, "bad-manifest-row", f"label {integer} does not fit in a signed 64-bit integer"
        if self.given is not None and not 0 <= integer < len(self.given):
            return None, "unknown-class", f"label {integer} is outside the {len(self.given)} classes given"
        self.first_int = self.first_int or (number, label)
        self._check_mix(number)
        return integer, "", ""

    def _name(self, name: str, number: int) -> tuple[int | None, str, str]:
        self.first_name = self.first_name or (number, name)
        self._check_mix(number)
        if self.given is not None:
            value = self.class_ids.get(name)
            if value is None:
                return None, "unknown-class", f"class {name!r} is not in the class list (--classes)"
            return value, "", ""
        return self.class_ids.setdefault(name, len(self.class_ids)), "", ""

    def _check_mix(self, number: int) -> None:
        if self.first_int is not None and self.first_name is not None:
            (i_line, i_label), (n_line, n_label) = self.first_int, self.first_name
            raise SourceError(f"manifest mixes integer labels (line {i_line}: {i_label!r}) and class-name labels "
                              f"(line {n_line}: {n_label!r}); use one kind, or pass --label-type str to read "
                              f"every label as a class name", path=self.manifest)

    @property
    def kind(self) -> str:
        """``"int"`` or ``"str"``: what the labels were read as."""
        return "str" if self.label_type == "str" or self.first_name is not None else "int"

    def finish(self, labels: array) -> tuple[tuple[str, ...], array]:
        """(classes, labels renumbered to the sorted class order)."""
        if self.given is not None:
            return self.given, labels
        if self.kind == "int":
            return (), labels
        classes = tuple(sorted(self.class_ids, key=str.encode))
        remap = np.empty(len(self.class_ids), dtype=np.int64)
        for sorted_id, name in enumerate(classes):
            remap[self.class_ids[name]] = sorted_id
        values = np.frombuffer(labels, dtype=np.int64)
        return classes, (array("q", remap[values].tobytes()) if len(values) else labels)


def _row_metadata(row: dict[str, object], jsonl: bool, exclude: frozenset[str] = frozenset()
                  ) -> tuple[bytes | None, str]:
    """(canonical JSON metadata or b"", error); bytes None when the row's metadata is refused.

    ``exclude``: columns that are declared fields' sources (stored as fields, not metadata).
    """
    if jsonl and "metadata" in row:
        meta_obj = row["metadata"]
        if meta_obj is None:
            return b"", ""
        if not isinstance(meta_obj, dict):
            return None, f"metadata must be a JSON object, got {type(meta_obj).__name__}"
    else:  # CSV columns, or a JSONL row's other keys, are the metadata fields
        meta_obj = {k: v for k, v in row.items() if k not in ("path", "label") and k not in exclude}
    if not meta_obj:
        return b"", ""
    try:
        text = json.dumps(meta_obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (ValueError, TypeError) as exc:  # non-finite numbers cannot reach here (parse_strict_json)
        return None, f"metadata is not storable as strict JSON ({exc})"
    return text.encode("utf-8", "surrogatepass"), ""


def check_row_file(rel: str, root: Path) -> tuple[str, int, str, str]:
    """(key, size, rejection reason, message) of a manifest path; reason "" when usable."""
    if "\x00" in rel:  # no usable key: the caller names the row by its line instead
        return "", 0, "bad-manifest-row", "path contains a NUL character"
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: no file name and no valid key
        return "", 0, "undecodable-name", "path is not valid Unicode text"
    key = rel.replace(os.sep, "/")
    normal = os.path.normpath(rel)
    # Lexical check only (like the folder walk, symlinks are followed): resolving every path
    # with realpath would cost one lstat per path component per row.
    if os.path.isabs(rel) or normal == ".." or normal.startswith(".." + os.sep):
        return key, 0, "outside-root", f"path leads outside the root {root}"
    key = normal.replace(os.sep, "/")  # one spelling per file: "a/./b.jpg" is "a/b.jpg"
    full = os.path.join(root, normal)
    try:
        st = os.stat(full)
    except FileNotFoundError:
        return key, 0, "dangling-symlink" if os.path.islink(full) else "missing", "file does not exist"
    except OSError as exc:
        return key, 0, "unreadable", f"cannot stat: {exc.strerror}"
    if not stat.S_ISREG(st.st_mode):
        return key, 0, "not-a-file", "not a regular file"
    return key, st.st_size, "", ""


def _row_value(row: dict[str, object], spec: FieldSpec) -> object:
    if spec.source not in row:
        raise FieldValueError(f"field {spec.name!r}: the row has no {spec.source!r} "
                              f"{'member' if not isinstance(row.get('path'), str) else 'column or member'}")
    return row[spec.source]


def _row_image(spec: FieldSpec, value: object, root: Path) -> tuple[str, int]:
    """(key, size) of an image field's file named by a manifest row, relative to ``root``."""
    if not isinstance(value, str) or not value:
        raise FieldValueError(f"field {spec.name!r} is an image: its value must be a path relative to the root, "
                              f"got {value!r}")
    key, size, reason, message = check_row_file(value, root)
    if reason:
        raise FieldValueError(f"field {spec.name!r}: {value!r}: {message} ({reason})")
    if size == 0:
        raise FieldValueError(f"field {spec.name!r}: {value!r} is an empty file")
    return key, size


def list_manifest(manifest: str | os.PathLike[str], root: str | os.PathLike[str] | None = None, *,
                  progress: Callable[[int], None] | None = None, classes: Sequence[str] | None = None,
                  label_type: str = "auto", fields: Sequence[FieldSpec] = ()) -> SourceListing:
    """List the images named by a CSV/JSONL manifest, in the manifest's order.

    CSV columns other than ``path`` and ``label`` become the sample's metadata (strings); JSONL
    rows may carry a ``metadata`` object (strict JSON: no NaN/Infinity, rows at most
    ``MAX_MANIFEST_ROW_BYTES`` long and ``MAX_JSON_DEPTH`` deep). Labels follow ``label_type``
    (see ``LABEL_TYPES``). Streaming: rows go straight into flat arrays, so a manifest of 100 M
    rows is never a list of 100 M Python objects; duplicates are found afterwards by sorting
    64-bit key hashes.

    Args:
        manifest: the ``.csv``/``.tsv``/``.jsonl`` file.
        root: the folder paths are relative to (default: the manifest's folder).
        progress: called with the running count of rows every 10,000 rows.
        classes: a fixed class list: labels are names in it (or indices into it with
            ``label_type="int"``); any other label is rejected as ``unknown-class``.
        label_type: ``"auto"``, ``"int"`` or ``"str"``.
        fields: declared fields (``packer.fields``): each row's value of field F is its column
            (JSONL member) ``F.source``; a CSV cell of an array or classes field is JSON (classes
            also ``a|b|c``); an image field's value is a path relative to ``root``. With fields
            declared the ``label`` column is optional (missing: ``-1``, unlabelled). A row whose
            value is missing or does not fit is rejected as ``bad-field``.

    Raises:
        SourceError: unreadable manifest, mixed label kinds, a header without path/label.
        EmptySourceError: no usable rows (its message names the top reasons, with examples).
    """
    manifest_path = Path(manifest)
    if not manifest_path.is_file():
        raise SourceError("manifest file does not exist", path=manifest_path)
    root_path = Path(root) if root is not None else manifest_path.parent
    if not root_path.is_dir():
        raise SourceError("manifest root is not a folder", path=root_path)
    check_label_type(label_type)
    jsonl = manifest_path.suffix.lower() in (".jsonl", ".ndjson")
    out = _ListingBuilder(progress)
    key_hashes = array("Q")
    labels = _LabelReader(label_type, tuple(classes) if classes is not None else None, manifest_path)
    first_keys: list[str] | None = None  # the first rejected JSONL row's keys, for the header hints
    field_rows = FieldRowBuilder(fields) if fields else None
    labelled = False  # a row had a label (with fields declared, the column may be absent)
    field_sources = frozenset(spec.source for spec in fields)
    for number, row, error in _manifest_rows(manifest_path, label_optional=bool(fields)):
        where = f"{manifest_path.name}:{number}"
        if row is None:
            out.reject(where, "bad-manifest-row", error)
            continue
        if fields and "label" not in row:
            row["label"] = -1  # detection, captions: samples need no class
        else:
            labelled = True
        rel = row.get("path")
        if not isinstance(rel, str) or not rel or "label" not in row:
            first_keys = first_keys if first_keys is not None else [str(k) for k in row]
            hint = "; ".join(header_hints([str(k) for k in row]))
            out.reject(where, "bad-manifest-row", f"row needs a non-empty 'path' and a 'label' ({hint})")
            continue
        value, reason, message = labels.read(row["label"], number)
        if value is None:
            out.reject(where, reason, message)
            continue
        meta, meta_error = _row_metadata(row, jsonl, field_sources)
        if meta is None:
            out.reject(where, "bad-metadata", meta_error)
            continue
        key, size, reason, message = check_row_file(rel, root_path)
        if reason:
            out.reject(key or where, reason, message)
            continue
        if field_rows is not None:
            try:
                values = field_rows.encode(lambda spec: _row_value(row, spec), from_text=not jsonl,
                                           resolve_image=lambda spec, value: _row_image(spec, value, root_path))
            except FieldValueError as exc:
                out.reject(key, FIELD_REJECTION, str(exc))
                continue
            field_rows.add(values)
        encoded = key.encode("utf-8")
        out.add(encoded, size, value, meta)
        key_hashes.append(xxhash.xxh3_64_intdigest(encoded))
    class_names, out.labels = labels.finish(out.labels)
    listing = out.finish(root_path, "manifest", class_names)
    listing.label_type = labels.kind if labelled or not fields else "none"
    if field_rows is not None:
        listing.fields = field_rows.finish()
    listing = drop_duplicate_keys(listing, np.frombuffer(key_hashes, dtype=np.uint64))
    if len(listing) == 0:
        hints = header_hints(first_keys) if first_keys else []
        raise empty_source_error("manifest lists no usable files", listing.rejected, path=manifest_path,
                                 hints=hints)
    return listing


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


#: How manifest labels are read (``--label-type``):
#: ``auto`` (default): labels that are all integers (JSON integers, or CSV text of plain ASCII
#: digits with an optional ``-``: no spaces, ``_``, ``+``, leading zeros or other scripts' digits)
#: stay integers; labels that are all other strings are class names, numbered in sorted order;
#: a mix is an error; a label that only *looks* like an integer (``" 1 "``, ``"1_000"``, ``"١"``)
#: is rejected with a reason. With ``--classes``, ``auto`` means ``str``.
#: ``int``: every label must be an integer (else the row is rejected).
#: ``str``: every label is a class name, as written (``"1"`` and ``" 1 "`` are two classes).
LABEL_TYPES = ("auto", "int", "str")


def check_label_type(label_type: str) -> str:
    """Raises OptionError unless ``label_type`` is one of ``LABEL_TYPES``."""
    if label_type not in LABEL_TYPES:
        raise OptionError(f"--label-type must be one of {', '.join(LABEL_TYPES)}, got {label_type!r}")
    return label_type


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


_STRICT_INT = re.compile(r"-?(0|[1-9][0-9]*)\Z")


def _strict_int(text: str) -> int | None:
    """The integer ``text`` spells in plain ASCII digits (``-12``), else None (``" 1 "``, ``"1_000"``)."""
    if len(text) > 20 or not _STRICT_INT.match(text):
        return None
    return int(text)


def loose_int(text: str) -> bool:
    """True when Python's ``int()`` would read ``text`` (spaces, ``_``, ``+``, Unicode digits)."""
    try:
        int(text)
    except ValueError:
        return False
    return True


def list_source(source: str | os.PathLike[str], root: str | os.PathLike[str] | None = None, *,
                progress: Callable[[int], None] | None = None, classes: Sequence[str] | None = None,
                label_type: str = "auto", fields: Sequence[FieldSpec] = ()) -> SourceListing:
    """List a folder or a manifest file, whichever ``source`` is.

    ``progress`` is called with the running count of entries every 10,000 entries (listing
    100 M files takes minutes even on a fast file system: the build shows a counter).
    ``classes`` fixes the class list (see ``list_image_folder``, ``list_manifest``);
    ``label_type`` applies to manifests.
    """
    path = Path(source)
    if path.is_file():
        return list_manifest(path, root, progress=progress, classes=classes, label_type=label_type, fields=fields)
    return list_image_folder(path, progress=progress, classes=classes, fields=fields)

