"""One order value for every torch reader (issue 34): ``order=ReadOrder(...)`` reads what the old
keywords read, the old keywords still work for one release with a warning naming the new spelling,
and ``PackedDataLoader`` deals a ``PackedDataset`` itself (or a ``PackedSampler`` through a batch
sampler sharing its order and position), its ``state_dict`` in one dialect."""

from __future__ import annotations

import os
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from packer import ReadOrder  # noqa: E402
from packer.errors import OptionError  # noqa: E402
from packer.threaded import ThreadedLoader  # noqa: E402
from packer.torch import (PackedBatchSampler, PackedDataLoader, PackedDataset, PackedIterableDataset,  # noqa: E402
                          PackedSampler, collate)
from packer.writer import build  # noqa: E402
from packer.writer.plan import BuildOptions  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:This DataLoader will create.*:UserWarning")]

N = 30
OLD = dict(order="block", seed=2, rank=1, world_size=2, drop_last=True, block_bytes=1024, window=3)
NEW = ReadOrder("block", seed=2, rank=1, world_size=2, drop_last=True, block_bytes=1024, window=3)


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import make_sample

    root = tmp_path_factory.mktemp("spellings") / "src"
    make_sample.make_image_folder(root, classes=3, per_class=N // 3, seed=8, min_size=8, max_size=8,
                                  formats=("png",))
    out = root.parent / "raw"
    build(root, out, BuildOptions(shard_size=4 << 10, alignment=512, codec="raw:size=8x8"), workers=1,
          progress=False)
    return out


def _indices(packed: Path) -> PackedDataset:
    return PackedDataset(packed, decode=False, fields=("index",))


def _old(make: Any, reader: str, **keywords: Any) -> Any:
    """``make(**keywords)`` with old keywords: one DeprecationWarning naming ``reader`` and the new spelling."""
    with pytest.warns(DeprecationWarning) as caught:
        made = make(**keywords)
    ours = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    messages = [str(w.message) for w in ours]
    assert len(messages) == 1 and messages[0].startswith(f"{reader}(")
    if "MUTANT_UNDER_TEST" not in os.environ:  # mutmut's trampoline is a frame outside packer too
        assert ours[0].filename == __file__  # the caller's line, however deep in packer it was noticed
    assert "is deprecated and goes in the next release: pass order=packer.ReadOrder(" in messages[0]
    return made


def _new(make: Any, **keywords: Any) -> Any:
    """``make(**keywords)`` in the new spelling: no warning at all from packer."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        return make(**keywords)


def _epochs(reader: Any, epochs: int = 2) -> list[list[int]]:
    seen = []
    for epoch in range(epochs):
        reader.set_epoch(epoch)
        seen.append([i for batch in reader for i in (batch if isinstance(batch, list) else [batch])])
    return seen


# --- the old and the new spelling read the same and save the same ------------------------------------


def test_samplers_read_and_save_the_same_in_both_spellings(packed: Path) -> None:
    data = _indices(packed)
    old = _old(lambda **k: PackedSampler(data, **k), "PackedSampler", batch_size=4, **OLD)
    new = _new(lambda **k: PackedSampler(data, **k), order=replace(NEW, batch_size=4))
    assert old.read_order == new.read_order and _epochs(old) == _epochs(new)
    assert old.state_dict(samples_consumed=8) == new.state_dict(samples_consumed=8)
    old_batches = _old(lambda **k: PackedBatchSampler(data, batch_size=4, **k), "PackedBatchSampler", **OLD)
    new_batches = _new(lambda **k: PackedBatchSampler(data, batch_size=4, **k), order=NEW)
    assert old_batches.read_order == new_batches.read_order == replace(NEW, batch_size=4)
    assert _epochs(old_batches) == _epochs(new_batches)
    assert old_batches.state_dict(batches_consumed=1) == new_batches.state_dict(batches_consumed=1)
    assert (new_batches.batch_size, new_batches.drop_last) == (4, True)


def test_iterable_and_threaded_readers_read_and_save_the_same_in_both_spellings(packed: Path) -> None:
    old = _old(lambda **k: PackedIterableDataset(packed, batch_size=4, decode=False, fields=("index",), **k),
               "PackedIterableDataset", **OLD)
    new = _new(lambda **k: PackedIterableDataset(packed, batch_size=4, decode=False, fields=("index",), **k), order=NEW)
    assert old.read_order == new.read_order
    assert [[b["index"].tolist() for b in old] for _ in range(1)] == [[b["index"].tolist() for b in new]]
    assert old.state_dict(batches_consumed=1) == new.state_dict(batches_consumed=1)
    sampler = PackedBatchSampler(_indices(packed), batch_size=4, order=NEW)
    assert [b["index"].tolist() for b in new] == list(sampler)  # every reader deals the order the same way
    old_threads = _old(lambda **k: ThreadedLoader(packed, batch_size=4, decode=False, fields=("index",), **k),
                       "ThreadedLoader", **OLD)
    new_threads = _new(lambda **k: ThreadedLoader(packed, batch_size=4, decode=False, fields=("index",), **k),
                       order=NEW)
    assert old_threads.read_order == new_threads.read_order
    assert [b["index"].tolist() for b in old_threads] == [b["index"].tolist() for b in new_threads] == list(sampler)
    assert old_threads.state_dict(1) == new_threads.state_dict(1) == sampler.state_dict(batches_consumed=1)


def test_a_kind_string_is_short_for_a_read_order(packed: Path) -> None:
    data = _indices(packed)
    assert list(PackedBatchSampler(data, batch_size=4, order="sequential")) == \
        list(PackedBatchSampler(data, batch_size=4, order=ReadOrder("sequential")))
    assert PackedSampler(data).read_order.kind == "random"  # each reader's default kind
    assert PackedIterableDataset(packed, batch_size=4, decode=False).read_order.kind == "block"
    assert ThreadedLoader(packed, batch_size=4, decode=False).read_order.kind == "random"


def test_an_order_disagreeing_with_the_readers_batch_size_is_refused(packed: Path) -> None:
    for make, reader in ((lambda: PackedBatchSampler(_indices(packed), batch_size=4, order=ReadOrder(batch_size=8)),
                          "PackedBatchSampler"),
                         (lambda: PackedIterableDataset(packed, batch_size=4, order=ReadOrder(batch_size=8)),
                          "PackedIterableDataset"),
                         (lambda: ThreadedLoader(packed, batch_size=4, order=ReadOrder(batch_size=8)),
                          "ThreadedLoader")):
        with pytest.raises(OptionError) as caught:
            make()
        assert caught.value.message == (f"{reader} has batch_size=4 but its order has batch_size=8; give the same, "
                                        f"or leave the order's out (None: the reader's)")


def test_old_keywords_beside_an_order_are_refused(packed: Path) -> None:
    with pytest.raises(OptionError) as caught:
        PackedSampler(_indices(packed), order=ReadOrder("block"), seed=3)
    assert caught.value.message == ("PackedSampler: seed= and order=ReadOrder('block') both say how to read; put "
                                    "them in the ReadOrder")
    with pytest.raises(TypeError, match="unexpected keyword argument 'sed'"):
        PackedBatchSampler(_indices(packed), batch_size=2, sed=3)


@pytest.mark.parametrize("threads, prefetch, name, value", [(0, None, "threads", 0), (2, 0, "prefetch", 0),
                                                            (True, None, "threads", True)])
def test_threaded_loader_counts_are_option_errors(packed: Path, threads: Any, prefetch: Any, name: str,
                                                  value: Any) -> None:
    with pytest.raises(OptionError) as caught:
        ThreadedLoader(packed, batch_size=4, threads=threads, prefetch=prefetch)
    assert caught.value.message == f"{name} must be a positive integer, got {value!r}"


# --- PackedDataLoader deals a PackedDataset itself ---------------------------------------------------


def test_the_loader_builds_its_batch_sampler_from_the_order(packed: Path) -> None:
    data = _indices(packed)
    order = ReadOrder("block", seed=4, block_bytes=1024, rank=1, world_size=2)
    loader = _new(lambda **k: PackedDataLoader(data, **k), batch_size=4, order=order, collate_fn=collate)
    assert isinstance(loader.batch_sampler, PackedBatchSampler) and isinstance(loader.sampler, PackedSampler)
    assert loader.batch_size == 4 and loader.drop_last is False
    assert loader.read_order == replace(order, batch_size=4)
    reference = PackedBatchSampler(data, batch_size=4, order=order)
    loader.set_epoch(3)
    reference.set_epoch(3)
    assert [b["index"].tolist() for b in loader] == list(reference)
    it = iter(loader)
    next(it)
    next(it)
    assert loader.state_dict() == reference.state_dict(batches_consumed=2)  # one dialect: batches
    loader.sampler.set_epoch(5)  # the DistributedSampler habit moves the loader
    assert loader.epoch == 5
    resumed = PackedDataLoader(data, batch_size=3, order=replace(order, rank=0, world_size=1), collate_fn=collate)
    resumed.load_state_dict(reference.state_dict(batches_consumed=2))  # another batch size and world size
    rest = [i for b in resumed for i in b["index"].tolist()]
    assert len(rest) == N - 2 * 2 * 4


def test_the_loaders_batch_size_and_drop_rule_are_the_orders(packed: Path) -> None:
    data = _indices(packed)
    from_order = PackedDataLoader(data, order=ReadOrder("sequential", batch_size=7), collate_fn=collate)
    assert from_order.batch_size == 7 and [len(b["index"]) for b in from_order] == [7, 7, 7, 7, 2]
    dropping = PackedDataLoader(data, batch_size=7, order="sequential", drop_last=True, collate_fn=collate)
    assert dropping.read_order.drop_last and [len(b["index"]) for b in dropping] == [7, 7, 7, 7]
    assert dropping.drop_last is True and dropping.batch_size == 7  # what frameworks read off a loader
    assert PackedDataLoader(data, collate_fn=collate).batch_size == 1  # the DataLoader's default
    with pytest.raises(OptionError) as refused:
        PackedDataLoader(data, batch_size=4, order=3)  # type: ignore[arg-type]
    assert refused.value.message == ("PackedDataLoader: order must be a packer.ReadOrder or one of ['sequential', "
                                     "'random', 'block'], got int")
    with pytest.raises(OptionError) as caught:
        PackedDataLoader(data, batch_size=4, order=ReadOrder(batch_size=8))
    assert caught.value.message == ("PackedDataLoader has batch_size=4 but its order has batch_size=8; give the "
                                    "same, or leave the order's out (None: the reader's)")


def test_without_an_order_the_loader_shuffles_as_a_dataloader_would(packed: Path) -> None:
    data = _indices(packed)
    plain = PackedDataLoader(data, batch_size=5, collate_fn=collate)
    assert plain.read_order.kind == "sequential" and [b["index"].tolist() for b in plain][0] == [0, 1, 2, 3, 4]
    shuffled = PackedDataLoader(data, batch_size=5, shuffle=True, collate_fn=collate)
    assert shuffled.read_order == ReadOrder("random", batch_size=5, rank=0, world_size=1)
    assert PackedDataLoader(data, batch_size=5, shuffle=False, order="block").read_order.kind == "block"
    with pytest.raises(OptionError) as caught:
        PackedDataLoader(data, batch_size=5, shuffle=True, order="block")
    assert caught.value.message == ("PackedDataLoader: shuffle=True and order= both say how to read; give the order "
                                    "alone (order=ReadOrder('random', ...))")


def test_a_loader_without_batches_reads_samples(packed: Path) -> None:
    data = _indices(packed)
    loader = PackedDataLoader(data, batch_size=None, order=ReadOrder("random", seed=1))
    assert isinstance(loader.sampler, PackedSampler) and loader.batch_sampler is None
    assert loader.state_dict()["consumed"] == 0  # nothing handed out yet
    it = iter(loader)
    first = [next(it)["index"] for _ in range(3)]
    assert first == list(PackedSampler(data, order=ReadOrder("random", seed=1)))[:3]
    assert loader.state_dict() == loader.sampler.state_dict(samples_consumed=3)
    loader.load_state_dict(loader.state_dict())
    assert loader.state_dict()["consumed"] == 3  # nothing handed out since the load


def test_a_loader_batching_an_unbatched_iterable_counts_samples(packed: Path) -> None:
    samples = PackedIterableDataset(packed, batch_size=4, batched=False, decode=False, fields=("index",),
                                    order=ReadOrder("sequential"))
    loader = PackedDataLoader(samples, batch_size=4, collate_fn=collate)
    it = iter(loader)
    assert [next(it)["index"].tolist() for _ in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert loader.state_dict()["consumed"] == 8 == samples.state_dict(samples_consumed=8)["consumed"]


def test_order_is_refused_beside_a_reader_with_its_own(packed: Path) -> None:
    data = _indices(packed)
    message = ("PackedDataLoader: order= is for a PackedDataset without a sampler; the sampler, batch sampler or "
               "PackedIterableDataset given reads an order of its own")
    for make in (lambda: PackedDataLoader(data, sampler=PackedSampler(data), batch_size=2, order="block"),
                 lambda: PackedDataLoader(data, batch_sampler=PackedBatchSampler(data, batch_size=2), order="block"),
                 lambda: PackedDataLoader(PackedIterableDataset(packed, batch_size=2, decode=False), batch_size=None,
                                          order="block")):
        with pytest.raises(OptionError) as caught:
            make()
        assert caught.value.message == message


# --- a PackedSampler with a loader batch size: read through a batch sampler, never changed ---------------


def test_a_sampler_is_read_through_a_batch_sampler_that_shares_its_order_and_position(packed: Path) -> None:
    data = _indices(packed)
    order = ReadOrder("block", seed=3, block_bytes=1024, rank=0, world_size=2)
    sampler = PackedSampler(data, order=order)
    loader = PackedDataLoader(data, sampler=sampler, batch_size=4, collate_fn=collate)
    assert sampler.read_order == order and sampler.batch_size is None  # not changed
    assert loader.sampler is sampler and loader.batch_size == 4
    assert loader.batch_sampler.read_order == replace(order, batch_size=4)
    sampler.set_epoch(2)  # one position: the sampler moves the loader
    assert loader.epoch == 2 and loader.batch_sampler.epoch == 2
    assert [b["index"].tolist() for b in loader] == _at_epoch(data, order, 4, 2)
    sized = PackedSampler(data, order=replace(order, batch_size=5))
    assert PackedDataLoader(data, sampler=sized, collate_fn=collate).batch_size == 5  # the sampler's, unasked
    unsized = PackedDataLoader(data, sampler=PackedSampler(data, order="sequential"), collate_fn=collate)
    assert unsized.batch_size == 1 and [b["index"].tolist() for b in unsized][:2] == [[0], [1]]  # DataLoader's 1
    with pytest.raises(ValueError, match="mutually exclusive"):  # the DataLoader's own refusal, not a silent pick
        PackedDataLoader(data, sampler=PackedSampler(data), batch_sampler=PackedBatchSampler(data, batch_size=2))
    dropped = PackedDataLoader(data, sampler=PackedSampler(data, order=order), batch_size=4, drop_last=True)
    assert dropped.batch_sampler.drop_last and not dropped.sampler.read_order.drop_last


def _at_epoch(data: PackedDataset, order: ReadOrder, batch_size: int, epoch: int) -> list[list[int]]:
    batches = PackedBatchSampler(data, batch_size=batch_size, order=order)
    batches.set_epoch(epoch)
    return list(batches)


def test_use_batch_size_still_works_for_a_release(packed: Path) -> None:
    sampler = PackedSampler(_indices(packed), order="sequential")
    with pytest.warns(DeprecationWarning) as caught:
        sampler.use_batch_size(4)
    assert str(caught[0].message) == ("PackedSampler.use_batch_size() is deprecated and goes in the next release: give "
                                      "the batch size in order=packer.ReadOrder(batch_size=...), or pass the sampler "
                                      "to PackedDataLoader")
    assert sampler.batch_size == 4
    with pytest.raises(OptionError) as caught, pytest.warns(DeprecationWarning):
        sampler.use_batch_size(8)
    assert caught.value.message == ("the PackedSampler was given batch_size=4 but the DataLoader's batch_size is 8: "
                                    "give both the same, or leave the sampler's out")


def test_the_loader_with_worker_processes_reads_what_the_batch_sampler_deals(packed: Path) -> None:
    data = _indices(packed)
    order = ReadOrder("random", seed=6)
    loader = PackedDataLoader(data, batch_size=4, order=order, num_workers=2, collate_fn=collate)
    loader.set_epoch(1)
    assert [b["index"].tolist() for b in loader] == _at_epoch(data, order, 4, 1)


class _Recording:
    """A sample source that records what a reader says it will read (what a dataset in object
    storage fetches ahead from): ``plan_reads`` and ``reads_advanced``."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.planned: list[list[int]] = []
        self.advanced: list[int] = []

    def __len__(self) -> int:
        return self.count

    def plan_reads(self, indices: Any) -> None:
        self.planned.append([int(i) for i in indices])

    def reads_advanced(self, position: int) -> None:
        self.advanced.append(int(position))


def test_every_sampler_tells_its_dataset_the_order_it_will_read() -> None:
    order = ReadOrder("random", seed=2)
    expected = PackedBatchSampler(12, batch_size=4, order=order)
    flat = [i for batch in expected for i in batch]
    batches = _Recording(12)
    assert list(PackedBatchSampler(batches, batch_size=4, order=order)) == list(expected)
    assert batches.planned == [flat] and batches.advanced == [0, 4, 8]
    samples = _Recording(12)
    assert list(PackedSampler(samples, order=order)) == flat
    assert samples.planned == [flat] and samples.advanced == [0]  # one chunk of indices
    wrapped = _Recording(12)  # a PackedSampler read by the loader through a batch sampler: the same
    sampler = PackedSampler(wrapped, order=order)
    loader = PackedDataLoader(list(range(12)), sampler=sampler, batch_size=4)
    assert [b.tolist() for b in loader] == list(expected)
    assert wrapped.planned == [flat] and wrapped.advanced == [0, 4, 8]
    assert list(loader.batch_sampler.sampler) == flat  # its .sampler (what frameworks iterate) too
    assert wrapped.planned == [flat, flat] and wrapped.advanced == [0, 4, 8, 0]


def test_the_sampler_of_a_batch_sampler_counts_samples_and_moves_the_crops(packed: Path) -> None:
    from packer.transforms import RandomResizedCrop

    data = PackedDataset(packed, decode=RandomResizedCrop(4, seed=1))
    batches = PackedBatchSampler(data, batch_size=4, order=ReadOrder("random", seed=3))
    it = iter(batches.sampler)
    for _ in range(5):
        next(it)
    assert batches.sampler.state_dict() == batches.sampler.state_dict(samples_consumed=5)  # samples, not batches
    assert batches.sampler.state_dict()["consumed"] == 4
    batches.sampler.set_epoch(3)  # what Lightning and Accelerate call
    assert data._pipeline.decode.epoch == 3 and batches.epoch == 3
    loader = PackedDataLoader(data, sampler=PackedSampler(data, order="random"), batch_size=4)
    loader.batch_sampler.sampler.set_epoch(5)
    assert data._pipeline.decode.epoch == 5
