"""Read orders (packer.order): determinism, block locality, equal rank shares, exact resumption."""

from __future__ import annotations

import subprocess
import sys
from typing import Any, Callable

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from packer import order as order_module
from packer.order import (
                          DEFAULT_BLOCK_SAMPLES,
                          ORDERS,
                          STATE_VERSION,
                          ReadOrder,
                          block_order,
                          deal,
                          epoch_order,
                          epoch_rng,
                          index_blocks,
                          random_order,
                          rank_share,
                          sequential_order,
                          uniform_blocks,
)


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


# --- order ----------------------------------------------------------------------------------------


def reference_block_order(bounds: list[int], seed: int, epoch: int, window: int) -> np.ndarray:
    """The docstring's rule with plain loops: shuffle blocks, then samples within each window."""
    rng = np.random.Generator(np.random.PCG64([seed, epoch]))
    count = bounds[-1]
    if count == 0:
        return np.zeros(0, dtype=np.int64)
    perm = rng.permutation(len(bounds) - 1)
    placed = [list(range(bounds[p], bounds[p + 1])) for p in perm]
    order = np.array([i for block in placed for i in block], dtype=np.int64)
    if window > 1:
        start = 0
        for w in range(0, len(placed), window):
            end = start + sum(len(b) for b in placed[w:w + window])
            rng.shuffle(order[start:end])
            start = end
    return order


BLOCK_LAYOUTS = [[0, 5], [0, 3, 3, 7], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [0, 4, 8, 12, 13],
                 [0, 2, 9, 10, 15, 21, 22, 30]]


@pytest.mark.parametrize("bounds", BLOCK_LAYOUTS)
@pytest.mark.parametrize("window", [1, 2, 3, 4, 32])
def test_block_order_matches_the_reference(bounds: list[int], window: int) -> None:
    for seed, epoch in [(0, 0), (3, 1), (11, 7)]:
        got = block_order(np.array(bounds), seed=seed, epoch=epoch, window=window)
        assert got.dtype == np.int64
        assert got.tolist() == reference_block_order(bounds, seed, epoch, window).tolist()
        assert sorted(got.tolist()) == list(range(bounds[-1]))


def test_block_order_accepts_any_integer_boundaries() -> None:
    expected = block_order(np.array([0, 4, 9, 12], dtype=np.int64), seed=5, epoch=2, window=1)
    for blocks in ([0, 4, 9, 12], np.array([0, 4, 9, 12], dtype=np.uint64), np.array([0, 4, 9, 12], dtype=np.int32)):
        got = block_order(blocks, seed=5, epoch=2, window=1)
        assert got.dtype == np.int64 and got.tolist() == expected.tolist()
    # window=1: each block stays in storage order, contiguous
    where = np.argsort(expected)
    for a, b in ((0, 4), (4, 9), (9, 12)):
        assert np.all(np.diff(where[a:b]) == 1)


def test_block_order_with_no_samples() -> None:
    for blocks in ([0], [0, 0], [0, 0, 0]):
        got = block_order(np.array(blocks), seed=1, epoch=1, window=2)
        assert got.dtype == np.int64 and got.shape == (0,)
    for window in (1, 2):
        assert block_order(np.array([0, 1]), seed=1, epoch=1, window=window).tolist() == [0]
        assert block_order(np.array([0, 0, 1]), seed=1, epoch=1, window=window).tolist() == [0]


@pytest.mark.parametrize("blocks", [[], [1, 3], [0, 5, 3], [[0, 2], [2, 4]]])
def test_block_order_refuses_bad_boundaries(blocks: Any) -> None:
    with pytest.raises(ValueError, match="^blocks must be non-decreasing boundaries starting at 0$"):
        block_order(np.array(blocks, dtype=np.int64), seed=0, epoch=0)


def test_epoch_order_kinds_and_defaults() -> None:
    n = 300
    assert epoch_order("sequential", n).tolist() == list(range(n))
    assert epoch_order("random", n).tolist() == random_order(n, seed=0, epoch=0).tolist()
    assert epoch_order("random", n, seed=2, epoch=3).tolist() == random_order(n, seed=2, epoch=3).tolist()
    default_blocks = uniform_blocks(n)
    assert epoch_order("block", n).tolist() == block_order(default_blocks, seed=0, epoch=0).tolist()
    assert (epoch_order("block", n, seed=4, epoch=5, window=3).tolist()
            == block_order(default_blocks, seed=4, epoch=5, window=3).tolist())
    blocks = np.array([0, 100, 250, 300])
    assert (epoch_order("block", n, seed=1, epoch=2, blocks=blocks, window=2).tolist()
            == block_order(blocks, seed=1, epoch=2, window=2).tolist())
    with pytest.raises(ValueError, match=r"^blocks cover 250 samples, expected 300$"):
        epoch_order("block", n, blocks=np.array([0, 100, 250]))
    with pytest.raises(ValueError, match=r"^unknown order 'shuffle'; choose one of \['sequential', 'random', 'block'\]$"):
        epoch_order("shuffle", n)


def reference_deal(order: list[int], consumed: int, rank: int, world: int, batch: int, drop_last: bool,
                   sort_steps: bool) -> tuple[list[int], list[int]]:
    """The module docstring's dealing rule, step by step: (indices, batch bounds)."""
    n = len(order)
    consumed = min(consumed, n)
    remaining = n - consumed
    if drop_last:
        total = remaining // (world * batch) * world * batch
    else:
        total = -(-remaining // world) * world
    sequence = [order[(consumed + i) % n] if consumed + i >= n else order[consumed + i] for i in range(total)]
    if consumed + total > n:
        sequence = order[consumed:] + [order[i % n] for i in range(consumed + total - n)]
    mine, bounds = [], [0]
    step = world * batch
    for s in range(0, total, step):
        chunk = sequence[s:s + step]
        if sort_steps:
            chunk = sorted(chunk)
        per = len(chunk) // world
        mine += chunk[rank * per:(rank + 1) * per]
        bounds.append(len(mine))
    return mine, bounds


DEAL_CASES = [(n, consumed, world, batch, drop)
              for n in (0, 1, 7, 12, 13)
              for consumed in (0, 3, 12, 20)
              for world in (1, 2, 3)
              for batch in (1, 2, 4)
              for drop in (False, True)]


@pytest.mark.parametrize("sort_steps", [False, True])
def test_deal_matches_the_reference(sort_steps: bool) -> None:
    for n, consumed, world, batch, drop in DEAL_CASES:
        order = np.random.default_rng(n).permutation(n).tolist()
        for rank in range(world):
            given = np.array(order, dtype=np.int64)
            plan = deal(given, consumed=consumed, rank=rank, world_size=world, batch_size=batch,
                        drop_last=drop, sort_steps=sort_steps)
            indices, bounds = reference_deal(order, consumed, rank, world, batch, drop, sort_steps)
            case = (n, consumed, world, batch, drop, rank)
            assert plan.indices.tolist() == indices, case
            assert plan.batch_bounds.tolist() == bounds, case
            assert plan.indices.dtype == np.int64 and plan.batch_bounds.dtype == np.int64, case
            assert given.tolist() == order, "deal must never reorder the caller's array"
            assert len(plan) == len(indices) and plan.num_batches == len(bounds) - 1
            share = plan.share
            assert share == rank_share(n, consumed=consumed, world_size=world, batch_size=batch, drop_last=drop)


def test_deal_defaults_and_input_types() -> None:
    plan = deal(np.array([4, 2, 0, 1, 3]))
    assert plan.indices.tolist() == [4, 2, 0, 1, 3] and plan.batch_bounds.tolist() == [0, 1, 2, 3, 4, 5]
    for indices in ([4, 2, 0, 1, 3], np.array([4, 2, 0, 1, 3], dtype=np.int32)):
        got = deal(indices, world_size=2, batch_size=2)
        assert got.indices.dtype == np.int64
        assert got.indices.tolist() == [4, 2, 3] and got.batch_bounds.tolist() == [0, 2, 3]


def test_rank_share_arithmetic() -> None:
    for n, consumed, world, batch, drop in DEAL_CASES:
        share = rank_share(n, consumed=consumed, world_size=world, batch_size=batch, drop_last=drop)
        remaining = n - min(consumed, n)
        total = remaining // (world * batch) * world * batch if drop else -(-remaining // world) * world
        assert share.consumed == min(consumed, n)
        assert share.total == total and share.per_rank == total // world and type(share.per_rank) is int
        assert share.full_steps == total // (world * batch)
        assert share.num_batches == -(-share.per_rank // batch)
        for batches in range(share.num_batches + 2):
            expected = n if batches >= share.num_batches else share.consumed + batches * world * batch
            assert share.consumed_after(batches) == expected
        for samples in range(share.per_rank + 2):
            expected = n if samples >= share.per_rank else share.consumed_after(samples // batch)
            assert share.consumed_after_samples(samples) == expected


def test_rank_plan_batches_and_workers() -> None:
    plan = deal(np.arange(10), world_size=1, batch_size=3)
    assert [plan.batch(k).tolist() for k in range(plan.num_batches)] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    for k in (-1, 4):
        with pytest.raises(IndexError, match=f"^batch {k} out of range: this rank has 4 batches$"):
            plan.batch(k)
    assert list(plan.worker_batches(0, 1)) == [0, 1, 2, 3]
    assert list(plan.worker_batches(0, 3)) == [0, 3] and list(plan.worker_batches(2, 3)) == [2]
    assert list(plan.worker_batches(1, 2)) == [1, 3]
    for worker, workers in ((3, 3), (-1, 2)):
        with pytest.raises(ValueError, match=f"^worker {worker} out of range for {workers} workers$"):
            plan.worker_batches(worker, workers)
    with pytest.raises(ValueError, match="^num_workers must be a positive integer, got 0$"):
        plan.worker_batches(0, 0)
    assert plan.consumed_after(2) == 6 and plan.consumed_after_samples(7) == 6
    assert plan.consumed_after_samples(10) == 10


def test_read_order_delegates_with_its_settings() -> None:
    reader = ReadOrder(kind="random", seed=9, batch_size=2, drop_last=True)
    assert reader.epoch_order(20, 3).tolist() == random_order(20, seed=9, epoch=3).tolist()
    got = reader.plan(20, epoch=3, consumed=4, rank=1, world_size=3)
    expected = deal(random_order(20, seed=9, epoch=3), consumed=4, rank=1, world_size=3, batch_size=2, drop_last=True)
    assert got.indices.tolist() == expected.indices.tolist() and got.share == expected.share
    assert reader.share(20, consumed=4, world_size=3) == expected.share
    assert reader.share(20) == rank_share(20, consumed=0, world_size=1, batch_size=2, drop_last=True)
    first = reader.plan(20, epoch=3)
    assert first.indices.tolist() == deal(random_order(20, seed=9, epoch=3), batch_size=2, drop_last=True).indices.tolist()
    blocked = ReadOrder(kind="block", seed=1, window=2)
    blocks = np.array([0, 5, 10, 20])
    assert (blocked.epoch_order(20, 1, blocks).tolist() == block_order(blocks, seed=1, epoch=1, window=2).tolist())
    plan = blocked.plan(20, epoch=1, world_size=2, blocks=blocks)
    assert plan.indices.tolist() == deal(block_order(blocks, seed=1, epoch=1, window=2), world_size=2,
                                         sort_steps=True).indices.tolist()
    done = reader.plan(20, epoch=0, consumed=20)
    assert done.indices.dtype == np.int64 and len(done) == 0 and done.batch_bounds.tolist() == [0]


def test_state_dict_is_exact() -> None:
    assert ReadOrder(kind="random", seed=3).state_dict(50, epoch=2, consumed=60) == {
        "version": STATE_VERSION, "order": "random", "seed": 3, "num_samples": 50, "epoch": 2, "consumed": 50}
    blocks = np.array([0, 10, 50])
    fingerprint = f"2:{xxhash.xxh3_64_intdigest(np.array([0, 10, 50], dtype='<i8').tobytes()):016x}"
    state = ReadOrder(kind="block", seed=3, window=4).state_dict(50, epoch=1, consumed=5, blocks=blocks)
    assert state == {"version": STATE_VERSION, "order": "block", "seed": 3, "num_samples": 50, "epoch": 1,
                     "consumed": 5, "window": 4, "blocks": fingerprint}
    # the fingerprint is of the boundaries, whatever integer type the caller holds them in
    for same in ([0, 10, 50], blocks.astype(np.int32), blocks.astype(np.uint64)):
        assert ReadOrder(kind="block", seed=3, window=4).state_dict(50, epoch=1, consumed=5, blocks=same) == state
    default = ReadOrder(kind="block").state_dict(200, epoch=0, consumed=0)
    assert default["blocks"] == ReadOrder(kind="block").state_dict(200, epoch=0, consumed=0,
                                                                   blocks=uniform_blocks(200))["blocks"]


def test_check_state_accepts_its_own_and_refuses_others() -> None:
    reader = ReadOrder(kind="block", seed=3, window=4)
    blocks = np.array([0, 10, 50])
    state = reader.state_dict(50, epoch=6, consumed=50, blocks=blocks)
    assert reader.check_state(state, 50, blocks) == (6, 50)  # a finished epoch is a valid position
    assert reader.check_state({**state, "consumed": 0, "epoch": 0}, 50, blocks) == (0, 0)
    for key, value in (("order", "random"), ("seed", 4), ("num_samples", 51), ("window", 5), ("blocks", "2:0")):
        with pytest.raises(ValueError, match=f"^the saved state has {key}={value!r} but this reader has "
                                             f"{state[key]!r}; resuming would not"):
            reader.check_state({**state, key: value}, 50, blocks)
    with pytest.raises(ValueError, match=r"^read-order state version 2 is not 1$"):
        reader.check_state({**state, "version": 2}, 50, blocks)
    with pytest.raises(ValueError, match="^a read-order state must be a dict, got list$"):
        reader.check_state([], 50, blocks)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="^consumed=51 exceeds the 50 samples of an epoch$"):
        reader.check_state({**state, "consumed": 51}, 50, blocks)
    for key in ("epoch", "consumed"):
        with pytest.raises(ValueError, match=f"^{key} must be a non-negative integer, got -1$"):
            reader.check_state({**state, key: -1}, 50, blocks)


# Every public entry point names the argument it refuses (house rule: the message names the option).
BAD_ARGUMENTS: list[tuple[str, Callable[[Any], Any], str]] = [
    ("seed", lambda v: epoch_rng(v, 0), "non-negative"),
    ("epoch", lambda v: epoch_rng(0, v), "non-negative"),
    ("num_samples", lambda v: sequential_order(v), "non-negative"),
    ("num_samples", lambda v: random_order(v, seed=0, epoch=0), "non-negative"),
    ("num_samples", lambda v: epoch_order("random", v), "non-negative"),
    ("num_samples", lambda v: uniform_blocks(v), "non-negative"),
    ("block_samples", lambda v: uniform_blocks(10, v), "positive"),
    ("block_bytes", lambda v: index_blocks(np.zeros(1), np.zeros(1), np.zeros(1), v), "positive"),
    ("window", lambda v: block_order(np.array([0, 3]), seed=0, epoch=0, window=v), "positive"),
    ("num_samples", lambda v: rank_share(v, consumed=0, world_size=1, batch_size=1, drop_last=False), "non-negative"),
    ("consumed", lambda v: rank_share(5, consumed=v, world_size=1, batch_size=1, drop_last=False), "non-negative"),
    ("world_size", lambda v: rank_share(5, consumed=0, world_size=v, batch_size=1, drop_last=False), "positive"),
    ("batch_size", lambda v: rank_share(5, consumed=0, world_size=1, batch_size=v, drop_last=False), "positive"),
    ("world_size", lambda v: deal(np.arange(4), world_size=v), "positive"),
    ("rank", lambda v: deal(np.arange(4), rank=v, world_size=4), "non-negative"),
    ("batches", lambda v: rank_share(5, consumed=0, world_size=1, batch_size=1, drop_last=False).consumed_after(v),
     "non-negative"),
    ("samples", lambda v: rank_share(5, consumed=0, world_size=1, batch_size=1,
                                     drop_last=False).consumed_after_samples(v), "non-negative"),
    ("seed", lambda v: ReadOrder(seed=v), "non-negative"),
    ("block_bytes", lambda v: ReadOrder(block_bytes=v), "positive"),
    ("window", lambda v: ReadOrder(window=v), "positive"),
    ("batch_size", lambda v: ReadOrder(batch_size=v), "positive or None"),
    ("block_samples", lambda v: ReadOrder(block_samples=v), "positive or None"),
    ("epoch", lambda v: ReadOrder().state_dict(5, epoch=v, consumed=0), "non-negative"),
    ("consumed", lambda v: ReadOrder().state_dict(5, epoch=0, consumed=v), "non-negative"),
]


@pytest.mark.parametrize("name, call, kind", BAD_ARGUMENTS,
                         ids=[f"{i}-{name}" for i, (name, _, _) in enumerate(BAD_ARGUMENTS)])
def test_bad_arguments_are_named(name: str, call: Callable[[Any], Any], kind: str) -> None:
    optional = kind.endswith(" or None")  # None: "the reader's own" (ReadOrder.batch_size, block_samples)
    kind = kind.removesuffix(" or None")
    bad = [-1, 1.5, True, "3"] if kind == "non-negative" else [0, -2, 2.0, False] + ([] if optional else [None])
    for value in bad:
        with pytest.raises(ValueError, match=f"^{name} must be a {kind} integer, got {value!r}$"):
            call(value)
    call(np.int64(1))  # numpy integers are integers
    if optional:
        call(None)


def test_unknown_read_order_kind() -> None:
    with pytest.raises(ValueError, match=r"^unknown order 'rand'; choose one of \['sequential', 'random', 'block'\]$"):
        ReadOrder(kind="rand")


def test_index_blocks_edges() -> None:
    with pytest.raises(ValueError, match="^offset, size and shard must have the same length$"):
        index_blocks(np.zeros(3), np.zeros(2), np.zeros(3))
    with pytest.raises(ValueError, match="^offset, size and shard must have the same length$"):
        index_blocks(np.zeros(3), np.zeros(3), np.zeros(2))
    empty = index_blocks(np.zeros(0), np.zeros(0), np.zeros(0))
    assert empty.dtype == np.int64 and empty.tolist() == [0]
    # offsets past 2^53 (a 9 PB shard is absurd, but the column is u64): no float rounding merges windows
    big = np.array([2**60, 2**60 + 1], dtype=np.uint64)
    assert index_blocks(big.tolist(), [1, 1], [0, 0], block_bytes=1).tolist() == [0, 1, 2]
    got = index_blocks(np.array([0, 4096, 8192, 1 << 20, (1 << 20) + 4096, 3 << 20], dtype=np.uint64),
                       np.full(6, 4096), np.zeros(6, dtype=np.uint32), block_bytes=1 << 20)
    assert got.dtype == np.int64 and got.tolist() == [0, 3, 5, 6]


def test_small_orders_have_exact_types() -> None:
    assert sequential_order(4).dtype == np.int64 and sequential_order(0).tolist() == []
    blocks = uniform_blocks(130)
    assert blocks.dtype == np.int64 and blocks.tolist() == [0, 64, 128, 130]
    assert uniform_blocks(10, 5).tolist() == [0, 5, 10] and uniform_blocks(0).tolist() == [0]
    assert DEFAULT_BLOCK_SAMPLES == 64
    assert random_order(5, seed=1, epoch=1).dtype == np.int64
    assert order_module.epoch_rng(np.int64(2), np.int64(3)).integers(1000) == \
        np.random.Generator(np.random.PCG64([2, 3])).integers(1000)


# --- order: blocks are cut at shard boundaries; epochs seeded by (seed, epoch) --------------------


def test_index_blocks_cut_at_shard_boundaries_even_inside_one_window() -> None:
    """Mutant: no cut where ``shard`` changes (tests only had shards bigger than a block)."""
    offset = np.array([4096, 8192, 12288, 4096, 8192, 4096], dtype=np.uint64)
    size = np.full(6, 100, dtype=np.uint64)
    shard = np.array([0, 0, 0, 1, 1, 2], dtype=np.uint32)
    blocks = index_blocks(offset, size, shard, block_bytes=1 << 20)
    assert blocks.tolist() == [0, 3, 5, 6]
    # a shard change where the offset falls in a different window is one cut, not two
    offset2 = np.array([4096, 8 << 20, 4096], dtype=np.uint64)
    assert index_blocks(offset2, size[:3], np.array([0, 0, 1]), block_bytes=1 << 20).tolist() == [0, 1, 2, 3]


def test_epoch_orders_are_seeded_by_the_pair_not_the_sum() -> None:
    """Mutant: ``PCG64(seed + epoch)``: seed 7 epoch 4 would equal seed 8 epoch 3."""
    n = 1000
    assert not np.array_equal(random_order(n, seed=7, epoch=4), random_order(n, seed=8, epoch=3))
    assert not np.array_equal(random_order(n, seed=0, epoch=1), random_order(n, seed=1, epoch=0))
    # the documented generator, exactly: PCG64([seed, epoch])
    expected = np.random.Generator(np.random.PCG64([7, 4])).permutation(n)
    assert np.array_equal(random_order(n, seed=7, epoch=4), expected)
    assert epoch_rng(7, 4).integers(1 << 62) == np.random.Generator(np.random.PCG64([7, 4])).integers(1 << 62)
    blocks = np.arange(0, n + 1, 10, dtype=np.int64)
    assert not np.array_equal(block_order(blocks, seed=7, epoch=4), block_order(blocks, seed=8, epoch=3))
    assert not np.array_equal(epoch_order("random", n, seed=7, epoch=4), epoch_order("random", n, seed=8, epoch=3))
