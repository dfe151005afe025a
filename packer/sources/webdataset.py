"""The WebDataset door: a tar whose members are samples (``key.ext`` at the top level, or
``.cls`` / ``.json`` / ``.txt`` members beside images), a brace pattern
``train-{000000..000099}.tar``, or a folder holding only tar files.

Consecutive members with the same key (the name up to the first ``.`` of its last part) are one
sample; its image is the first member with an image extension, its key the image member's name;
the label is the ``.cls`` member (an integer) or the ``label_field`` of the ``.json`` member (an
integer or a class name); ``.json``, ``.txt`` and ``.cls`` contents go into the sample's metadata
(``{"cls": .., "json": {..}, "txt": ".."}``). With declared fields (``--field``) the members feed
them by the rules of ``sources/sidefiles.py`` (the image is then the one image member no field
takes; a ``key.mask.png`` member of ``mask=image@mask.png`` is read by offset like the image).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import tarfile
from pathlib import Path
from typing import Any

from .._internal.names import ESCAPED_FIELD, is_plain
from .archive_listing import META_EXTENSIONS, META_LIMIT, ArchiveListing
from .listing import DoorOptions, RawListing, RawListingBuilder
from .sidefiles import IMAGE_EXTENSIONS, SideMember, assemble_sample, read_limit, split_key
from .strictjson import MAX_JSON_DEPTH, json_depth_ok, parse_strict_json
from .labels import INT64, LABEL_REJECTION
from .sniff import decompressor, is_tar_header
from .tar_stream import SpooledTar, all_file_members, archive_errors, peek_member


#: How much of a compressed tar is decompressed to tell a WebDataset from a tar of class folders.
_PEEK_BYTES = 64 << 20


class _Limited(io.RawIOBase):
    """The first ``limit`` bytes of a stream, then its end (a bounded peek into a compressed tar)."""

    def __init__(self, stream: Any, limit: int) -> None:
        self.stream, self.left = stream, limit
        self.ended = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if not self.left:  # the peek is over (tarfile would otherwise read nothing forever, skipping a member)
            raise tarfile.ReadError("the peek's budget is spent")
        data = self.stream.read(min(len(buffer), self.left))
        if not data:
            self.ended += 1
            if self.ended > 8:  # the same guard as the listing's (tar._READS_PAST_END)
                raise tarfile.ReadError("the stream ends inside a member")
        self.left -= len(data)
        buffer[:len(data)] = data
        return len(data)


def _peeked_members(archive: tarfile.TarFile) -> Any:
    """Members until the end, or until the peek's budget (or damage: the listing reports it) stops them."""
    while True:
        try:
            member = archive.next()
        except (tarfile.TarError, EOFError, OSError):
            return
        if member is None:
            return
        archive.members = []
        yield member


def looks_like_webdataset(path: Path, kind: str) -> bool:
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
        try:
            if kind != "tar":  # peeking into a compressed tar means decompressing its start: bounded
                stream = stack.enter_context(decompressor(path, kind.split(".")[1]))
                limited = io.BufferedReader(_Limited(stream, _PEEK_BYTES), 1 << 16)
                archive = stack.enter_context(tarfile.open(fileobj=limited, mode="r|"))
            else:
                archive = stack.enter_context(tarfile.open(path, mode="r:"))
        except tarfile.ReadError:  # no first member to peek at: the listing says what is wrong
            return False
        for member in _peeked_members(archive):
            if not member.isfile():
                continue
            files += 1
            name = member.name.lstrip("./")
            folder, _, base = name.rpartition("/")
            stem, _, rest = base.partition(".")
            suffix = rest.rsplit(".", 1)[-1].lower() if rest else ""
            key = f"{folder}/{stem}" if folder else stem
            if suffix in META_EXTENSIONS:
                if not folder or key in other_keys:
                    return True
                meta_keys.add(key)
            else:
                if suffix == "tar" or (not folder and is_tar_header(peek_member(archive, member))):
                    return False
                if key in meta_keys:
                    return True
                other_keys.add(key)
            top_level = top_level and not folder
            if files >= 64:
                break
    return files > 0 and top_level


# --- WebDataset ----------------------------------------------------------------------------------------

#: A sample (one key) holds at most this many members; the rest are rejected unread (``unused-member``).
MAX_SAMPLE_MEMBERS = 1024
#: At most this many bytes of one sample's text members are read while listing; a member past it is
#: not read (a field that needs it rejects the sample; metadata without it is ``unused-member``).
MAX_SAMPLE_READ_BYTES = 32 << 20


def list_webdataset(shards: list[Path], door: DoorOptions = DoorOptions()) -> RawListing:
    """List WebDataset shards, in shard order (see the module docstring for the sample rules).

    ``door.fields``: declared fields: each sample's members feed them by the rules of
    ``sources/sidefiles.py`` (``key.mask.png`` for ``mask=image@mask.png``, the ``.json``
    member's keys, ``key.txt`` for ``caption=text@txt``); an image field's member is read by
    offset from the archive when packing, like the image.

    Memory is bounded per sample whatever the shard holds: at most ``MAX_SAMPLE_MEMBERS``
    members and ``MAX_SAMPLE_READ_BYTES`` of text are kept for one key; every member past
    either is rejected with a reason, never dropped.

    Raises:
        SourceError: a shard is not a tar or is damaged.
    """
    out = ArchiveListing(door.progress, door.fields)
    for index, shard in enumerate(shards):
        with archive_errors(shard):
            _list_shard(shard, index, out, door)
    return out.finish(shards[0] if len(shards) == 1 else shards[0].parent, "webdataset")


def _list_shard(shard: Path, index: int, out: ArchiveListing, door: DoorOptions) -> None:
    """One WebDataset shard, in archive order."""
    opened = SpooledTar(shard, door.spool_dir, out, index)
    sample: list[tuple[str, tarfile.TarInfo, bytes | None]] = []
    current = None
    budget = MAX_SAMPLE_READ_BYTES
    read_kinds: set[str] = set()  # without fields: the metadata extensions already read for this sample
    for archive, _, name, member in all_file_members(opened, out):
        key, suffix = split_key(name)
        if key != current and sample:
            _sample(sample, out, opened.container, door.source.label_field)
            sample, budget, read_kinds = [], MAX_SAMPLE_READ_BYTES, set()
        current = key
        if len(sample) >= MAX_SAMPLE_MEMBERS:
            out.reject(name, "unused-member", f"the sample {key} already has {MAX_SAMPLE_MEMBERS} members; this "
                                              f"one is not read (not packed)")
            continue
        if out.field_rows is not None:
            limit = out.read_limits.get(suffix)
            if limit is None:  # few distinct suffixes: computed once each
                limit = out.read_limits[suffix] = read_limit(suffix, out.field_rows.specs)
            wanted = 0 <= member.size <= limit
        else:
            ext = suffix.rsplit(".", 1)[-1].lower()
            wanted = ext in META_EXTENSIONS and member.size <= META_LIMIT and ext not in read_kinds
            if wanted:
                read_kinds.add(ext)
        data = None
        if wanted and member.size <= budget:
            data = _read_member(archive, member)
            budget -= len(data)
        sample.append((name, member, data))
    if sample:
        _sample(sample, out, opened.container, door.source.label_field)


def _read_member(archive: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    handle = archive.extractfile(member)
    return handle.read(member.size) if handle is not None else b""


#: The build report's reason for a WebDataset sample whose label cannot be read.


_CLS_INTEGER = re.compile(r"-?[0-9]+")


def _label(cls_text: str | None, document: Any, out: ArchiveListing, label_field: str) -> tuple[tuple[int, int] | None, str]:
    """A WebDataset sample's label as written: its ``.cls`` member, else the ``label_field`` of its
    ``.json`` object; none without either (or with a JSON ``null``).

    A ``.cls`` of ASCII digits is an integer (WebDataset's convention, zero-padded too, as its
    readers' ``int()`` take it); other ``.cls`` text and a JSON string are text labels, typed by
    the contract (``--label-type``: a class name, or refused when it only looks like an integer).
    Returns ``(label, "")``, or ``(None, why)`` for a label that cannot be one (an empty ``.cls``,
    ``3.0``, ``true``, digits past int64): never a guess.
    """
    if cls_text is not None:
        if not cls_text:
            return None, "the .cls member is empty"
        if not _CLS_INTEGER.fullmatch(cls_text):
            return out.text_label(cls_text), ""
        # bounded before int() so a megabyte of digits costs nothing
        value = int(cls_text) if len(cls_text) <= 21 else None
        if value is None or value not in INT64:
            return None, f"the .cls label {cls_text[:40]} does not fit in a signed 64-bit integer"
        return RawListingBuilder.int_label(value), ""
    value = document.get(label_field) if isinstance(document, dict) else None
    if value is None:
        return RawListingBuilder.NONE, ""
    if isinstance(value, int) and not isinstance(value, bool):
        if value not in INT64:
            return None, f"the .json label {label_field!r} ({value}) does not fit in a signed 64-bit integer"
        return RawListingBuilder.int_label(value), ""
    if isinstance(value, str) and value:
        return out.text_label(value), ""
    return None, (f"the .json label {label_field!r} is {json.dumps(value)[:80]}: expected an integer or a "
                  f"class name (or null for none)")


def _sample(sample: list[tuple[str, tarfile.TarInfo, bytes | None]], out: ArchiveListing,
            container: int, label_field: str) -> None:
    if out.field_rows is not None:
        _sample_with_fields(sample, out, container, label_field)
        return
    image = None
    meta: dict[str, Any] = {}
    read_from: dict[str, str] = {}  # metadata extension -> the member it was read from
    cls_text: str | None = None
    document: Any = None
    for name, member, data in sample:
        suffix = split_key(name)[1]
        ext = suffix.rsplit(".", 1)[-1].lower()
        if image is None and ext in IMAGE_EXTENSIONS:
            image = (name, member)
            continue
        if data is None:
            if ext in read_from:
                why = f"the sample already has a .{ext} member ({read_from[ext]}); not packed"
            elif ext in META_EXTENSIONS:
                why = f"a .{ext} member of {member.size} bytes, over the {META_LIMIT} read as metadata (not packed)"
            else:
                why = ("a WebDataset member that is neither the sample's image nor a .cls/.json/.txt member "
                       "(not packed)")
            out.reject(name, "unused-member", why)
            continue
        read_from[ext] = name
        text = data.decode("utf-8", "replace")
        if ext == "cls":
            cls_text = meta["cls"] = text.strip()
        elif ext == "json":
            if not json_depth_ok(text):
                out.reject(name, "bad-manifest-row", f"the .json member nests brackets deeper than "
                                                     f"{MAX_JSON_DEPTH} levels (ignored)")
                continue
            try:
                obj = parse_strict_json(data)  # as side files: no NaN, no 1e400, no lone surrogate
            except (ValueError, RecursionError) as exc:
                out.reject(name, "bad-manifest-row", f"the .json member is not strict JSON ({str(exc)[:80]}; ignored)")
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
    if not is_plain(os.fsencode(member.name)):
        meta[ESCAPED_FIELD] = True
    encoded = json.dumps(meta, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode() if meta else b""
    out.add(name, member.size, label, container, member.offset_data, member.size, meta=encoded)


def _sample_with_fields(sample: list[tuple[str, tarfile.TarInfo, bytes | None]], out: ArchiveListing,
                        container: int, label_field: str) -> None:
    """A sample of a WebDataset built with declared fields (``sources/sidefiles.py`` rules)."""
    assert out.field_rows is not None
    members = [SideMember(name, split_key(name)[1], member.size, data, member) for name, member, data in sample]
    parts = assemble_sample(split_key(sample[0][0])[0], members, out.field_rows)
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
    if not is_plain(os.fsencode(image.handle.name)):
        meta[ESCAPED_FIELD] = True
    encoded = json.dumps(meta, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode() if meta else b""
    out.add(image.name, image.size, label, container,
            image.handle.offset_data, image.size, meta=encoded, field_values=parts.values,
            field_members={name: (container, m.handle.offset_data, m.size) for name, m in parts.field_members.items()})
