"""The PyTorch readers under real DataLoader worker processes: ranks, epochs, resumption, memory."""

from __future__ import annotations

import os
import pickle
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, DistributedSampler  # noqa: E402

from packer.writer import build  # noqa: E402
from packer.writer.plan import BuildOptions  # noqa: E402
from packer.torch import PackedBatchSampler, PackedDataset, PackedIterableDataset, collate  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:.*pin_memory.*:UserWarning"),
              pytest.mark.filterwarnings("ignore:This DataLoader will create.*:UserWarning")]

N = 30  # samples in the test dataset


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import make_sample

    root = tmp_path_factory.mktemp("dl") / "src"
    make_sample.make_image_folder(root, classes=3, per_class=N // 3, seed=5, min_size=16, max_size=16,
                                  formats=("jpeg", "png"))
    out = root.parent / "ds"
    build(root, out, BuildOptions(shard_size=4 << 10, alignment=512), workers=1, progress=False)
    return out


class _Identify:
    """Maps a raw payload (decode=False) back to its sample index."""

    def __init__(self, path: Path) -> None:
        dataset = PackedDataset(path).dataset
        self.by_payload = {dataset.read(i): i for i in range(len(dataset))}

    def __call__(self, images) -> list[int]:
        return [self.by_payload[t.numpy().tobytes()] for t in images]


def _loader(dataset, **kwargs) -> DataLoader:
    defaults = dict(num_workers=2, persistent_workers=True, pin_memory=True)
    defaults.update(kwargs)
    return DataLoader(dataset, **defaults)


def test_map_style_with_packed_batch_sampler_across_ranks_and_epochs(packed: Path) -> None:
    identify = _Identify(packed)
    dataset = PackedDataset(packed, decode=False)
    world = 3
    per_epoch = []
    for epoch in range(2):
        ranks = []
        for rank in range(world):
            sampler = PackedBatchSampler(dataset, batch_size=4, order="random", seed=7, rank=rank, world_size=world)
            sampler.set_epoch(epoch)
            batches = [identify(images) for images, _ in _loader(dataset, batch_sampler=sampler, collate_fn=collate)]
            assert [len(b) for b in batches] == [len(b) for b in (list(sampler))]
            assert batches == list(sampler)  # the loader returns the sampler's batches, in order
            ranks.append(batches)
        assert len({len(batches) for batches in ranks}) == 1  # same number of batches on every rank
        seen = [i for batches in ranks for batch in batches for i in batch]
        assert set(seen) == set(range(N)) and len(seen) == N  # 30 = 3 x 10: no padding needed
        per_epoch.append([b for step in zip(*ranks) for b in step])
    assert per_epoch[0] != per_epoch[1]


def test_map_style_decoded_batches_with_labels(packed: Path) -> None:
    dataset = PackedDataset(packed)
    sampler = PackedBatchSampler(dataset, batch_size=8, order="sequential")
    loader = _loader(dataset, batch_sampler=sampler, collate_fn=collate)
    for epoch in range(2):  # persistent workers serve both epochs
        sampler.set_epoch(epoch)
        got = list(loader)
        assert [images.shape[0] for images, _ in got] == [8, 8, 8, 6]
        assert all(images.shape[1:] == (3, 16, 16) and images.dtype == torch.uint8 for images, _ in got)
        labels = torch.cat([labels for _, labels in got])
        assert labels.tolist() == dataset.labels.tolist()
    first, _ = next(iter(loader))
    assert torch.equal(first[3], dataset[3][0])


def test_fused_transforms_decode_straight_into_the_shared_batch(packed: Path) -> None:
    """With a packer.transforms decode, workers decode into one channels-last shared batch tensor
    that collate hands over as is (HWC itself, CHW a view of it); the pixels equal the per-sample path's."""
    from packer.transforms import CenterCrop

    fused = PackedDataset(packed, decode=CenterCrop(12, resize=14), layout="HWC")
    samples = fused.__getitems__([5, 0, 5, 7])
    images, labels = collate(samples)
    assert images is samples.batch and images.shape == (4, 12, 12, 3) and images.is_contiguous()
    assert labels.tolist() == [int(fused.dataset.index.label[i]) for i in (5, 0, 5, 7)]
    for k, i in enumerate((5, 0, 5, 7)):
        assert torch.equal(images[k], fused[i][0])
    assert [int(label) for _, label in samples] == labels.tolist()  # still a sequence of samples
    assert torch.utils.data.default_collate(samples)[0] is images  # torch's own collate: the same tensor
    # CHW: the same memory, seen as (N, C, H, W) with channels-last strides (FFCV's ToTorchImage)
    chw = PackedDataset(packed, decode=CenterCrop(12, resize=14))
    chw_samples = chw.__getitems__([5, 0, 5, 7])
    chw_images, chw_labels = collate(chw_samples)
    assert chw_images.shape == (4, 3, 12, 12) and not chw_images.is_contiguous()
    assert chw_images.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(chw_images, images.permute(0, 3, 1, 2)) and torch.equal(chw_labels, labels)
    assert torch.equal(chw_images[1], chw[0][0])  # the per-sample path's (contiguous) CHW image
    default_images, default_labels = torch.utils.data.default_collate(chw_samples)
    assert default_images is chw_images and torch.equal(default_labels, labels)
    buffer = chw.fast_batch_buffer(4)  # ThreadedLoader's buffer, made in the iterating thread
    into, _ = chw.load_batch([5, 0, 5, 7], out=buffer)
    assert into.data_ptr() == buffer.data_ptr() and torch.equal(into, chw_images)
    assert PackedDataset(packed, decode=CenterCrop(12, resize=14), backend="pread").fast_batch_buffer(4) is None
    # a tensor transform keeps the per-sample path
    assert not hasattr(PackedDataset(packed, decode=CenterCrop(12, resize=14),
                                     transform=lambda t: t).__getitems__([0]), "batch")
    loader = _loader(fused, batch_sampler=PackedBatchSampler(fused, batch_size=8, order="sequential"),
                     collate_fn=collate)
    batches = list(loader)
    assert [b.shape for b, _ in batches] == [(8, 12, 12, 3)] * 3 + [(6, 12, 12, 3)]
    assert torch.equal(torch.cat([b for b, _ in batches]),
                       torch.stack([fused[i][0] for i in range(len(fused))]))


def test_plain_batch_size_wiring_takes_the_batched_path_across_workers(packed: Path) -> None:
    """DataLoader(dataset, batch_size=...) with torch's default collate and worker processes: the
    batch arrives as one channels-last NCHW tensor, the same pixels as the per-sample path."""
    from packer.transforms import CenterCrop

    dataset = PackedDataset(packed, decode=CenterCrop(12, resize=14))
    batches = list(torch.utils.data.DataLoader(dataset, batch_size=8, num_workers=2))
    assert [type(b) for b in batches] == [list] * 4  # what default_collate returns for tuples
    images = torch.cat([b[0] for b in batches])
    assert all(b[0].is_contiguous(memory_format=torch.channels_last) for b in batches)
    assert torch.equal(images, torch.stack([dataset[i][0] for i in range(len(dataset))]))
    assert torch.cat([b[1] for b in batches]).tolist() == dataset.labels.tolist()


def _shm_inode(images: torch.Tensor) -> int:
    """The shared-memory object behind a batch received from a worker (its inode)."""
    import os

    fd, _ = images.untyped_storage()._share_fd_cpu_()
    return os.fstat(fd).st_ino


def test_workers_reuse_batch_memory_only_after_the_main_process_lets_go(packed: Path) -> None:
    """Forked workers write a batch into a pooled shared-memory storage again only once every tensor
    of the batch that used it is gone here: held batches keep their pixels, dropped ones are reused."""
    import pickle

    from packer.torch.runtime import BatchPool
    from packer.transforms import CenterCrop

    dataset = PackedDataset(packed, decode=CenterCrop(12, resize=14))
    expected = torch.stack([dataset[i][0] for i in range(len(dataset))])
    order = [list(range(k, k + 2)) for k in range(0, len(dataset) - 1, 2)] * 3  # 45 batches of 2
    held = []
    for images, labels in DataLoader(dataset, batch_sampler=order, num_workers=1, collate_fn=collate):
        held.append((images, labels))
    assert len({_shm_inode(images) for images, _ in held}) == len(order)  # all held: none reused
    for batch, (images, labels) in zip(order, held):  # and none overwritten
        assert torch.equal(images, expected[batch]) and labels.tolist() == dataset.labels[batch].tolist()
    del held, images, labels  # the first loader's slots go back with the next batch received
    inodes, seen = set(), 0
    for images, labels in DataLoader(dataset, batch_sampler=order, num_workers=1, collate_fn=collate):
        assert torch.equal(images, expected[order[seen]]) and labels.tolist() == dataset.labels[order[seen]].tolist()
        inodes.add(_shm_inode(images))
        seen += 1
        del images, labels  # let go: its storage goes back to the worker
    assert seen == len(order) and len(inodes) <= BatchPool.SLOTS + 2  # reused, not one per batch
    assert pickle.loads(pickle.dumps(dataset._pool)).flags is None  # spawned workers: no sharing, no pool


def test_map_style_with_torch_distributed_sampler(packed: Path) -> None:
    identify = _Identify(packed)
    dataset = PackedDataset(packed, decode=False)
    world = 4  # 30 samples: DistributedSampler pads to 32
    ranks = []
    for rank in range(world):
        sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=1)
        sampler.set_epoch(2)
        loader = _loader(dataset, sampler=sampler, batch_size=3, collate_fn=collate)
        ranks.append([identify(images) for images, _ in loader])
    assert len({len(batches) for batches in ranks}) == 1
    seen = Counter(i for batches in ranks for batch in batches for i in batch)
    assert set(seen) == set(range(N)) and sum(seen.values()) == 32


@pytest.mark.parametrize("order", ["block", "random"])
def test_iterable_splits_ranks_and_workers_and_follows_set_epoch(packed: Path, order: str) -> None:
    identify = _Identify(packed)
    world = 2
    epochs = []
    for epoch in range(2):
        ranks = []
        for rank in range(world):
            dataset = PackedIterableDataset(packed, batch_size=4, order=order, seed=3, rank=rank, world_size=world,
                                            decode=False, block_bytes=2048, window=2)
            dataset.set_epoch(epoch)
            plan = dataset.plan()
            got = [identify(images) for images, _ in _loader(dataset, batch_size=None)]
            assert got == [plan.batch(k).tolist() for k in range(plan.num_batches)]  # loader order = rank order
            ranks.append(got)
        assert len({len(b) for b in ranks}) == 1
        seen = [i for batches in ranks for batch in batches for i in batch]
        assert sorted(seen) == list(range(N))
        epochs.append(ranks)
    assert epochs[0] != epochs[1]


def test_iterable_set_epoch_reaches_persistent_workers(packed: Path) -> None:
    identify = _Identify(packed)
    dataset = PackedIterableDataset(packed, batch_size=5, order="random", seed=4, decode=False)
    loader = _loader(dataset, batch_size=None, num_workers=3)
    orders = []
    for epoch in range(3):
        dataset.set_epoch(epoch)
        got = [i for images, _ in loader for i in identify(images)]
        assert got == dataset.read_order.epoch_order(N, epoch).tolist()
        orders.append(got)
    assert len({tuple(o) for o in orders}) == 3


@pytest.mark.parametrize("order", ["block", "random", "sequential"])
def test_resume_mid_epoch_with_other_workers_and_ranks(packed: Path, order: str) -> None:
    """Consume part of an epoch on 2 ranks x 2 workers, resume on 3 ranks x 1 and 3 workers."""
    identify = _Identify(packed)
    kwargs = dict(order=order, seed=11, decode=False, block_bytes=2048, window=2)
    consumed_samples = []
    states = []
    for rank in range(2):
        dataset = PackedIterableDataset(packed, batch_size=3, rank=rank, world_size=2, **kwargs)
        dataset.set_epoch(1)
        steps = 0
        for images, _ in _loader(dataset, batch_size=None):
            consumed_samples += identify(images)
            steps += 1
            if steps == 2:
                break
        states.append(dataset.state_dict(batches_consumed=steps))
    assert states[0] == states[1] and states[0]["consumed"] == 12

    rest = []
    counts = []
    for rank, workers in zip(range(3), (1, 3, 3)):
        dataset = PackedIterableDataset(packed, batch_size=2, rank=rank, world_size=3, **kwargs)
        dataset.load_state_dict(states[0])
        dataset.set_epoch(1)  # the loaded epoch: the position is kept
        got = [identify(images) for images, _ in _loader(dataset, batch_size=None, num_workers=workers)]
        counts.append(len(got))
        rest += [i for batch in got for i in batch]
    assert len(set(counts)) == 1
    assert sorted(consumed_samples + rest) == list(range(N))  # 18 left = 3 x 6: exactly the rest, none twice


def test_batch_sampler_resume_with_other_world_size(packed: Path) -> None:
    identify = _Identify(packed)
    dataset = PackedDataset(packed, decode=False)
    kwargs = dict(order="block", seed=2, block_bytes=2048, window=2)
    seen = []
    for rank in range(3):
        sampler = PackedBatchSampler(dataset, batch_size=2, rank=rank, world_size=3, **kwargs)
        loader = _loader(dataset, batch_sampler=sampler, collate_fn=collate)
        for step, (images, _) in enumerate(loader, 1):
            seen += identify(images)
            if step == 3:
                break
        state = sampler.state_dict(batches_consumed=3)
    assert state["consumed"] == 18
    rest = []
    for rank in range(2):
        sampler = PackedBatchSampler(dataset, batch_size=4, rank=rank, world_size=2, **kwargs)
        sampler.load_state_dict(state)
        rest += [i for images, _ in _loader(dataset, batch_sampler=sampler, collate_fn=collate, num_workers=1)
                 for i in identify(images)]
    assert sorted(seen + rest) == list(range(N))


def test_spawned_workers_get_the_dataset_by_pickle_and_follow_set_epoch(packed: Path) -> None:
    identify = _Identify(packed)
    dataset = PackedIterableDataset(packed, batch_size=4, order="random", seed=6, decode=False)
    loader = _loader(dataset, batch_size=None, num_workers=1, multiprocessing_context="spawn")
    for epoch in (0, 5):
        dataset.set_epoch(epoch)
        got = [i for images, _ in loader for i in identify(images)]
        assert got == dataset.read_order.epoch_order(N, epoch).tolist()
    mapped = PackedDataset(packed)
    sampler = PackedBatchSampler(mapped, batch_size=7, order="sequential")
    images, labels = next(iter(_loader(mapped, batch_sampler=sampler, collate_fn=collate, num_workers=1,
                                       multiprocessing_context="spawn")))
    assert images.shape == (7, 3, 16, 16) and labels.tolist() == mapped.labels[:7].tolist()


# --- memory ---------------------------------------------------------------------------------------

def _own_memory_after_trim() -> int:
    """This process's private anonymous memory after glibc hands its free heap back.

    Why trim: the worker computes its share of the epoch from a full int64 permutation and frees
    it; at 100k samples those temporaries (under glibc's 32 MiB mmap ceiling) land on the brk
    heap, and whether the freed heap is returned depends on what small object was allocated above
    it: the same run measured 16.7 or 18.4 MiB. What the worker *keeps* is the claim; malloc_trim
    makes the measurement of it repeatable.
    """
    import ctypes

    import bench_memory

    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return bench_memory.worker_memory(os.getpid())["own"]


class _MeasuringIterable(torch.utils.data.IterableDataset):
    """Yields the wrapped dataset's batches, then one ``("own memory", bytes)`` taken in the worker."""

    def __init__(self, dataset, samples: int) -> None:
        self.dataset, self.samples = dataset, samples

    def __iter__(self):
        seen = 0
        for images, labels in self.dataset:
            yield images, labels
            seen += len(images)
            if seen >= self.samples:
                break
        yield "own memory", _own_memory_after_trim()


class _MeasuringMap(torch.utils.data.Dataset):
    """The wrapped map-style dataset; index -1 is the worker's own memory, taken in the worker."""

    def __init__(self, dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        return ("own memory", _own_memory_after_trim()) if index == -1 else self.dataset[index]


def _collate_or_measurement(batch):
    return batch[0] if batch[0][0] == "own memory" else collate(batch)


def _worker_own_memory(dataset, *, iterable: bool, samples: int = 96) -> int:
    if iterable:
        loader = DataLoader(_MeasuringIterable(dataset, samples), batch_size=None, num_workers=1)
    else:
        rng = np.random.default_rng(0)
        order = rng.choice(len(dataset), samples, replace=False).tolist()
        batches = [order[i:i + 16] for i in range(0, samples, 16)] + [[-1]]
        loader = DataLoader(_MeasuringMap(dataset), batch_sampler=batches, num_workers=1,
                            collate_fn=_collate_or_measurement)
    measured = [own for tag, own in loader if isinstance(tag, str)]
    assert len(measured) == 1, measured
    return measured[0]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/<pid>/smaps")
@pytest.mark.measures_memory
def test_worker_memory_and_pickles_stay_flat(tmp_path: Path) -> None:
    import bench_memory

    payload = bench_memory.tiny_jpeg()
    small = bench_memory.make_synthetic_dataset(tmp_path / "small", 1000, payload)
    large = bench_memory.make_synthetic_dataset(tmp_path / "large", 100_000, payload)
    sizes = [len(pickle.dumps(PackedDataset(path))) for path in (small, large)]
    assert max(sizes) < 64 << 10 and abs(sizes[1] - sizes[0]) < 256  # manifest-sized, not sample-sized
    mib = 1 << 20
    own_small = _worker_own_memory(PackedDataset(small), iterable=False)
    own_large = _worker_own_memory(PackedDataset(large), iterable=False)
    print(f"worker own memory: 1k {own_small / mib:.1f} MiB, 100k {own_large / mib:.1f} MiB")
    assert own_large - own_small < 3 * mib, (own_small / mib, own_large / mib)
    # The iterable worker keeps its int32 share of the epoch order: 400 KB for 100k samples.
    it_small = _worker_own_memory(PackedIterableDataset(small, batch_size=16, order="random"), iterable=True)
    it_large = _worker_own_memory(PackedIterableDataset(large, batch_size=16, order="random"), iterable=True)
    print(f"iterable worker own memory: 1k {it_small / mib:.1f} MiB, 100k {it_large / mib:.1f} MiB")
    assert it_large - it_small < 4 * mib, (it_small / mib, it_large / mib)
