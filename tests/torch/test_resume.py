"""Resume that cannot be wired wrong: every reader, stopped mid-epoch under real prefetching, resumed
from its saved state, sees the rest of the epoch exactly once.

Each test runs an epoch until a few batches have reached the loop, drops the loader (as a killed
job would: its workers had prefetched more), saves the state the natural way, builds a fresh
reader in another configuration, and checks that what the two runs saw together is the epoch
(every sample once; padding only where the pad rule says).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import BatchSampler, DataLoader  # noqa: E402

from packer.writer import build  # noqa: E402
from packer.writer.plan import BuildOptions  # noqa: E402
from packer.errors import OptionError  # noqa: E402
from packer.torch import PackedBatchSampler, PackedDataLoader, PackedDataset, PackedIterableDataset, PackedSampler, collate

pytestmark = [pytest.mark.filterwarnings("ignore:.*pin_memory.*:UserWarning"),
              pytest.mark.filterwarnings("ignore:This DataLoader will create.*:UserWarning")]

N = 40  # samples; batch 4 divides it, so an epoch has no padding on one rank


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import make_sample

    root = tmp_path_factory.mktemp("resume") / "src"
    make_sample.make_image_folder(root, classes=4, per_class=N // 4, seed=11, min_size=12, max_size=12,
                                  formats=("png",))
    out = root.parent / "ds"
    build(root, out, BuildOptions(shard_size=8 << 10, alignment=512), workers=1, progress=False)
    return out


@pytest.fixture(scope="module")
def identify(packed: Path):
    dataset = PackedDataset(packed).dataset
    by_payload = {dataset.read(i): i for i in range(len(dataset))}
    return lambda images: [by_payload[t.numpy().tobytes()] for t in images]


def _workers() -> dict:
    # Two workers, each prefetching 4 batches: far more in flight than the loop consumes.
    return dict(num_workers=2, prefetch_factor=4, persistent_workers=False)


def _take(loader, batches: int, identify) -> list[int]:
    seen = []
    for step, (images, _) in enumerate(loader, 1):
        seen += identify(images)
        if step == batches:
            break
    return seen


def _assert_epoch_once(seen: list[int], *, extra: int = 0) -> None:
    counts = Counter(seen)
    assert set(counts) == set(range(N)), sorted(set(range(N)) - set(counts))
    assert sum(counts.values()) == N + extra, counts.most_common(3)


# --- the trap of the old README: counting DataLoader batches as sampler samples ---------------

def test_sampler_refuses_batches_it_cannot_count(packed: Path) -> None:
    sampler = PackedSampler(PackedDataset(packed, decode=False), seed=0)
    with pytest.raises(OptionError, match="samples_consumed"):
        sampler.state_dict(batches_consumed=2)
    # told the batch size, batches are unambiguous: 2 batches of 4 are 8 samples
    told = PackedSampler(PackedDataset(packed, decode=False), seed=0, batch_size=4)
    assert told.state_dict(batches_consumed=2)["consumed"] == 8
    assert sampler.state_dict(samples_consumed=8)["consumed"] == 8


def test_loader_refuses_a_sampler_batch_size_that_is_not_its_own(packed: Path) -> None:
    dataset = PackedDataset(packed, decode=False)
    with pytest.raises(OptionError, match="batch_size"):
        PackedDataLoader(dataset, sampler=PackedSampler(dataset, batch_size=8), batch_size=4, collate_fn=collate)
    with pytest.raises(OptionError, match="tracks a packer reader"):
        PackedDataLoader(list(range(8)), batch_size=4, collate_fn=collate)


def test_batch_sampler_is_a_torch_batch_sampler(packed: Path) -> None:
    dataset = PackedDataset(packed, decode=False)
    sampler = PackedBatchSampler(dataset, batch_size=4, seed=3)
    assert isinstance(sampler, BatchSampler)
    assert sampler.batch_size == 4 and sampler.drop_last is False and isinstance(sampler.sampler, PackedSampler)
    sampler.sampler.set_epoch(2)  # a framework calling set_epoch on .sampler moves the batch sampler too
    assert sampler.epoch == 2
    flat = [i for batch in sampler for i in batch]
    assert flat == list(sampler.sampler)


# --- every reader: stop under prefetching, resume elsewhere, the epoch exactly once ------------

def test_map_style_sampler_through_packed_dataloader(packed: Path, identify) -> None:
    dataset = PackedDataset(packed, decode=False)
    loader = PackedDataLoader(dataset, sampler=PackedSampler(dataset, seed=5), batch_size=4, collate_fn=collate,
                              **_workers())
    loader.set_epoch(1)
    seen = _take(loader, 2, identify)  # the README's wiring: 2 batches of 4
    state = loader.state_dict()
    del loader
    assert state["consumed"] == 8 and state["epoch"] == 1
    # resume with another batch size and worker count
    resumed = PackedDataLoader(dataset, sampler=PackedSampler(dataset, seed=5), batch_size=3, collate_fn=collate,
                               num_workers=1)
    resumed.load_state_dict(state)
    resumed.set_epoch(1)
    rest = [i for images, _ in resumed for i in identify(images)]
    _assert_epoch_once(seen + rest)


def test_map_style_batch_sampler_across_ranks(packed: Path, identify) -> None:
    dataset = PackedDataset(packed, decode=False)
    seen, state = [], None
    for rank in range(2):
        sampler = PackedBatchSampler(dataset, batch_size=4, seed=2, order="block", block_bytes=2048, rank=rank,
                                     world_size=2)
        loader = PackedDataLoader(dataset, batch_sampler=sampler, collate_fn=collate, **_workers())
        seen += _take(loader, 3, identify)
        state = loader.state_dict()
        del loader
    assert state["consumed"] == 24
    rest = []
    sampler = PackedBatchSampler(dataset, batch_size=5, seed=2, order="block", block_bytes=2048)
    loader = PackedDataLoader(dataset, batch_sampler=sampler, collate_fn=collate, num_workers=2)
    loader.load_state_dict(state)
    rest = [i for images, _ in loader for i in identify(images)]
    _assert_epoch_once(seen + rest)


@pytest.mark.parametrize("batched", [True, False])
def test_iterable_dataset_through_packed_dataloader(packed: Path, identify, batched: bool) -> None:
    dataset = PackedIterableDataset(packed, batch_size=4, order="random", seed=9, decode=False, batched=batched)
    kwargs = dict(batch_size=None) if batched else dict(batch_size=4, collate_fn=collate)
    loader = PackedDataLoader(dataset, **kwargs, **_workers())
    seen = _take(loader, 3, identify)
    state = loader.state_dict()
    del loader
    assert state["consumed"] == 12
    fresh = PackedIterableDataset(packed, batch_size=4, order="random", seed=9, decode=False, batched=batched)
    fresh.load_state_dict(state)
    rest = [i for images, _ in PackedDataLoader(fresh, **kwargs, num_workers=1) for i in identify(images)]
    _assert_epoch_once(seen + rest)


def test_gpu_raw_batches_on_the_host(tmp_path: Path) -> None:
    import make_sample

    from packer.gpu import GpuRawBatches

    make_sample.make_image_folder(tmp_path / "src", classes=2, per_class=11, seed=2, formats=("png",))
    build(tmp_path / "src", tmp_path / "raw", BuildOptions(shard_size=16 << 10, codec="raw:size=8x6"),
          workers=1, progress=False)
    loader = GpuRawBatches(tmp_path / "raw", 4, order="block", seed=1, device="cpu", double_buffer=True)
    pixels = {}
    with loader:
        ds = loader.dataset
        for i in range(len(ds)):
            pixels[ds.read(i)] = i
        seen = []
        for step, (images, _) in enumerate(loader, 1):  # the read-ahead thread runs a batch ahead
            seen += [pixels[t.numpy().tobytes()] for t in images]
            if step == 2:
                state = loader.state_dict()
                break
    resumed = GpuRawBatches(tmp_path / "raw", 3, order="block", seed=1, device="cpu")
    with resumed:
        resumed.load_state_dict(state)
        rest = [pixels[t.numpy().tobytes()] for images, _ in resumed for t in images]
    counts = Counter(seen + rest)
    assert set(counts) == set(range(22)) and sum(counts.values()) == 22  # one rank: no padding, a short last batch


def test_dali_sample_source_state(packed: Path, identify) -> None:
    dali = pytest.importorskip("nvidia.dali")
    from nvidia.dali import fn, types

    from packer.dali import PackedSampleSource

    def run(source, batches: int | None) -> list[int]:
        @dali.pipeline_def(batch_size=4, num_threads=1, device_id=None, prefetch_queue_depth=3, seed=0,
                           py_num_workers=2, py_start_method="spawn")
        def pipeline():
            data, label, index = fn.external_source(source=source, num_outputs=3, batch=False, parallel=True,
                                                    dtype=[types.UINT8, types.INT64, types.INT64])
            return data, label, index

        pipe = pipeline()
        pipe.build()
        seen = []
        try:
            while batches is None or len(seen) < 4 * batches:
                _, _, index = pipe.run()
                seen += [int(np.array(index.at(j))) for j in range(len(index))]
        except StopIteration:
            pass
        del pipe
        return seen

    source = PackedSampleSource(packed, 4, seed=4, return_index=True)
    seen = run(source, 3)  # DALI prefetched further; the loop consumed 3 batches of epoch 0
    state = source.state_dict(0, 3)
    assert state["consumed"] == 12
    fresh = PackedSampleSource(packed, 4, seed=4, return_index=True)
    fresh.load_state_dict(state)
    rest = run(fresh, None)
    _assert_epoch_once(seen + rest)


def test_plain_dataloader_with_explicit_counts(packed: Path, identify) -> None:
    """Without PackedDataLoader: the loop counts and says what it counted."""
    dataset = PackedDataset(packed, decode=False)
    sampler = PackedSampler(dataset, seed=8)
    loader = DataLoader(dataset, sampler=sampler, batch_size=4, collate_fn=collate, **_workers())
    seen = _take(loader, 2, identify)
    state = sampler.state_dict(samples_consumed=2 * 4)
    del loader
    fresh = PackedSampler(dataset, seed=8)
    fresh.load_state_dict(state)
    rest = [i for images, _ in DataLoader(dataset, sampler=fresh, batch_size=4, collate_fn=collate)
            for i in identify(images)]
    _assert_epoch_once(seen + rest)


# --- torchdata's StatefulDataLoader: its own state_dict protocol on samplers and datasets --------

@pytest.mark.parametrize("kind", ["sampler", "batch_sampler", "iterable"])
def test_torchdata_stateful_dataloader(packed: Path, identify, kind: str) -> None:
    stateful = pytest.importorskip("torchdata.stateful_dataloader")

    def make():
        dataset = PackedDataset(packed, decode=False)
        if kind == "sampler":
            return stateful.StatefulDataLoader(dataset, sampler=PackedSampler(dataset, seed=3), batch_size=4,
                                               collate_fn=collate, **_workers())
        if kind == "batch_sampler":
            return stateful.StatefulDataLoader(dataset, batch_sampler=PackedBatchSampler(dataset, batch_size=4, seed=3),
                                               collate_fn=collate, **_workers())
        iterable = PackedIterableDataset(packed, batch_size=4, seed=3, decode=False)
        return stateful.StatefulDataLoader(iterable, batch_size=None, **_workers())

    loader = make()
    seen = _take(loader, 3, identify)
    state = loader.state_dict()  # the loader's own protocol: it asks the sampler / each worker's dataset
    del loader
    resumed = make()
    resumed.load_state_dict(state)
    rest = [i for images, _ in resumed for i in identify(images)]
    _assert_epoch_once(seen + rest)


def test_a_worker_state_is_refused_outside_its_worker(packed: Path) -> None:
    dataset = PackedIterableDataset(packed, batch_size=4, seed=3, decode=False)
    state = dict(dataset.state_dict(), worker=1, num_workers=2, worker_items=3)
    with pytest.raises(OptionError, match="worker 1 of 2"):
        dataset.load_state_dict(state)
