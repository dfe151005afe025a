"""Read orders (packer.order): determinism, block locality, equal rank shares, exact resumption."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.order import (ORDERS, ReadOrder, block_order, deal, epoch_order, index_blocks, rank_share,
                          uniform_blocks)


def _is_permutation(order: np.ndarray, n: int) -> bool:
    return order.dtype == np.int64 and len(order) == n and np.array_equal(np.sort(order), np.arange(n))


def _layout(sizes: list[int], per_shard: int, alignment: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Offsets/sizes/shards of a packed index (tight packing from the data offset, per shard)."""
    offsets, shards = [], []
    position, shard = 64, 0
    for i, size in enumerate(sizes):
        if i and i % per_shard == 0:
            position, shard = 64, shard + 1
        offsets.append(position)
        shards.append(shard)
        position += -(-size // alignment) * alignment
    return (np.array(offsets, dtype=np.uint64), np.array(sizes, dtype=np.uint64),
            np.array(shards, dtype=np.uint32))


def test_import_is_torch_free() -> None:
    code = "import sys, packer.order; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.parametrize("kind", ORDERS)
def test_orders_are_permutations_determined_by_seed_and_epoch(kind: str) -> None:
    n = 1000
    blocks = uniform_blocks(n, 10)
    a = epoch_order(kind, n, seed=7, epoch=3, blocks=blocks, window=4)
    b = epoch_order(kind, n, seed=7, epoch=3, blocks=blocks, window=4)
    assert _is_permutation(a, n)
    assert np.array_equal(a, b)
    if kind == "sequential":
        assert np.array_equal(a, np.arange(n))
    else:
        assert not np.array_equal(a, epoch_order(kind, n, seed=7, epoch=4, blocks=blocks, window=4))
        assert not np.array_equal(a, epoch_order(kind, n, seed=8, epoch=3, blocks=blocks, window=4))


def test_orders_ignore_global_rng() -> None:
    np.random.seed(1)
    a = epoch_order("random", 100, seed=0, epoch=0)
    np.random.seed(2)
    assert np.array_equal(a, epoch_order("random", 100, seed=0, epoch=0))


def test_block_order_keeps_blocks_contiguous_with_window_one() -> None:
    blocks = np.array([0, 5, 7, 20, 21, 30])
    order = block_order(blocks, seed=1, epoch=0, window=1)
    assert _is_permutation(order, 30)
    # Cut the order where a new block starts: each piece is one whole block in storage order.
    pos = 0
    seen = []
    while pos < 30:
        block = int(np.searchsorted(blocks, order[pos], side="right")) - 1
        length = int(blocks[block + 1] - blocks[block])
        assert np.array_equal(order[pos:pos + length], np.arange(blocks[block], blocks[block + 1]))
        seen.append(block)
        pos += length
    assert sorted(seen) == list(range(5)) and seen != list(range(5))


def test_block_order_shuffles_within_windows_only() -> None:
    blocks = uniform_blocks(400, 10)  # 40 blocks
    window = 4
    order = block_order(blocks, seed=5, epoch=2, window=window)
    block_of = order // 10
    for start in range(0, 400, window * 10):
        piece = block_of[start:start + window * 10]
        assert len(np.unique(piece)) == window  # a window's samples come from exactly `window` blocks
        assert np.all(np.bincount(piece, minlength=40)[np.unique(piece)] == 10)
    # ... and samples are mixed across the window's blocks, not left in block runs.
    assert np.count_nonzero(np.diff(block_of) != 0) > 40


def test_index_blocks_cut_by_bytes_and_shards() -> None:
    rng = np.random.default_rng(0)
    sizes = rng.integers(1, 3000, 500).tolist()
    offset, size, shard = _layout(sizes, per_shard=120, alignment=512)
    block_bytes = 8192
    bounds = index_blocks(offset, size, shard, block_bytes)
    assert bounds[0] == 0 and bounds[-1] == 500 and np.all(np.diff(bounds) > 0)
    for j in range(len(bounds) - 1):
        first, last = int(bounds[j]), int(bounds[j + 1]) - 1
        assert shard[first] == shard[last]  # never across a shard boundary
        assert offset[first] // block_bytes == offset[last] // block_bytes  # one byte window
        span = int(offset[last] + size[last] - offset[first])
        assert span <= block_bytes + 3000
    # maximal: consecutive blocks differ in shard or byte window
    starts = bounds[1:-1]
    window_of = offset // block_bytes
    assert np.all((shard[starts] != shard[starts - 1]) | (window_of[starts] != window_of[starts - 1]))


def test_index_blocks_large_samples_are_own_blocks() -> None:
    offset, size, shard = _layout([10_000] * 6, per_shard=6)
    assert np.array_equal(index_blocks(offset, size, shard, 4096), np.arange(7))
    assert np.array_equal(index_blocks(offset[:0], size[:0], shard[:0]), [0])


def _all_ranks(order: np.ndarray, **kwargs: object) -> list:
    world = kwargs.pop("world_size")
    return [deal(order, rank=r, world_size=world, **kwargs) for r in range(world)]


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("n,world,batch", [(100, 3, 4), (7, 4, 1), (3, 5, 2), (64, 4, 16), (0, 2, 3)])
def test_deal_equal_shares_and_pad_drop_rule(n: int, world: int, batch: int, drop_last: bool) -> None:
    order = epoch_order("random", n, seed=1, epoch=0)
    plans = _all_ranks(order, world_size=world, batch_size=batch, drop_last=drop_last)
    assert len({len(p) for p in plans}) == 1 and len({p.num_batches for p in plans}) == 1
    got = np.concatenate([p.indices for p in plans])
    counts = np.bincount(got, minlength=n) if n else np.zeros(0, dtype=np.int64)
    if drop_last:
        kept = (n // (world * batch)) * world * batch
        assert len(got) == kept and np.all(counts <= 1)
        assert set(got.tolist()) == set(order[:kept].tolist())  # the dropped ones are the order's end
        assert all(len(p.batch(k)) == batch for p in plans for k in range(p.num_batches))
    else:
        padded = -(-n // world) * world
        assert len(got) == padded and np.all(counts >= 1)
        assert counts.sum() - n == padded - n < world  # at most world-1 repeats
        repeats = np.flatnonzero(counts > 1)
        assert set(repeats.tolist()) <= set(order[:world].tolist())  # padding wraps to the start
        last_sizes = set()
        for p in plans:  # full batches but the last, which has the same size on every rank
            sizes = [len(p.batch(k)) for k in range(p.num_batches)]
            assert all(s == batch for s in sizes[:-1])
            last_sizes.update(sizes[-1:])
        assert len(last_sizes) <= 1


def test_deal_steps_are_prefixes_of_the_global_order() -> None:
    order = epoch_order("random", 50, seed=3, epoch=1)
    plans = _all_ranks(order, world_size=2, batch_size=5)
    for step in range(5):
        both = np.concatenate([plans[0].batch(step), plans[1].batch(step)])
        assert np.array_equal(both, order[step * 10:(step + 1) * 10])


def test_batch_size_one_matches_distributed_sampler_striding() -> None:
    order = epoch_order("random", 20, seed=0, epoch=0)
    plans = _all_ranks(order, world_size=4, batch_size=1)
    for r, plan in enumerate(plans):
        assert np.array_equal(plan.indices, order[r::4])


def test_block_order_ranks_read_contiguous_runs() -> None:
    n, block = 4000, 50
    blocks = uniform_blocks(n, block)
    ro = ReadOrder("block", seed=2, batch_size=32, window=8)
    plans = [ro.plan(n, epoch=0, rank=r, world_size=4, blocks=blocks) for r in range(4)]
    for k in range(plans[0].num_batches):
        per_rank = [set((p.batch(k) // block).tolist()) for p in plans]
        # each rank's batch is sorted (coalesced reads) and touches far fewer blocks than the step
        assert all(np.all(np.diff(p.batch(k)) > 0) for p in plans)
        step_blocks = set().union(*per_rank)
        assert sum(len(b) for b in per_rank) <= len(step_blocks) + 3  # ranks share only boundary blocks
    union = np.concatenate([p.indices for p in plans])
    assert np.array_equal(np.sort(union), np.arange(n))


@pytest.mark.parametrize("kind", ORDERS)
@pytest.mark.parametrize("before,after", [((2, 8), (3, 5)), ((4, 4), (1, 16)), ((1, 3), (5, 2))])
def test_resume_with_other_world_and_batch_sees_exactly_the_rest(kind: str, before: tuple[int, int],
                                                                 after: tuple[int, int]) -> None:
    n = 397
    blocks = uniform_blocks(n, 9)
    world, batch = before
    first = ReadOrder(kind, seed=11, batch_size=batch, window=3)
    plans = [first.plan(n, epoch=5, rank=r, world_size=world, blocks=blocks) for r in range(world)]
    steps = plans[0].num_batches // 2
    seen = np.concatenate([p.indices[:p.batch_bounds[steps]] for p in plans])
    consumed = plans[0].consumed_after(steps)
    assert all(p.consumed_after(steps) == consumed for p in plans) and consumed == len(seen)
    state = first.state_dict(n, epoch=5, consumed=consumed, blocks=blocks)

    world2, batch2 = after
    second = ReadOrder(kind, seed=11, batch_size=batch2, window=3)
    epoch, start = second.check_state(state, n, blocks)
    rest = [second.plan(n, epoch=epoch, consumed=start, rank=r, world_size=world2, blocks=blocks)
            for r in range(world2)]
    assert len({len(p) for p in rest}) == 1
    remaining = np.concatenate([p.indices for p in rest])
    order = first.epoch_order(n, 5, blocks)
    assert np.array_equal(np.sort(seen), np.sort(order[:consumed]))  # what was read is the order's prefix
    pad = len(remaining) - (n - consumed)
    assert 0 <= pad < world2  # only the documented padding (from the epoch's start) repeats
    assert np.array_equal(np.sort(remaining), np.sort(np.concatenate([order[consumed:], order[:pad]])))


def test_consumed_after_end_marks_epoch_done() -> None:
    share = rank_share(10, consumed=0, world_size=4, batch_size=2, drop_last=False)
    assert (share.total, share.per_rank, share.full_steps, share.num_batches) == (12, 3, 1, 2)
    assert share.consumed_after(0) == 0 and share.consumed_after(1) == 8 and share.consumed_after(2) == 10
    assert share.consumed_after_samples(1) == 0 and share.consumed_after_samples(3) == 10
    done = rank_share(10, consumed=10, world_size=3, batch_size=2, drop_last=False)
    assert done.total == 0 and done.num_batches == 0


def test_state_dict_round_trip_and_mismatch_errors() -> None:
    ro = ReadOrder("block", seed=4, batch_size=8, window=5)
    blocks = uniform_blocks(100, 10)
    state = ro.state_dict(100, epoch=2, consumed=40, blocks=blocks)
    assert set(state) == {"version", "order", "seed", "num_samples", "epoch", "consumed", "window", "blocks"}
    assert (state["epoch"], state["consumed"], state["blocks"][:3]) == (2, 40, "10:")
    assert ReadOrder("block", seed=4, batch_size=3, window=5).check_state(state, 100, blocks) == (2, 40)
    for other, n, other_blocks in [(ReadOrder("random", seed=4), 100, blocks),
                                   (ReadOrder("block", seed=5, window=5), 100, blocks),
                                   (ReadOrder("block", seed=4, window=6), 100, blocks),
                                   (ro, 100, uniform_blocks(100, 11)), (ro, 101, uniform_blocks(101, 10))]:
        with pytest.raises(ValueError, match="resuming would not see"):
            other.check_state(state, n, other_blocks)
    plain = ReadOrder("random", seed=1).state_dict(10, epoch=0, consumed=3)
    assert "blocks" not in plain and ReadOrder("random", seed=1).check_state(plain, 10) == (0, 3)
    with pytest.raises(ValueError, match="version"):
        ro.check_state({**state, "version": 9}, 100, blocks)
    with pytest.raises(ValueError, match="exceeds"):
        ro.check_state({**state, "consumed": 101}, 100, blocks)


@pytest.mark.parametrize("bad", [dict(kind="shuffle"), dict(seed=-1), dict(batch_size=0), dict(window=0)])
def test_read_order_rejects_bad_settings(bad: dict) -> None:
    with pytest.raises(ValueError):
        ReadOrder(**bad)


def test_deal_rejects_bad_rank() -> None:
    with pytest.raises(ValueError, match="rank 2 out of range"):
        deal(np.arange(10), rank=2, world_size=2)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 300), world=st.integers(1, 6), batch=st.integers(1, 9), drop_last=st.booleans(),
       kind=st.sampled_from(ORDERS), seed=st.integers(0, 2**32), cut=st.floats(0, 1), world2=st.integers(1, 6),
       batch2=st.integers(1, 9))
def test_resume_property(n: int, world: int, batch: int, drop_last: bool, kind: str, seed: int, cut: float,
                         world2: int, batch2: int) -> None:
    blocks = uniform_blocks(n, 7)
    first = ReadOrder(kind, seed=seed, batch_size=batch, drop_last=drop_last, window=2)
    plans = [first.plan(n, epoch=1, rank=r, world_size=world, blocks=blocks) for r in range(world)]
    assert len({p.num_batches for p in plans}) == 1 and len({len(p) for p in plans}) == 1
    steps = int(plans[0].num_batches * cut)
    seen = np.concatenate([p.indices[:p.batch_bounds[steps]] for p in plans]).astype(np.int64)
    consumed = plans[0].consumed_after(steps)
    second = ReadOrder(kind, seed=seed, batch_size=batch2, drop_last=drop_last, window=2)
    rest = [second.plan(n, epoch=1, consumed=consumed, rank=r, world_size=world2, blocks=blocks)
            for r in range(world2)]
    assert len({p.num_batches for p in rest}) == 1 and len({len(p) for p in rest}) == 1
    remaining = np.concatenate([p.indices for p in rest]).astype(np.int64)
    order = first.epoch_order(n, 1, blocks)
    if steps < plans[0].num_batches:
        assert np.array_equal(np.sort(seen), np.sort(order[:consumed]))
        tail = order[consumed:]
        if drop_last:  # the rest minus a dropped end
            assert len(remaining) % (world2 * batch2) == 0 and len(tail) - len(remaining) < world2 * batch2
            assert np.array_equal(np.sort(remaining), np.sort(tail[:len(remaining)]))
        else:  # the rest plus padding from the epoch's start
            pad = len(remaining) - len(tail)
            assert 0 <= pad < world2
            wrap = order[np.arange(pad) % n] if n else order[:0]
            assert np.array_equal(np.sort(remaining), np.sort(np.concatenate([tail, wrap])))
    else:
        assert consumed == n and len(remaining) == 0


# --- the shared cursor every reader delegates to (EpochCursor, CursorReader) ---------------------

from packer.errors import OptionError  # noqa: E402
from packer.order import CursorReader, EpochCursor, Position, check_epoch  # noqa: E402


@pytest.mark.parametrize("bad", [-1, True, 1.0, "2", None])
def test_check_epoch_refuses_what_is_not_a_non_negative_integer(bad: object) -> None:
    with pytest.raises(OptionError) as caught:
        check_epoch(bad)
    assert str(caught.value) == f"epoch must be a non-negative integer, got {bad!r}"
    assert check_epoch(0) == 0 and check_epoch(np.int64(3)) == 3


def _batches(plan) -> list[list[int]]:
    return [plan.batch(k).tolist() for k in range(plan.num_batches)]


def test_epoch_cursor_defaults_and_argument_errors() -> None:
    order = ReadOrder("sequential", batch_size=2)
    cursor = EpochCursor(order, 10)
    assert (cursor.rank, cursor.world_size, cursor.count_samples, cursor.handed_out) == (0, 1, False, 0)
    assert (cursor.epoch, cursor.start, cursor.num_samples) == (0, 0, 10)
    assert _batches(cursor.plan()) == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]  # all of it: rank 0 of 1
    cases = [({"world_size": 0}, "world_size must be a positive integer, got 0"),
             ({"rank": -1}, "rank must be a non-negative integer, got -1"),
             ({"rank": 2, "world_size": 2}, "rank 2 out of range for world_size 2"),
             ({"num_samples": -3}, "num_samples must be a non-negative integer, got -3")]
    for changes, message in cases:
        kwargs = {"rank": 0, "world_size": 1, **changes}
        num_samples = kwargs.pop("num_samples", 10)
        with pytest.raises(OptionError) as caught:
            EpochCursor(order, num_samples, **kwargs)
        assert str(caught.value) == message
    rank1 = EpochCursor(order, 10, rank=1, world_size=2).plan()
    assert rank1.indices.tolist() == deal(np.arange(10), rank=1, world_size=2, batch_size=2).indices.tolist()
    assert _batches(rank1)[:2] == [[2, 3], [6, 7]]


def test_epoch_cursor_counts_handed_out_items_and_resets_per_epoch() -> None:
    order = ReadOrder("sequential", batch_size=2)
    cursor = EpochCursor(order, 10)
    cursor.handed_out = 2  # two batches of this iteration were handed out
    assert cursor.consumed() == 4 and cursor.state_dict()["consumed"] == 4
    assert cursor.consumed(samples=5) == 4 and cursor.consumed(batches=3) == 6
    assert cursor.state_dict(samples=6)["consumed"] == 6 and cursor.state_dict(batches=1)["consumed"] == 2
    with pytest.raises(OptionError) as caught:
        cursor.consumed(batches=1, samples=2)
    assert str(caught.value) == "give batches or samples consumed, not both"
    samples = EpochCursor(order, 10, count_samples=True)
    samples.handed_out = 5  # five samples: two whole batches
    assert samples.consumed() == 4
    cursor.set_epoch(0)  # the same epoch: the count stands
    assert cursor.handed_out == 2
    cursor.set_epoch(1)  # another epoch starts from nothing handed out
    assert (cursor.handed_out, cursor.epoch, cursor.start) == (0, 1, 0)
    cursor.handed_out = 1
    cursor.load_state_dict(cursor.state_dict())
    assert cursor.handed_out == 0 and cursor.start == 2


def test_epoch_cursor_plans_from_the_loaded_position_only_in_its_epoch() -> None:
    order = ReadOrder("random", seed=5, batch_size=2)
    cursor = EpochCursor(order, 12)
    saved = EpochCursor(order, 12)
    saved.set_epoch(3)
    cursor.load_state_dict(saved.state_dict(batches=2))  # epoch 3, 4 samples consumed
    assert (cursor.epoch, cursor.start) == (3, 4)
    full = epoch_order(order.kind, 12, seed=5, epoch=3).tolist()
    assert cursor.plan().indices.tolist() == full[4:]
    assert cursor.plan(epoch=3, start=0).indices.tolist() == full
    assert cursor.plan(epoch=4).indices.tolist() == epoch_order(order.kind, 12, seed=5, epoch=4).tolist()
    assert cursor.plan(start=6).indices.tolist() == full[6:]
    cursor.set_epoch(3)  # selecting the loaded epoch keeps the position
    assert cursor.start == 4
    cursor.set_epoch(4)
    assert (cursor.epoch, cursor.start) == (4, 0)
    cursor.set_epoch(3)  # back to 3: its saved position is gone, it starts at 0
    assert cursor.start == 0


def test_cursor_reader_state_dict_passes_samples_consumed() -> None:
    class Reader(CursorReader):
        def __init__(self) -> None:
            self.cursor = EpochCursor(ReadOrder("sequential", batch_size=2), 10, position=Position())

    reader = Reader()
    assert reader.state_dict(samples_consumed=5)["consumed"] == 4
    assert reader.state_dict(batches_consumed=1)["consumed"] == 2
    assert reader.state_dict()["consumed"] == 0
