"""Tests written for the survivors of ``scripts/mutate.py`` (mutmut), module by module (issue #16).

Most compare a function with a small, obviously right reference written from its docstring,
over a grid of inputs that includes the edge cases (zero samples, a last partial batch, padding
that wraps around, empty blocks), and check that bad arguments get the error that names them.
"""

from __future__ import annotations

import json
import re
import struct
from typing import Any, Callable

import numpy as np
import pytest
import xxhash

from packer import format as fmt
from packer import order as order_module
from packer.errors import (ChecksumMismatchError, CorruptHeaderError, ManifestError, NotAPackerFileError,
                           PackerError, TruncatedFileError, UnsafePathError, UnsupportedVersionError)
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


# === format ====================================================================================


WHERE = "/data/ds/shards/shard-00000-0000000000000000.pks"


def header_bytes(**fields: int) -> bytes:
    values = {"version": 1, "alignment": 4096, "data_offset": 4096, "count": 3, "file_size": 3 * 4096,
              "number": 0, **fields}
    return struct.pack("<8sIIQQQI20x", fields.get("magic", fmt.SHARD_MAGIC), values["version"], values["alignment"],
                       values["data_offset"], values["count"], values["file_size"], values["number"])


SHARD_HEADER_CASES = [
    (b"", NotAPackerFileError, "not a packer shard (starts with b'')"),
    (b"junkjunkjunkjunkjunk", NotAPackerFileError, "not a packer shard (starts with b'junkjunk')"),
    (fmt.SHARD_MAGIC + b"\x01\x00", TruncatedFileError, "shard is 10 bytes, shorter than its 64-byte header"),
    (header_bytes(magic=b"PKINDEX\x00"), NotAPackerFileError, "not a packer shard (starts with b'PKINDEX\\x00')"),
    (header_bytes(version=2), UnsupportedVersionError,
     "shard format version 2 is not supported (this reader accepts [1]); upgrade packer"),
    (header_bytes(alignment=3), CorruptHeaderError, "alignment must be a power of two between 1 and 16777216, got 3"),
    (header_bytes(data_offset=64), CorruptHeaderError, "data_offset 64 must be 4096 for alignment 4096"),
    (header_bytes(count=0), CorruptHeaderError, f"sample_count 0 outside 1..{fmt.MAX_SAMPLES}"),
    (header_bytes(count=fmt.MAX_SAMPLES + 1), CorruptHeaderError,
     f"sample_count {fmt.MAX_SAMPLES + 1} outside 1..{fmt.MAX_SAMPLES}"),
    (header_bytes(file_size=4096), CorruptHeaderError,
     "file_size 4096 must be a multiple of 4096, hold at least one sample and be below 2^62"),
    (header_bytes(file_size=3 * 4096 + 1), CorruptHeaderError,
     "file_size 12289 must be a multiple of 4096, hold at least one sample and be below 2^62"),
    (header_bytes(alignment=1, data_offset=64, file_size=64), CorruptHeaderError,
     "file_size 64 must be a multiple of 1, hold at least one sample and be below 2^62"),
    (header_bytes(alignment=1, data_offset=64, file_size=fmt.MAX_FILE_SIZE + 1), CorruptHeaderError,
     f"file_size {fmt.MAX_FILE_SIZE + 1} must be a multiple of 1, hold at least one sample and be below 2^62"),
]


@pytest.mark.parametrize("head, error, message", SHARD_HEADER_CASES,
                         ids=[f"case{i}" for i in range(len(SHARD_HEADER_CASES))])
def test_shard_header_errors_are_exact_and_name_the_file(head: bytes, error: type, message: str) -> None:
    with pytest.raises(error) as caught:
        fmt.ShardHeader.parse(head, path=WHERE)
    assert type(caught.value) is error
    assert caught.value.message == message and caught.value.path == WHERE


def test_shard_header_size_on_disk_and_limits() -> None:
    for actual, word in ((2 * 4096, "truncated"), (4 * 4096, "extended")):
        with pytest.raises(TruncatedFileError) as caught:
            fmt.ShardHeader.parse(header_bytes(), path=WHERE, actual_size=actual)
        assert caught.value.message == f"shard is {actual} bytes on disk but its header says 12288 ({word})"
        assert caught.value.path == WHERE
    # the largest values each rule allows are accepted
    top = fmt.ShardHeader.parse(header_bytes(alignment=1, data_offset=64, count=fmt.MAX_SAMPLES,
                                             file_size=fmt.MAX_FILE_SIZE, number=7))
    assert (top.alignment, top.sample_count, top.file_size, top.shard_number) == (1, fmt.MAX_SAMPLES,
                                                                                   fmt.MAX_FILE_SIZE, 7)
    smallest = fmt.ShardHeader.parse(header_bytes(alignment=1, data_offset=64, count=1, file_size=65))
    assert smallest.file_size == 65 and smallest.version == 1
    assert fmt.ShardHeader.parse(header_bytes(), actual_size=12288).encode()[:64] == header_bytes()


def manifest_dict(**changes: Any) -> dict[str, Any]:
    shard = {"path": "shards/shard-00000-00000000000000aa.pks", "size": 8192, "checksum": "00000000000000bb",
             "sample_count": 2}
    base: dict[str, Any] = {
        "format": "packer-dataset", "format_version": 1, "checksum_algorithm": "xxh3_64", "alignment": 4096,
        "sample_count": 2, "codec": {"name": "passthrough"}, "classes": ["a"],
        "index": {"path": "index-00000000000000cc.pki", "size": 100, "checksum": "00000000000000dd"},
        "shards": [shard], "created_by": "test"}
    base.update(changes)
    return base


MANIFEST_PATH = "/data/ds/manifest.json"


def manifest_error(obj: Any) -> Any:
    data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    with pytest.raises(PackerError) as caught:
        fmt.parse_manifest(data, path=MANIFEST_PATH)
    assert caught.value.path == MANIFEST_PATH, "every manifest error names the manifest"
    return caught.value


def test_manifest_errors_are_exact() -> None:
    junk = manifest_error(b"PK\x03\x04 this is a zip file")
    assert isinstance(junk, NotAPackerFileError)
    assert junk.message == "not a packer manifest (starts with b'PK\\x03\\x04 this is a z')"
    null = manifest_error(manifest_dict(format_version=None))
    assert null.message == "manifest field 'format_version' must be an integer, got null"
    assert manifest_error(manifest_dict(alignment=True)).message == \
        "manifest field 'alignment' must be an integer, got a boolean"
    missing = manifest_dict()
    del missing["checksum_algorithm"]
    assert manifest_error(missing).message == "manifest lacks required field 'checksum_algorithm'"
    assert manifest_error(manifest_dict(sample_count=-1)).message == \
        f"manifest field 'sample_count' = -1 outside 0..{fmt.MAX_SAMPLES}"
    bad_index = manifest_dict(index={"path": "index-00000000000000cc.pki", "size": 100, "checksum": "DD"})
    assert manifest_error(bad_index).message == "index checksum must be 16 lowercase hex digits, got 'DD'"
    bad_path = manifest_dict(index={"path": "index.pki", "size": 100, "checksum": "00000000000000dd"})
    error = manifest_error(bad_path)
    assert isinstance(error, UnsafePathError)
    assert error.message == ("index path 'index.pki' is not a valid dataset path (expected "
                             "index-<16 hex digits>.pki, relative, inside the dataset)")
    shard = dict(manifest_dict()["shards"][0], path="shards/x.pks")
    assert manifest_error(manifest_dict(shards=[shard])).message == (
        "shard 0 path 'shards/x.pks' is not a valid dataset path (expected "
        "shards/shard-<number, at least 5 digits>-<16 hex digits>.pks, relative, inside the dataset)")


def test_manifest_limits_are_inclusive() -> None:
    shard = dict(manifest_dict()["shards"][0], sample_count=fmt.MAX_SAMPLES)
    parsed = fmt.parse_manifest(json.dumps(manifest_dict(sample_count=fmt.MAX_SAMPLES, shards=[shard])).encode())
    assert parsed.sample_count == fmt.MAX_SAMPLES
    # exactly the size limit is not "over the limit" (it fails later, for its content)
    at_limit = b"{" + b" " * (fmt.MAX_MANIFEST_BYTES - 2) + b"}"
    error = manifest_error(at_limit)
    assert "limit" not in error.message and "format is None" in error.message
    over = manifest_error(at_limit + b" ")
    assert over.message == f"manifest is {fmt.MAX_MANIFEST_BYTES + 1} bytes, over the {fmt.MAX_MANIFEST_BYTES} limit"


def test_relative_paths() -> None:
    anything = re.compile(r".*")
    for text in ("a/../b", ".."):
        with pytest.raises(UnsafePathError):
            fmt.check_relative_path(text, anything, what="x")
    with pytest.raises(UnsafePathError) as caught:
        fmt.check_relative_path(12, anything, what="thing", path=MANIFEST_PATH)
    assert caught.value.message == ("thing 12 is not a valid dataset path (expected .*, relative, inside the "
                                    "dataset)") and caught.value.path == MANIFEST_PATH
    assert fmt.check_relative_path("a/b", anything, what="x") == "a/b"
    with pytest.raises(UnsafePathError, match="^shard path 5 is not a valid dataset path"):
        fmt.shard_number_of(5)  # type: ignore[arg-type]
    assert fmt.shard_number_of("shards/shard-00012-00000000000000aa.pks") == 12


def test_checksum_helpers() -> None:
    with pytest.raises(ManifestError) as caught:
        fmt.parse_checksum_hex("abc", path=MANIFEST_PATH)
    assert caught.value.message == "checksum must be 16 lowercase hex digits, got 'abc'"
    assert caught.value.path == MANIFEST_PATH
    with pytest.raises(ChecksumMismatchError) as mismatch:
        fmt.verify_checksum(b"abc", 0, path=WHERE, sample=4, offset=8192)
    assert (mismatch.value.path, mismatch.value.sample, mismatch.value.offset) == (WHERE, 4, 8192)
    fmt.verify_checksum(b"abc", fmt.checksum(b"abc"))


@pytest.mark.parametrize("alignment", [1, 2, 64, 4096])
def test_align_up_array_matches_align_up(alignment: int) -> None:
    values = [0, 1, 2, 63, 64, 65, 4095, 4096, 4097, 123457]
    for dtype in (np.uint64, np.int64):
        got = fmt.align_up_array(np.array(values, dtype=dtype), alignment)
        assert got.dtype == dtype
        assert got.tolist() == [fmt.align_up(v, alignment) for v in values]


# === build: atomic, records, commit, plan ======================================================

import os  # noqa: E402
from pathlib import Path  # noqa: E402

from PIL import Image  # noqa: E402

from packer.writer import build, finish  # noqa: E402
from packer.writer.atomic import fsync_dir, write_atomic  # noqa: E402
from packer.writer.plan import (DEFAULT_SHARD_SIZE, BuildOptions, load_plan, make_plan, plan_shards,  # noqa: E402
                               save_plan)
from packer.writer.records import RECORD_COLUMNS, read_record, record_path, write_record  # noqa: E402
from packer.sources import list_source  # noqa: E402
from packer.writer.staging import PLAN_NAME, STAGING_DIR  # noqa: E402
from packer.dataset import open_index  # noqa: E402
from packer.errors import BuildError, EmptySourceError, OptionError  # noqa: E402


def png_folder(root: Path, count: int, *, seed: int = 0, bad: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    for i in range(count):
        folder = root / ("cat" if i % 2 else "dog")
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (12 + i, 16, 3), dtype=np.uint8)).save(folder / f"{i:03d}.png")
    for i in range(bad):
        (root / "dog" / f"bad{i}.png").write_bytes(b"not an image at all")
    return root


def test_write_atomic_returns_the_digest_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "f.bin"
    digest = write_atomic(target, [b"hello ", memoryview(b"world")])
    assert digest == fmt.checksum(b"hello world") and target.read_bytes() == b"hello world"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.bin"]

    def failing() -> Any:
        yield b"new bytes"
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        write_atomic(target, failing())
    assert target.read_bytes() == b"hello world", "a failed write leaves the old file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.bin"], "and removes its temp file"


def test_write_atomic_temp_name_is_the_one_cleanup_looks_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    real_replace = os.replace

    def replace(src: Any, dst: Any) -> None:
        seen.append(os.path.basename(src))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    write_atomic(tmp_path / "manifest.json", [b"{}"])
    assert seen == [f".manifest.json.{os.getpid()}.tmp"]


def test_fsync_dir_needs_a_folder(tmp_path: Path) -> None:
    fsync_dir(tmp_path)
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(NotADirectoryError):
        fsync_dir(tmp_path / "file")


def test_records_round_trip_and_distrust(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    (out / STAGING_DIR / "done").mkdir(parents=True)
    assert record_path(out, 7) == out / STAGING_DIR / "done" / "shard-00007.pkr"
    rows = {"source": [3, 1], "offset": [4096, 8192], "size": [100, 200], "checksum": [2**64 - 1, 5],
            "width": [640, 2**32 - 1], "height": [480, 1], "channels": [3, 1], "image_format": [1, 2]}
    name = fmt.shard_file_name(7, 0x1234)  # records trust only paths that are shard names
    shard = out / name
    shard.parent.mkdir()
    shard.write_bytes(bytes(12288))
    header = {"plan": fmt.checksum_hex(42), "sample_count": 2, "path": name, "size": 12288, "rejected": []}
    path = record_path(out, 7)
    write_record(path, header, rows)
    found = read_record(path, 42, out)
    assert found is not None
    got_header, columns = found
    assert got_header == header
    assert set(columns) == set(RECORD_COLUMNS)
    for name in RECORD_COLUMNS:
        assert columns[name].tolist() == rows[name], name
    assert {name: columns[name].dtype.str for name in RECORD_COLUMNS} == {
        "source": "<u8", "offset": "<u8", "size": "<u8", "checksum": "<u8", "width": "<u4", "height": "<u4",
        "channels": "|u1", "image_format": "|u1"}
    assert read_record(path, 43, out) is None, "a record of another plan is not trusted"
    assert read_record(record_path(out, 8), 42, out) is None, "no record"
    shard.unlink()
    assert read_record(path, 42, out) is None, "its shard file is gone"
    empty = {"plan": fmt.checksum_hex(42), "sample_count": 0, "rejected": []}
    write_record(path, empty, {name: [] for name in RECORD_COLUMNS})
    assert read_record(path, 42, out)[0] == empty, "an all-rejected shard needs no file"
    path.write_bytes(path.read_bytes()[:-3])
    assert read_record(path, 42, out) is None, "a damaged record is redone"
    path.write_bytes(b"PKPLAN\0\0" + bytes(100))
    assert read_record(path, 42, out) is None


def test_finish_names_the_missing_shards(tmp_path: Path) -> None:
    src, out = png_folder(tmp_path / "src", 24), tmp_path / "ds"
    options = BuildOptions(shard_size=8192, alignment=4096)  # one sample per shard: 24 planned shards
    build(src, out, options, workers=1, progress=False, part=(0, 2))
    plan = load_plan(out / STAGING_DIR / PLAN_NAME, src)
    assert plan.shard_count == 24
    with pytest.raises(BuildError) as caught:
        finish(out, src)
    odd = ", ".join(str(i) for i in range(1, 21, 2))
    assert caught.value.message == (f"12 of 24 planned shards are not packed yet (shards {odd} ...); "
                                    f"run the missing parts, or the build with --resume")
    build(src, out, options, workers=1, progress=False, part=(1, 2))
    for i in range(3, 24, 2):
        record_path(out, i).unlink()  # shard 1 alone is there: 11 missing, at most 10 shown
    with pytest.raises(BuildError) as caught:
        finish(out, src)
    assert caught.value.message == ("11 of 24 planned shards are not packed yet (shards 3, 5, 7, 9, 11, 13, 15, 17, "
                                    "19, 21 ...); run the missing parts, or the build with --resume")
    assert caught.value.path == str(out)
    build(src, out, options, workers=1, progress=False, part=(1, 2))
    for i in range(5, 24, 2):
        record_path(out, i).unlink()
    with pytest.raises(BuildError) as caught:
        finish(out, src)
    assert "(shards 5, 7, 9, 11, 13, 15, 17, 19, 21, 23);" in caught.value.message, "ten shown, no ..."


def test_a_build_where_everything_is_rejected_says_why(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    for i in range(3):
        (src / "a" / f"{i}.png").write_bytes(b"text, not a png")
    (src / "a" / "empty.jpg").write_bytes(b"")
    with pytest.raises(EmptySourceError) as caught:
        build(src, tmp_path / "ds", BuildOptions(), workers=1, progress=False)
    assert caught.value.message.startswith(
        "every one of the 4 listed source files was rejected; nothing to pack (4 rejected: 3 not-an-image (e.g. ")
    assert "1 empty-file (e.g. a/empty.jpg" in caught.value.message
    assert caught.value.message.endswith(f"every rejection is in {tmp_path / 'ds' / fmt.REPORT_NAME}")
    assert caught.value.path == str(tmp_path / "ds")
    assert not (tmp_path / "ds" / fmt.MANIFEST_NAME).exists()


def test_build_summary_report_and_result_are_exact(tmp_path: Path) -> None:
    src, out = png_folder(tmp_path / "src", 6, bad=2), tmp_path / "ds"
    (src / "stray.png").write_bytes(b"a file outside every class folder: rejected when listed")
    options = BuildOptions(shard_size=12288, seed=3)
    result = build(src, out, options, workers=1, progress=False)
    with open_index(out) as ds:
        manifest = ds.manifest
        sizes = ds.index.size
        assert result.sample_count == len(ds) == 6
        assert result.shard_count == len(manifest.shards)
        assert result.payload_bytes == int(sizes.sum())
        assert result.total_bytes == sum(s.size for s in manifest.shards) + manifest.index.size
        keys = [ds.key(i) for i in range(len(ds))]
    plan = load_plan(out / STAGING_DIR / PLAN_NAME, src) if (out / STAGING_DIR).exists() else None
    assert plan is None, "the staging folder is removed after the commit"
    from packer import __version__

    probes = {path.relative_to(src).as_posix(): path.stat().st_size  # every listed file (<= 16 of them)
              for path in sorted((src / "cat").iterdir()) + sorted((src / "dog").iterdir())}
    summary = {"options": options.to_json(), "source_kind": "folder", "source_files": 9, "packed": 6, "rejected": 3,
               "planned_shards": result.summary["planned_shards"], "tool": f"packer {__version__}",
               "label_type": "str", "source": "src", "source_probes": probes,
               "classes_checksum": fmt.class_list_checksum(("cat", "dog"))}
    assert result.summary == summary and manifest.build == summary
    assert summary["planned_shards"] >= result.shard_count >= 2
    lines = [json.loads(line) for line in (out / fmt.REPORT_NAME).read_text().splitlines()]
    assert lines[0] == {"type": "summary", **summary}
    assert [(r["type"], r["key"], r["reason"]) for r in lines[1:]] == [
        ("rejected", "dog/bad0.png", "not-an-image"), ("rejected", "dog/bad1.png", "not-an-image"),
        ("rejected", "stray.png", "not-in-class-folder")]
    assert sorted(r.key for r in result.rejected) == ["dog/bad0.png", "dog/bad1.png", "stray.png"]
    assert sorted(keys) == sorted(f"{'cat' if i % 2 else 'dog'}/{i:03d}.png" for i in range(6))
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [fmt.MANIFEST_NAME, fmt.REPORT_NAME, "shards", manifest.index.path, ".packer.lock"])


def test_overwrite_removes_what_no_manifest_names(tmp_path: Path) -> None:
    src, out = png_folder(tmp_path / "src", 6), tmp_path / "ds"
    build(src, out, BuildOptions(shard_size=12288), workers=1, progress=False)
    stale = [out / ".manifest.json.999.tmp", out / ".build-report.jsonl.999.tmp",
             out / "shards" / "shard-00099-00000000000000ff.pks", out / "index-00000000000000ff.pki"]
    for path in stale:
        path.write_bytes(b"x")
    keep = out / "shards" / "notes.txt"
    keep.write_bytes(b"mine")
    build(src, out, BuildOptions(shard_size=12288, seed=5), workers=1, progress=False, overwrite=True)
    assert not any(p.exists() for p in stale)
    assert keep.exists(), "only packer's own file names are removed"
    with open_index(out) as ds:
        listed = {s.path for s in ds.manifest.shards}
        assert {p.relative_to(out).as_posix() for p in (out / "shards").glob("*.pks")} == listed
        assert [p.name for p in out.glob("index-*.pki")] == [ds.manifest.index.path]


@pytest.mark.parametrize("changes, message", [
    ({"alignment": 3}, "--alignment must be a power of two between 1 and 16777216, got 3"),
    ({"alignment": 0}, "--alignment must be a power of two between 1 and 16777216, got 0"),
    ({"alignment": 1 << 25}, "--alignment must be a power of two between 1 and 16777216, got 33554432"),
    ({"alignment": 4096, "shard_size": 4095},
     "--shard-size must be at least the alignment (4096 bytes) and below 2^62, got 4095"),
    ({"shard_size": fmt.MAX_FILE_SIZE},
     f"--shard-size must be at least the alignment (4096 bytes) and below 2^62, got {fmt.MAX_FILE_SIZE}"),
    ({"max_pixels": 0}, "--max-pixels must be a positive number of pixels, got 0"),
    ({"validate": "some"}, "--validate must be 'header' or 'full', got 'some'"),
])
def test_build_options_are_checked_by_name(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(OptionError) as caught:
        BuildOptions(**changes).check()
    assert caught.value.message == message


from packer.writer.plan import DEFAULT_MAX_FILE_SIZE  # noqa: E402


def test_build_options_edges_are_accepted() -> None:
    BuildOptions(alignment=1, shard_size=1, max_pixels=1, validate="full").check()
    BuildOptions(alignment=fmt.MAX_ALIGNMENT, shard_size=fmt.MAX_ALIGNMENT).check()
    BuildOptions(shard_size=fmt.MAX_FILE_SIZE - 1).check()
    assert BuildOptions().to_json() == {"alignment": 4096, "shard_size": DEFAULT_SHARD_SIZE, "shuffle": True,
                                        "seed": 0, "codec": "passthrough", "validate": "header",
                                        "max_pixels": BuildOptions().max_pixels,
                                        "max_file_size": DEFAULT_MAX_FILE_SIZE}
    assert DEFAULT_SHARD_SIZE == 512 << 20
    with pytest.raises(OptionError, match="codec"):
        BuildOptions(codec="nope").check()


def test_plan_order_and_cuts(tmp_path: Path) -> None:
    listing = list_source(png_folder(tmp_path / "src", 9))
    shuffled = make_plan(listing, BuildOptions(seed=4, shard_size=3 * 4096 + 4096))
    assert shuffled.order.tolist() == np.random.Generator(np.random.PCG64(4)).permutation(9).tolist()
    assert shuffled.order.dtype == np.int64
    kept = make_plan(listing, BuildOptions(shuffle=False, shard_size=3 * 4096 + 4096))
    assert kept.order.tolist() == list(range(9)) and kept.order.dtype == np.int64
    assert kept.shard_starts.tolist() == [0, 3, 6, 9] and kept.shard_count == 3
    assert kept.shard_members(1).tolist() == [3, 4, 5]
    assert plan_shards(np.zeros(0, dtype=np.uint64), 4096, 1 << 20).tolist() == [0]
    # an oversize sample gets a shard of its own; the greedy cut closes before the sample that overflows
    sizes = np.array([100, 9000, 100, 100, 5000], dtype=np.uint64)
    assert plan_shards(sizes, 4096, 16384).tolist() == [0, 1, 2, 4, 5]
    assert plan_shards(sizes, 1, 9000 + 64).tolist() == [0, 1, 2, 5]
    assert plan_shards(np.array([10, 10], dtype=np.uint64), 1, 64 + 20).tolist() == [0, 2]
    assert plan_shards(np.array([10, 10], dtype=np.uint64), 1, 64 + 19).tolist() == [0, 1, 2]
    assert plan_shards(np.array([10, 10], dtype=np.uint64), 1, 10).tolist() == [0, 1, 2]
    with pytest.raises(BuildError, match="^shard size 100 is smaller than the alignment 4096$"):
        make_plan(listing, BuildOptions(shard_size=100))


def test_plan_saves_and_loads_exactly(tmp_path: Path) -> None:
    src = png_folder(tmp_path / "src", 7)
    (src / "stray.png").write_bytes(b"outside every class folder")
    listing = list_source(src)
    plan = make_plan(listing, BuildOptions(seed=2, shard_size=8192), source="src", first_shard_number=5)
    path = tmp_path / "plan.pkp"
    digest = save_plan(plan, path)
    assert digest == plan.fingerprint == fmt.checksum(path.read_bytes()) != 0
    loaded = load_plan(path, src)
    assert loaded.fingerprint == digest and loaded.source == "src" and loaded.first_shard_number == 5
    assert loaded.options == plan.options and loaded.listing.kind == "folder"
    assert loaded.order.tolist() == plan.order.tolist() and loaded.order.dtype == np.int64
    assert loaded.shard_starts.tolist() == plan.shard_starts.tolist() and loaded.shard_starts.dtype == np.int64
    assert loaded.listing.classes == listing.classes and loaded.listing.root == src
    assert [loaded.listing.key(i) for i in range(7)] == [listing.key(i) for i in range(7)]
    assert loaded.listing.sizes.tolist() == listing.sizes.tolist()
    assert loaded.listing.labels.tolist() == listing.labels.tolist()
    assert [r.to_json() for r in loaded.listing.rejected] == [r.to_json() for r in listing.rejected] != []
    data = path.read_bytes()
    path.write_bytes(data[:40])  # cut short (a column file has no checksum of its own: see SPEC)
    with pytest.raises(BuildError) as caught:
        load_plan(path, src)
    assert "the saved build plan is damaged" in caught.value.message and f"delete {tmp_path}" in caught.value.message
    assert caught.value.path == str(path)
    with pytest.raises(BuildError) as caught:
        load_plan(tmp_path / "missing.pkp", src)
    assert caught.value.message == "cannot read the build plan: No such file or directory"


# --- format: the index table and the column-file writer --------------------------------------------

from packer.errors import IndexMismatchError, MisalignedRecordError, OffsetOutOfBoundsError, OverlappingRecordsError  # noqa: E402,E501

INDEX_PATH = "/data/ds/index-00000000000000cc.pki"
TWO_SHARDS = [fmt.ShardEntry("shards/shard-00000-00000000000000aa.pks", 16384, 1, 2),
              fmt.ShardEntry("shards/shard-00001-00000000000000bb.pks", 8192, 2, 1)]


def index_columns(**changes: Any) -> dict[str, np.ndarray]:
    """A valid 3-sample index over TWO_SHARDS (alignment 4096), with ``changes`` applied."""
    dtypes = {name: typestr for name, (typestr, _) in fmt.INDEX_COLUMNS.items()}
    values: dict[str, Any] = {
        "shard": [0, 0, 1], "offset": [4096, 8192, 4096], "size": [100, 5000, 10], "checksum": [1, 2, 3],
        "label": [0, 1, 0], "width": [1, 2, 3], "height": [1, 2, 3], "channels": [3, 3, 1],
        "image_format": [1, 2, 1], "key_offsets": [0, 1, 2, 3], "keys": list(b"abc"),
        "meta_offsets": [0, 0, 0, 0], "meta": []}
    values.update(changes)
    return {name: np.array(value, dtype=dtypes[name]) if not isinstance(value, np.ndarray) else value
            for name, value in values.items()}


INDEX_CASES = [
    ({"shard": [0, 0, 2]}, OffsetOutOfBoundsError, "names shard 2 but the manifest lists 2", 2),
    ({"shard": [0, 2, 2]}, OffsetOutOfBoundsError, "names shard 2 but the manifest lists 2", 1),
    ({"shard": [0, 1, 1]}, OverlappingRecordsError,
     "is in shard 1 but the manifest's per-shard counts place it in shard 0", 1),
    ({"size": [100, 0, 10]}, CorruptHeaderError, "has size 0; every sample holds at least one byte", 1),
    ({"offset": [4096, 8193, 4096]}, MisalignedRecordError, "starts at 8193, not a multiple of 4096", 1),
    ({"offset": [4096, 8192, 4097]}, MisalignedRecordError, "starts at 4097, not a multiple of 4096", 2),
    ({"size": [100, 2**62, 10]}, OffsetOutOfBoundsError, "has an offset or size beyond 2^62", 1),
    ({"offset": [4096, 2**62, 4096]}, OffsetOutOfBoundsError, "has an offset or size beyond 2^62", 1),
    ({"offset": [4096, 12288, 4096]}, OverlappingRecordsError,
     "starts at 12288 but the layout requires 8192 (samples must be packed in order at aligned offsets "
     "without overlap or gaps)", 1),
    ({"size": [100, 9000, 10]}, OffsetOutOfBoundsError,
     "shard 0 (shards/shard-00000-00000000000000aa.pks) is 16384 bytes but its samples end at 20480", 1),
    ({"size": [100, 5000, 5000]}, OffsetOutOfBoundsError,
     "shard 1 (shards/shard-00001-00000000000000bb.pks) is 8192 bytes but its samples end at 12288", 2),
    ({"key_offsets": [0, 1, 2, 4]}, OverlappingRecordsError,
     "index column 'key_offsets' must start at 0, never decrease and end at the 'keys' length 3", None),
    ({"key_offsets": [0, 2, 1, 3]}, OverlappingRecordsError,
     "index column 'key_offsets' must start at 0, never decrease and end at the 'keys' length 3", None),
    ({"meta_offsets": [1, 1, 1, 1], "meta": [7]}, OverlappingRecordsError,
     "index column 'meta_offsets' must start at 0, never decrease and end at the 'meta' length 1", None),
    ({"label": np.array([0, 1, 0], dtype="<u8")}, CorruptHeaderError,
     "index column 'label' has dtype <u8, expected <i8", None),
    ({"width": np.array([1, 2], dtype="<u4")}, IndexMismatchError,
     "index column 'width' has 2 entries, expected 3", None),
    ({"meta_offsets": [0, 0, 0]}, IndexMismatchError, "index column 'meta_offsets' has 3 entries, expected 4", None),
]


@pytest.mark.parametrize("changes, error, message, sample", INDEX_CASES, ids=[f"case{i}" for i in range(len(INDEX_CASES))])
def test_index_errors_name_the_file_and_sample(changes: dict[str, Any], error: type, message: str,
                                               sample: int | None) -> None:
    with pytest.raises(error) as caught:
        fmt.validate_index(3, index_columns(**changes), TWO_SHARDS, 4096, path=INDEX_PATH)
    assert type(caught.value) is error
    assert (caught.value.message, caught.value.path, caught.value.sample) == (message, INDEX_PATH, sample)


def test_index_structure_errors() -> None:
    columns = index_columns()
    del columns["meta"]
    with pytest.raises(CorruptHeaderError) as caught:
        fmt.validate_index(3, columns, TWO_SHARDS, 4096, path=INDEX_PATH)
    assert (caught.value.message, caught.value.path) == ("index lacks required column 'meta'", INDEX_PATH)
    with pytest.raises(IndexMismatchError) as mismatch:
        fmt.validate_index(3, index_columns(), TWO_SHARDS[:1], 4096, path=INDEX_PATH)
    assert (mismatch.value.message, mismatch.value.path) == (
        "index holds 3 samples but the manifest's shards hold 2", INDEX_PATH)
    ix = fmt.validate_index(3, index_columns(), TWO_SHARDS, 4096, path=INDEX_PATH)
    assert len(ix) == 3 and ix.size.tolist() == [100, 5000, 10]
    # alignment 1: any offset is aligned, payloads packed back to back after the 64-byte header
    tight = index_columns(offset=[64, 164, 64], size=[100, 50, 1])  # a 1-byte sample is a sample
    shards = [fmt.ShardEntry(TWO_SHARDS[0].path, 214, 1, 2), fmt.ShardEntry(TWO_SHARDS[1].path, 65, 2, 1)]
    assert fmt.validate_index(3, tight, shards, 1).offset.tolist() == [64, 164, 64]
    # offsets past 2^53 are checked exactly (no float rounding): one sample of 2^60 + 1 bytes
    big = (1 << 60) + 1
    huge_shards = [fmt.ShardEntry(TWO_SHARDS[0].path, 64 + big + 1, 1, 2), fmt.ShardEntry(TWO_SHARDS[1].path, 65, 2, 1)]
    huge_index = index_columns(offset=[64, 64 + big, 64], size=[big, 1, 1])
    assert fmt.validate_index(3, huge_index, huge_shards, 1).offset.tolist() == [64, 64 + big, 64]
    with pytest.raises(OverlappingRecordsError):  # one byte off at 2^60 is still off
        fmt.validate_index(3, index_columns(offset=[64, 65 + big, 64], size=[big, 1, 1]), huge_shards, 1)
    # a size just below 2^62 is not "beyond 2^62": the layout check refuses it instead
    with pytest.raises(OffsetOutOfBoundsError) as caught:
        fmt.validate_index(3, index_columns(size=[100, fmt.MAX_FILE_SIZE - 1, 10]), TWO_SHARDS, 4096)
    assert caught.value.message.startswith("shard 0 (")
    # alignment 2: an odd offset is misaligned
    with pytest.raises(MisalignedRecordError):
        fmt.validate_index(3, index_columns(offset=[64, 165, 64], size=[101, 50, 10]),
                           [fmt.ShardEntry(TWO_SHARDS[0].path, 216, 1, 2), fmt.ShardEntry(TWO_SHARDS[1].path, 74, 2, 1)], 2)
    # the largest offset and size below 2^62 are not "beyond" it
    huge = fmt.MAX_FILE_SIZE - 4095  # a multiple of 4096 below 2^62
    with pytest.raises(OverlappingRecordsError):  # refused for layout, not for the 2^62 bound
        fmt.validate_index(3, index_columns(offset=[4096, huge, 4096]), TWO_SHARDS, 4096)
    empty = {name: np.zeros(1 if rule == "N+1" else 0, dtype=typestr) for name, (typestr, rule) in fmt.INDEX_COLUMNS.items()}
    assert len(fmt.validate_index(0, empty, [], 4096)) == 0


def test_column_file_writer_limits_and_layout() -> None:
    one = {"a": np.arange(3, dtype="<u8")}
    with pytest.raises(ValueError, match=f"^a column file holds 1..{fmt.MAX_COLUMNS} columns, got 0$"):
        fmt.encode_column_file(fmt.INDEX_MAGIC, 0, {})
    many = {f"c{i}": np.zeros(1, dtype="|u1") for i in range(fmt.MAX_COLUMNS)}
    assert fmt.parse_column_file(b"".join(bytes(p) for p in fmt.encode_column_file(fmt.INDEX_MAGIC, 1, many)),
                                 fmt.INDEX_MAGIC)[1].keys() == many.keys()
    with pytest.raises(ValueError, match="^magic must be 8 bytes, got b'PK'$"):
        fmt.encode_column_file(b"PK", 0, one)
    with pytest.raises(ValueError, match=f"^row_count -1 outside 0..{fmt.MAX_SAMPLES}$"):
        fmt.encode_column_file(fmt.INDEX_MAGIC, -1, one)
    fmt.encode_column_file(fmt.INDEX_MAGIC, fmt.MAX_SAMPLES, one)
    with pytest.raises(ValueError, match=r"^column 'a': need a 1-D array of \['<i8', '<u4', '<u8', '\|u1'\], got <f8$"):
        fmt.encode_column_file(fmt.INDEX_MAGIC, 0, {"a": np.zeros(2)})
    pieces = fmt.encode_column_file(fmt.PLAN_MAGIC, 3, {"a": np.arange(3, dtype="<u8"), "b": np.arange(3, dtype="|u1")})
    data = b"".join(bytes(p) for p in pieces)
    # header 64 + 2 entries of 64 = 192: already 64-aligned, so no padding piece before the first column;
    # 24 bytes of "a" then padding to 256, 3 bytes of "b" then padding to 320
    assert [len(bytes(p)) for p in pieces] == [192, 24, 40, 3, 61]
    assert len(data) == 320
    rows, columns = fmt.parse_column_file(data, fmt.PLAN_MAGIC)
    assert rows == 3 and columns["a"].tolist() == [0, 1, 2] and columns["b"].tolist() == [0, 1, 2]
    exact = fmt.encode_column_file(fmt.PLAN_MAGIC, 8, {"a": np.arange(8, dtype="<u8")})
    assert [len(bytes(p)) for p in exact] == [128, 64], "no zero-length padding pieces"


def test_manifest_dump_is_utf8_and_refuses_nan() -> None:
    manifest = fmt.parse_manifest(json.dumps(manifest_dict(classes=["café"])).encode())
    text = fmt.dump_manifest(manifest)
    assert "café".encode("utf-8") in text and b"\\u00e9" not in text
    informational = fmt.Manifest(**{**manifest.__dict__, "build": {"x": float("nan")}})
    assert b'"x": null' in fmt.dump_manifest(informational)  # informational fields: strict JSON, never NaN
    bad = fmt.Manifest(**{**manifest.__dict__, "codec": {"name": "passthrough", "x": float("nan")}})
    with pytest.raises(ValueError):
        fmt.dump_manifest(bad)
    with pytest.raises(ValueError, match=f"^shard number -1 outside 0..{fmt.MAX_SHARD_NUMBER}$"):
        fmt.shard_file_name(-1, 0)


def shard_item(number: int = 0, **changes: Any) -> dict[str, Any]:
    return {"path": f"shards/shard-{number:05d}-00000000000000aa.pks", "size": 8192, "checksum": "00000000000000bb",
            "sample_count": 2, **changes}


MANIFEST_CASES: list[tuple[Any, str]] = [
    (b"{\"a\": NaN}", "manifest is not valid UTF-8 JSON: NaN is not valid JSON"),
    (manifest_dict(format_version=2), "dataset format version 2 is not supported (this reader accepts [1]); upgrade packer"),
    (manifest_dict(checksum_algorithm="crc32"), "checksum_algorithm 'crc32' is not 'xxh3_64'"),
    (manifest_dict(alignment=3), "alignment must be a power of two between 1 and 16777216, got 3"),
    (manifest_dict(classes=["a", 1]), "manifest classes must all be strings"),
    (manifest_dict(sample_count="2"), "manifest field 'sample_count' must be an integer, got a string"),
    (manifest_dict(codec=[]), "manifest field 'codec' must be an object, got an array"),
    (manifest_dict(codec={}), "manifest codec lacks required field 'name'"),
    (manifest_dict(classes="ab"), "manifest field 'classes' must be an array, got a string"),
    (manifest_dict(index=1.5), "manifest field 'index' must be an object, got a number with a fraction or exponent"),
    (manifest_dict(index={"size": 100, "checksum": "00000000000000dd"}), "manifest index lacks required field 'path'"),
    (manifest_dict(shards={}), "manifest field 'shards' must be an array, got an object"),
    (manifest_dict(shards=[{"size": 8192}]), "manifest shard 0 lacks required field 'path'"),
    (manifest_dict(index={"path": "index-00000000000000cc.pki", "size": 0, "checksum": "00000000000000dd"}),
     f"manifest index field 'size' = 0 outside 1..{fmt.MAX_FILE_SIZE}"),
    (manifest_dict(shards=[5]), "manifest shard 0 must be an object"),
    (manifest_dict(shards=[shard_item(size=0)]), f"manifest shard 0 field 'size' = 0 outside 1..{fmt.MAX_FILE_SIZE}"),
    (manifest_dict(shards=[shard_item(checksum="x")]), "shard 0 checksum must be 16 lowercase hex digits, got 'x'"),
    (manifest_dict(shards=[shard_item(sample_count=0)]),
     f"manifest shard 0 field 'sample_count' = 0 outside 1..{fmt.MAX_SAMPLES}"),
    (manifest_dict(shards=[shard_item(size=100)]), "manifest shard 0 size 100 is not a multiple of the alignment 4096"),
    (manifest_dict(shards=[shard_item(4294967296)]),
     "manifest shard 0 (shards/shard-4294967296-00000000000000aa.pks) has number 4294967296, over the u32 limit "
     "4294967295"),
    (manifest_dict(sample_count=4, shards=[shard_item(1), shard_item(1)]),
     "manifest shard 1 (shards/shard-00001-00000000000000aa.pks) is not numbered after the shard before it (1); "
     "shards must be listed in increasing number order"),
    (manifest_dict(sample_count=3), "sample_count 3 differs from the sum of the shards' counts 2"),
    (manifest_dict(build=[]), "manifest 'build' must be an object and 'history' a list of objects"),
    (manifest_dict(history=[1]), "manifest 'build' must be an object and 'history' a list of objects"),
    (manifest_dict(history={}), "manifest 'build' must be an object and 'history' a list of objects"),
    (manifest_dict(created_by=5), "manifest 'created_by' must be a string"),
]


@pytest.mark.parametrize("obj, message", MANIFEST_CASES, ids=[f"case{i}" for i in range(len(MANIFEST_CASES))])
def test_manifest_errors_table(obj: Any, message: str) -> None:
    assert manifest_error(obj).message == message


def test_manifest_fields_that_default_and_limits() -> None:
    obj = manifest_dict()
    del obj["created_by"]
    parsed = fmt.parse_manifest(json.dumps(obj).encode())
    assert parsed.created_by == "" and parsed.build == {} and parsed.history == () and parsed.format_version == 1
    shard = shard_item(4294967295, size=4096, sample_count=2)  # the largest number and the smallest size
    assert fmt.parse_manifest(json.dumps(manifest_dict(shards=[shard])).encode()).shards[0].number == 4294967295
    assert fmt.parse_manifest(json.dumps(manifest_dict(shards=[shard_item(0)])).encode()).shards[0].number == 0
    tiny = manifest_dict(alignment=1, sample_count=1, shards=[shard_item(0, size=1, sample_count=1)])
    assert fmt.parse_manifest(json.dumps(tiny).encode()).shards[0].size == 1  # one byte is a valid shard size


def column_file(**header: int) -> bytearray:
    data = bytearray(b"".join(bytes(p) for p in fmt.encode_column_file(
        fmt.PLAN_MAGIC, 3, {"a": np.arange(3, dtype="<u8"), "b": np.arange(3, dtype="|u1")})))
    fields = dict(zip(("version", "header_size", "file_size", "rows", "count"),
                      struct.unpack_from("<IIQQI", data, 8)))
    fields.update(header)
    struct.pack_into("<IIQQI", data, 8, fields["version"], fields["header_size"], fields["file_size"], fields["rows"],
                     fields["count"])
    return data


def entry(data: bytearray, i: int, **changes: Any) -> bytearray:
    at = 64 + 64 * i
    name, dtype, offset, length = struct.unpack_from("<24s8sQQ", data, at)
    values = {"name": name, "dtype": dtype, "offset": offset, "length": length, **changes}
    struct.pack_into("<24s8sQQ", data, at, values["name"], values["dtype"], values["offset"], values["length"])
    return data


PLAN_PATH = "/data/ds/.packer-build/plan.pkp"
COLUMN_CASES = [
    (b"", NotAPackerFileError, "not a packer plan file (starts with b'')"),
    (b"PKPLAN\x00\x00" + bytes(10), TruncatedFileError, "plan file is 18 bytes, shorter than its 64-byte header"),
    (b"PKPLAN\x00", TruncatedFileError, "plan file is 7 bytes, shorter than its 64-byte header"),
    (b"PKINDEX\x00" + bytes(10), NotAPackerFileError, "not a packer plan file (starts with b'PKINDEX\\x00')"),
    (b"PKINDEX\x00" + bytes(100), NotAPackerFileError, "not a packer plan file (starts with b'PKINDEX\\x00')"),
    (column_file(version=9), UnsupportedVersionError,
     "plan format version 9 is not supported (this reader accepts [1]); upgrade packer"),
    (column_file(file_size=1000), TruncatedFileError, "plan file is 320 bytes on disk but its header says 1000 (truncated)"),
    (column_file(file_size=100), TruncatedFileError, "plan file is 320 bytes on disk but its header says 100 (extended)"),
    (column_file(count=0), CorruptHeaderError, f"column_count 0 outside 1..{fmt.MAX_COLUMNS}"),
    (column_file(count=65), CorruptHeaderError, f"column_count 65 outside 1..{fmt.MAX_COLUMNS}"),
    (column_file(header_size=128), CorruptHeaderError, "header_size 128 does not match 2 columns"),
    (column_file(rows=fmt.MAX_SAMPLES + 1), CorruptHeaderError,
     f"row_count {fmt.MAX_SAMPLES + 1} exceeds the limit {fmt.MAX_SAMPLES}"),
    (entry(column_file(), 1, name=b"\xffb"), CorruptHeaderError, "column 1 has a non-ASCII name b'\\xffb" + "\\x00" * 22 + "'"),
    (entry(column_file(), 1, name=b"a"), CorruptHeaderError, "column 1 has an invalid or repeated name 'a'"),
    (entry(column_file(), 1, name=b"B"), CorruptHeaderError, "column 1 has an invalid or repeated name 'B'"),
    (entry(column_file(), 1, name=b"bX"), CorruptHeaderError, "column 1 has an invalid or repeated name 'bX'"),
    (entry(column_file(), 1, dtype=b"<f8"), CorruptHeaderError, "column 'b' has unsupported dtype '<f8'"),
    (entry(column_file(), 1, dtype=b"|u1X"), CorruptHeaderError, "column 'b' has unsupported dtype '|u1X'"),
    (entry(column_file(), 1, offset=200), OverlappingRecordsError,
     "column 'b' starts at 200: must be a multiple of 64 at or after 216"),
    (entry(column_file(), 1, offset=192), OverlappingRecordsError,
     "column 'b' starts at 192: must be a multiple of 64 at or after 216"),
    (entry(column_file(), 0, length=17), OffsetOutOfBoundsError,
     "column 'a' (17 x 8 bytes at 192) runs past the end (320)"),
]


@pytest.mark.parametrize("data, error, message", COLUMN_CASES, ids=[f"case{i}" for i in range(len(COLUMN_CASES))])
def test_column_file_errors_are_exact(data: bytes, error: type, message: str) -> None:
    with pytest.raises(error) as caught:
        fmt.parse_column_file(bytes(data), fmt.PLAN_MAGIC, path=PLAN_PATH, kind="plan")
    assert type(caught.value) is error
    assert (caught.value.message, caught.value.path) == (message, PLAN_PATH)


def test_column_file_edges_are_accepted() -> None:
    data = bytes(entry(column_file(), 1, length=64))  # the largest length that fits: 64 bytes at 256 end at 320
    assert len(fmt.parse_column_file(data, fmt.PLAN_MAGIC)[1]["b"]) == 64
    with pytest.raises(OffsetOutOfBoundsError):
        fmt.parse_column_file(bytes(entry(column_file(), 1, length=65)), fmt.PLAN_MAGIC)
    assert fmt.parse_column_file(bytes(column_file(rows=fmt.MAX_SAMPLES)), fmt.PLAN_MAGIC)[0] == fmt.MAX_SAMPLES
    many = {f"c{i}": np.zeros(1, dtype="|u1") for i in range(fmt.MAX_COLUMNS)}
    assert len(fmt.parse_column_file(b"".join(bytes(p) for p in fmt.encode_column_file(fmt.INDEX_MAGIC, 1, many)),
                                     fmt.INDEX_MAGIC)[1]) == fmt.MAX_COLUMNS
    # a header-only file (64 bytes, no room for the column table) is refused, not read past its end
    header_only = b"PKPLAN\x00\x00" + struct.pack("<IIQQI", 1, 192, 64, 0, 2) + bytes(28)
    with pytest.raises(CorruptHeaderError, match="^header_size 192 does not match 2 columns$"):
        fmt.parse_column_file(header_only, fmt.PLAN_MAGIC)
    exact = b"PKPLAN\x00\x00" + struct.pack("<IIQQI", 1, 64, 64, 0, 0) + bytes(28)
    with pytest.raises(CorruptHeaderError, match="column_count 0"):
        fmt.parse_column_file(exact, fmt.PLAN_MAGIC)  # exactly 64 bytes is a header, not "shorter than" one
    empty_column = b"".join(bytes(p) for p in fmt.encode_column_file(fmt.PLAN_MAGIC, 0, {"a": np.zeros(0, dtype="<u8")}))
    assert len(empty_column) == 128 and len(fmt.parse_column_file(empty_column, fmt.PLAN_MAGIC)[1]["a"]) == 0
    # numpy arrays and memoryviews are accepted like bytes
    assert fmt.parse_column_file(np.frombuffer(bytes(column_file()), dtype=np.uint8), fmt.PLAN_MAGIC)[0] == 3


def test_write_atomic_reports_the_real_error_after_the_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failing folder fsync (after the temp file is renamed away) raises that error, not a
    FileNotFoundError from cleaning up a temp file that no longer exists."""
    import errno

    import packer.writer.atomic as atomic_module

    def broken_fsync_dir(path: Path) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(atomic_module, "fsync_dir", broken_fsync_dir)
    with pytest.raises(OSError) as caught:
        write_atomic(tmp_path / "f.bin", [b"x"])
    assert caught.value.errno == errno.EIO


def test_report_lines_are_canonical_json(tmp_path: Path) -> None:
    src, out = png_folder(tmp_path / "src", 4), tmp_path / "ds"
    (src / "cat" / "café.png").write_bytes(b"not a png")
    result = build(src, out, BuildOptions(), workers=1, progress=False)
    assert result.path == out
    lines = (out / fmt.REPORT_NAME).read_text(encoding="utf-8").splitlines()
    for line in lines:  # sorted keys, UTF-8 as is (no \\u escapes)
        assert line == json.dumps(json.loads(line), sort_keys=True, ensure_ascii=False)
    assert '"key": "cat/café.png"' in lines[1]


def test_commit_refuses_a_bad_index_and_writes_nothing(tmp_path: Path) -> None:
    from packer.writer.commit import commit_dataset

    out = tmp_path / "ds"
    out.mkdir()
    with pytest.raises(IndexMismatchError) as caught:
        commit_dataset(out, index_columns(), TWO_SHARDS[:1], classes=(), codec={"name": "passthrough"},
                       alignment=4096, build_info={}, rejected=[], history=[])
    assert caught.value.path == "(new index)"
    assert list(out.iterdir()) == []


def test_commit_io_errors_are_build_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    import packer.writer.commit as commit_module

    src, out = png_folder(tmp_path / "src", 4), tmp_path / "ds"
    real = commit_module.write_atomic

    def full_disk(path: Path, pieces: Any) -> int:
        if path.name == fmt.MANIFEST_NAME:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, pieces)

    monkeypatch.setattr(commit_module, "write_atomic", full_disk)
    with pytest.raises(BuildError) as caught:
        build(src, out, BuildOptions(), workers=1, progress=False)
    assert caught.value.message == ("the disk is full while writing the index and manifest; free space and run "
                                    "again with --resume")
    assert caught.value.path == str(out)
    assert not (out / fmt.MANIFEST_NAME).exists()


def test_codec_notes_are_summed_over_shards(tmp_path: Path) -> None:
    src = tmp_path / "src"
    rng = np.random.default_rng(1)
    for i in range(5):
        (src / "a").mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, (64, 48, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(src / "a" / f"{i}.jpg", quality=90, progressive=(i == 4))
    (src / "a" / "p.png").write_bytes((src / "a" / "0.jpg").read_bytes() and _png_bytes())
    result = build(src, tmp_path / "ds", BuildOptions(codec="tiled", shard_size=8192), workers=1, progress=False)
    assert result.shard_count >= 3
    assert result.summary["codec_notes"] == {"kept: not a JPEG (png)": 1, "kept: progressive": 1, "tiled": 4}
    assert list(result.summary["codec_notes"]) == sorted(result.summary["codec_notes"])


def _png_bytes() -> bytes:
    import io

    buffer = io.BytesIO()
    Image.fromarray(np.zeros((8, 8, 3), dtype=np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def _saved_plan(tmp_path: Path, **overrides: Any) -> tuple[Path, Path]:
    """A saved plan of a small JSONL source with metadata; ``overrides`` replace plan fields first."""
    from dataclasses import replace

    src = png_folder(tmp_path / "src", 6)
    lines = [json.dumps({"path": f"{'cat' if i % 2 else 'dog'}/{i:03d}.png", "label": i % 2, "metadata": {"i": i}})
             for i in range(6)]
    manifest = src / "list.jsonl"
    manifest.write_text("\n".join(lines) + "\n")
    plan = make_plan(list_source(manifest), BuildOptions(shard_size=8192))
    plan = replace(plan, **overrides)
    path = tmp_path / "plan.pkp"
    save_plan(plan, path)
    return path, src


def test_loaded_plan_keeps_the_metadata(tmp_path: Path) -> None:
    path, src = _saved_plan(tmp_path)
    loaded = load_plan(path, src)
    assert [json.loads(loaded.listing.metadata(i)) for i in range(6)] == [{"i": i} for i in range(6)]
    assert loaded.source == "" and loaded.first_shard_number == 0


@pytest.mark.parametrize("what", ["order-short", "order-high", "order-negative", "starts-not-at-0", "starts-short",
                                  "starts-decrease", "starts-empty"])
def test_an_inconsistent_plan_is_refused(tmp_path: Path, what: str) -> None:
    overrides: dict[str, Any] = {
        "order-short": {"order": np.arange(5)},
        "order-high": {"order": np.array([0, 1, 2, 3, 4, 6])},
        "order-negative": {"order": np.array([0, 1, 2, 3, 4, -1])},
        "starts-not-at-0": {"shard_starts": np.array([1, 3, 6])},
        "starts-short": {"shard_starts": np.array([0, 3, 5])},
        "starts-decrease": {"shard_starts": np.array([0, 4, 3, 6])},
        "starts-empty": {"shard_starts": np.zeros(0, dtype=np.int64)},
    }[what]
    path, src = _saved_plan(tmp_path, **overrides)
    with pytest.raises(BuildError) as caught:
        load_plan(path, src)
    assert caught.value.message == f"the saved build plan is inconsistent; delete {tmp_path} to start over"
    assert caught.value.path == str(path)


def test_plan_edges_that_are_accepted(tmp_path: Path) -> None:
    path, src = _saved_plan(tmp_path, order=np.array([5, 4, 3, 2, 1, 0]), shard_starts=np.array([0, 6]))
    assert load_plan(path, src).order.tolist() == [5, 4, 3, 2, 1, 0]


def _rewrite_header(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    rows, columns = fmt.parse_column_file(path.read_bytes(), fmt.PLAN_MAGIC)
    header = json.loads(columns["header"].tobytes())
    change(header)
    columns = {name: np.array(column) for name, column in columns.items()}
    columns["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    path.write_bytes(b"".join(bytes(p) for p in fmt.encode_column_file(fmt.PLAN_MAGIC, rows, columns)))


def test_plan_header_defaults_and_unusable_headers(tmp_path: Path) -> None:
    path, src = _saved_plan(tmp_path)
    _rewrite_header(path, lambda h: (h.pop("source"), h.pop("first_shard_number")))
    loaded = load_plan(path, src)  # a plan written before these fields existed
    assert loaded.source == "" and loaded.first_shard_number == 0
    _rewrite_header(path, lambda h: h["options"].update(bogus=1))
    with pytest.raises(BuildError) as caught:
        load_plan(path, src)
    assert caught.value.message.startswith("the saved build plan is unusable (TypeError(")
    assert caught.value.message.endswith(f"); delete {tmp_path} to start over") and caught.value.path == str(path)
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(BuildError) as damaged:
        load_plan(path, src)
    assert damaged.value.message == (f"the saved build plan is damaged ({path}: plan file is 40 bytes, shorter than its "
                                     f"64-byte header); delete {tmp_path} to start over")
    with pytest.raises(BuildError) as unreadable:
        load_plan(tmp_path / "nope.pkp", src)
    assert unreadable.value.path == str(tmp_path / "nope.pkp")


def test_make_plan_edges(tmp_path: Path) -> None:
    listing = list_source(png_folder(tmp_path / "src", 3))
    plan = make_plan(listing, BuildOptions(shard_size=4096, alignment=4096))  # shard size == alignment is allowed
    assert plan.source == "" and plan.shard_count == 3 and plan.first_shard_number == 0
    empty = plan_shards(np.zeros(0, dtype=np.uint64), 1, 64)
    assert empty.dtype == np.int64
    assert plan_shards(np.ones(3, dtype=np.uint64), 1, 64).tolist() == [0, 1, 2, 3]  # no room after the header
    assert plan_shards(np.ones(3, dtype=np.uint64), 1, 65).tolist() == [0, 1, 2, 3]
    assert plan_shards(np.ones(3, dtype=np.uint64), 1, 66).tolist() == [0, 2, 3]
    with pytest.raises(OptionError) as caught:
        BuildOptions(codec="nope").check()
    assert caught.value.message == "unknown codec 'nope'; available: jpeg, passthrough, raw, tiled"


def test_plan_consistency_edges(tmp_path: Path) -> None:
    from dataclasses import replace

    from packer.sources.listing import select_rows

    path, src = _saved_plan(tmp_path, shard_starts=np.array([0, 3, 3, 6]))
    assert load_plan(path, src).shard_starts.tolist() == [0, 3, 3, 6]  # an empty planned shard is tolerated
    listing = list_source(png_folder(tmp_path / "src2", 2))
    empty = make_plan(select_rows(listing, np.zeros(2, dtype=bool)), BuildOptions())
    assert empty.shard_starts.tolist() == [0]
    save_plan(empty, tmp_path / "empty.pkp")
    assert load_plan(tmp_path / "empty.pkp", src).shard_count == 0
    plan = make_plan(listing, BuildOptions())
    short_labels = replace(plan, listing=replace(plan.listing, labels=plan.listing.labels[:-1]))
    save_plan(short_labels, tmp_path / "labels.pkp")
    with pytest.raises(BuildError, match="inconsistent"):
        load_plan(tmp_path / "labels.pkp", src)


# === imageinfo =================================================================================

import io as _io  # noqa: E402

from packer.errors import RejectedImageError  # noqa: E402
from packer.imageinfo import probe_image  # noqa: E402


def _encoded(fmt_name: str, **options: Any) -> bytes:
    rng = np.random.default_rng(7)
    buffer = _io.BytesIO()
    if fmt_name == "GIF":
        frames = [Image.fromarray(rng.integers(0, 256, (24, 20, 3), dtype=np.uint8)).convert("P") for _ in range(3)]
        frames[0].save(buffer, "GIF", save_all=True, append_images=frames[1:], duration=40)
    else:
        Image.fromarray(rng.integers(0, 256, (24, 20, 3), dtype=np.uint8)).save(buffer, fmt_name, **options)
    return buffer.getvalue()


def _exif_jpeg() -> bytes:
    """A JPEG whose EXIF segment holds a whole JPEG thumbnail (so an FF D9 sits before the scan)."""
    thumb = _encoded("JPEG", quality=50)
    app1 = b"Exif\x00\x00" + thumb
    segment = b"\xff\xe1" + (len(app1) + 2).to_bytes(2, "big") + app1
    main = _encoded("JPEG", quality=90)
    return main[:2] + segment + main[2:]


IMAGES = {"jpeg": lambda: _encoded("JPEG", quality=90), "jpeg-exif": _exif_jpeg,
          "jpeg-restart": lambda: _encoded("JPEG", quality=90, restart_marker_blocks=1),
          "png": lambda: _encoded("PNG"), "gif": lambda: _encoded("GIF"), "bmp": lambda: _encoded("BMP"),
          "webp": lambda: _encoded("WEBP", quality=80)}


@pytest.mark.parametrize("kind", sorted(IMAGES))
def test_every_cut_is_refused_and_appended_bytes_are_not(kind: str) -> None:
    data = IMAGES[kind]()
    probe_image(data, name=f"ok.{kind}")
    # a PNG cut inside its IEND chunk's CRC still holds every pixel: only cuts before "IEND" count
    end = len(data) - 8 if kind == "png" else len(data)
    cuts = sorted(set(range(1, end, max(1, len(data) // 97))) | {end - 1, end - 2, 8, 13})
    for cut in cuts:
        with pytest.raises(RejectedImageError) as caught:
            probe_image(data[:cut], name=f"cut.{kind}")
        assert caught.value.reason in ("truncated", "not-an-image", "decode-failed"), (kind, cut)
        assert caught.value.path == f"cut.{kind}"
    if kind.startswith(("jpeg", "png", "gif")):  # bytes after the end (a phone's motion photo) are fine
        probe_image(data + bytes(range(200)) * 2, name=f"long.{kind}")


def test_truncation_messages() -> None:
    png = IMAGES["png"]()
    with pytest.raises(RejectedImageError) as caught:
        probe_image(png[:-12], name="x.png")
    assert caught.value.reason == "truncated"
    idat = png.rindex(b"IDAT") - 4
    assert caught.value.message == (f"PNG has no IEND chunk: expected chunks up to IEND, but the file ({len(png) - 12} "
                                    f"bytes) ends after 'IDAT' at offset {idat}: the file is truncated")
    probe_image(png + bytes(100), name="x.png")  # bytes after IEND: the chunk walk finds IEND
    jpeg = IMAGES["jpeg-exif"]()
    with pytest.raises(RejectedImageError) as caught:
        probe_image(jpeg[:-2] + bytes(100), name="x.jpg")
    assert caught.value.message == ("JPEG has no end-of-image marker (FF D9) in its last 64 bytes, nor after the start "
                                    f"of its scan data: the file ({len(jpeg) + 98} bytes) is truncated")
    probe_image(jpeg + bytes(100), name="x.jpg")  # its end is found after the scan, not in the thumbnail
    gif = IMAGES["gif"]()
    with pytest.raises(RejectedImageError) as caught:
        probe_image(gif[:-1], name="x.gif")
    assert caught.value.message == ("GIF ends without its trailer byte (0x3B) after 3 complete frame(s): expected the "
                                    f"block structure to end with 0x3B within the file ({len(gif) - 1} bytes): "
                                    "the file is truncated")
    with pytest.raises(RejectedImageError) as caught:
        probe_image(gif[:12], name="x.gif")
    assert caught.value.reason == "truncated"


@pytest.mark.parametrize("data, text", [
    (b"version https://git-lfs.github.com/spec/v1\noid sha256:0\n",
     "a git-LFS pointer file (the image was never fetched: run `git lfs pull`)"),
    (b"  \n<!DOCTYPE html><html></html>", "an HTML page (a failed download?)"),
    (b"\t<HTML><body>403</body></HTML>", "an HTML page (a failed download?)"),
    (b"hello, this is plain text and more", "bytes starting b'hello, this is p'"),
])
def test_not_an_image_says_what_it_looks_like(data: bytes, text: str) -> None:
    with pytest.raises(RejectedImageError) as caught:
        probe_image(data, name="a.jpg")
    assert caught.value.reason == "not-an-image" and caught.value.path == "a.jpg"
    assert caught.value.message == f"expected a JPEG, PNG, WEBP, GIF, BMP or TIFF image, found {text}"


def test_full_validation_names_damaged_pixels() -> None:
    png = bytearray(IMAGES["png"]())
    start = png.index(b"IDAT") + 4
    png[start + 2:start + 40] = bytes(38)  # zlib data damaged, the header intact
    with pytest.raises(RejectedImageError) as caught:
        probe_image(bytes(png), name="d.png", validate="full")
    assert caught.value.path == "d.png"
    assert caught.value.reason in ("decode-failed", "truncated")
    assert caught.value.message.startswith("PNG ")
    assert probe_image(IMAGES["png"](), validate="full").channels == 3


@pytest.mark.filterwarnings("ignore:Corrupt EXIF data:UserWarning", "ignore:Truncated File Read:UserWarning")  # Pillow, on purpose
@pytest.mark.parametrize("options", [{}, {"compression": "tiff_lzw"}, {"compression": "tiff_deflate"}])
def test_every_cut_of_a_tiff_is_refused(options: dict[str, Any]) -> None:
    data = _encoded("TIFF", **options)
    probe_image(data, name="ok.tif")
    for cut in sorted(set(range(1, len(data), max(1, len(data) // 97))) | {len(data) - 1, 8, 9}):
        with pytest.raises(RejectedImageError) as caught:
            probe_image(data[:cut], name="cut.tif")
        assert caught.value.reason in ("truncated", "not-an-image", "decode-failed"), cut


# === verify: the report, every problem's exact wording and location, workers and I/O hints =========

import errno  # noqa: E402
import shutil  # noqa: E402

from packer import verify as verify_module  # noqa: E402
from packer.decode import decode_image  # noqa: E402
from packer.verify import Problem, VerifyReport, verify  # noqa: E402

VECTORS = Path(__file__).resolve().parents[2] / "formats" / "vectors"


@pytest.fixture(scope="module")
def verify_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """9 PNGs in 3 shards (3584, 4096, 3584 bytes) of 3 samples, alignment 512."""
    tmp = tmp_path_factory.mktemp("verify-kills")
    out = tmp / "ds"
    build(png_folder(tmp / "src", 9), out, BuildOptions(shard_size=4096, alignment=512), workers=1, progress=False)
    return out


@pytest.fixture
def vds(verify_base: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(verify_base, tmp_path / "ds"))


def _layout(folder: Path) -> dict[str, Any]:
    with open_index(folder) as index:
        return {"paths": [s.path for s in index.manifest.shards], "sizes": [s.size for s in index.manifest.shards],
                "checksums": [s.checksum for s in index.manifest.shards],
                "ranges": [index.shard_range(s) for s in range(len(index.manifest.shards))],
                "offset": index.index.offset.astype(int).tolist(), "size": index.index.size.astype(int).tolist(),
                "checksum": index.index.checksum.tolist(), "keys": [index.key(i) for i in range(len(index))]}


def _problem(kind: str, message: str, **where: Any) -> dict[str, Any]:
    found = {"kind": kind, "message": message, "sample": None, "shard": None, "key": None, "path": None,
             "field": None, "sample_range": None}
    found.update(where)
    return found


def _poke(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(data)


def _file_hash(path: Path) -> str:
    return fmt.checksum_hex(xxhash.xxh3_64_intdigest(path.read_bytes()))


def _shard_checksum_problem(folder: Path, shard: int) -> dict[str, Any]:
    lay = _layout(folder)
    path = lay["paths"][shard]
    return _problem("shard-checksum", f"shard checksum mismatch: the manifest says {fmt.checksum_hex(lay['checksums'][shard])}, "
                    f"the file hashes to {_file_hash(folder / path)}", shard=shard, path=path)


def _verify_json(folder: Path, **options: Any) -> dict[str, Any]:
    options.setdefault("workers", 1)
    return verify(folder, **options).to_json()


def test_verify_report_of_an_intact_dataset_is_exact(verify_base: Path) -> None:
    import time as _time

    before = _time.monotonic()
    report = verify(verify_base, workers=1)
    elapsed = _time.monotonic() - before
    assert 0 < report.seconds <= elapsed
    assert report.to_json() == {"ok": True, "path": str(verify_base), "samples": 9, "shards": 3,
                                "samples_checked": 9, "shards_checked": 3, "bytes_read": 3584 + 4096 + 3584,
                                "seconds": round(report.seconds, 6), "decoded": False,
                                "damaged_sample_count": 0, "fields": {}, "unlisted": 0, "problems": []}
    assert VerifyReport(path="x", ok=True, seconds=1.23456789).to_json()["seconds"] == 1.234568


def test_verify_problem_text_and_json_without_a_key_or_a_place() -> None:
    assert str(Problem(kind="checksum", message="m", sample=4, shard=1)) == "[checksum] shard 1, sample 4: m"
    assert str(Problem(kind="structure", message="bad index")) == "[structure] bad index"
    assert Problem(kind="padding", message="m", sample=2, shard=0, key="a/b.png", path="shards/x.pks").to_json() == {
        "kind": "padding", "message": "m", "sample": 2, "shard": 0, "key": "a/b.png", "path": "shards/x.pks",
        "field": None, "sample_range": None}


@pytest.mark.parametrize("chunk", [None, 700, 2400])
def test_verify_payload_and_padding_damage_is_exact(vds: Path, monkeypatch: pytest.MonkeyPatch,
                                                    chunk: int | None) -> None:
    """A flipped payload byte and nonzero padding (twice around a chunk boundary: one problem)."""
    if chunk is not None:
        monkeypatch.setattr(verify_module, "CHUNK_SIZE", chunk)
    lay = _layout(vds)
    p1, p2 = (vds / lay["paths"][1]), (vds / lay["paths"][2])
    _poke(p1, lay["offset"][4] + 10, b"\xee")
    pad_start, pad_end = lay["offset"][7] + lay["size"][7], lay["offset"][8]  # 2241..2559 in shard 2
    _poke(p2, 2300, b"\x01")
    _poke(p2, 2500, b"\x02")
    payload = p1.read_bytes()[lay["offset"][4]:lay["offset"][4] + lay["size"][4]]
    report = _verify_json(vds)
    assert report["problems"] == [
        _problem("checksum", f"payload checksum mismatch: the index says {fmt.checksum_hex(lay['checksum'][4])}, the "
                 f"{lay['size'][4]} bytes at offset {lay['offset'][4]} hash to "
                 f"{fmt.checksum_hex(xxhash.xxh3_64_intdigest(payload))}",
                 sample=4, shard=1, key=lay["keys"][4], path=lay["paths"][1]),
        _shard_checksum_problem(vds, 1),
        _problem("padding", f"nonzero bytes in the padding after the payload (bytes {pad_start}..{pad_end - 1}, which "
                 f"must be zero)", sample=7, shard=2, key=lay["keys"][7], path=lay["paths"][2]),
        _shard_checksum_problem(vds, 2)]
    assert (report["ok"], report["samples_checked"], report["damaged_sample_count"]) == (False, 9, 2)


HEADER_CHANGES = [
    ({"alignment": 1024}, "header alignment 1024 disagrees with the manifest's 512"),
    ({"sample_count": 4}, "header sample_count 4 disagrees with the manifest's 3"),
    ({"file_size": 4608}, "header file_size 4608 disagrees with the manifest's size 4096"),
    ({"shard_number": 5}, "header shard_number 5 disagrees with the file name's 1"),
]


@pytest.mark.parametrize("change, message", HEADER_CHANGES)
def test_verify_header_disagreements_are_exact(vds: Path, change: dict[str, int], message: str) -> None:
    lay = _layout(vds)
    fields = dict(alignment=512, sample_count=3, file_size=4096, shard_number=1)
    fields.update(change)
    _poke(vds / lay["paths"][1], 0, fmt.ShardHeader(**fields).encode()[:fmt.SHARD_HEADER_SIZE])
    assert _verify_json(vds)["problems"] == [_problem("header", message, shard=1, path=lay["paths"][1]),
                                             _shard_checksum_problem(vds, 1)]


@pytest.mark.parametrize("position, message", [(50, "reserved header bytes 44..63 are not zero"),
                                               (100, "nonzero bytes in the header padding (64..511)"),
                                               (511, "nonzero bytes in the header padding (64..511)")])
@pytest.mark.parametrize("chunk", [None, 100])
def test_verify_header_bytes_that_must_be_zero(vds: Path, monkeypatch: pytest.MonkeyPatch, position: int,
                                               message: str, chunk: int | None) -> None:
    if chunk is not None:
        monkeypatch.setattr(verify_module, "CHUNK_SIZE", chunk)
    lay = _layout(vds)
    _poke(vds / lay["paths"][1], position, b"\x07")
    assert _verify_json(vds)["problems"] == [_problem("header", message, shard=1, path=lay["paths"][1]),
                                             _shard_checksum_problem(vds, 1)]


@pytest.mark.parametrize("where", ["in-payload", "at-payload-end", "in-padding"])
def test_verify_truncated_shard_names_exactly_the_lost_samples(vds: Path, where: str) -> None:
    lay = _layout(vds)
    end4 = lay["offset"][4] + lay["size"][4]
    keep = {"in-payload": lay["offset"][4] + 10, "at-payload-end": end4, "in-padding": end4 + 5}[where]
    first = 4 if where == "in-payload" else 5  # a sample whose whole payload is there was checked
    os.truncate(vds / lay["paths"][1], keep)
    report = _verify_json(vds)
    assert report["problems"] == [
        _problem("size", f"shard file is {keep} bytes on disk but the manifest says 4096 (truncated)", shard=1,
                 path=lay["paths"][1]),
        _problem("truncated", f"{6 - first} sample(s) lie past the end of the file ({keep} bytes) and are lost",
                 shard=1, path=lay["paths"][1], sample_range=[first, 6])]
    assert report["samples_checked"] == 9 - (6 - first) and report["bytes_read"] == 3584 + keep + 3584


@pytest.mark.parametrize("chunk", [None, 1000])
def test_verify_extended_shard_reads_only_the_listed_bytes(vds: Path, monkeypatch: pytest.MonkeyPatch,
                                                           chunk: int | None) -> None:
    if chunk is not None:
        monkeypatch.setattr(verify_module, "CHUNK_SIZE", chunk)
    lay = _layout(vds)
    with open(vds / lay["paths"][2], "ab") as handle:
        handle.write(b"\x05" * 100)
    report = _verify_json(vds)
    assert report["problems"] == [_problem("size", "shard file is 3684 bytes on disk but the manifest says 3584 "
                                                   "(extended)", shard=2, path=lay["paths"][2])]
    assert (report["samples_checked"], report["bytes_read"]) == (9, 3584 + 4096 + 3584)


def test_verify_unopenable_shards_are_missing_with_the_reason(vds: Path, tmp_path: Path) -> None:
    lay = _layout(vds)
    paths = [vds / p for p in lay["paths"]]
    paths[0].unlink()
    paths[1].unlink()
    paths[1].mkdir()
    paths[2].unlink()
    paths[2].symlink_to(paths[2])  # a link to itself: opening it fails with ELOOP
    outside = tmp_path / "elsewhere.pks"
    outside.write_bytes(b"")
    report = _verify_json(vds)

    def missing(shard: int, why: str) -> dict[str, Any]:
        first, end = lay["ranges"][shard]
        return _problem("missing", f"{why}: its 3 samples cannot be read", shard=shard, path=lay["paths"][shard],
                        sample_range=[first, end])

    assert report["problems"] == [
        missing(0, "shard file is missing"), missing(1, "is not a regular file"),
        missing(2, f"cannot open the shard file (cannot open {lay['paths'][2]}: Too many levels of symbolic links)")]
    assert (report["shards_checked"], report["samples_checked"], report["damaged_sample_count"]) == (0, 0, 9)
    paths[0].symlink_to(outside)
    assert _verify_json(vds)["problems"][0] == missing(0, "resolves outside the dataset folder; not read")


@pytest.mark.parametrize("error, text", [(OSError(errno.EIO, "Input/output error"), "Input/output error"),
                                         (OSError("the disk went away"), "the disk went away")])
def test_verify_an_error_reading_the_header_is_an_io_problem(vds: Path, monkeypatch: pytest.MonkeyPatch,
                                                             error: OSError, text: str) -> None:
    lay = _layout(vds)
    real_pread = os.pread

    def pread(fd: int, count: int, offset: int) -> bytes:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(lay["paths"][1]):
            raise error
        return real_pread(fd, count, offset)

    monkeypatch.setattr(verify_module.os, "pread", pread)
    report = _verify_json(vds)
    monkeypatch.undo()
    assert report["problems"] == [_problem("io", f"reading the shard failed: {text}", shard=1, path=lay["paths"][1])]
    assert (report["shards_checked"], report["samples_checked"]) == (2, 6)


@pytest.mark.parametrize("fail_at, lost", [(1000, [3, 6]), (2000, [4, 6]), (3700, None)])
def test_verify_a_read_error_names_the_unchecked_samples(vds: Path, monkeypatch: pytest.MonkeyPatch,
                                                         fail_at: int, lost: list[int] | None) -> None:
    """A read error after the last payload (only padding unread) loses no sample."""
    lay = _layout(vds)
    real_preadv = os.preadv
    monkeypatch.setattr(verify_module, "CHUNK_SIZE", fail_at)

    def preadv(fd: int, buffers: list, position: int) -> int:
        if position >= fail_at and os.readlink(f"/proc/self/fd/{fd}").endswith(lay["paths"][1]):
            raise OSError(errno.EIO, "Input/output error")
        return real_preadv(fd, buffers, position)

    monkeypatch.setattr(verify_module.os, "preadv", preadv)
    report = _verify_json(vds)
    monkeypatch.undo()
    assert report["problems"] == [_problem(
        "io", f"reading the shard failed at byte {fail_at}: Input/output error; the samples from there on were not "
              f"checked", shard=1, path=lay["paths"][1], sample_range=lost)]


@pytest.mark.parametrize("shrink_to", [1000, 1001])
def test_verify_a_shard_that_shrinks_while_read(vds: Path, monkeypatch: pytest.MonkeyPatch, shrink_to: int) -> None:
    """The file is cut after verify measured it: what it could not read is reported lost."""
    lay = _layout(vds)
    path = vds / lay["paths"][1]
    real_preadv = os.preadv
    monkeypatch.setattr(verify_module, "CHUNK_SIZE", 1000)

    def preadv(fd: int, buffers: list, position: int) -> int:
        if position == 1000 and os.readlink(f"/proc/self/fd/{fd}") == str(path.resolve()):
            os.truncate(path, shrink_to)
        return real_preadv(fd, buffers, position)

    monkeypatch.setattr(verify_module.os, "preadv", preadv)
    report = _verify_json(vds)
    monkeypatch.undo()
    assert report["problems"] == [_problem(
        "truncated", f"3 sample(s) lie past the end of the file ({shrink_to} bytes) and are lost", shard=1,
        path=lay["paths"][1], sample_range=[3, 6])]
    assert report["bytes_read"] == 3584 + shrink_to + 3584


def test_verify_asks_the_kernel_to_read_the_next_chunk_ahead(verify_base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int, int]] = []
    real = os.posix_fadvise
    monkeypatch.setattr(verify_module, "CHUNK_SIZE", 1000)
    monkeypatch.setattr(verify_module.os, "posix_fadvise",
                        lambda fd, offset, length, advice: (calls.append((offset, length, advice)),
                                                            real(fd, offset, length, advice))[1])
    assert verify(verify_base, workers=1).ok
    monkeypatch.undo()
    seq, need = os.POSIX_FADV_SEQUENTIAL, os.POSIX_FADV_WILLNEED
    short = [(0, 0, seq), (1000, 1000, need), (2000, 1000, need), (3000, 584, need)]
    assert calls == short + [(0, 0, seq), (1000, 1000, need), (2000, 1000, need), (3000, 1000, need),
                             (4000, 96, need)] + short


_SCANNED_HERE: list[int] = []
_REAL_SCAN_SHARD = verify_module._scan_shard


def _recording_scan(task: Any, on_progress: Any = None, buffer: Any = None) -> Any:
    """``_scan_shard`` that notes, in the process that runs it, which shard it scanned."""
    _SCANNED_HERE.append(task.shard)
    return _REAL_SCAN_SHARD(task, on_progress, buffer)


def test_verify_checks_in_this_process_or_in_workers(verify_base: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``workers=1`` (or a single shard) scans here; more workers on several shards fork a pool."""
    monkeypatch.setattr(verify_module, "_scan_shard", _recording_scan)
    one_shard = tmp_path / "one"
    build(png_folder(tmp_path / "src", 2), one_shard, BuildOptions(), workers=1, progress=False)
    two_shards = VECTORS / "valid" / "base-align512"
    for folder, workers, here in [(verify_base, 1, [0, 1, 2]), (verify_base, 0, [0, 1, 2]), (verify_base, 2, []),
                                  (verify_base, 7, []), (two_shards, 2, []), (one_shard, 2, [0])]:
        _SCANNED_HERE.clear()
        report = verify(folder, workers=workers)
        assert report.ok and _SCANNED_HERE == here, (folder, workers, _SCANNED_HERE)


def test_verify_default_workers_follow_cores_shards_and_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verify_module, "available_cpus", lambda: 4)
    unit = verify_module.BYTES_PER_WORKER
    cases = {(10, 0): 1, (10, unit - 1): 1, (10, 3 * unit + 5): 3, (2, 100 * unit): 2, (10, 100 * unit): 4,
             (0, 100 * unit): 1}
    for (shards, total), expected in cases.items():
        got = verify_module._default_workers(shards, total)
        assert type(got) is int and got == expected, (shards, total, got)


@pytest.mark.parametrize("workers", [1, 2])
def test_verify_progress_bar_only_when_asked(verify_base: Path, capsys: pytest.CaptureFixture[str],
                                             workers: int) -> None:
    verify(verify_base, workers=workers)
    assert capsys.readouterr().err == ""
    verify(verify_base, workers=workers, progress=True)
    err = capsys.readouterr().err
    assert re.search(r"(^|\r)verifying: .* 9/9 ", err), err


def test_verify_structure_problems_are_exact() -> None:
    vector = VECTORS / "invalid" / "index-overlap"
    with pytest.raises(PackerError) as caught:
        open_index(vector)
    assert caught.value.sample is not None and caught.value.path is not None
    import time as _time

    before = _time.monotonic()
    report = verify(vector, decode=True, workers=1)
    assert 0 < report.seconds <= _time.monotonic() - before
    assert report.to_json() == {"ok": False, "path": str(vector), "samples": 0, "shards": 0, "samples_checked": 0,
                                "shards_checked": 0, "bytes_read": 0, "seconds": round(report.seconds, 6),
                                "decoded": True, "damaged_sample_count": 1, "fields": {}, "unlisted": 0,
                                "problems": [_problem("structure", str(caught.value), sample=caught.value.sample,
                                                      path=caught.value.path)]}


def _edit_manifest(folder: Path, change: Callable[[dict[str, Any]], None]) -> None:
    manifest = json.loads((folder / fmt.MANIFEST_NAME).read_text())
    change(manifest)
    (folder / fmt.MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, sort_keys=True))


def test_verify_decode_refuses_an_unknown_codec_as_structure(vds: Path) -> None:
    import time as _time

    _edit_manifest(vds, lambda m: m.update(codec={"name": "zstd-future"}))
    assert verify(vds, workers=1).ok  # the bytes are still checked without decoding
    before = _time.monotonic()
    report = verify(vds, decode=True, workers=1)
    assert 0 < report.seconds <= _time.monotonic() - before
    from packer.codecs import check_decodable

    with pytest.raises(PackerError) as caught:
        check_decodable({"name": "zstd-future"}, path=vds)
    assert report.to_json() == {"ok": False, "path": str(vds), "samples": 0, "shards": 0, "samples_checked": 0,
                                "shards_checked": 0, "bytes_read": 0, "seconds": round(report.seconds, 6),
                                "decoded": True, "damaged_sample_count": 0, "fields": {}, "unlisted": 0,
                                "problems": [_problem("structure", caught.value.message, path=str(vds))]}


def _decode_problem(folder: Path, sample: int, message: str) -> dict[str, Any]:
    lay = _layout(folder)
    shard = next(s for s, (a, b) in enumerate(lay["ranges"]) if a <= sample < b)
    return _problem("decode", message, sample=sample, shard=shard, key=lay["keys"][sample], path=lay["paths"][shard])


def _limit_message(folder: Path, sample: int, limit: int) -> str:
    with open_index(folder) as index:
        shard = index.shard_of(sample)
        data = (folder / index.manifest.shards[shard].path).read_bytes()[
            int(index.index.offset[sample]):int(index.index.offset[sample]) + int(index.index.size[sample])]
        image_format = int(index.index.image_format[sample])
    with pytest.raises(PackerError) as caught:
        decode_image(data, image_format, max_pixels=limit)
    return caught.value.message


@pytest.mark.parametrize("chunk", [None, 700])
def test_verify_decodes_with_the_callers_or_the_recorded_pixel_limit(vds: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     chunk: int | None) -> None:
    """Images are 16 wide and 12..20 high: a 250-pixel limit refuses those 16 or more rows high."""
    if chunk is not None:
        monkeypatch.setattr(verify_module, "CHUNK_SIZE", chunk)
    assert verify(vds, decode=True, workers=1).ok
    with open_index(vds) as index:
        big = [i for i in range(len(index)) if int(index.index.height[i]) * 16 > 250]
    assert 0 < len(big) < 9
    expected = [_decode_problem(vds, i, _limit_message(vds, i, 250)) for i in big]
    assert _verify_json(vds, decode=True, max_pixels=250)["problems"] == expected
    _edit_manifest(vds, lambda m: m.update(limits={"max_pixels": 250}))
    assert _verify_json(vds, decode=True)["problems"] == expected
    assert verify(vds, decode=True, max_pixels=10_000, workers=1).ok


def _rewrite_index_column(folder: Path, name: str, change: Callable[[np.ndarray], None]) -> None:
    """Rewrite one index column and make the manifest's index entry (name, size, checksum) match."""
    manifest = json.loads((folder / fmt.MANIFEST_NAME).read_text())
    rows, columns = fmt.parse_column_file((folder / manifest["index"]["path"]).read_bytes(), fmt.INDEX_MAGIC)
    columns = {key: np.array(value) for key, value in columns.items()}
    change(columns[name])
    data = b"".join(bytes(p) for p in fmt.encode_column_file(fmt.INDEX_MAGIC, rows, columns))
    (folder / manifest["index"]["path"]).unlink()
    digest = fmt.checksum(data)
    manifest["index"] = {"path": fmt.index_file_name(digest), "size": len(data), "checksum": fmt.checksum_hex(digest)}
    (folder / manifest["index"]["path"]).write_bytes(data)
    (folder / fmt.MANIFEST_NAME).write_text(json.dumps(manifest))


def test_verify_decode_checks_the_recorded_shape_and_format(vds: Path) -> None:
    with open_index(vds) as index:
        height = int(index.index.height[2])
    _rewrite_index_column(vds, "width", lambda c: c.__setitem__(2, 99))
    _rewrite_index_column(vds, "image_format", lambda c: c.__setitem__(5, int(fmt.ImageFormat.BMP)))
    assert verify(vds, workers=1).ok  # the bytes hash right
    report = _verify_json(vds, decode=True)
    with open_index(vds) as index:
        data = (vds / index.manifest.shards[1].path).read_bytes()
        offset, size = int(index.index.offset[5]), int(index.index.size[5])
    with pytest.raises(PackerError) as caught:
        decode_image(data[offset:offset + size], int(fmt.ImageFormat.BMP))
    assert report["problems"] == [
        _decode_problem(vds, 2, f"decodes to {height}x16 (HxW) pixels but the index says {height}x99"),
        _decode_problem(vds, 5, caught.value.message)]


def test_verify_decode_checks_raw_payload_sizes(tmp_path: Path) -> None:
    out = tmp_path / "raw"
    build(png_folder(tmp_path / "src", 4), out, BuildOptions(codec="raw:size=12x16", alignment=512), workers=1, progress=False)
    assert verify(out, decode=True, workers=1).ok
    with open_index(out) as index:
        size = int(index.index.size[1])
    _rewrite_index_column(out, "width", lambda c: c.__setitem__(0, 0))  # unknown shape: nothing to compare
    _rewrite_index_column(out, "channels", lambda c: c.__setitem__(1, 4))
    assert _verify_json(out, decode=True)["problems"] == [
        _decode_problem(out, 1, f"raw payload is {size} bytes, not 12x16x4")]


@pytest.mark.parametrize("chunk", [1168, 2290])
def test_verify_payloads_ending_on_a_chunk_boundary(verify_base: Path, monkeypatch: pytest.MonkeyPatch,
                                                    chunk: int) -> None:
    """Shard 0's first (1168) and second (2290) payloads end exactly where a chunk ends."""
    monkeypatch.setattr(verify_module, "CHUNK_SIZE", chunk)
    for decode in (False, True):
        report = verify(verify_base, workers=1, decode=decode)
        assert report.ok and report.samples_checked == 9, report.problems


def _die_on_shard_1(task: Any, on_progress: Any = None, buffer: Any = None) -> Any:
    if task.shard == 1:
        os._exit(3)  # what an out-of-memory kill looks like to the pool
    return _REAL_SCAN_SHARD(task, on_progress, buffer)


def test_verify_a_dying_worker_is_an_exact_io_problem(verify_base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verify_module, "_scan_shard", _die_on_shard_1)
    report = verify(verify_base, workers=2)
    path = _layout(verify_base)["paths"][1]
    dead = [p.to_json() for p in report.problems if p.shard == 1]
    assert len(dead) == 1 and dead[0] == _problem("io", dead[0]["message"], shard=1, path=path)
    assert re.fullmatch(r"the process checking this shard died \(.+\); run verify with --workers 1 to see where",
                        dead[0]["message"]), dead[0]["message"]


def _scan_slowly_noting_the_pid(task: Any, on_progress: Any = None, buffer: Any = None) -> Any:
    import time as _time

    _time.sleep(0.3)  # long enough that every shard is handed out before one finishes
    result = _REAL_SCAN_SHARD(task, on_progress, buffer)
    result.problems.append(Problem(kind="io", message=str(os.getpid())))
    return result


def test_verify_runs_at_most_the_workers_asked_for(verify_base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 8)  # what an unbounded pool would size itself to
    monkeypatch.setattr(verify_module, "_scan_shard", _scan_slowly_noting_the_pid)
    report = verify(verify_base, workers=2)
    pids = {p.message for p in report.problems}
    assert len(report.problems) == 3 and len(pids) == 2 and str(os.getpid()) not in pids


# === dataset: open errors, lookups, pickling, the shard cache, reads ==============================

import pickle  # noqa: E402

from packer.dataset import Dataset, open_dataset  # noqa: E402
from packer.errors import DatasetChangedError, MisalignedRecordError  # noqa: E402

# Every invalid vector, opened and read: (error class, exact message, the file it names relative to
# the vector's folder, the sample it names). "{invalid}" stands for formats/vectors/invalid.
INVALID_VECTOR_ERRORS = {
    'index-checksum-mismatch': (ChecksumMismatchError, 'index checksum mismatch: manifest says 917373e8036c0734, file hashes to e7e643c11d83d4e6 (the index is damaged or belongs to another build)', 'index-917373e8036c0734.pki', None),
    'index-column-bad-dtype': (CorruptHeaderError, "column 'label' has unsupported dtype '<f8'", 'index-ac1df22296e4b444.pki', None),
    'index-column-bad-name': (CorruptHeaderError, "column 4 has an invalid or repeated name 'Label'", 'index-d511f47d65d0d63b.pki', None),
    'index-column-count-0': (CorruptHeaderError, 'column_count 0 outside 1..64', 'index-fe367d84e27b9a01.pki', None),
    'index-column-past-end': (OffsetOutOfBoundsError, "column 'meta' (2305843009213693952 x 1 bytes at 1664) runs past the end (1664)", 'index-e2f69e303e6864cc.pki', None),
    'index-column-wrong-dtype': (CorruptHeaderError, "index column 'label' has dtype <u8, expected <i8", 'index-778b7add6fb23e76.pki', None),
    'index-column-wrong-length': (IndexMismatchError, "index column 'width' has 2 entries, expected 3", 'index-093a3a0c86b39207.pki', None),
    'index-columns-overlap': (OverlappingRecordsError, "column 'offset' starts at 896: must be a multiple of 64 at or after 908", 'index-92c212fa5de9b8aa.pki', None),
    'index-extended': (TruncatedFileError, 'index file is 1728 bytes on disk but its header says 1664 (extended)', 'index-5c5f58b598de5f08.pki', None),
    'index-gap': (OverlappingRecordsError, 'starts at 1536 but the layout requires 1024 (samples must be packed in order at aligned offsets without overlap or gaps)', 'index-0bf3d1141ebada68.pki', 1),
    'index-header-size': (CorruptHeaderError, 'header_size 960 does not match 13 columns', 'index-d0686b0fd5670b61.pki', None),
    'index-key-offsets-decrease': (OverlappingRecordsError, "index column 'key_offsets' must start at 0, never decrease and end at the 'keys' length 27", 'index-ef6f505ac1f2776d.pki', None),
    'index-lfs-pointer': (NotAPackerFileError, "not a packer index file (starts with b'version ')", 'index-cdf888787fe6c8d8.pki', None),
    'index-misaligned-offset': (MisalignedRecordError, 'starts at 1032, not a multiple of 512', 'index-304500358b600ddb.pki', 1),
    'index-missing': (DatasetChangedError, 'index-917373e8036c0734.pki is missing: the dataset was replaced or deleted while in use, or the copy is incomplete', 'index-917373e8036c0734.pki', None),
    'index-missing-column': (CorruptHeaderError, "index lacks required column 'checksum'", 'index-c90ea7bc7f748584.pki', None),
    'index-offset-2pow62': (OffsetOutOfBoundsError, 'has an offset or size beyond 2^62', 'index-ec28fa22ffa81806.pki', 2),
    'index-offset-past-end': (OffsetOutOfBoundsError, 'shard 1 (shards/shard-00001-2dcae0495225d083.pks) is 1024 bytes but its samples end at 1536', 'index-6daa582d71d818c1.pki', 2),
    'index-overlap': (OverlappingRecordsError, 'starts at 512 but the layout requires 1024 (samples must be packed in order at aligned offsets without overlap or gaps)', 'index-bb547f5958c48607.pki', 1),
    'index-path-dotdot': (UnsafePathError, "index path '../index-917373e8036c0734.pki' is not a valid dataset path (expected index-<16 hex digits>.pki, relative, inside the dataset)", 'manifest.json', None),
    'index-row-count-2pow63': (CorruptHeaderError, 'row_count 9223372036854775808 exceeds the limit 1099511627776', 'index-280763de4e675a39.pki', None),
    'index-row-count-mismatch': (IndexMismatchError, "index holds 2 samples but the manifest's shards hold 3", 'index-812b89bc9cbc526b.pki', None),
    'index-shard-order': (OverlappingRecordsError, "is in shard 1 but the manifest's per-shard counts place it in shard 0", 'index-811dd1077b09005f.pki', 1),
    'index-shard-out-of-range': (OffsetOutOfBoundsError, 'names shard 7 but the manifest lists 2', 'index-3303bcf6741ac87d.pki', 2),
    'index-short': (TruncatedFileError, 'index file is 10 bytes, shorter than its 64-byte header', 'index-8bd86b4b938f4ecc.pki', None),
    'index-size-zero': (CorruptHeaderError, 'has size 0; every sample holds at least one byte', 'index-849a29a2686450c6.pki', 1),
    'index-truncated': (TruncatedFileError, 'is 1600 bytes on disk but the manifest says 1664 (truncated)', 'index-917373e8036c0734.pki', None),
    'index-version-2': (UnsupportedVersionError, 'index format version 2 is not supported (this reader accepts [1]); upgrade packer', 'index-44b0e9c9c6f5083c.pki', None),
    'label-out-of-range': (IndexMismatchError, 'has label 2 but the manifest lists 2 classes', 'index-0a0f7228b99bbcf4.pki', 0),
    'manifest-alignment-768': (ManifestError, 'alignment must be a power of two between 1 and 16777216, got 768', 'manifest.json', None),
    'manifest-bool-as-int': (ManifestError, "manifest field 'sample_count' must be an integer, got a boolean", 'manifest.json', None),
    'manifest-checksum-algorithm': (ManifestError, "checksum_algorithm 'crc32' is not 'xxh3_64'", 'manifest.json', None),
    'manifest-checksum-uppercase': (ManifestError, "shard 0 checksum must be 16 lowercase hex digits, got '73B4D06BBB44B44D'", 'manifest.json', None),
    'manifest-classes-string': (ManifestError, "manifest field 'classes' must be an array, got a string", 'manifest.json', None),
    'manifest-count-2pow63': (ManifestError, "manifest field 'sample_count' = 9223372036854775808 outside 0..1099511627776", 'manifest.json', None),
    'manifest-history-not-list': (ManifestError, "manifest 'build' must be an object and 'history' a list of objects", 'manifest.json', None),
    'manifest-is-a-folder': (NotAPackerFileError, 'manifest.json is not a regular file', 'manifest.json', None),
    'manifest-lfs-pointer': (NotAPackerFileError, "not a packer manifest (starts with b'version https://')", 'manifest.json', None),
    'manifest-missing': (NotAPackerFileError, 'no manifest.json: not a packer dataset (an unfinished build is here: finish it with `packer build --resume`)', '.', None),
    'manifest-missing-codec': (ManifestError, "manifest lacks required field 'codec'", 'manifest.json', None),
    'manifest-nan': (ManifestError, 'manifest is not valid UTF-8 JSON: NaN is not valid JSON', 'manifest.json', None),
    'manifest-not-utf8': (ManifestError, "manifest is not valid UTF-8 JSON: 'utf-8' codec can't decode byte 0xff in position 678: invalid start byte", 'manifest.json', None),
    'manifest-shard-size-2pow62': (ManifestError, "manifest shard 0 field 'size' = 4611686018427387904 outside 1..4611686018427387903", 'manifest.json', None),
    'manifest-truncated-json': (ManifestError, 'manifest is not valid UTF-8 JSON: Unterminated string starting at: line 29 column 25 (char 646)', 'manifest.json', None),
    'manifest-version-2': (UnsupportedVersionError, 'dataset format version 2 is not supported (this reader accepts [1]); upgrade packer', 'manifest.json', None),
    'manifest-version-string': (ManifestError, "manifest field 'format_version' must be an integer, got a string", 'manifest.json', None),
    'manifest-wrong-format': (NotAPackerFileError, "manifest format is 'webdataset', expected 'packer-dataset'", 'manifest.json', None),
    'path-absolute': (UnsafePathError, "shard 0 path '/tmp/shards/shard-00000-73b4d06bbb44b44d.pks' is not a valid dataset path (expected shards/shard-<number, at least 5 digits>-<16 hex digits>.pks, relative, inside the dataset)", 'manifest.json', None),
    'path-dotdot': (UnsafePathError, "shard 1 path 'shards/../shards/shard-00001-2dcae0495225d083.pks' is not a valid dataset path (expected shards/shard-<number, at least 5 digits>-<16 hex digits>.pks, relative, inside the dataset)", 'manifest.json', None),
    'path-short-number': (UnsafePathError, "shard 0 path 'shards/shard-0-73b4d06bbb44b44d.pks' is not a valid dataset path (expected shards/shard-<number, at least 5 digits>-<16 hex digits>.pks, relative, inside the dataset)", 'manifest.json', None),
    'sample-count-sum': (ManifestError, "sample_count 4 differs from the sum of the shards' counts 3", 'manifest.json', None),
    'shard-alignment-3': (CorruptHeaderError, 'alignment must be a power of two between 1 and 16777216, got 3', 'shards/shard-00000-056e254f620e0927.pks', None),
    'shard-bad-magic': (NotAPackerFileError, "not a packer shard (starts with b'\\x1f\\x8b\\x08\\x00\\x00\\x00\\x00\\x00')", 'shards/shard-00000-6ea95062343d6360.pks', None),
    'shard-count-2pow63': (CorruptHeaderError, 'sample_count 9223372036854775808 outside 1..1099511627776', 'shards/shard-00000-eaf8789143aaad97.pks', None),
    'shard-data-offset': (CorruptHeaderError, 'data_offset 64 must be 512 for alignment 512', 'shards/shard-00000-7e992f356290da6b.pks', None),
    'shard-extended': (TruncatedFileError, 'is 1536 bytes on disk but the manifest says 1024 (extended)', 'shards/shard-00001-2dcae0495225d083.pks', None),
    'shard-extended-manifest-updated': (OffsetOutOfBoundsError, 'shard 1 (shards/shard-00001-2a9822bb6e3fafbc.pks) is 1536 bytes but its samples end at 1024', 'index-917373e8036c0734.pki', 2),
    'shard-file-size-not-multiple': (CorruptHeaderError, 'file_size 1000 must be a multiple of 512, hold at least one sample and be below 2^62', 'shards/shard-00000-86c9395e89daeaaf.pks', None),
    'shard-header-alignment-mismatch': (ManifestError, 'shard header (alignment 256, 2 samples, number 0) disagrees with the manifest (alignment 512, 2 samples, number 0)', 'shards/shard-00000-a92e4d12ce4d53f2.pks', None),
    'shard-header-count-mismatch': (ManifestError, 'shard header (alignment 512, 1 samples, number 0) disagrees with the manifest (alignment 512, 2 samples, number 0)', 'shards/shard-00000-d95eeb7603d921a8.pks', None),
    'shard-header-number-mismatch': (ManifestError, 'shard header (alignment 512, 1 samples, number 5) disagrees with the manifest (alignment 512, 1 samples, number 1)', 'shards/shard-00001-a73b54fcd8e55ba0.pks', None),
    'shard-header-size-mismatch': (TruncatedFileError, 'shard is 1536 bytes on disk but its header says 2048 (truncated)', 'shards/shard-00000-bd1810c75afd1316.pks', None),
    'shard-is-a-folder': (NotAPackerFileError, 'shards/shard-00001-2dcae0495225d083.pks is not a regular file', 'shards/shard-00001-2dcae0495225d083.pks', None),
    'shard-listed-twice': (ManifestError, 'manifest shard 2 (shards/shard-00000-73b4d06bbb44b44d.pks) is not numbered after the shard before it (1); shards must be listed in increasing number order', 'manifest.json', None),
    'shard-missing': (DatasetChangedError, 'shards/shard-00001-2dcae0495225d083.pks is missing: the dataset was replaced or deleted while in use, or the copy is incomplete', 'shards/shard-00001-2dcae0495225d083.pks', None),
    'shard-size-not-multiple': (ManifestError, 'manifest shard 1 size 1000 is not a multiple of the alignment 512', 'manifest.json', None),
    'shard-truncated': (TruncatedFileError, 'is 924 bytes on disk but the manifest says 1024 (truncated)', 'shards/shard-00001-2dcae0495225d083.pks', None),
    'shard-version-2': (UnsupportedVersionError, 'shard format version 2 is not supported (this reader accepts [1]); upgrade packer', 'shards/shard-00000-01752482eaed4b87.pks', None),
    'shards-not-increasing': (ManifestError, 'manifest shard 1 (shards/shard-00000-73b4d06bbb44b44d.pks) is not numbered after the shard before it (1); shards must be listed in increasing number order', 'manifest.json', None),
    'symlink-escape': (UnsafePathError, "'shards/shard-00001-2dcae0495225d083.pks' resolves outside the dataset folder (to {invalid}/outside-the-dataset.pks)", '.', None),
}


@pytest.mark.parametrize("name", sorted(INVALID_VECTOR_ERRORS))
def test_invalid_vectors_name_the_exact_error_file_and_sample(name: str) -> None:
    folder = (VECTORS / "invalid" / name).resolve()
    error, message, where, sample = INVALID_VECTOR_ERRORS[name]
    with pytest.raises(PackerError) as caught:
        with open_dataset(folder) as dataset:
            for i in range(len(dataset)):
                dataset.read(i)
    assert type(caught.value) is error
    assert caught.value.message == message.replace("{invalid}", str(VECTORS.resolve() / "invalid"))
    assert caught.value.path is not None and os.path.relpath(caught.value.path, folder) == where
    assert caught.value.sample == sample


def _refusal(folder: Path) -> tuple[type, str, str | None]:
    with pytest.raises(PackerError) as caught:
        open_index(folder)
    return type(caught.value), caught.value.message, caught.value.path


def test_open_refuses_what_is_not_a_dataset_and_says_what_it_is(tmp_path: Path) -> None:
    no_manifest = "no manifest.json: not a packer dataset"
    staging = " (an unfinished build is here: finish it with `packer build --resume`)"
    report = (f" (a build that packed nothing left {fmt.REPORT_NAME} here: it lists every rejected file "
              f"and why)")
    assert _refusal(tmp_path / "nope") == (NotAPackerFileError, "dataset folder does not exist", str(tmp_path / "nope"))
    (tmp_path / "file").write_bytes(b"x")
    assert _refusal(tmp_path / "file") == (
        NotAPackerFileError, "not a dataset folder (expected a folder holding manifest.json)", str(tmp_path / "file"))
    cases = {"empty": ([], no_manifest), "staging": ([".packer-build/"], no_manifest + staging),
             "failed": ([fmt.REPORT_NAME], no_manifest + report),
             "both": ([".packer-build/", fmt.REPORT_NAME], no_manifest + staging),
             "report-folder": ([fmt.REPORT_NAME + "/"], no_manifest)}
    for name, (entries, message) in cases.items():
        folder = tmp_path / name
        folder.mkdir()
        for entry in entries:
            if entry.endswith("/"):
                (folder / entry).mkdir()
            else:
                (folder / entry).write_text("{}\n")
        assert _refusal(folder) == (NotAPackerFileError, message, str(folder)), name
    big = tmp_path / "big"
    big.mkdir()
    with open(big / fmt.MANIFEST_NAME, "wb") as handle:
        handle.truncate(fmt.MAX_MANIFEST_BYTES + 1)  # sparse: never read, refused by its size
    assert _refusal(big) == (ManifestError, f"manifest is over the {fmt.MAX_MANIFEST_BYTES} bytes limit",
                             str(big / fmt.MANIFEST_NAME))
    with open(big / fmt.MANIFEST_NAME, "r+b") as handle:
        handle.truncate(fmt.MAX_MANIFEST_BYTES)
    error, message, _ = _refusal(big)  # at the limit it is read (and is not a manifest)
    assert (error, message) == (NotAPackerFileError, f"not a packer manifest (starts with {bytes(16)!r})")


def _rewrite_index(folder: Path, change: Callable[[dict[str, np.ndarray]], None]) -> None:
    """Rewrite the index's columns and make the manifest's index entry (name, size, checksum) match."""
    manifest = json.loads((folder / fmt.MANIFEST_NAME).read_text())
    rows, columns = fmt.parse_column_file((folder / manifest["index"]["path"]).read_bytes(), fmt.INDEX_MAGIC)
    columns = {key: np.array(value) for key, value in columns.items()}
    change(columns)
    data = b"".join(bytes(p) for p in fmt.encode_column_file(fmt.INDEX_MAGIC, rows, columns))
    (folder / manifest["index"]["path"]).unlink()
    digest = fmt.checksum(data)
    manifest["index"] = {"path": fmt.index_file_name(digest), "size": len(data), "checksum": fmt.checksum_hex(digest)}
    (folder / manifest["index"]["path"]).write_bytes(data)
    (folder / fmt.MANIFEST_NAME).write_text(json.dumps(manifest))


@pytest.fixture
def base3(tmp_path: Path) -> Path:
    """A private copy of the base-align512 vector: cat/a.png, cat/b.jpg, dog/c.bmp in 2 shards."""
    return Path(shutil.copytree(VECTORS / "valid" / "base-align512", tmp_path / "base3"))


def _with_blob(column: str, pieces: list[bytes]) -> Callable[[dict[str, np.ndarray]], None]:
    """Replace a variable-length column (keys, meta) and its offsets by ``pieces``."""

    def change(columns: dict[str, np.ndarray]) -> None:
        columns[column] = np.frombuffer(b"".join(pieces), dtype=np.uint8).copy()
        columns[column[:-1] + "_offsets" if column == "keys" else "meta_offsets"] = np.cumsum(
            [0] + [len(p) for p in pieces]).astype(np.uint64)

    return change


def test_index_labels_outside_the_class_list_name_the_first_one(base3: Path) -> None:
    for labels, bad, label in [([0, 1, 2], 2, 2), ([0, -1, 1], 1, -1), ([1, 0, 5], 2, 5), ([0, 1, 1], None, None)]:
        _rewrite_index(base3, lambda c: c.__setitem__("label", np.array(labels, dtype=np.int64)))
        if bad is None:
            assert open_index(base3).labels.tolist() == labels
            continue
        error, message, path = _refusal(base3)
        assert (error, message) == (IndexMismatchError, f"has label {label} but the manifest lists 2 classes")
        with pytest.raises(IndexMismatchError) as caught:
            open_index(base3)
        assert caught.value.sample == bad and Path(path).name == json.loads(
            (base3 / fmt.MANIFEST_NAME).read_text())["index"]["path"]


def test_a_one_byte_index_file_is_too_short_for_its_header(base3: Path) -> None:
    manifest = json.loads((base3 / fmt.MANIFEST_NAME).read_text())
    (base3 / manifest["index"]["path"]).unlink()
    name = fmt.index_file_name(fmt.checksum(b"P"))
    (base3 / name).write_bytes(b"P")
    manifest["index"] = {"path": name, "size": 1, "checksum": fmt.checksum_hex(fmt.checksum(b"P"))}
    (base3 / fmt.MANIFEST_NAME).write_text(json.dumps(manifest))
    error, message, path = _refusal(base3)
    assert (error, message, Path(path).name) == (
        TruncatedFileError, "index file is 1 bytes, shorter than its 64-byte header", name)


def test_find_matches_whole_keys_only(base3: Path) -> None:
    """Keys that hold other keys: "a/z.png" inside "a/a/z.png", "111" overlapping "z1"."""
    keys = ["a/a/z.png", "z1", "111"]
    _rewrite_index(base3, _with_blob("keys", [k.encode() for k in keys]))
    with open_index(base3) as index:
        assert list(index.keys()) == keys
        assert [index.find(k) for k in keys] == [0, 1, 2]
        _rewrite_index(base3, _with_blob("keys", [b"a/a/z.png", b"a/z.png", b"111"]))
    with open_index(base3) as index:
        assert index.find("a/z.png") == 1 and index.find("a/a/z.png") == 0
        for missing in ["z.png", "a/a", "pnga/z", "11", "1111", "a/z.pn", "", "\udc80", 7, None]:
            with pytest.raises(KeyError) as caught:
                index.find(missing)  # type: ignore[arg-type]
            assert caught.value.args == (missing,)
    _rewrite_index(base3, _with_blob("keys", [b"x", b"a/z.png", b"b/a/z.png"]))  # the false match comes last
    with open_index(base3) as index:
        assert [index.find(k) for k in ("x", "a/z.png", "b/a/z.png")] == [0, 1, 2]
    with open_index(VECTORS / "valid" / "empty") as index:
        for key in ("X", "XX", "a"):
            with pytest.raises(KeyError):
                index.find(key)


def test_keys_that_are_not_utf8_are_shown_with_replacement_characters(base3: Path) -> None:
    _rewrite_index(base3, _with_blob("keys", [b"cat/\xff.png", b"cat/b.jpg", b"dog/c.bmp"]))
    with open_index(base3) as index:
        assert index.key(0) == "cat/\ufffd.png"


def test_sample_numbers_are_checked_like_a_sequence(base3: Path, tmp_path: Path) -> None:
    with open_index(base3) as index:
        assert [index.key(i) for i in (-3, -1, 0, 2)] == ["cat/a.png", "dog/c.bmp", "cat/a.png", "dog/c.bmp"]
        assert index.shard_of(-1) == 1 and index.shard_of(1) == 0
        for bad in (3, -4, 10):
            with pytest.raises(IndexError) as caught:
                index.key(bad)
            assert str(caught.value) == f"sample {bad} out of range for a dataset of 3 samples"
    with open_index(VECTORS / "valid" / "empty") as index:
        with pytest.raises(IndexError, match="^sample 0 out of range for a dataset of 0 samples$"):
            index.key(0)


def test_metadata_forms_and_refusals(base3: Path) -> None:
    depth = fmt.MAX_JSON_DEPTH
    deepest = ("[" * depth + "]" * depth).encode()
    _rewrite_index(base3, _with_blob("meta", [b'{"a": 1}', b"", b"[1, 2]"]))
    with open_index(base3) as index:
        assert [index.metadata(i) for i in range(3)] == [{"a": 1}, {}, {"value": [1, 2]}]
        assert index.metadata(-3) == {"a": 1}
    _rewrite_index(base3, _with_blob("meta", [b"", deepest, b"[" + deepest + b"]"]))
    with open_index(base3) as index:
        assert index.metadata(1) == {"value": json.loads(deepest)}
        with pytest.raises(IndexMismatchError) as caught:
            index.metadata(-1)
        assert (caught.value.message, caught.value.sample, caught.value.path) == (
            f"holds metadata nested {depth + 1} levels deep; readers decode at most {depth}", 2, str(base3))
    _rewrite_index(base3, _with_blob("meta", [b"", b"{not json", b""]))
    with open_index(base3) as index:
        with pytest.raises(IndexMismatchError) as caught:
            index.metadata(1)
        assert (caught.value.message, caught.value.sample, caught.value.path) == (
            "holds metadata that is not JSON", 1, str(base3))


def test_sample_info_is_exact() -> None:
    with open_index(VECTORS / "valid" / "base-align512") as index:
        info = index.sample_info(-1)
        ix = index.index
        assert info == {"index": 2, "key": "dog/c.bmp", "label": 1, "class": "dog", "shard": 1,
                        "shard_path": index.manifest.shards[1].path, "offset": int(ix.offset[2]),
                        "size": int(ix.size[2]), "checksum": fmt.checksum_hex(int(ix.checksum[2])),
                        "width": int(ix.width[2]), "height": int(ix.height[2]), "channels": int(ix.channels[2]),
                        "image_format": "bmp", "metadata": {}}
        assert index.sample_info(0)["class"] == "cat"
    with open_index(VECTORS / "valid" / "manifest-metadata") as index:  # no classes; labels 123456789, -1, 0, 7
        assert [index.sample_info(i)["class"] for i in range(4)] == [None] * 4
        assert index.sample_info(2)["metadata"] == {"caption": "ünicode ✓", "n": 3}
    with open_index(VECTORS / "valid" / "unknown-fields") as index:  # image_format 200 is reserved
        assert index.sample_info(0)["image_format"] == "unknown"


def test_dataset_defaults_and_options() -> None:
    folder = VECTORS / "valid" / "base-align512"
    with Dataset(folder) as dataset:
        assert (dataset.backend_name, dataset.verify_checksums, dataset.max_open_shards) == ("mmap", False, 64)
    with open_dataset(folder, backend="pread", verify_checksums=True, max_open_shards=1) as dataset:
        assert (dataset.backend_name, dataset.verify_checksums, dataset.max_open_shards) == ("pread", True, 1)
        assert dataset.read(2) == bytes(Dataset(folder)[2])
    with open_dataset(folder, max_open_shards=0) as dataset:
        assert dataset.max_open_shards == 1


def test_checksums_are_verified_only_when_asked() -> None:
    folder = VECTORS / "invalid" / "sample-checksum-mismatch"
    with open_dataset(folder) as dataset:
        for i in range(len(dataset)):
            dataset.read(i)  # the default trusts the index: no hashing on the hot path
        damaged = [i for i in range(len(dataset)) if fmt.checksum(dataset.read(i)) != int(dataset.index.checksum[i])]
        assert len(damaged) == 1
        bad = damaged[0]
        shard_path = dataset.manifest.shards[dataset.shard_of(bad)].path
        offset = int(dataset.index.offset[bad])
        assert list(dataset.iter_samples()) and len(dataset.read_batch([bad])) == 1
    with open_dataset(folder, verify_checksums=True) as dataset:
        calls = {"get": lambda: dataset.get(bad - len(dataset)), "batch": lambda: dataset.read_batch([bad - len(dataset)]),
                 "iter": lambda: list(dataset.iter_samples([bad]))}
        for name, call in calls.items():
            with pytest.raises(ChecksumMismatchError) as caught:
                call()
            assert (caught.value.sample, caught.value.path) == (bad, shard_path), name
            assert caught.value.offset == (offset if name == "get" else None), name


def test_a_pickled_dataset_reopens_the_same_version(tmp_path: Path) -> None:
    folder = Path(shutil.copytree(VECTORS / "valid" / "base-align512", tmp_path / "ds"))
    with open_dataset(folder, backend="pread", verify_checksums=True, max_open_shards=1) as dataset:
        data = pickle.dumps(dataset)
        expected = [dataset.read(i) for i in range(3)]
    manifest = (folder / fmt.MANIFEST_NAME).read_bytes()
    (folder / fmt.MANIFEST_NAME).unlink()  # the worker uses the manifest bytes it was sent
    clone = pickle.loads(data)
    assert (clone.path, clone.backend_name, clone.verify_checksums, clone.max_open_shards) == (folder, "pread", True, 1)
    assert [clone.read(i) for i in range(3)] == expected
    clone.close()
    (folder / fmt.MANIFEST_NAME).write_bytes(manifest)
    index_file = folder / json.loads(manifest)["index"]["path"]
    index_bytes = index_file.read_bytes()
    index_file.write_bytes(index_bytes[:-1] + bytes([index_bytes[-1] ^ 1]))
    with pytest.raises(DatasetChangedError) as caught:
        pickle.loads(data)
    assert caught.value.path == str(folder)
    assert caught.value.message.startswith("the dataset changed since it was opened in the parent process: ")
    assert "index checksum mismatch" in caught.value.message
    index_file.unlink()
    with pytest.raises(DatasetChangedError) as caught:
        pickle.loads(data)
    assert caught.value.message.endswith("is missing: the dataset was replaced or deleted while in use, or the copy "
                                         "is incomplete")


def _mapped_shards(folder: Path) -> set[str]:
    with open("/proc/self/maps") as maps:
        return {Path(line.split()[-1]).name for line in maps if str(folder) in line and line.rstrip().endswith(".pks")}


def test_open_shards_are_an_lru_of_the_asked_size(tmp_path: Path) -> None:
    folder = Path(shutil.copytree(VECTORS / "valid" / "align1", tmp_path / "ds"))  # 3 shards
    with open_dataset(folder, max_open_shards=2) as dataset:
        names = [Path(s.path).name for s in dataset.manifest.shards]
        first = [dataset.index.shard.tolist().index(s) for s in range(3)]
        for shard in (0, 1, 0, 2):  # shard 1 is the least recently used when shard 2 opens
            assert bytes(dataset.get(first[shard]))
        assert _mapped_shards(folder) == {names[0], names[2]}
        assert dataset.shard(0) is dataset.shard(0)
    assert _mapped_shards(folder) == set()


def test_a_shard_cut_after_it_was_opened_names_its_file(tmp_path: Path) -> None:
    folder = Path(shutil.copytree(VECTORS / "valid" / "base-align512", tmp_path / "ds"))
    with open_dataset(folder, backend="pread") as dataset:
        shard = folder / dataset.manifest.shards[0].path
        dataset.shard(0)
        os.truncate(shard, 600)
        with pytest.raises(TruncatedFileError) as caught:
            dataset.read(1)
        assert caught.value.path == str(shard.resolve())


def test_a_forked_child_opens_its_own_shards() -> None:
    with open_dataset(VECTORS / "valid" / "base-align512") as dataset:
        parents = dataset.shard(0)
        pid = os.fork()
        if pid == 0:  # the child: exit status 0 only if it opened and then kept its own backend
            ok = False
            try:
                mine = dataset.shard(0)
                ok = mine is not parents and dataset.shard(0) is mine and bytes(dataset.get(0)) == dataset.read(0)
            finally:
                os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert dataset.shard(0) is parents


def test_batches_and_iteration_check_their_indices() -> None:
    with open_dataset(VECTORS / "valid" / "base-align512") as dataset:
        every = [dataset.read(i) for i in range(3)]
        empty = dataset.read_batch([])
        assert len(empty) == 0 and empty.data.dtype == np.uint8 and empty.data.shape == (0,)
        assert empty.starts.dtype == np.int64 and empty.starts.shape == (0,) == empty.sizes.shape
        assert empty.sizes.dtype == np.int64
        batch = dataset.read_batch(np.array([[2, -3], [-1, 1]]))
        assert [bytes(batch[j]) for j in range(4)] == [every[2], every[0], every[2], every[1]]
        with open_dataset(VECTORS / "valid" / "base-align512", verify_checksums=True) as checked:
            batch = checked.read_batch(np.array([[2, -3], [-1, 1]]))
            assert [bytes(batch[j]) for j in range(4)] == [every[2], every[0], every[2], every[1]]
        assert [bytes(b) for b, _ in dataset.iter_samples([-3, -1, 2])] == [every[0], every[2], every[2]]
        for bad in ([3], [-4], [0, 3], [-4, 1], [-4, 3]):
            with pytest.raises(IndexError, match=r"^batch holds an index outside 0\.\.2$"):
                dataset.read_batch(bad)
            with pytest.raises(IndexError, match=r"^indices hold a value outside 0\.\.2$"):
                list(dataset.iter_samples(bad))
        assert [label for _, label in dataset.iter_samples()] == [0, 0, 1]


def test_iteration_over_a_one_sample_dataset(tmp_path: Path) -> None:
    out = tmp_path / "one"
    build(png_folder(tmp_path / "src", 1), out, BuildOptions(), workers=1, progress=False)
    with open_dataset(out) as dataset:
        assert [bytes(b) for b, _ in dataset.iter_samples([-1, 0])] == [dataset.read(0)] * 2


# === codecs/tiles: the tiled window cutter and the reasons a JPEG stays untiled =====================

import dataclasses  # noqa: E402
import sys  # noqa: E402

from packer.codecs import tiles as tiles_module  # noqa: E402


def _jpeg_bytes(height: int, width: int, **options: Any) -> bytes:
    rng = np.random.default_rng(3)
    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([x % 256, y % 256, (x + y) % 256], axis=-1) + rng.integers(0, 20, (height, width, 3))
    buffer = _io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buffer, "JPEG", **options)
    return buffer.getvalue()


def _with_comment(jpeg: bytes, size: int) -> bytes:
    """``jpeg`` with a COM segment of ``size`` payload bytes right after SOI (a length >= 256 spans two bytes)."""
    return jpeg[:2] + b"\xff\xfe" + struct.pack(">H", size + 2) + bytes(range(256)) * (size // 256) + bytes(size % 256) + jpeg[2:]


def _frame(marker: int, precision: int = 8) -> bytes:
    """SOI and a bare frame header: enough for the marker walk, not a decodable JPEG."""
    return b"\xff\xd8\xff" + bytes([marker]) + struct.pack(">HB", 11, precision) + bytes(8)


def _as_buffers(data: bytes) -> list[Any]:
    return [data, bytearray(data), memoryview(data), np.frombuffer(data, dtype=np.uint8)]


def test_untiled_reason_reads_every_frame_kind() -> None:
    expected = {0xC2: "progressive", 0xC6: "progressive", 0xC3: "lossless", 0xC7: "lossless",
                **{m: "arithmetic" for m in (0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF)}}
    for marker, reason in expected.items():
        assert tiles_module.untiled_reason(_frame(marker)) == reason, hex(marker)
    assert tiles_module.untiled_reason(_frame(0xC0, 12)) == "12-bit"
    assert tiles_module.untiled_reason(_frame(0xC1, 16)) == "16-bit"
    for marker in (0xCC, 0xD0, 0xC0, 0xC4):  # DAC, RST0, an 8-bit baseline frame, DHT: no verdict from the header
        assert tiles_module.untiled_reason(_frame(marker)) == "damaged or multi-scan", hex(marker)


def test_untiled_reason_at_the_end_of_the_bytes() -> None:
    assert tiles_module.untiled_reason(b"\xff\xd8\xff\xc2\x00\x02") == "progressive"  # a 4-byte segment at the end
    assert tiles_module.untiled_reason(b"\xff\xd8\xff\xc0\x00\x11") == "damaged or multi-scan"  # no precision byte
    assert tiles_module.untiled_reason(b"\xff\xd8\xff\xc0\x00\x11\x0c") == "12-bit"  # the precision is the last byte
    assert tiles_module.untiled_reason(b"\xff\xd8\xff\xc2\x00") == "damaged or multi-scan"


def test_untiled_reason_skips_long_segments_in_any_buffer() -> None:
    progressive = _with_comment(_jpeg_bytes(16, 16, progressive=True), 300)
    for data in _as_buffers(progressive):
        assert tiles_module.untiled_reason(data) == "progressive", type(data)
    twelve_bit = _with_comment(_frame(0xC0, 12), 700)
    assert [tiles_module.untiled_reason(d) for d in _as_buffers(twelve_bit)] == ["12-bit"] * 4


def test_untiled_reason_asks_the_transcoder_after_the_header() -> None:
    baseline = _jpeg_bytes(24, 40)
    for data in _as_buffers(baseline + b"trailing bytes"):
        assert tiles_module.untiled_reason(data) == "data after the image"
    assert tiles_module.untiled_reason(baseline[:200]) == "damaged or multi-scan"


def test_transcoder_available_is_false_without_the_extension(monkeypatch: pytest.MonkeyPatch) -> None:
    import packer.codecs as codecs_package

    assert tiles_module.transcoder_available() is True  # the suite runs with the extension built
    monkeypatch.delattr(codecs_package, "_jpegtiles", raising=False)
    monkeypatch.setitem(sys.modules, "packer.codecs._jpegtiles", None)  # import now raises ImportError
    assert tiles_module.transcoder_available() is False


def _tiled(height: int, width: int) -> tuple[bytes, tiles_module.TileLayout]:
    data = tiles_module.transcode(_jpeg_bytes(height, width, quality=90), max_pixels=10**8)
    layout = tiles_module.read_layout(data)
    assert layout is not None and layout.rows >= 2 and layout.columns >= 2
    return data, layout


def test_window_jpeg_reads_any_contiguous_buffer_by_bytes() -> None:
    data, layout = _tiled(96, 160)
    expected = tiles_module.window_jpeg(data, layout, 1, 2, 0, 2)
    as_matrix = np.frombuffer(data, dtype=np.uint8).reshape(1, -1)
    for buffer in _as_buffers(data)[1:] + [as_matrix]:
        assert tiles_module.window_jpeg(buffer, layout, 1, 2, 0, 2) == expected, type(buffer)


def test_window_jpeg_checks_the_marker_before_the_second_row() -> None:
    """A table whose second row starts one byte late, with its first tile one byte shorter: the tile
    still ends at a restart marker, only the marker before it can tell."""
    data, layout = _tiled(96, 160)
    starts, lengths = layout.starts.copy(), layout.lengths.copy()
    first = layout.columns  # tile (row 1, column 0)
    starts[first] += 1
    lengths[first] -= 1
    shifted = dataclasses.replace(layout, starts=starts, lengths=lengths)
    with pytest.raises(ValueError) as caught:
        tiles_module.window_jpeg(data, shifted, 0, layout.columns, 0, 2)
    assert str(caught.value) == "the tile table does not match the JPEG's restart markers"


def test_window_jpeg_of_a_window_wider_than_32767_pixels() -> None:
    """JPEG dimensions are unsigned 16-bit: a 40,000-pixel-wide window is valid."""
    x = np.arange(40_000)
    pixels = np.tile(((x // 50) % 256).astype(np.uint8), (16, 1))
    buffer = _io.BytesIO()
    Image.fromarray(pixels, "L").save(buffer, "JPEG", quality=80)
    data = tiles_module.transcode(buffer.getvalue(), max_pixels=10**9)
    layout = tiles_module.read_layout(data)
    assert layout is not None and layout.rows == 2
    window, left, top = tiles_module.window_jpeg(data, layout, 0, layout.columns, 1, 2)
    assert (left, top) == (0, layout.tile_height)
    with Image.open(_io.BytesIO(bytes(window))) as image:
        assert image.size == (40_000, 16 - layout.tile_height)
    with Image.open(_io.BytesIO(data)) as whole:
        assert np.array_equal(np.asarray(Image.open(_io.BytesIO(bytes(window)))), np.asarray(whole)[layout.tile_height:])


# === torch: the sampler and reader state (orders, rank split, positions, state dicts) ===============

from types import SimpleNamespace  # noqa: E402

from packer.order import DEFAULT_BLOCK_BYTES, DEFAULT_WINDOW  # noqa: E402


@pytest.fixture(scope="module")
def torch_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """20 PNGs of distinct sizes in several 4 KiB shards (alignment 512)."""
    tmp = tmp_path_factory.mktemp("torch-kills")
    build(png_folder(tmp / "src", 20), tmp / "ds", BuildOptions(shard_size=4096, alignment=512), workers=1,
          progress=False)
    return tmp / "ds"


def _torch() -> Any:
    pytest.importorskip("torch")  # packer.torch without torch raises MissingDependencyError, not ImportError
    import packer.torch
    return packer.torch


def _reference_plan(n: int, *, order: str = "random", seed: int = 0, rank: int = 0, world_size: int = 1,
                    batch_size: int = 1, drop_last: bool = False, window: int = DEFAULT_WINDOW,
                    block_bytes: int = DEFAULT_BLOCK_BYTES, blocks: Any = None, epoch: int = 0,
                    consumed: int = 0) -> RankPlan:
    read_order = ReadOrder(kind=order, seed=seed, block_bytes=block_bytes, window=window, batch_size=batch_size,
                           drop_last=drop_last)
    return read_order.plan(n, epoch=epoch, consumed=consumed, rank=rank, world_size=world_size, blocks=blocks)


def _index_blocks_of(folder: Path, block_bytes: int) -> np.ndarray:
    with open_index(folder) as index:
        ix = index.index
        return index_blocks(ix.offset, ix.size, ix.shard, block_bytes)


def test_samplers_follow_the_order_settings(torch_base: Path) -> None:
    pt = _torch()
    small = _index_blocks_of(torch_base, 1500)
    assert not np.array_equal(small, uniform_blocks(20))  # byte blocks differ from the default sample blocks
    index = open_index(torch_base)
    cases = [  # (source, sampler options, reference options)
        (20, {}, {}),
        (np.int64(20), dict(order="sequential"), dict(order="sequential")),
        (20, dict(seed=5, rank=1, world_size=3, batch_size=4, drop_last=True),
         dict(seed=5, rank=1, world_size=3, batch_size=4, drop_last=True)),
        (20, dict(order="block", block_samples=3, window=2, seed=1),
         dict(order="block", blocks=uniform_blocks(20, 3), window=2, seed=1)),
        (20, dict(order="block", seed=1), dict(order="block", blocks=uniform_blocks(20, DEFAULT_BLOCK_SAMPLES), seed=1)),
        (index, dict(order="block", block_bytes=1500, window=1, seed=2, batch_size=3, rank=1, world_size=2),
         dict(order="block", blocks=small, block_bytes=1500, window=1, seed=2, batch_size=3, rank=1, world_size=2)),
        (pt.PackedDataset(torch_base, decode=False), dict(order="block", block_bytes=1500, seed=3),
         dict(order="block", blocks=small, block_bytes=1500, seed=3)),
        (index, dict(order="block", block_samples=4, seed=3), dict(order="block", blocks=uniform_blocks(20, 4), seed=3)),
    ]
    for source, options, reference in cases:
        sampler = pt.PackedSampler(source, **options)
        bs = options.get("batch_size", 1)
        plan = _reference_plan(20, **{**reference, "batch_size": bs})
        assert list(sampler) == plan.indices.tolist(), options
        assert len(sampler) == plan.share.per_rank
        batches = pt.PackedBatchSampler(source, **{"batch_size": 2, **options})
        plan2 = _reference_plan(20, **{**reference, "batch_size": options.get("batch_size", 2)})
        assert list(batches) == [plan2.batch(k).tolist() for k in range(plan2.num_batches)], options
        assert len(batches) == plan2.num_batches
        expected_state = ReadOrder(kind=reference.get("order", "random"), seed=reference.get("seed", 0),
                                   window=reference.get("window", DEFAULT_WINDOW)).state_dict(
            20, epoch=0, consumed=plan2.share.consumed_after(1), blocks=reference.get("blocks"))
        assert batches.state_dict(batches_consumed=1) == expected_state, options
    index.close()


def test_sampler_sources_that_are_not_datasets_are_refused() -> None:
    pt = _torch()
    for source, name in [(object(), "object"), (True, "bool"), (2.5, "float")]:
        with pytest.raises(OptionError) as caught:
            pt.PackedSampler(source)
        assert caught.value.message == f"expected a packer dataset or a sample count, got {name}"


def test_sampler_state_counts_samples_and_batches() -> None:
    pt = _torch()
    sampler = pt.PackedSampler(20, seed=4, batch_size=4, world_size=2, rank=1)
    it = iter(sampler)
    for _ in range(5):
        next(it)
    share = sampler.share()
    assert sampler.state_dict() == sampler.state_dict(samples_consumed=5)  # what it handed out: samples
    assert sampler.state_dict()["consumed"] == share.consumed_after_samples(5)
    assert sampler.state_dict(batches_consumed=2) == sampler.state_dict(samples_consumed=8)
    unsized = pt.PackedSampler(20, seed=4)
    with pytest.raises(OptionError) as caught:
        unsized.state_dict(batches_consumed=1)
    assert caught.value.message == (
        "PackedSampler yields samples and does not know your DataLoader's batch size, so batches_consumed is "
        "ambiguous: pass samples_consumed=batches * batch_size, create the sampler with batch_size=<the "
        "DataLoader's batch_size>, or use packer.torch.PackedDataLoader, which counts the batches it hands out")
    batches = pt.PackedBatchSampler(20, batch_size=3, seed=4, drop_last=True, block_samples=5, order="block")
    assert (batches.batch_size, batches.drop_last, batches.sampler.batch_size) == (3, True, 3)
    assert list(batches.sampler) == [i for b in batches for i in b]  # the same order, batch-aligned
    batches.set_epoch(2)
    assert batches.sampler.epoch == 2 and batches.epoch == 2
    it = iter(batches)
    next(it)
    next(it)
    assert batches.state_dict() == batches.state_dict(batches_consumed=2)  # what it handed out: batches


def test_resolve_rank_reads_torch_distributed(monkeypatch: pytest.MonkeyPatch) -> None:
    pt = _torch()
    import torch

    assert pt.resolve_rank() == (0, 1)
    monkeypatch.setattr(torch.distributed, "is_available", lambda: True)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 3)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 4)
    assert pt.resolve_rank() == (3, 4)
    assert pt.PackedSampler(20, seed=1).rank == 3 and pt.PackedSampler(20, seed=1).world_size == 4
    assert pt.resolve_rank(1, 2) == (1, 2)


@pytest.mark.parametrize("rank, world_size, message", [
    (1, None, "give both rank and world_size, or neither (to use torch.distributed)"),
    (None, 2, "give both rank and world_size, or neither (to use torch.distributed)"),
    (0, 0, "world_size must be a positive integer, got 0"),
    (0, 2.0, "world_size must be a positive integer, got 2.0"),
    (2, 2, "rank must be an integer in 0..1, got 2"),
    (-1, 3, "rank must be an integer in 0..2, got -1"),
    (0.0, 3, "rank must be an integer in 0..2, got 0.0"),
])
def test_resolve_rank_refusals_are_exact(rank: Any, world_size: Any, message: str) -> None:
    pt = _torch()
    with pytest.raises(OptionError) as caught:
        pt.resolve_rank(rank, world_size)
    assert caught.value.message == message


def test_packed_dataloader_counts_what_the_loop_received(torch_base: Path) -> None:
    pt = _torch()
    dataset = pt.PackedDataset(torch_base, decode=False)
    collate = lambda samples: samples  # noqa: E731  (raw payloads of different sizes)
    sampler = pt.PackedSampler(dataset, seed=2)
    loader = pt.PackedDataLoader(dataset, 4, sampler=sampler, collate_fn=collate)  # batch_size positionally
    assert loader.batch_size == 4
    assert loader.state_dict() == sampler.state_dict(samples_consumed=0)
    it = iter(loader)
    next(it)
    next(it)
    assert loader.state_dict() == sampler.state_dict(samples_consumed=8)
    saved = loader.state_dict()
    again = pt.PackedDataLoader(dataset, batch_size=4, sampler=pt.PackedSampler(dataset, seed=2), collate_fn=collate)
    again.load_state_dict(saved)
    assert again.state_dict() == saved  # nothing handed out since the load
    again.set_epoch(3)
    assert again.epoch == 3 and again.sampler.epoch == 3
    single = pt.PackedDataLoader(dataset, batch_size=None, sampler=pt.PackedSampler(dataset, seed=2))
    it = iter(single)
    for _ in range(3):
        next(it)
    assert single.state_dict() == single.sampler.state_dict(samples_consumed=3)
    iterable = pt.PackedIterableDataset(torch_base, batch_size=2, batched=False, decode=False, seed=2)
    samples = pt.PackedDataLoader(iterable, batch_size=None)
    it = iter(samples)
    for _ in range(3):
        next(it)
    assert samples.state_dict() == iterable.state_dict(samples_consumed=3)
    with pytest.raises(OptionError) as caught:
        pt.PackedDataLoader(dataset, batch_size=2)
    assert caught.value.message == ("PackedDataLoader tracks a packer reader: pass batch_sampler=PackedBatchSampler(...), "
                                    "sampler=PackedSampler(...) or a PackedIterableDataset")


def _payload_ids(folder: Path) -> Callable[[Any], list[int]]:
    with open_dataset(folder) as dataset:
        by_payload = {dataset.read(i): i for i in range(len(dataset))}
    return lambda images: [by_payload[bytes(t.numpy())] for t in images]


def _in_worker(monkeypatch: pytest.MonkeyPatch, worker: int | None, num_workers: int = 0) -> None:
    import torch.utils.data as torch_data

    info = None if worker is None else SimpleNamespace(id=worker, num_workers=num_workers)
    monkeypatch.setattr(torch_data, "get_worker_info", lambda: info)


def test_iterable_dataset_follows_its_settings_and_deals_to_workers(torch_base: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    pt = _torch()
    ids = _payload_ids(torch_base)
    small = _index_blocks_of(torch_base, 1500)
    options = dict(order="block", seed=6, rank=1, world_size=2, drop_last=True, block_bytes=1500, window=2)
    plan = _reference_plan(20, **options, batch_size=3, blocks=small)
    dataset = pt.PackedIterableDataset(torch_base, batch_size=3, decode=False, **options)
    assert dataset.dataset.verify_checksums is False and dataset.batch_size == 3
    assert [ids(images) for images, _ in dataset] == [plan.batch(k).tolist() for k in range(plan.num_batches)]
    assert len(dataset) == plan.num_batches
    samples = pt.PackedIterableDataset(torch_base, batch_size=3, decode=False, batched=False, **options)
    assert len(samples) == plan.share.per_rank
    assert [ids([image])[0] for image, _ in samples] == plan.indices.tolist()
    default = _reference_plan(20, order="block", seed=0, batch_size=2, blocks=_index_blocks_of(torch_base, DEFAULT_BLOCK_BYTES))
    assert [ids(images) for images, _ in pt.PackedIterableDataset(torch_base, batch_size=2, decode=False)] == [
        default.batch(k).tolist() for k in range(default.num_batches)]
    # in a DataLoader worker: that worker's round-robin share of the rank's batches
    for worker, num_workers in [(1, 2), (0, 3), (3, 5)]:
        _in_worker(monkeypatch, worker, num_workers)
        got = [ids(images) for images, _ in pt.PackedIterableDataset(torch_base, batch_size=3, decode=False, **options)]
        assert got == [plan.batch(k).tolist() for k in plan.worker_batches(worker, num_workers)]
    _in_worker(monkeypatch, 6, 8)  # more workers than batches: this one has none
    assert list(pt.PackedIterableDataset(torch_base, batch_size=3, decode=False, **options)) == []
    checked = pt.PackedIterableDataset(torch_base, batch_size=3, decode=False, verify_checksums=True)
    assert checked.dataset.verify_checksums is True


def test_iterable_dataset_default_state_counts_its_items(torch_base: Path) -> None:
    pt = _torch()
    for batched in (True, False):
        dataset = pt.PackedIterableDataset(torch_base, batch_size=3, decode=False, batched=batched, seed=1)
        it = iter(dataset)
        for _ in range(4):
            next(it)
        counted = dict(batches_consumed=4) if batched else dict(samples_consumed=4)
        assert dataset.state_dict() == dataset.state_dict(**counted), batched


def _worker_state_round_trip(folder: Path, monkeypatch: pytest.MonkeyPatch, *, batched: bool) -> None:
    pt = _torch()
    ids = _payload_ids(folder)
    options = dict(batch_size=2, decode=False, seed=8, batched=batched)
    _in_worker(monkeypatch, 1, 2)
    first = pt.PackedIterableDataset(folder, **options)
    first.set_epoch(1)
    items = list(first)
    it = iter(first)
    taken = [next(it) for _ in range(2 if batched else 3)]
    state = first.state_dict()
    assert state == {**first.read_order.state_dict(20, epoch=1, consumed=0, blocks=first.cursor.blocks),
                     "worker": 1, "num_workers": 2,
                     "worker_items": len(taken)}
    assert "worker" not in first.state_dict(batches_consumed=1) and "worker" not in first.state_dict(samples_consumed=2)
    json.dumps(state)
    second = pt.PackedIterableDataset(folder, **options)
    second.load_state_dict(state)
    key = (lambda item: tuple(ids(item[0]))) if batched else (lambda item: ids([item[0]])[0])
    rest = [key(item) for item in second]
    whole = [key(item) for item in items]
    skipped = 2 if batched else 2  # sample mode resumes at whole batches: 3 samples -> 1 batch of 2
    assert rest == whole[skipped:]
    assert second.state_dict()["worker_items"] == len(whole)
    assert [key(item) for item in second] == whole  # the next iteration starts the epoch part over
    state.pop("worker_items")
    third = pt.PackedIterableDataset(folder, **options)
    third.load_state_dict(state)  # no count: nothing skipped
    assert [key(item) for item in third] == whole
    for wrong, here in [((0, 2), "worker 1 of 2"), ((1, 3), "worker 1 of 2")]:
        with pytest.raises(OptionError) as caught:
            third.load_state_dict({**state, "worker": wrong[0], "num_workers": wrong[1]})
        assert caught.value.message == (f"this is the state of worker {wrong[0]} of {wrong[1]}; resume with a loader "
                                        f"of as many workers (here: {here})")
    _in_worker(monkeypatch, None)
    with pytest.raises(OptionError) as caught:
        third.load_state_dict(state)
    assert caught.value.message == ("this is the state of worker 1 of 2; resume with a loader of as many workers "
                                    "(here: no worker)")


@pytest.mark.parametrize("batched", [True, False])
def test_iterable_worker_state_resumes_in_its_worker(torch_base: Path, monkeypatch: pytest.MonkeyPatch,
                                                     batched: bool) -> None:
    _worker_state_round_trip(torch_base, monkeypatch, batched=batched)


def test_iterable_worker_state_with_a_negative_count_skips_nothing(torch_base: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    pt = _torch()
    _in_worker(monkeypatch, 0, 1)
    dataset = pt.PackedIterableDataset(torch_base, batch_size=4, decode=False, seed=2)
    whole = [labels.tolist() for _, labels in dataset]
    dataset.load_state_dict({**dataset.state_dict(), "worker_items": -3})
    assert [labels.tolist() for _, labels in dataset] == whole


def test_iterable_dataset_pickles_for_a_worker(torch_base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The copy a worker gets recomputes its blocks and advises its own shards and blocks."""
    pt = _torch()
    from packer.backends.posix import MmapShard

    ids = _payload_ids(torch_base)
    dataset = pt.PackedIterableDataset(torch_base, batch_size=3, decode=False, block_bytes=1500, seed=4)
    expected = [ids(images) for images, _ in dataset]  # the parent has advised everything once
    hints: list[tuple[str, int, int]] = []
    monkeypatch.setattr(MmapShard, "advise_willneed", lambda self, offset, size: hints.append((self.path, offset, size)))
    monkeypatch.setattr(MmapShard, "advise_random", lambda self: hints.append((self.path, -1, -1)))
    copy = pickle.loads(pickle.dumps(dataset))
    assert [ids(images) for images, _ in copy] == expected
    blocks = _index_blocks_of(torch_base, 1500)
    with open_index(torch_base) as index:
        shards = len(index.manifest.shards)
    assert sum(size == -1 for _, _, size in hints) == shards and sum(size > 0 for _, _, size in hints) == len(blocks) - 1


def test_iterable_read_ahead_asks_for_the_next_batch_before_it_is_read(torch_base: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    pt = _torch()
    from packer.backends.posix import MmapShard

    advised: set[tuple[str, int]] = set()
    monkeypatch.setattr(MmapShard, "advise_willneed",
                        lambda self, offset, size: advised.add((Path(self.path).name, offset)))
    dataset = pt.PackedIterableDataset(torch_base, batch_size=4, decode=False, block_bytes=1, seed=4)  # a block per sample
    plan = dataset.plan()
    assert plan.num_batches == 5
    with open_index(torch_base) as index:
        where = [(Path(index.manifest.shards[int(index.index.shard[i])].path).name, int(index.index.offset[i]))
                 for i in range(len(index))]
    for k, _ in enumerate(dataset):
        upto = min(k + 2, plan.num_batches)
        assert {where[i] for j in range(upto) for i in plan.batch(j)} <= advised, k
        if k + 2 < plan.num_batches:
            assert not {where[i] for i in plan.batch(k + 2)} <= advised, k  # two ahead: not yet


def test_iterable_dataset_reader_options(torch_base: Path, tmp_path: Path) -> None:
    pt = _torch()
    dataset = pt.PackedIterableDataset(torch_base, batch_size=4, order="sequential", batched=False, layout="HWC",
                                       transform=lambda t: t.float() / 2, target_transform=lambda y: y + 100)
    image, label = next(iter(dataset))
    with open_dataset(torch_base) as raw:
        pixels = decode_image(raw.read(0), int(raw.index.image_format[0]))
        assert label == int(raw.labels[0]) + 100
    assert image.dtype == torch_float32() and np.allclose(image.numpy(), pixels / 2)
    out = Path(shutil.copytree(torch_base, tmp_path / "ds"))
    _edit_manifest(out, lambda m: m.update(codec={"name": "zstd-future"}))
    for decode in (True, lambda data, image_format: data):
        with pytest.raises(PackerError) as caught:
            pt.PackedIterableDataset(out, batch_size=2, decode=decode)
        assert "zstd-future" in caught.value.message and caught.value.path == str(out)
    pt.PackedIterableDataset(out, batch_size=2, decode=False)
    _edit_manifest(out, lambda m: m.update(codec={"name": "passthrough"}, limits={"max_pixels": 100}))
    with pytest.raises(PackerError):
        next(iter(pt.PackedIterableDataset(out, batch_size=2)))  # the recorded limit refuses 16x12 images


def test_set_epoch_reaches_persistent_workers(torch_base: Path) -> None:
    pt = _torch()
    import torch.utils.data as torch_data

    ids = _payload_ids(torch_base)
    dataset = pt.PackedIterableDataset(torch_base, batch_size=5, decode=False, order="random", seed=3)
    loader = torch_data.DataLoader(dataset, batch_size=None, num_workers=1, persistent_workers=True,
                                   multiprocessing_context="fork")
    for epoch in (0, 1, 2):
        dataset.set_epoch(epoch)  # in the main process, after the worker started
        plan = _reference_plan(20, seed=3, batch_size=5, epoch=epoch)
        assert [ids(images) for images, _ in loader] == [plan.batch(k).tolist() for k in range(plan.num_batches)]


def torch_float32() -> Any:
    import torch

    return torch.float32


def test_shared_position_holds_large_positions() -> None:
    pt = _torch()
    dataset = pt.PackedIterableDataset(VECTORS / "valid" / "base-align512", batch_size=1, decode=False)
    dataset.cursor.position.set(7, 2**40 + 3)
    assert dataset.cursor.position.get() == (7, 2**40 + 3)


class _FakePlan:
    """The part of a RankPlan that _worker_share reads, for a dataset too big to build here."""

    def __init__(self, num_samples: int, batches: list[list[int]]) -> None:
        self.share = SimpleNamespace(num_samples=num_samples)
        self._batches = [np.array(b, dtype=np.int64) for b in batches]

    def batch(self, k: int) -> np.ndarray:
        return self._batches[k]

    def worker_batches(self, worker: int, num_workers: int) -> range:
        return range(worker, len(self._batches), num_workers)


def test_worker_share_keeps_indices_past_2_to_the_31() -> None:
    pt = _torch()
    for n, dtype in [(2**31 - 1, np.int32), (2**31 + 8, np.int64), (2**32 + 8, np.int64)]:
        indices, bounds = pt.iterable._worker_share(_FakePlan(n, [[n - 1, 0], [5], [n - 2]]), 0, 2)
        assert indices.dtype == dtype and indices.tolist() == [n - 1, 0, n - 2] and bounds.tolist() == [0, 2, 3]
        indices, bounds = pt.iterable._worker_share(_FakePlan(n, [[1]]), 1, 2)
        assert indices.tolist() == [] and bounds.tolist() == [0]


# === imageinfo: exact rejections, the structure walkers' edges, buffers ===========================

import warnings  # noqa: E402

from packer import imageinfo as imageinfo_module  # noqa: E402


def _rejection(data: Any, **options: Any) -> tuple[str, str, str | None]:
    with pytest.raises(RejectedImageError) as caught:
        probe_image(data, **options)
    return caught.value.reason, caught.value.message, caught.value.path


def _png(width: int, height: int) -> bytes:
    buffer = _io.BytesIO()
    Image.new("RGB", (width, height), (9, 8, 7)).save(buffer, "PNG")
    return buffer.getvalue()


def test_probe_limits_and_thin_images() -> None:
    for width, height in [(1, 5), (5, 1), (1, 1)]:
        assert probe_image(_png(width, height), max_pixels=width * height).width == width
    assert _rejection(_png(30, 20), name="p.png", max_pixels=100) == (
        "too-many-pixels", "image is 30x20 = 600 pixels; the limit (max_pixels) is 100", "p.png")
    assert _rejection(b"", name="e.png") == ("empty-file", "the file is empty (0 bytes); expected image data", "e.png")
    with pytest.raises(ValueError, match="^max_pixels must be at least 1, got 0$"):
        probe_image(_png(1, 1), max_pixels=0)


def test_probe_rejections_name_the_file() -> None:
    big_ppm = b"P6\n20000 20000\n255\n" + bytes(10)
    reason, message, path = _rejection(big_ppm, name="big.ppm")
    assert (reason, path) == ("too-many-pixels", "big.ppm") and message.startswith("Pillow refused the image: ")
    garbage = b"\xff\xd8\xff\xc0\x00\x03" + bytes(200) + b"\xff\xd9"
    reason, message, path = _rejection(garbage, name="g.jpg")
    assert (reason, path) == ("decode-failed", "g.jpg")
    assert re.fullmatch(r"starts with the JPEG signature but its header cannot be parsed: SyntaxError: \S.*", message), message
    import zlib

    zero = bytearray(_png(3, 3))
    zero[16:20] = (0).to_bytes(4, "big")  # IHDR width 0, its CRC fixed
    zero[29:33] = zlib.crc32(bytes(zero[12:29])).to_bytes(4, "big")
    assert _rejection(bytes(zero), name="z.png") == (
        "not-an-image", "PNG header gives a zero width or height (or no pixel mode); expected at least 1x1 pixels",
        "z.png")
    assert _rejection(b"hello, plain text bytes", name="t.jpg", show_bytes=False) == (
        "not-an-image", "expected a JPEG, PNG, WEBP, GIF, BMP or TIFF image, found bytes that are not an image "
        "(not quoted: the file lies outside the source folder)", "t.jpg")
    # only the first 64 bytes are looked at: an HTML start that ends past them is just bytes
    late_html = b" " * 51 + b"<!doctype html><html></html>"
    assert _rejection(late_html)[1].endswith(f"found bytes starting {late_html[:16]!r}")
    assert _rejection(b" " * 50 + b"<!doctype html>")[1].endswith("found an HTML page (a failed download?)")


def test_full_validation_of_cut_pixel_data_is_truncated() -> None:
    """A PNG whose IDAT holds half its zlib stream (chunk length and CRC fixed): the header is fine."""
    import zlib

    buffer = _io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(buffer, "PNG")
    png = buffer.getvalue()
    at = png.index(b"IDAT") - 4
    length = int.from_bytes(png[at:at + 4], "big")
    half = png[at + 8:at + 8 + length][:length // 2]
    chunk = struct.pack(">I", len(half)) + b"IDAT" + half + struct.pack(">I", zlib.crc32(b"IDAT" + half))
    cut = png[:at] + chunk + png[at + 12 + length:]
    assert probe_image(cut).width == 32
    reason, message, path = _rejection(cut, name="c.png", validate="full")
    assert (reason, path) == ("truncated", "c.png")
    assert message.startswith("PNG pixel data ends early while decoding: OSError: image file is truncated"), message


def _gif(*, global_table: bool = True, flags: int | None = None, local_flags: int = 0x00, stray: bytes = b"",
         comment: bytes = b"", trailer: bool = True, lead: bytes = b"", table_end: int = 0) -> bytes:
    """A hand-made 1x1 GIF: header, optional global colour table, an optional comment extension,
    one image (optional local table), LZW data, optional stray bytes, the trailer."""
    if flags is None:
        flags = 0x80 if global_table else 0x00
    head = b"GIF89a" + struct.pack("<HH", 1, 1) + bytes([flags, 0, 0])
    table = (bytes((3 << ((flags & 7) + 1)) - 1) + bytes([table_end])) if flags & 0x80 else b""
    table += lead
    extension = b"\x21\xfe" + bytes([len(comment)]) + comment + b"\x00" if comment else b""
    local = bytes(3 << ((local_flags & 7) + 1)) if local_flags & 0x80 else b""
    image = b"\x2c" + struct.pack("<HHHH", 0, 0, 1, 1) + bytes([local_flags]) + local + b"\x02\x02\x44\x01\x00"
    return head + table + extension + image + stray + (b";" if trailer else b"")


def _gif_truncated(frames: int, size: int) -> str:
    return (f"GIF ends without its trailer byte (0x3B) after {frames} complete frame(s): expected the block structure "
            f"to end with 0x3B within the file ({size} bytes): the file is truncated")


def test_gif_walker_tables_extensions_and_stray_bytes() -> None:
    problem = imageinfo_module._gif_problem
    for data in [_gif(), _gif(global_table=False, local_flags=0x80), _gif(global_table=False, flags=0x01),
                 _gif(local_flags=0x01), _gif(local_flags=0x81), _gif(stray=b"\x00"), _gif(stray=b"\x00\x07\x00"),
                 _gif(comment=b"a,b;c"), _gif(table_end=0x2C, lead=b"\x00"), _gif(table_end=0x3B, lead=b"\x07")]:
        assert problem(data) is None, data
    ends_in_stray = _gif(trailer=False, stray=b"\x00\x07")
    assert problem(ends_in_stray) == _gif_truncated(1, len(ends_in_stray))
    for data, frames in [(_gif(trailer=False), 1), (_gif(global_table=False, flags=0x01, trailer=False), 1),
                         (_gif(global_table=False, local_flags=0x80, trailer=False), 1)]:
        assert problem(data) == _gif_truncated(frames, len(data)), data
    commented = _gif(comment=b"x;y,z" * 10)
    inside = commented.index(b"x;y")  # cut inside the comment: a 0x3B there is data, not the trailer
    for cut in (inside + 3, inside + 20):
        assert problem(commented[:cut]) == _gif_truncated(0, cut)
    image = _gif().index(b"\x2c")
    for cut in (image + 5, image + 9):  # inside the image descriptor
        assert problem(_gif()[:cut]) == _gif_truncated(0, cut)
    lzw_end = len(_gif()) - 1  # after the LZW sub-blocks' terminator, before the trailer
    assert problem(_gif()[:lzw_end - 1]) == _gif_truncated(1, lzw_end - 1)  # a sub-block chain that runs out
    assert problem(b"GIF89a" + bytes(7)) == _gif_truncated(0, 13)
    assert problem(b"GIF89a" + bytes(6)) == "GIF is 12 bytes, shorter than its 13-byte header: the file is truncated"


def test_gif_plugin_warnings_are_not_shown(tmp_path: Path) -> None:
    """A GIF whose screen is over Pillow's warning size (89 Mpx) but within the caller's limit."""
    data = bytearray(_gif())
    data[6:10] = struct.pack("<HH", 10_000, 10_000)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            probe_image(bytes(data), max_pixels=200_000_000)
        except RejectedImageError:
            pass
    assert not [w for w in seen if issubclass(w.category, Image.DecompressionBombWarning)]


def test_webp_png_and_tiff_cut_messages() -> None:
    webp = _encoded("WEBP")
    assert imageinfo_module._webp_problem(webp[:11]) == "WEBP is 11 bytes, shorter than its 12-byte RIFF header: truncated"
    assert imageinfo_module._webp_problem(webp[:12]) == (
        f"WEBP RIFF header says the file is {len(webp)} bytes, found 12: the file is truncated")
    png = _png(4, 4)
    assert imageinfo_module._png_problem(png[:12]) == (
        "PNG has no IEND chunk: expected chunks up to IEND, but the file (12 bytes) ends after the signature: the file "
        "is truncated")
    idat = png.index(b"IDAT") - 4
    assert imageinfo_module._png_problem(png[:idat + 8]) == (
        f"PNG has no IEND chunk: expected chunks up to IEND, but the file ({idat + 8} bytes) ends after 'IDAT' at "
        f"offset {idat}: the file is truncated")
    cases = [
        (b"II*\x00\x08\x00", "TIFF is 6 bytes, shorter than its 8-byte header: the file is truncated"),
        (b"II+\x00\x08\x00\x00\x00\x10\x00\x00", "TIFF is 11 bytes, shorter than its 16-byte header: the file is truncated"),
        (b"II*\x00\x64\x00\x00\x00", "TIFF header points to its first directory at offset 100, but the file has 8 bytes: "
                                     "the file is truncated"),
        (b"MM\x00*\x00\x00\x00\x08\x00\x05\x00\x00", "TIFF directory at offset 8 has 5 entries ending at byte 70, but "
                                                     "the file has 12 bytes: the file is truncated"),
        (b"II+\x00\x08\x00\x00\x00\x10" + bytes(7) + b"\x02" + bytes(7) + bytes(10),
         "TIFF directory at offset 16 has 2 entries ending at byte 64, but the file has 34 bytes: the file is truncated"),
        (b"II*\x00\x08\x00\x00\x00\x01\x00" + bytes(12), None),
        (b"II*\x00\x08\x00\x00\x00\x00\x00", None),  # an empty directory ending exactly at the end
        (b"II*\x00\x08\x00\x00\x00\x00", "TIFF header points to its first directory at offset 8, but the file has 9 "
                                            "bytes: the file is truncated"),
    ]
    for data, expected in cases:
        assert imageinfo_module._tiff_ifd_problem(data) == expected, data
        if expected is not None:
            assert _rejection(data, name="t.tif") == ("truncated", expected, "t.tif")


def _tiff_with_strip_offsets_type(field_type: int) -> bytes:
    buffer = _io.BytesIO()
    Image.new("L", (8, 6), 5).save(buffer, "TIFF")
    data = bytearray(buffer.getvalue())
    assert data[:4] == b"II*\x00"
    ifd = int.from_bytes(data[4:8], "little")
    for k in range(int.from_bytes(data[ifd:ifd + 2], "little")):
        entry = ifd + 2 + 12 * k
        if int.from_bytes(data[entry:entry + 2], "little") == 273:
            assert int.from_bytes(data[entry + 2:entry + 4], "little") in (3, 4)
            data[entry + 2:entry + 4] = field_type.to_bytes(2, "little")
    return bytes(data)


def test_tiff_offsets_of_a_signed_type_are_refused_by_name() -> None:
    assert _rejection(_tiff_with_strip_offsets_type(9), name="s.tif") == (
        "decode-failed", "TIFF header field StripOffsets: expected type SHORT, LONG or LONG8, got SLONG", "s.tif")
    buffer = _io.BytesIO()
    Image.new("L", (8, 6), 5).save(buffer, "TIFF")
    tiff = buffer.getvalue()
    with Image.open(_io.BytesIO(tiff)) as img:
        end = max(o + c for o, c in zip(img.tag_v2[273], img.tag_v2[279]))
    assert _rejection(tiff[:end - 1], name="c.tif") == (
        "truncated", f"TIFF image data extends to byte {end} (strip/tile offsets plus byte counts), found {end - 1} "
                     f"bytes: the file is truncated", "c.tif")


def _jpeg_with(segments: bytes, *, junk: int = 100, end: bool = True) -> bytes:
    """A real JPEG with ``segments`` inserted after SOI, optionally without its end marker, then junk."""
    jpeg = _jpeg_bytes(16, 16)
    body = jpeg[2:-2] + (b"\xff\xd9" if end else b"")
    return jpeg[:2] + segments + body + bytes(junk)


def test_jpeg_walker_fill_bytes_and_markers_without_length() -> None:
    problem = imageinfo_module._jpeg_problem
    headers = [b"\xff\xff\xff\xfe\x00\x04ab", b"\xff\x01", b"\xff\xd0", b"\xff\xd7", b"\xff\xd8\x00\x04ab",
               b"\xff\x01\xff\xff\xd3\xff\xfe\x00\x03x"]
    for segments in headers:
        assert problem(_jpeg_with(segments)) is None, segments  # the end marker is found after the scan starts
        cut = _jpeg_with(segments, end=False)
        assert problem(cut) == (f"JPEG has no end-of-image marker (FF D9) in its last 64 bytes, nor after the start of "
                                f"its scan data: the file ({len(cut)} bytes) is truncated"), segments
    # an FF D9 inside a header segment (a comment here, an EXIF thumbnail in practice) is not the end
    comment = b"\xff\xfe\x00\x04\xff\xd9"
    assert problem(_jpeg_with(comment, end=False)) is not None
    jpeg = _jpeg_bytes(16, 16)
    sos = jpeg.index(b"\xff\xda")
    late_comment = jpeg[:sos] + comment + jpeg[sos:-2] + bytes(100)
    assert problem(late_comment) is not None
    scan_end = jpeg[:sos] + b"\xff\xda\x00\x02" + b"\xff\xd9" + bytes(100)  # an empty scan right before the end
    assert problem(scan_end) is None


def test_byte_view_flattens_any_contiguous_buffer() -> None:
    data = bytes(range(12))
    assert imageinfo_module.byte_view(data) is data
    for buffer in (bytearray(data), memoryview(data), np.frombuffer(data, dtype=np.uint8).reshape(3, 4),
                   np.frombuffer(data, dtype=np.int8), np.frombuffer(data, dtype=np.uint16),
                   memoryview(data).cast("B", (2, 6))):
        view = imageinfo_module.byte_view(buffer)
        assert isinstance(view, memoryview) and view.format == "B" and view.ndim == 1, type(buffer)
        assert view.tobytes() == data and list(view) == list(data)
    strided = np.arange(24, dtype=np.uint8)[::2]
    assert imageinfo_module.byte_view(strided) == strided.tobytes()


def test_exception_descriptions_and_mode_channels() -> None:
    assert imageinfo_module._describe(ValueError("bad thing")) == "ValueError: bad thing"
    assert imageinfo_module._describe(EOFError()) == "EOFError"
    assert [imageinfo_module._mode_channels(m) for m in ("L", "LA", "RGB", "RGBA", "I;16", "no-such-mode")] == [
        1, 2, 3, 4, 1, 0]


def test_plugin_factory_without_the_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(imageinfo_module._PIL_PLUGIN, fmt.ImageFormat.WEBP, "NO-SUCH-PLUGIN")
    assert imageinfo_module.plugin_factory(fmt.ImageFormat.WEBP) is None
    assert imageinfo_module.plugin_factory(fmt.ImageFormat.UNKNOWN) is None


def test_jpeg_walker_fill_bytes_to_the_end() -> None:
    data = b"\xff\xd8" + b"\xff" * 100
    assert imageinfo_module._jpeg_problem(data) == (
        "JPEG has no end-of-image marker (FF D9) in its last 64 bytes, nor after the start of its scan data: the file "
        "(102 bytes) is truncated")


def test_other_pillow_formats_are_checked_with_the_file_and_its_name() -> None:
    buffer = _io.BytesIO()
    Image.new("RGB", (8, 8)).save(buffer, "PPM")
    ppm = buffer.getvalue()
    reason, message, path = _rejection(ppm[:-5], name="x.ppm")
    assert (reason, path) == ("truncated", "x.ppm")
    assert message.startswith("PPM pixel data ends early while decoding: ") and message.endswith(
        f"(the file, {len(ppm) - 5} bytes, is truncated)"), message


class _FakeImage:
    """What _check_opened and the BMP/TIFF checks read from a Pillow image, set by hand: the values a
    hostile header can make a plugin report."""

    def __init__(self, **attributes: Any) -> None:
        self.__dict__.update(attributes)


def test_check_opened_refuses_sizes_and_modes_pillow_should_not_give() -> None:
    png = _png(3, 3)
    check = imageinfo_module._check_opened
    for size in [(0, 5), (5, 0), (0, 0), (-1, 3), (3, -2)]:
        with pytest.raises(RejectedImageError) as caught:
            check(png, _FakeImage(size=size, mode="RGB", format="PNG"), "PNG", "x.png", "header", 100)
        assert (caught.value.reason, caught.value.path) == ("not-an-image", "x.png")
        assert caught.value.message == f"PNG header gives a size of {size[0]}x{size[1]}; expected at least 1x1 pixels"
    for size in [(True, 3), (3, 2.0), (3, None)]:
        with pytest.raises(imageinfo_module._BadField) as caught:
            check(png, _FakeImage(size=size, mode="RGB", format="PNG"), "PNG", "x.png", "header", 100)
        assert str(caught.value) == f"size: expected integer width and height, got {size[0]!r} x {size[1]!r}"
    with pytest.raises(imageinfo_module._BadField, match=r"^mode: expected a Pillow mode name, got 5$"):
        check(png, _FakeImage(size=(3, 3), mode=5, format="PNG"), "PNG", "x.png", "header", 100)
    assert check(png, _FakeImage(size=(3, 3), mode="RGB", format="PNG"), "PNG", None, "header", 9).width == 3


def test_a_check_that_trips_is_a_decode_failure_naming_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any) -> None:
        raise RuntimeError("a field nobody validated")

    monkeypatch.setattr(imageinfo_module, "_truncation_problem", broken)
    assert _rejection(_png(3, 3), name="b.png") == (
        "decode-failed", "PNG header cannot be checked: RuntimeError: a field nobody validated", "b.png")


def _bmp(tile: Any) -> _FakeImage:
    return _FakeImage(tile=tile)


def test_bmp_pixel_array_check_cases() -> None:
    problem = imageinfo_module._bmp_problem
    view = bytes(80)

    def needs(end: int, rows: int, stride: int, offset: int) -> str:
        return (f"BMP pixel array needs {end} bytes ({rows} rows of {stride} bytes from offset {offset}), found 80: "
                f"the file is truncated")

    assert problem(view, _bmp([("raw", (0, 0, 4, 3), 54, ("BGR", 12, -1))])) == needs(90, 3, 12, 54)
    assert problem(view, _bmp([("raw", (0, 2, 4, 5), 54, ("BGR", 12))])) == needs(90, 3, 12, 54)
    assert problem(bytes(62), _bmp([("raw", (0, 0, 4, 3), 60, ("BGR", 1))])) == (
        "BMP pixel array needs 63 bytes (3 rows of 1 bytes from offset 60), found 62: the file is truncated")
    assert problem(view, _bmp([("raw", (0, 0, 4, 3), 0, ("BGR", 12))])) is None  # offset 0 is allowed
    assert problem(view, _bmp([("raw", (0, 3, 4, 3), 90, ("BGR", 12))])) == needs(90, 0, 12, 90)  # no rows
    for tiles in ([("raw", (0, 0, 4, 3), 54, ("BGR", 12)), ("raw", (0, 0, 4, 3), 54, ("BGR", 12))],
                  [("bmp_rle", (0, 0, 4, 3), 54, ("BGR", 12))],
                  [("raw", (0, 0, 4, 3), 200, "BGR")], [("raw", (0, 0, 4, 3), 200, ("BGR",))],
                  [("raw", (0, 0, 4, 3), 200, ("BGR", "x"))], [("raw", (0, 0, 4, 3), 200, ("BGR", 0))], []):
        assert problem(view, _bmp(tiles)) is None, tiles
    assert problem(view, _FakeImage()) is None  # no tile attribute at all
    refused = [((0, 0, 4, 3), -1, "pixel data offset: expected a non-negative integer, got -1"),
               ((0, 0, 4, 3), 5.0, "pixel data offset: expected a non-negative integer, got 5.0"),
               ((0, 0, 4), 54, "pixel array extent: expected 4 ordered integers, got (0, 0, 4)"),
               ((0, 5, 4, 3), 54, "pixel array extent: expected 4 ordered integers, got (0, 5, 4, 3)"),
               ((0, 0, 4.0, 3), 54, "pixel array extent: expected 4 ordered integers, got (0, 0, 4.0, 3)"),
               ([0, 0, 4, 3], 54, "pixel array extent: expected 4 ordered integers, got [0, 0, 4, 3]")]
    for extents, offset, message in refused:
        with pytest.raises(imageinfo_module._BadField) as caught:
            problem(view, _bmp([("raw", extents, offset, ("BGR", 12))]))
        assert str(caught.value) == message


class _Tags(dict):
    """A TIFF tag directory as Pillow exposes it: values by tag, and their field types."""

    def __init__(self, values: dict[int, Any], types: dict[int, int] | None) -> None:
        super().__init__(values)
        if types is not None:
            self.tagtype = types


def test_tiff_offset_fields_and_strip_or_tile_ends() -> None:
    integers = imageinfo_module._tiff_integers
    assert integers(_Tags({273: 5}, {273: 4}), 273) == (5,)
    assert integers(_Tags({273: (0, 7)}, {273: 3}), 273) == (0, 7)
    assert integers(_Tags({}, {}), 279) is None
    for tags, message in [(_Tags({273: (5,)}, None), "StripOffsets: expected type SHORT, LONG or LONG8, got type None"),
                          (_Tags({279: (5,)}, {279: 99}), "StripByteCounts: expected type SHORT, LONG or LONG8, got type 99"),
                          (_Tags({324: ()}, {324: 16}), "TileOffsets: expected at least one value, got none"),
                          (_Tags({325: (3, -1)}, {325: 4}), "TileByteCounts: expected non-negative integers, got -1"),
                          (_Tags({273: (2.5,)}, {273: 4}), "StripOffsets: expected non-negative integers, got 2.5")]:
        tag = next(iter(tags))
        with pytest.raises(imageinfo_module._BadField) as caught:
            integers(tags, tag)
        assert str(caught.value) == message
    tiff = imageinfo_module._tiff_problem
    tiles = _Tags({324: (8, 40), 325: (30, 30)}, {324: 4, 325: 4})
    assert tiff(bytes(70), _FakeImage(tag_v2=tiles)) is None
    assert tiff(bytes(69), _FakeImage(tag_v2=tiles)) == (
        "TIFF image data extends to byte 70 (strip/tile offsets plus byte counts), found 69 bytes: the file is truncated")
    assert tiff(bytes(10), _FakeImage(tag_v2=_Tags({273: (8,)}, {273: 4}))) is None  # offsets without counts
    with pytest.raises(imageinfo_module._BadField) as caught:
        tiff(bytes(10), _FakeImage(tag_v2=_Tags({273: (8, 9), 279: (1,)}, {273: 4, 279: 4})))
    assert str(caught.value) == ("StripOffsets: 2 values, but StripByteCounts has 1; expected one byte count per "
                                 "offset")


# === build/commit: the report of an empty build, the recorded pixel limit ==========================

def test_an_empty_build_reports_every_rejection_and_leaves_no_staging(tmp_path: Path) -> None:
    import packer
    from packer.imageinfo import DEFAULT_MAX_PIXELS

    bad = tmp_path / "bad" / "a"
    bad.mkdir(parents=True)
    for i in (1, 0):
        (bad / f"{i}.png").write_bytes(b"nope")
    out = tmp_path / "out"
    with pytest.raises(EmptySourceError) as caught:
        build(tmp_path / "bad", out, BuildOptions(), workers=1, progress=False)
    suffix = f"; every rejection is in {out / fmt.REPORT_NAME}"
    assert caught.value.message.endswith(suffix) and str(caught.value).endswith(suffix)
    assert caught.value.args == (str(caught.value),)
    lines = [json.loads(line) for line in (out / fmt.REPORT_NAME).read_text().splitlines()]
    summary = lines[0]
    assert summary["error"] + suffix == str(caught.value)
    assert {k: v for k, v in summary.items() if k not in ("error", "options")} == {
        "type": "summary", "packed": 0, "rejected": 2, "source_kind": "folder", "tool": f"packer {packer.__version__}"}
    assert summary["options"]["max_pixels"] == DEFAULT_MAX_PIXELS and summary["options"]["validate"] == "header"
    assert [(line["type"], line["key"], line["reason"]) for line in lines[1:]] == [
        ("rejected", "a/0.png", "not-an-image"), ("rejected", "a/1.png", "not-an-image")]
    assert sorted(p.name for p in out.iterdir()) == [fmt.REPORT_NAME]  # no staging folder left to --resume
    # over an existing dataset (--overwrite), the dataset keeps its own report
    good = tmp_path / "good"
    build(png_folder(tmp_path / "src", 2), good, BuildOptions(), workers=1, progress=False)
    report = (good / fmt.REPORT_NAME).read_bytes()
    with pytest.raises(EmptySourceError) as caught:
        build(tmp_path / "bad", good, BuildOptions(), workers=1, progress=False, overwrite=True)
    assert "every rejection is in" not in caught.value.message
    assert (good / fmt.REPORT_NAME).read_bytes() == report


def test_a_folder_in_place_of_the_report_is_refused_before_the_commit(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / fmt.REPORT_NAME).mkdir(parents=True)
    with pytest.raises(BuildError) as caught:
        build(png_folder(tmp_path / "src", 2), out, BuildOptions(), workers=1, progress=False)
    assert (caught.value.message, caught.value.path) == (
        f"{fmt.REPORT_NAME} is a folder, not a regular file; remove it and run again", str(out / fmt.REPORT_NAME))
    assert not (out / fmt.MANIFEST_NAME).exists()


def test_the_recorded_pixel_limit_is_the_largest_above_the_default(tmp_path: Path) -> None:
    from packer.writer.commit import recorded_max_pixels
    from packer.imageinfo import DEFAULT_MAX_PIXELS

    big = DEFAULT_MAX_PIXELS + 5
    assert recorded_max_pixels() is None and recorded_max_pixels(None) is None
    assert recorded_max_pixels(DEFAULT_MAX_PIXELS) is None and recorded_max_pixels(100, None) is None
    assert recorded_max_pixels(big) == big and recorded_max_pixels(100, big, None, 7) == big
    src = png_folder(tmp_path / "src", 2)
    for limit, recorded in [(big, big), (DEFAULT_MAX_PIXELS, None), (1000, None)]:
        out = tmp_path / f"ds-{limit}"
        build(src, out, BuildOptions(max_pixels=limit), workers=1, progress=False)
        with open_index(out) as index:
            assert index.manifest.max_pixels == recorded


def test_the_build_report_keeps_listing_warnings_and_non_ascii_keys(tmp_path: Path) -> None:
    from packer.classes import split_folder_warning

    src = tmp_path / "src"
    rng = np.random.default_rng(1)
    for split in ("train", "val"):
        (src / split).mkdir(parents=True)
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(src / split / "ok.png")
    (src / "val" / "ñandú.png").write_bytes(b"not an image")
    out = tmp_path / "ds"
    build(src, out, BuildOptions(), workers=1, progress=False)
    text = (out / fmt.REPORT_NAME).read_text(encoding="utf-8")
    summary, rejected = (json.loads(line) for line in text.splitlines())
    assert summary["warnings"] == [split_folder_warning(["train", "val"])]
    assert rejected["key"] == "val/ñandú.png" and "val/ñandú.png" in text  # UTF-8 as is, not \\u escapes


# === build/plan: class lists, the file-size option, what a saved plan keeps ========================

def test_build_options_class_lists(tmp_path: Path) -> None:
    assert BuildOptions(classes=["b", "a"]).classes == ("b", "a")  # from JSON: a list becomes a tuple
    assert BuildOptions(classes="dog,cat").classes == ("dog", "cat")  # names separated by commas
    listed = tmp_path / "classes.txt"
    listed.write_text("zebra\n\n  ant \n")
    assert BuildOptions(classes=listed).classes == ("zebra", "ant") == BuildOptions(classes=str(listed)).classes
    assert BuildOptions(classes=("x",)).classes == ("x",) and BuildOptions().classes is None
    assert BuildOptions(classes=["b", "a"]).to_json()["classes"] == ["b", "a"]
    assert "classes" not in BuildOptions().to_json()
    for classes, message in [([], "classes: the class list is empty"), (["a", "a"], "classes: class 'a' is listed twice"),
                             (("a", 3), "classes: class names must be non-empty strings, got 3")]:
        with pytest.raises(OptionError) as caught:
            BuildOptions(classes=classes).check()
        assert caught.value.message == message


def test_build_options_max_file_size_bounds() -> None:
    for value in (0, -1, True, 1.5, fmt.MAX_FILE_SIZE):
        with pytest.raises(OptionError) as caught:
            BuildOptions(max_file_size=value).check()
        assert caught.value.message == f"--max-file-size must be between 1 byte and 2^62, got {value}"
    for value in (1, 2, fmt.MAX_FILE_SIZE - 1):
        BuildOptions(max_file_size=value).check()


def test_a_saved_plan_keeps_label_type_warnings_and_stamps(tmp_path: Path) -> None:
    from packer.classes import split_folder_warning

    src = tmp_path / "src"
    rng = np.random.default_rng(2)
    for split in ("train", "val"):
        (src / split).mkdir(parents=True)
        for i in range(2):
            Image.fromarray(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)).save(src / split / f"{i}.png")
    listing = list_source(src)
    plan = make_plan(listing, BuildOptions(shard_size=8192))
    path = tmp_path / "plan.pkp"
    save_plan(plan, path)
    loaded = load_plan(path, src).listing
    assert loaded.warnings == [split_folder_warning(["train", "val"])] == listing.warnings
    assert loaded.label_type == listing.label_type
    assert loaded.stamps.tolist() == listing.stamps.tolist() and len(loaded.stamps) == 4
    assert loaded.stamps.dtype == np.uint64
    _rewrite_header(path, lambda h: (h.pop("label_type"), h.pop("warnings")))  # a plan from before these fields
    older = load_plan(path, src).listing
    assert older.label_type == "str" and older.warnings == []


def test_a_plan_without_stamps_loads_with_none(tmp_path: Path) -> None:
    path, src = _saved_plan(tmp_path)
    rows, columns = fmt.parse_column_file(path.read_bytes(), fmt.PLAN_MAGIC)
    assert "stamps" in columns
    kept = {name: np.array(column) for name, column in columns.items() if name != "stamps"}
    path.write_bytes(b"".join(bytes(p) for p in fmt.encode_column_file(fmt.PLAN_MAGIC, rows, kept)))
    stamps = load_plan(path, src).listing.stamps
    assert stamps.dtype == np.uint64 and stamps.shape == (0,)


def test_the_build_result_names_the_class_list(tmp_path: Path) -> None:
    result = build(png_folder(tmp_path / "src", 4), tmp_path / "ds", BuildOptions(), workers=1, progress=False)
    assert result.classes == ("cat", "dog") and result.sample_count == 4
