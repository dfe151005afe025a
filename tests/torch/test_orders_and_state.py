"""The torch readers' order and state: samplers, batch sampler, loader and iterable dataset deal the
order module's epoch order to ranks and workers, count what they handed out, and resume from
their state dicts."""

from __future__ import annotations

import json
import pickle
import shutil
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np
import pytest

from packer.dataset import open_dataset, open_index
from packer.decode import decode_image
from packer.errors import OptionError, PackerError
from packer.order import (
    DEFAULT_BLOCK_BYTES,
    DEFAULT_BLOCK_SAMPLES,
    DEFAULT_WINDOW,
    RankPlan,
    ReadOrder,
    deal,
    epoch_order,
    index_blocks,
    uniform_blocks,
)
from packer.writer import BuildOptions, build

from helpers import VECTORS, edit_manifest, png_folder


# --- torch: the sampler and reader state (orders, rank split, positions, state dicts) -------------


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
        "ambiguous: pass samples_consumed=batches * batch_size, create the sampler with "
        "order=ReadOrder(batch_size=<the DataLoader's batch_size>), or use packer.torch.PackedDataLoader, which "
        "counts the batches it hands out")
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
        pt.PackedDataLoader(list(range(8)), batch_size=2)  # no packer reader: nothing to track
    assert caught.value.message == ("PackedDataLoader tracks a packer reader: pass a PackedDataset (with order=), "
                                    "batch_sampler=PackedBatchSampler(...), sampler=PackedSampler(...) or a "
                                    "PackedIterableDataset")


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
    edit_manifest(out, lambda m: m.update(codec={"name": "zstd-future"}))
    for decode in (True, lambda data, image_format: data):
        with pytest.raises(PackerError) as caught:
            pt.PackedIterableDataset(out, batch_size=2, decode=decode)
        assert "zstd-future" in caught.value.message and caught.value.path == str(out)
    pt.PackedIterableDataset(out, batch_size=2, decode=False)
    edit_manifest(out, lambda m: m.update(codec={"name": "passthrough"}, limits={"max_pixels": 100}))
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


# --- torch ----------------------------------------------------------------------------------------


TORCH_COUNT = 14


@pytest.fixture(scope="module")
def torch_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import make_sample

    root = tmp_path_factory.mktemp("torch-state")
    make_sample.make_image_folder(root / "src", classes=2, per_class=TORCH_COUNT // 2, seed=21, min_size=10,
                                  max_size=14, formats=("png",))
    build(root / "src", root / "ds", BuildOptions(shard_size=4096, alignment=512), workers=1, progress=False)
    with open_dataset(root / "ds") as ds:  # what the tests below rely on
        ix = ds.index
        assert len(ds) == TORCH_COUNT and ix.shard.tolist() == [0] * 7 + [1] * 4 + [2] * 3
        assert len({ds.read(i) for i in range(TORCH_COUNT)}) == TORCH_COUNT
    return root / "ds"


def _torch_pt() -> Any:
    pytest.importorskip("torch")  # packer.torch raises MissingDependencyError without it, not ImportError
    import packer.torch

    return packer.torch


def _torch_ids(folder: Path) -> Callable[[Any], list[int]]:
    """Sample indices of raw payloads (``decode=False``), told apart by their bytes."""
    with open_dataset(folder) as ds:
        by_payload = {ds.read(i): i for i in range(len(ds))}
    return lambda payloads: [by_payload[bytes(t.numpy())] for t in payloads]


def _torch_blocks(folder: Path, block_bytes: int) -> np.ndarray:
    with open_dataset(folder) as ds:
        ix = ds.index
        return index_blocks(ix.offset, ix.size, ix.shard, block_bytes)


def _torch_batches(*, order: str = "random", seed: int = 0, epoch: int = 0, consumed: int = 0, rank: int = 0,
                   world_size: int = 1, batch_size: int = 1, drop_last: bool = False, blocks: Any = None,
                   window: int = DEFAULT_WINDOW, count: int = TORCH_COUNT) -> list[list[int]]:
    """The reference: ``deal(epoch_order(...))`` cut into the rank's batches."""
    if order == "block" and blocks is None:
        blocks = uniform_blocks(count)
    global_order = epoch_order(order, count, seed=seed, epoch=epoch, blocks=blocks, window=window)
    plan = deal(global_order, consumed=consumed, rank=rank, world_size=world_size, batch_size=batch_size,
                drop_last=drop_last, sort_steps=order == "block")
    return [plan.batch(k).tolist() for k in range(plan.num_batches)]


def _torch_in_worker(monkeypatch: pytest.MonkeyPatch, worker: int | None, num_workers: int = 0) -> None:
    import torch.utils.data as torch_data

    info = None if worker is None else SimpleNamespace(id=worker, num_workers=num_workers)
    monkeypatch.setattr(torch_data, "get_worker_info", lambda: info)


def _torch_equal(a: Any, b: Any) -> bool:
    import torch

    return bool(torch.equal(a, b))


def test_torch_samplers_deal_the_reference_order(torch_folder: Path) -> None:
    pt = _torch_pt()
    byte_blocks = _torch_blocks(torch_folder, 1024)
    cases = [  # (sampler options, reference options besides the batch size)
        (dict(order="random", seed=3, rank=1, world_size=3), dict(order="random", seed=3, rank=1, world_size=3)),
        (dict(order="sequential", rank=2, world_size=4, drop_last=True),
         dict(order="sequential", rank=2, world_size=4, drop_last=True)),
        (dict(order="block", seed=2, block_bytes=1024, window=2, rank=0, world_size=2),
         dict(order="block", seed=2, blocks=byte_blocks, window=2, rank=0, world_size=2)),
        (dict(order="block", seed=2, block_samples=3, window=1, rank=1, world_size=2),
         dict(order="block", seed=2, blocks=uniform_blocks(TORCH_COUNT, 3), window=1, rank=1, world_size=2)),
        (dict(order="block", seed=5),
         dict(order="block", seed=5, blocks=_torch_blocks(torch_folder, DEFAULT_BLOCK_BYTES))),
    ]
    dataset = pt.PackedDataset(torch_folder, decode=False)
    for options, reference in cases:
        for epoch in (0, 2):
            for batch_size in (None, 3):
                sampler = pt.PackedSampler(dataset, batch_size=batch_size, **options)
                sampler.set_epoch(epoch)
                expected = _torch_batches(epoch=epoch, batch_size=batch_size or 1, **reference)
                flat = [i for batch in expected for i in batch]
                assert list(sampler) == flat, (options, epoch, batch_size)
                assert len(sampler) == len(flat)
            batches = pt.PackedBatchSampler(dataset, batch_size=3, **options)
            batches.set_epoch(epoch)
            expected = _torch_batches(epoch=epoch, batch_size=3, **reference)
            assert list(batches) == expected and len(batches) == len(expected), (options, epoch)
            assert list(batches.sampler) == [i for batch in expected for i in batch]


def test_torch_iterable_deals_batches_to_ranks_and_workers(torch_folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pt = _torch_pt()
    ids = _torch_ids(torch_folder)
    byte_blocks = _torch_blocks(torch_folder, 1024)
    cases = [
        (dict(order="block", seed=4, block_bytes=1024, window=2, rank=1, world_size=2),
         dict(order="block", seed=4, blocks=byte_blocks, window=2, rank=1, world_size=2)),
        (dict(order="random", seed=7, rank=0, world_size=3, drop_last=True),
         dict(order="random", seed=7, rank=0, world_size=3, drop_last=True)),
        (dict(order="sequential", rank=2, world_size=3), dict(order="sequential", rank=2, world_size=3)),
    ]
    for options, reference in cases:
        for worker, num_workers in [(None, 0), (0, 2), (1, 2), (2, 3)]:
            _torch_in_worker(monkeypatch, worker, num_workers)
            batches = pt.PackedIterableDataset(torch_folder, batch_size=2, decode=False, **options)
            samples = pt.PackedIterableDataset(torch_folder, batch_size=2, decode=False, batched=False, **options)
            for epoch in (0, 3):
                batches.set_epoch(epoch)
                samples.set_epoch(epoch)
                expected = _torch_batches(epoch=epoch, batch_size=2, **reference)
                mine = expected if worker is None else expected[worker::num_workers]
                assert [ids(images) for images, _ in batches] == mine, (options, worker, epoch)
                assert [ids([image])[0] for image, _ in samples] == [i for batch in mine for i in batch]
                assert len(batches) == len(expected) and len(samples) == sum(map(len, expected))


def test_torch_resume_positions_across_readers(torch_folder: Path) -> None:
    """Saved after some batches of one configuration, loaded into another: the rest of that epoch."""
    pt = _torch_pt()
    ids = _torch_ids(torch_folder)
    dataset = pt.PackedDataset(torch_folder, decode=False)
    byte_blocks = _torch_blocks(torch_folder, 1024)
    for order, blocks, drop_last in [("random", None, False), ("block", byte_blocks, True), ("sequential", None, True)]:
        settings = dict(order=order, seed=6, drop_last=drop_last, block_bytes=1024, window=2)
        reference = dict(order=order, seed=6, drop_last=drop_last, blocks=blocks, window=2, epoch=1)
        first = pt.PackedBatchSampler(dataset, batch_size=2, rank=1, world_size=2, **settings)
        first.set_epoch(1)
        it = iter(first)
        taken = [next(it) for _ in range(2)]
        assert taken == _torch_batches(batch_size=2, rank=1, world_size=2, **reference)[:2]
        state = first.state_dict()
        assert (state["epoch"], state["consumed"], state["order"], state["seed"]) == (1, 8, order, 6)
        assert state == first.state_dict(batches_consumed=2) == first.sampler.state_dict(samples_consumed=4)
        resumed = pt.PackedBatchSampler(dataset, batch_size=3, **settings)  # another batch size and world size
        resumed.load_state_dict(state)
        assert (resumed.epoch, resumed.start) == (1, 8)
        rest = _torch_batches(batch_size=3, consumed=8, **reference)
        assert list(resumed) == rest and len(resumed) == len(rest), order
        resumed.set_epoch(1)  # the loaded position was used by the pass after the load: a whole epoch now
        assert list(resumed) == _torch_batches(batch_size=3, **reference)
        again = pt.PackedBatchSampler(dataset, batch_size=3, **settings)
        again.load_state_dict(state)
        again.set_epoch(1)  # the loaded epoch keeps the position for the pass that follows the load
        assert list(again) == rest
        samples = pt.PackedSampler(dataset, rank=1, world_size=3, **settings)
        samples.load_state_dict(state)
        flat = [i for batch in _torch_batches(consumed=8, rank=1, world_size=3, **reference) for i in batch]
        assert list(samples) == flat and len(samples) == len(flat)
        iterable = pt.PackedIterableDataset(torch_folder, batch_size=4, decode=False, **settings)
        iterable.load_state_dict(state)
        assert [ids(images) for images, _ in iterable] == _torch_batches(batch_size=4, consumed=8, **reference)
        assert len(iterable) == len(_torch_batches(batch_size=4, consumed=8, **reference))
        iterable.set_epoch(2)  # another epoch starts at its beginning
        assert iterable.start == 0
        assert [ids(images) for images, _ in iterable] == _torch_batches(batch_size=4, **{**reference, "epoch": 2})
        resumed.set_epoch(3)
        assert list(resumed) == _torch_batches(batch_size=3, **{**reference, "epoch": 3})


def test_torch_loader_refusals_are_exact(torch_folder: Path) -> None:
    pt = _torch_pt()
    dataset = pt.PackedDataset(torch_folder, decode=False)
    with pytest.raises(OptionError) as caught:
        pt.PackedDataLoader(dataset, sampler=pt.PackedSampler(dataset, batch_size=3), batch_size=2)
    assert caught.value.message == ("the PackedSampler was given batch_size=3 but the DataLoader's batch_size is 2: "
                                    "give both the same, or leave the sampler's out")
    for sampler in (pt.PackedSampler(dataset, batch_size=2), pt.PackedSampler(dataset)):  # agreeing, or unsized
        assert pt.PackedDataLoader(dataset, sampler=sampler, batch_size=2).state_dict()["consumed"] == 0


def test_torch_iterable_with_fields_counts_what_it_handed_out(torch_folder: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Dict samples (``fields=``) take another path through ``__iter__``: it counts the same way."""
    pt = _torch_pt()
    expected = _torch_batches(seed=1, batch_size=3)
    for batched in (True, False):
        dataset = pt.PackedIterableDataset(torch_folder, batch_size=3, decode=False, order="random", seed=1,
                                           batched=batched, fields=("index", "label"))
        it = iter(dataset)
        taken = [next(it) for _ in range(4)]
        if batched:
            assert [batch["index"].tolist() for batch in taken] == expected[:4]
            assert dataset.state_dict() == dataset.state_dict(batches_consumed=4)
            assert dataset.state_dict()["consumed"] == 12
        else:
            assert [sample["index"] for sample in taken] == [i for batch in expected for i in batch][:4]
            assert dataset.state_dict() == dataset.state_dict(samples_consumed=4)
            assert dataset.state_dict()["consumed"] == 3  # one whole batch
        list(it)
        assert dataset.state_dict()["consumed"] == TORCH_COUNT
    _torch_in_worker(monkeypatch, 1, 2)  # a worker's own state counts its own items
    for batched, items in ((True, 2), (False, 5)):
        dataset = pt.PackedIterableDataset(torch_folder, batch_size=3, decode=False, seed=1, batched=batched,
                                           fields=("index",))
        it = iter(dataset)
        for _ in range(items):
            next(it)
        assert dataset.state_dict()["worker_items"] == items


def test_torch_set_epoch_moves_the_seeded_crops(torch_folder: Path) -> None:
    """A loop that moves only the sampler (the DistributedSampler habit) moves the dataset's crops too."""
    pt = _torch_pt()
    from packer.transforms import RandomResizedCrop

    crop = RandomResizedCrop(8, seed=3)
    dataset = pt.PackedDataset(torch_folder, decode=crop)
    for epoch, reader in enumerate([pt.PackedSampler(dataset), pt.PackedBatchSampler(dataset, batch_size=2),
                                    pt.PackedDataLoader(dataset, sampler=pt.PackedSampler(dataset), batch_size=2)], 1):
        reader.set_epoch(epoch)
        assert crop.epoch == epoch and reader.epoch == epoch
    moved = RandomResizedCrop(8, seed=3)
    iterable = pt.PackedIterableDataset(torch_folder, batch_size=4, order="sequential", decode=moved)
    iterable.set_epoch(5)
    assert moved.epoch == 5
    at_five = RandomResizedCrop(8, seed=3)
    at_five.set_epoch(5)
    reference = pt.PackedDataset(torch_folder, decode=at_five)
    images, _ = next(iter(iterable))
    assert _torch_equal(images, pt.collate(reference.__getitems__([0, 1, 2, 3]))[0])
    at_zero = pt.PackedDataset(torch_folder, decode=RandomResizedCrop(8, seed=3))
    assert not _torch_equal(images, pt.collate(at_zero.__getitems__([0, 1, 2, 3]))[0])  # the epoch matters
    fields = RandomResizedCrop(8, seed=3)
    pt.PackedIterableDataset(torch_folder, batch_size=4, decode=fields, fields=("image", "index")).set_epoch(2)
    assert fields.epoch == 2


def test_torch_iterable_fields_pass_the_reader_options(torch_folder: Path) -> None:
    """With ``fields=`` the samples come from a PackedDataset given every decoding option."""
    pt = _torch_pt()
    options = dict(layout="HWC", transform=lambda t: t[:2, :3] + 1, target_transform=lambda y: y + 10)
    fields = ("image", "label", "index")
    reference = pt.PackedDataset(torch_folder, fields=fields, **options)
    for batched in (True, False):
        dataset = pt.PackedIterableDataset(torch_folder, batch_size=3, order="random", seed=2, fields=fields,
                                           batched=batched, **options)
        got = list(dataset)
        samples = got if not batched else [dict(image=batch["image"][j], label=int(batch["label"][j]),
                                                index=int(batch["index"][j]))
                                           for batch in got for j in range(len(batch["index"]))]
        order = [i for batch in _torch_batches(seed=2, batch_size=3) for i in batch]
        assert [int(sample["index"]) for sample in samples] == order
        for sample in samples:
            expected = reference[int(sample["index"])]
            assert sample["label"] == expected["label"] and sample["label"] >= 10
            assert sample["image"].shape == (2, 3, 3) and _torch_equal(sample["image"], expected["image"])


def test_torch_iterable_collate_fn_is_for_dict_samples_only(torch_folder: Path) -> None:
    pt = _torch_pt()
    ids = _torch_ids(torch_folder)
    custom = lambda samples: {"custom": len(samples)}  # noqa: E731
    plain = pt.PackedIterableDataset(torch_folder, batch_size=3, order="random", seed=2, decode=False,
                                     collate_fn=custom)
    assert [ids(images) for images, _ in plain] == _torch_batches(seed=2, batch_size=3)  # unused for (image, label)
    for fields in (["image", "label"], ("image", "label")):
        assert isinstance(next(iter(pt.PackedIterableDataset(torch_folder, batch_size=3, fields=fields,
                                                             collate_fn=custom))), tuple)
    dicts = pt.PackedIterableDataset(torch_folder, batch_size=3, order="random", seed=2, fields=("index",),
                                     collate_fn=custom)
    assert list(dicts) == [{"custom": len(batch)} for batch in _torch_batches(seed=2, batch_size=3)]


def test_torch_readers_report_their_order_settings(torch_folder: Path) -> None:
    """``read_order`` is the order the reader was given, its batch size, rank and world size filled in
    (a reader built from it reads the same blocks)."""
    pt = _torch_pt()
    from packer.order import ReadOrder

    order = ReadOrder("block", seed=2, block_bytes=1024, window=3, drop_last=True)
    here = dict(rank=0, world_size=1)  # resolved: no process group in this test
    dataset = pt.PackedDataset(torch_folder, decode=False)
    assert pt.PackedSampler(dataset, order=order).read_order == replace(order, **here)  # batch size: None
    sized = replace(order, batch_size=4)
    assert pt.PackedSampler(dataset, order=sized).read_order == replace(sized, **here)
    batches = pt.PackedBatchSampler(dataset, batch_size=3, order=order)
    assert batches.read_order == batches.sampler.read_order == replace(order, batch_size=3, **here)
    iterable = pt.PackedIterableDataset(torch_folder, batch_size=3, decode=False, order=order)
    assert iterable.read_order == replace(order, batch_size=3, **here)
    rebuilt = pt.PackedSampler(dataset, order=batches.read_order)
    assert list(rebuilt) == list(batches.sampler)
