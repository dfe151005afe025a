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
import json
import os
import re
import tarfile
from pathlib import Path
from typing import Any, Callable, Sequence

from ..fields import FieldSpec
from ..names import ESCAPED_FIELD, is_utf8
from .archive_listing import _META_EXTENSIONS, _META_LIMIT, DEFAULT_MAX_MEMBER_SIZE, _Listing
from .labels import loose_int
from .listing import SourceListing
from .sidefiles import IMAGE_EXTENSIONS, SideMember, assemble_sample, read_limit, split_key
from .tar import _archive_errors, _file_members, _peek, _Spooled, decompressor, is_tar_header


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
            stream = stack.enter_context(decompressor(path, kind.split(".")[1]))
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
                if suffix == "tar" or (not folder and is_tar_header(_peek(archive, member))):
                    return False
                if key in meta_keys:
                    return True
                other_keys.add(key)
            top_level = top_level and not folder
            if files >= 64:
                break
    return files > 0 and top_level


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
