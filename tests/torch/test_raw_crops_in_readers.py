"""The batched raw crop in every reader: the iterable dataset and the GPU loader (on CPU tensors)
draw the map-style path's crops, as a function of (seed, epoch, index), across ranks, workers,
threads and resumes."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

from packer.writer import build  # noqa: E402
from packer.writer.plan import BuildOptions  # noqa: E402
from packer.errors import OptionError  # noqa: E402
from packer.gpu import GpuRawBatches  # noqa: E402
from packer.order import ReadOrder  # noqa: E402
from packer.rawcrop import AGREEMENT_MAX_ABS, AGREEMENT_MEAN_ABS, raw_shape_of, read_raw_batch  # noqa: E402
from packer.threaded import ThreadedLoader  # noqa: E402
from packer.torch import PackedDataset, PackedIterableDataset, collate  # noqa: E402
from packer.transforms import CenterCrop, RandomResizedCrop  # noqa: E402

N = 30


@pytest.fixture(scope="module")
def raw(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import make_sample

    root = tmp_path_factory.mktemp("rawcrop-readers") / "src"
    make_sample.make_image_folder(root, classes=3, per_class=N // 3, seed=21, min_size=24, max_size=60,
                                  formats=("png", "jpeg"))
    out = root.parent / "raw"
    build(root, out, BuildOptions(codec="raw:size=20x24", shard_size=12 << 10, alignment=512), workers=1,
          progress=False)
    return out


def _expected_crops(raw: Path, make, epoch: int, kernel: str = "auto") -> torch.Tensor:
    """Every sample's crop in ``epoch``, by index: ``transform.batch`` over the whole dataset."""
    transform = make()
    transform.set_epoch(epoch)
    dataset = PackedDataset(raw).dataset
    pixels = read_raw_batch(dataset, np.arange(N), raw_shape_of(dataset))
    return transform.batch(pixels, np.arange(N), kernel=kernel)


def _assert_agree(got: torch.Tensor, want: torch.Tensor, limit: int = AGREEMENT_MAX_ABS) -> None:
    diff = (got.int() - want.int()).abs()
    assert diff.max().item() <= limit and diff.float().mean().item() <= AGREEMENT_MEAN_ABS


# --- the GPU loader, host side (device="cpu" runs torch's kernel, the one CUDA runs) ---------

def _rrc() -> RandomResizedCrop:
    return RandomResizedCrop(12, scale=(0.2, 1.0), seed=7)


@pytest.mark.parametrize("order", ["block", "random"])
@pytest.mark.parametrize("double_buffer", [True, False])
def test_gpu_raw_batches_crop_like_the_cpu_readers(raw: Path, order: str, double_buffer: bool) -> None:
    torch_crops = _expected_crops(raw, _rrc, epoch=2, kernel="torch")
    cpu_crops = _expected_crops(raw, _rrc, epoch=2)  # the compiled kernel where it is built
    reference = PackedDataset(raw, decode=_rrc(), layout="HWC")
    reference._pipeline.decode.set_epoch(2)
    with GpuRawBatches(raw, 7, order=order, seed=3, device="cpu", double_buffer=double_buffer,
                       block_bytes=2048, decode=_rrc()) as loader:
        loader.set_epoch(2)  # the transform follows the loader's epoch
        plan = loader.plan()
        seen = []
        for k, (images, labels) in enumerate(loader):
            indices = loader.batch_indices(plan, k, 2)
            assert images.shape == (len(indices), 12, 12, 3) and images.dtype == torch.uint8
            assert torch.equal(images, torch_crops[indices])  # the same draws, the same kernel
            _assert_agree(images, cpu_crops[indices], limit=1)
            map_images, map_labels = reference.load_batch(indices)  # PackedDataset's batched path
            _assert_agree(images, map_images, limit=1)
            assert torch.equal(labels, map_labels)
            seen += indices.tolist()
        assert sorted(seen) == list(range(N))
        assert loader.decode.epoch == 2


def test_gpu_raw_batches_center_crop_and_per_sample_agreement(raw: Path) -> None:
    with GpuRawBatches(raw, 8, order="sequential", device="cpu", decode=CenterCrop(16, resize=18)) as loader:
        images = torch.cat([batch for batch, _ in loader])
    per_sample = PackedDataset(raw, decode=CenterCrop(16, resize=18), layout="HWC")
    _assert_agree(images, torch.stack([per_sample[i][0] for i in range(N)]))


def test_gpu_raw_crops_depend_on_the_sample_not_on_rank_or_resume(raw: Path) -> None:
    expected = _expected_crops(raw, _rrc, epoch=1, kernel="torch")
    crops: dict[int, list[torch.Tensor]] = {}
    for world_size in (1, 3):
        for rank in range(world_size):
            with GpuRawBatches(raw, 4, order="random", seed=5, rank=rank, world_size=world_size, device="cpu",
                               decode=_rrc()) as loader:
                loader.set_epoch(1)
                plan = loader.plan()
                for k, (images, _) in enumerate(loader):
                    for i, image in zip(loader.batch_indices(plan, k, 1).tolist(), images):
                        crops.setdefault(i, []).append(image)
    assert sorted(crops) == list(range(N))
    assert all(torch.equal(image, expected[i]) for i, seen in crops.items() for image in seen)
    with GpuRawBatches(raw, 4, order="random", seed=5, device="cpu", decode=_rrc()) as loader:
        loader.set_epoch(1)
        iterator = iter(loader)
        for _ in range(3):
            next(iterator)
        state = loader.state_dict()
        iterator.close()
    with GpuRawBatches(raw, 6, order="random", seed=5, device="cpu", decode=_rrc()) as resumed:
        resumed.load_state_dict(state)
        plan = resumed.plan()
        rest = []
        for k, (images, _) in enumerate(resumed):
            indices = resumed.batch_indices(plan, k, 1)
            assert torch.equal(images, expected[indices])
            rest += indices.tolist()
    assert len(rest) == N - 12


def test_gpu_raw_batches_refuse_a_decode_that_is_not_a_crop(raw: Path) -> None:
    with pytest.raises(OptionError, match="decode must be None or a packer.transforms crop"):
        GpuRawBatches(raw, 4, device="cpu", decode=lambda data, fmt: data)


# --- the iterable dataset ----------------------------------------------------------------------

def _no_per_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    from packer import torch as packer_torch

    def refuse(*args, **kwargs):
        raise AssertionError("the per-sample path ran on a raw dataset")

    monkeypatch.setattr(packer_torch.pipeline._Pipeline, "pixels", refuse)


@pytest.mark.parametrize("order", ["sequential", "random"])
def test_iterable_raw_crops_are_the_map_style_batches(raw: Path, order: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    transform = _rrc()
    transform.set_epoch(1)
    dataset = PackedIterableDataset(raw, batch_size=8, order=order, seed=2, decode=transform, layout="HWC")
    dataset.set_epoch(1)
    reference = PackedDataset(raw, decode=transform, layout="HWC")
    plan = ReadOrder(kind=order, seed=2, batch_size=8).plan(N, epoch=1)
    expected = _expected_crops(raw, _rrc, epoch=1)
    _no_per_sample(monkeypatch)  # a whole batch is one gather and one crop
    batches = list(dataset)
    assert len(batches) == plan.num_batches
    for k, (images, labels) in enumerate(batches):
        indices = plan.batch(k)
        want_images, want_labels = reference.load_batch(indices)
        assert torch.equal(images, want_images) and torch.equal(labels, want_labels)
        assert torch.equal(images, expected[indices])
    single = PackedIterableDataset(raw, batch_size=8, order=order, seed=2, decode=transform, layout="HWC",
                                   batched=False, read_ahead=False)
    single.set_epoch(1)
    samples = list(single)
    assert len(samples) == N and all(torch.equal(image, expected[i])
                                     for (image, _), i in zip(samples, plan.indices.tolist()))


def test_iterable_raw_crops_agree_with_the_per_sample_path(raw: Path) -> None:
    transform = _rrc()
    images, _ = next(iter(PackedIterableDataset(raw, batch_size=N, order="sequential", decode=transform,
                                                layout="HWC")))
    per_sample = PackedDataset(raw, decode=transform, layout="HWC")
    _assert_agree(images, torch.stack([per_sample[i][0] for i in range(N)]))


@pytest.mark.parametrize("layout", ["HWC", "CHW"])
def test_iterable_raw_pixels_without_a_crop_are_one_gather(raw: Path, layout: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    reference = PackedDataset(raw, layout=layout)
    dataset = PackedIterableDataset(raw, batch_size=7, order="random", seed=1, layout=layout)
    plan = ReadOrder(kind="random", seed=1, batch_size=7).plan(N, epoch=0)
    _no_per_sample(monkeypatch)
    for k, (images, labels) in enumerate(dataset):
        want_images, want_labels = collate(reference.__getitems__(plan.batch(k)))
        memory = torch.contiguous_format if layout == "HWC" else torch.channels_last  # CHW: a view of NHWC memory
        assert images.is_contiguous(memory_format=memory)
        assert torch.equal(images, want_images) and torch.equal(labels, want_labels)


@pytest.mark.filterwarnings("ignore:This DataLoader will create.*:UserWarning")
def test_iterable_raw_crops_in_workers_across_ranks_and_epochs(raw: Path) -> None:
    transform = _rrc()
    crops: dict[int, list[torch.Tensor]] = {}
    datasets = [PackedIterableDataset(raw, batch_size=4, order="random", seed=8, rank=rank, world_size=2,
                                      decode=transform, layout="HWC") for rank in range(2)]
    loaders = [DataLoader(d, batch_size=None, num_workers=2, persistent_workers=True) for d in datasets]
    for epoch in (0, 1):
        transform.set_epoch(epoch)  # reaches the persistent workers through shared memory
        expected = _expected_crops(raw, _rrc, epoch)
        crops.clear()
        for rank, (dataset, loader) in enumerate(zip(datasets, loaders)):
            dataset.set_epoch(epoch)
            plan = ReadOrder(kind="random", seed=8, batch_size=4).plan(N, epoch=epoch, rank=rank, world_size=2)
            batches = list(loader)
            assert len(batches) == plan.num_batches == math.ceil(N / 8)
            for k, (images, _) in enumerate(batches):
                for i, image in zip(plan.batch(k).tolist(), images):
                    crops.setdefault(i, []).append(image)
        assert sorted(crops) == list(range(N))
        assert all(torch.equal(image, expected[i]) for i, seen in crops.items() for image in seen)


def test_iterable_raw_crops_resume_exactly(raw: Path) -> None:
    transform = _rrc()
    expected = _expected_crops(raw, _rrc, epoch=0)
    dataset = PackedIterableDataset(raw, batch_size=6, order="random", seed=4, decode=transform, layout="HWC")
    plan = ReadOrder(kind="random", seed=4, batch_size=6).plan(N, epoch=0)
    iterator = iter(dataset)
    for _ in range(2):
        next(iterator)
    state = dataset.state_dict(batches_consumed=2)
    resumed = PackedIterableDataset(raw, batch_size=4, order="random", seed=4, decode=transform, layout="HWC")
    resumed.load_state_dict(state)
    rest = torch.cat([images for images, _ in resumed])
    assert torch.equal(rest, expected[plan.indices[12:]])


# --- every reader, one crop per (seed, epoch, index) --------------------------------------------

def test_every_reader_draws_the_same_crop_for_a_sample(raw: Path) -> None:
    expected = _expected_crops(raw, _rrc, epoch=3)
    found: dict[str, dict[int, torch.Tensor]] = {}

    def record(name: str, indices: np.ndarray, images: torch.Tensor) -> None:
        found.setdefault(name, {}).update(zip(indices.tolist(), images))

    threaded = ThreadedLoader(raw, batch_size=5, order="random", seed=1, threads=2, decode=_rrc())
    threaded.set_epoch(3)
    plan = threaded.plan()
    for k, (images, _) in enumerate(threaded):
        record("threaded", plan.batch(k), images)
    transform = _rrc()
    transform.set_epoch(3)
    iterable = PackedIterableDataset(raw, batch_size=5, order="random", seed=1, decode=transform, layout="HWC")
    iterable.set_epoch(3)
    for k, (images, _) in enumerate(iterable):
        record("iterable", ReadOrder(kind="random", seed=1, batch_size=5).plan(N, epoch=3).batch(k), images)
    with GpuRawBatches(raw, 5, order="random", seed=1, device="cpu", decode=_rrc()) as gpu_loader:
        gpu_loader.set_epoch(3)
        gpu_plan = gpu_loader.plan()
        for k, (images, _) in enumerate(gpu_loader):
            record("gpu (torch kernel)", gpu_loader.batch_indices(gpu_plan, k, 3), images)
    for name, crops in found.items():
        assert sorted(crops) == list(range(N)), name
        got = torch.stack([crops[i] for i in range(N)])
        if name.startswith("gpu"):
            _assert_agree(got, expected, limit=1)
        else:
            assert torch.equal(got, expected), name


# --- batches written into a tensor the caller allocated (ThreadedLoader's main-thread buffers) ----

def test_load_batch_writes_into_a_given_tensor_of_the_fast_path_shape(raw: Path) -> None:
    crop = PackedDataset(raw, decode=_rrc(), layout="HWC")
    assert crop.fast_batch_shape(5) == (5, 12, 12, 3)
    assert PackedDataset(raw, layout="HWC").fast_batch_shape(5) == (5, 20, 24, 3)
    assert PackedDataset(raw, layout="CHW").fast_batch_shape(5) == (5, 3, 20, 24)
    assert PackedDataset(raw, decode=_rrc(), layout="CHW").fast_batch_shape(5) == (5, 3, 12, 12)  # batched too
    assert PackedDataset(raw, decode=False).fast_batch_shape(5) is None
    assert PackedDataset(raw, decode=_rrc(), transform=lambda t: t).fast_batch_shape(5) is None  # per sample
    indices = [4, 0, 29, 4, 11]
    expected, labels = crop.load_batch(indices)
    out = torch.zeros((5, 12, 12, 3), dtype=torch.uint8)
    images, same_labels = crop.load_batch(indices, out=out)
    assert images is out and torch.equal(out, expected) and torch.equal(labels, same_labels)
    wrong = torch.zeros((5, 12, 13, 3), dtype=torch.uint8)
    images, _ = crop.load_batch(indices, out=wrong)
    assert images is not wrong and torch.equal(images, expected) and not wrong.any()
    # CHW: the buffer is the channels-last view fast_batch_buffer makes; a contiguous NCHW one is not it
    chw = PackedDataset(raw, decode=_rrc(), layout="CHW")
    buffer = chw.fast_batch_buffer(5)
    assert buffer.shape == (5, 3, 12, 12) and buffer.is_contiguous(memory_format=torch.channels_last)
    images, _ = chw.load_batch(indices, out=buffer)
    assert images.data_ptr() == buffer.data_ptr() and torch.equal(images, expected.permute(0, 3, 1, 2))
    contiguous = torch.zeros((5, 3, 12, 12), dtype=torch.uint8)
    images, _ = chw.load_batch(indices, out=contiguous)
    assert images.data_ptr() != contiguous.data_ptr() and torch.equal(images, expected.permute(0, 3, 1, 2))


def test_threaded_loader_batches_are_fresh_tensors_of_the_fast_path(raw: Path) -> None:
    loader = ThreadedLoader(raw, batch_size=6, order="sequential", threads=2, decode=_rrc())
    batches = [images for images, _ in loader]
    expected = _expected_crops(raw, _rrc, epoch=0)
    assert torch.equal(torch.cat(batches), expected)
    pointers = {batch.data_ptr() for batch in batches}
    assert len(pointers) == len(batches)  # every batch its own memory: the loop may keep them all


def test_gpu_raw_crops_with_fields_keep_index_and_refuse_array_fields(tmp_path: Path) -> None:
    import json

    from PIL import Image

    src = tmp_path / "src"
    src.mkdir()
    rows = []
    for i in range(12):
        Image.fromarray(np.full((16, 16, 3), i * 9, np.uint8)).save(src / f"{i}.png")
        rows.append({"path": f"{i}.png", "score": i / 4})
    (src / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), "utf-8")
    out = tmp_path / "raw"
    build(src / "rows.jsonl", out, BuildOptions(fields=("score=float32",), codec="raw:size=16x16"), workers=1,
          progress=False)
    crop = RandomResizedCrop(8, seed=2)
    with GpuRawBatches(out, 4, device="cpu", order="random", fields=("image", "index"), decode=crop) as loader:
        dataset = PackedDataset(out, decode=RandomResizedCrop(8, seed=2), layout="HWC")
        for batch in loader:
            expected, _ = dataset.load_batch(batch["index"].numpy())
            _assert_agree(batch["image"], expected, limit=1)
    with pytest.raises(OptionError, match="crops the pixels but not the array fields"):
        GpuRawBatches(out, 4, device="cpu", fields=("image", "score"), decode=crop)


# --- set_epoch on the sampler (or the iterable, or the loader) moves the seeded crops too ----------

def test_the_samplers_epoch_moves_the_datasets_seeded_crops(raw: Path) -> None:
    """The DistributedSampler habit: a loop that calls only sampler.set_epoch(epoch) must not
    train every epoch on epoch 0's crops; with 2 persistent workers the epoch reaches them."""
    from packer.torch import PackedBatchSampler, PackedSampler

    dataset = PackedDataset(raw, decode=_rrc(), layout="HWC")
    sampler = PackedBatchSampler(dataset, batch_size=N, order="sequential")
    loader = DataLoader(dataset, batch_sampler=sampler, num_workers=2, persistent_workers=True, collate_fn=collate)
    seen = []
    for epoch in (0, 1, 2):
        sampler.set_epoch(epoch)
        assert dataset._pipeline.decode.epoch == epoch
        images = torch.cat([images for images, _ in loader])
        _assert_agree(images, _expected_crops(raw, _rrc, epoch))
        seen.append(images)
    assert not torch.equal(seen[0], seen[1]) and not torch.equal(seen[1], seen[2])
    plain = PackedSampler(dataset)
    plain.set_epoch(5)
    assert dataset._pipeline.decode.epoch == 5
    unseeded = PackedDataset(raw, decode=RandomResizedCrop(12))
    PackedSampler(unseeded).set_epoch(3)  # nothing to follow: draws come from the process RNG
    assert unseeded._pipeline.decode.epoch == 0


def test_the_iterables_epoch_moves_its_seeded_crops(raw: Path) -> None:
    iterable = PackedIterableDataset(raw, batch_size=N, order="sequential", decode=_rrc(), layout="HWC")
    iterable.set_epoch(4)
    assert iterable._pipeline.decode.epoch == 4
    images = torch.cat([images for images, _ in DataLoader(iterable, batch_size=None)])
    _assert_agree(images, _expected_crops(raw, _rrc, 4))


@pytest.mark.filterwarnings("ignore:This DataLoader will create.*:UserWarning")
@pytest.mark.parametrize("reader", ["map", "map, batch_size=", "iterable"])
def test_worker_batches_arrive_as_one_storage_of_images_and_labels(raw: Path, reader: str) -> None:
    """Images and labels of a raw batch share one shared-memory storage (one file descriptor per
    batch); the main process gets plain tuples/lists holding the same values as in-process."""
    if reader == "iterable":
        dataset = PackedIterableDataset(raw, batch_size=6, order="sequential", decode=_rrc())
        loader = DataLoader(dataset, batch_size=None, num_workers=1)
        expected = list(PackedIterableDataset(raw, batch_size=6, order="sequential", decode=_rrc()))
    else:
        dataset = PackedDataset(raw, decode=_rrc())
        order = [list(range(k, min(k + 6, N))) for k in range(0, N, 6)]
        loader = (DataLoader(dataset, batch_sampler=order, num_workers=1, collate_fn=collate) if reader == "map"
                  else DataLoader(dataset, batch_size=6, num_workers=1))
        expected = [collate(dataset.__getitems__(batch)) for batch in order]
    batches = list(loader)
    assert len(batches) == len(expected) == 5
    for (images, labels), (want_images, want_labels) in zip(batches, expected):
        assert torch.equal(images, want_images) and torch.equal(labels, want_labels)
        assert images.shape == (6, 3, 12, 12) and images.is_contiguous(memory_format=torch.channels_last)
        assert images.untyped_storage().data_ptr() == labels.untyped_storage().data_ptr()
    assert type(batches[0]) is (list if reader == "map, batch_size=" else tuple)
