"""A dataset URL opened through the node cache (``packer.remote.reader``), against an in-memory S3
(``conftest.MemoryTransport``): where the generation's files land in the cache, what an open fetches
and checks, which extents the prefetcher fetches within ``lookahead_bytes``, the eviction rank of
every kind of cache file (Belady's rule on the read order), how often a bounded cache is rescanned,
what happens to damaged bytes from the store and in the cache, shard headers and the build report,
and byte-exact reads across extents."""

from __future__ import annotations

import os
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import MemoryTransport, memory_store
from helpers import write_images

import packer
from packer import format as fmt
from packer.errors import (ChecksumMismatchError, DatasetChangedError, ManifestError, PackerError,
                           RemoteStoreError, TruncatedFileError)
from packer.remote import RemoteOptions, parse_url
from packer.remote import reader as reader_module
from packer.remote.reader import RemoteFiles, _contiguous, _settle, dataset_key, read_manifest

EXTENT = 8 << 10  # two 4 KiB-aligned raw samples per extent
URL = "s3://bucket/ds"


@pytest.fixture(scope="module")
def uniform(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """24 raw samples of one size (4 KiB aligned) in shards of 48 KiB."""
    root = tmp_path_factory.mktemp("reader")
    write_images(root / "src", {"a": 12, "b": 12}, size=24)
    packer.build_dataset(root / "src", root / "ds", packer.BuildSettings(
        codec="raw:size=24x24", layout=packer.LayoutSettings(shard_size=48 << 10, alignment=4096)),
        packer.RunOptions(workers=1))
    return root / "ds"


class Store(MemoryTransport):
    """MemoryTransport with a log of range GETs and a hook that may change what one returns."""

    def __init__(self) -> None:
        super().__init__()
        self.ranges: list[tuple[str, int, int]] = []
        self.tamper = None

    def get_range(self, key: str, start: int, end: int) -> bytes:
        data = super().get_range(key, start, end)
        self.ranges.append((key, start, end))
        if self.tamper is not None:
            data = self.tamper(key, start, end, data)
        return data


@pytest.fixture
def store(monkeypatch, uniform) -> Store:
    transport = Store()
    transport.load_folder(uniform, "ds")
    memory_store(monkeypatch, transport)
    return transport


def _options(tmp_path: Path, **changes: Any) -> RemoteOptions:
    settings: dict[str, Any] = dict(cache_dir=str(tmp_path / "cache"), extent_bytes=EXTENT, request_bytes=EXTENT,
                                    in_flight=1, lookahead_bytes=EXTENT, backoff_s=0.001, retries=2)
    settings.update(changes)
    return RemoteOptions(**settings)


def _drain(place: RemoteFiles) -> None:
    """Wait for every queued prefetch (one prefetch thread: the queue is in order)."""
    place._local().prefetch_pool.submit(lambda: None).result(timeout=30)


def _cached(place: RemoteFiles) -> list[int]:
    table = place.table("")
    return [e for e in range(len(table)) if os.path.exists(place._extent_path("", e))]


# --- opening ---------------------------------------------------------------------------------------


def test_the_generation_lands_in_its_own_cache_folder(store, uniform, tmp_path):
    options = _options(tmp_path, endpoint_url="http://127.0.0.1:9")
    manifest = (uniform / fmt.MANIFEST_NAME).read_bytes()
    with packer.open_dataset(URL, remote=options) as remote:
        place = remote.place
        generation = fmt.checksum_hex(fmt.checksum(manifest))
        assert place.generation == generation and place.manifest_bytes == manifest
        key = fmt.checksum_hex(fmt.checksum(b"s3://bucket/ds\nhttp://127.0.0.1:9"))
        assert dataset_key(parse_url(URL), options) == key
        assert place.root == tmp_path / "cache" / "v1" / key / generation == place.folder
        assert (place.root / fmt.MANIFEST_NAME).read_bytes() == manifest
        index = place.manifest.index.path
        assert (place.root / index).read_bytes() == (uniform / index).read_bytes()
        assert place.backend == "remote"
    assert dataset_key(parse_url(URL), RemoteOptions()) == fmt.checksum_hex(fmt.checksum(b"s3://bucket/ds\n"))


def test_a_warm_open_fetches_no_index_and_a_damaged_one_is_fetched_again(store, uniform, tmp_path):
    options = _options(tmp_path)
    with packer.open_dataset(URL, remote=options) as remote:
        index = remote.place.root / remote.manifest.index.path
        index_key = f"ds/{remote.manifest.index.path}"
    assert [r for r in store.ranges if r[0] == index_key] == [(index_key, 0, index.stat().st_size + 1)]
    store.ranges.clear()
    with packer.open_dataset(URL, remote=options):
        pass
    assert [r[0] for r in store.ranges] == ["ds/manifest.json"]
    damaged = bytearray(index.read_bytes())
    damaged[-1] ^= 1
    index.write_bytes(bytes(damaged))
    with packer.open_dataset(URL, remote=options):
        pass
    assert [r[0] for r in store.ranges] == ["ds/manifest.json", "ds/manifest.json", index_key]
    assert index.read_bytes() == (uniform / index.name).read_bytes()
    (index.parent / fmt.MANIFEST_NAME).unlink()  # a copy of the manifest is part of a warm cache
    with packer.open_dataset(URL, remote=options):
        pass
    assert (index.parent / fmt.MANIFEST_NAME).is_file()
    assert [r[0] for r in store.ranges].count(index_key) == 1


@pytest.mark.parametrize("change, error, message", [
    (lambda data: data + b"x", TruncatedFileError, "the index object is larger than the {size} bytes the manifest "
                                                   "records: it is not this generation's index (the read stopped at "
                                                   "{plus} bytes)"),
    (lambda data: data[:-1], TruncatedFileError, "the index object is {minus} bytes, not the {size} the manifest "
                                                 "records: it is not this generation's index"),
])
def test_an_index_object_of_another_size_is_named(store, uniform, tmp_path, change, error, message):
    manifest = fmt.parse_manifest((uniform / fmt.MANIFEST_NAME).read_bytes())
    key = f"ds/{manifest.index.path}"
    store.objects[key] = change(store.objects[key])
    size = manifest.index.size
    with pytest.raises(error) as caught:
        packer.open_dataset(URL, remote=_options(tmp_path))
    assert caught.value.message == message.format(size=size, plus=size + 1, minus=size - 1)
    assert caught.value.path == f"{URL}/{manifest.index.path}"
    assert [r for r in store.ranges if r[0] == key] == [(key, 0, size + 1)]


def test_a_damaged_index_is_fetched_again_once(store, uniform, tmp_path):
    manifest = fmt.parse_manifest((uniform / fmt.MANIFEST_NAME).read_bytes())
    key = f"ds/{manifest.index.path}"
    good = store.objects[key]
    damaged = bytearray(good)
    damaged[100] ^= 0xFF
    answers = [bytes(damaged), good]
    store.tamper = lambda k, start, end, data: answers.pop(0) if k == key and answers else data
    with packer.open_dataset(URL, remote=_options(tmp_path)) as remote:
        assert len(remote) == 24
    store.objects[key] = bytes(damaged)
    store.tamper = None
    with pytest.raises(ChecksumMismatchError) as caught:
        packer.open_dataset(URL, remote=_options(tmp_path, cache_dir=str(tmp_path / "other")))
    assert caught.value.message == (
        f"the index fetched twice does not match the manifest (size {manifest.index.size}, expected "
        f"{manifest.index.size}; checksum {fmt.checksum_hex(fmt.checksum(bytes(damaged)))}, expected "
        f"{fmt.checksum_hex(manifest.index.checksum)})")
    assert caught.value.path == f"{URL}/{manifest.index.path}"
    assert [r[0] for r in store.ranges].count(key) == 2 + 2


def test_a_pinned_generation_is_refused_once_the_store_holds_another(store, uniform, tmp_path):
    manifest = (uniform / fmt.MANIFEST_NAME).read_bytes()
    place = RemoteFiles(parse_url(URL), _options(tmp_path), manifest_bytes=manifest)
    assert place.generation == fmt.checksum_hex(fmt.checksum(manifest))
    with pytest.raises(DatasetChangedError) as caught:
        RemoteFiles(parse_url(URL), _options(tmp_path), manifest_bytes=b"{}")
    assert caught.value.message == (
        f"the dataset has a new manifest generation ({fmt.checksum_hex(fmt.checksum(manifest))}) since it was opened "
        f"at generation {fmt.checksum_hex(fmt.checksum(b'{}'))}; refusing to mix generations: open it again")
    assert caught.value.path == URL


def test_read_manifest_stops_at_its_limit(store, uniform, tmp_path, monkeypatch):
    manifest = (uniform / fmt.MANIFEST_NAME).read_bytes()
    place = RemoteFiles(parse_url(URL), _options(tmp_path))
    monkeypatch.setattr(fmt, "MAX_MANIFEST_BYTES", len(manifest))
    assert read_manifest(place.store) == manifest
    monkeypatch.setattr(fmt, "MAX_MANIFEST_BYTES", len(manifest) - 1)
    with pytest.raises(ManifestError) as caught:
        read_manifest(place.store)
    assert caught.value.message == f"manifest is over the {len(manifest) - 1} bytes limit (the read stopped there)"
    assert caught.value.path == f"{URL}/manifest.json"
    assert store.ranges[-1] == ("ds/manifest.json", 0, len(manifest))
    del store.objects["ds/manifest.json"]
    assert read_manifest(place.store, missing_ok=True) is None
    with pytest.raises(RemoteStoreError, match="the object does not exist"):
        read_manifest(place.store)


# --- reading and prefetching ----------------------------------------------------------------------


def test_an_epoch_downloads_each_extent_once_and_reads_every_byte(store, uniform, tmp_path):
    order = np.random.default_rng(3).permutation(24)
    with packer.open_dataset(URL, remote=_options(tmp_path, request_bytes=3 * EXTENT)) as remote, \
            packer.open_dataset(uniform) as local:
        table = remote.place.table("")
        remote.plan_reads(order)
        got = []
        for position, sample in enumerate(order.tolist()):
            remote.reads_advanced(position)
            got.append(bytes(remote.get(sample)))
        assert got == [bytes(local.get(int(i))) for i in order]
        stats = remote.remote_stats()
        assert stats["downloads"] == len(table)
        assert stats["downloaded_bytes"] == int((table.end - table.start).sum())
        assert (stats["refetched"], stats["repaired"], stats["retried"]) == (0, 0, 0)
        assert sorted(stats) == ["downloaded_bytes", "downloads", "refetched", "repaired", "requests", "retried"]
        shard_gets = [r for r in store.ranges if "/shards/" in r[0]]
        assert stats["requests"] == len(store.ranges)
        assert all(end - start <= 3 * EXTENT for _, start, end in shard_gets)


def test_the_prefetcher_fetches_the_plans_extents_within_the_lookahead(store, tmp_path):
    with packer.open_dataset(URL, remote=_options(tmp_path, lookahead_bytes=3 * EXTENT,
                                                  request_bytes=4 * EXTENT)) as remote:
        place = remote.place
        table = place.table("")
        order = np.asarray([int(table.first[e]) for e in (5, 2, 7, 0, 9, 4)], dtype=np.int64)
        remote.plan_reads(order)
        _drain(place)
        assert _cached(place) == [2, 5, 7]
        remote.reads_advanced(0)  # the first extent is being read: one more fits
        _drain(place)
        assert _cached(place) == [0, 2, 5, 7]
        remote.reads_advanced(1)
        _drain(place)
        assert _cached(place) == [0, 2, 5, 7, 9]
        remote.reads_advanced(3)
        _drain(place)
        assert _cached(place) == [0, 2, 4, 5, 7, 9]
        assert place.stats()["downloads"] == 6


def test_an_extent_already_fetched_is_not_fetched_again_by_a_new_plan(store, tmp_path):
    with packer.open_dataset(URL, remote=_options(tmp_path, lookahead_bytes=2 * EXTENT)) as remote:
        place = remote.place
        table = place.table("")
        remote.get(int(table.first[3]))  # fetched on demand
        remote.plan_reads(np.asarray([int(table.first[3]), int(table.first[1])]))
        _drain(place)
        assert _cached(place) == [1, 3]
        assert place.stats()["downloads"] == 2
        remote.plan_reads(np.asarray([int(table.first[1]), int(table.first[3]), int(table.first[6])]))
        _drain(place)
        assert place.stats()["downloads"] == 2  # 6 is past the lookahead; 1 and 3 are cached


def test_negative_plan_indices_count_from_the_end(store, tmp_path):
    with packer.open_dataset(URL, remote=_options(tmp_path, lookahead_bytes=EXTENT)) as remote:
        place = remote.place
        place.plan([-1])
        _drain(place)
        assert _cached(place) == [int(place.table("").of_sample[23])]


def test_ensure_fetches_a_batchs_missing_extents_and_leaves_one_to_the_reader(store, tmp_path):
    with packer.open_dataset(URL, remote=_options(tmp_path)) as remote:
        place = remote.place
        table = place.table("")
        place.ensure([int(table.first[4])])
        assert _cached(place) == []  # one missing extent: the read fetches it
        place.ensure([int(table.first[4]), int(table.first[6]), int(table.first[6]) + 1])
        assert _cached(place) == [4, 6]
        remote.get(int(table.first[4]))
        place.ensure([int(table.first[4]), int(table.first[8])])  # 4 is mapped: one missing
        assert _cached(place) == [4, 6]


def test_reads_across_extents_and_the_header(store, uniform, tmp_path):
    with packer.open_dataset(URL, remote=_options(tmp_path)) as remote, packer.open_dataset(uniform) as local:
        place = remote.place
        entry = remote.manifest.shards[0]
        shard = place.open_shard("", 0, entry, lambda head, where: None)
        assert shard.path == f"{URL}/{entry.path}" and shard.size == entry.size
        data = (uniform / entry.path).read_bytes()
        table = place.table("")
        start, end = int(table.start[0]), int(table.end[1])
        out = bytearray(end - start)
        shard.read_into(start, out)
        assert bytes(out) == data[start:end]
        out = bytearray(start + 100)
        shard.read_into(0, out)  # the header is not a sample: zeros (never fetched)
        assert bytes(out) == bytes(start) + data[start:start + 100]
        assert bytes(shard.view(start + 10, 20)) == data[start + 10:start + 30]
        assert bytes(shard.view(start + EXTENT - 10, 20)) == data[start + EXTENT - 10:start + EXTENT + 10]
        assert bytes(shard.view(0, 8)) == bytes(8)
        out = bytearray(16)
        shard.read_into(start + 4, out)
        assert bytes(out) == data[start + 4:start + 20]
        shard.close()
        assert [bytes(remote.get(i)) for i in range(24)] == [bytes(local.get(i)) for i in range(24)]


# --- the eviction rank ----------------------------------------------------------------------------


def test_the_eviction_rank_of_every_kind_of_cache_file(store, tmp_path):
    with packer.open_dataset(URL, remote=_options(tmp_path, lookahead_bytes=2 * EXTENT)) as remote:
        place = remote.place
        state = place._local()
        table = place.table("")
        rank = lambda path: place._evict_rank(state, Path(path), 7.0)  # noqa: E731
        assert rank(tmp_path / "cache" / "v1" / "other" / "g" / "extents" / "main" / "0" / "1-2") == (0.0, 7.0)
        assert rank(place.root / "extents" / "field-00" / "0" / "4096-8192") == (1.0, 7.0)
        assert rank(place.root / "extents" / "main" / "0") == (1.0, 7.0)
        assert rank(place.root / "extents" / "main" / "0" / "5-9") == (1.0, 7.0)  # no extent starts there
        assert rank(place._extent_path("", 3)) == (2.0, 7.0)  # no plan: not needed by this process
        sample = lambda e: int(table.first[e])  # noqa: E731
        # the order reads extents 1 2 3 1 4 5 2 6 (positions 0..7)
        order = np.asarray([sample(e) for e in (1, 2, 3, 1, 4, 5, 2, 6)], dtype=np.int64)
        place.plan(order)
        _drain(place)
        assert state.position[""] == 0 and state.cursor[""] == 2  # a new plan starts at 0; 1 and 2 fetched
        assert rank(place._extent_path("", 1)) == (float("inf"),)  # needed now
        assert rank(place._extent_path("", 2)) == (float("inf"),)  # needed before the frontier
        assert rank(place._extent_path("", 3)) == (3.0, -2.0)
        assert rank(place._extent_path("", 6)) == (3.0, -7.0)
        assert rank(place._extent_path("", 0)) == (2.0, 7.0)  # never read by this order
        state.position[""] = 4
        assert rank(place._extent_path("", 1)) == (2.0, 7.0)  # not needed again
        assert rank(place._extent_path("", 2)) == (3.0, -6.0)
        assert rank(place._extent_path("", 4)) == (float("inf"),)
        state.cursor[""] = 5  # fetched ahead up to the first need of 5 (position 5)
        assert rank(place._extent_path("", 5)) == (float("inf"),)
        assert rank(place._extent_path("", 2)) == (3.0, -6.0)
        assert rank(place._extent_path("", 6)) == (3.0, -7.0)
        state.cursor[""] = 99  # past the sequence: its last entry's first need (7) is the frontier
        assert rank(place._extent_path("", 2)) == (float("inf"),)
        assert rank(place._extent_path("", 6)) == (float("inf"),)
        state.cursor[""] = 0
        state.position[""] = 5
        assert rank(place._extent_path("", 5)) == (float("inf"),)
        assert rank(place._extent_path("", 6)) == (3.0, -7.0)
        state.inflight[("", 0)] = Future()
        assert rank(place._extent_path("", 0)) == (float("inf"),)
        state.inflight.pop(("", 0))


def test_a_bounded_cache_is_rescanned_on_the_first_insert_and_every_32nd(store, tmp_path, monkeypatch):
    calls: list[int] = []
    real = reader_module.evict

    def counting(root, bound, priority, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(bound)
        return real(root, bound, priority, **kwargs)

    monkeypatch.setattr(reader_module, "evict", counting)
    monkeypatch.setattr(reader_module, "_RESCAN_EVERY", 4)
    with packer.open_dataset(URL, remote=_options(tmp_path, cache_bytes=1 << 30)) as remote:
        for sample in range(0, 24, 2):  # one extent each: 12 insertions
            remote.get(sample)
        assert calls == [1 << 30] * 4  # insertions 1, 4, 8, 12
        remote.get(1)  # mapped: no insertion
        remote.get(23)  # in an extent already cached: no insertion either
        assert len(calls) == 4
        from packer.remote.cache import scan_extents

        sizes = sum(size for _, size, _ in scan_extents(remote.place.cache_root))
        table = remote.place.table("")
        assert remote.place._local().usage == sizes == sum(table.nbytes(e) for e in _cached(remote.place))
    calls.clear()
    with packer.open_dataset(URL, remote=_options(tmp_path / "unbounded")) as remote:
        remote.get(0)
    assert calls == []


def test_an_evicted_extent_is_unmapped_and_read_again(store, uniform, tmp_path):
    with packer.open_dataset(URL, remote=_options(tmp_path, cache_bytes=3 * EXTENT)) as remote, \
            packer.open_dataset(uniform) as local:
        place = remote.place
        state = place._local()
        table = place.table("")
        for extent in range(6):
            assert bytes(remote.get(int(table.first[extent]))) == bytes(local.get(int(table.first[extent])))
        cached = _cached(place)
        assert len(cached) <= 3
        gone = [e for e in range(6) if e not in cached]
        assert gone and all(("", e) not in state.maps for e in gone)
        shard = int(table.shard[gone[0]])
        views = state.shard_views.get(("", shard))
        if views is not None:
            assert views[gone[0] - int(table.shard_extents[shard])] is None
        downloads = place.stats()["downloads"]
        assert bytes(remote.get(int(table.first[gone[0]]))) == bytes(local.get(int(table.first[gone[0]])))
        assert place.stats()["downloads"] == downloads + 1


# --- damage ---------------------------------------------------------------------------------------


def _flip_first_sample(store: Store, times: int, table, place) -> list[int]:
    """Flip a byte of extent 0's first sample in the next ``times`` answers that carry it."""
    start = int(table.start[0])
    left = [times]

    def tamper(key, lo, hi, data):  # type: ignore[no-untyped-def]
        if "/shards/" in key and lo <= start < hi and left[0] > 0:
            left[0] -= 1
            data = bytearray(data)
            data[start - lo] ^= 0xFF
            return bytes(data)
        return data
    store.tamper = tamper
    return left


def test_damaged_bytes_from_the_store_are_fetched_again_once(store, uniform, tmp_path):
    with packer.open_dataset(URL, remote=_options(tmp_path, request_bytes=2 * EXTENT)) as remote, \
            packer.open_dataset(uniform) as local:
        place = remote.place
        table = place.table("")
        _flip_first_sample(store, 1, table, place)
        place.ensure([int(table.first[0]), int(table.first[1])])
        assert bytes(remote.get(0)) == bytes(local.get(0))
        assert place.stats()["refetched"] == 1
        entry = remote.manifest.shards[0]
        shard_gets = [r for r in store.ranges if "/shards/" in r[0]]
        assert (f"ds/{entry.path}", int(table.start[0]), int(table.end[0])) in shard_gets


def test_damage_that_comes_back_names_the_sample_and_the_range(store, tmp_path):
    with packer.open_dataset(URL, remote=_options(tmp_path)) as remote:
        place = remote.place
        table = place.table("")
        _flip_first_sample(store, 2, table, place)
        sample = int(table.first[0])
        with pytest.raises(ChecksumMismatchError) as caught:
            remote.get(sample)
        entry = remote.manifest.shards[int(table.shard[0])]
        assert caught.value.message == (
            f"sample bytes fetched twice from the store do not match the index checksum (range "
            f"{int(table.start[0])}-{int(table.end[0])}; the stored object is damaged)")
        assert caught.value.path == f"{URL}/{entry.path}"
        assert caught.value.sample == sample and caught.value.offset == int(table.start[0])
        assert not os.path.exists(place._extent_path("", 0))


def test_damage_that_comes_with_a_new_manifest_is_a_changed_dataset(store, tmp_path):
    with packer.open_dataset(URL, remote=_options(tmp_path)) as remote:
        place = remote.place
        table = place.table("")
        _flip_first_sample(store, 4, table, place)
        new = b'{"a": "new generation"}'
        store.objects["ds/manifest.json"] = new
        with pytest.raises(DatasetChangedError) as caught:
            remote.get(int(table.first[0]))
        assert caught.value.message == (
            f"the dataset has a new manifest generation ({fmt.checksum_hex(fmt.checksum(new))}) since it was opened "
            f"at generation {place.generation}; refusing to mix generations: open it again")
        assert caught.value.path == URL
        del store.objects["ds/manifest.json"]  # gone: the damage is the store's
        with pytest.raises(ChecksumMismatchError):
            remote.get(int(table.first[0]))


def test_a_shard_gone_with_its_generation_is_a_changed_dataset(store, tmp_path):
    with packer.open_dataset(URL, remote=_options(tmp_path)) as remote:
        place = remote.place
        entry = remote.manifest.shards[1]
        del store.objects[f"ds/{entry.path}"]
        with pytest.raises(RemoteStoreError, match="not retried: the object does not exist"):
            remote.get(int(place.table("").first[int(place.table("").shard_extents[1])]))
        store.objects["ds/manifest.json"] = b"{}"
        with pytest.raises(DatasetChangedError):
            remote.get(int(place.table("").first[int(place.table("").shard_extents[1])]))


def test_a_damaged_cache_file_is_fetched_again_once_then_named(store, uniform, tmp_path, monkeypatch):
    options = _options(tmp_path)
    with packer.open_dataset(URL, remote=options) as remote:
        remote.get(0)
        extent = int(remote.place.table("").of_sample[0])
        path = Path(remote.place._extent_path("", extent))
    path.write_bytes(path.read_bytes()[:-1])
    with packer.open_dataset(URL, remote=options) as remote, packer.open_dataset(uniform) as local:
        assert bytes(remote.get(0)) == bytes(local.get(0))
        assert remote.place.stats()["repaired"] == 1 and remote.place.stats()["downloads"] == 1
    monkeypatch.setattr(reader_module, "write_cached", lambda target, pieces: Path(target).write_bytes(b"bad") or 3)
    path.write_bytes(b"x")
    with packer.open_dataset(URL, remote=options) as remote:
        with pytest.raises(ChecksumMismatchError) as caught:
            remote.get(0)
        table = remote.place.table("")
        assert caught.value.message == (
            f"the node cache's copy of bytes {int(table.start[extent])}-{int(table.end[extent])} of this object is "
            f"1 bytes, not {int(table.end[extent] - table.start[extent])}; fetched again, it is 3 bytes, not "
            f"{int(table.end[extent] - table.start[extent])} (cache file {path}): something other than packer "
            f"writes into the cache folder, or its disk is failing")
        assert caught.value.sample == int(table.first[extent])


def test_a_flipped_byte_in_a_cache_file_names_the_sample(store, uniform, tmp_path):
    options = _options(tmp_path)
    with packer.open_dataset(URL, remote=options) as remote:
        place = remote.place
        table = place.table("")
        why = place._extent_damage("", 0, memoryview(bytes(int(table.end[0] - table.start[0]))))
        assert why == f"damaged (sample {int(table.first[0])} does not match its checksum)"
        assert place._extent_damage("", 0, memoryview(b"ab")) == f"2 bytes, not {int(table.end[0] - table.start[0])}"
        good = (uniform / remote.manifest.shards[0].path).read_bytes()[int(table.start[0]):int(table.end[0])]
        assert place._extent_damage("", 0, memoryview(good)) is None
        second = bytearray(good)
        second[int(table.stop[0] - table.first[0] - 1) * 4096] ^= 1  # the extent's last sample
        assert place._first_bad_sample("", 0, memoryview(bytes(second))) == int(table.stop[0]) - 1


# --- headers and the report -----------------------------------------------------------------------


def test_a_shard_header_is_cached_and_a_damaged_copy_fetched_again(store, uniform, tmp_path):
    options = _options(tmp_path)
    with packer.open_dataset(URL, remote=options) as remote:
        place = remote.place
        entry = remote.manifest.shards[2]
        head, where = place.shard_header("", 2)
        assert head == (uniform / entry.path).read_bytes()[:fmt.SHARD_HEADER_SIZE]
        assert where == f"{URL}/{entry.path}"
        cached = place.root / "headers" / "main-2"
        assert cached.read_bytes() == head
        gets = len(store.ranges)
        assert place.shard_header("", 2) == (head, where) and len(store.ranges) == gets
        cached.write_bytes(b"junk")
        seen: list[bytes] = []

        def check(data: bytes, where: str) -> None:
            seen.append(data)
            if data == b"junk":
                raise ManifestError("not a header", path=where)

        place.open_shard("", 2, entry, check)
        assert seen == [b"junk", head] and cached.read_bytes() == head
    assert reader_module._family_dir("") == "main" and reader_module._family_dir("é") == "field-c3a9"


def test_a_shard_header_gone_with_its_generation_is_a_changed_dataset(store, tmp_path):
    with packer.open_dataset(URL, remote=_options(tmp_path)) as remote:
        place = remote.place
        last = len(remote.manifest.shards) - 1
        del store.objects[f"ds/{remote.manifest.shards[last].path}"]
        with pytest.raises(RemoteStoreError, match="header of shards/"):
            place.shard_header("", last)
        store.objects["ds/manifest.json"] = b"{}"
        with pytest.raises(DatasetChangedError):
            place.shard_header("", last)


def test_the_build_report_is_copied_once_or_is_none(store, uniform, tmp_path):
    options = _options(tmp_path, request_bytes=EXTENT)
    with packer.open_dataset(URL, remote=options) as remote:
        place = remote.place
        expected = [line for line in (uniform / fmt.REPORT_NAME).read_text().splitlines() if line]
        entries = list(place.build_report())
        assert len(entries) == len(expected)
        assert (place.root / fmt.REPORT_NAME).read_bytes() == (uniform / fmt.REPORT_NAME).read_bytes()
        gets = len(store.ranges)
        list(place.build_report())
        assert len(store.ranges) == gets
        (place.root / fmt.REPORT_NAME).unlink()
        del store.objects[f"ds/{fmt.REPORT_NAME}"]
        assert place.build_report() is None
        store.fail["head"] = PermissionError("no")
        assert place.build_report() is None
        store.fail["head"] = ValueError("bad")
        assert place.build_report() is None


def test_the_build_report_is_read_in_requests_of_request_bytes(store, uniform, tmp_path, monkeypatch):
    report = b"".join(b'{"n": %d}\n' % n for n in range(3000))
    store.objects[f"ds/{fmt.REPORT_NAME}"] = report
    with packer.open_dataset(URL, remote=_options(tmp_path)) as remote:
        assert len(list(remote.place.build_report())) == 3000
    with packer.open_dataset(URL, remote=_options(tmp_path)) as remote:
        assert list(remote.place.build_report(must_contain=b'"n": 17}')) == [{"n": 17}]
    gets = [r for r in store.ranges if r[0].endswith(fmt.REPORT_NAME)]
    assert gets == [(f"ds/{fmt.REPORT_NAME}", s, min(s + EXTENT, len(report))) for s in range(0, len(report), EXTENT)]
    monkeypatch.setattr(reader_module, "MAX_REPORT_BYTES", 100)
    with packer.open_dataset(URL, remote=_options(tmp_path / "small")) as remote:
        remote.place.build_report()
        assert (remote.place.root / fmt.REPORT_NAME).read_bytes() == report[:100]


# --- small parts ----------------------------------------------------------------------------------


def test_contiguous_runs():
    assert _contiguous([5, 1, 2, 4, 7, 8, 9]) == [[1, 2], [4, 5], [7, 8, 9]]
    assert _contiguous([]) == [] and _contiguous([3]) == [[3]]


def test_settle_resolves_once():
    future: Future = Future()
    _settle(future, None)
    assert future.result() is None
    _settle(future, ValueError("late"))
    assert future.result() is None
    failed: Future = Future()
    error = ValueError("x")
    _settle(failed, error)
    assert failed.exception() is error


def test_close_ends_the_process_state(store, tmp_path):
    remote = packer.open_dataset(URL, remote=_options(tmp_path))
    place = remote.place
    remote.get(0)
    state = place._local()
    lock = next(iter(state.lock_files.values()))
    remote.close()
    assert place._state is None and lock.fd == -1 and state.maps == {} and state.lock_files == {}
    place.close()  # twice is harmless


def test_a_file_checked_by_this_process_is_not_hashed_again(store, tmp_path, monkeypatch):
    options = _options(tmp_path)
    with packer.open_dataset(URL, remote=options) as remote:
        remote.get(0)
        path = remote.place._extent_path("", 0)
    time.sleep(0.06)  # settled: a file changed just now is not remembered (its ctime may tick later)
    reader_module._VERIFIED.pop(path, None)
    real = RemoteFiles._extent_damage
    hashed = []
    monkeypatch.setattr(RemoteFiles, "_extent_damage", lambda self, *a: hashed.append(a[1]) or real(self, *a))
    with packer.open_dataset(URL, remote=options) as remote:
        remote.get(0)
    assert path in reader_module._VERIFIED and len(hashed) == 1
    with packer.open_dataset(URL, remote=options) as remote:
        remote.get(0)
    assert len(hashed) == 1  # the same file, unchanged: not hashed again
    time.sleep(0.06)
    stamp = time.time() - 10
    os.utime(path, (stamp, stamp))  # a change through the file system: checked again
    with packer.open_dataset(URL, remote=options) as remote:
        remote.get(0)
    assert len(hashed) == 2


def test_a_fresh_shards_first_read_maps_the_right_extent(store, uniform, tmp_path):
    """The fast path on a shard whose extents are not mapped yet (shard 1: its extents are numbered
    after shard 0's), then reads that cross the header or run past the last extent."""
    with packer.open_dataset(URL, remote=_options(tmp_path)) as remote:
        place = remote.place
        table = place.table("")
        number = 1
        entry = remote.manifest.shards[number]
        data = (uniform / entry.path).read_bytes()
        first = int(table.shard_extents[number])
        assert first > 0 and int(table.shard_extents[number + 1]) - first >= 2
        shard = place.open_shard("", number, entry, lambda head, where: None)
        start = int(table.start[first + 1])
        out = bytearray(16)
        shard.read_into(start + 8, out)  # extent k=1 of this shard, never mapped
        assert bytes(out) == data[start + 8:start + 24]
        head = int(table.start[first])
        out = bytearray(20)
        shard.read_into(head - 10, out)  # the header's last bytes (zeros), then the first extent
        assert bytes(out) == bytes(10) + data[head:head + 10]
        last = int(table.end[int(table.shard_extents[number + 1]) - 1])
        out = bytearray(16)
        shard.read_into(last - 8, out)  # the last extent, then past it (zeros)
        assert bytes(out) == data[last - 8:last] + bytes(8)
        final = len(remote.manifest.shards) - 1
        entry = remote.manifest.shards[final]
        shard = place.open_shard("", final, entry, lambda head, where: None)
        end = int(table.end[-1])
        assert bytes(shard.view(end - 4, 8)) == (uniform / entry.path).read_bytes()[end - 4:end] + bytes(4)


# --- an image field's own shards and extents --------------------------------------------------------


@pytest.fixture(scope="module")
def with_fields(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 rows with an image field ``mask`` (small PNGs) beside the main JPEGs."""
    from helpers import make_field_source

    from packer.sources import LabelSettings

    root = tmp_path_factory.mktemp("fields")
    manifest = make_field_source(root / "src", 8)
    packer.build_dataset(manifest, root / "ds", packer.BuildSettings(
        layout=packer.LayoutSettings(shard_size=4096, alignment=64, shuffle=False),
        labels=LabelSettings(fields=("mask=image",))), packer.RunOptions(workers=1))
    return root / "ds"


@pytest.fixture
def field_store(monkeypatch, with_fields) -> Store:
    transport = Store()
    transport.load_folder(with_fields, "ds")
    memory_store(monkeypatch, transport)
    return transport


def _field_options(tmp_path: Path, **changes: Any) -> RemoteOptions:
    settings: dict[str, Any] = dict(extent_bytes=256, request_bytes=256, lookahead_bytes=512)
    settings.update(changes)
    return _options(tmp_path, **settings)


def test_an_image_fields_bytes_come_from_its_own_extents(field_store, with_fields, tmp_path):
    with packer.open_dataset(URL, remote=_field_options(tmp_path)) as remote, \
            packer.open_dataset(with_fields) as local:
        place = remote.place
        fields, main = place.table("mask"), place.table("")
        assert len(fields) >= 4 and not np.array_equal(fields.start, main.start[:len(fields.start)])
        for i in (5, 0, 7, 3, 1, 6, 2, 4):
            assert bytes(remote.field_bytes("mask", i)) == bytes(local.field_bytes("mask", i))
        assert bytes(remote.get(2)) == bytes(local.get(2))
        folder = place.root / "extents" / ("field-" + "mask".encode().hex())
        cached = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
        assert cached == sorted(f"{int(fields.shard[e])}/{int(fields.start[e])}-{int(fields.end[e])}"
                                for e in range(len(fields)))
        spec = remote.manifest.field("mask")
        head, where = place.shard_header("mask", 1)
        assert head == (with_fields / spec.shards[1].path).read_bytes()[:fmt.SHARD_HEADER_SIZE]
        assert where == f"{URL}/{spec.shards[1].path}"
        assert (place.root / "headers" / f"field-{'mask'.encode().hex()}-1").read_bytes() == head


def test_a_field_shard_read_maps_its_own_extents(field_store, with_fields, tmp_path):
    with packer.open_dataset(URL, remote=_field_options(tmp_path)) as remote:
        place = remote.place
        table = place.table("mask")
        spec = remote.manifest.field("mask")
        number = int(table.shard[-1])
        first = int(table.shard_extents[number])
        entry = spec.shards[number]
        data = (with_fields / entry.path).read_bytes()
        shard = place.open_shard("mask", number, entry, lambda head, where: None)
        k = int(table.shard_extents[number + 1]) - first - 1
        start = int(table.start[first + k])
        out = bytearray(8)
        shard.read_into(start, out)
        assert bytes(out) == data[start:start + 8]
        span = bytearray(int(table.end[first + k]) - int(table.start[first]) + 8)
        shard.read_into(int(table.start[first]), span)
        assert bytes(span) == data[int(table.start[first]):int(table.end[first + k])] + bytes(8)


def test_a_field_plan_and_ensure_fetch_the_fields_extents(field_store, with_fields, tmp_path):
    with packer.open_dataset(URL, remote=_field_options(tmp_path, lookahead_bytes=2048)) as remote:
        place = remote.place
        table = place.table("mask")
        order = np.asarray([7, 6, 5, 4, 3, 2, 1, 0])
        place.plan(order, family="mask")
        _drain(place)
        folder = place.root / "extents" / ("field-" + "mask".encode().hex())
        want = list(dict.fromkeys(int(table.of_sample[i]) for i in order))  # first-need order, by hand
        assert want == [int(e) for e in place._local().plans["mask"].sequence]
        got = [e for e in range(len(table)) if os.path.exists(place._extent_path("mask", e))]
        budget = 0
        expected = []
        for e in want:
            budget += table.nbytes(e)
            if budget > 2048:
                break
            expected.append(e)
        assert expected and got == sorted(expected) and folder.is_dir()
        assert not (place.root / "extents" / "main").exists()
        before = {e for e in range(len(table)) if os.path.exists(place._extent_path("mask", e))}
        for i in range(8):
            remote.get(i)  # the main extents are cached too: their files must not stand for the field's
        place.ensure([0, 1, 2, 3], family="mask")
        _drain(place)
        got = {e for e in range(len(table)) if os.path.exists(place._extent_path("mask", e))}
        assert got == before | {int(table.of_sample[i]) for i in range(4)}
        state = place._local()
        state.position["mask"], state.cursor["mask"] = 0, 1
        last = int(table.of_sample[0])  # sample 0's extent: the order reads it last
        upcoming = min(p for p, i in enumerate(order.tolist()) if int(table.of_sample[i]) == last)
        assert upcoming >= 5
        assert place._evict_rank(state, Path(place._extent_path("mask", last)), 1.0) == (3.0, -float(upcoming))


def test_damage_in_a_fields_bytes_names_the_field(field_store, with_fields, tmp_path):
    with packer.open_dataset(URL, remote=_field_options(tmp_path)) as remote:
        place = remote.place
        table = place.table("mask")
        spec = remote.manifest.field("mask")
        offsets, _sizes, _ = place._sample_columns("mask")
        main_offsets, _, _ = place._sample_columns("")
        # an extent whose first sample lies elsewhere in its field shard than in its main shard
        extent = next(e for e in range(len(table))
                      if int(offsets[int(table.first[e])]) != int(main_offsets[int(table.first[e])]))
        shard_path = spec.shards[int(table.shard[extent])].path
        start = int(table.start[extent])

        def tamper(key, lo, hi, data):  # type: ignore[no-untyped-def]
            if key == f"ds/{shard_path}" and lo <= start < hi:
                data = bytearray(data)
                data[start - lo] ^= 0xFF
            return bytes(data)

        field_store.tamper = tamper
        sample = int(table.first[extent])
        with pytest.raises(ChecksumMismatchError) as caught:
            remote.field_bytes("mask", sample)
        assert caught.value.message == (
            f"field 'mask' bytes fetched twice from the store do not match the index checksum (range "
            f"{start}-{int(table.end[extent])}; the stored object is damaged)")
        assert caught.value.path == f"{URL}/{shard_path}"
        assert caught.value.sample == sample and caught.value.offset == int(offsets[sample])
        field_store.tamper = None
        main = place.table("")
        assert (int(main.start[extent]), int(main.end[extent])) != (start, int(table.end[extent]))
        bad = memoryview(b"x" * table.nbytes(extent))
        error = place._cache_damage("mask", extent, place._extent_damage("mask", extent, bad))
        assert error.path == f"{URL}/{shard_path}"
        assert error.message.startswith(f"the node cache's copy of bytes {start}-{int(table.end[extent])} of this "
                                        f"object is damaged (sample {sample} does not match its checksum)")
        assert f"(cache file {place._extent_path('mask', extent)})" in error.message
        assert error.sample == sample
        assert place._extent_path("mask", extent) != place._extent_path("", extent)


def test_an_extent_evicted_as_soon_as_it_enters_is_fetched_three_times_then_refused(store, tmp_path, monkeypatch):
    """Another process with a tiny bound evicts each extent between its fetch and this reader's
    mapping of it: three fetches, then an error naming the bound (not a fetch loop)."""
    from packer.remote.cache import evict

    cache = tmp_path / "cache"
    fetch = RemoteFiles._fetch_now
    fetched: list[int] = []

    def fetch_then_evicted(self, family: str, extent: int, **kwargs: Any) -> None:
        fetch(self, family, extent, **kwargs)
        fetched.append(extent)
        assert evict(cache, 1, lambda path, mtime: (0.0, mtime))[1] > 0

    monkeypatch.setattr(RemoteFiles, "_fetch_now", fetch_then_evicted)
    with packer.open_dataset(URL, remote=_options(tmp_path, cache_bytes=4096)) as remote:
        with pytest.raises(RemoteStoreError) as caught:
            remote.get(5)
        assert fetched == [int(remote.place.table("").of_sample[5])] * 3
        assert remote.remote_stats()["downloads"] == 3
    assert caught.value.path == URL
    assert caught.value.message == (f"extent {fetched[0]} left the cache as soon as it entered (cache_bytes 4096 is "
                                    f"too small for the read-ahead)")


def test_a_batch_ensured_ahead_moves_the_prefetcher_past_it(field_store, tmp_path):
    """``ensure`` notes the batch's extents as needed: the prefetcher's window starts after them."""
    with packer.open_dataset(URL, remote=_field_options(tmp_path)) as remote:
        place = remote.place
        table = place.table("mask")
        window = 2 * max(table.nbytes(e) for e in range(len(table)))
        place.options = place.options.with_(lookahead_bytes=window)
        place.plan(np.arange(8), family="mask")
        _drain(place)
        sequence = list(dict.fromkeys(int(e) for e in table.of_sample[:8]))  # first-need order, by hand
        assert sequence == [int(e) for e in place._local().plans["mask"].sequence] and len(sequence) >= 5

        def within(first: int, budget: int) -> set[int]:
            """The entries of the sequence from ``first`` whose sizes add up to at most ``budget``."""
            picked, used = set(), 0
            for e in sequence[first:]:
                used += table.nbytes(e)
                if used > budget:
                    break
                picked.add(e)
            return picked

        cached = lambda: {e for e in range(len(table)) if os.path.exists(place._extent_path("mask", e))}  # noqa: E731
        initial = within(0, window)
        assert cached() == initial and sequence[-1] not in initial
        j = len(sequence) - 3
        place.ensure([int(table.first[sequence[j]]), int(table.first[sequence[j + 1]])], family="mask")
        _drain(place)
        # the window now starts after the batch's last extent: the next one is fetched ahead
        assert cached() == initial | {sequence[j], sequence[j + 1]} | within(j + 1, window)
        assert sequence[j + 2] in cached()


def test_the_lookahead_is_a_byte_budget_from_the_readers_position(store, tmp_path):
    with packer.open_dataset(URL, remote=_options(tmp_path, lookahead_bytes=3 * EXTENT - 1)) as remote:
        place = remote.place
        table = place.table("")
        order = np.asarray([int(table.first[e]) for e in (4, 1, 6, 3)], dtype=np.int64)
        remote.plan_reads(order)
        _drain(place)
        assert _cached(place) == [1, 4]  # a third extent would pass the budget by one byte


def test_a_plan_of_a_batch_matrix_is_its_rows_in_order(store, tmp_path):
    with packer.open_dataset(URL, remote=_options(tmp_path, lookahead_bytes=EXTENT)) as remote:
        place = remote.place
        table = place.table("")
        matrix = np.asarray([[int(table.first[e]) for e in (5, 2)], [int(table.first[e]) for e in (7, 2)]])
        place.plan(matrix)
        plan = place._local().plans[""]
        assert plan.sequence.tolist() == [5, 2, 7]
        assert plan.last_need.tolist()[2] == 3 and plan.next_need(2, 2) == 3


def test_a_reader_waiting_on_a_prefetch_gets_its_bytes(store, uniform, tmp_path):
    import threading as _threading

    started = _threading.Event()

    def slow(key, lo, hi, data):  # type: ignore[no-untyped-def]
        if "/shards/" in key:
            started.set()
            time.sleep(0.3)
        return data

    store.tamper = slow
    with packer.open_dataset(URL, remote=_options(tmp_path)) as remote, packer.open_dataset(uniform) as local:
        table = remote.place.table("")
        remote.plan_reads(np.asarray([int(table.first[3])]))
        assert started.wait(10)
        assert bytes(remote.get(int(table.first[3]))) == bytes(local.get(int(table.first[3])))
        assert remote.remote_stats()["downloads"] == 1


def test_the_prefetcher_skips_an_extent_another_process_is_fetching(field_store, tmp_path):
    """Prefetching never waits: an extent whose lock byte another process holds is left to it."""
    import fcntl as _fcntl
    import signal as _signal

    with packer.open_dataset(URL, remote=_field_options(tmp_path, lookahead_bytes=1 << 20)) as remote:
        place = remote.place
        table = place.table("mask")
        held = int(table.of_sample[2])
        lock_path = place.root / "locks" / f"field-{'mask'.encode().hex()}-{int(table.shard[held])}.lock"
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        lock_path.touch()
        ready_r, ready_w = os.pipe()
        done_r, done_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the other process holds the extent's byte until told
            _signal.alarm(60)
            os.close(done_w)
            os.close(ready_r)
            fd = os.open(lock_path, os.O_RDWR)
            _fcntl.lockf(fd, _fcntl.LOCK_EX, 1, int(table.ordinal[held]), os.SEEK_SET)
            os.write(ready_w, b"1")
            os.read(done_r, 1)
            os._exit(0)
        try:
            os.read(ready_r, 1)
            place.plan(np.arange(8), family="mask")
            place._local().prefetch_pool.submit(lambda: None).result(timeout=10)
            cached = {e for e in range(len(table)) if os.path.exists(place._extent_path("mask", e))}
            assert cached == set(range(len(table))) - {held}
        finally:
            os.write(done_w, b"1")
            os.waitpid(pid, 0)
            for fd in (ready_r, ready_w, done_r, done_w):
                os.close(fd)


def test_mapped_extents_are_bounded_least_recently_used_first(store, uniform, tmp_path, monkeypatch):
    monkeypatch.setattr(reader_module, "_MAPPED_EXTENTS", 2)
    with packer.open_dataset(URL, remote=_options(tmp_path)) as remote, packer.open_dataset(uniform) as local:
        place = remote.place
        state = place._local()
        table = place.table("")
        shard = place.open_shard("", 0, remote.manifest.shards[0], lambda head, where: None)
        views = place.shard_views("", 0)
        for extent in (0, 1, 0, 2):
            place.extent_view("", extent)
        assert list(state.maps) == [("", 0), ("", 2)]  # 1 was used least recently
        assert views[1] is None and views[0] is not None and views[2] is not None
        start = int(table.start[1])
        out = bytearray(16)
        shard.read_into(start, out)  # mapped again on demand
        assert bytes(out) == (uniform / remote.manifest.shards[0].path).read_bytes()[start:start + 16]
        assert list(state.maps) == [("", 2), ("", 1)]
        assert [bytes(remote.get(i)) for i in range(6)] == [bytes(local.get(i)) for i in range(6)]


def test_a_shards_slot_table_holds_the_extents_mapped_before_it(store, uniform, tmp_path):
    with packer.open_dataset(URL, remote=_options(tmp_path)) as remote:
        place = remote.place
        table = place.table("")
        first, stop = int(table.shard_extents[1]), int(table.shard_extents[2])
        for extent in range(first, stop):
            place.extent_view("", extent)
        views = place.shard_views("", 1)
        assert len(views) == stop - first and all(view is not None for view in views)
        assert bytes(views[1]) == bytes(place.extent_view("", first + 1))


def test_two_damaged_cache_files_are_two_repairs_and_an_empty_one_is_named(store, uniform, tmp_path, monkeypatch):
    options = _options(tmp_path)
    with packer.open_dataset(URL, remote=options) as remote:
        table = remote.place.table("")
        remote.get(int(table.first[0]))
        remote.get(int(table.first[1]))
        paths = [Path(remote.place._extent_path("", e)) for e in (0, 1)]
    for path in paths:
        path.write_bytes(b"")
    with packer.open_dataset(URL, remote=options) as remote, packer.open_dataset(uniform) as local:
        for e in (0, 1):
            assert bytes(remote.get(int(table.first[e]))) == bytes(local.get(int(table.first[e])))
        assert remote.place.stats()["repaired"] == 2
    monkeypatch.setattr(reader_module, "write_cached", lambda target, pieces: Path(target).write_bytes(b"") or 0)
    paths[0].write_bytes(b"")
    with packer.open_dataset(URL, remote=options) as remote:
        with pytest.raises(ChecksumMismatchError) as caught:
            remote.get(int(table.first[0]))
    size = table.nbytes(0)
    assert f"is 0 bytes, not {size}; fetched again, it is 0 bytes, not {size} (cache file" in caught.value.message


def test_a_field_shards_header_is_the_fields_own(field_store, with_fields, tmp_path):
    with packer.open_dataset(URL, remote=_field_options(tmp_path)) as remote:
        place = remote.place
        spec = remote.manifest.field("mask")
        entry = spec.shards[1]
        seen: list[tuple[bytes, str]] = []
        place.open_shard("mask", 1, entry, lambda head, where: seen.append((head, where)))
        head = (with_fields / entry.path).read_bytes()[:fmt.SHARD_HEADER_SIZE]
        assert seen == [(head, f"{URL}/{entry.path}")]
        cached = place.root / "headers" / f"field-{'mask'.encode().hex()}-1"
        cached.write_bytes(b"junk")
        seen.clear()

        def check(data: bytes, where: str) -> None:
            seen.append((data, where))
            if data == b"junk":
                raise ManifestError("not a header", path=where)

        place.open_shard("mask", 1, entry, check)
        assert seen == [(b"junk", f"{URL}/{entry.path}"), (head, f"{URL}/{entry.path}")]
        assert cached.read_bytes() == head


# --- process state, locks, the cache bound (issue 41: the survivors of round 4) ----------------------


def _shard_gets(store: Store) -> int:
    return sum(1 for key, _lo, _hi in store.ranges if "/shards/" in key)


def test_fetch_threads_are_named_and_at_most_in_flight(store, tmp_path):
    import threading as _threading

    guard = _threading.Lock()
    active, peak, names = [0], [0], set()

    def slow(key, lo, hi, data):  # type: ignore[no-untyped-def]
        if "/shards/" in key:
            with guard:
                active[0] += 1
                peak[0] = max(peak[0], active[0])
                names.add(_threading.current_thread().name.rsplit("_", 1)[0])
            time.sleep(0.05)
            with guard:
                active[0] -= 1
        return data

    store.tamper = slow
    remote = packer.open_dataset(URL, remote=_options(tmp_path, in_flight=2, lookahead_bytes=1 << 20))
    place = remote.place
    table = place.table("")
    place.ensure([int(table.first[e]) for e in range(len(table))])
    remote.close()
    assert peak[0] == 2 and names == {"packer-fetch"} and len(_cached(place)) == len(table)
    names.clear()
    peak[0] = 0
    remote = packer.open_dataset(URL, remote=_options(tmp_path / "b", in_flight=2, lookahead_bytes=1 << 20))
    remote.place.plan(np.arange(24))
    deadline = time.monotonic() + 30
    while len(_cached(remote.place)) < len(table) and time.monotonic() < deadline:
        time.sleep(0.01)
    remote.close()
    assert names == {"packer-prefetch"} and peak[0] == 2 and len(_cached(remote.place)) == len(table)


def test_close_waits_for_the_running_prefetch_and_cancels_the_queued(store, tmp_path):
    import threading as _threading

    gate, started = _threading.Event(), _threading.Event()

    def held(key, lo, hi, data):  # type: ignore[no-untyped-def]
        if "/shards/" in key:
            started.set()
            assert gate.wait(10)
        return data

    store.tamper = held
    remote = packer.open_dataset(URL, remote=_options(tmp_path, lookahead_bytes=8 * EXTENT))
    remote.place.plan(np.arange(24))
    assert started.wait(10)
    closer = _threading.Thread(target=remote.close)
    closer.start()
    closer.join(0.3)
    assert closer.is_alive()  # the running GET is waited for
    gate.set()
    closer.join(10)
    assert not closer.is_alive() and _shard_gets(store) == 1  # the queued ones never ran


def test_close_waits_for_the_running_demand_fetch_and_cancels_the_queued(store, tmp_path):
    import threading as _threading

    gate, started = _threading.Event(), _threading.Event()

    def held(key, lo, hi, data):  # type: ignore[no-untyped-def]
        if "/shards/" in key:
            started.set()
            assert gate.wait(10)
        return data

    store.tamper = held
    remote = packer.open_dataset(URL, remote=_options(tmp_path))
    place = remote.place
    table = place.table("")
    failures: list[BaseException] = []

    def ensure() -> None:
        try:
            place.ensure([int(table.first[e]) for e in range(4)])
        except BaseException as exc:  # noqa: BLE001 - the cancelled fetches
            failures.append(exc)

    batch = _threading.Thread(target=ensure)
    batch.start()
    assert started.wait(10)
    closer = _threading.Thread(target=remote.close)
    closer.start()
    closer.join(0.3)
    assert closer.is_alive()
    gate.set()
    closer.join(10)
    batch.join(10)
    assert not closer.is_alive() and not batch.is_alive()
    assert _shard_gets(store) == 1 and len(failures) == 1


def test_the_cache_usage_is_added_up_between_rescans(store, tmp_path, monkeypatch):
    totals: list[int] = []
    calls: list[int] = []

    def fake_evict(root, bound, priority, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(bound)
        return totals.pop(0), 0

    monkeypatch.setattr(reader_module, "evict", fake_evict)
    monkeypatch.setattr(reader_module, "_RESCAN_EVERY", 4)
    place = RemoteFiles(parse_url(URL), _options(tmp_path, cache_bytes=1000))
    state = place._local()
    totals[:] = [0]
    place._account(state, 10)  # the first insertion: the usage is unknown, rescanned
    assert calls == [1000] and state.usage == 0
    place._account(state, 0)  # nothing added to an empty cache: no rescan
    assert calls == [1000] and state.usage == 0
    place._account(state, 1000)  # exactly the bound is not over it
    assert calls == [1000] and state.usage == 1000
    totals[:] = [700]
    place._account(state, 5)  # the 4th insertion: rescanned
    assert calls == [1000] * 2 and state.usage == 700
    place._account(state, 300)
    assert calls == [1000] * 2 and state.usage == 1000
    place.close()


def test_the_usage_adds_every_byte_a_coalesced_request_wrote(store, uniform, tmp_path):
    from packer.remote.cache import scan_extents

    options = _options(tmp_path, cache_bytes=1 << 30, request_bytes=2 * EXTENT, lookahead_bytes=1 << 20)
    with packer.open_dataset(URL, remote=options) as remote, packer.open_dataset(uniform) as local:
        place = remote.place
        table = place.table("")
        place.plan(np.arange(24))
        _drain(place)
        assert _cached(place) == list(range(len(table)))
        assert _shard_gets(store) < len(table)  # coalesced
        for e in range(len(table)):
            assert os.path.getsize(place._extent_path("", e)) == table.nbytes(e)
        sizes = sum(size for _, size, _ in scan_extents(place.cache_root))
        assert place._local().usage == sizes
        assert [bytes(remote.get(i)) for i in range(24)] == [bytes(local.get(i)) for i in range(24)]
        assert place.stats()["repaired"] == 0 and place.stats()["refetched"] == 0


def test_other_datasets_files_are_evicted_oldest_first(store, tmp_path):
    probe = RemoteFiles(parse_url(URL), _options(tmp_path / "probe"))
    size = probe.table("").nbytes(0)
    probe.close()
    options = _options(tmp_path, cache_bytes=size + 8000 - 1)  # one of the two 4000-byte files must go
    other = options.cache_root / "v1" / "other" / "gen" / "extents" / "main" / "0"
    other.mkdir(parents=True)
    old, new = other / "0-4000", other / "4000-8000"
    for path, age in ((old, 200), (new, 100)):
        path.write_bytes(bytes(4000))
        os.utime(path, (time.time() - age, time.time() - age))
    with packer.open_dataset(URL, remote=options) as remote:
        remote.get(0)
        assert not old.exists() and new.exists()
        assert os.path.exists(remote.place._extent_path("", 0))


def test_file_matches_checks_the_size_then_the_checksum(tmp_path):
    from packer.remote.reader import _file_matches

    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert _file_matches(empty, 0, fmt.checksum(b""))
    assert not _file_matches(empty, 0, fmt.checksum(b"x"))
    full = tmp_path / "full"
    full.write_bytes(b"abcd")
    assert _file_matches(full, 4, fmt.checksum(b"abcd"))
    assert not _file_matches(full, 3, fmt.checksum(b"abc"))
    assert not _file_matches(full, 4, fmt.checksum(b"abce"))
    assert not _file_matches(tmp_path / "none", 0, fmt.checksum(b""))


def test_the_open_lock_is_one_file_of_mode_0644(store, tmp_path):
    old = os.umask(0o022)
    place = None
    try:
        place = RemoteFiles(parse_url(URL), _options(tmp_path))
        lock = place.root / "open.lock"
        assert sorted(p.name for p in place.root.iterdir()) == sorted(
            [fmt.MANIFEST_NAME, place.manifest.index.path, "open.lock"])
        assert lock.stat().st_mode & 0o777 == 0o644
        lock.unlink()
        place.shard_header("", 0)  # creates it again
        assert lock.stat().st_mode & 0o777 == 0o644
        assert sorted(p.name for p in place.root.iterdir()) == sorted(
            [fmt.MANIFEST_NAME, place.manifest.index.path, "open.lock", "headers"])
    finally:
        os.umask(old)
        if place is not None:
            place.close()


def test_a_warm_open_takes_no_lock(store, tmp_path):
    import fcntl as _fcntl
    import threading as _threading

    options = _options(tmp_path)
    first = RemoteFiles(parse_url(URL), options)
    first.close()
    fd = os.open(first.root / "open.lock", os.O_RDWR)
    _fcntl.flock(fd, _fcntl.LOCK_EX)  # another process opening the same generation cold
    opened: list[RemoteFiles] = []
    warm = _threading.Thread(target=lambda: opened.append(RemoteFiles(parse_url(URL), options)))
    try:
        warm.start()
        warm.join(3)
        assert opened  # the cache proved the index: no lock taken
    finally:
        _fcntl.flock(fd, _fcntl.LOCK_UN)
        os.close(fd)
        warm.join(10)
    opened[0].close()


def test_an_extent_table_is_planned_once_per_family(field_store, tmp_path, monkeypatch):
    calls: list[int] = []
    real = reader_module.plan_extents
    monkeypatch.setattr(reader_module, "plan_extents", lambda *a: calls.append(1) or real(*a))
    with packer.open_dataset(URL, remote=_field_options(tmp_path)) as remote:
        place = remote.place
        main = place.table()
        assert place.table("") is main and place.table() is main
        mask = place.table("mask")
        assert place.table("mask") is mask and mask is not main
        assert len(calls) == 2


def test_one_lock_file_per_shard_and_family_per_process(field_store, tmp_path, monkeypatch):
    created: list[Path] = []
    real = reader_module.LockFile

    def counting(path: Path):  # type: ignore[no-untyped-def]
        created.append(path)
        return real(path)

    monkeypatch.setattr(reader_module, "LockFile", counting)
    with packer.open_dataset(URL, remote=_field_options(tmp_path, lookahead_bytes=1 << 20)) as remote:
        place = remote.place
        table = place.table("mask")
        place.extent_view("mask", 0)  # on demand
        place.extent_view("mask", len(table) - 1)
        place.plan(np.arange(8), family="mask")  # the rest prefetched
        _drain(place)
        assert all(os.path.exists(place._extent_path("mask", e)) for e in range(len(table)))
        family = "field-" + "mask".encode().hex()
        shards = sorted({int(s) for s in table.shard.tolist()})
        assert sorted(os.listdir(place.root / "locks")) == sorted(f"{family}-{s}.lock" for s in shards)
        assert sorted(p.name for p in created) == sorted(f"{family}-{s}.lock" for s in shards)
        state = place._local()
        assert place._lock_file(state, "mask", shards[0]) is place._lock_file(state, "mask", shards[0])
        assert len(created) == len(shards)


def test_each_damaged_answer_is_one_refetch(store, uniform, tmp_path):
    with packer.open_dataset(URL, remote=_options(tmp_path)) as remote, packer.open_dataset(uniform) as local:
        place = remote.place
        table = place.table("")
        starts = {int(table.start[0]), int(table.start[1])}

        def tamper(key, lo, hi, data):  # type: ignore[no-untyped-def]
            hit = [s for s in starts if "/shards/" in key and lo <= s < hi]
            if hit:
                starts.discard(hit[0])
                data = bytearray(data)
                data[hit[0] - lo] ^= 0xFF
                return bytes(data)
            return data

        store.tamper = tamper
        for e in (0, 1):
            assert bytes(remote.get(int(table.first[e]))) == bytes(local.get(int(table.first[e])))
        assert place.stats()["refetched"] == 2 and place.stats()["downloads"] == 2


def test_a_failed_shard_read_names_the_shard(store, tmp_path):
    with packer.open_dataset(URL, remote=_options(tmp_path)) as remote:
        place = remote.place
        entry = remote.manifest.shards[0]
        del store.objects[f"ds/{entry.path}"]
        with pytest.raises(RemoteStoreError) as caught:
            place.extent_view("", 0)
        assert f"shard {entry.path} bytes" in caught.value.message
        assert not isinstance(caught.value, DatasetChangedError)


def test_a_failed_second_fetch_of_damaged_bytes_names_the_shard(store, tmp_path):
    with packer.open_dataset(URL, remote=_options(tmp_path)) as remote:
        place = remote.place
        table = place.table("")
        entry = remote.manifest.shards[0]
        start = int(table.start[0])
        answers = [0]

        def tamper(key, lo, hi, data):  # type: ignore[no-untyped-def]
            if "/shards/" in key:
                answers[0] += 1
                if answers[0] > 1:
                    raise FileNotFoundError(key)
                data = bytearray(data)
                data[start - lo] ^= 0xFF
                return bytes(data)
            return data

        store.tamper = tamper
        with pytest.raises(RemoteStoreError) as caught:
            place.extent_view("", 0)
        assert f"shard {entry.path} bytes {start}-{int(table.end[0])}" in caught.value.message


def test_a_prefetch_settles_its_extents_with_its_outcome(store, tmp_path):
    with packer.open_dataset(URL, remote=_options(tmp_path)) as remote:
        place = remote.place
        state = place._local()
        table = place.table("")
        place.extent_view("", 0)
        landed: Future = Future()
        state.inflight[("", 0)] = landed
        place._prefetch_job(state, "", [0])  # it landed meanwhile: nothing to fetch, its lock is let go
        assert landed.result(timeout=5) is None and ("", 0) not in state.inflight
        last = len(table) - 1
        del store.objects[f"ds/{remote.manifest.shards[int(table.shard[last])].path}"]
        failed: Future = Future()
        state.inflight[("", last)] = failed
        place._prefetch_job(state, "", [last])
        assert isinstance(failed.exception(timeout=5), RemoteStoreError)
        assert place.stats()["downloads"] == 1


def test_a_reader_waiting_on_a_failed_fetch_gets_its_error(store, tmp_path):
    import threading as _threading

    gate, started = _threading.Event(), _threading.Event()

    def failing(key, lo, hi, data):  # type: ignore[no-untyped-def]
        if "/shards/" in key:
            started.set()
            assert gate.wait(10)
            raise FileNotFoundError(key)
        return data

    store.tamper = failing
    with packer.open_dataset(URL, remote=_options(tmp_path)) as remote:
        place = remote.place
        errors: list[BaseException] = []

        def read() -> None:
            try:
                place.extent_view("", 0)
            except RemoteStoreError as exc:
                errors.append(exc)

        first = _threading.Thread(target=read)
        first.start()
        assert started.wait(10)
        second = _threading.Thread(target=read)
        second.start()
        time.sleep(0.2)  # the second waits on the first's fetch
        gate.set()
        first.join(10)
        second.join(10)
        assert len(errors) == 2 and _shard_gets(store) == 1


def test_a_file_changed_within_the_settle_time_is_not_remembered(store, tmp_path, monkeypatch):
    import types

    options = _options(tmp_path)
    with packer.open_dataset(URL, remote=options) as remote:
        remote.get(0)
        path = remote.place._extent_path("", 0)
    ctime = os.stat(path).st_ctime_ns
    now = [0]
    monkeypatch.setattr(reader_module, "time", types.SimpleNamespace(time_ns=lambda: now[0]))
    for delay, remembered in ((0, False), (reader_module._SETTLED_NS, False), (reader_module._SETTLED_NS + 1, True)):
        reader_module._VERIFIED.pop(path, None)
        now[0] = ctime + delay
        with packer.open_dataset(URL, remote=options) as remote:
            remote.get(0)
        assert (path in reader_module._VERIFIED) is remembered, delay


def test_a_damaged_field_cache_file_is_repaired_then_named(field_store, with_fields, tmp_path, monkeypatch):
    options = _field_options(tmp_path)
    with packer.open_dataset(URL, remote=options) as remote:
        place = remote.place
        table = place.table("mask")
        extent = int(table.of_sample[3])
        remote.field_bytes("mask", 3)
        path = Path(place._extent_path("mask", extent))
        offsets, _sizes, _ = place._sample_columns("mask")
        at = int(offsets[3]) - int(table.start[extent])
        entry = remote.manifest.field("mask").shards[int(table.shard[extent])]
    damaged = bytearray(path.read_bytes())
    damaged[at] ^= 0xFF
    path.write_bytes(bytes(damaged))
    with packer.open_dataset(URL, remote=options) as remote, packer.open_dataset(with_fields) as local:
        assert bytes(remote.field_bytes("mask", 3)) == bytes(local.field_bytes("mask", 3))
        assert remote.place.stats()["repaired"] == 1 and remote.place.stats()["downloads"] == 1
    monkeypatch.setattr(reader_module, "write_cached", lambda target, pieces: Path(target).write_bytes(b"") or 0)
    path.write_bytes(b"")
    with packer.open_dataset(URL, remote=options) as remote:
        with pytest.raises(ChecksumMismatchError) as caught:
            remote.field_bytes("mask", 3)
    assert caught.value.path == f"{URL}/{entry.path}"
    assert f"bytes {int(table.start[extent])}-{int(table.end[extent])} of this object" in caught.value.message


def test_reading_a_fields_extent_moves_its_prefetcher(field_store, tmp_path):
    with packer.open_dataset(URL, remote=_field_options(tmp_path, lookahead_bytes=1 << 20)) as remote:
        place = remote.place
        table = place.table("mask")
        sequence = [int(table.of_sample[i]) for i in range(8)]
        sequence = list(dict.fromkeys(sequence))
        assert len(sequence) >= 4
    budget = table.nbytes(sequence[2]) + table.nbytes(sequence[3])
    with packer.open_dataset(URL, remote=_field_options(tmp_path / "b", lookahead_bytes=budget)) as remote:
        place = remote.place
        place.plan(np.arange(8), family="mask")
        _drain(place)
        assert not os.path.exists(place._extent_path("mask", sequence[3]))
        place.extent_view("mask", sequence[2])  # the reader is there: the prefetcher moves on
        _drain(place)
        assert os.path.exists(place._extent_path("mask", sequence[3]))


def test_a_header_gone_before_it_is_fetched_again_is_fetched(store, uniform, tmp_path):
    with packer.open_dataset(URL, remote=_options(tmp_path)) as remote:
        place = remote.place
        entry = remote.manifest.shards[0]
        cached = place.root / "headers" / "main-0"
        seen: list[bytes] = []

        def check(head: bytes, where: str) -> None:
            seen.append(head)
            if len(seen) == 1:
                cached.unlink()  # another process's eviction took it meanwhile
                raise ManifestError("not a header", path=where)

        place.open_shard("", 0, entry, check)
        assert seen[1] == (uniform / entry.path).read_bytes()[:fmt.SHARD_HEADER_SIZE] and len(seen) == 2
        assert cached.read_bytes() == seen[1]


def _replace_index(store: Store, data: bytes) -> str:
    """Put ``data`` in the store as the index, with a manifest that records its size and xxh3."""
    import json

    manifest = json.loads(store.objects["ds/manifest.json"])
    store.objects[f"ds/{manifest['index']['path']}"] = data
    manifest["index"].update(size=len(data), checksum=fmt.checksum_hex(fmt.checksum(data)))
    store.objects["ds/manifest.json"] = json.dumps(manifest).encode()
    return manifest["index"]["path"]


def test_an_index_that_is_no_index_is_named_with_its_cache_file(store, tmp_path):
    relative = _replace_index(store, b"not an index, but the manifest's checksum matches it" * 4)
    place = RemoteFiles(parse_url(URL), _options(tmp_path))
    with pytest.raises(PackerError) as caught:
        place.table("")
    assert caught.value.message == "not a packer index file (starts with b'not an i')"
    assert str(caught.value.path) == str(place.root / relative)
    place.close()


def test_another_datasets_index_is_named_with_its_cache_file(store, with_fields, tmp_path):
    relative = _replace_index(store, next(with_fields.glob("index-*")).read_bytes())
    place = RemoteFiles(parse_url(URL), _options(tmp_path))
    with pytest.raises(PackerError) as caught:
        place.table("")
    assert str(caught.value.path) == str(place.root / relative)
    place.close()


def test_a_manifest_that_is_not_one_is_named_with_its_url(store, tmp_path):
    store.objects["ds/manifest.json"] = b"{}"
    with pytest.raises(PackerError) as caught:
        RemoteFiles(parse_url(URL), _options(tmp_path))
    assert caught.value.path == f"{URL}/{fmt.MANIFEST_NAME}"


def test_a_field_is_checked_against_its_own_checksums(field_store, with_fields, tmp_path):
    with packer.open_dataset(URL, remote=_field_options(tmp_path)) as remote, \
            packer.open_dataset(with_fields) as local:
        for i in range(8):
            assert bytes(remote.field_bytes("mask", i)) == bytes(local.field_bytes("mask", i))
        assert remote.place.stats()["refetched"] == 0
        table = remote.place.table("mask")
        offsets, _sizes, _ = remote.place._sample_columns("mask")
        extent = int(table.of_sample[3])
        entry = remote.manifest.field("mask").shards[int(table.shard[extent])]
    at = int(offsets[3])
    left = [1]

    def tamper(key, lo, hi, data):  # type: ignore[no-untyped-def]
        if key == f"ds/{entry.path}" and lo <= at < hi and left[0]:
            left[0] -= 1
            data = bytearray(data)
            data[at - lo] ^= 0xFF
            return bytes(data)
        return data

    field_store.tamper = tamper
    with packer.open_dataset(URL, remote=_field_options(tmp_path / "again")) as remote, \
            packer.open_dataset(with_fields) as local:
        assert bytes(remote.field_bytes("mask", 3)) == bytes(local.field_bytes("mask", 3))
        assert remote.place.stats()["refetched"] == 1 and left == [0]


def test_a_field_shard_reads_its_own_extents_beside_mapped_main_ones(field_store, with_fields, tmp_path):
    with packer.open_dataset(URL, remote=_field_options(tmp_path)) as remote:
        place = remote.place
        for i in range(8):
            remote.get(i)  # the main shards' slot tables fill up
        table = place.table("mask")
        for number, entry in enumerate(remote.manifest.field("mask").shards):
            data = (with_fields / entry.path).read_bytes()
            reading = place.open_shard("mask", number, entry, lambda head, where: None)
            viewing = place.open_shard("mask", number, entry, lambda head, where: None)
            for e in range(int(table.shard_extents[number]), int(table.shard_extents[number + 1])):
                lo, hi = int(table.start[e]), int(table.end[e])
                assert bytes(viewing.view(lo, hi - lo)) == data[lo:hi]
                out = bytearray(hi - lo)
                reading.read_into(lo, out)
                assert bytes(out) == data[lo:hi]
            viewing = place.open_shard("mask", number, entry, lambda head, where: None)
            for e in range(int(table.shard_extents[number]), int(table.shard_extents[number + 1])):
                lo, hi = int(table.start[e]), int(table.end[e])
                assert bytes(viewing.view(lo, hi - lo)) == data[lo:hi]


def test_an_evicted_extent_this_process_never_mapped_is_no_error(store, uniform, tmp_path):
    with packer.open_dataset(URL, remote=_options(tmp_path, cache_bytes=3 * EXTENT)) as remote, \
            packer.open_dataset(uniform) as local:
        place = remote.place
        table = place.table("")
        place.ensure([int(table.first[e]) for e in range(6)])  # fetched, never mapped: some evicted
        assert place.stats()["downloads"] == 6 and len(_cached(place)) <= 3 and not place._local().maps
        assert [bytes(remote.get(i)) for i in range(12)] == [bytes(local.get(i)) for i in range(12)]


def test_the_prefetcher_leaves_an_extent_in_flight_to_its_fetcher(store, tmp_path):
    import threading as _threading

    gate, started = _threading.Event(), _threading.Event()

    def held(key, lo, hi, data):  # type: ignore[no-untyped-def]
        if "/shards/" in key:
            started.set()
            assert gate.wait(10)
        return data

    store.tamper = held
    with packer.open_dataset(URL, remote=_options(tmp_path, lookahead_bytes=1 << 20)) as remote:
        place = remote.place
        table = place.table("")
        reader = _threading.Thread(target=lambda: place.extent_view("", 0))
        reader.start()
        assert started.wait(10)
        place.plan(np.arange(24))  # extent 0 comes first, and is in flight
        gate.set()
        reader.join(10)
        deadline = time.monotonic() + 30
        while len(_cached(place)) < len(table) and time.monotonic() < deadline:
            time.sleep(0.01)
        _drain(place)
        assert _shard_gets(store) == len(table) == place.stats()["downloads"]
