"""Archive sources: tar (plain, gz, bz2, xz, zstd), tar of tars, zip and WebDataset shards, listed in one pass.

``list_any_source`` recognises the source by its bytes, not its name, and otherwise hands it to
``coco.list_coco`` (a COCO annotation JSON, recognised by content) or ``sources.list_source``
(folder, manifest):

* **tar** (any compression): members are ``class/file`` paths, as in an image folder; a member
  that is itself a tar (its header says so) is one class named after it without the extension,
  its members the class's files (ImageNet's ``ILSVRC2012_img_train.tar``: 1,000 tars of JPEGs).
  Keys are ``class/file`` in both cases. A file at the top level is ``not-in-class-folder``.
* **zip**: ``class/file`` paths like a tar (stored, deflate, bzip2 and lzma members).
* **WebDataset**: a tar whose members are samples (``key.ext`` at the top level, or ``.cls`` /
  ``.json`` / ``.txt`` members beside images), a brace pattern ``train-{000000..000099}.tar``,
  or a folder holding only tar files. Consecutive members with the same key (the name up to the
  first ``.`` of its last part) are one sample; its image is the first member with an image
  extension, its key the image member's name; the label is the ``.cls`` member (an integer) or
  the ``label_field`` of the ``.json`` member (an integer or a class name); ``.json``, ``.txt``
  and ``.cls`` contents go into the sample's metadata (``{"cls": .., "json": {..}, "txt": ".."}``).
  A sample without a label has label -1. With declared fields (``--field``) the members feed
  them by the rules of ``build/sidefiles.py`` (the image is then the one image member no field
  takes; a ``key.mask.png`` member of ``mask=image@mask.png`` is read by offset like the image).
  Tar and zip sources of class folders, and Parquet, take no fields (``OptionError``).

Listing order is archive order (shard order for WebDataset); class names are sorted by their
UTF-8 bytes and labelled 0..C-1, as for a folder. Every member is accounted for: directories
are structure, and anything else not packed is a rejection in the build report
(``not-a-file`` for links, devices and sparse members, ``outside-root`` for ``../x`` or
absolute names, ``hidden-file``, ``duplicate-entry``, ``oversize-member`` over
``max_member_size``, ``decompression-bomb`` for a zip member expanding more than
``MAX_EXPANSION`` times, ``unused-member`` for a WebDataset member that is neither the image nor
a label/metadata member). A name that is not UTF-8 gets the escaped key of ``packer.names``.

**Parallelism.** An uncompressed tar or a zip is listed by reading only headers (tarfile seeks
past member data; zip reads its central directory), and workers then read members by offset in
parallel (``members.MemberReader``). A compressed tar is decompressed once, while listing, in one
sequential pass that writes the uncompressed stream to a spool file in the output's staging
folder (``spool_dir``); packing then reads the spool by offset in parallel. The cost is the
decompressor's speed plus the spool's disk space (the uncompressed tar; removed with the staging
folder when the build commits). A compressed stream expanding more than ``MAX_EXPANSION`` times
past 1 GiB is refused as a decompression bomb (``SourceError``).

Memory is flat arrays in the number of members: tarfile's member list is emptied after every
member. Exception: a zip's central directory is read whole by ``zipfile`` (~0.5 KB a member, for
the listing step only).
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import io
import json
import lzma
import os
import re
import stat
import tarfile
import zipfile
import zlib
from array import array
from pathlib import Path
from typing import IO, Any, Callable, Iterator, Sequence

import numpy as np
import xxhash

from ..errors import MissingDependencyError, OptionError, SourceError
from ..names import ESCAPED_FIELD, escape_name, is_utf8
from .members import RAW, ZIP_METHODS, MemberTable, container_stat
from ..fields import FieldSpec
from .fieldvalues import FieldRowBuilder
from .sidefiles import (IMAGE_EXTENSIONS, MAX_TEXT_MEMBER_BYTES, TEXT_EXTENSIONS, SideMember, assemble_sample,
                        read_limit, split_key)
from .coco import list_coco, looks_like_coco
from .sources import (ListingBuilder, Rejection, SourceListing, empty_source_error, list_source, loose_int,
                      select_rows)

__all__ = ["ARCHIVE_KINDS", "SOURCE_KINDS", "list_any_source", "list_tar", "list_zip", "list_webdataset",
           "expand_braces", "sniff_container", "DEFAULT_MAX_MEMBER_SIZE", "MAX_EXPANSION", "IMAGE_EXTENSIONS"]

#: Listing kinds whose members live in archives (``SourceListing.kind``).
ARCHIVE_KINDS = frozenset({"tar", "zip", "webdataset", "parquet"})
#: Accepted values of ``source_kind``.
SOURCE_KINDS = ("auto", "folder", "manifest", "tar", "zip", "webdataset", "parquet", "coco")
#: Members larger than this are rejected (``oversize-member``) before anything is read.
DEFAULT_MAX_MEMBER_SIZE = 1 << 30
#: Largest accepted ratio of uncompressed to compressed bytes (decompression-bomb guard).
MAX_EXPANSION = 1000
# WebDataset: IMAGE_EXTENSIONS (lower case, last part) make a member the sample's image;
# .cls/.json/.txt members (TEXT_EXTENSIONS) up to MAX_TEXT_MEMBER_BYTES are read as label and metadata.
_META_EXTENSIONS = TEXT_EXTENSIONS
_META_LIMIT = MAX_TEXT_MEMBER_BYTES
_COMPRESSIONS = {b"\x1f\x8b": "gz", b"BZh": "bz2", b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zst"}
_BOMB_FLOOR = 1 << 30


# --- recognising a source ----------------------------------------------------------------------

def _is_tar_header(block: bytes) -> bool:
    if len(block) < 512:
        return False
    if block[257:262] == b"ustar":
        return True
    try:  # a v7 tar has no magic: its header checksum must match
        stored = int(block[148:156].replace(b"\x00", b" ").strip() or b"-1", 8)
    except ValueError:
        return False
    return stored == sum(block[:148]) + 256 + sum(block[156:512])


def sniff_container(path: Path) -> str | None:
    """``"tar"``, ``"tar.gz"``/``"tar.bz2"``/``"tar.xz"``/``"tar.zst"``, ``"zip"`` or None, from the bytes."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(512)
    except OSError:
        return None
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return "zip"
    if head[:4] == b"PAR1":
        return "parquet"
    if _is_tar_header(head):
        return "tar"
    for magic, name in _COMPRESSIONS.items():
        if head.startswith(magic):
            try:
                with _decompressor(path, name) as stream:
                    return f"tar.{name}" if _is_tar_header(stream.read(512)) else None
            except (OSError, EOFError, lzma.LZMAError, MissingDependencyError):
                return None
    return None


def expand_braces(pattern: str) -> list[str]:
    """Expand ``{000..099}`` (zero-padded ranges) and ``{a,b}`` alternatives, left to right.

    Raises:
        SourceError: a range with a start after its end, or more than 10 million names.
    """
    match = re.search(r"\{([^{}]*)\}", pattern)
    if match is None:
        return [pattern]
    body, head, tail = match.group(1), pattern[:match.start()], pattern[match.end():]
    ranged = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if ranged:
        first, last = ranged.group(1), ranged.group(2)
        if int(first) > int(last) or int(last) - int(first) > 10_000_000:
            raise SourceError(f"brace range {{{body}}} must go up, and name at most 10 million files", path=pattern)
        width = len(first)
        choices = [str(n).zfill(width) for n in range(int(first), int(last) + 1)]
    else:
        choices = body.split(",")
    return [name for choice in choices for name in expand_braces(head + choice + tail)]


def _webdataset_shards(source: str) -> list[Path] | None:
    """The shard files if ``source`` is a brace pattern or a folder holding only tar files."""
    if "{" in source and not os.path.exists(source):
        shards = [Path(p) for p in expand_braces(source)]
        missing = [str(p) for p in shards if not p.is_file()]
        if missing:
            raise SourceError(f"{len(missing)} of {len(shards)} WebDataset shards do not exist (first: {missing[0]})",
                              path=source)
        return shards
    path = Path(source)
    if path.is_dir():
        try:
            with os.scandir(path) as it:
                entries = sorted((e for e in it if not e.name.startswith(".")), key=lambda e: os.fsencode(e.name))
        except OSError:
            return None
        if entries and all(e.is_file() for e in entries) and all(
                (sniff_container(Path(e.path)) or "").startswith("tar") for e in entries):
            return [Path(e.path) for e in entries]
    return None


def list_any_source(source: str | os.PathLike[str], root: str | os.PathLike[str] | None = None, *,
                    progress: Callable[[int], None] | None = None, spool_dir: Path | None = None,
                    source_kind: str = "auto", label_field: str = "label", image_column: str | None = None,
                    max_member_size: int = DEFAULT_MAX_MEMBER_SIZE, classes: Any = None,
                    label_type: str = "auto", fields: Sequence[FieldSpec] = ()) -> SourceListing:
    """List any source: an archive (tar, zip, WebDataset), else a folder or a manifest.

    Args:
        source: a folder, a manifest, an archive, a folder of WebDataset shards, or a brace pattern.
        root: the folder manifest paths are relative to.
        progress: called with the running member count every 10,000 members.
        spool_dir: where a compressed tar is decompressed to (required for one).
        source_kind: ``"auto"`` (by content) or one of ``SOURCE_KINDS`` to insist.
        label_field: the WebDataset ``.json`` field, or the Parquet column, holding the label.
        image_column: the Parquet column holding the images (default: found by its type).
        max_member_size: larger archive members are rejected.
        classes, label_type: as for ``sources.list_source`` (folders and manifests; archives
            number the classes they find).
        fields: declared fields (``packer.fields``), for the sources that carry them.

    Raises:
        SourceError: the source is unusable (missing, damaged archive, decompression bomb).
        OptionError: an unknown ``source_kind``.
    """
    if source_kind not in SOURCE_KINDS:
        raise OptionError(f"--source-kind must be one of {', '.join(SOURCE_KINDS)}, got {source_kind!r}")
    text = os.fspath(source)
    if source_kind in ("folder", "manifest"):
        return list_source(text, root, progress=progress, classes=classes, label_type=label_type, fields=fields)
    shards = _webdataset_shards(text) if source_kind in ("auto", "webdataset") else None
    if shards is not None:
        return list_webdataset(shards, progress=progress, spool_dir=spool_dir, label_field=label_field,
                               max_member_size=max_member_size, fields=fields)
    path = Path(text)
    if source_kind == "coco" or (source_kind == "auto" and path.is_file() and looks_like_coco(path)):
        _no_fields(fields, "a COCO annotation file declares its own fields (boxes, labels, iscrowd, area, image_id)")
        if classes is not None:
            raise OptionError("--classes does not apply to a COCO source: its samples have no main label (-1); "
                              "the objects' categories are the 'labels' field")
        return list_coco(path, root, progress=progress)
    parquet = _parquet_files(path) if source_kind in ("auto", "parquet") else None
    if parquet is not None:
        _no_fields(fields, "a Parquet source")
        return list_parquet(parquet, progress=progress, spool_dir=spool_dir, label_column=label_field,
                            image_column=image_column, max_member_size=max_member_size)
    kind = sniff_container(path) if path.is_file() else None
    if kind is None:
        if source_kind != "auto":
            raise SourceError(f"--source-kind {source_kind}: the source is not a readable {source_kind} archive",
                              path=path)
        return list_source(text, root, progress=progress, classes=classes, label_type=label_type, fields=fields)
    if kind == "zip":
        if source_kind not in ("auto", "zip"):
            raise SourceError(f"--source-kind {source_kind}: the source is a zip archive", path=path)
        _no_fields(fields, "a zip of class folders")
        return list_zip(path, progress=progress, max_member_size=max_member_size)
    with _archive_errors(path):
        samples = source_kind == "webdataset" or (source_kind == "auto" and _looks_like_webdataset(path, kind))
    if samples:
        return list_webdataset([path], progress=progress, spool_dir=spool_dir, label_field=label_field,
                               max_member_size=max_member_size, fields=fields)
    if source_kind == "zip":
        raise SourceError("--source-kind zip: the source is a tar archive", path=path)
    _no_fields(fields, "a tar of class folders (a tar of samples, key.jpg + key.json, is a WebDataset: "
                       "--source-kind webdataset)")
    return list_tar(path, progress=progress, spool_dir=spool_dir, max_member_size=max_member_size)


def _no_fields(fields: Sequence[FieldSpec], what: str) -> None:
    if fields:
        raise OptionError(f"--field: {what} does not take declared fields; fields come from a CSV/JSONL "
                          f"manifest, an image folder with side files, or a WebDataset")


def _looks_like_webdataset(path: Path, kind: str) -> bool:
    """Whether a tar holds samples (WebDataset) rather than class folders or class tars.

    Among the first 64 files: a label/metadata member (``.cls``, ``.json``, ``.txt``) at the top
    level, or one sharing its key with another member (``a/000.jpg`` beside ``a/000.cls``: keys
    may have folders), says samples; an inner tar says class tars. Without either signal, files
    all at the top level are samples and files in folders are class folders (``cat/001.jpg``).
    """
    files, top_level = 0, True
    meta_keys: set[str] = set()
    other_keys: set[str] = set()
    with contextlib.ExitStack() as stack:
        if kind != "tar":  # peeking into a compressed tar means decompressing its start: cheap enough
            stream = stack.enter_context(_decompressor(path, kind.split(".")[1]))
            archive = stack.enter_context(tarfile.open(fileobj=stream, mode="r|"))
        else:
            archive = stack.enter_context(tarfile.open(path, mode="r:"))
        for member in archive:
            archive.members = []
            if not member.isfile():
                continue
            files += 1
            name = member.name.lstrip("./")
            folder, _, base = name.rpartition("/")
            stem, _, rest = base.partition(".")
            suffix = rest.rsplit(".", 1)[-1].lower() if rest else ""
            key = f"{folder}/{stem}" if folder else stem
            if suffix in _META_EXTENSIONS:
                if not folder or key in other_keys:
                    return True
                meta_keys.add(key)
            else:
                if suffix == "tar" or (not folder and _is_tar_header(_peek(archive, member))):
                    return False
                if key in meta_keys:
                    return True
                other_keys.add(key)
            top_level = top_level and not folder
            if files >= 64:
                break
    return files > 0 and top_level


def _peek(archive: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    handle = archive.extractfile(member)
    return handle.read(512) if handle is not None else b""


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


# --- tar -----------------------------------------------------------------------------------------------

class _Tee(io.RawIOBase):
    """A read-only stream that copies what it reads into ``sink`` (the spool), counting bytes."""

    def __init__(self, source: IO[bytes], sink: IO[bytes], raw: IO[bytes], path: Path) -> None:
        self.source, self.sink, self.raw, self.path = source, sink, raw, path
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.source.read(len(buffer))
        n = len(data)
        buffer[:n] = data
        self.sink.write(data)
        self.count += n
        if self.count > _BOMB_FLOOR and self.count > MAX_EXPANSION * max(self.raw.tell(), 1):
            raise SourceError(f"the compressed archive expands more than {MAX_EXPANSION} times (over "
                              f"{self.count >> 20} MiB from {self.raw.tell() >> 20} MiB): a decompression bomb",
                              path=self.path)
        return n


def _decompressor(path: Path, name: str, raw: IO[bytes] | None = None) -> IO[bytes]:
    """A decompressing reader of ``path`` (over ``raw``, whose position then counts compressed bytes)."""
    raw = raw if raw is not None else open(path, "rb")
    if name == "gz":
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if name == "bz2":
        return bz2.BZ2File(raw, "rb")
    if name == "xz":
        return lzma.LZMAFile(raw, "rb")
    try:
        import zstandard
    except ImportError:
        raise MissingDependencyError("reading a .tar.zst needs the zstandard package: pip install 'packer[zstd]'") \
            from None
    return zstandard.ZstdDecompressor().stream_reader(raw, closefd=True)


class _Spooled:
    """Open a tar for listing: the file itself, or a decompressing tee into a spool file."""

    def __init__(self, path: Path, spool_dir: Path | None, out: _Listing, index: int) -> None:
        self.path = path
        kind = sniff_container(path)
        if kind is None or not kind.startswith("tar"):
            raise SourceError("not a tar archive (nor a compressed one)", path=path)
        self.compression = kind[4:] or None
        self.files: list[Any] = []
        if self.compression is None:
            self.container = out.add_container(str(path.resolve()))
            self.archive = tarfile.open(path, mode="r:")
            return
        if spool_dir is None:
            raise SourceError("a compressed tar needs a spool folder to decompress into (build it through "
                              "packer build, which uses the output's staging folder)", path=path)
        spool_dir.mkdir(parents=True, exist_ok=True)
        spool = spool_dir / f"spool-{index:05d}.tar"
        raw = open(path, "rb")
        stream = _decompressor(path, self.compression, raw)
        sink = open(spool, "wb", buffering=8 << 20)
        self.files = [stream, sink, raw]
        self.spool, self.sink = spool, sink
        self.tee = _Tee(stream, sink, raw, path)
        self.archive = tarfile.open(fileobj=io.BufferedReader(self.tee, 1 << 20), mode="r|")
        self.container = out.add_container(str(spool.resolve()))  # its size is recorded once complete

    def finish(self, out: _Listing) -> int:
        """Complete the spool, and check the archive really ended where tarfile stopped.

        tarfile ends its member loop quietly at a header it cannot parse; a real end is zero
        blocks (or the end of the file), so anything else there is a damaged archive.
        """
        end = self.archive.offset
        self.archive.close()
        if self.compression is not None:
            while self.tee.read(1 << 20):  # the tar's end padding: the spool is the whole stream
                pass
            self.sink.flush()
            os.fsync(self.sink.fileno())
            for handle in self.files:
                handle.close()
            out.stats[self.container] = container_stat(str(self.spool.resolve()))
        with open(out.containers[self.container], "rb") as handle:
            handle.seek(end)
            tail = handle.read(1024)
        if tail.strip(b"\x00"):
            raise SourceError(f"the tar archive is damaged at offset {end}: a member header there cannot be "
                              f"read (the members before it were listed; nothing after it can be)", path=self.path)
        return self.container


def _tar_members(archive: tarfile.TarFile, path: Path) -> Iterator[tarfile.TarInfo]:
    """Members one at a time, keeping tarfile's member list empty (bounded memory)."""
    for member in archive:
        archive.members = []
        yield member


@contextlib.contextmanager
def _archive_errors(path: Path) -> Iterator[None]:
    """A damaged or truncated archive (or compressed stream) is an unusable source."""
    try:
        yield
    except tarfile.TarError as exc:
        raise SourceError(f"the tar archive is damaged or truncated: {exc}", path=path) from None
    except (EOFError, zlib.error, lzma.LZMAError, gzip.BadGzipFile) as exc:
        raise SourceError(f"the archive's compressed stream is damaged or truncated: {exc}", path=path) from None


def list_tar(path: Path, *, progress: Callable[[int], None] | None = None, spool_dir: Path | None = None,
             max_member_size: int = DEFAULT_MAX_MEMBER_SIZE) -> SourceListing:
    """List a tar of ``class/file`` members, of class tars, or both (see the module docstring).

    Raises:
        SourceError: not a tar, a damaged archive, a decompression bomb.
    """
    with _archive_errors(path):
        return _list_tar(path, progress, spool_dir, max_member_size)


def _file_members(archive: Any, path: Path, out: Any) -> Iterator[tuple[str, tarfile.TarInfo]]:
    """``(checked name, member)`` of a tar's regular-file members, in archive order; folders are
    skipped, bad names and members that are not files (links, devices) rejected with a reason."""
    for member in _tar_members(archive, path):
        if member.isdir():
            continue
        name = _member_name(member.name, out)
        if name is None:
            continue
        problem = _not_a_file(member)
        if problem is not None:
            out.reject(name, "not-a-file", problem)
            continue
        yield name, member


def _list_tar(path: Path, progress: Callable[[int], None] | None, spool_dir: Path | None,
              max_member_size: int) -> SourceListing:
    out = _Listing(progress)
    opened = _Spooled(path, spool_dir, out, 0)
    with opened.archive:
        for name, member in _file_members(opened.archive, path, out):
            if member.size > max_member_size:
                out.reject(name, "oversize-member", f"{member.size} bytes, over the limit of {max_member_size}")
                continue
            handle = opened.archive.extractfile(member)
            head = handle.read(512) if handle is not None and member.size >= 1024 else b""
            if _is_tar_header(head):
                if opened.compression is None:  # seekable: the inner tar's headers alone are read
                    handle.seek(0)
                    inner: IO[bytes] = handle
                else:  # one pass through the spooling stream, the head already read
                    inner = io.BufferedReader(_Chain(head, handle), 1 << 16)
                _list_inner_tar(inner, member, name, out, opened.container, max_member_size,
                                seekable=opened.compression is None)
                continue
            if "/" not in name:
                out.reject(name, "not-in-class-folder", "members must sit inside a class folder (class/file), "
                                                         "or in a class tar")
                continue
            out.add(name, member.size, out.class_id(name.split("/", 1)[0]), opened.container, member.offset_data,
                    member.size, meta=_name_meta(member.name))
    opened.finish(out)
    return out.finish(path, "tar")


class _Chain(io.RawIOBase):
    """``head`` then the rest of ``handle``: a member whose first block was already read."""

    def __init__(self, head: bytes, handle: IO[bytes]) -> None:
        self.head, self.handle = head, handle

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.head:
            n = min(len(buffer), len(self.head))
            buffer[:n] = self.head[:n]
            self.head = self.head[n:]
            return n
        data = self.handle.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


def _name_meta(raw: str) -> bytes:
    """The metadata of a member whose name is not UTF-8: the ``packer.names`` marker."""
    return b"" if is_utf8(os.fsencode(raw)) else json.dumps({ESCAPED_FIELD: True}, separators=(",", ":")).encode()


def _list_inner_tar(handle: IO[bytes], member: tarfile.TarInfo, name: str, out: _Listing, container: int,
                    max_member_size: int, *, seekable: bool) -> None:
    """One member tar is one class: its name without the extension."""
    class_name = name.rsplit("/", 1)[-1]
    class_name = class_name.split(".", 1)[0] or class_name
    label = out.class_id(class_name)
    base = member.offset_data
    try:
        with tarfile.open(fileobj=handle, mode="r:" if seekable else "r|") as inner:
            for item in inner:
                inner.members = []
                if item.isdir():
                    continue
                inner_name = _member_name(item.name, out)
                if inner_name is None:
                    continue
                key = f"{class_name}/{inner_name}"
                problem = _not_a_file(item)
                if problem is not None:
                    out.reject(key, "not-a-file", problem)
                elif item.size > max_member_size:
                    out.reject(key, "oversize-member", f"{item.size} bytes, over the limit of {max_member_size}")
                else:
                    out.add(key, item.size, label, container, base + item.offset_data, item.size,
                            meta=_name_meta(item.name))
    except tarfile.ReadError as exc:
        out.reject(name, "unreadable", f"the class tar is damaged or truncated: {exc}")


# --- WebDataset ----------------------------------------------------------------------------------------

def list_webdataset(shards: list[Path], *, progress: Callable[[int], None] | None = None,
                    spool_dir: Path | None = None, label_field: str = "label",
                    max_member_size: int = DEFAULT_MAX_MEMBER_SIZE, fields: Sequence[FieldSpec] = ()
                    ) -> SourceListing:
    """List WebDataset shards, in shard order (see the module docstring for the sample rules).

    Args:
        fields: declared fields: each sample's members feed them by the rules of
            ``build/sidefiles.py`` (``key.mask.png`` for ``mask=image@mask.png``, the ``.json``
            member's keys, ``key.txt`` for ``caption=text@txt``); an image field's member is
            read by offset from the archive when packing, like the image.

    Raises:
        SourceError: a shard is not a tar, is damaged, or labels mix integers and names.
    """
    out = _Listing(progress, fields)
    for index, shard in enumerate(shards):
        with _archive_errors(shard):
            _list_shard(shard, index, out, spool_dir, label_field, max_member_size)
    return out.finish(shards[0] if len(shards) == 1 else shards[0].parent, "webdataset")


def _list_shard(shard: Path, index: int, out: _Listing, spool_dir: Path | None, label_field: str,
                max_member_size: int) -> None:
    """One WebDataset shard, in archive order."""
    opened = _Spooled(shard, spool_dir, out, index)
    with opened.archive:
        sample: list[tuple[str, tarfile.TarInfo, bytes | None]] = []
        current = None
        for name, member in _file_members(opened.archive, shard, out):
            key, suffix = split_key(name)
            if key != current and sample:
                _sample(sample, out, opened.container, label_field, max_member_size)
                sample = []
            current = key
            if out.field_rows is not None:
                limit = out.read_limits.get(suffix)
                if limit is None:  # few distinct suffixes: computed once each
                    limit = out.read_limits[suffix] = read_limit(suffix, out.field_rows.specs)
                small = 0 <= member.size <= limit
            else:
                small = suffix.rsplit(".", 1)[-1].lower() in _META_EXTENSIONS and member.size <= _META_LIMIT
            sample.append((name, member, _read_member(opened.archive, member) if small else None))
        if sample:
            _sample(sample, out, opened.container, label_field, max_member_size)
    opened.finish(out)


def _read_member(archive: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    handle = archive.extractfile(member)
    return handle.read() if handle is not None else b""


#: The build report's reason for a WebDataset sample whose label cannot be read.
LABEL_REJECTION = "bad-label"
_INT64 = range(-(1 << 63), 1 << 63)
_CLS_INTEGER = re.compile(r"-?[0-9]+")


def _label(cls_text: str | None, document: Any, out: _Listing, label_field: str) -> tuple[int | None, str]:
    """A WebDataset sample's label: its ``.cls`` member (an integer or a class name), else the
    ``label_field`` of its ``.json`` object; -1 without either (or with a JSON ``null``).

    Returns ``(label, "")``, or ``(None, why)`` for a label that cannot be read: read the way a
    manifest's labels are (``sources._LabelReader``), plain ASCII digits or a name, never a
    guess (``" 1_0"``, ``3.0``, ``true`` and an empty ``.cls`` are refused, not turned into 10,
    3, 1 or the class ``""``).
    """
    if cls_text is not None:
        if not cls_text:
            return None, "the .cls member is empty"
        if not _CLS_INTEGER.fullmatch(cls_text):
            if loose_int(cls_text):
                return None, (f"the .cls member {cls_text!r} looks like an integer but is not plain ASCII digits "
                              f"('_', '+' or non-ASCII digits): packer reads labels strictly; fix the member")
            return out.class_id(cls_text), ""
        # ASCII digits (zero-padded too, as WebDataset readers' int() takes them), bounded before
        # int() so a megabyte of digits costs nothing
        value = int(cls_text) if len(cls_text) <= 21 else None
        if value is None or value not in _INT64:
            return None, f"the .cls label {cls_text[:40]} does not fit in a signed 64-bit integer"
        out.label_kinds.setdefault("int", str(value))
        return value, ""
    value = document.get(label_field) if isinstance(document, dict) else None
    if value is None:
        return -1, ""
    if isinstance(value, int) and not isinstance(value, bool):
        if value not in _INT64:
            return None, f"the .json label {label_field!r} ({value}) does not fit in a signed 64-bit integer"
        out.label_kinds.setdefault("int", str(value))
        return value, ""
    if isinstance(value, str) and value:
        return out.class_id(value), ""
    return None, (f"the .json label {label_field!r} is {json.dumps(value)[:80]}: expected an integer or a "
                  f"class name (or null for none)")


def _parquet_label(label: object, out: _Listing, column: str) -> tuple[int | None, str]:
    """A Parquet row's label: an integer (a boolean column gives 0/1), a class name, or -1 for
    null; ``(None, why)`` for anything else (a float, bytes, a list), never a guessed class."""
    if label is None:
        return -1, ""
    if isinstance(label, int):  # bool included: a boolean label column is two classes, 0 and 1
        if label not in _INT64:
            return None, f"the label column {column!r} holds {label}, which does not fit in a signed 64-bit integer"
        out.label_kinds.setdefault("int", str(int(label)))
        return int(label), ""
    if isinstance(label, str) and label:
        return out.class_id(label), ""
    return None, (f"the label column {column!r} holds {str(label)[:80]!r} ({type(label).__name__}): expected "
                  f"an integer or a class name")


def _sample(sample: list[tuple[str, tarfile.TarInfo, bytes | None]], out: _Listing,
            container: int, label_field: str, max_member_size: int) -> None:
    if out.field_rows is not None:
        _sample_with_fields(sample, out, container, label_field, max_member_size)
        return
    image = None
    meta: dict[str, Any] = {}
    cls_text: str | None = None
    document: Any = None
    for name, member, data in sample:
        suffix = split_key(name)[1]
        ext = suffix.rsplit(".", 1)[-1].lower()
        if image is None and ext in IMAGE_EXTENSIONS:
            if member.size > max_member_size:
                out.reject(name, "oversize-member", f"{member.size} bytes, over the limit of {max_member_size}")
                return
            image = (name, member)
            continue
        if data is None:
            out.reject(name, "unused-member", "a WebDataset member that is neither the sample's image nor a "
                                              ".cls/.json/.txt member (not packed)")
            continue
        text = data.decode("utf-8", "replace")
        if ext == "cls":
            cls_text = meta["cls"] = text.strip()
        elif ext == "json":
            try:
                obj = json.loads(data)
            except (ValueError, RecursionError):  # a member nested 100,000 deep must not end the build
                out.reject(name, "bad-manifest-row", "the .json member is not JSON (ignored)")
                continue
            document = meta["json"] = obj
        else:
            meta["txt"] = text
    if image is None:
        first = sample[0][0]
        out.reject(split_key(first)[0], "not-an-image", "a WebDataset sample without an image member "
                                                        f"(extensions {', '.join(split_key(n)[1] for n, _, _ in sample)})")
        return
    label, why = _label(cls_text, document, out, label_field)
    name, member = image
    if label is None:
        out.reject(name, LABEL_REJECTION, why)
        return
    if not is_utf8(os.fsencode(member.name)):
        meta[ESCAPED_FIELD] = True
    encoded = json.dumps(meta, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode() if meta else b""
    out.add(name, member.size, label, container, member.offset_data, member.size, meta=encoded)


def _sample_with_fields(sample: list[tuple[str, tarfile.TarInfo, bytes | None]], out: _Listing,
                        container: int, label_field: str, max_member_size: int) -> None:
    """A sample of a WebDataset built with declared fields (``build/sidefiles.py`` rules)."""
    assert out.field_rows is not None
    members = [SideMember(name, split_key(name)[1], member.size, data, member) for name, member, data in sample]
    parts = assemble_sample(split_key(sample[0][0])[0], members, out.field_rows, max_image_size=max_member_size)
    for name, reason, message in parts.unused:
        out.reject(name, reason, message)
    if parts.rejection is not None:
        out.reject(*parts.rejection)
        return
    image = parts.image
    assert image is not None  # set unless the sample is rejected
    label, why = _label(parts.cls_text, parts.json_object, out, label_field)
    if label is None:
        out.reject(image.name, LABEL_REJECTION, why)
        return
    meta = dict(parts.metadata)
    if not is_utf8(os.fsencode(image.handle.name)):
        meta[ESCAPED_FIELD] = True
    encoded = json.dumps(meta, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode() if meta else b""
    out.add(image.name, image.size, label, container,
            image.handle.offset_data, image.size, meta=encoded, field_values=parts.values,
            field_members={name: (container, m.handle.offset_data, m.size) for name, m in parts.field_members.items()})


# --- zip --------------------------------------------------------------------------------------------------

def list_zip(path: Path, *, progress: Callable[[int], None] | None = None,
             max_member_size: int = DEFAULT_MAX_MEMBER_SIZE) -> SourceListing:
    """List a zip of ``class/file`` members (see the module docstring).

    Raises:
        SourceError: not a zip, or a damaged central directory.
    """
    out = _Listing(progress)
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise SourceError(f"not a readable zip archive: {exc}", path=path) from None
    container = out.add_container(str(path.resolve()))
    with archive:
        for info in archive.infolist():
            if info.is_dir():
                continue
            name = _member_name(info.filename, out)
            if name is None:
                continue
            mode = info.external_attr >> 16
            if stat.S_IFMT(mode) not in (0, stat.S_IFREG):  # writers that store no type leave 0
                out.reject(name, "not-a-file", "a symbolic link or special file stored in the zip")
                continue
            if info.flag_bits & 1:
                out.reject(name, "unreadable", "an encrypted zip member")
                continue
            method = ZIP_METHODS.get(info.compress_type)
            if method is None:
                out.reject(name, "unreadable", f"zip compression method {info.compress_type} is not supported")
                continue
            if info.file_size > max_member_size:
                out.reject(name, "oversize-member", f"{info.file_size} bytes, over the limit of {max_member_size}")
                continue
            if info.file_size > (1 << 20) and info.file_size > MAX_EXPANSION * max(info.compress_size, 1):
                out.reject(name, "decompression-bomb", f"{info.compress_size} compressed bytes declare "
                                                      f"{info.file_size} bytes (over {MAX_EXPANSION}x)")
                continue
            if "/" not in name:
                out.reject(name, "not-in-class-folder", "members must sit inside a class folder (class/file)")
                continue
            out.add(name, info.file_size, out.class_id(name.split("/", 1)[0]), container, info.header_offset,
                    info.compress_size, method, info.CRC, meta=_name_meta(info.filename))
    return out.finish(path, "zip")


# --- Parquet (HuggingFace datasets) ---------------------------------------------------------------

def _parquet_files(path: Path) -> list[Path] | None:
    """The Parquet files if ``path`` is one, or a folder (searched recursively) holding only Parquet data."""
    if path.is_file():
        return [path] if sniff_container(path) == "parquet" else None
    if not path.is_dir():
        return None
    # Stops at the first file that is neither Parquet nor a dataset card: an image folder costs
    # one look at its first image, not a walk of the tree.
    data: list[Path] = []
    for folder, dirs, names in os.walk(path):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in names:
            full = Path(folder) / name
            if name.startswith("."):
                continue
            if sniff_container(full) == "parquet":
                data.append(full)
            elif full.suffix.lower() not in (".json", ".md", ".txt", ".lock"):
                return None
    return sorted(data, key=lambda p: os.fsencode(p.relative_to(path))) or None


def _pyarrow() -> Any:
    try:
        import pyarrow.parquet as parquet
    except ImportError:
        raise MissingDependencyError("reading Parquet needs pyarrow: pip install 'packer[parquet]'") from None
    return parquet


def _image_column(schema: Any, wanted: str | None, path: Path) -> str:
    import pyarrow as pa

    def is_image(field: Any) -> bool:
        kind = field.type
        return (pa.types.is_binary(kind) or pa.types.is_large_binary(kind)
                or (pa.types.is_struct(kind) and kind.get_field_index("bytes") >= 0))

    if wanted is not None:
        if wanted not in schema.names or not is_image(schema.field(wanted)):
            raise SourceError(f"--image-column {wanted!r}: no binary or {{bytes, path}} column of that name "
                              f"(columns: {', '.join(schema.names)})", path=path)
        return wanted
    candidates = [f.name for f in schema if is_image(f)]
    for name in ("image", "img", "jpg", "png"):
        if name in candidates:
            return name
    if not candidates:
        raise SourceError(f"no image column (binary, or a struct with 'bytes'); columns: {', '.join(schema.names)}",
                          path=path)
    return candidates[0]


def _class_label_names(schema: Any, column: str) -> tuple[str, ...]:
    """HuggingFace's ``ClassLabel`` names for ``column``, from the schema's ``huggingface`` metadata."""
    raw = (schema.metadata or {}).get(b"huggingface")
    if not raw:
        return ()
    try:
        features = json.loads(raw)["info"]["features"]
        feature = features.get(column, {})
        names = feature.get("names") if feature.get("_type") == "ClassLabel" else None
    except (ValueError, KeyError, TypeError, AttributeError):
        return ()
    return tuple(str(n) for n in names) if isinstance(names, list) else ()


def list_parquet(files: list[Path], *, progress: Callable[[int], None] | None = None, spool_dir: Path | None = None,
                 label_column: str = "label", image_column: str | None = None,
                 max_member_size: int = DEFAULT_MAX_MEMBER_SIZE) -> SourceListing:
    """List Parquet files (HuggingFace datasets on disk): one sample per row.

    The image column is a struct with ``bytes`` (and ``path``) or a binary column; the label
    column an integer (labelled by the ``ClassLabel`` names when the file's metadata holds them)
    or a string (class names, sorted). Parquet pages are compressed and cannot be read by offset,
    so the image bytes are copied once, in row order, into a spool in the staging folder that the
    workers then read by offset (like a compressed tar). A row's key is its image ``path`` when
    set, else ``<file stem>/<row>``. A null image is ``not-an-image``; a null label is -1.

    Raises:
        SourceError: no image column, unreadable Parquet. MissingDependencyError: no pyarrow.
    """
    parquet = _pyarrow()
    if spool_dir is None:
        raise SourceError("a Parquet source needs a spool folder (build it through packer build)", path=files[0])
    spool_dir.mkdir(parents=True, exist_ok=True)
    out = _Listing(progress)
    spool = spool_dir / "spool-parquet.bin"
    spool.write_bytes(b"")
    container = out.add_container(str(spool.resolve()))  # its size is recorded once complete
    position = 0
    declared: tuple[str, ...] | None = None
    with open(spool, "wb", buffering=8 << 20) as sink:
        for path in files:
            try:
                handle = parquet.ParquetFile(path)
            except Exception as exc:  # noqa: BLE001 - pyarrow raises ArrowInvalid, OSError, ...
                raise SourceError(f"not a readable Parquet file: {exc}", path=path) from None
            schema = handle.schema_arrow
            image = _image_column(schema, image_column, path)
            columns = [image] + ([label_column] if label_column in schema.names else [])
            names = _class_label_names(schema, label_column)
            if names:
                if declared is not None and declared != names:
                    raise SourceError("the Parquet files declare different ClassLabel names", path=path)
                declared = out.fixed_classes = names
            row = 0
            try:
                batches = handle.iter_batches(batch_size=256, columns=columns)
                for batch in batches:
                    images = batch.column(0).to_pylist()
                    labels = batch.column(1).to_pylist() if len(columns) > 1 else [None] * len(images)
                    for value, label in zip(images, labels):
                        data, name = (value.get("bytes"), value.get("path")) if isinstance(value, dict) else (value, None)
                        key = name.replace("\\", "/").lstrip("/") if isinstance(name, str) and name else \
                            f"{path.stem}/{row:09d}"
                        row += 1
                        if ".." in key.split("/"):
                            key = f"{path.stem}/{row - 1:09d}"
                        if not data:
                            out.reject(key, "not-an-image", "the row's image has no bytes")
                            continue
                        if len(data) > max_member_size:
                            out.reject(key, "oversize-member", f"{len(data)} bytes, over the limit of {max_member_size}")
                            continue
                        value_label, why = _parquet_label(label, out, label_column)
                        if value_label is None:
                            out.reject(key, LABEL_REJECTION, why)
                            continue
                        sink.write(data)
                        out.add(key, len(data), value_label, container, position, len(data))
                        position += len(data)
            except SourceError:
                raise
            except Exception as exc:  # noqa: BLE001
                raise SourceError(f"the Parquet file is damaged: {exc}", path=path) from None
        sink.flush()
        os.fsync(sink.fileno())
    out.stats[container] = container_stat(str(spool.resolve()))
    if declared and "int" in out.label_kinds:
        labels = np.frombuffer(out.out.labels, dtype=np.int64)
        if len(labels) and labels.max() >= len(declared):
            raise SourceError(f"a label is {int(labels.max())}, but ClassLabel names only {len(declared)} classes",
                              path=files[0])
    return out.finish(files[0] if len(files) == 1 else files[0].parent, "parquet")
