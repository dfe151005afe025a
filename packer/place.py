"""Where a dataset's bytes live: the ``Place`` protocol a ``Dataset`` reads through, and ``open_place``.

A ``Dataset`` never asks whether it is a folder or a URL: it holds a place and asks it for bytes.
Two places implement the protocol:

- ``LocalFiles``: a dataset folder, read in place (every open through ``packer._internal.files``: inside
  the folder, regular files, bounded reads); planning, prefetching and ``ensure`` do nothing;
- ``packer.remote.reader.RemoteFiles``: a dataset URL at one manifest generation; its manifest,
  index and build report are copied into the node cache, its shards read as checked extents
  fetched in the order the readers plan.

``open_place`` is the one point that picks one, from a ``packer.location.Location``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Protocol

import numpy as np

from . import format as fmt
from .backends import ShardBackend, open_backend
from .errors import DatasetChangedError, ManifestError, NotAPackerFileError, OptionError
from ._internal.files import iter_json_lines, open_dataset_file, read_capped
from .location import Location
from .remote.options import RemoteOptions

__all__ = ["Place", "LocalFiles", "open_place", "HeaderCheck"]

#: Checks a shard's first ``SHARD_HEADER_SIZE`` bytes against the manifest (``head``, ``where``):
#: the dataset's rule, run by the place before a backend is handed out.
HeaderCheck = Callable[[bytes, str], None]


class Place(Protocol):
    """What a dataset does with bytes, wherever they are.

    Attributes:
        folder: a local folder holding the manifest and index files (a URL's generation folder
            in the node cache); messages about those files name it.
        backend: the name of the shard backend reads go through (``"remote"`` for a URL).
        manifest_bytes: the manifest this place was opened at (its generation).
        options: how another process reaches the place again (``RemoteOptions``), or None.
    """

    folder: Path
    backend: str
    manifest_bytes: bytes

    @property
    def options(self) -> RemoteOptions | None: ...

    def open_index(self, entry: fmt.FileEntry) -> tuple[int, str]:
        """A descriptor of the index file (regular, of the manifest's size) and its path; close it."""

    def build_report(self, must_contain: bytes = b"") -> Iterator[dict[str, Any]] | None:
        """The build report's JSON lines (``files.iter_json_lines``: bounded, bad lines skipped), or
        None when the dataset has no report."""

    def open_shard(self, family: str, number: int, entry: fmt.ShardEntry, check_header: HeaderCheck) -> ShardBackend:
        """Shard ``number`` of ``family`` (``""``: the payloads; else an image field), its header
        checked by ``check_header`` before the backend is returned."""

    def plan(self, indices: Any) -> None:
        """This process will read samples ``indices`` in this order (prefetch them)."""

    def advance(self, position: int) -> None:
        """The reader has handed out ``position`` samples of its plan."""

    def ensure(self, indices: np.ndarray) -> None:
        """Make the bytes of samples ``indices`` (a batch) readable without waiting one by one."""

    def stats(self) -> dict[str, int] | None:
        """This process's transfer counters (None where nothing is transferred)."""

    def close(self) -> None: ...


def read_manifest(folder: Path) -> bytes:
    """The manifest bytes of the dataset folder ``folder``, bounded; a typed error saying what is
    there instead (no folder, a file, an unfinished build, a build that packed nothing)."""
    if not folder.exists():  # [R42]
        raise NotAPackerFileError("dataset folder does not exist", path=folder)
    if not folder.is_dir():  # [R42]
        raise NotAPackerFileError("not a dataset folder (expected a folder holding manifest.json)", path=folder)
    try:
        data = read_capped(folder, fmt.MANIFEST_NAME, fmt.MAX_MANIFEST_BYTES)
    except DatasetChangedError:  # [R42]
        staging = (folder / ".packer-build").exists()
        failed = not staging and (folder / fmt.REPORT_NAME).is_file()
        raise NotAPackerFileError(
            "no manifest.json: not a packer dataset" + (
                " (an unfinished build is here: finish it with `packer build --resume`)" if staging else "") + (
                f" (a build that packed nothing left {fmt.REPORT_NAME} here: it lists every rejected file "
                f"and why)" if failed else ""),
            path=folder) from None
    except NotAPackerFileError:  # [R44] a FIFO or folder in its place
        raise NotAPackerFileError("manifest.json is not a regular file", path=folder / fmt.MANIFEST_NAME) from None
    if data is None:  # [R30]
        raise ManifestError(f"manifest is over the {fmt.MAX_MANIFEST_BYTES} bytes limit", path=folder / fmt.MANIFEST_NAME)
    return data


class LocalFiles:
    """A dataset folder: every file opened in place, nothing planned or fetched.

    Args:
        folder: the dataset folder.
        backend: the shard backend (``packer.backends``).
        manifest_bytes: the manifest a parent process opened (a worker reads the same generation:
            the index file's name carries its checksum); None reads ``manifest.json``.
    """

    options: RemoteOptions | None = None

    def __init__(self, folder: Path, backend: str = "mmap", manifest_bytes: bytes | None = None) -> None:
        self.folder = folder
        self.backend = backend
        self.manifest_bytes = manifest_bytes if manifest_bytes is not None else read_manifest(folder)

    def open_index(self, entry: fmt.FileEntry) -> tuple[int, str]:
        return open_dataset_file(self.folder, entry.path, entry.size)

    def build_report(self, must_contain: bytes = b"") -> Iterator[dict[str, Any]] | None:
        if not (self.folder / fmt.REPORT_NAME).is_file():
            return None
        return iter_json_lines(self.folder, fmt.REPORT_NAME, must_contain=must_contain)

    def open_shard(self, family: str, number: int, entry: fmt.ShardEntry, check_header: HeaderCheck) -> ShardBackend:
        fd, real = open_dataset_file(self.folder, entry.path, entry.size)
        try:
            check_header(os.pread(fd, fmt.SHARD_HEADER_SIZE, 0), real)
            return open_backend(self.backend, fd, real, entry.size)
        finally:
            os.close(fd)

    def plan(self, indices: Any) -> None:
        """Nothing to prefetch: the page cache reads ahead."""

    def advance(self, position: int) -> None:
        """Nothing to move on."""

    def ensure(self, indices: np.ndarray) -> None:
        """Every byte is already here."""

    def stats(self) -> dict[str, int] | None:
        return None

    def close(self) -> None:
        """Nothing to stop: shard backends close with their last reference (``packer.dataset``)."""


#: Backends that read a URL's shards: both go through the node cache's extents.
_URL_BACKENDS = ("mmap", "pread")


def open_place(location: Location, *, backend: str | None = None,
               remote: RemoteOptions | Mapping[str, Any] | None = None, manifest_bytes: bytes | None = None) -> Place:
    """The place holding the dataset at ``location``.

    Args:
        backend: the shard backend reads will use (None: the dataset's index only).
        remote: for a URL, ``RemoteOptions`` (or a dict of its fields); ignored for a folder.
        manifest_bytes: the generation to open (a worker's parent's); the place refuses another.

    Raises:
        OptionError: a backend that reads local files asked of a URL, or bad remote options.
        DatasetChangedError, RemoteStoreError, PackerError: the place cannot be opened.
    """
    if location.url is None:
        return LocalFiles(location.local_path(), backend or "mmap", manifest_bytes)
    if backend is not None and backend not in _URL_BACKENDS:
        raise OptionError(f"backend {backend!r} reads local files; a dataset URL is read through the node "
                          f"cache (backend 'mmap' or 'pread')")
    from .remote import open_remote  # lazy: the transports load only for a URL

    return open_remote(location.url, remote, manifest_bytes=manifest_bytes)
