"""The node cache under a size bound: eviction follows the read order (Belady's rule: what the
order needs again latest, or never, goes first; what it needs next stays), and the cache stays
within its bound. A sequential pass over a dataset many times the bound downloads every extent
once; a random-order pass, which must fetch some extents again, fetches fewer than an LRU cache
of the same size would."""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest

from conftest import options_for

import packer
from packer.order import epoch_order, index_blocks
from packer.remote.upload import upload_dataset
from packer.remote.url import parse_url

EXTENT = 8 << 10  # two 4 KiB-aligned samples per extent: ~60 extents in the test dataset
BOUND = 6 * EXTENT


def _cached(cache: Path) -> set[tuple[int, int, int]]:
    """Every cached extent file: (shard, start, end)."""
    found = set()
    for folder, _dirs, files in os.walk(cache):
        if f"{os.sep}extents{os.sep}main{os.sep}" in folder + os.sep:
            for name in files:
                if not name.startswith("."):
                    start, end = (int(x) for x in name.split("-"))
                    found.add((int(Path(folder).name), start, end))
    return found


def _lru_misses(keys: list[tuple[int, int]], capacity: int) -> int:
    cache: OrderedDict[tuple[int, int], None] = OrderedDict()
    misses = 0
    for key in keys:
        if key in cache:
            cache.move_to_end(key)
            continue
        misses += 1
        cache[key] = None
        if len(cache) > capacity:
            cache.popitem(last=False)
    return misses


@pytest.mark.parametrize("kind", ["sequential", "random"])
def test_a_bounded_cache_evicts_by_the_order(s3, small_dataset, tmp_path, kind):
    url = f"s3://{s3.bucket}/ds"
    upload_dataset(small_dataset, parse_url(url), options_for(s3, tmp_path / "up"))
    cache = tmp_path / "cache"
    options = options_for(s3, cache, extent_bytes=EXTENT, request_bytes=EXTENT, lookahead_bytes=2 * EXTENT,
                          in_flight=2, cache_bytes=BOUND)
    with packer.open_dataset(small_dataset) as local:
        shard, offset = np.asarray(local.index.shard), np.asarray(local.index.offset)
        blocks = index_blocks(local.index.offset, local.index.size, local.index.shard, 16 << 10)
        order = epoch_order(kind, len(local), seed=7, epoch=0, blocks=blocks)
        expect = [bytes(local.get(int(i))) for i in order]
    s3.reset()
    with packer.open_dataset(url, remote=options) as remote:
        remote.plan_reads(order)
        got, largest, seen, extent_of = [], 0, set(), {}
        for position, i in enumerate(order.tolist()):
            remote.reads_advanced(position)
            got.append(bytes(remote.get(i)))
            present = _cached(cache)
            largest = max(largest, EXTENT * len(present))
            seen |= present
            for key in present:
                for sample in np.flatnonzero((shard == key[0]) & (offset >= key[1]) & (offset < key[2])).tolist():
                    extent_of[sample] = key
            if kind == "sequential":  # what eviction removed, the order does not read again
                later = set(order[position + 1:].tolist())
                for key in seen - present:
                    inside = np.flatnonzero((shard == key[0]) & (offset >= key[1]) & (offset < key[2]))
                    assert not set(inside.tolist()) & later, (position, key)
        stats = remote.remote_stats()
    assert got == expect
    assert largest <= BOUND + 2 * EXTENT, (largest, BOUND)  # the bound, give or take what is in flight
    assert len(seen) > 4 * (BOUND // EXTENT)  # several times the bound went through the cache
    if kind == "sequential":
        assert stats["downloads"] == len(seen)  # each extent once
    else:
        lru = _lru_misses([extent_of[i] for i in order.tolist()], BOUND // EXTENT)
        print(f"downloads {stats['downloads']}, extents {len(seen)}, LRU of the same size {lru}")
        assert len(seen) < stats["downloads"] < lru
