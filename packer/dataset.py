"""The reader: open a dataset folder, validate it, and give zero-copy access to sample bytes.

``open_index`` validates the manifest and maps the index (no shard is touched): enough for
``inspect`` and tools. ``open_dataset`` adds shard access. Opening is O(1) in the number of
samples apart from mapping, hashing and vectorised validation of the index (10-17 ms for a
million samples on the project VM: README, "Performance"). Shards are opened lazily, each header validated against the manifest at its
first use, then the hot path trusts the validated tables.

Shard handles are shared by threads and never closed under a reader. The cache of open shards
(at most ``max_open_shards``, least recently used first out) holds one reference to each
backend; evicting a shard only drops that reference. A backend closes its file when the last
reference goes (CPython's reference count is the handle count: the cache, each thread in the
middle of a read, each zero-copy view of a mapping), so a thread that fetched a backend reads
the right bytes until it lets go, whatever other threads evict meanwhile. A descriptor is never
closed while a read on it may run, so it is never reused for another shard under that read.
Lookups of an open shard take no lock; opening one (and evicting) happens under the dataset's
lock, so two threads never open the same shard twice.

A ``Dataset`` pickles as the manifest bytes it was opened from plus options (a few KB), never
per-sample Python objects: a DataLoader worker re-maps the *same* index file (its name carries
its checksum), so parent and workers always read one dataset version. If that version has been
replaced and deleted meanwhile, the worker raises ``DatasetChangedError``.

Where the bytes live is not this module's business: a dataset holds a *place*
(``packer.place.Place``: a folder, or a URL through the node cache), opened once from the
location the caller gave (``packer.location``), and asks it for the manifest, the index, the
build report and each shard; read plans, batch prefetches, transfer counters and ``close`` go to
it too (they do nothing for a folder).
"""

from __future__ import annotations

import json
import mmap
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from . import format as fmt
from .backends import ShardBackend, check_backend_name
from .backends.buffers import PAGE, aligned_empty
from .backends.runs import RunPlan, plan_runs
from . import fields as fieldspec
from .errors import (DatasetChangedError, IndexMismatchError, ManifestError, OptionError, PackerError,
                     SampleIndexError, SampleIndexTypeError, SampleKeyError, TruncatedFileError)
from .location import Location, parse_location
from .place import Place, open_place
from .selection import SelectedColumns
from .viewfile import ViewFile, check_base, is_view_file, parse_view, read_view
from .remote.options import RemoteOptions

__all__ = ["DatasetIndex", "Dataset", "Batch", "open_index", "open_dataset", "as_sample_indices"]

#: Shards kept open per process by default (each holds one fd and, for mmap, one mapping).
DEFAULT_MAX_OPEN_SHARDS = 64
#: Backends whose ``read_batch`` reads whole 4 KiB page blocks (formats/SPEC.md §3.4); mmap gathers
#: exact runs from the mapping, and a URL's node cache reads what its extents hold.
PAGE_BACKENDS = ("pread", "direct", "kvikio")


def as_sample_indices(indices: Any) -> np.ndarray:
    """``indices`` (a sequence, an array or a tensor of sample numbers) as an int64 array.

    Raises:
        TypeError: values that are not integers (``1.7`` would silently read sample 1, a bool
            mask would read samples 0 and 1), or unsigned values past int64.
    """
    array = np.asarray(indices)
    if array.size and array.dtype.kind not in "iu":
        first = array.reshape(-1)[0]
        raise SampleIndexTypeError(f"sample indices must be integers, got {array.dtype} values (e.g. {first!r})")
    if array.size and array.dtype.kind == "u" and int(array.max()) > np.iinfo(np.int64).max:
        raise SampleIndexTypeError(f"sample index {int(array.max())} is past int64")
    return array.astype(np.int64, copy=False)


class DatasetIndex:
    """A validated manifest and index: everything but the payload bytes.

    Attributes:
        path: the dataset folder (for a URL, its generation's folder in the node cache, which
            holds its manifest and index).
        url: the dataset URL (``s3://...``) of a dataset in object storage, else None.
        place: where the bytes are read from (``packer.place.Place``).
        manifest: the parsed ``Manifest``.
        index: the ``IndexColumns`` (numpy views of the mapped index file).
    """

    def __init__(self, path: str | os.PathLike[str] | Location, *, manifest_bytes: bytes | None = None,
                 remote: RemoteOptions | dict[str, Any] | None = None, view_bytes: bytes | None = None) -> None:
        self._location = parse_location(path, what="the dataset")
        self.view: ViewFile | None = None
        self._view_bytes: bytes | None = None
        base = self._location
        if self._location.url is None and (view_bytes is not None or is_view_file(self._location.local_path())):
            # A view file: the dataset is its base, seen through the view's selection (packer.viewfile).
            view_path = self._location.local_path()
            self._view_bytes = view_bytes if view_bytes is not None else read_view(view_path)
            self.view = parse_view(self._view_bytes, path=view_path)
            base = parse_location(self.view.base_location(view_path), what="the view's dataset")
        self.url: str | None = base.url.text if base.url is not None else None
        self.place: Place = self._open_place(base, remote=remote, manifest_bytes=manifest_bytes)
        self.path = self.place.folder
        self._manifest_bytes = self.place.manifest_bytes
        self.manifest = fmt.parse_manifest(self._manifest_bytes, path=self.path / fmt.MANIFEST_NAME)
        entry = self.manifest.index
        fd, real = self.place.open_index(entry)
        try:
            if entry.size == 0:
                raise TruncatedFileError("index file is empty", path=real)
            self._map = mmap.mmap(fd, entry.size, mmap.MAP_SHARED, mmap.PROT_READ)
        finally:
            os.close(fd)
        digest = fmt.checksum(self._map)
        if digest != entry.checksum:  # [R39] the whole index is hashed: a damaged table is never trusted
            raise fmt.ChecksumMismatchError(
                f"index checksum mismatch: manifest says {fmt.checksum_hex(entry.checksum)}, file hashes to "
                f"{fmt.checksum_hex(digest)} (the index is damaged or belongs to another build)", path=real)
        rows, columns = fmt.parse_column_file(self._map, fmt.INDEX_MAGIC, path=real, kind="index")
        self.index = fmt.validate_index(rows, columns, list(self.manifest.shards), self.manifest.alignment,
                                        path=real, fields=self.manifest.fields)
        labels = self.index.label
        if self.manifest.classes and len(labels) and (labels.min() < 0 or labels.max() >= len(self.manifest.classes)):  # [R40]
            bad = int(np.argmax((labels < 0) | (labels >= len(self.manifest.classes))))
            raise IndexMismatchError(f"has label {int(labels[bad])} but the manifest lists "
                                     f"{len(self.manifest.classes)} classes", path=real, sample=bad)
        self._shard_firsts = np.zeros(len(self.manifest.shards) + 1, dtype=np.int64)
        np.cumsum([s.sample_count for s in self.manifest.shards], out=self._shard_firsts[1:])
        self._count = self.manifest.sample_count
        self._stored_firsts = self._shard_firsts  # the shards' rows as stored (a view's base's)
        if self.view is not None:
            self._select(self.view, base)

    def _select(self, view: ViewFile, base: Location) -> None:
        """Turn this dataset into the view's: its rows are the selected rows of the base (V9 first)."""
        check_base(view, self.index, self.manifest.sample_count, path=self._location.display, base=base.display)
        rows = view.selected.view(np.int64) if view.selected.dtype == np.uint64 else view.selected.astype(np.int64)  # < 2^40 (V4)
        # The base's rows are grouped by shard in order, and the selection ascends: a view's rows
        # of one shard are consecutive too, so shard_range stays a range.
        self._shard_firsts = np.searchsorted(rows, self._shard_firsts).astype(np.int64)
        self.index = SelectedColumns(self.index, rows, self.manifest.fields)  # type: ignore[assignment]
        self._count = len(rows)

    @property
    def base_rows(self) -> np.ndarray | None:
        """For a view, the base dataset's sample number of each of its samples (int64); else None."""
        return self.index.rows if self.view is not None else None  # type: ignore[attr-defined]

    @property
    def is_view(self) -> bool:
        """Whether this is a view of a dataset (opened from a view file)."""
        return self.view is not None

    def _open_place(self, location: Location, *, remote: RemoteOptions | dict[str, Any] | None,
                    manifest_bytes: bytes | None) -> Place:
        """The place of an index: no shard is read through it."""
        return open_place(location, remote=remote, manifest_bytes=manifest_bytes)

    @property
    def location(self) -> str:
        """Where the dataset is, as the caller named it: its URL, or its folder."""
        return self._location.text

    def build_report(self, must_contain: bytes = b"") -> Iterator[dict[str, Any]] | None:
        """The entries of the build report (``build-report.jsonl``: every rejected file and why),
        read bounded with bad lines skipped (it is informational); None when the dataset has none.

        Args:
            must_contain: skip lines without these bytes before parsing them.
        """
        return self.place.build_report(must_contain)

    # --- tables ---
    def __len__(self) -> int:
        return self._count

    @property
    def classes(self) -> tuple[str, ...]:
        return self.manifest.classes

    @property
    def labels(self) -> np.ndarray:
        """int64 labels, a zero-copy view of the index."""
        return self.index.label

    @property
    def classes_checksum(self) -> str | None:
        """The class list's checksum (``packer.classes.class_list_checksum``), None without classes."""
        return fmt.class_list_checksum(self.classes) if self.classes else None

    @property
    def sizes(self) -> np.ndarray:
        return self.index.size

    @property
    def alignment(self) -> int:
        return self.manifest.alignment

    def shard_alignment(self, shard: int) -> int:
        """The alignment shard ``shard`` was written with: the dataset's (a mixture's shards each
        keep their own stream's, which raw readers need for the distance between two samples)."""
        return self.manifest.alignment

    @property
    def shard_sizes(self) -> np.ndarray:
        """Each shard file's size in bytes (int64), from the manifest: where whole-block reads stop."""
        sizes = self.__dict__.get("_shard_sizes")
        if sizes is None:
            sizes = self.__dict__["_shard_sizes"] = np.fromiter(
                (entry.size for entry in self.manifest.shards), dtype=np.int64, count=len(self.manifest.shards))
        return sizes

    def _check(self, i: int) -> int:
        n = self._count
        if not -n <= i < n:
            raise SampleIndexError(f"sample {i} out of range for a dataset of {n} samples")
        return i % n if n else i

    def key(self, i: int) -> str:
        """The source key (relative path) of sample ``i``."""
        i = self._check(i)
        ko = self.index.key_offsets
        return self.index.keys[int(ko[i]):int(ko[i + 1])].tobytes().decode("utf-8", "replace")

    def keys(self) -> Iterator[str]:
        for i in range(len(self)):
            yield self.key(i)

    def metadata(self, i: int) -> dict[str, Any]:
        """Sample ``i``'s JSON metadata from a manifest build ({} when none)."""
        i = self._check(i)
        mo = self.index.meta_offsets
        raw = self.index.meta[int(mo[i]):int(mo[i + 1])].tobytes()
        if not raw:
            return {}
        depth = fmt.json_nesting_depth(raw)
        if depth > fmt.MAX_JSON_DEPTH:
            raise IndexMismatchError(f"holds metadata nested {depth} levels deep; readers decode at most "
                                     f"{fmt.MAX_JSON_DEPTH}", path=self.path, sample=i)
        try:
            value = json.loads(raw)
        except (ValueError, RecursionError):
            raise IndexMismatchError("holds metadata that is not JSON", path=self.path, sample=i) from None
        return value if isinstance(value, dict) else {"value": value}

    # --- declared fields (formats/SPEC.md §14) ---
    @property
    def fields(self) -> tuple[fmt.FieldSpec, ...]:
        """The dataset's declared fields (``()`` for a dataset of images and labels only)."""
        return self.manifest.fields

    def field_spec(self, name: str) -> fmt.FieldSpec:
        """The declaration of field ``name``.

        Raises:
            OptionError: the dataset declares no such field (the message lists those it has).
        """
        try:
            return self.manifest.field(name)
        except KeyError:
            have = [spec.name for spec in self.manifest.fields]
            raise OptionError(f"dataset has no field {name!r}; its fields are {have or 'none'} (besides "
                              f"image, label, key, index and metadata)") from None

    def field_value(self, name: str, i: int) -> Any:
        """Sample ``i``'s value of an ``array``, ``classes`` or ``text`` field: an ndarray (the
        declared shape; variable arrays ``(n, *rest)``; class sets their sorted int64 ids) or a str.

        Raises:
            OptionError: no such field, or an ``image`` field (read it with ``Dataset.field_image``).
            IndexMismatchError: stored text that is not UTF-8.
        """
        spec = self.field_spec(name)
        i = self._check(i)
        if spec.kind == "image":
            raise OptionError(f"field {name!r} is an image: read it with Dataset.field_image(name, i)")
        raw = self._field_raw(spec, i)
        try:
            return fieldspec.decode_value(spec, raw)
        except fieldspec.FieldValueError as exc:
            raise IndexMismatchError(str(exc), path=self.path, sample=i) from None

    def _field_raw(self, spec: fmt.FieldSpec, i: int) -> np.ndarray:
        """Sample ``i``'s stored bytes of value field ``spec`` (a view of the index)."""
        column = self.index.field_columns[spec.column]
        if spec.variable:
            offsets = self.index.field_columns[spec.offsets_column]
            return column[int(offsets[i]):int(offsets[i + 1])]
        size = spec.record_bytes
        return column[i * size:(i + 1) * size]

    def field_array(self, name: str) -> np.ndarray:
        """A fixed-shape ``array`` field for every sample: a zero-copy ``(N, *shape)`` view of the index."""
        spec = self.field_spec(name)
        if spec.kind != "array" or spec.variable:
            raise OptionError(f"field {name!r} ({spec.describe()}) has no fixed shape; read it per sample "
                              f"with field_value")
        column = self.index.field_columns[spec.column]
        return column.view(spec.numpy_dtype).reshape((len(self), *spec.shape))

    def find(self, key: str) -> int:
        """The index of the sample whose key is ``key``.

        Scans the key blob (no per-sample objects are built): O(total key bytes).

        Raises:
            SampleKeyError: no sample has this key (also a ``KeyError``).
        """
        if not isinstance(key, str) or not key:
            # an empty needle would match everywhere
            raise SampleKeyError(f"no sample has the key {key!r}: keys are non-empty strings", key=key)
        try:
            needle = key.encode("utf-8")
        except UnicodeEncodeError:
            raise SampleKeyError(f"no sample has the key {key!r}: it holds a lone surrogate, and keys are UTF-8",
                                 key=key) from None
        blob = memoryview(self.index.keys).tobytes() if len(self.index.keys) else b""
        offsets = self.index.key_offsets
        start = 0
        while True:
            pos = blob.find(needle, start)
            if pos < 0:
                raise SampleKeyError(f"no sample has the key {key!r}", key=key)
            row = int(np.searchsorted(offsets, pos, side="right")) - 1
            if int(offsets[row]) == pos and int(offsets[row + 1]) == pos + len(needle):
                return row
            start = pos + 1

    def shard_of(self, i: int) -> int:
        return int(self.index.shard[self._check(i)])

    def sample_info(self, i: int) -> dict[str, Any]:
        """Everything the index knows about sample ``i`` (JSON-ready)."""
        i = self._check(i)
        ix = self.index
        shard = int(ix.shard[i])
        label = int(ix.label[i])
        return {
            "index": i, "key": self.key(i), "label": label,
            **({"base_index": int(self.index.rows[i])} if self.view is not None else {}),  # type: ignore[attr-defined]
            "class": self.classes[label] if 0 <= label < len(self.classes) else None,
            "shard": shard, "shard_path": self.manifest.shards[shard].path,
            "offset": int(ix.offset[i]), "size": int(ix.size[i]), "checksum": fmt.checksum_hex(int(ix.checksum[i])),
            "width": int(ix.width[i]), "height": int(ix.height[i]), "channels": int(ix.channels[i]),
            "image_format": fmt.ImageFormat.NAMES.get(int(ix.image_format[i]), "unknown"),
            "metadata": self.metadata(i),
            **({"fields": {spec.name: self._field_info(spec, i) for spec in self.fields}} if self.fields else {}),
        }

    def _field_info(self, spec: fmt.FieldSpec, i: int) -> Any:
        """A field's value for ``sample_info`` (JSON-ready); an image field's table entry."""
        if spec.kind == "image":
            columns = self.index.field_columns
            return {"shard_path": spec.shards[int(self.index.shard[i])].path,
                    **{part: int(columns[spec.image_column(part)][i]) for part in fieldspec.IMAGE_COLUMNS},
                    "format": fmt.ImageFormat.NAMES.get(int(columns[spec.image_column("format")][i]), "unknown")}
        try:
            value = self.field_value(spec.name, i)
        except IndexMismatchError as exc:  # a hand-damaged value: show its bytes escaped, `verify` reports it
            return {"error": exc.message,
                    "escaped": self._field_raw(spec, i).tobytes().decode("utf-8", "backslashreplace")}
        return value if isinstance(value, str) else fmt.json_ready(value.tolist())

    def shard_range(self, shard: int) -> tuple[int, int]:
        """[first, end) sample indices of shard ``shard``."""
        return int(self._shard_firsts[shard]), int(self._shard_firsts[shard + 1])

    def stored_layout(self, shard: int) -> tuple[int, int, int]:
        """Shard ``shard`` as stored: ``(first, end, origin)``, its rows ``[first, end)`` in stored
        numbering (``stored_rows``) and the offset of its first stored sample. What a check of the
        raw layout counts from (a view's rows of a shard need not be consecutive in it)."""
        first, end = int(self._stored_firsts[shard]), int(self._stored_firsts[shard + 1])
        columns = self.index.base if self.view is not None else self.index  # type: ignore[attr-defined]
        return first, end, int(columns.offset[first]) if end > first else 0

    def stored_rows(self, indices: np.ndarray) -> np.ndarray:
        """Samples ``indices`` (in range, non-negative) in stored numbering: a view's base's rows."""
        rows = self.base_rows
        return indices if rows is None else rows[indices]

    def close(self) -> None:
        index = getattr(self, "index", None)
        self.index = None  # type: ignore[assignment]
        del index
        try:
            self._map.close()
        except (BufferError, AttributeError):
            pass  # views still alive elsewhere; freed with them

    def __enter__(self) -> "DatasetIndex":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class Batch:
    """Bytes of several samples read with coalesced I/O.

    ``data[starts[j]:starts[j] + sizes[j]]`` is the j-th requested sample. Adjacent samples were read
    as one block, so ``data`` holds them in storage order with their alignment padding.
    """

    data: np.ndarray
    starts: np.ndarray
    sizes: np.ndarray

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, j: int) -> memoryview:
        start = int(self.starts[j])
        return memoryview(self.data)[start:start + int(self.sizes[j])]


class Dataset(DatasetIndex):
    """A dataset with payload access: ``get(i)`` / ``read_batch(indices)`` over a backend."""

    def __init__(self, path: str | os.PathLike[str] | Location, *, backend: str = "mmap",
                 verify_checksums: bool = False, max_open_shards: int = DEFAULT_MAX_OPEN_SHARDS,
                 manifest_bytes: bytes | None = None, remote: RemoteOptions | dict[str, Any] | None = None,
                 view_bytes: bytes | None = None) -> None:
        self._backend_asked = check_backend_name(backend)  # before anything is mapped or hashed
        super().__init__(path, manifest_bytes=manifest_bytes, remote=remote, view_bytes=view_bytes)
        # The backend reads go through: the one asked for, or for a URL "remote" (the node cache's extents).
        self.backend_name = self.place.backend
        self.verify_checksums = verify_checksums
        self.max_open_shards = max(1, max_open_shards)
        self._open: OrderedDict[Any, ShardBackend] = OrderedDict()
        self._open_lock = threading.Lock()
        self._pid = os.getpid()

    def _open_place(self, location: Location, *, remote: RemoteOptions | dict[str, Any] | None,
                    manifest_bytes: bytes | None) -> Place:
        return open_place(location, backend=self._backend_asked, remote=remote, manifest_bytes=manifest_bytes)

    # --- pickling: manifest bytes + options, a few KB ---
    def __getstate__(self) -> dict[str, Any]:
        return {"path": self._location, "manifest": self._manifest_bytes, "backend": self._backend_asked,
                "verify": self.verify_checksums, "max_open": self.max_open_shards, "remote": self.place.options,
                "view": self._view_bytes}

    def __setstate__(self, state: dict[str, Any]) -> None:
        try:
            Dataset.__init__(self, state["path"], backend=state["backend"], verify_checksums=state["verify"],
                             max_open_shards=state["max_open"], manifest_bytes=state["manifest"],
                             remote=state.get("remote"), view_bytes=state.get("view"))
        except DatasetChangedError:
            raise
        except PackerError as exc:
            raise DatasetChangedError(f"the dataset changed since it was opened in the parent process: {exc}",
                                      path=str(state["path"])) from None

    # --- shards ---
    def shard(self, number: int, field: str | None = None) -> ShardBackend:
        """The open backend of shard ``number`` (opened and validated on first use); with
        ``field``, of that image field's shard parallel to it.

        Thread-safe. The backend stays open while the caller holds it, even if other threads
        evict it from the cache meanwhile (module docstring): hold the returned object for as
        long as you read through it, and drop it when done.
        """
        if self._pid != os.getpid():  # forked: never share file offsets or maps across processes
            self._open = OrderedDict()
            self._open_lock = threading.Lock()
            self._pid = os.getpid()
        key: Any = number if field is None else (field, number)
        backend = self._open.get(key)
        if backend is not None:
            try:
                self._open.move_to_end(key)
            except KeyError:  # evicted by another thread since the get: ours stays open while we hold it
                pass
            return backend
        with self._open_lock:
            backend = self._open.get(key)
            if backend is None:
                backend = self._open_shard(number, field)
                self._open[key] = backend
                while len(self._open) > self.max_open_shards:
                    # Dropped, not closed: a thread may be reading it; it closes with its last reference.
                    self._open.popitem(last=False)
        return backend

    def _open_shard(self, number: int, field: str | None) -> ShardBackend:
        entry = self.manifest.shards[number] if field is None else self.field_spec(field).shards[number]
        return self.place.open_shard(field or "", number, entry,
                                     lambda head, where: self._check_shard_header(head, where, entry))

    def _check_shard_header(self, head: bytes, where: str, entry: fmt.ShardEntry) -> None:
        header = fmt.ShardHeader.parse(head, path=where, actual_size=entry.size)
        expected_number = entry.number
        if (header.alignment != self.manifest.alignment or header.sample_count != entry.sample_count
                or header.shard_number != expected_number):  # [R38]
            raise ManifestError(
                f"shard header (alignment {header.alignment}, {header.sample_count} samples, number "
                f"{header.shard_number}) disagrees with the manifest (alignment {self.manifest.alignment}, "
                f"{entry.sample_count} samples, number {expected_number})", path=where)

    # --- planned reads (a dataset in object storage prefetches them; a local one needs nothing) ---
    def plan_reads(self, indices: Any) -> None:
        """This process will read samples ``indices`` in this order (the readers say so at the start
        of an epoch): a dataset in object storage fetches what comes next ahead of the reads."""
        self.place.plan(self._base_numbers(as_sample_indices(indices).reshape(-1)))

    def _base_numbers(self, indices: np.ndarray) -> np.ndarray:
        """Sample numbers of this dataset as the place knows them: a view's are its base's."""
        rows = self.base_rows
        if rows is None:
            return indices
        return rows[indices % max(len(rows), 1)] if len(rows) else indices

    def reads_advanced(self, position: int) -> None:
        """The reader has handed out ``position`` samples of its planned order."""
        self.place.advance(int(position))

    def remote_stats(self) -> dict[str, int] | None:
        """This process's transfer counters for a dataset in object storage (None for a folder)."""
        return self.place.stats()

    def _locate(self, i: int) -> tuple[int, int, int]:
        i = self._check(i)
        ix = self.index
        return int(ix.shard[i]), int(ix.offset[i]), int(ix.size[i])

    def get(self, i: int) -> memoryview:
        """Sample ``i``'s stored bytes: a zero-copy view with the mmap backend.

        Raises:
            ChecksumMismatchError: with ``verify_checksums``, when the bytes are damaged.
        """
        shard, offset, size = self._locate(i)
        data = self.shard(shard).view(offset, size)
        if self.verify_checksums:
            fmt.verify_checksum(data, int(self.index.checksum[i]), path=self.manifest.shards[shard].path,
                                sample=self._check(i), offset=offset)
        return data

    def read(self, i: int) -> bytes:
        """Sample ``i``'s bytes as an independent ``bytes`` object."""
        return bytes(self.get(i))

    def field_bytes(self, name: str, i: int) -> memoryview:
        """Sample ``i``'s stored bytes of image field ``name`` (zero-copy with mmap).

        Raises:
            OptionError: no such field, or not an image field.
            ChecksumMismatchError: with ``verify_checksums``, when the bytes are damaged.
        """
        spec = self.field_spec(name)
        if spec.kind != "image":
            raise OptionError(f"field {name!r} is {spec.kind}, not an image: read it with field_value")
        i = self._check(i)
        columns = self.index.field_columns
        shard = int(self.index.shard[i])
        offset, size = int(columns[spec.image_column("offset")][i]), int(columns[spec.image_column("size")][i])
        data = self.shard(shard, name).view(offset, size)
        if self.verify_checksums:
            fmt.verify_checksum(data, int(columns[spec.image_column("checksum")][i]), path=spec.shards[shard].path,
                                sample=i, offset=offset, what=f"field {name!r}")
        return data

    def field_image(self, name: str, i: int, *, max_pixels: int | None = None) -> np.ndarray:
        """Sample ``i``'s image field ``name`` decoded with its values kept (``decode_as_stored``:
        a palette mask gives its indices, a 16-bit depth map uint16).

        Raises:
            OptionError, DecodeError, ChecksumMismatchError.
        """
        from .codecs import dataset_max_pixels
        from .decode import decode_as_stored

        spec = self.field_spec(name)
        data = self.field_bytes(name, i)
        image_format = int(self.index.field_columns[spec.image_column("format")][self._check(i)])
        return decode_as_stored(data, image_format, name=f"{self.key(i)} (field {name!r})",
                                max_pixels=max_pixels or dataset_max_pixels(self.manifest))

    def value(self, name: str, i: int) -> Any:
        """Sample ``i``'s field ``name`` as a reader returns it: ``field_image`` for image fields,
        ``field_value`` for the rest."""
        spec = self.field_spec(name)
        return self.field_image(name, i) if spec.kind == "image" else self.field_value(name, i)

    def __getitem__(self, i: int) -> memoryview:
        return self.get(i)

    def iter_samples(self, indices: Sequence[int] | np.ndarray | None = None, *, chunk: int = 65536
                     ) -> Iterator[tuple[memoryview, int]]:
        """Yield ``(bytes, label)`` for ``indices`` (default: every sample in storage order).

        The fast path for raw iteration: table lookups are done per chunk with numpy, so each
        sample costs one slice of its shard's zero-copy view (mmap) instead of a method call
        chain. With another backend each chunk is read with ``read_batch``.
        """
        n = len(self)
        order = np.arange(n, dtype=np.int64) if indices is None else as_sample_indices(indices)
        if order.size and (order.min() < -n or order.max() >= n):
            raise SampleIndexError(f"indices hold {int(order[(order < -n) | (order >= n)][0])}, outside "
                                   f"{-n}..{n - 1} (a dataset of {n} samples)")
        ix = self.index
        for first in range(0, len(order), chunk):
            part = order[first:first + chunk] % max(n, 1)
            labels = ix.label[part].tolist()
            if self.backend_name != "mmap" or self.verify_checksums:
                batch = self.read_batch(part)
                for j, label in enumerate(labels):
                    yield batch[j], label
                continue
            shards, offsets, sizes = ix.shard[part].tolist(), ix.offset[part].tolist(), ix.size[part].tolist()
            views: dict[int, memoryview] = {}
            for shard, offset, size, label in zip(shards, offsets, sizes, labels):
                view = views.get(shard)
                if view is None:
                    view = views[shard] = self.shard(shard).view(0, self.manifest.shards[shard].size)
                yield view[offset:offset + size], label

    def read_batch(self, indices: Sequence[int] | np.ndarray) -> Batch:
        """Read many samples, coalescing runs of adjacent samples into one read each.

        Samples ``i, i+1, ...`` in the same shard are contiguous on disk (aligned padding between
        them), so a run is one aligned block: one ``read_into`` call, no per-sample syscalls.
        """
        idx = as_sample_indices(indices).reshape(-1)
        n = len(self)
        if idx.size == 0:
            empty = np.zeros(0, dtype=np.int64)
            return Batch(data=np.zeros(0, dtype=np.uint8), starts=empty, sizes=empty)
        if idx.min() < -n or idx.max() >= n:
            raise SampleIndexError(f"batch holds index {int(idx[(idx < -n) | (idx >= n)][0])}, outside "
                                   f"{-n}..{n - 1} (a dataset of {n} samples)")
        idx = np.where(idx < 0, idx + n, idx)
        ix = self.index
        if self.backend_name == "mmap":
            # The page cache is already in memory: exact runs, joined without alignment games.
            runs = plan_runs(ix, idx)
            data = self._gather_mapped(runs)
        elif self.backend_name in PAGE_BACKENDS:
            # Whole pages, whatever the alignment (formats/SPEC.md §3.4): page-sized reads at page
            # offsets into page-aligned memory let O_DIRECT / GPUDirect backends skip their bounce
            # buffer, and small records sharing a page come in one read.
            runs = plan_runs(ix, idx, pages=self.shard_sizes)
            self.place.ensure(self._base_numbers(runs.unique))
            data = self._read_runs(runs)
        else:
            # In object storage: the payloads and their aligned ends only, which lie in the extents
            # of the samples asked (a page block could reach into an extent nobody asked for).
            runs = plan_runs(ix, idx, round_to=PAGE if self.manifest.alignment % PAGE == 0 else 1)
            self.place.ensure(self._base_numbers(runs.unique))  # in object storage: the batch's missing extents, fetched in parallel
            data = self._read_runs(runs)
        batch = Batch(data=data, starts=runs.starts, sizes=runs.batch_sizes)
        if self.verify_checksums:
            for j, i in enumerate(idx.tolist()):
                fmt.verify_checksum(batch[j], int(ix.checksum[i]), sample=i,
                                    path=self.manifest.shards[int(ix.shard[i])].path)
        return batch

    def _gather_mapped(self, runs: RunPlan) -> np.ndarray:
        """mmap: join the runs' zero-copy slices with one ``bytearray.join`` (a C loop of memcpy).

        A Python loop of slice assignments costs ~3x more per run than building the list of slices.
        """
        views = {shard: memoryview(self.shard(shard).array) for shard in np.unique(runs.run_shard).tolist()}
        pieces = [views[shard][start:start + length] for shard, start, length
                  in zip(runs.run_shard.tolist(), runs.run_offset.tolist(), runs.run_bytes.tolist())]
        return np.frombuffer(bytearray().join(pieces), dtype=np.uint8)

    def _read_runs(self, runs: RunPlan) -> np.ndarray:
        """Other backends: one ``read_into`` per run into one page-aligned buffer."""
        data = aligned_empty(runs.nbytes, PAGE)
        for shard in np.unique(runs.run_shard).tolist():  # one backend lookup per shard, not per run
            backend = self.shard(shard)
            for r in np.flatnonzero(runs.run_shard == shard).tolist():
                position = int(runs.run_pos[r])
                backend.read_into(int(runs.run_offset[r]), data[position:position + int(runs.run_bytes[r])])
        return data

    def close(self) -> None:
        """Drop the open shards: each closes now, or, if another thread is still reading it (or a
        zero-copy view of it is alive), when that reader lets go (never under it)."""
        self._open = OrderedDict()
        self.place.close()
        super().close()


def open_index(path: str | os.PathLike[str] | Location, *,
               remote: RemoteOptions | dict[str, Any] | None = None) -> DatasetIndex:
    """Validate a dataset's manifest and index without touching its shards.

    ``path`` may be a dataset URL (``remote`` as for ``open_dataset``).

    Raises:
        PackerError: a typed error naming the file and what is wrong.
    """
    return DatasetIndex(path, remote=remote)


def open_dataset(path: str | os.PathLike[str] | Location, *, backend: str = "mmap", verify_checksums: bool = False,
                 max_open_shards: int = DEFAULT_MAX_OPEN_SHARDS,
                 remote: RemoteOptions | dict[str, Any] | None = None) -> Dataset:
    """Open a dataset for reading.

    Args:
        path: the dataset folder (holding ``manifest.json``), or its URL: ``s3://``, ``gs://``,
            ``az://``, ``https://`` (read-only) or ``file://`` (see ``packer.remote`` and
            docs/guides/object-storage.md); parsed once by ``packer.location.parse_location``.
        remote: for a URL, ``packer.remote.RemoteOptions`` (or a dict of its fields): endpoint,
            transport, node cache folder and bound, request sizes, retries.
        backend: ``"mmap"`` (default, zero-copy, shared pages), ``"pread"``, ``"direct"`` (O_DIRECT),
            ``"kvikio"`` (GPUDirect Storage; ``read_into`` accepts CUDA buffers, see ``packer.gpu``).
        verify_checksums: check every sample's xxh3 on read (about 20 GB/s).
        max_open_shards: LRU bound on open shard files per process.

    Raises:
        PackerError: a typed error naming the file and what is wrong.
    """
    return Dataset(path, backend=backend, verify_checksums=verify_checksums, max_open_shards=max_open_shards,
                   remote=remote)
