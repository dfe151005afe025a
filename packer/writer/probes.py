"""What a finished build records to recognise its source again: a spread of its files' sizes.

``packer build ... --resume`` on a finished dataset (a job script re-run after it succeeded) must
tell "this source, already done" (exit 0, nothing rewritten) from "another source" (an error)
without listing the source again. The build records ``build.source_probes``: at most
``PROBES`` of the source's files, spread over it, with their sizes, named relative to a folder
that the source's kind (recorded beside them) and the source given determine:

- an image folder, a manifest, a COCO file (``FILE_KINDS``: every sample is a file): sample
  files by key, under ``sources.source_root`` (the folder, ``--root`` or the file's folder);
- the kinds whose samples live inside other files (tar, zip, WebDataset, Parquet, a Hugging
  Face folder): the files the source is made of (the archive, the shards, the data files),
  under the source folder (or the folder of a single file, or of a brace pattern's shards),
  each as ``{"size": bytes, "ends_xxh3": hex}``: an archive's size alone says little (a tar is
  padded to 10 KiB records), so the xxh3-64 of its first and last 64 KiB goes with it.

The record is informative: whoever reads it checks each probe's type and never follows a path
out of that folder.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import numpy as np

from .. import format as fmt
from .._internal.names import source_name
from ..sources import SourceListing, source_root
from ..sources.detect import expand_braces

__all__ = ["PROBES", "FILE_KINDS", "source_probes", "listing_probes", "probe_mismatch"]

#: At most this many files are probed.
PROBES = 16
#: The kinds whose samples are files under a root (their keys name them).
FILE_KINDS = ("folder", "manifest", "coco")
#: A folder source is walked for at most this many files (a spread of the first ones beyond).
_MAX_WALK = 1_000_000
#: The bytes hashed at each end of a probed archive, shard or data file.
_ENDS = 64 << 10


def _spread(count: int) -> list[int]:
    return sorted({int(x) for x in np.linspace(0, count - 1, num=min(PROBES, count))}) if count else []


def listing_probes(listing: SourceListing) -> dict[str, int]:
    """A spread of a file kind's listed samples and their sizes (keys that are escaped names,
    ``packer._internal.names``, are left out: they name no file as written)."""
    probes = {}
    for i in _spread(len(listing)):
        key = listing.key(i)
        if source_name(key, listing.metadata(i)) is None:
            probes[key] = int(listing.sizes[i])
    return probes


def source_probes(source: str | os.PathLike[str], kind: str, listing: SourceListing) -> dict[str, Any] | None:
    """The probes a build of ``source`` (of the detected ``kind``) records; None for a kind that has
    no files (samples written from Python)."""
    if kind in FILE_KINDS:
        return listing_probes(listing)
    if kind == "python":
        return None
    anchor, files = _source_files(source)
    probes: dict[str, Any] = {}
    for i in _spread(len(files)):
        try:
            found = _size_and_ends(files[i])
            if found is not None:
                probes[files[i].relative_to(anchor).as_posix()] = {"size": found[0], "ends_xxh3": found[1]}
        except ValueError:  # outside the anchor (cannot happen for the files listed under it)
            continue
    return probes


def _size_and_ends(path: Path) -> tuple[int, str] | None:
    """(size, xxh3-64 hex of its first and last ``_ENDS`` bytes) of a regular file; None when it
    is not one or cannot be read (opened without blocking: a FIFO is never read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        head = os.pread(fd, _ENDS, 0)
        tail = os.pread(fd, _ENDS, max(info.st_size - _ENDS, len(head)))
    except OSError:
        return None
    finally:
        os.close(fd)
    return info.st_size, fmt.checksum_hex(fmt.checksum(head + tail))


def probe_mismatch(source: str | os.PathLike[str], kind: str, root: str | os.PathLike[str] | None,
                   probes: Any) -> str | None:
    """What differs between the recorded ``probes`` and the source given now (``"'cat/1.jpg' is 12
    bytes under /data, it was 10 bytes"``), or None when every probe matches. Probes that are not
    a relative path with a size (or a size and the hash of its ends) are skipped: the record is
    informative."""
    anchor = source_root(source, kind, root) if kind in FILE_KINDS else _anchor(os.fspath(source))
    for key, recorded in (probes.items() if isinstance(probes, dict) else ()):
        if not isinstance(key, str) or not key or key.startswith("/") or ".." in key.split("/"):
            continue
        if isinstance(recorded, dict):  # {"size", "ends_xxh3"}: a file the source is made of
            size, ends = recorded.get("size"), recorded.get("ends_xxh3")
            if not _is_size(size) or not isinstance(ends, str):
                continue
            found = _size_and_ends(anchor / key)
            if found is None:
                return f"{key!r} is missing under {anchor}, it was {size} bytes"
            if found[0] != size:
                return f"{key!r} is {found[0]} bytes under {anchor}, it was {size} bytes"
            if found[1] != ends:
                return f"{key!r} under {anchor} holds other bytes than it did (same size, {size} bytes)"
            continue
        if not _is_size(recorded):
            continue
        try:
            now = os.stat(anchor / key).st_size
        except (OSError, ValueError):
            now = -1
        if now != recorded:
            return (f"{key!r} is {'missing' if now < 0 else f'{now} bytes'} under {anchor}, it was "
                    f"{recorded} bytes")
    return None


def _is_size(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _anchor(text: str) -> Path:
    """The folder a non-file kind's probes are named under (see the module docstring)."""
    if "{" in text and not os.path.exists(text):
        parents = {os.path.dirname(name) or "." for name in expand_braces(text)}
        return Path(os.path.commonpath(sorted(parents)) if len(parents) > 1 else parents.pop())
    path = Path(text)
    return path if path.is_dir() else path.parent


def _source_files(source: str | os.PathLike[str]) -> tuple[Path, list[Path]]:
    """(the anchor, the regular files the source is made of, sorted by their UTF-8 bytes)."""
    text = os.fspath(source)
    anchor = _anchor(text)
    if "{" in text and not os.path.exists(text):
        return anchor, [Path(name) for name in expand_braces(text)]
    path = Path(text)
    if not path.is_dir():
        return anchor, [path]
    # An explicit stack, not os.walk (tests/sources: no recursive walk of a user's tree), bounded.
    found: list[Path] = []
    stack = [path]
    while stack and len(found) < _MAX_WALK:
        folder = stack.pop()
        try:
            with os.scandir(folder) as entries:
                for entry in entries:
                    if entry.name.startswith("."):
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(Path(entry.path))
                    elif entry.is_file():
                        found.append(Path(entry.path))
        except OSError:
            continue
    return anchor, sorted(found, key=lambda p: os.fsencode(p))
