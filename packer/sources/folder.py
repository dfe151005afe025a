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
* A class list given up front (``classes=``, ``--classes``) numbers the classes instead: a
  folder not in it is rejected per file as ``unknown-class``, a listed class with no files stays
  a class with 0 samples, so train and val built with one list agree on every label.
"""

from __future__ import annotations

import heapq
import json
import logging
import os
import stat
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import xxhash

from ..classes import split_folder_warning
from ..errors import SourceError
from ..fields import FieldSpec
from ..files import open_nonblocking, read_fd_capped
from ..names import ESCAPED_META, escape_name
from .fieldvalues import FieldRowBuilder
from .listing import SourceListing, _ListingBuilder, empty_source_error, file_stamp
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
