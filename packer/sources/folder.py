"""The image-folder door (torchvision ImageFolder layout).

* Every top-level sub-folder is a class; class names are sorted by their UTF-8 bytes and labelled
  0..C-1. Files are listed depth-first with siblings sorted by the UTF-8 bytes of their names;
  files in nested sub-folders belong to the top-level class. Every file is a candidate whatever
  its extension: the packer decides what is an image by its bytes, so a ``.jpg`` that is really
  text is *rejected with a reason*, not skipped. Hidden entries (a leading ``.``) and files at
  the top level are rejected too.
* With declared fields (``--field``) the files are grouped into samples with their side files
  (``cat/1.jpg`` + ``cat/1.mask.png`` + ``cat/1.json``) by the rules of ``sources/sidefiles.py``;
  a sample takes the place of its first file, and its key is its image's path.
* Symlinks are followed (files and folders); a dangling one or a loop is rejected with a reason.
  Each real folder is listed once: a second path to it (through a symlink) is rejected as a
  ``duplicate-entry``, which also keeps a fan-out of folder links from listing exponentially.
* Every class folder is listed, its name the label of its files *as written*; an empty class
  folder is a class the source declares. Which classes exist and how they are numbered (a class
  list given with ``--classes``: a folder not in it is rejected per file as ``unknown-class``, a
  listed class with no files stays a class with 0 samples) is the source contract's
  (``contract.py``), the same for every door.
"""

from __future__ import annotations

import heapq
import json
import logging
import os
import stat
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import xxhash

from ..classes import split_folder_warning
from ..errors import SourceError
from ..fields import FieldSpec
from .._internal.files import open_nonblocking, read_fd_capped
from .._internal.names import ESCAPED_META, escape_name, is_plain, is_utf8, unescape_key
from .fieldvalues import FieldRowBuilder
from .listing import DoorOptions, RawListing, RawListingBuilder, file_stamp
from .sidefiles import SideMember, assemble_sample, read_limit, split_key

logger = logging.getLogger("packer.build")


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


def _walk_class(folder: Path, relative: str, label: tuple[int, int], out: RawListingBuilder,
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
            if key is None or not is_plain(key):  # packed under its one-to-one escaped key (packer/_internal/names.py)
                out.add(escape_name(os.fsencode(rel)).encode(), st.st_size, label, ESCAPED_META)
                continue
            out.add(key, st.st_size, label, stamp=file_stamp(st))
        else:
            out.reject(_printable(rel), "not-a-file", "not a regular file (device, socket or FIFO)")


def _open_folder(folder: Path, relative: str, out: RawListingBuilder) -> Iterator[os.DirEntry[str]] | None:
    """The sorted entries of ``folder``, or None (and a rejection) if it cannot be listed."""
    try:
        return iter(_sorted_entries(folder))
    except OSError as exc:
        out.reject(_printable(relative + "/"), "unreadable", f"cannot list folder: {exc.strerror}")
        return None


def list_image_folder(root: str | os.PathLike[str], door: DoorOptions = DoorOptions()) -> RawListing:
    """List an ImageFolder-layout source (see the module docstring for the rules).

    Args:
        root: the folder of class sub-folders.
        door: ``progress``: called with the running count of entries every 10,000 entries;
            ``fields``: declared fields: files are grouped into samples with their side files
            (``cat/001.jpg`` + ``cat/001.mask.png`` + ``cat/001.json``) by the rules of
            ``sources/sidefiles.py``. Without fields every file is a candidate, as above.

    Raises:
        SourceError: the root is missing or not a folder.
    """
    root_path = Path(root)
    if not root_path.exists():
        raise SourceError("source folder does not exist", path=root_path)
    if not root_path.is_dir():
        raise SourceError("source is not a folder (give a folder of class sub-folders, or a .csv/.jsonl manifest)",
                          path=root_path)
    out = RawListingBuilder(door.progress)
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
    for name, entry in class_dirs:
        try:
            st = entry.stat(follow_symlinks=True)
        except OSError as exc:
            out.reject(_printable(name + "/"), "unreadable", f"cannot stat: {exc.strerror}")
            continue
        if (st.st_dev, st.st_ino) in out.listed_folders:
            out.reject(_printable(name + "/"), "duplicate-entry", f"the same folder as class "
                       f"{out.listed_folders[(st.st_dev, st.st_ino)]}/ (a symlink); this class stays empty")
            continue
        out.listed_folders[(st.st_dev, st.st_ino)] = _printable(name)
        _walk_class(Path(entry.path), name, out.name_label(name), out,
                    frozenset({(root_stat.st_dev, root_stat.st_ino), (st.st_dev, st.st_ino)}))
    where = f"{len(class_dirs)} class folder(s)"
    listing = out.finish(root_path, "folder", declared_classes=tuple(folder_names),
                         warnings=[warning] if warning else [],
                         empty_what=f"no files found under {where}"
                                    f"{'' if class_dirs else ' (expected class sub-folders such as SRC/cat/1.jpg)'}",
                         empty_path=root_path)
    if door.fields and len(listing):
        listing = _group_side_files(listing, door.fields)
        listing.empty_what = f"no sample under {where} has its image and declared fields"
    return listing


def _group_side_files(listing: RawListing, fields: Sequence[FieldSpec]) -> RawListing:
    """The folder's files as samples of side files (``sources/sidefiles.py``), in listing order.

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
    sizes = listing.sizes.tolist()
    escaped = (np.diff(listing.meta_offsets.astype(np.int64)) > 0).tolist()  # the walk's only metadata
    root = os.fspath(listing.root)
    limits: dict[str, int] = {}  # suffix -> read_limit: few distinct suffixes
    out = RawListingBuilder()
    out.rejected = list(listing.rejected)
    out.texts = {text: number for number, text in enumerate(listing.label_texts)}  # label ids stay valid
    builder = FieldRowBuilder(fields)

    def sample(rows: list[int]) -> None:
        members = []
        for row in rows:
            name = blob[offsets[row]:offsets[row + 1]].decode("utf-8")
            if escaped[row]:  # an escaped key (packer/_internal/names.py)
                original = unescape_key(name)
                if not is_utf8(original):
                    out.reject(name, "undecodable-name", "with --field, files are grouped into samples by their "
                                                         "names, which must be UTF-8")
                    continue
                # a UTF-8 name holding %XX: its files are read and grouped by the real name, and the
                # sample's key is escaped again when it is listed (RawListingBuilder.add)
                name = original.decode("utf-8")
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
            _add_side_file_sample(members, builder, out, listing)

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
    return out.finish(listing.root, listing.kind, declared_classes=listing.declared_classes,
                      warnings=listing.warnings, fields=builder.finish(), empty_what=listing.empty_what,
                      empty_path=listing.empty_path)


def _add_side_file_sample(members: list[SideMember], builder: FieldRowBuilder, out: RawListingBuilder,
                          listing: RawListing) -> None:
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
    row = image.handle
    out.add(image.name.encode("utf-8"), image.size,
            (int(listing.label_kinds[row]), int(listing.label_values[row])), meta, stamp=int(listing.stamps[row]))


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
