"""A dataset URL opened at one manifest generation: index in the node cache, shards read as extents.

``RemoteFiles`` is the place (``packer.place.Place``) a ``packer.dataset.Dataset`` holds for a URL.
Opening fetches the manifest (the generation is its xxh3) and the index into the node cache, where
``DatasetIndex`` maps and validates them exactly as a local dataset's; the build report is copied
there when it is first asked for. Extents are cut from the same cached index, mapped and checked
here (nothing is handed back by the dataset). Shard bytes come through ``RemoteShard`` (the
``ShardBackend`` protocol: ``read_into`` / ``view``), which reads checked extent files of the
cache and fetches a missing extent on demand (one process per node fetches it: a record lock).

Reads are planned from the order: ``plan(indices)`` hands over the sample order this process
will read (the samplers, the iterable dataset and ``ThreadedLoader`` do it), and a pool of
``in_flight`` threads fetches the extents in first-need order, adjacent ones coalesced into
range GETs of up to ``request_bytes``, never more than ``lookahead_bytes`` ahead of the reader,
each extent once. Every extent is checked sample by sample against the index's xxh3 before it
enters the cache; a bad range is fetched again once, then ``ChecksumMismatchError`` names the
sample. The generation is pinned: a forked or unpickled worker whose store now holds another
manifest raises ``DatasetChangedError`` instead of mixing generations.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import threading
import time
from bisect import bisect_right
from collections import OrderedDict
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from .. import format as fmt
from ..errors import ChecksumMismatchError, DatasetChangedError, ManifestError, PackerError, RemoteStoreError, TruncatedFileError
from .._internal.files import MAX_REPORT_BYTES, iter_json_lines, open_dataset_file
from .cache import LockFile, evict, write_cached
from .extents import ExtentTable, FetchPlan, coalesce, plan_extents
from .options import RemoteOptions
from .store import Store, store_for
from .url import DatasetURL, object_key

__all__ = ["RemoteFiles", "RemoteShard", "dataset_key", "read_manifest"]

#: Extent files kept mapped per process (least recently used are dropped first: unmapped when
#: the last reader lets go of them).
_MAPPED_EXTENTS = 1024
#: Linux: map an extent's pages at once (not one fault per page on first touch).
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
#: With a bounded cache, the cache is rescanned after this many insertions by one process (other
#: processes' insertions are seen then).
_RESCAN_EVERY = 32


def dataset_key(url: DatasetURL, options: RemoteOptions) -> str:
    """The cache folder name of a dataset URL: the xxh3 of the URL and endpoint (no credential)."""
    return fmt.checksum_hex(fmt.checksum(f"{url.text}\n{options.endpoint_url or ''}".encode()))


def read_manifest(store: Store, *, missing_ok: bool = False) -> bytes | None:
    """The manifest's bytes, read as a bounded stream: at most ``MAX_MANIFEST_BYTES`` + 1 bytes come
    over the wire whatever the object's size [R30]; None when there is none and ``missing_ok``.

    Raises:
        ManifestError: the object is over the limit (named with the URL).
        RemoteStoreError: the read failed (after its retries), or no manifest (not ``missing_ok``).
    """
    data = store.read_prefix(fmt.MANIFEST_NAME, fmt.MAX_MANIFEST_BYTES, missing_ok=missing_ok)
    if data is None:
        return None
    if len(data) > fmt.MAX_MANIFEST_BYTES:  # [R30]
        raise ManifestError(f"manifest is over the {fmt.MAX_MANIFEST_BYTES} bytes limit (the read stopped there)",
                            path=f"{store.url}/{fmt.MANIFEST_NAME}")
    return data


def _file_matches(path: Path, size: int, checksum: int) -> bool:
    """Whether the cache file ``path`` holds ``size`` bytes whose xxh3 is ``checksum``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        if os.fstat(fd).st_size != size:
            return False
        if size == 0:
            return fmt.checksum(b"") == checksum
        with mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ) as mapped, memoryview(mapped) as view:
            return fmt.checksum(view) == checksum
    finally:
        os.close(fd)


def _family_dir(family: str) -> str:
    return "main" if not family else "field-" + family.encode("utf-8").hex()


class _ProcessState:
    """Everything that belongs to one process: threads, lock descriptors, mappings, plans."""

    def __init__(self, options: RemoteOptions) -> None:
        self.lock = threading.Lock()
        self.prefetch_pool = ThreadPoolExecutor(options.in_flight, thread_name_prefix="packer-prefetch")
        self.demand_pool = ThreadPoolExecutor(options.in_flight, thread_name_prefix="packer-fetch")
        self.lock_files: dict[tuple[str, int], LockFile] = {}
        self.inflight: dict[tuple[str, int], Future[None]] = {}
        self.maps: OrderedDict[tuple[str, int], memoryview] = OrderedDict()
        #: per (family, shard): the mapped views of its extents by ordinal (None: not mapped), the
        #: ``RemoteShard`` fast path's table; an extent dropped from ``maps`` is cleared here too
        self.shard_views: dict[tuple[str, int], list[memoryview | None]] = {}
        self.plans: dict[str, FetchPlan] = {}
        self.plan_bytes: dict[str, np.ndarray] = {}
        self.cursor: dict[str, int] = {}
        self.progress: dict[str, int] = {}
        self.position: dict[str, int] = {}
        self.usage = -1
        self.inserts = 0
        self.downloads = 0
        self.downloaded_bytes = 0
        self.refetched = 0
        #: cache files found damaged when mapped and fetched again
        self.repaired = 0

    def close(self) -> None:
        self.prefetch_pool.shutdown(wait=True, cancel_futures=True)
        # a cancelled prefetch never settles the extents it had claimed: whoever waits on one (a
        # demand fetch left running by a batch that failed) would wait forever, and so would close
        with self.lock:
            pending = list(self.inflight.values())
        for future in pending:
            _settle(future, RemoteStoreError("the dataset was closed while this extent was being fetched"))
        self.demand_pool.shutdown(wait=True, cancel_futures=True)
        for lock in self.lock_files.values():
            lock.close()
        self.lock_files.clear()
        self.maps.clear()
        self.shard_views.clear()


class RemoteFiles:
    """A dataset URL at one generation (see the module docstring): a ``packer.place.Place``.

    Args:
        url: the dataset URL.
        options: transport, cache and prefetch options.
        manifest_bytes: the manifest a parent process opened (a worker pins its generation).

    Raises:
        DatasetChangedError: ``manifest_bytes`` given and the store holds another manifest.
        RemoteStoreError: the manifest or index could not be fetched (names the object).
        PackerError: the manifest or index is invalid (as for a local dataset).
    """

    #: Shards are read from checked extents of the node cache, not through a local-file backend.
    backend = "remote"

    def __init__(self, url: DatasetURL, options: RemoteOptions, *, manifest_bytes: bytes | None = None) -> None:
        self.url = url
        self.options = options
        self.cache_root = options.cache_root / "v1"  # a bad cache setting is refused before any request
        current = read_manifest(self.store)
        assert current is not None
        if manifest_bytes is not None and current != manifest_bytes:
            raise DatasetChangedError(
                f"the dataset has a new manifest generation ({_generation(current)}) since it was opened at "
                f"generation {_generation(manifest_bytes)}; refusing to mix generations: open it again",
                path=url.text)
        self.manifest_bytes = current
        self.generation = _generation(current)
        self.manifest = fmt.parse_manifest(current, path=f"{url}/{fmt.MANIFEST_NAME}")
        self.root = self.cache_root / dataset_key(url, options) / self.generation
        self._fetch_index()
        self._index: fmt.IndexColumns | None = None
        self._tables: dict[str, ExtentTable] = {}
        self._paths: dict[tuple[str, int], str] = {}  # each extent's cache file, as a string (hot)
        self._path_keys: dict[str, tuple[str, int]] = {}
        self._pid = os.getpid()
        self._state: _ProcessState | None = None

    @property
    def store(self) -> Store:
        return store_for(self.url, self.options)

    # --- opening: manifest and index into the cache ---
    def _fetch_index(self) -> None:
        """The generation's index into the cache: fetched by its declared size (never more: an
        object larger than the manifest says is refused after ``size + 1`` bytes, not downloaded
        whole, nor twice), checked against the manifest's checksum, fetched again once if the
        bytes are wrong. A cached copy is checked the same way at every open (the cache proves what
        it serves): a damaged one is fetched again."""
        entry = self.manifest.index
        target = self.root / object_key("", entry.path, where=self.url.text)
        manifest_copy = self.root / fmt.MANIFEST_NAME
        if manifest_copy.is_file() and _file_matches(target, entry.size, entry.checksum):
            return
        self.root.mkdir(parents=True, exist_ok=True)
        lock = os.open(self.root / "open.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one process per node downloads the index
            if not _file_matches(target, entry.size, entry.checksum):
                data = b""
                for _attempt in range(2):  # a damaged download is fetched again once
                    data = self.store.read_prefix(entry.path, entry.size)
                    if len(data) > entry.size:
                        raise TruncatedFileError(
                            f"the index object is larger than the {entry.size} bytes the manifest records: it is "
                            f"not this generation's index (the read stopped at {len(data)} bytes)",
                            path=f"{self.url}/{entry.path}")
                    if len(data) < entry.size:
                        raise TruncatedFileError(
                            f"the index object is {len(data)} bytes, not the {entry.size} the manifest records: "
                            f"it is not this generation's index", path=f"{self.url}/{entry.path}")
                    if fmt.checksum(data) == entry.checksum:
                        break
                else:
                    raise fmt.ChecksumMismatchError(
                        f"the index fetched twice does not match the manifest (size {len(data)}, expected "
                        f"{entry.size}; checksum {fmt.checksum_hex(fmt.checksum(data))}, expected "
                        f"{fmt.checksum_hex(entry.checksum)})", path=f"{self.url}/{entry.path}")
                write_cached(target, [data])
            if not manifest_copy.is_file():
                write_cached(manifest_copy, [self.manifest_bytes])
        finally:
            os.close(lock)

    @property
    def folder(self) -> Path:
        """The generation's folder in the node cache (its manifest and index: ``DatasetIndex.path``)."""
        return self.root

    def open_index(self, entry: fmt.FileEntry) -> tuple[int, str]:
        """The cached index file (fetched and checked at open): a descriptor and its path."""
        return open_dataset_file(self.root, entry.path, entry.size)

    def _columns(self) -> fmt.IndexColumns:
        """The index columns extents are cut from: the generation's cached index, mapped and checked
        here as ``DatasetIndex`` checks it (its checksum was checked when it entered the cache)."""
        if self._index is None:
            entry = self.manifest.index
            fd, real = self.open_index(entry)
            try:
                mapped = mmap.mmap(fd, entry.size, mmap.MAP_SHARED, mmap.PROT_READ)
            finally:
                os.close(fd)
            rows, columns = fmt.parse_column_file(mapped, fmt.INDEX_MAGIC, path=real, kind="index")
            self._index = fmt.validate_index(rows, columns, list(self.manifest.shards), self.manifest.alignment,
                                             path=real, fields=self.manifest.fields)
        return self._index

    def build_report(self, must_contain: bytes = b"") -> Iterator[dict[str, Any]] | None:
        """The build report's entries: the object copied into the generation's folder on first use
        (at most ``files.MAX_REPORT_BYTES``), then read as a local report is. None when the store
        holds no report (or it cannot be read: it is informational)."""
        target = self.root / fmt.REPORT_NAME
        if not target.is_file():
            try:
                info = self.store.head(fmt.REPORT_NAME)
                if info is None:
                    return None
                write_cached(target, self._object_pieces(fmt.REPORT_NAME, min(info.size, MAX_REPORT_BYTES)))
            except RemoteStoreError:
                return None
        return iter_json_lines(self.root, fmt.REPORT_NAME, must_contain=must_contain)

    def _object_pieces(self, relative: str, size: int) -> Iterator[bytes]:
        step = self.options.request_bytes
        for start in range(0, size, step):
            yield bytes(self.store.read_range(relative, start, min(start + step, size)))

    # --- extents ---
    def table(self, family: str = "") -> ExtentTable:
        table = self._tables.get(family)
        if table is None:
            ix, manifest = self._columns(), self.manifest
            if not family:
                sizes = np.array([e.size for e in manifest.shards], dtype=np.int64)
                table = plan_extents(ix.shard, ix.offset, ix.size, sizes, manifest.alignment, self.options.extent_bytes)
            else:
                spec = manifest.field(family)
                columns = ix.field_columns
                sizes = np.array([e.size for e in spec.shards], dtype=np.int64)
                table = plan_extents(ix.shard, columns[spec.image_column("offset")], columns[spec.image_column("size")],
                                     sizes, manifest.alignment, self.options.extent_bytes)
            self._tables[family] = table
        return table

    def _entries(self, family: str) -> Any:
        return self.manifest.shards if not family else self.manifest.field(family).shards

    def _sample_columns(self, family: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        ix = self._columns()
        if not family:
            return ix.offset, ix.size, ix.checksum
        spec = self.manifest.field(family)
        columns = ix.field_columns
        return (columns[spec.image_column("offset")], columns[spec.image_column("size")],
                columns[spec.image_column("checksum")])

    def _extent_path(self, family: str, extent: int) -> str:
        path = self._paths.get((family, extent))
        if path is None:
            table = self.table(family)
            path = self._paths[(family, extent)] = os.path.join(
                self.root, "extents", _family_dir(family), str(int(table.shard[extent])),
                f"{int(table.start[extent])}-{int(table.end[extent])}")
            self._path_keys[path] = (family, extent)
        return path

    def _local(self) -> _ProcessState:
        if self._pid != os.getpid() or self._state is None:
            # A forked child: the parent's threads, lock descriptors and plans are not ours.
            self._pid = os.getpid()
            self._state = _ProcessState(self.options)
        return self._state

    def _lock_file(self, state: _ProcessState, family: str, shard: int) -> LockFile:
        lock = state.lock_files.get((family, shard))
        if lock is None:
            lock = state.lock_files[(family, shard)] = LockFile(
                self.root / "locks" / f"{_family_dir(family)}-{shard}.lock")
        return lock

    # --- shard headers ---
    def shard_header(self, family: str, number: int) -> tuple[bytes, str]:
        """The first ``SHARD_HEADER_SIZE`` bytes of a shard (cached), and the shard's URL."""
        entry = self._entries(family)[number]
        where = f"{self.url}/{entry.path}"
        path = self.root / "headers" / f"{_family_dir(family)}-{number}"
        try:
            return path.read_bytes(), where
        except FileNotFoundError:
            pass
        lock = os.open(self.root / "open.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one process per node fetches it
            if path.is_file():
                return path.read_bytes(), where
            size = min(fmt.SHARD_HEADER_SIZE, entry.size)
            try:
                head = bytes(self.store.read_range(entry.path, 0, size, what=f"header of {entry.path}"))
            except RemoteStoreError as exc:  # a replaced generation's objects are deleted after its successor lands
                raise self._changed() or exc from None
            write_cached(path, [head])
            return head, where
        finally:
            os.close(lock)

    def open_shard(self, family: str, number: int, entry: fmt.ShardEntry,
                   check_header: Callable[[bytes, str], None]) -> "RemoteShard":
        """Shard ``number`` of ``family``, its (cached) header checked by ``check_header`` first."""
        head, where = self.shard_header(family, number)
        try:
            check_header(head, where)
        except PackerError:
            # a damaged cached header is fetched again once; the store's own bad header is named
            (self.root / "headers" / f"{_family_dir(family)}-{number}").unlink(missing_ok=True)
            check_header(*self.shard_header(family, number))
        return RemoteShard(self, family, number, entry)

    # --- reading an extent ---
    def extent_view(self, family: str, extent: int) -> memoryview:
        """The checked bytes of ``extent`` (a read-only mapping of its cache file), fetched if missing."""
        state = self._local()
        key = (family, extent)
        view = state.maps.get(key)
        if view is not None:
            state.maps.move_to_end(key)
            return view
        self._note_need(state, family, extent)
        path = self._extent_path(family, extent)
        damaged: str | None = None
        for _attempt in range(3):
            mapped = _map(path)
            if mapped is None:  # not there (never fetched, evicted, deleted): fetch it
                self._fetch_now(family, extent)
                continue
            view, identity = mapped
            inode = identity[1]
            if _VERIFIED.get(path) == identity:
                break  # this process checked this very file (no write, truncate or replace since)
            why = self._extent_damage(family, extent, view)
            if why is None:
                if time.time_ns() - identity[4] > _SETTLED_NS:
                    _VERIFIED[path] = identity
                break
            # The cache proves what it serves: a file that is not what entered (truncated, zeroed,
            # a flipped byte) is fetched again once, then named.
            if damaged is not None:
                raise self._cache_damage(family, extent, f"{damaged}; fetched again, it is {why}")
            damaged = why
            with state.lock:
                state.repaired += 1
            self._fetch_now(family, extent, replace=inode)
        else:
            raise RemoteStoreError(f"extent {extent} left the cache as soon as it entered (cache_bytes "
                                   f"{self.options.cache_bytes} is too small for the read-ahead)", path=self.url.text)
        with state.lock:
            state.maps[key] = view
            self._slot(state, family, extent, view)
            while len(state.maps) > _MAPPED_EXTENTS:
                (old_family, old_extent), _dropped = state.maps.popitem(last=False)
                self._slot(state, old_family, old_extent, None)
        return view

    def _slot(self, state: _ProcessState, family: str, extent: int, view: memoryview | None) -> None:
        table = self.table(family)
        shard = int(table.shard[extent])
        slots = state.shard_views.get((family, shard))
        if slots is not None:
            slots[extent - int(table.shard_extents[shard])] = view

    def shard_views(self, family: str, shard: int) -> list[memoryview | None]:
        """This process's table of ``shard``'s mapped extents, by ordinal (kept up to date)."""
        state = self._local()
        slots = state.shard_views.get((family, shard))
        if slots is None:
            table = self.table(family)
            lo, hi = int(table.shard_extents[shard]), int(table.shard_extents[shard + 1])
            with state.lock:
                slots = state.shard_views.setdefault((family, shard), [None] * (hi - lo))
                for k in range(lo, hi):
                    view = state.maps.get((family, k))
                    if view is not None:
                        slots[k - lo] = view
        return slots

    def _extent_damage(self, family: str, extent: int, view: memoryview) -> str | None:
        """Why a mapped cache file is not the extent (its size, or the first sample whose xxh3 is
        not the index's), or None: checked at every mapping, not only when the file was written."""
        table = self.table(family)
        expected = int(table.end[extent]) - int(table.start[extent])
        if len(view) != expected:
            return f"{len(view)} bytes, not {expected}"
        bad = self._first_bad_sample(family, extent, view)
        if bad is not None:
            return f"damaged (sample {bad} does not match its checksum)"
        return None

    def _cache_damage(self, family: str, extent: int, why: str) -> ChecksumMismatchError:
        table = self.table(family)
        entry = self._entries(family)[int(table.shard[extent])]
        return ChecksumMismatchError(
            f"the node cache's copy of bytes {int(table.start[extent])}-{int(table.end[extent])} of this object is "
            f"{why} (cache file {self._extent_path(family, extent)}): something other than packer writes into "
            f"the cache folder, or its disk is failing", path=f"{self.url}/{entry.path}", sample=int(table.first[extent]))

    def _fetch_now(self, family: str, extent: int, *, replace: int | None = None) -> None:
        """Fetch ``extent`` unless another thread or process is: then wait for it. ``replace``: the
        inode of a damaged cache file, removed first (unless another process already replaced it)."""
        state = self._local()
        key = (family, extent)
        with state.lock:
            future = state.inflight.get(key)
            mine = future is None
            if mine:
                future = state.inflight[key] = Future()
        assert future is not None
        if not mine:
            future.result()
            return
        table = self.table(family)
        ordinal = int(table.ordinal[extent])
        lock = self._lock_file(state, family, int(table.shard[extent]))
        try:
            lock.acquire(ordinal)  # blocks while another process of the node fetches it
            try:
                path = self._extent_path(family, extent)
                if replace is not None:
                    try:
                        if os.stat(path).st_ino == replace:  # still the damaged file
                            os.unlink(path)
                    except FileNotFoundError:
                        pass
                if not os.path.exists(path):
                    self._download(state, family, [extent])
            finally:
                lock.release(ordinal)
            _settle(future, None)
        except BaseException as exc:
            _settle(future, exc)
            raise
        finally:
            with state.lock:
                state.inflight.pop(key, None)

    def _download(self, state: _ProcessState, family: str, extents: list[int]) -> None:
        """One range GET for adjacent ``extents`` (locked by this process), checked, then cached."""
        table = self.table(family)
        entry = self._entries(family)[int(table.shard[extents[0]])]
        start, end = int(table.start[extents[0]]), int(table.end[extents[-1]])
        try:
            data = memoryview(self.store.read_range(entry.path, start, end, what=f"shard {entry.path}")).cast("B")
        except RemoteStoreError as exc:  # a replaced generation's objects are deleted after its successor lands
            raise self._changed() or exc from None
        pieces = []
        for extent in extents:
            lo, hi = int(table.start[extent]), int(table.end[extent])
            piece = data[lo - start:hi - start]
            bad = self._first_bad_sample(family, extent, piece)
            if bad is not None:  # fetched again once, alone
                with state.lock:
                    state.refetched += 1
                piece = memoryview(self.store.read_range(entry.path, lo, hi, what=f"shard {entry.path}")).cast("B")
                bad = self._first_bad_sample(family, extent, piece)
                if bad is not None:
                    raise self._damage(family, extent, bad, entry.path)
            pieces.append((extent, piece))
        with state.lock:  # counted before the files appear: a reader that sees one sees its count
            state.downloads += len(extents)
            state.downloaded_bytes += sum(len(piece) for _extent, piece in pieces)
        written = 0
        for extent, piece in pieces:
            written += write_cached(Path(self._extent_path(family, extent)), [piece])
        self._account(state, written)

    def _first_bad_sample(self, family: str, extent: int, piece: memoryview) -> int | None:
        table = self.table(family)
        offsets, sizes, checksums = self._sample_columns(family)
        first, stop, base = int(table.first[extent]), int(table.stop[extent]), int(table.start[extent])
        for i, offset, size, expected in zip(range(first, stop), offsets[first:stop].tolist(),
                                             sizes[first:stop].tolist(), checksums[first:stop].tolist()):
            if fmt.checksum(piece[offset - base:offset - base + size]) != expected:
                return i
        return None

    def _changed(self) -> DatasetChangedError | None:
        """``DatasetChangedError`` if the store now holds another manifest than the one opened."""
        try:
            now = read_manifest(self.store, missing_ok=True)
        except (RemoteStoreError, ManifestError):
            return None
        if now is None or now == self.manifest_bytes:
            return None
        return DatasetChangedError(
            f"the dataset has a new manifest generation ({_generation(now)}) since it was opened at "
            f"generation {self.generation}; refusing to mix generations: open it again", path=self.url.text)

    def _damage(self, family: str, extent: int, sample: int, relative: str) -> Exception:
        changed = self._changed()
        if changed is not None:
            return changed
        offsets, sizes, _ = self._sample_columns(family)
        table = self.table(family)
        return ChecksumMismatchError(
            f"{'sample' if not family else f'field {family!r}'} bytes fetched twice from the store do not match "
            f"the index checksum (range {int(table.start[extent])}-{int(table.end[extent])}; the stored object "
            f"is damaged)", path=f"{self.url}/{relative}", sample=sample, offset=int(offsets[sample]))

    # --- planned reads ---
    def plan(self, indices: Any, family: str = "") -> None:
        """This process will read ``indices`` in this order (negative ones count from the end):
        prefetch their extents in first-need order."""
        state = self._local()
        table = self.table(family)
        order = np.asarray(indices, dtype=np.int64).reshape(-1) % max(self.manifest.sample_count, 1)
        plan = FetchPlan(table, order)
        with state.lock:
            state.plans[family] = plan
            state.plan_bytes[family] = np.cumsum((table.end - table.start)[plan.sequence])
            state.cursor[family] = 0
            state.progress[family] = 0
            state.position[family] = 0
        self._pump(state, family)

    def advance(self, position: int, family: str = "") -> None:
        """The reader has reached sample ``position`` of its plan: let the prefetcher move on."""
        state = self._local()
        plan = state.plans.get(family)
        if plan is None:
            return
        with state.lock:
            state.position[family] = max(state.position[family], position)
            state.progress[family] = max(state.progress[family], plan.rank_of_sample(position))
        self._pump(state, family)

    def _note_need(self, state: _ProcessState, family: str, extent: int) -> None:
        plan = state.plans.get(family)
        if plan is None or plan.first_need[extent] < 0:
            return
        with state.lock:
            state.progress[family] = max(state.progress[family], int(plan.first_need[extent]))
        self._pump(state, family)

    def _pump(self, state: _ProcessState, family: str) -> None:
        """Submit range GETs for the next extents of the plan, within ``lookahead_bytes``."""
        plan = state.plans.get(family)
        if plan is None:
            return
        table = self.table(family)
        lookahead = self.options.lookahead_bytes
        with state.lock:
            cursor, progress = state.cursor[family], state.progress[family]
            cursor = max(cursor, progress)
            cumulative = state.plan_bytes[family]
            before = int(cumulative[progress - 1]) if progress > 0 else 0
            picked: list[int] = []
            while cursor < len(plan.sequence) and int(cumulative[cursor]) - before <= lookahead:
                extent = int(plan.sequence[cursor])
                cursor += 1
                if ((family, extent) in state.inflight or (family, extent) in state.maps
                        or os.path.exists(self._extent_path(family, extent))):
                    continue
                picked.append(extent)
                state.inflight[(family, extent)] = Future()
            state.cursor[family] = cursor
        for group in coalesce(table, picked, self.options.request_bytes):
            state.prefetch_pool.submit(self._prefetch_job, state, family, group)

    def _prefetch_job(self, state: _ProcessState, family: str, group: list[int]) -> None:
        table = self.table(family)
        locked: list[int] = []
        try:
            for extent in group:  # never wait here: an extent another process fetches is skipped
                lock = self._lock_file(state, family, int(table.shard[extent]))
                if lock.acquire(int(table.ordinal[extent]), blocking=False):
                    if os.path.exists(self._extent_path(family, extent)):
                        lock.release(int(table.ordinal[extent]))
                    else:
                        locked.append(extent)
            for run in _contiguous(locked):
                self._download(state, family, run)
            error: BaseException | None = None
        except BaseException as exc:  # noqa: BLE001 - handed to whoever needs these extents
            error = exc
        finally:
            for extent in locked:
                self._lock_file(state, family, int(table.shard[extent])).release(int(table.ordinal[extent]))
        with state.lock:
            futures = [state.inflight.pop((family, extent), None) for extent in group]
        for future in futures:
            if future is None:
                continue
            _settle(future, error)

    def ensure(self, indices: Any, family: str = "") -> None:
        """Make the extents of ``indices`` present, fetching the missing ones in parallel."""
        state = self._local()
        table = self.table(family)
        extents = np.unique(table.of_sample[np.asarray(indices, dtype=np.int64)]).tolist()
        missing = [e for e in extents if (family, e) not in state.maps]
        if len(missing) <= 1:
            return
        for extent in missing:
            self._note_need(state, family, extent)
        missing = [e for e in missing if not os.path.exists(self._extent_path(family, e))]
        if missing:
            for future in [state.demand_pool.submit(self._fetch_now, family, e) for e in missing]:
                future.result()

    # --- the cache bound ---
    def _account(self, state: _ProcessState, added: int) -> None:
        bound = self.options.cache_bytes
        if not bound:
            return
        with state.lock:
            state.inserts += 1
            state.usage = -1 if state.usage < 0 or state.inserts % _RESCAN_EVERY == 0 else state.usage + added
            over = state.usage < 0 or state.usage > bound
        if over:
            gone: list[Path] = []
            total, _removed = evict(self.cache_root, bound, lambda path, mtime: self._evict_rank(state, path, mtime),
                                    removed_paths=gone)
            with state.lock:
                state.usage = total
                # an unlinked file's space is freed when its last mapping goes: drop ours (a reader
                # holding a view keeps it until it lets go; the next read fetches it again)
                for path in gone:
                    key = self._path_keys.get(str(path))
                    if key is not None and state.maps.pop(key, None) is not None:
                        self._slot(state, key[0], key[1], None)

    def _evict_rank(self, state: _ProcessState, path: Path, mtime: float) -> tuple[float, ...]:
        """Eviction order (lowest first), from the read order (Belady's rule: the extent needed
        again furthest in the future goes first): other datasets and generations (oldest first);
        extents this process's order does not read again; then those whose next need is latest.
        Never: in flight, or needed again before the prefetcher's frontier (what it has already
        fetched ahead would otherwise be fetched twice)."""
        try:
            relative = path.relative_to(self.root)
        except ValueError:
            return (0.0, mtime)
        parts = relative.parts  # extents/<family>/<shard>/<start>-<end>
        family = next((f for f in list(state.plans) + [""] if _family_dir(f) == parts[1]), None)
        if family is None or len(parts) != 4:
            return (1.0, mtime)
        table = self.table(family)
        extent = table.find(int(parts[2]), int(parts[3].split("-")[0]))
        if extent < 0:
            return (1.0, mtime)
        if (family, extent) in state.inflight:
            return (float("inf"),)
        plan = state.plans.get(family)
        if plan is None:
            return (2.0, mtime)
        position = state.position.get(family, 0)
        upcoming = plan.next_need(extent, position)
        if upcoming < 0:
            return (2.0, mtime)  # not needed again in this pass
        cursor = min(state.cursor.get(family, 0), len(plan.sequence))
        frontier = int(plan.sequence_sample[cursor - 1]) if cursor > 0 else position
        if upcoming <= max(frontier, position):
            return (float("inf"),)  # in use, or needed before what is already fetched ahead
        return (3.0, -float(upcoming))  # needed latest goes first

    # --- bookkeeping ---
    def stats(self) -> dict[str, int]:
        """This process's counters: extents and bytes downloaded, GETs sent, retries, re-fetches."""
        state = self._local()
        store = self.store
        return {"downloads": state.downloads, "downloaded_bytes": state.downloaded_bytes,
                "requests": store.requests, "retried": store.retried, "refetched": state.refetched,
                "repaired": state.repaired}

    def close(self) -> None:
        if self._state is not None and self._pid == os.getpid():
            self._state.close()
        self._state = None


#: Forks this process descends from (bumped in every child): cheaper to compare than ``os.getpid()``.
_FORKS = [0]
os.register_at_fork(after_in_child=lambda: _FORKS.__setitem__(0, _FORKS[0] + 1))


def _settle(future: Future[None], error: BaseException | None) -> None:
    """Resolve ``future`` (with ``error`` if given) unless it already is (closing settles the rest)."""
    if future.done():
        return
    try:
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)
    except InvalidStateError:  # settled by another thread meanwhile
        pass


def _contiguous(extents: list[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for extent in sorted(extents):
        if runs and runs[-1][-1] + 1 == extent:
            runs[-1].append(extent)
        else:
            runs.append([extent])
    return runs


def _generation(manifest_bytes: bytes) -> str:
    return fmt.checksum_hex(fmt.checksum(manifest_bytes))


#: Cache files this process has checked, by path: their identity when checked (device, inode,
#: size, mtime and ctime in ns). Any write, truncation or replacement through the file system
#: changes it (ctime cannot be set back), so a file mapped again with the same identity is the
#: bytes checked, and a dataset reopened in the same process (the warm epoch of a restart loop)
#: does not hash them again; a new process checks every file it maps once. What no system call
#: does (bits rotting on the disk under an unchanged inode) is caught by the next process.
_VERIFIED: dict[str, tuple[int, int, int, int, int]] = {}
#: A file changed less than this before its check is not remembered as checked: file times tick
#: coarsely (a jiffy), so a change right after it could carry the same ctime.
_SETTLED_NS = 50_000_000


def _map(path: str) -> tuple[memoryview, tuple[int, int, int, int, int]] | None:
    """A read-only mapping of a cache file and its identity (None: not there). MAP_POPULATE maps
    its pages (in the page cache after a download or a first read) in one call, not one fault per
    4 KiB on first touch; copying from the mapping then beats a ``preadv`` per run (measured:
    bench_remote)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        stat = os.fstat(fd)
        identity = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
        if stat.st_size == 0:
            return memoryview(b""), identity
        return memoryview(mmap.mmap(fd, stat.st_size, mmap.MAP_SHARED | _POPULATE, mmap.PROT_READ)), identity
    finally:
        os.close(fd)


class RemoteShard:
    """``ShardBackend`` of one shard in object storage: bytes come from checked cache extents.

    The hot path (a run of samples inside one extent, which is every run a reader makes: extents
    are cut at sample boundaries) is one ``bisect`` over the shard's extent starts, held as a
    Python list, and one slice copy from the extent's mapping, taken from a per-shard table of
    mapped views: no numpy call, no dictionary lookup, no system call per run.
    """

    def __init__(self, files: RemoteFiles, family: str, number: int, entry: fmt.ShardEntry) -> None:
        self.files = files
        self.family = family
        self.number = number
        self.path = f"{files.url}/{entry.path}"
        self.size = entry.size
        table = files.table(family)
        self._first = int(table.shard_extents[number])
        last = int(table.shard_extents[number + 1])
        self._starts: list[int] = table.start[self._first:last].tolist()
        self._ends: list[int] = table.end[self._first:last].tolist()
        self._views: list[memoryview | None] | None = None
        self._fork = -1

    def _extent(self, offset: int, size: int) -> tuple[memoryview, int] | None:
        """The mapped extent holding ``[offset, offset + size)`` and the offset in it, or None."""
        k = bisect_right(self._starts, offset) - 1
        if k < 0 or offset + size > self._ends[k]:
            return None
        slots = self._views
        if slots is None or self._fork != _FORKS[0]:  # a forked child maps its own
            slots = self._views = self.files.shard_views(self.family, self.number)
            self._fork = _FORKS[0]
        return slots[k] or self.files.extent_view(self.family, self._first + k), offset - self._starts[k]

    def read_into(self, offset: int, out: Any) -> None:
        target = memoryview(out).cast("B")
        total = target.nbytes
        k = bisect_right(self._starts, offset) - 1
        if k < 0 or offset + total > self._ends[k]:
            self._read_spanning(offset, target, total)
            return
        slots = self._views
        if slots is None or self._fork != _FORKS[0]:  # a forked child maps its own
            slots = self._views = self.files.shard_views(self.family, self.number)
            self._fork = _FORKS[0]
        view = slots[k] or self.files.extent_view(self.family, self._first + k)
        position = offset - self._starts[k]
        target[:] = view[position:position + total]

    def _read_spanning(self, offset: int, target: memoryview, total: int) -> None:
        """A range over several extents, the header or trailing padding (not a reader's run)."""
        table = self.files.table(self.family)
        done = 0
        while done < total:
            at = offset + done
            extent = table.find(self.number, at)
            if extent < 0:  # header or trailing padding (zeros by the format): not a sample byte
                lo, hi = int(table.shard_extents[self.number]), int(table.shard_extents[self.number + 1])
                later = table.start[lo:hi][table.start[lo:hi] > at]
                step = min(total - done, (int(later[0]) - at) if len(later) else total - done)
                target[done:done + step] = bytes(step)
                done += step
                continue
            view = self.files.extent_view(self.family, extent)
            base = int(table.start[extent])
            step = min(total - done, int(table.end[extent]) - at)
            target[done:done + step] = view[at - base:at - base + step]
            done += step

    def view(self, offset: int, size: int) -> memoryview:
        found = self._extent(offset, size)
        if found is not None:
            view, base = found
            return view[base:base + size]
        buffer = bytearray(size)
        self._read_spanning(offset, memoryview(buffer), size)
        return memoryview(buffer)

    def close(self) -> None:
        pass
