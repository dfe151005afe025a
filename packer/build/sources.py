"""Source discovery: turn an image folder or a manifest file into a sorted, flat listing.

The listing is the input of the shard plan, so its order is part of the determinism contract:

* Image folder (torchvision ImageFolder layout): every top-level sub-folder is a class; class
  names are sorted by their UTF-8 bytes and labelled 0..C-1. Files are listed depth-first with
  siblings sorted by the UTF-8 bytes of their names; files in nested sub-folders belong to the
  top-level class. Every file is a candidate whatever its extension: the packer decides what is
  an image by its bytes, so a ``.jpg`` that is really text is *rejected with a reason*, not
  skipped. Hidden entries (a leading ``.``) and files at the top level are rejected too.
* Symlinks are followed (files and folders); a dangling one or a loop is rejected with a reason.
  Each real folder is listed once: a second path to it (through a symlink) is rejected as a
  ``duplicate-entry``, which also keeps a fan-out of folder links from listing exponentially.
* Manifest input (CSV with a ``path,label[,...]`` header, or JSONL objects with ``path``,
  ``label`` and optional ``metadata``): listed in the manifest's order, paths relative to a root.
  String labels become sorted class names; integer labels are kept as they are.

Paths are held in one UTF-8 blob plus offsets (not a Python list of strings), so listing ten
million files costs about 100 bytes per file, not a kilobyte of Python objects.
"""

from __future__ import annotations

import csv
import json
import os
import stat
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import xxhash

from ..errors import EmptySourceError, SourceError

__all__ = ["Rejection", "SourceListing", "list_image_folder", "list_manifest", "list_source",
           "REJECTION_REASONS"]

#: Every reason a source file can be rejected for (the build report's ``reason`` field).
REJECTION_REASONS = {
    "empty-file": "the file has zero bytes",
    "not-an-image": "the bytes are not an image Pillow can identify",
    "unsupported-format": "an image format packer does not pack (JPEG, PNG, WEBP, GIF, BMP, TIFF are)",
    "truncated": "the image ends early",
    "decode-failed": "the image could not be decoded (--validate full)",
    "too-many-pixels": "width x height over the pixel limit (decompression-bomb guard)",
    "unreadable": "the file could not be read (permissions, I/O error)",
    "dangling-symlink": "a symlink whose target does not exist",
    "symlink-loop": "a symlinked folder that leads back to one of its parents",
    "missing": "a manifest entry whose file does not exist",
    "changed-during-build": "the file changed size between listing and packing",
    "hidden-file": "a name starting with '.' (e.g. .DS_Store)",
    "not-in-class-folder": "a file at the top level of an image folder, outside any class folder",
    "outside-root": "a manifest path that leads outside the root",
    "duplicate-entry": "a manifest path listed more than once",
    "undecodable-name": "a file name that is not valid UTF-8",
    "not-a-file": "a device, socket or FIFO",
    "bad-manifest-row": "a manifest row without a usable path or label",
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
        self.labels = array("q")
        self.meta_blob = bytearray()
        self.meta_offsets = array("Q", [0])
        self.rejected: list[Rejection] = []
        self.listed_folders: dict[tuple[int, int], str] = {}  # (st_dev, st_ino) -> first relative path

    def _tick(self) -> None:
        self.seen += 1
        if self.progress is not None and self.seen % 10_000 == 0:
            self.progress(self.seen)

    def add(self, key: bytes, size: int, label: int, meta: bytes = b"") -> None:
        self._tick()
        self.key_blob += key
        self.key_offsets.append(len(self.key_blob))
        self.sizes.append(size)
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
            labels=np.frombuffer(self.labels, dtype=np.int64).copy(),
            meta_blob=np.frombuffer(bytes(self.meta_blob), dtype=np.uint8),
            meta_offsets=np.frombuffer(self.meta_offsets, dtype=np.uint64).copy(),
            rejected=self.rejected)


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
    """Depth-first listing of one class folder, following symlinks with loop detection."""
    try:
        entries = _sorted_entries(folder)
    except OSError as exc:
        out.reject(_printable(relative + "/"), "unreadable", f"cannot list folder: {exc.strerror}")
        return
    for entry in entries:
        rel = f"{relative}/{entry.name}"
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
            if ident in ancestors:
                out.reject(_printable(rel + "/"), "symlink-loop", "folder leads back to one of its parents")
                continue
            if ident in out.listed_folders:  # each real folder is listed once, whatever links reach it
                out.reject(_printable(rel + "/"), "duplicate-entry",
                           f"the same folder as {out.listed_folders[ident]}/ (reached again through a symlink)")
                continue
            out.listed_folders[ident] = _printable(rel)
            _walk_class(Path(entry.path), rel, label, out, ancestors | {ident})
        elif stat.S_ISREG(st.st_mode):
            key = _utf8_name(rel)
            if key is None:
                out.reject(_printable(rel), "undecodable-name", "file name is not valid UTF-8")
                continue
            out.add(key, st.st_size, label)
        else:
            out.reject(_printable(rel), "not-a-file", "not a regular file (device, socket or FIFO)")


def list_image_folder(root: str | os.PathLike[str], *, progress: Callable[[int], None] | None = None
                      ) -> SourceListing:
    """List an ImageFolder-layout source (see the module docstring for the rules).

    Raises:
        SourceError: the root is missing or not a folder.
        EmptySourceError: no class folder holds any file.
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
    for label, (name, entry) in enumerate(class_dirs):
        st = entry.stat(follow_symlinks=True)
        if (st.st_dev, st.st_ino) in out.listed_folders:
            out.reject(_printable(name + "/"), "duplicate-entry", f"the same folder as class "
                       f"{out.listed_folders[(st.st_dev, st.st_ino)]}/ (a symlink); this class stays empty")
            continue
        out.listed_folders[(st.st_dev, st.st_ino)] = _printable(name)
        _walk_class(Path(entry.path), name, label, out,
                    frozenset({(root_stat.st_dev, root_stat.st_ino), (st.st_dev, st.st_ino)}))
    listing = out.finish(root_path, "folder", tuple(name for name, _ in class_dirs))
    if len(listing) == 0:
        raise EmptySourceError(
            f"no files found under {len(class_dirs)} class folder(s)"
            f"{'' if class_dirs else ' (expected class sub-folders such as SRC/cat/1.jpg)'}",
            path=root_path)
    return listing


def _manifest_rows(path: Path) -> Iterator[tuple[int, dict[str, object] | None, str]]:
    """Yield (line number, row, error) from a CSV or JSONL manifest, streaming line by line."""
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
                for number, line in enumerate(handle, 1):
                    if not line.strip():
                        continue
                    try:
                        row = json.loads(line)
                    except ValueError as exc:
                        yield number, None, f"line is not JSON: {exc}"
                        continue
                    yield (number, row, "") if isinstance(row, dict) else (number, None, "line is not a JSON object")
            else:
                reader = csv.DictReader(handle, delimiter="\t" if suffix == ".tsv" else ",")
                if not reader.fieldnames or "path" not in reader.fieldnames:
                    raise SourceError(f"CSV manifest needs a header row with a 'path' column (and 'label'), "
                                      f"got {reader.fieldnames}", path=path)
                for row in reader:
                    yield reader.line_num, dict(row), ""
    except UnicodeDecodeError as exc:
        raise SourceError(f"manifest is not UTF-8 text ({exc.reason})", path=path) from None
    except csv.Error as exc:
        raise SourceError(f"manifest is not valid CSV: {exc}", path=path) from None


def list_manifest(manifest: str | os.PathLike[str], root: str | os.PathLike[str] | None = None, *,
                  progress: Callable[[int], None] | None = None) -> SourceListing:
    """List the images named by a CSV/JSONL manifest, in the manifest's order.

    CSV columns other than ``path`` and ``label`` become the sample's metadata (strings); JSONL
    rows may carry a ``metadata`` object. Labels are all integers or all class-name strings.
    Streaming: rows go straight into flat arrays, so a manifest of 100 M rows is never a list of
    100 M Python objects; duplicates are found afterwards by sorting 64-bit key hashes.

    Raises:
        SourceError: unreadable manifest, mixed label kinds, missing header.
        EmptySourceError: no usable rows.
    """
    manifest_path = Path(manifest)
    if not manifest_path.is_file():
        raise SourceError("manifest file does not exist", path=manifest_path)
    root_path = Path(root) if root is not None else manifest_path.parent
    if not root_path.is_dir():
        raise SourceError("manifest root is not a folder", path=root_path)
    out = _ListingBuilder(progress)
    key_hashes = array("Q")
    class_ids: dict[str, int] = {}  # class name -> id in order of first appearance (remapped below)
    label_kinds: set[str] = set()
    for number, row, error in _manifest_rows(manifest_path):
        where = f"{manifest_path.name}:{number}"
        if row is None:
            out.reject(where, "bad-manifest-row", error)
            continue
        rel, label = row.get("path"), row.get("label")
        if not isinstance(rel, str) or not rel or label is None or label == "" or isinstance(label, bool):
            out.reject(where, "bad-manifest-row", "row needs a non-empty 'path' and a 'label'")
            continue
        if isinstance(label, int) or (isinstance(label, str) and _is_int_text(label)):
            value = int(label)
            if not -(1 << 63) <= value < (1 << 63):
                out.reject(where, "bad-manifest-row", f"label {value} does not fit in a signed 64-bit integer")
                continue
            label_kinds.add("int")
        elif isinstance(label, str):
            label_kinds.add("name")
            value = class_ids.setdefault(label, len(class_ids))
        else:
            out.reject(where, "bad-manifest-row", f"label must be an integer or a class name, got {label!r}")
            continue
        if len(label_kinds) > 1:
            raise SourceError(f"manifest mixes integer and class-name labels (line {number}); use one kind",
                              path=manifest_path)
        meta_obj = row["metadata"] if "metadata" in row else {
            k: v for k, v in row.items() if k not in ("path", "label") and k is not None}
        meta = (json.dumps(meta_obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
                if meta_obj not in ({}, None) else b"")
        key = rel.replace(os.sep, "/")
        if "\x00" in rel:
            out.reject(where, "bad-manifest-row", "path contains a NUL character")
            continue
        try:
            rel.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: no file name and no valid key
            out.reject(where, "undecodable-name", "path is not valid Unicode text")
            continue
        normal = os.path.normpath(rel)
        # Lexical check only (like the folder walk, symlinks are followed): resolving every path
        # with realpath would cost one lstat per path component per row.
        if os.path.isabs(rel) or normal == ".." or normal.startswith(".." + os.sep):
            out.reject(key, "outside-root", f"path leads outside the root {root_path}")
            continue
        key = normal.replace(os.sep, "/")  # one spelling per file: "a/./b.jpg" is "a/b.jpg"
        full = os.path.join(root_path, normal)
        try:
            st = os.stat(full)
        except FileNotFoundError:
            out.reject(key, "dangling-symlink" if os.path.islink(full) else "missing", "file does not exist")
            continue
        except OSError as exc:
            out.reject(key, "unreadable", f"cannot stat: {exc.strerror}")
            continue
        if not stat.S_ISREG(st.st_mode):
            out.reject(key, "not-a-file", "not a regular file")
            continue
        encoded = key.encode("utf-8")
        out.add(encoded, st.st_size, value, meta)
        key_hashes.append(xxhash.xxh3_64_intdigest(encoded))
    classes: tuple[str, ...] = ()
    if "name" in label_kinds:
        classes = tuple(sorted(class_ids, key=str.encode))
        remap = np.empty(len(class_ids), dtype=np.int64)
        for sorted_id, name in enumerate(classes):
            remap[class_ids[name]] = sorted_id
        labels = np.frombuffer(out.labels, dtype=np.int64)
        out.labels = array("q", remap[labels].tobytes()) if len(labels) else out.labels
    listing = out.finish(root_path, "manifest", classes)
    listing = _drop_duplicates(listing, np.frombuffer(key_hashes, dtype=np.uint64))
    if len(listing) == 0:
        raise EmptySourceError(f"manifest lists no usable files ({len(listing.rejected)} rejected)", path=manifest_path)
    return listing


def gather_blob(blob: np.ndarray, offsets: np.ndarray, rows: np.ndarray, *, chunk_rows: int = 1 << 20
                ) -> tuple[np.ndarray, np.ndarray]:
    """Entries ``rows`` of a (blob, offsets) pair, concatenated: vectorised, in bounded memory.

    Works through ``chunk_rows`` rows at a time, so the temporary byte-index arrays stay around
    ``8 x`` one chunk's bytes (not ``8 x`` the whole blob: 20 GB for 100 M keys).
    """
    rows = np.asarray(rows, dtype=np.int64)
    starts = offsets[rows].astype(np.int64)
    lengths = offsets[rows + 1].astype(np.int64) - starts
    new_offsets = np.zeros(len(rows) + 1, dtype=np.uint64)
    np.cumsum(lengths, out=new_offsets[1:])
    out = np.empty(int(new_offsets[-1]), dtype=np.uint8)
    for first in range(0, len(rows), chunk_rows):
        last = min(first + chunk_rows, len(rows))
        chunk_lengths = lengths[first:last]
        base = int(new_offsets[first])
        total = int(new_offsets[last]) - base
        if total == 0:
            continue
        # byte p of this chunk comes from starts[row] + (p - (new_offsets[row] - base))
        row_of = np.repeat(np.arange(last - first), chunk_lengths)
        within = np.arange(total, dtype=np.int64) - (new_offsets[first:last].astype(np.int64) - base)[row_of]
        out[base:base + total] = blob[starts[first:last][row_of] + within]
    return out, new_offsets


def select_rows(listing: SourceListing, keep: np.ndarray) -> SourceListing:
    """The listing restricted to the rows where ``keep`` is true (order kept)."""
    rows = np.flatnonzero(keep)
    keys, key_offsets = gather_blob(listing.key_blob, listing.key_offsets, rows)
    meta, meta_offsets = gather_blob(listing.meta_blob, listing.meta_offsets, rows)
    return SourceListing(root=listing.root, kind=listing.kind, classes=listing.classes, key_blob=keys,
                         key_offsets=key_offsets, sizes=listing.sizes[rows], labels=listing.labels[rows],
                         meta_blob=meta, meta_offsets=meta_offsets, rejected=listing.rejected)


def _drop_duplicates(listing: SourceListing, key_hashes: np.ndarray) -> SourceListing:
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


def _is_int_text(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def list_source(source: str | os.PathLike[str], root: str | os.PathLike[str] | None = None, *,
                progress: Callable[[int], None] | None = None) -> SourceListing:
    """List a folder or a manifest file, whichever ``source`` is.

    ``progress`` is called with the running count of entries every 10,000 entries (listing
    100 M files takes minutes even on a fast file system: the build shows a counter).
    """
    path = Path(source)
    if path.is_file():
        return list_manifest(path, root, progress=progress)
    return list_image_folder(path, progress=progress)

