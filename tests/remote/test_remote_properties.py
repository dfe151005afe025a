"""The object-storage policies as properties (issue 41), each shown able to fail by breaking the
policy it pins (the ``*_catches_*`` tests):

- the bounded node cache: the downloads of an epoch never exceed Belady's count (the optimal
  replacement, knowing the order) for the cache's floor capacity, and never fall below the number of
  distinct extents the order reads; with no bound, every extent is downloaded exactly once;
- generation deletes: an overwrite deletes exactly the objects of the generation replaced before it
  that neither the replaced nor the new generation (nor the manifest the store holds) names, and
  never an object of either, whatever the sequence of overwrites and appends.

They run against ``conftest.MemoryTransport`` (an in-memory S3), hundreds of epochs in seconds."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import MemoryTransport, memory_store
from helpers import write_images

import packer
from packer.remote import RemoteOptions, parse_url
from packer.remote.reader import RemoteFiles
from packer.remote.upload import REPLACED_NAME, retire_names

EXTENT = 8 << 10  # two 4 KiB-aligned raw samples per extent


@pytest.fixture(scope="module")
def uniform_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 raw samples of one size (4 KiB aligned): 20 extents of two samples, all the same size."""
    root = tmp_path_factory.mktemp("uniform")
    write_images(root / "src", {"a": 20, "b": 20}, size=24)
    packer.build_dataset(root / "src", root / "ds", packer.BuildSettings(
        codec="raw:size=24x24", layout=packer.LayoutSettings(shard_size=48 << 10, alignment=4096)), packer.RunOptions(workers=1))
    return root / "ds"


def belady_misses(sequence: list[int], capacity: int) -> int:
    """Misses of the optimal replacement (evict what is needed again furthest ahead, or never)."""
    cache: set[int] = set()
    misses = 0
    for position, item in enumerate(sequence):
        if item in cache:
            continue
        misses += 1
        if len(cache) >= capacity:
            def next_use(other: int) -> int:
                for later in range(position + 1, len(sequence)):
                    if sequence[later] == other:
                        return later
                return len(sequence) + 1
            cache.remove(max(sorted(cache), key=next_use))
        cache.add(item)
    return misses


def _epoch(dataset: Path, order: np.ndarray, bound_extents: int, monkeypatch: pytest.MonkeyPatch,
           lookahead_extents: int = 1) -> tuple[int, list[int], list[bytes]]:
    """One epoch of ``order`` through a fresh node cache bounded to ``bound_extents`` extents:
    (downloads, the order's extent sequence, the bytes read)."""
    transport = MemoryTransport()
    transport.load_folder(dataset, "ds")
    memory_store(monkeypatch, transport)
    with tempfile.TemporaryDirectory() as cache:
        options = RemoteOptions(cache_dir=cache, extent_bytes=EXTENT, request_bytes=EXTENT, in_flight=1,
                                lookahead_bytes=lookahead_extents * EXTENT, cache_bytes=bound_extents * EXTENT,
                                backoff_s=0.001)
        with packer.open_dataset("s3://bucket/ds", remote=options) as remote:
            place: RemoteFiles = remote.place  # type: ignore[assignment]
            extents = place.table("").of_sample[order].tolist()
            remote.plan_reads(order)
            got = []
            for position, sample in enumerate(order.tolist()):
                remote.reads_advanced(position)
                got.append(bytes(remote.get(sample)))
            downloads = remote.remote_stats()["downloads"]
    return downloads, extents, got


ORDERS = st.lists(st.integers(0, 39), min_size=1, max_size=120).map(lambda xs: np.asarray(xs, dtype=np.int64))


@given(order=ORDERS, bound=st.integers(3, 8))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
def test_an_epochs_downloads_lie_between_the_distinct_extents_and_beladys_count(uniform_dataset, monkeypatch,
                                                                                 order, bound):
    downloads, extents, got = _epoch(uniform_dataset, order, bound, monkeypatch)
    with packer.open_dataset(uniform_dataset) as local:
        assert got == [bytes(local.get(int(i))) for i in order]
    # the floor capacity: eviction brings the cache to 0.9 of the bound, and one extent is the
    # read-ahead (lookahead_bytes): what Belady's rule may count on holding at every step
    floor = max(1, int(0.9 * bound) - 1)
    assert len(set(extents)) <= downloads <= belady_misses(extents, floor), (downloads, extents, floor)


def test_the_cache_property_catches_a_policy_that_evicts_what_is_needed_next(uniform_dataset, monkeypatch):
    """Break the policy (evict the extent needed *soonest* first) and the bound above fails."""
    order = np.asarray([0, 2, 4, 6, 8, 10, 0, 2, 4, 6, 8, 10] * 3, dtype=np.int64)
    honest, extents, _ = _epoch(uniform_dataset, order, 5, monkeypatch)
    floor = max(1, int(0.9 * 5) - 1)
    assert honest <= belady_misses(extents, floor)
    rank = RemoteFiles._evict_rank

    def soonest_first(self, state, path, mtime):  # type: ignore[no-untyped-def]
        key = rank(self, state, path, mtime)
        return (3.0, -key[1]) if key[0] == 3.0 else key

    monkeypatch.setattr(RemoteFiles, "_evict_rank", soonest_first)
    broken, _, _ = _epoch(uniform_dataset, order, 5, monkeypatch)
    assert broken > belady_misses(extents, floor), (broken, honest)


@given(order=ORDERS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
def test_without_a_bound_every_extent_is_downloaded_once(uniform_dataset, monkeypatch, order):
    downloads, extents, _ = _epoch(uniform_dataset, order, 0, monkeypatch)
    assert downloads == len(set(extents))


# --- generation deletes -------------------------------------------------------------------------------

NAMES = [f"shards/shard-{n:05d}.pks" for n in range(12)] + [f"index-{n}.pki" for n in range(4)]
STEPS = st.lists(st.tuples(st.sampled_from(["overwrite", "append"]), st.sets(st.sampled_from(NAMES), min_size=1,
                                                                                 max_size=8)),
                 min_size=1, max_size=8)


def _run_generations(steps, retire=retire_names) -> None:
    """Apply ``steps`` to a store, checking the deletion rule and that no object of the current or
    the previous generation is ever deleted."""
    transport = MemoryTransport()
    from packer.remote.store import Store

    url = parse_url("s3://bucket/ds")
    store = Store(url, RemoteOptions(cache_dir=tempfile.gettempdir(), backoff_s=0.001), transport=transport)
    current = {NAMES[0]}
    for name in current:
        transport.objects[f"ds/{name}"] = b"x"
    record: set[str] = set()
    previous: set[str] = set()
    for number, (kind, names) in enumerate(steps):
        new = set(names) | (current if kind == "append" else set())
        for name in new:
            transport.objects[f"ds/{name}"] = b"x"  # uploaded before the commit
        before = {key[3:] for key in transport.objects}
        if kind == "overwrite" and new != current:
            deleted, retained = retire(store, url, current, new, f"g{number}")
            assert set(deleted) == record - current - new  # exactly the recorded objects no newer one names
            assert set(retained) == current - new
            record = set(retained)
        after = {key[3:] for key in transport.objects}
        assert before - after == (set(deleted) if kind == "overwrite" and new != current else set())
        assert new <= after and current <= after  # a reader of either generation finds every object
        previous, current = current, new
    assert f"ds/{REPLACED_NAME}" in transport.objects or not record


@given(STEPS)
@settings(max_examples=300, deadline=None)
def test_an_overwrite_deletes_exactly_the_older_generations_own_objects(steps):
    _run_generations(steps)


def test_the_deletes_property_catches_a_rule_that_deletes_old_minus_new_at_once(monkeypatch):
    """Break the rule (delete the replaced generation's own objects at once, as before) and the
    property fails: a reader of the replaced generation would lose its objects."""
    from packer.remote.upload import retire_names as honest

    def at_once(store, url, old, new, generation):  # type: ignore[no-untyped-def]
        deleted, retained = honest(store, url, old, new, generation)
        for name in sorted(old - new):
            store.delete(name)
        return sorted(set(deleted) | (old - new)), retained

    steps = [("overwrite", {NAMES[1]}), ("overwrite", {NAMES[2]})]
    _run_generations(steps)
    with pytest.raises(AssertionError):
        _run_generations(steps, retire=at_once)


def test_closing_settles_an_extent_a_cancelled_prefetch_had_claimed(uniform_dataset, monkeypatch):
    """Found by the remote fuzzer: a batch that failed left a demand fetch waiting on an extent whose
    prefetch was still queued; closing cancelled the prefetch and then waited forever for the
    demand thread. Closing settles such an extent with a typed error and returns."""
    import threading
    from concurrent.futures import Future

    from packer.errors import RemoteStoreError

    transport = MemoryTransport()
    transport.load_folder(uniform_dataset, "ds")
    memory_store(monkeypatch, transport)
    with tempfile.TemporaryDirectory() as cache:
        dataset = packer.open_dataset("s3://bucket/ds", remote=RemoteOptions(cache_dir=cache, extent_bytes=EXTENT))
        place = dataset.place
        state = place._local()
        state.inflight[("", 3)] = Future()  # claimed by a prefetch that will never run
        waiter = state.demand_pool.submit(place._fetch_now, "", 3)
        closed = threading.Thread(target=dataset.close, daemon=True)
        closed.start()
        closed.join(timeout=20)
        assert not closed.is_alive(), "close() hung"
        error = waiter.exception(timeout=5)
    assert isinstance(error, RemoteStoreError)
    assert error.message == "the dataset was closed while this extent was being fetched"
