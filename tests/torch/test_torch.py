"""PyTorch readers in one process: decoding, layouts, labels, batched reads, samplers, state, pickling."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from packer.writer import build  # noqa: E402
from packer.decode import decode_image  # noqa: E402
from packer.errors import SampleIndexError, SampleIndexTypeError  # noqa: E402
from packer.writer.plan import BuildOptions  # noqa: E402
from packer.torch import PackedBatchSampler, PackedDataset, PackedIterableDataset, PackedSampler, collate, resolve_rank


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import make_sample

    root = tmp_path_factory.mktemp("torch-src") / "src"
    make_sample.make_image_folder(root, classes=3, per_class=7, seed=3, min_size=12, max_size=20,
                                  formats=("jpeg", "png", "png-rgba", "jpeg-gray", "webp", "png-palette"))
    return root


@pytest.fixture(scope="module")
def packed(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("torch-ds") / "ds"
    build(source, out, BuildOptions(shard_size=8 << 10, alignment=512), workers=1, progress=False)
    return out


@pytest.fixture(scope="module")
def same_size(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every image 16x16: batches stack into one tensor."""
    import make_sample

    root = tmp_path_factory.mktemp("torch-same") / "src"
    make_sample.make_image_folder(root, classes=2, per_class=10, seed=4, min_size=16, max_size=16,
                                  formats=("jpeg", "png"))
    out = root.parent / "ds"
    build(root, out, BuildOptions(shard_size=4 << 10, alignment=512), workers=1, progress=False)
    return out


def test_import_packer_does_not_import_torch(packed: Path) -> None:
    code = (f"import sys, packer, packer.order; d = packer.open_dataset({str(packed)!r}); d.read_batch([0, 1]); "
            f"sys.exit(10 + ('torch' in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 10


@pytest.mark.parametrize("layout", ["CHW", "HWC"])
def test_decoded_images_and_labels_match_the_source(packed: Path, source: Path, layout: str) -> None:
    ds = PackedDataset(packed, layout=layout)
    assert len(ds) == 21
    for i in range(len(ds)):
        image, label = ds[i]
        key = ds.dataset.key(i)
        expected = decode_image((source / key).read_bytes())
        assert image.dtype == torch.uint8 and image.is_contiguous()
        if layout == "CHW":
            assert image.shape == (3, *expected.shape[:2])
            assert torch.equal(image.permute(1, 2, 0), torch.from_numpy(expected))
        else:
            assert torch.equal(image, torch.from_numpy(expected))
        assert isinstance(label, int) and ds.classes[label] == key.split("/")[0]


def test_raw_bytes_and_numpy_indices(packed: Path, source: Path) -> None:
    ds = PackedDataset(packed, decode=False)
    for i in (0, np.int64(5), -1):
        payload, label = ds[i]
        assert payload.dtype == torch.uint8 and payload.dim() == 1
        assert payload.numpy().tobytes() == (source / ds.dataset.key(int(i) % len(ds))).read_bytes()
    with pytest.raises(SampleIndexError, match=f"^sample {len(ds)} out of range for a dataset of {len(ds)} samples$"):
        ds[len(ds)]
    with pytest.raises(SampleIndexTypeError, match="^sample indices must be integers, got NoneType: None$"):
        ds[None]
    assert payload.numpy().tobytes() == ds[torch.tensor(len(ds) - 1)][0].numpy().tobytes()  # a 0-d tensor
    # int() would read sample 3 for '3' and sample 2 for 2.7: a key or a float is a caller's mistake
    for wrong in ("3", 2.7, np.float64(1.0)):
        with pytest.raises(SampleIndexTypeError, match=f"^sample indices must be integers, got {type(wrong).__name__}"):
            ds[wrong]


@pytest.mark.parametrize("decode", [True, False])
def test_getitems_equals_getitem(packed: Path, decode: bool) -> None:
    ds = PackedDataset(packed, decode=decode)
    indices = [5, 4, 3, 3, 20, 0, -2, 11]
    batch = ds.__getitems__(indices)
    assert len(batch) == len(indices)
    for (image, label), i in zip(batch, indices):
        one_image, one_label = ds[i]
        assert torch.equal(image, one_image) and label == one_label


def test_decode_callable_transform_and_target_transform(packed: Path) -> None:
    calls = []

    def center_crop_decode(data, image_format):  # the shape of a fused decode+crop
        calls.append(image_format)
        return decode_image(data, image_format)[:8, :8]

    ds = PackedDataset(packed, decode=center_crop_decode, transform=lambda t: t.float() / 255,
                       target_transform=lambda y: y + 100)
    image, label = ds[3]
    assert image.shape == (3, 8, 8) and image.dtype == torch.float32 and float(image.max()) <= 1.0
    assert label >= 100 and calls == [int(ds.dataset.index.image_format[3])]
    images, labels = collate(ds.__getitems__([0, 1, 2]))
    assert images.shape == (3, 3, 8, 8) and labels.tolist() == [int(x) + 100 for x in ds.labels[:3]]


def test_raw_codec_is_reshaped_not_decoded(source: Path, tmp_path: Path) -> None:
    try:
        build(source, tmp_path / "raw", BuildOptions(codec="raw:size=6x10", shard_size=8 << 10), workers=1,
              progress=False)
    except Exception as exc:  # noqa: BLE001 - the raw codec belongs to another module
        pytest.skip(f"raw codec unavailable: {exc}")
    chw = PackedDataset(tmp_path / "raw")
    hwc = PackedDataset(tmp_path / "raw", layout="HWC")
    image, _ = chw[2]
    assert image.shape == (3, 6, 10)
    stored = np.frombuffer(chw.dataset.read(2), dtype=np.uint8).reshape(6, 10, 3)
    assert torch.equal(hwc[2][0], torch.from_numpy(stored.copy()))
    assert torch.equal(image, torch.from_numpy(stored.copy()).permute(2, 0, 1))


def test_decode_errors_name_the_sample(packed: Path, tmp_path: Path) -> None:
    import shutil

    from packer.errors import DecodeError

    copy = tmp_path / "ds"
    shutil.copytree(packed, copy)
    ds = PackedDataset(copy)
    victim = 4
    ix = ds.dataset.index
    shard_path = copy / ds.dataset.manifest.shards[int(ix.shard[victim])].path
    with open(shard_path, "r+b") as handle:  # same size, garbage bytes: only decoding can notice
        handle.seek(int(ix.offset[victim]))
        handle.write(b"\x00" * int(ix.size[victim]))
    ds = PackedDataset(copy)
    with pytest.raises(DecodeError) as caught:
        ds[victim]
    assert caught.value.sample == victim and ds.dataset.key(victim) in str(caught.value)
    with pytest.raises(DecodeError):
        ds.__getitems__([victim - 1, victim])
    assert ds[victim - 1][0].dim() == 3


def test_collate_stacks_same_sizes_and_lists_different_ones(packed: Path, same_size: Path) -> None:
    images, labels = collate(PackedDataset(same_size).__getitems__([0, 1, 2, 3]))
    assert isinstance(images, torch.Tensor) and images.shape == (4, 3, 16, 16) and labels.dtype == torch.int64
    mixed = PackedDataset(packed).__getitems__(list(range(6)))
    images, labels = collate(mixed)
    assert isinstance(images, list) and [t.shape for t in images] == [s[0].shape for s in mixed]
    assert labels.tolist() == [s[1] for s in mixed]


def test_pickles_small_without_per_sample_state(packed: Path) -> None:
    ds = PackedDataset(packed)
    blob = pickle.dumps(ds)
    assert len(blob) < 64 << 10
    copy = pickle.loads(blob)
    assert len(copy) == len(ds) and torch.equal(copy[4][0], ds[4][0])
    iterable = PackedIterableDataset(packed, batch_size=4, order="block")
    list(iterable)  # fills per-process caches, which must not travel
    assert len(pickle.dumps(iterable)) < 64 << 10


def test_rejects_bad_options(packed: Path) -> None:
    with pytest.raises(ValueError, match="layout"):
        PackedDataset(packed, layout="NCHW")
    with pytest.raises(ValueError, match="decode"):
        PackedDataset(packed, decode="yes")
    with pytest.raises(ValueError, match="order"):
        PackedSampler(10, order="shuffle")


def test_resolve_rank_without_process_group() -> None:
    assert resolve_rank() == (0, 1)
    assert resolve_rank(2, 4) == (2, 4)
    with pytest.raises(ValueError, match="both"):
        resolve_rank(rank=1)
    with pytest.raises(ValueError, match="rank"):
        resolve_rank(4, 4)


def test_sampler_with_batch_size_one_strides_like_distributed_sampler() -> None:
    shares = [list(PackedSampler(10, order="random", seed=3, rank=r, world_size=4)) for r in range(4)]
    assert [len(s) for s in shares] == [3] * 4 and len(PackedSampler(10, rank=0, world_size=4)) == 3
    union = sorted(i for s in shares for i in s)
    assert set(union) == set(range(10)) and len(union) == 12  # padded with 2 repeats
    order = [i for step in zip(*shares) for i in step]
    assert sorted(order[:10]) == list(range(10))  # step-major: the global order's prefix


def test_sampler_epochs_and_state(packed: Path) -> None:
    sampler = PackedSampler(PackedDataset(packed), order="block", seed=1, block_bytes=2048, window=2)
    first = list(sampler)
    assert sorted(first) == list(range(21)) and first == list(sampler)  # same epoch, same order
    sampler.set_epoch(1)
    second = list(sampler)
    assert sorted(second) == list(range(21)) and second != first
    state = sampler.state_dict(samples_consumed=5)
    assert state["epoch"] == 1 and state["consumed"] == 5 and state["order"] == "block"
    resumed = PackedSampler(PackedDataset(packed), order="block", seed=1, block_bytes=2048, window=2,
                            rank=1, world_size=2)
    resumed.load_state_dict(state)
    resumed.set_epoch(1)  # the loaded epoch: keeps the position
    assert resumed.start == 5 and len(resumed) == 8
    resumed.set_epoch(2)
    assert resumed.start == 0
    with pytest.raises(ValueError, match="seed"):
        PackedSampler(PackedDataset(packed), order="block", seed=2, block_bytes=2048, window=2).load_state_dict(state)


def test_sampler_default_state_counts_what_it_handed_out() -> None:
    sampler = PackedBatchSampler(30, batch_size=4, order="random", seed=0, rank=0, world_size=2)
    batches = iter(sampler)
    next(batches), next(batches)
    assert sampler.state_dict()["consumed"] == 16
    list(batches)
    assert sampler.state_dict()["consumed"] == 30


@pytest.mark.parametrize("backend", ["mmap", "pread"])
def test_iterable_in_process_yields_the_rank_plan(same_size: Path, backend: str) -> None:
    ds = PackedIterableDataset(same_size, batch_size=3, order="block", seed=2, rank=1, world_size=2,
                               block_bytes=1024, window=2, backend=backend)
    plan = ds.plan()
    batches = list(ds)
    assert len(batches) == len(ds) == plan.num_batches
    for k, (images, labels) in enumerate(batches):
        expected = plan.batch(k)
        assert images.shape == (len(expected), 3, 16, 16)
        assert labels.tolist() == ds.dataset.labels[expected].tolist()
        reference = PackedDataset(same_size).__getitems__(expected.tolist())
        assert torch.equal(images, torch.stack([r[0] for r in reference]))
    assert ds.state_dict()["consumed"] == 20  # handed out everything: the epoch is done
    samples = list(PackedIterableDataset(same_size, batch_size=3, order="sequential", batched=False, layout="HWC"))
    assert len(samples) == 20 and samples[0][0].shape == (16, 16, 3) and isinstance(samples[0][1], int)


def _indices_of(dataset, images) -> list[int]:
    """Sample indices of a batch of raw payloads (decode=False), identified by their bytes."""
    by_payload = {dataset.read(i): i for i in range(len(dataset))}
    return [by_payload[t.numpy().tobytes()] for t in images]


def test_iterable_resume_in_process(same_size: Path) -> None:
    ds = PackedIterableDataset(same_size, batch_size=2, order="random", seed=9, decode=False)
    ds.set_epoch(3)
    it = iter(ds)
    first = [i for _ in range(4) for i in _indices_of(ds.dataset, next(it)[0])]
    state = ds.state_dict(batches_consumed=4)
    assert state["consumed"] == 8 and state["epoch"] == 3
    other = PackedIterableDataset(same_size, batch_size=3, order="random", seed=9, decode=False)
    other.load_state_dict(state)
    rest = [i for images, _ in other for i in _indices_of(other.dataset, images)]
    assert sorted(first + rest) == list(range(20))
    assert first + rest == ds.read_order.epoch_order(20, 3).tolist()  # one rank: exactly the epoch order


def test_block_read_ahead_asks_for_whole_blocks(same_size: Path) -> None:
    from packer.order import index_blocks

    ds = PackedIterableDataset(same_size, batch_size=4, order="block", seed=1, block_bytes=2048, window=2)
    calls: list[tuple[int, int, int]] = []
    real_shard = ds.dataset.shard

    class Spy:
        def __init__(self, number: int) -> None:
            self.number, self.backend = number, real_shard(number)

        def advise_willneed(self, offset: int, size: int) -> None:
            calls.append((self.number, offset, size))
            self.backend.advise_willneed(offset, size)  # the real hint must accept these ranges

        def __getattr__(self, name: str):
            return getattr(self.backend, name)

    ds.dataset.shard = Spy  # type: ignore[method-assign]
    batches = list(ds)
    ix = ds.dataset.index
    bounds = index_blocks(ix.offset, ix.size, ix.shard, 2048)
    expected = {(int(ix.shard[bounds[j]]), int(ix.offset[bounds[j]]),
                 int(ix.offset[bounds[j + 1] - 1] + ix.size[bounds[j + 1] - 1] - ix.offset[bounds[j]]))
                for j in range(len(bounds) - 1)}
    assert len(bounds) > 3 and set(calls) == expected and len(calls) == len(expected)  # each block once, whole
    assert sum(len(labels) for _, labels in batches) == 20


def test_getitems_checks_range_and_never_aliases_repeated_samples(tmp_path) -> None:
    from PIL import Image

    from packer.writer import build
    from packer.writer.plan import BuildOptions
    from packer.torch import PackedDataset

    rng = np.random.default_rng(0)
    for c in ("a", "b"):
        (tmp_path / "src" / c).mkdir(parents=True)
        for k in range(3):
            Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(tmp_path / "src" / c / f"{k}.png")
    build(tmp_path / "src", tmp_path / "ds", BuildOptions(), workers=1, progress=False)
    outside = r"^batch holds index -7, outside -6\.\.5 \(a dataset of 6 samples\)$"
    for decode in (True, False):
        ds = PackedDataset(tmp_path / "ds", decode=decode)
        with pytest.raises(SampleIndexError, match=outside):
            ds.__getitems__([0, -7])
        with pytest.raises(SampleIndexError, match=outside):  # dict samples (fields=) check the same way
            PackedDataset(tmp_path / "ds", decode=decode, fields=("index", "label")).__getitems__([0, -7])
        assert torch.equal(ds.__getitems__([-1])[0][0], ds[5][0])
        first, second, _ = ds.__getitems__([3, 3, 4])
        before = second[0].clone()
        first[0].view(-1)[:4].add_(7)
        assert torch.equal(second[0], before)
