"""Recognising a source by its bytes (``--source-kind auto``) and handing it to its door: a
WebDataset (brace pattern, folder of tars, or a tar of samples), COCO, a Hugging Face
``save_to_disk`` folder, Parquet, a zip, a tar of class folders or class tars, else an image
folder or a manifest.

``detect_kind`` is the one place a source's kind is decided (a build calls it once and records
the kind); ``list_raw`` is the one dispatcher. It hands each door a ``DoorOptions`` and nothing else: the
rules (class list, label type, unlabeled samples, bounds) are applied to what it returns by
``contract.apply_contract``.
"""

from __future__ import annotations

import itertools
import os
import re
from pathlib import Path
from typing import Sequence

from ..errors import OptionError, SourceError
from ..fields import FieldSpec
from .._internal.files import open_user_file
from .coco import list_coco, looks_like_coco
from .folder import list_image_folder
from .hf_disk import hf_disk_folder, list_hf_disk
from .listing import DoorOptions, RawListing
from .manifest import list_manifest
from .parquet import list_parquet, parquet_files
from .sniff import COMPRESSIONS, sniff_container
from .tar import list_tar
from .tar_stream import archive_errors
from .webdataset import list_webdataset, looks_like_webdataset
from .zip import list_zip

__all__ = ["SOURCE_KINDS", "MAX_BRACE_NAMES", "expand_braces", "detect_kind", "source_root", "list_raw"]

#: Accepted values of ``source_kind``.
SOURCE_KINDS = ("auto", "folder", "manifest", "tar", "zip", "webdataset", "parquet", "coco", "hf")
#: A brace pattern may name at most this many shards (counted before anything is expanded).
MAX_BRACE_NAMES = 1_000_000
_BRACE = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"(\d{1,18})\.\.(\d{1,18})")


def expand_braces(pattern: str) -> list[str]:
    """Expand ``{000..099}`` (zero-padded ranges) and ``{a,b}`` alternatives, left to right.

    The number of names is the product of every group's count, computed before anything is
    expanded: ``{0..9999}{0..9999}`` is refused at once, not after building a hundred million
    strings. Groups do not nest.

    Raises:
        SourceError: a range with a start after its end, nested or unbalanced braces, or more
            than ``MAX_BRACE_NAMES`` names.
    """
    literals: list[str] = []
    groups: list[Sequence[str]] = []
    total = 1
    position = 0
    for match in _BRACE.finditer(pattern):
        literals.append(pattern[position:match.start()])
        position = match.end()
        body = match.group(1)
        ranged = _RANGE.fullmatch(body)
        if ranged:
            first, last = int(ranged.group(1)), int(ranged.group(2))
            if first > last:
                raise SourceError(f"brace range {{{body}}} must go up", path=pattern)
            width = len(ranged.group(1))
            count = last - first + 1
            groups.append(_Range(first, count, width))
        elif re.fullmatch(r"\d+\.\.\d+", body):
            raise SourceError(f"brace range {{{body}}}: numbers of at most 18 digits", path=pattern)
        else:
            groups.append(body.split(","))
        total *= len(groups[-1])
        if total > MAX_BRACE_NAMES:
            raise SourceError(f"the brace pattern names more than {MAX_BRACE_NAMES} files (its groups multiply); "
                              f"give fewer shards, or a folder of them", path=pattern)
    literals.append(pattern[position:])
    if any("{" in text or "}" in text for text in literals):
        raise SourceError("the brace pattern has nested or unbalanced braces (groups like {000..099} or {a,b} "
                          "do not nest)", path=pattern)
    if not groups:
        return [pattern]
    names = []
    for choice in itertools.product(*groups):
        names.append(literals[0] + "".join(part + literal for part, literal in zip(choice, literals[1:])))
    return names


class _Range(Sequence[str]):
    """``{first..last}`` zero-padded to ``width``, without building the list."""

    def __init__(self, first: int, count: int, width: int) -> None:
        self.first, self.count, self.width = first, count, width

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index):  # type: ignore[no-untyped-def]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.count))]
        if not 0 <= index < self.count:
            raise IndexError(index)
        return str(self.first + index).zfill(self.width)


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
                (_sniff(Path(e.path)) or "").startswith("tar") for e in entries):
            return [Path(e.path) for e in entries]
    return None


def _sniff(path: Path) -> str | None:
    """``sniff_container``, naming a missing optional dependency when the bytes say what is needed."""
    return sniff_container(path, strict=True)


def detect_kind(source: str | os.PathLike[str], source_kind: str = "auto") -> str:
    """The kind of door that reads ``source``: recognised by its bytes (``"auto"``), or checked
    against them when ``source_kind`` names one. The one place a source's kind is decided: a build
    detects it once and records it (``SourceSettings.kind``); nothing downstream guesses it.

    Returns:
        One of ``"folder"``, ``"manifest"``, ``"tar"``, ``"zip"``, ``"webdataset"``, ``"parquet"``,
        ``"coco"``, ``"hf"`` (a file named as ``"folder"`` is a manifest, a folder named as
        ``"manifest"`` an image folder: they share one door).

    Raises:
        OptionError: an unknown ``source_kind``.
        SourceError: the bytes are not the kind named, or the source is an unreadable archive.
        MissingDependencyError: the bytes say what the source is, and its reader is not installed.
    """
    return _detect(os.fspath(source), source_kind)[0]


def source_root(source: str | os.PathLike[str], kind: str, root: str | os.PathLike[str] | None = None) -> Path:
    """The folder a ``kind`` source's keys are relative to: the image folder itself, ``root`` or the
    folder of a manifest or COCO file; for the kinds whose samples are archive members, columns
    or shards, the source as given (their keys name no file)."""
    if kind in ("manifest", "coco"):
        return Path(root) if root is not None else Path(source).parent
    return Path(source)


def _detect(text: str, source_kind: str) -> tuple[str, object]:
    """(kind, what its door is given: the WebDataset shards, the Parquet files, else None)."""
    if source_kind not in SOURCE_KINDS:
        raise OptionError(f"--source-kind must be one of {', '.join(SOURCE_KINDS)}, got {source_kind!r}")
    if source_kind in ("folder", "manifest"):
        return ("manifest" if Path(text).is_file() else "folder"), None
    shards = _webdataset_shards(text) if source_kind in ("auto", "webdataset") else None
    if shards is not None:
        return "webdataset", shards
    path = Path(text)
    if source_kind == "coco" or (source_kind == "auto" and path.is_file() and looks_like_coco(path)):
        return "coco", None
    if source_kind == "hf" or (source_kind == "auto" and hf_disk_folder(path)):
        return "hf", None
    parquet = parquet_files(path) if source_kind in ("auto", "parquet") else None
    if parquet is not None:
        return "parquet", parquet
    kind = _sniff(path) if path.is_file() else None
    if kind is None:
        if source_kind != "auto":
            raise SourceError(f"--source-kind {source_kind}: the source is not a readable {source_kind} archive",
                              path=path)
        return ("manifest" if path.is_file() else "folder"), None
    if kind == "zip":
        if source_kind not in ("auto", "zip"):
            raise SourceError(f"--source-kind {source_kind}: the source is a zip archive", path=path)
        return "zip", None
    if kind == "parquet":  # --source-kind names another kind
        raise SourceError(f"--source-kind {source_kind}: the source is a Parquet file", path=path)
    with archive_errors(path):
        samples = source_kind == "webdataset" or (source_kind == "auto" and looks_like_webdataset(path, kind))
    if samples:
        return "webdataset", [path]
    if source_kind == "zip":
        raise SourceError("--source-kind zip: the source is a tar archive", path=path)
    return "tar", None


def list_raw(source: str | os.PathLike[str], door: DoorOptions = DoorOptions()) -> RawListing:
    """List any source with its door: an archive (tar, zip, WebDataset), Parquet, COCO, else a
    folder or a manifest. The door's listing, labels as written; no rule applied yet.

    Args:
        source: a folder, a manifest, an archive, a folder of WebDataset shards, or a brace pattern.
        door: what the doors may know (``listing.DoorOptions``); ``door.source.kind`` is
            ``"auto"`` or the kind ``detect_kind`` found (or the user named).

    Raises:
        SourceError: the source is unusable (missing, damaged archive, decompression bomb).
        OptionError: an unknown ``source_kind``, or fields for a door that takes none.
        MissingDependencyError: the bytes say what the source is, and its reader is not installed.
    """
    text = os.fspath(source)
    kind, found = _detect(text, door.source.kind)
    path = Path(text)
    if kind == "webdataset":
        return list_webdataset(found, door)  # type: ignore[arg-type]
    if kind == "coco":
        _no_fields(door.fields, "a COCO annotation file (it declares its own fields: boxes, labels, iscrowd, area, "
                                "image_id)")
        return list_coco(path, door)
    if kind == "hf":
        _no_fields(door.fields, "a Hugging Face save_to_disk folder (its fields come from its features)")
        return list_hf_disk(path, door)
    if kind == "parquet":
        _no_fields(door.fields, "a Parquet source")
        return list_parquet(found, door)  # type: ignore[arg-type]
    if kind == "zip":
        _no_fields(door.fields, "a zip of class folders")
        return list_zip(path, door)
    if kind == "tar":
        _no_fields(door.fields, "a tar of class folders (a tar of samples, key.jpg + key.json, is a WebDataset: "
                                "--source-kind webdataset)")
        return list_tar(path, door)
    return _folder_or_manifest(path, kind, door)


def _no_fields(fields: Sequence[FieldSpec], what: str) -> None:
    if fields:
        raise OptionError(f"--field: {what} does not take declared fields; fields come from a CSV/JSONL "
                          f"manifest, an image folder with side files, or a WebDataset")


def _folder_or_manifest(path: Path, kind: str, door: DoorOptions) -> RawListing:
    """List a folder or a manifest file, as ``kind`` says.

    A file whose first bytes say it is a compressed stream the manifest reader cannot be is
    named for what it is (a ``.tar.zst`` without zstandard), not called a bad manifest.
    """
    if kind == "manifest":
        handle, _ = open_user_file(path, what="the source", error=SourceError)  # never blocks on a FIFO
        with handle:
            head = handle.read(1024)
        if len(head) == 1024 and not head.strip(b"\x00"):
            raise SourceError("the source is an empty tar archive (only its end-of-archive blocks): nothing to pack",
                              path=path)
        if any(head.startswith(magic) for magic in COMPRESSIONS):
            raise SourceError("the source is a compressed stream, but not a tar packer can read (nor a manifest)",
                              path=path)
        return list_manifest(path, door)
    return list_image_folder(path, door)
