"""packer.threaded.ThreadedLoader: order, ranks, resume, threads and errors, on raw and encoded datasets."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from packer.writer import build  # noqa: E402
from packer.writer.plan import BuildOptions  # noqa: E402
from packer.order import ReadOrder  # noqa: E402
from packer.errors import OptionError  # noqa: E402
from packer.threaded import ThreadedLoader  # noqa: E402
from packer.torch import PackedDataset, collate  # noqa: E402
from packer.transforms import RandomResizedCrop  # noqa: E402

N = 45


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import make_sample

    root = tmp_path_factory.mktemp("threaded") / "src"
    make_sample.make_image_folder(root, classes=3, per_class=N // 3, seed=8, min_size=20, max_size=40,
                                  formats=("png", "jpeg"))
    built = {}
    for name, codec in (("raw", "raw:size=24x24"), ("encoded", "passthrough")):
        out = root.parent / name
        build(root, out, BuildOptions(codec=codec, shard_size=16 << 10, alignment=512), workers=1, progress=False)
        built[name] = out
    return built


class _Identify:
    """Maps raw pixels back to the sample index (every test image is distinct)."""

    def __init__(self, path: Path) -> None:
        dataset = PackedDataset(path).dataset
        self.by_bytes = {dataset.read(i): i for i in range(len(dataset))}
        assert len(self.by_bytes) == len(dataset)

    def __call__(self, images: torch.Tensor) -> list[int]:
        return [self.by_bytes[image.numpy().tobytes()] for image in images]


@pytest.mark.parametrize("order", ["sequential", "random", "block"])
def test_batches_follow_packer_order_for_any_thread_count(datasets: dict, order: str) -> None:
    identify = _Identify(datasets["raw"])
    loaders = [ThreadedLoader(datasets["raw"], batch_size=8, order=order, seed=3, threads=threads,
                              block_bytes=4096) for threads in (1, 3)]
    blocks = None
    if order == "block":
        from packer.order import index_blocks
        ix = loaders[0].dataset.dataset.index
        blocks = index_blocks(ix.offset, ix.size, ix.shard, 4096)
    plan = ReadOrder(kind=order, seed=3, batch_size=8, block_bytes=4096).plan(N, epoch=2, blocks=blocks)
    for loader in loaders:
        loader.set_epoch(2)
        batches = [(identify(images), labels.tolist()) for images, labels in loader]
        assert len(batches) == len(loader) == plan.num_batches
        for k, (indices, labels) in enumerate(batches):
            assert indices == plan.batch(k).tolist()
            assert labels == [int(loader.dataset.labels[i]) for i in indices]


def test_ranks_share_the_epoch_like_the_samplers(datasets: dict) -> None:
    identify = _Identify(datasets["raw"])
    seen = Counter()
    counts = []
    for rank in range(2):
        loader = ThreadedLoader(datasets["raw"], batch_size=4, seed=1, rank=rank, world_size=2)
        batches = [identify(images) for images, _ in loader]
        counts.append(len(batches))
        seen.update(i for batch in batches for i in batch)
    assert counts[0] == counts[1]
    assert set(seen) == set(range(N)) and sum(seen.values()) == N + 1  # 45 padded to 46 for 2 ranks


@pytest.mark.parametrize("threads,new_threads,new_batch", [(2, 1, 5), (1, 3, 8)])
def test_resume_sees_the_rest_of_the_epoch_exactly_once(datasets: dict, threads: int, new_threads: int,
                                                        new_batch: int) -> None:
    identify = _Identify(datasets["raw"])
    loader = ThreadedLoader(datasets["raw"], batch_size=6, seed=9, threads=threads, prefetch=4)
    loader.set_epoch(1)
    first = []
    for step, (images, _) in enumerate(loader, 1):
        first.extend(identify(images))
        if step == 3:
            state = loader.state_dict()  # exact without batches_consumed: nothing handed out early
            break
    assert state["consumed"] == 18 and state["epoch"] == 1
    resumed = ThreadedLoader(datasets["raw"], batch_size=new_batch, seed=9, threads=new_threads)
    resumed.load_state_dict(state)
    resumed.set_epoch(1)  # keeps the loaded position
    rest = [i for images, _ in resumed for i in identify(images)]
    assert sorted(first + rest) == list(range(N))
    assert resumed.state_dict()["consumed"] == N
    with pytest.raises(ValueError, match="seed"):
        ThreadedLoader(datasets["raw"], batch_size=6, seed=10).load_state_dict(state)


def test_seeded_crops_are_identical_across_threads_and_equal_the_dataset_path(datasets: dict) -> None:
    def run(threads: int, epoch: int) -> list[torch.Tensor]:
        loader = ThreadedLoader(datasets["raw"], batch_size=7, seed=2, threads=threads,
                                decode=RandomResizedCrop(16, seed=5))
        loader.set_epoch(epoch)
        return [images for images, _ in loader]

    one, four = run(1, 0), run(4, 0)
    assert all(torch.equal(a, b) for a, b in zip(one, four)) and len(one) == len(four) == 7
    assert one[0].shape == (7, 16, 16, 3)
    assert not all(torch.equal(a, b) for a, b in zip(one, run(2, 1)))  # epochs differ
    transform = RandomResizedCrop(16, seed=5)
    dataset = PackedDataset(datasets["raw"], decode=transform, layout="HWC")
    plan = ReadOrder(kind="random", seed=2, batch_size=7).plan(N, epoch=0)
    assert torch.equal(one[2], collate(dataset.__getitems__(plan.batch(2)))[0])


def test_encoded_datasets_and_transforms_go_through_the_same_loader(datasets: dict) -> None:
    loader = ThreadedLoader(datasets["encoded"], batch_size=10, decode=RandomResizedCrop(12, seed=0),
                            threads=2)
    shapes = [tuple(images.shape) for images, _ in loader]
    assert shapes == [(10, 12, 12, 3)] * 4 + [(5, 12, 12, 3)]
    plain = ThreadedLoader(datasets["encoded"], batch_size=10, order="sequential")
    images, labels = next(iter(plain))
    assert isinstance(images, list) and len(images) == 10  # sizes differ: a list, as collate does
    assert labels.dtype == torch.int64


def test_errors_surface_in_order_and_an_early_stop_does_not_hang(datasets: dict) -> None:
    def bad_label(label: int) -> int:
        raise RuntimeError("label transform failed")

    loader = ThreadedLoader(datasets["raw"], batch_size=5, target_transform=bad_label)
    with pytest.raises(RuntimeError, match="label transform failed"):
        next(iter(loader))
    for _ in ThreadedLoader(datasets["raw"], batch_size=1, threads=3, prefetch=8):
        break
    for bad in ({"threads": 0}, {"prefetch": 0}, {"threads": True}):
        with pytest.raises(OptionError, match=r"^(threads|prefetch) must be a positive integer, got (0|True)$"):
            ThreadedLoader(datasets["raw"], batch_size=5, **bad)
    with pytest.raises(ValueError, match="epoch"):
        ThreadedLoader(datasets["raw"], batch_size=5).set_epoch(-1)


def test_seeded_crops_depend_on_the_sample_not_on_the_rank(datasets: dict) -> None:
    from packer.rawcrop import raw_shape_of, read_raw_batch

    reference = RandomResizedCrop(12, seed=4)
    reference.set_epoch(3)
    crops = {}
    for world_size in (1, 3):
        for rank in range(world_size):
            loader = ThreadedLoader(datasets["raw"], batch_size=4, seed=6, rank=rank, world_size=world_size,
                                    decode=RandomResizedCrop(12, seed=4), threads=2)
            loader.set_epoch(3)
            plan = ReadOrder(kind="random", seed=6, batch_size=4).plan(N, epoch=3, rank=rank,
                                                                       world_size=world_size)
            for k, (images, _) in enumerate(loader):
                for i, image in zip(plan.batch(k).tolist(), images):
                    crops.setdefault(i, []).append(image)
    dataset = loader.dataset.dataset
    pixels = read_raw_batch(dataset, np.arange(N), raw_shape_of(dataset))
    expected = reference.batch(pixels, np.arange(N))
    assert sorted(crops) == list(range(N))
    for i, seen in crops.items():
        assert all(torch.equal(image, expected[i]) for image in seen)
