"""Tests written for the survivors of ``scripts/mutate.py`` (mutmut), module by module (issue #16).

Most compare a function with a small, obviously right reference written from its docstring,
over a grid of inputs that includes the edge cases (zero samples, a last partial batch, padding
that wraps around, empty blocks), and check that bad arguments get the error that names them.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable

import numpy as np
import pytest
import xxhash

from packer import order as order_module
from packer.order import (DEFAULT_BLOCK_SAMPLES, STATE_VERSION, RankPlan, ReadOrder, block_order, deal,
                          epoch_order, epoch_rng, index_blocks, random_order, rank_share, sequential_order,
                          uniform_blocks)


# === order =====================================================================================

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
    for given in ([4, 2, 0, 1, 3], np.array([4, 2, 0, 1, 3], dtype=np.int32)):
        got = deal(given, world_size=2, batch_size=2)
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
    ("batch_size", lambda v: ReadOrder(batch_size=v), "positive"),
    ("epoch", lambda v: ReadOrder().state_dict(5, epoch=v, consumed=0), "non-negative"),
    ("consumed", lambda v: ReadOrder().state_dict(5, epoch=0, consumed=v), "non-negative"),
]


@pytest.mark.parametrize("name, call, kind", BAD_ARGUMENTS,
                         ids=[f"{i}-{name}" for i, (name, _, _) in enumerate(BAD_ARGUMENTS)])
def test_bad_arguments_are_named(name: str, call: Callable[[Any], Any], kind: str) -> None:
    bad = [-1, 1.5, True, "3"] if kind == "non-negative" else [0, -2, 2.0, False, None]
    for value in bad:
        with pytest.raises(ValueError, match=f"^{name} must be a {kind} integer, got {value!r}$"):
            call(value)
    call(np.int64(1))  # numpy integers are integers


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
