"""Recognising a source by its bytes (``--source-kind auto``) and handing it to its door: a
WebDataset (brace pattern, folder of tars, or a tar of samples), COCO, a Hugging Face
``save_to_disk`` folder, Parquet, a zip, a tar of class folders or class tars, else an image
folder or a manifest."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Callable, Sequence

from ..errors import OptionError, SourceError
from ..fields import FieldSpec
from .archive_listing import DEFAULT_MAX_MEMBER_SIZE
from .coco import list_coco, looks_like_coco
from .folder import list_image_folder
from .hf_disk import hf_disk_folder, list_hf_disk
from .listing import SourceListing
from .manifest import list_manifest
from .parquet import _parquet_files, list_parquet
from .sniff import sniff_container
from .tar import _archive_errors, list_tar
from .webdataset import _looks_like_webdataset, list_webdataset
from .zip import list_zip

#: Accepted values of ``source_kind``.
SOURCE_KINDS = ("auto", "folder", "manifest", "tar", "zip", "webdataset", "parquet", "coco", "hf")


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
        label_field: the WebDataset ``.json`` field, or the Parquet / Hugging Face column, holding the label.
        image_column: the Parquet / Hugging Face column holding the images (default: found by its type).
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
    if source_kind == "hf" or (source_kind == "auto" and hf_disk_folder(path)):
        _no_fields(fields, "a Hugging Face save_to_disk folder declares its fields from its features")
        return list_hf_disk(path, progress=progress, spool_dir=spool_dir, label_column=label_field,
                            image_column=image_column, max_member_size=max_member_size)
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
