"""The one order value (``packer.ReadOrder``), the one conversion of the readers' old order keywords
(``read_order_from``), the rank rule (``resolve_rank``) and the sample-space seam the cursor orders
(``SampleSpace``, ``IndexSpace``): torch-free, exact messages (issue 34, workstream A)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import types
import warnings
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from packer.errors import OptionError, StateMismatchError, UnexpectedKeywordError
from packer.order import (
    DEFAULT_BLOCK_BYTES,
    DEFAULT_BLOCK_SAMPLES,
    DEFAULT_WINDOW,
    ORDER_KEYWORDS,
    STATE_VERSION,
    EpochCursor,
    IndexSpace,
    ReadOrder,
    _blocks_fingerprint,
    block_order,
    deal,
    epoch_order,
    index_blocks,
    random_order,
    read_order_from,
    resolve_rank,
    sample_space,
    uniform_blocks,
)

from helpers import VECTORS

DATASET = VECTORS / "valid" / "base-align512"


# --- ReadOrder: the fields, their checks, how it prints ----------------------------------------------


def test_read_order_keeps_its_positional_fields_and_adds_keyword_only_ones() -> None:
    order = ReadOrder("block", 3, 1024, 8, 4, True)  # the field order of earlier releases
    assert (order.kind, order.seed, order.block_bytes, order.window, order.batch_size, order.drop_last) == \
        ("block", 3, 1024, 8, 4, True)
    assert (order.rank, order.world_size, order.block_samples) == (None, None, None)
    with pytest.raises(TypeError):
        ReadOrder("block", 3, 1024, 8, 4, True, 0)  # type: ignore[misc]  # rank is keyword-only
    default = ReadOrder()
    assert (default.kind, default.seed, default.block_bytes, default.window, default.batch_size,
            default.drop_last) == ("random", 0, DEFAULT_BLOCK_BYTES, DEFAULT_WINDOW, None, False)


def test_read_order_prints_what_differs_from_the_defaults() -> None:
    assert repr(ReadOrder()) == "ReadOrder('random')"
    order = ReadOrder("block", seed=3, batch_size=4, drop_last=True, rank=1, world_size=2, block_samples=8)
    assert repr(order) == ("ReadOrder('block', seed=3, batch_size=4, drop_last=True, rank=1, world_size=2, "
                           "block_samples=8)")
    assert repr(ReadOrder("sequential", block_bytes=1 << 20, window=3)) == \
        "ReadOrder('sequential', block_bytes=1048576, window=3)"
    assert eval(repr(order), {"ReadOrder": ReadOrder}) == order  # the spelling a warning suggests works


@pytest.mark.parametrize("changes, message", [
    ({"drop_last": "yes"}, "drop_last must be True or False, got 'yes'"),
    ({"drop_last": 1}, "drop_last must be True or False, got 1"),
    ({"rank": 1}, "give both rank and world_size, or neither (to use torch.distributed)"),
    ({"world_size": 2}, "give both rank and world_size, or neither (to use torch.distributed)"),
    ({"rank": 2, "world_size": 2}, "rank must be an integer in 0..1, got 2"),
    ({"rank": 0, "world_size": 0}, "world_size must be a positive integer, got 0"),
    ({"rank": True, "world_size": 2}, "rank must be an integer in 0..1, got True"),
    ({"rank": 0, "world_size": True}, "world_size must be a positive integer, got True"),
])
def test_read_order_refuses_settings_by_name(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(OptionError) as caught:
        ReadOrder(**changes)
    assert caught.value.message == message


def test_read_order_accepts_numpy_values() -> None:
    order = ReadOrder(drop_last=np.bool_(True), rank=np.int64(1), world_size=np.int64(3))
    assert order.drop_last and (order.rank, order.world_size) == (1, 3)


# --- resolved: the reader's batch size and rank -----------------------------------------------------


def test_resolved_fills_the_readers_batch_size_and_the_rank() -> None:
    order = ReadOrder("block", seed=2)
    resolved = order.resolved(batch_size=8, reader="PackedThing")
    assert resolved == replace(order, batch_size=8, rank=0, world_size=1)
    assert ReadOrder(batch_size=8).resolved(batch_size=8).batch_size == 8  # the same: fine
    assert ReadOrder(batch_size=8).resolved().batch_size == 8  # the reader has none: the order's
    assert ReadOrder().resolved().batch_size is None
    assert ReadOrder(rank=2, world_size=4).resolved() == ReadOrder(rank=2, world_size=4)
    with pytest.raises(OptionError) as caught:
        ReadOrder(batch_size=4).resolved(batch_size=8, reader="PackedThing")
    assert caught.value.message == ("PackedThing has batch_size=8 but its order has batch_size=4; give the same, "
                                    "or leave the order's out (None: the reader's)")
    with pytest.raises(OptionError, match="^the reader has batch_size=8 but its order has batch_size=4;"):
        ReadOrder(batch_size=4).resolved(batch_size=8)


# --- resolve_rank: as given, else torch.distributed when initialised, else 0 of 1 -------------------


def _fake_torch(available: bool, initialized: bool) -> types.ModuleType:
    torch = types.ModuleType("torch")
    torch.distributed = types.SimpleNamespace(  # type: ignore[attr-defined]
        is_available=lambda: available, is_initialized=lambda: initialized,
        get_rank=lambda: 3, get_world_size=lambda: 4)
    return torch


def test_resolve_rank_asks_torch_distributed_only_when_torch_is_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _LAUNCHER_NAMES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert resolve_rank() == (0, 1)
    assert "torch" not in sys.modules  # never imported for it
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))  # a torch without distributed
    assert resolve_rank() == (0, 1)
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(available=False, initialized=True))
    assert resolve_rank() == (0, 1)
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(available=True, initialized=False))
    assert resolve_rank() == (0, 1)
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(available=True, initialized=True))
    assert resolve_rank() == (3, 4)
    assert resolve_rank(1, 2) == (1, 2)  # given wins
    assert ReadOrder().resolved().world_size == 4 and ReadOrder().resolved().rank == 3


_LAUNCHER_NAMES = ("WORLD_SIZE", "RANK", "SLURM_NTASKS", "SLURM_PROCID")


def test_a_rank_a_launcher_started_without_a_process_group_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun or srun started several copies, none joined a process group: each would read the
    whole dataset as rank 0 of 1. Refused, naming both fixes, for every reader (torch-free ones too)."""
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    for name in _LAUNCHER_NAMES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(OptionError) as caught:
        resolve_rank()
    assert caught.value.message == (
        "the environment says this process is rank 1 of 2 (WORLD_SIZE=2, RANK=1: set by torchrun), but "
        "torch.distributed is not initialised, so this reader would read every sample on every rank: call "
        "torch.distributed.init_process_group() before making it (its rank and world size then come from the "
        "process group), or pass rank= and world_size= in the order (order=packer.ReadOrder(..., rank=1, "
        "world_size=2); rank=0, world_size=1 to read the whole dataset in this process)")
    assert resolve_rank(1, 2) == (1, 2) and ReadOrder(rank=0, world_size=1).resolved().world_size == 1
    with pytest.raises(OptionError, match="^the environment says this process is rank 1 of 2"):
        ReadOrder().resolved()
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(available=True, initialized=True))
    assert resolve_rank() == (3, 4)  # a process group: the environment no longer decides
    monkeypatch.delitem(sys.modules, "torch")
    for world in ("1", "", "two", " "):
        monkeypatch.setenv("WORLD_SIZE", world)
        assert resolve_rank() == (0, 1)
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.delenv("RANK")
    monkeypatch.setenv("SLURM_NTASKS", " 4 ")
    with pytest.raises(OptionError, match=r"^the environment says this process is rank \? of 4 \(SLURM_NTASKS=4, "
                                          r"SLURM_PROCID=\?: set by Slurm\)"):
        resolve_rank()
    monkeypatch.setenv("SLURM_PROCID", "3")
    with pytest.raises(OptionError, match=r"rank 3 of 4 \(SLURM_NTASKS=4, SLURM_PROCID=3: set by Slurm\)"):
        resolve_rank()
    monkeypatch.setenv("SLURM_PROCID", " ")
    with pytest.raises(OptionError, match=r"rank \? of 4"):
        resolve_rank()


def test_resolve_rank_takes_numpy_integers_and_returns_ints() -> None:
    rank, world_size = resolve_rank(np.int64(1), np.int32(2))
    assert (rank, world_size) == (1, 2) and type(rank) is int and type(world_size) is int


# --- plan and share without a reader ----------------------------------------------------------------


def test_plan_counts_no_batch_size_as_one_and_takes_the_orders_rank() -> None:
    order = ReadOrder("random", seed=4, rank=1, world_size=3)
    one = replace(order, batch_size=1)
    assert order.plan(20, epoch=2).indices.tolist() == one.plan(20, epoch=2).indices.tolist()
    assert order.plan(20, epoch=2).indices.tolist() == \
        deal(random_order(20, seed=4, epoch=2), rank=1, world_size=3).indices.tolist()
    assert order.plan(20, epoch=2, rank=0, world_size=2).indices.tolist() == \
        deal(random_order(20, seed=4, epoch=2), rank=0, world_size=2).indices.tolist()  # arguments win
    assert order.share(20) == one.share(20) == one.share(20, world_size=3)
    assert order.share(20).per_rank == 7 and ReadOrder().share(20).per_rank == 20


# --- read_order_from: the one conversion of a reader's order= and old keywords ----------------------


def test_order_argument_forms() -> None:
    default = ReadOrder("block", seed=5)
    assert read_order_from(None, reader="R", default=default) is default
    assert read_order_from(None, reader="R") == ReadOrder()
    assert read_order_from("random", reader="R", default=default) == ReadOrder("random", seed=5)
    given = ReadOrder("sequential")
    assert read_order_from(given, {}, reader="R", default=default) is given
    with pytest.raises(OptionError) as caught:
        read_order_from("rand", reader="R")
    assert caught.value.message == ("unknown order 'rand'; choose one of ['sequential', 'random', 'block'] "
                                    "(or a packer.ReadOrder)")
    with pytest.raises(OptionError) as caught:
        read_order_from(3, reader="PackedThing")  # type: ignore[arg-type]
    assert caught.value.message == ("PackedThing: order must be a packer.ReadOrder or one of ['sequential', "
                                    "'random', 'block'], got int")


#: What a reader's ``__init__`` does with its ``order=`` and ``**deprecated``, as code of a packer
#: module (a warning names the first line outside packer: here, the test's call).
_READER: dict[str, Any] = {"__name__": "packer.fake_reader", "read_order_from": read_order_from, "ReadOrder": ReadOrder}
exec(compile("def reader(order=None, **deprecated):\n"
             "    return read_order_from(order, deprecated, reader='PackedThing', default=ReadOrder('random'))\n",
             "packer_fake_reader.py", "exec"), _READER)
_reader = _READER["reader"]


def test_old_keywords_warn_with_the_new_spelling_and_give_the_same_order() -> None:
    with pytest.warns(DeprecationWarning) as caught:
        order = _reader("block", seed=3, rank=1, world_size=2, window=4); line = sys._getframe().f_lineno  # noqa: E702
    assert order == ReadOrder("block", seed=3, rank=1, world_size=2, window=4)
    assert len(caught) == 1
    assert str(caught[0].message) == ("PackedThing(seed=, rank=, world_size=, window=) is deprecated and goes in "
                                      "the next release: pass order=packer.ReadOrder('block', seed=3, window=4, "
                                      "rank=1, world_size=2)")
    if "MUTANT_UNDER_TEST" not in os.environ:  # mutmut's trampoline is a frame outside packer too
        assert (caught[0].filename, caught[0].lineno) == (__file__, line)  # the reader's caller, not the reader
    every = {name: value for name, value in zip(ORDER_KEYWORDS, (1, 0, 1, True, 512, 2, 16))}
    with pytest.warns(DeprecationWarning):
        assert read_order_from(None, every, reader="R") == ReadOrder(seed=1, rank=0, world_size=1, drop_last=True,
                                                                      block_bytes=512, window=2, block_samples=16)


def test_old_keywords_are_refused_beside_a_read_order_or_when_never_taken() -> None:
    with pytest.raises(OptionError) as caught:
        read_order_from(ReadOrder("block"), {"seed": 1, "window": 2}, reader="PackedThing")
    assert caught.value.message == ("PackedThing: seed=, window= and order=ReadOrder('block') both say how to read; "
                                    "put them in the ReadOrder")
    with pytest.raises(TypeError) as unknown:  # what Python raises for an unknown keyword, and typed
        read_order_from(None, {"sed": 1}, reader="PackedThing")
    assert isinstance(unknown.value, UnexpectedKeywordError)
    assert str(unknown.value) == "PackedThing() got an unexpected keyword argument 'sed'"
    with pytest.raises(TypeError):
        read_order_from(None, {"batch_size": 4}, reader="R")  # only readers that took it as an order setting


def test_renamed_old_keywords_and_their_old_defaults() -> None:
    keywords = {**ORDER_KEYWORDS, "shard_id": "rank", "num_shards": "world_size"}
    old = {"shard_id": 0, "num_shards": 1}
    with pytest.warns(DeprecationWarning, match=r"^Source\(shard_id=, num_shards=\) is deprecated"):
        order = read_order_from(None, {"shard_id": 1, "num_shards": 2}, reader="Source", keywords=keywords,
                                old_defaults=old)
    assert (order.rank, order.world_size) == (1, 2)
    with pytest.warns(DeprecationWarning, match=r"^Source\(seed=\) is deprecated"):  # only what was typed
        kept = read_order_from(None, {"seed": 2}, reader="Source", keywords=keywords, old_defaults=old)
    assert (kept.rank, kept.world_size, kept.seed) == (0, 1, 2)  # the share it read before: 0 of 1
    assert read_order_from(None, {}, reader="Source", keywords=keywords, old_defaults=old).rank is None
    with pytest.raises(OptionError) as caught:
        read_order_from(None, {"shard_id": 3, "num_shards": 2}, reader="Source", keywords=keywords, old_defaults=old)
    assert caught.value.message == ("rank must be an integer in 0..1, got 3 (shard_id= sets rank, num_shards= "
                                    "sets world_size)")
    with pytest.raises(OptionError) as plain:  # a keyword of its own name: the message as ReadOrder says it
        read_order_from(None, {"seed": -1}, reader="Source", keywords=keywords)
    assert plain.value.message == "seed must be a non-negative integer, got -1"


# --- the sample-space seam: IndexSpace (a dataset, an index or a count) -----------------------------


def test_a_count_space_cuts_uniform_blocks() -> None:
    space = IndexSpace(num_samples=130)
    assert space.num_samples == 130
    assert space.blocks(ReadOrder("block")).tolist() == uniform_blocks(130, DEFAULT_BLOCK_SAMPLES).tolist()
    assert space.blocks(ReadOrder("block", block_samples=50)).tolist() == [0, 50, 100, 130]
    order = ReadOrder("block", seed=3, window=2, block_samples=50)
    assert space.epoch_order(order, 4).tolist() == \
        block_order(np.array([0, 50, 100, 130]), seed=3, epoch=4, window=2).tolist()
    assert space.epoch_order(ReadOrder("random", seed=3), 4).tolist() == random_order(130, seed=3, epoch=4).tolist()
    assert space.epoch_order(ReadOrder("sequential"), 0).tolist() == list(range(130))
    assert space.identity() == {"num_samples": 130}
    assert space.identity(ReadOrder("random")) == {"num_samples": 130}
    assert space.identity(order) == {"num_samples": 130, "blocks": _blocks_fingerprint(np.array([0, 50, 100, 130]))}


def test_an_index_space_measures_blocks_in_bytes_unless_told_samples() -> None:
    from packer.dataset import open_index

    with open_index(DATASET) as index:
        columns = index.index
        space = IndexSpace(index)
        assert space.num_samples == len(index)
        for block_bytes in (512, 4096, DEFAULT_BLOCK_BYTES):  # cached per setting, never stale
            assert space.blocks(ReadOrder("block", block_bytes=block_bytes)).tolist() == \
                index_blocks(columns.offset, columns.size, columns.shard, block_bytes).tolist()
        assert space.blocks(ReadOrder("block", block_samples=2)).tolist() == uniform_blocks(len(index), 2).tolist()
        opened = []
        lazy = IndexSpace(lambda: opened.append(1) or index, num_samples=len(index))  # opened on first use
        lazy.epoch_order(ReadOrder("random"), 0)
        lazy.identity(ReadOrder("random"))
        assert opened == []  # only the block order needs the index (a DALI source never opens it for others)
        assert lazy.blocks(ReadOrder("block", block_bytes=512)).tolist() == \
            index_blocks(columns.offset, columns.size, columns.shard, 512).tolist()
        assert IndexSpace.of(index, blocks=[0, 1, len(index)]).blocks(ReadOrder("block")).tolist() == [0, 1, len(index)]
        assert IndexSpace.of(index).blocks(ReadOrder("block", block_bytes=512)).tolist() == \
            lazy.blocks(ReadOrder("block", block_bytes=512)).tolist()
        holder = types.SimpleNamespace(dataset=index)  # a PackedDataset holds its dataset as .dataset
        assert IndexSpace.of(holder).identity(ReadOrder("block", block_bytes=512)) == \
            lazy.identity(ReadOrder("block", block_bytes=512))


def test_explicit_blocks_and_other_sources() -> None:
    bounds = np.array([0, 3, 10])
    assert IndexSpace(num_samples=10, blocks=bounds).blocks(ReadOrder("block", block_samples=5)).tolist() == [0, 3, 10]
    calls = []
    lazy = IndexSpace(num_samples=10, blocks=lambda: calls.append(1) or bounds)
    assert lazy.blocks(ReadOrder("block")).tolist() == lazy.blocks(ReadOrder("block")).tolist() == [0, 3, 10]
    assert calls == [1]  # computed once
    assert IndexSpace(num_samples=10, blocks=lambda: None).blocks(ReadOrder("block")).tolist() == [0, 10]
    assert IndexSpace.of(np.int64(7)).num_samples == 7
    assert IndexSpace.of([1, 2, 3]).num_samples == 3  # anything with a length is a count
    assert IndexSpace.of([1, 2, 3], blocks=[0, 1, 3]).blocks(ReadOrder("block")).tolist() == [0, 1, 3]
    assert IndexSpace.of(5, blocks=[0, 2, 5]).blocks(ReadOrder("block")).tolist() == [0, 2, 5]
    for source, name in ((True, "bool"), (2.5, "float"), (object(), "object")):
        with pytest.raises(OptionError) as caught:
            IndexSpace.of(source)
        assert caught.value.message == f"expected a packer dataset or a sample count, got {name}"
    for index in (None, lambda: None):
        with pytest.raises(OptionError) as caught:
            IndexSpace(index)
        assert caught.value.message == "IndexSpace needs num_samples without an open index"
    with pytest.raises(OptionError, match="^num_samples must be a non-negative integer, got -1$"):
        IndexSpace(num_samples=-1)


def test_a_space_pickles_without_its_blocks_and_recomputes_them() -> None:
    space = IndexSpace(num_samples=1000)
    order = ReadOrder("block", block_samples=10)
    before = space.blocks(order).tolist()
    assert space._cached is not None
    twin = pickle.loads(pickle.dumps(space))
    assert twin._cached is None and space._cached is not None  # the original keeps its cache
    assert twin.blocks(order).tolist() == before and twin.identity(order) == space.identity(order)


def test_sample_space_passes_spaces_through() -> None:
    space = IndexSpace(num_samples=4)
    assert sample_space(space) is space
    assert isinstance(sample_space(4), IndexSpace) and sample_space(4, [0, 4]).blocks(ReadOrder("block")).tolist() == [0, 4]
    with pytest.raises(OptionError) as caught:
        sample_space(space, [0, 4])
    assert caught.value.message == "blocks= is for a sample count; a IndexSpace has its own"


# --- the cursor orders any space: a mixture-like one plugs in without touching the readers ----------


class _Reversed:
    """A space of its own: every epoch reads the samples backwards, shifted by the epoch."""

    def __init__(self, count: int, name: str = "reversed", identity_key: str = "stream") -> None:
        self.num_samples = count
        self.name = name
        self.identity_key = identity_key

    def epoch_order(self, order: ReadOrder, epoch: int) -> np.ndarray:
        return np.roll(np.arange(self.num_samples, dtype=np.int64)[::-1], epoch)

    def identity(self, order: ReadOrder | None = None) -> dict[str, Any]:
        return {"num_samples": self.num_samples, self.identity_key: self.name}


def test_the_cursor_deals_and_resumes_any_space() -> None:
    order = ReadOrder("random", seed=1, batch_size=2)
    space = _Reversed(10)
    cursor = EpochCursor(order, space, rank=1, world_size=2)
    assert cursor.space is space and cursor.num_samples == 10 and cursor.blocks is None
    expected = deal(np.roll(np.arange(10)[::-1], 3), rank=1, world_size=2, batch_size=2)
    cursor.set_epoch(3)
    assert cursor.plan().indices.tolist() == expected.indices.tolist()
    state = cursor.state_dict(batches=1)
    assert state == {"version": STATE_VERSION, "order": "random", "seed": 1, "epoch": 3, "consumed": 4,
                     "num_samples": 10, "stream": "reversed"}
    resumed = EpochCursor(replace(order, batch_size=3), _Reversed(10))
    resumed.load_state_dict(state)
    assert resumed.begin().indices.tolist() == np.roll(np.arange(10)[::-1], 3)[4:].tolist()
    with pytest.raises(StateMismatchError) as caught:
        EpochCursor(order, _Reversed(10, "other")).load_state_dict(state)
    assert caught.value.message == ("the saved state has stream='reversed' but this reader has 'other'; resuming "
                                    "would not see the remaining samples of the saved epoch")
    with pytest.raises(StateMismatchError) as plain:  # a mixture's state is not a plain dataset's
        EpochCursor(order, 10).load_state_dict(state)
    assert plain.value.message.startswith("the saved state has stream='reversed' but this reader has None")
    with pytest.raises(StateMismatchError, match="^the saved state has stream=None but this reader has 'reversed'"):
        EpochCursor(order, _Reversed(10)).load_state_dict(EpochCursor(order, 10).state_dict())


def test_an_epoch_with_nothing_left_computes_no_order() -> None:
    class Costly(_Reversed):
        def epoch_order(self, order: ReadOrder, epoch: int) -> np.ndarray:
            raise AssertionError("an epoch with nothing left must not compute its order")

    done = ReadOrder("random").plan(Costly(5), epoch=0, consumed=5)
    assert done.indices.tolist() == [] and done.batch_bounds.tolist() == [0]
    assert ReadOrder("random").plan(_Reversed(5), epoch=0, consumed=4).indices.tolist() == [0]  # one left


def test_a_space_must_keep_to_its_contract() -> None:
    class Short(_Reversed):
        def epoch_order(self, order: ReadOrder, epoch: int) -> np.ndarray:
            return np.arange(self.num_samples - 1)

    with pytest.raises(OptionError) as caught:
        EpochCursor(ReadOrder(), Short(5)).plan()
    assert caught.value.message == "Short.epoch_order gave (4,) sample numbers for an epoch of 5"
    with pytest.raises(OptionError) as clash:
        EpochCursor(ReadOrder(), _Reversed(5, identity_key="epoch")).state_dict()
    assert clash.value.message == "_Reversed.identity() names ['epoch'], which a read-order state keeps for itself"


def test_the_cursor_fills_in_its_rank_and_measures_blocks_from_its_space() -> None:
    given = EpochCursor(ReadOrder("block", seed=2), 10, blocks=[0, 3, 10])  # a count with blocks of its own
    assert given.blocks.tolist() == [0, 3, 10] and given.pass_position is None
    assert given.plan().indices.tolist() == deal(block_order(np.array([0, 3, 10]), seed=2, epoch=0),
                                                 sort_steps=True).indices.tolist()
    cursor = EpochCursor(ReadOrder("block", block_samples=4), 10, rank=1, world_size=2)
    assert (cursor.read_order.rank, cursor.read_order.world_size, cursor.rank, cursor.world_size) == (1, 2, 1, 2)
    assert cursor.blocks.tolist() == [0, 4, 8, 10]
    assert EpochCursor(ReadOrder("random"), 10).blocks is None
    assert EpochCursor(ReadOrder("block", rank=1, world_size=3), 10).rank == 1  # the order's share
    twin = cursor.with_blocks(np.array([0, 5, 10]))
    assert twin.blocks.tolist() == [0, 5, 10] and cursor.blocks.tolist() == [0, 4, 8, 10]
    assert twin.position is cursor.position


def test_passes_begin_at_the_claimed_or_the_given_position() -> None:
    from packer.order import Position

    order = ReadOrder("random", seed=3, batch_size=2)
    cursor = EpochCursor(order, 10, position=Position(slots=2))
    whole = cursor.plan(0, 0).indices.tolist()
    cursor.handed_out = 3
    cursor.load_state_dict(cursor.read_order.state_dict(10, epoch=0, consumed=4))
    assert (cursor.handed_out, cursor.pass_position) == (0, None)
    assert cursor.begin().indices.tolist() == whole[4:]  # reader 0 of 1 used the load
    assert cursor.pass_position == (0, 4)
    # worker 1 of 2 begins a pass with another number of readers: a later pass, a whole epoch
    assert cursor.begin(1, 2).indices.tolist() == whole and cursor.pass_position == (0, 0)
    cursor.handed_out = 5
    assert cursor.begin_at(0, 6).indices.tolist() == whole[6:]  # a worker's own saved position
    assert (cursor.handed_out, cursor.pass_position) == (0, (0, 6))
    with pytest.raises(OptionError, match="^start must be a non-negative integer, got -1$"):
        cursor.begin_at(0, -1)


def test_states_of_earlier_releases_still_load() -> None:
    """The state format is unchanged: a dict saved by the previous release resumes here."""
    blocks = uniform_blocks(200)
    saved = {"version": 1, "order": "block", "seed": 7, "num_samples": 200, "epoch": 2, "consumed": 64,
             "window": 32, "blocks": _blocks_fingerprint(blocks)}
    cursor = EpochCursor(ReadOrder("block", seed=7, batch_size=8), 200)
    cursor.load_state_dict(saved)
    expected = deal(epoch_order("block", 200, seed=7, epoch=2, blocks=blocks), consumed=64, batch_size=8,
                    sort_steps=True)
    assert cursor.begin().indices.tolist() == expected.indices.tolist()
    assert cursor.state_dict(batches=0) == saved


def test_import_packer_gives_read_order_without_torch() -> None:
    code = ("import sys, packer; order = packer.ReadOrder('block', seed=1); "
            "assert 'ReadOrder' in packer.__all__ and order.seed == 1; sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_no_warning_without_old_keywords() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        read_order_from(ReadOrder("block"), {}, reader="R")
        read_order_from("block", None, reader="R")
