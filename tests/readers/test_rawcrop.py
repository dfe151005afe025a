"""Crop and resize of raw pixels: per-sample and batched paths, seeded draws, DataLoader workers."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

from packer.writer import build  # noqa: E402
from packer.writer.plan import BuildOptions  # noqa: E402
from packer.errors import DecodeError, OptionError, SampleIndexError  # noqa: E402
from packer.format import ImageFormat  # noqa: E402
from packer.rawcrop import (AGREEMENT_MAX_ABS, AGREEMENT_MEAN_ABS, RRC_DRAWS,  # noqa: E402
                            compiled_kernel_available, crop_resize_batch, random_resized_crop_boxes, raw_shape_of, read_raw_batch,
                            sample_uniforms)
from packer.torch import PackedBatchSampler, PackedDataset, collate  # noqa: E402
from packer.transforms import CenterCrop, RandomResizedCrop, random_resized_crop_params  # noqa: E402

N = 40


@pytest.fixture(scope="module")
def raw_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import make_sample

    root = tmp_path_factory.mktemp("rawcrop") / "src"
    make_sample.make_image_folder(root, classes=4, per_class=N // 4, seed=3, min_size=30, max_size=70,
                                  formats=("png", "jpeg"))
    out = root.parent / "raw"
    build(root, out, BuildOptions(codec="raw:size=36x40", shard_size=40 << 10, alignment=512, shuffle=False),
          workers=1, progress=False)
    return out


def _noise(count: int, height: int, width: int, seed: int = 0) -> np.ndarray:
    """Smooth random images (a random walk along rows): like photos, unlike white noise."""
    rng = np.random.default_rng(seed)
    steps = rng.integers(-12, 13, size=(count, height, width, 3))
    return np.clip(128 + np.cumsum(steps, axis=2) // 2, 0, 255).astype(np.uint8)


# --- seeded draws ---

def test_sample_uniforms_depend_only_on_seed_epoch_index() -> None:
    indices = np.array([5, 0, 17, 1_000_000_007, 5])
    draws = sample_uniforms(3, 2, indices, RRC_DRAWS)
    assert draws.shape == (5, RRC_DRAWS) and draws.min() >= 0 and draws.max() < 1
    np.testing.assert_array_equal(draws[0], draws[4])  # the same index, anywhere in a batch
    np.testing.assert_array_equal(draws[2], sample_uniforms(3, 2, [17], RRC_DRAWS)[0])
    assert not np.array_equal(draws, sample_uniforms(3, 3, indices, RRC_DRAWS))  # another epoch
    assert not np.array_equal(draws, sample_uniforms(4, 2, indices, RRC_DRAWS))  # another seed
    many = sample_uniforms(0, 0, np.arange(20_000), 4)
    assert abs(many.mean() - 0.5) < 0.01 and abs(np.corrcoef(many[:, 0], many[:, 1])[0, 1]) < 0.03
    with pytest.raises(OptionError, match="non-negative"):
        sample_uniforms(0, 0, [-1], 3)


class _ColumnRng:
    """A generator stand-in feeding ``random_resized_crop_params`` the batched rule's columns."""

    def __init__(self, row: np.ndarray) -> None:
        self.row, self.tries, self.placed = row, 0, 20

    def uniform(self, low: float, high: float) -> float:
        value = low + (high - low) * self.row[self.tries]
        self.tries += 1
        return value

    def integers(self, low: int, high: int) -> int:
        value = low + math.floor(self.row[self.placed] * (high - low))
        self.placed += 1
        return value


@pytest.mark.parametrize("width,height,scale", [(40, 36, (0.08, 1.0)), (200, 20, (0.5, 1.0)),
                                                (32, 32, (0.9, 1.0))])
def test_batched_boxes_follow_the_per_sample_rule(width: int, height: int, scale: tuple) -> None:
    draws = sample_uniforms(1, 0, np.arange(300), RRC_DRAWS)
    boxes, flips = random_resized_crop_boxes(draws, width, height, scale=scale)
    for row, box in zip(draws, boxes):
        top, left, h, w = random_resized_crop_params(width, height, _ColumnRng(row), scale=scale)
        assert tuple(box) == (left, top, left + w, top + h)
    assert 0.4 < flips.mean() < 0.6
    assert np.all(boxes[:, 2] <= width) and np.all(boxes[:, 3] <= height)


# --- the resample kernel ---

def test_identity_box_is_exact_and_flip_mirrors() -> None:
    images = _noise(4, 20, 24)
    boxes = np.tile([0.0, 0.0, 24.0, 20.0], (4, 1))
    out = crop_resize_batch(images, boxes, (20, 24)).numpy()
    np.testing.assert_array_equal(out, images)
    flipped = crop_resize_batch(images, boxes, (20, 24), flips=np.array([True, False, True, False])).numpy()
    np.testing.assert_array_equal(flipped[0], images[0, :, ::-1])
    np.testing.assert_array_equal(flipped[1], images[1])


def test_crop_resize_writes_into_a_strided_out_and_checks_shapes() -> None:
    images = _noise(3, 16, 16)
    boxes = np.array([[2.0, 3.0, 14.0, 15.0]] * 3)
    nchw = torch.empty((3, 3, 8, 8), dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
    crop_resize_batch(images, boxes, (8, 8), out=nchw.permute(0, 2, 3, 1))
    expected = crop_resize_batch(images, boxes, (8, 8))
    assert torch.equal(nchw.permute(0, 2, 3, 1), expected)
    with pytest.raises(OptionError, match="non-empty part"):
        crop_resize_batch(images, np.array([[0.0, 0.0, 17.0, 16.0]] * 3), (8, 8))
    with pytest.raises(OptionError, match="out must be"):
        crop_resize_batch(images, boxes, (8, 8), out=torch.empty((3, 8, 9, 3), dtype=torch.uint8))


needs_kernel = pytest.mark.skipif(not compiled_kernel_available(), reason="packer._rawresample not built")


def test_compiled_kernel_is_built_where_required() -> None:
    """CI (PACKER_REQUIRE_EXTENSION=1) must test the compiled kernel, not only the fallback."""
    if os.environ.get("PACKER_REQUIRE_EXTENSION") != "1":
        pytest.skip("PACKER_REQUIRE_EXTENSION is not set")
    assert compiled_kernel_available()


@needs_kernel
@pytest.mark.parametrize("source,size,clip", [((32, 32), (32, 32), True), ((64, 48), (32, 32), True),
                                              ((160, 160), (96, 80), True), ((36, 40), (24, 24), False)])
def test_compiled_and_torch_kernels_agree(source: tuple, size: tuple, clip: bool) -> None:
    images = _noise(40, *source, seed=4)
    draws = sample_uniforms(0, 1, np.arange(40), RRC_DRAWS)
    boxes, flips = random_resized_crop_boxes(draws, source[1], source[0])
    if not clip:
        boxes = boxes + np.array([0.3, 0.6, -0.2, -0.1])  # fractional, like CenterCrop's
    compiled = crop_resize_batch(images, boxes, size, flips=flips, clip_to_box=clip, kernel="c")
    reference = crop_resize_batch(images, boxes, size, flips=flips, clip_to_box=clip, kernel="torch")
    diff = (compiled.int() - reference.int()).abs()
    assert diff.max().item() <= 1 and diff.float().mean().item() < 0.01  # float sums, rounding ties
    channels_last = torch.empty((40, 3, *size), dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
    crop_resize_batch(images, boxes, size, flips=flips, clip_to_box=clip, kernel="c",
                      out=channels_last.permute(0, 2, 3, 1))
    assert torch.equal(channels_last.permute(0, 2, 3, 1), compiled)
    read_only = images.copy()
    read_only.flags.writeable = False
    assert torch.equal(crop_resize_batch(read_only, boxes, size, flips=flips, clip_to_box=clip), compiled)


@needs_kernel
def test_compiled_kernel_checks_its_arguments() -> None:
    from packer import _rawresample

    src = np.zeros((1, 4, 4, 3), np.uint8)
    out = np.zeros((1, 2, 2, 3), np.uint8)
    box = np.array([[0.0, 0.0, 4.0, 4.0]])
    _rawresample.crop_resize(src, out, box, np.zeros(1, np.uint8), True, 1, 4, 4, 3, 2, 2)
    with pytest.raises(ValueError, match="non-empty part"):
        _rawresample.crop_resize(src, out, box + 1, np.zeros(1, np.uint8), True, 1, 4, 4, 3, 2, 2)
    with pytest.raises(ValueError, match="does not match"):
        _rawresample.crop_resize(src, out, box, np.zeros(1, np.uint8), True, 1, 4, 5, 3, 2, 2)
    with pytest.raises(ValueError, match="does not match"):
        _rawresample.crop_resize(src, out, box, np.zeros(2, np.uint8), True, 1, 4, 4, 3, 2, 2)
    with pytest.raises(OptionError, match="kernel must be"):
        crop_resize_batch(src, np.array([[0.0, 0.0, 4.0, 4.0]]), (2, 2), kernel="numba")


@needs_kernel
@pytest.mark.parametrize("source,size,clip", [((32, 32), (32, 32), True), ((17, 45), (9, 31), True),
                                              ((64, 48), (32, 32), False), ((5, 3), (40, 44), True)])
def test_compiled_rgb_pass_gives_the_bytes_of_the_any_channel_pass(source: tuple, size: tuple, clip: bool) -> None:
    """The RGB path (pixels widened to 4 lanes, SSE2 columns) and the generic path for any channel
    count do the same float sums term for term: an RGB image and the same image with a 4th channel
    give the same 3 channels, exactly."""
    images = _noise(24, *source, seed=9)
    boxes, flips = random_resized_crop_boxes(sample_uniforms(1, 0, np.arange(24), RRC_DRAWS), source[1], source[0])
    if not clip:
        boxes = boxes + np.array([0.25, 0.5, -0.25, -0.125]) * (boxes[:, 2:3] - boxes[:, 0:1] > 1)
    rgb = crop_resize_batch(images, boxes, size, flips=flips, clip_to_box=clip, kernel="c")
    four = np.concatenate([images, images[..., :1]], axis=3)
    generic = crop_resize_batch(four, boxes, size, flips=flips, clip_to_box=clip, kernel="c")
    assert torch.equal(rgb, generic[..., :3])


@needs_kernel
def test_compiled_gather_copies_rows_and_checks_every_position() -> None:
    from packer import _rawresample

    source = np.arange(1000, dtype=np.int64).astype(np.uint8)
    out = np.zeros((3, 10), dtype=np.uint8)
    _rawresample.gather(source, out, np.array([990, 0, 500], dtype=np.int64), None, 10)
    np.testing.assert_array_equal(out, np.stack([source[990:], source[:10], source[500:510]]))
    into = np.zeros((4, 10), dtype=np.uint8)
    _rawresample.gather(source, into, np.array([7, 20], dtype=np.int64), np.array([3, 1], dtype=np.int64), 10)
    np.testing.assert_array_equal(into[[3, 1]], np.stack([source[7:17], source[20:30]]))
    assert not into[[0, 2]].any()
    for positions, rows in (([991], None), ([-1], None), ([0], [4]), ([0], [-1])):
        target = out[:1] if rows is None else into
        row_array = None if rows is None else np.array(rows, dtype=np.int64)
        with pytest.raises(ValueError, match="outside its buffer"):
            _rawresample.gather(source, target, np.array(positions, dtype=np.int64), row_array, 10)
    with pytest.raises(ValueError, match="one row per position"):
        _rawresample.gather(source, out, np.array([0, 1], dtype=np.int64), None, 10)
    with pytest.raises(ValueError, match="differ in length"):
        _rawresample.gather(source, into, np.array([0, 1], dtype=np.int64), np.array([0], dtype=np.int64), 10)
    with pytest.raises(ValueError, match="sample size"):
        _rawresample.gather(source, out, np.array([0], dtype=np.int64), None, 7)


@needs_kernel
def test_compiled_crop_resize_reads_samples_in_place_at_offsets_and_checks_them() -> None:
    from packer import _rawresample

    images = _noise(3, 8, 6, seed=2)
    mapping = np.zeros(4096 * 3, dtype=np.uint8)  # samples at a 4 KiB stride, like a raw shard
    for k in range(3):
        mapping[4096 * k:4096 * k + images[k].size] = images[k].reshape(-1)
    boxes = np.array([[0, 0, 6, 8], [1, 2, 5, 7], [0.5, 1.0, 6.0, 8.0]], dtype=np.float64)
    flips = np.array([0, 1, 0], dtype=np.uint8)
    expected = np.zeros((3, 4, 4, 3), dtype=np.uint8)
    _rawresample.crop_resize(images, expected, boxes, flips, True, 3, 8, 6, 3, 4, 4)
    got = np.zeros_like(expected)
    offsets = np.array([8192, 0, 4096], dtype=np.int64)
    _rawresample.crop_resize(mapping, got, boxes[[2, 0, 1]], flips[[2, 0, 1]], True, 3, 8, 6, 3, 4, 4, offsets,
                             np.array([2, 0, 1], dtype=np.int64))
    np.testing.assert_array_equal(got, expected)
    for offsets, rows in (([4096 * 3 - 100], None), ([-1], None), ([0], [3]), ([0], [-1])):
        with pytest.raises(ValueError, match="outside its buffer"):
            _rawresample.crop_resize(mapping, np.zeros((3, 4, 4, 3), np.uint8)[:1 if rows is None else 3], boxes[:1],
                                     flips[:1], True, 1, 8, 6, 3, 4, 4, np.array(offsets, dtype=np.int64),
                                     None if rows is None else np.array(rows, dtype=np.int64))
    with pytest.raises(ValueError, match="does not match"):
        _rawresample.crop_resize(mapping, got, boxes, flips, True, 3, 8, 6, 3, 4, 4, np.zeros(2, np.int64))


@pytest.mark.parametrize("backend", ["mmap", "pread"])
def test_crop_resize_raw_equals_the_gather_then_the_batched_resample(raw_dataset: Path, backend: str) -> None:
    """In place from the shard mappings (one kernel call per shard, rows scattered back) or, on
    other backends, gathered first: the same bytes as read_raw_batch + crop_resize_batch."""
    from packer.dataset import open_dataset
    from packer.rawcrop import crop_resize_raw

    with open_dataset(raw_dataset, backend=backend) as dataset:
        shape = raw_shape_of(dataset)
        assert len(dataset.manifest.shards) > 2  # a batch's rows interleave between shards
        indices = np.array([5, 38, 0, 5, 12, 30, 1, 22], dtype=np.int64)
        boxes, flips = random_resized_crop_boxes(sample_uniforms(3, 0, indices, RRC_DRAWS), shape[1], shape[0])
        expected = crop_resize_batch(read_raw_batch(dataset, indices, shape), boxes, (12, 10), flips=flips)
        got = crop_resize_raw(dataset, indices, shape, boxes, flips, (12, 10))
        assert torch.equal(got, expected)
        out = torch.zeros((8, 3, 12, 10), dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
        crop_resize_raw(dataset, indices, shape, boxes, flips, (12, 10), out=out.permute(0, 2, 3, 1))
        assert torch.equal(out.permute(0, 2, 3, 1), expected)  # the channels-last storage of a CHW batch


def test_bad_crop_arguments_are_option_errors_that_say_what_was_expected(raw_dataset: Path) -> None:
    """Every refusal of the batched crop doors is an OptionError (still a ValueError) naming what came."""
    from packer.dataset import open_dataset
    from packer.rawcrop import crop_resize_raw

    images = _noise(2, 16, 16)
    box = np.array([[0.0, 0.0, 8.0, 8.0]])
    cases = [
        (lambda: random_resized_crop_boxes(np.zeros((3, 2)), 16, 16),
         f"need an (N, {RRC_DRAWS}) array of draws, got shape (3, 2)"),
        (lambda: crop_resize_batch(images[0], box, (4, 4)),
         "images must be an (N, H, W, C) uint8 batch, got (16, 16, 3) torch.uint8"),
        (lambda: crop_resize_batch(images.astype(np.float32), box, (4, 4)),
         "images must be an (N, H, W, C) uint8 batch, got (2, 16, 16, 3) torch.float32"),
        (lambda: crop_resize_batch(images, box, (4, 4)), "need one box per image: 2 images, got 1 boxes"),
        (lambda: sample_uniforms(-1, 0, [0], 3),
         "seed, epoch, count and indices must be non-negative, got seed=-1, epoch=0, count=3, min index=0"),
    ]
    with open_dataset(raw_dataset) as dataset:
        shape = raw_shape_of(dataset)
        height, width = shape[0], shape[1]
        cases.append((lambda: crop_resize_raw(dataset, [0, 1], shape, box, None, (4, 4)),
                      "need one box per image: 2 images, got 1 boxes"))
        if compiled_kernel_available():  # in place: the kernel's refusal, with crop_resize_batch's words
            outside = np.array([[0.0, 0.0, width + 1.0, height]])
            cases.append((lambda: crop_resize_raw(dataset, [0], shape, outside, None, (4, 4)),
                          f"every box must be a non-empty part of the {width}x{height} image ("))
        for call, message in cases:
            with pytest.raises(OptionError) as caught:
                call()
            assert isinstance(caught.value, ValueError) and caught.value.message.startswith(message), caught.value


def test_raw_gather_without_the_compiled_kernel_gives_the_same_batch(raw_dataset: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from packer import rawcrop

    dataset = PackedDataset(raw_dataset).dataset
    shape = raw_shape_of(dataset)
    indices = np.array([N - 1, 0, 7, 7, 21, 3, 22, 8])
    compiled = read_raw_batch(dataset, indices, shape)
    monkeypatch.setattr(rawcrop, "_compiled_gather", lambda: None)
    np.testing.assert_array_equal(read_raw_batch(dataset, indices, shape), compiled)
    strided = np.zeros((len(indices), shape[0], shape[1] + 2, 3), dtype=np.uint8)[:, :, :shape[1]]
    np.testing.assert_array_equal(read_raw_batch(dataset, indices, shape, out=strided), compiled)


@pytest.mark.parametrize("backend", ["torch", "pil"])
@pytest.mark.parametrize("make,source", [
    (lambda b: RandomResizedCrop(32, seed=7, resize_backend=b), (32, 32)),      # CIFAR-like
    (lambda b: RandomResizedCrop(32, seed=8, resize_backend=b), (64, 64)),      # a downscale
    (lambda b: RandomResizedCrop((20, 28), seed=9, resize_backend=b), (48, 40)),
    (lambda b: RandomResizedCrop(96, seed=1, resize_backend=b), (160, 160)),   # the gather kernel
    (lambda b: CenterCrop(24, resize=28, resize_backend=b), (36, 40)),
    (lambda b: CenterCrop(28, resize=32, resize_backend=b), (64, 48)),
])
def test_batched_pixels_agree_with_the_per_sample_path(make, source: tuple, backend: str) -> None:
    transform = make(backend)
    images = _noise(48, *source, seed=source[0])
    indices = np.arange(100, 148)
    single = np.stack([transform(images[k], ImageFormat.RAW, index=int(i)) for k, i in enumerate(indices)])
    # torch's ops run on a CPU tensor here exactly as on a CUDA one (a strided view, like a shard's)
    padded = torch.zeros((48, source[0], source[1] + 3, 3), dtype=torch.uint8)
    padded[:, :, :source[1]] = torch.from_numpy(images)
    inputs = {"torch": padded[:, :, :source[1]]}
    if compiled_kernel_available():
        inputs["c"] = images
    for kernel, pixels in inputs.items():
        batched = transform.batch(pixels, indices, kernel=kernel).numpy().astype(int)
        diff = np.abs(batched - single.astype(int))
        assert diff.max() <= AGREEMENT_MAX_ABS, (kernel, diff.max())
        assert diff.mean() <= AGREEMENT_MEAN_ABS, (kernel, diff.mean())


def test_seeded_batch_is_a_function_of_seed_epoch_and_index() -> None:
    transform = RandomResizedCrop(16, seed=2)
    images = _noise(6, 24, 24)
    forward = transform.batch(images, [10, 11, 12, 13, 14, 15]).numpy()
    backward = transform.batch(images[::-1].copy(), [15, 14, 13, 12, 11, 10]).numpy()
    np.testing.assert_array_equal(forward, backward[::-1])
    transform.set_epoch(1)
    assert not np.array_equal(forward, transform.batch(images, [10, 11, 12, 13, 14, 15]).numpy())
    transform.set_epoch(0)
    np.testing.assert_array_equal(forward, transform.batch(images, [10, 11, 12, 13, 14, 15]).numpy())
    with pytest.raises(OptionError, match="pass indices"):
        transform.batch(images)


def test_raw_bytes_without_shape_are_refused_with_a_reason() -> None:
    with pytest.raises(DecodeError, match="carries no shape"):
        RandomResizedCrop(8)(bytes(300), ImageFormat.RAW)
    with pytest.raises(DecodeError, match=r"\(H, W, 3\) uint8"):
        RandomResizedCrop(8)(np.zeros((4, 4, 3), dtype=np.float32), ImageFormat.RAW)
    with pytest.raises(OptionError, match="seed must be"):
        RandomResizedCrop(8, seed=-1)


# --- through PackedDataset ---

def test_raw_dataset_gather_is_the_same_on_every_backend(raw_dataset: Path) -> None:
    mmap = PackedDataset(raw_dataset, layout="HWC").dataset
    shape = raw_shape_of(mmap)
    assert shape == (36, 40, 3) and len(mmap.manifest.shards) > 2
    indices = np.array([N - 1, 0, 7, 7, 21, 3])
    expected = np.stack([np.frombuffer(mmap.get(int(i)), np.uint8).reshape(shape) for i in indices])
    np.testing.assert_array_equal(read_raw_batch(mmap, indices, shape), expected)
    for options in ({"backend": "pread"}, {"verify_checksums": True}):
        other = PackedDataset(raw_dataset, **options).dataset
        np.testing.assert_array_equal(read_raw_batch(other, indices, shape), expected)


@pytest.mark.parametrize("make", [lambda: RandomResizedCrop(24, seed=5), lambda: CenterCrop(24, resize=28)])
def test_packed_dataset_batches_match_its_per_sample_items(raw_dataset: Path, make) -> None:
    dataset = PackedDataset(raw_dataset, decode=make(), layout="HWC")
    indices = [3, 17, 0, 39, 22, 17]
    images, labels = collate(dataset.__getitems__(indices))
    assert images.shape == (6, 24, 24, 3) and images.dtype == torch.uint8
    assert labels.tolist() == [int(dataset.labels[i]) for i in indices]
    single = torch.stack([dataset[i][0] for i in indices])
    diff = (images.int() - single.int()).abs()
    assert diff.max().item() <= AGREEMENT_MAX_ABS and diff.float().mean().item() <= AGREEMENT_MEAN_ABS
    assert torch.equal(images[1], images[5])  # the same index: the same crop in the same epoch
    chw = PackedDataset(raw_dataset, decode=make(), layout="CHW")[3][0]  # the per-sample layout path
    assert chw.shape == (3, 24, 24) and torch.equal(chw.permute(1, 2, 0), single[0])


@pytest.mark.filterwarnings("ignore:This DataLoader will create.*:UserWarning")
def test_dataloader_workers_draw_the_same_crops_as_the_main_process(raw_dataset: Path) -> None:
    transform = RandomResizedCrop(20, seed=11)
    dataset = PackedDataset(raw_dataset, decode=transform, layout="HWC")
    sampler = PackedBatchSampler(dataset, batch_size=8, order="random", seed=4)
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=collate, num_workers=2,
                        persistent_workers=True)
    reference = PackedDataset(raw_dataset, decode=RandomResizedCrop(20, seed=11), layout="HWC")
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        transform.set_epoch(epoch)  # reaches the persistent workers through shared memory
        reference_transform = RandomResizedCrop(20, seed=11)
        reference_transform.set_epoch(epoch)
        reference = PackedDataset(raw_dataset, decode=reference_transform, layout="HWC")
        got = list(loader)
        expected = [collate(reference.__getitems__(batch)) for batch in sampler]
        assert len(got) == len(expected) == math.ceil(N / 8)
        for (images, labels), (want_images, want_labels) in zip(got, expected):
            assert torch.equal(images, want_images) and torch.equal(labels, want_labels)
    epoch0 = collate(reference.__getitems__(list(range(8))))[0]
    reference_transform.set_epoch(0)
    assert not torch.equal(epoch0, collate(reference.__getitems__(list(range(8))))[0])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU with CUDA")
def test_crop_resize_on_cuda_matches_cpu() -> None:
    transform = RandomResizedCrop(32, seed=3)
    images = _noise(64, 48, 48)
    cpu = transform.batch(images, np.arange(64))
    cuda = transform.batch(torch.from_numpy(images).cuda(), np.arange(64))
    assert cuda.is_cuda
    assert (cuda.cpu().int() - cpu.int()).abs().max().item() <= 1  # float rounding may differ


@pytest.mark.parametrize("source,size", [((64, 64), (32, 32)), ((48, 64), (32, 32)), ((64, 64), (24, 40))])
def test_raw_build_to_a_smaller_size_is_one_lanczos_resample(tmp_path: Path, source: tuple,
                                                            size: tuple) -> None:
    """``--codec raw --size`` below the source: Pillow's Lanczos resize of the centred box, once."""
    from PIL import Image

    (tmp_path / "src" / "a").mkdir(parents=True)
    pixels = _noise(3, *source, seed=1)
    for k, image in enumerate(pixels):
        Image.fromarray(image).save(tmp_path / "src" / "a" / f"{k}.png")
    out = tmp_path / "raw"
    build(tmp_path / "src", out, BuildOptions(codec=f"raw:size={size[0]}x{size[1]}", shuffle=False),
          workers=1, progress=False)
    dataset = PackedDataset(out, layout="HWC")
    height, width = source
    scale = max(size[1] / width, size[0] / height)
    box_w, box_h = size[1] / scale, size[0] / scale
    box = ((width - box_w) / 2, (height - box_h) / 2, (width + box_w) / 2, (height + box_h) / 2)
    for k in range(3):
        key = dataset.dataset.key(k)
        expected = np.asarray(Image.fromarray(pixels[int(Path(key).stem)]).resize(
            (size[1], size[0]), Image.Resampling.LANCZOS, box=box))
        np.testing.assert_array_equal(dataset[k][0].numpy(), expected)


@pytest.mark.parametrize("layout", ["HWC", "CHW"])
@pytest.mark.parametrize("backend", ["mmap", "pread"])
def test_raw_batches_without_a_transform_are_one_gather_equal_to_the_items(raw_dataset: Path, layout: str,
                                                                         backend: str) -> None:
    dataset = PackedDataset(raw_dataset, layout=layout, backend=backend)
    indices = [5, 38, 0, 5, 12]
    images, labels = collate(dataset.__getitems__(indices))
    # one gather into (N, H, W, C) memory; CHW is a view of it (channels-last strides)
    assert images.permute(0, 2, 3, 1).is_contiguous() if layout == "CHW" else images.is_contiguous()
    assert images.shape == ((5, 36, 40, 3) if layout == "HWC" else (5, 3, 36, 40))
    assert torch.equal(images, torch.stack([dataset[i][0] for i in indices]))
    assert labels.tolist() == [int(dataset.labels[i]) for i in indices]


def test_raw_gather_does_not_copy_the_whole_shard(raw_dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The gather reads only the batch's samples: numpy.take on the strided shard view would copy
    every sample of the shard first (found at 50 k samples: 60 ms per batch)."""
    dataset = PackedDataset(raw_dataset).dataset
    calls = []
    original = np.take
    monkeypatch.setattr(np, "take", lambda *a, **k: calls.append(a) or original(*a, **k))
    read_raw_batch(dataset, [1, 2, 3], raw_shape_of(dataset))
    assert calls == []


@pytest.mark.parametrize("options", [{"decode": "rrc"}, {"decode": True}, {"decode": True, "layout": "CHW"},
                                     {"decode": "rrc", "target_transform": lambda label: label * 10}])
def test_load_batch_equals_collated_getitems(raw_dataset: Path, options: dict) -> None:
    options = dict(options)
    if options["decode"] == "rrc":
        options["decode"] = RandomResizedCrop(16, seed=1)
    options.setdefault("layout", "HWC")
    dataset = PackedDataset(raw_dataset, **options)
    indices = [9, 0, 33, 9]
    images, labels = dataset.load_batch(indices)
    want_images, want_labels = collate(dataset.__getitems__(indices))
    assert torch.equal(images, want_images) and torch.equal(labels, want_labels)
    assert labels.dtype == torch.int64
    with pytest.raises(SampleIndexError, match="outside"):
        dataset.load_batch([N])


def test_large_raw_samples_are_gathered_one_copy_each(tmp_path: Path) -> None:
    """150x150x3 = 67,500 bytes per sample: the per-sample copy path, across two shards."""
    import make_sample

    make_sample.make_image_folder(tmp_path / "src", classes=2, per_class=4, seed=6, formats=("png",))
    build(tmp_path / "src", tmp_path / "raw", BuildOptions(codec="raw:size=150x150", shard_size=300 << 10,
                                                           shuffle=False), workers=1, progress=False)
    dataset = PackedDataset(tmp_path / "raw", layout="HWC").dataset
    assert len(dataset.manifest.shards) > 1
    indices = np.array([7, 0, 3, 3, 5])
    shape = raw_shape_of(dataset)
    expected = np.stack([np.frombuffer(dataset.get(int(i)), np.uint8).reshape(shape) for i in indices])
    np.testing.assert_array_equal(read_raw_batch(dataset, indices, shape), expected)


@pytest.mark.parametrize("decode", ["rrc", "center", "full"])
def test_packer_bench_measures_raw_datasets_with_every_decode_mode(raw_dataset: Path, decode: str) -> None:
    from packer.bench import BenchOptions, run_bench

    result = run_bench(raw_dataset, BenchOptions(decode=decode, size=24, batch_size=8, batches=2, warmup=1,
                                                 loader="torch", workers=0))
    assert result.samples == 16 and result.samples_per_s > 0 and result.codec == "raw"
    assert not any("--codec raw is the fast path" in note for note in result.notes)


def test_raw_gather_refuses_an_index_that_disagrees_with_the_raw_layout(raw_dataset: Path) -> None:
    """A row whose size or offset breaks the raw layout gets IndexMismatchError naming the sample."""
    from types import SimpleNamespace

    from packer.errors import IndexMismatchError

    real = PackedDataset(raw_dataset).dataset
    shape = raw_shape_of(real)

    def fake(size_of_7: int, offset_shift_of_7: int) -> SimpleNamespace:
        size = real.index.size.copy()
        offset = real.index.offset.copy()
        size[7] = size_of_7
        offset[7] += offset_shift_of_7
        index = SimpleNamespace(size=size, offset=offset, shard=real.index.shard)
        return SimpleNamespace(index=index, manifest=real.manifest, path=real.path, backend_name="mmap",
                               verify_checksums=False, alignment=real.alignment,
                               shard_alignment=real.shard_alignment,
                               shard_range=real.shard_range, shard=real.shard,
                               stored_layout=lambda shard: (*real.shard_range(shard),
                                                            int(offset[real.shard_range(shard)[0]])),
                               stored_rows=lambda rows: rows)

    with pytest.raises(IndexMismatchError, match="raw sample of 100 bytes") as error:
        read_raw_batch(fake(100, 0), [3, 7], shape)
    assert error.value.sample == 7
    with pytest.raises(IndexMismatchError, match="not at a multiple") as error:
        read_raw_batch(fake(int(real.index.size[7]), 512), [7, 3], shape)
    assert error.value.sample == 7


def _crafted_raw(tmp_path: Path, name: str) -> Path:
    """A copy of a 2-shard raw dataset (6x5x3 samples of 90 bytes, 128-byte stride: 7 in shard 0, 1 in
    shard 1), built once under ``tmp_path``."""
    import shutil

    from helpers import png_folder

    if not (tmp_path / "raw").exists():
        build(png_folder(tmp_path / "src", 8), tmp_path / "raw",
              BuildOptions(codec="raw:size=6x5", shard_size=1 << 10, alignment=64, shuffle=False),
              workers=1, progress=False)
    return Path(shutil.copytree(tmp_path / "raw", tmp_path / name))


def test_in_place_crops_refuse_an_index_that_disagrees_with_the_raw_layout(tmp_path: Path) -> None:
    """Hand-made indexes that pass the layout checks of opening (sizes and offsets packed in order,
    aligned, ending at the shard's end; the shard's own header is read later) but break the raw
    layout: a sample of the wrong size, or one off the stride grid of its shard. The in-place crop
    path refuses them naming the sample, exactly as the gather does, before the kernel reads a
    byte (without the check the kernel crops whatever lies there)."""
    import json

    from helpers import edit_manifest, rewrite_index
    from packer.dataset import open_dataset
    from packer.errors import IndexMismatchError
    from packer.rawcrop import crop_resize_raw

    short = _crafted_raw(tmp_path, "short")
    rewrite_index(short, lambda columns: columns["size"].__setitem__(3, 70))  # still one 128-byte slot
    shifted = _crafted_raw(tmp_path, "shifted")

    def shift(columns: dict[str, np.ndarray]) -> None:
        columns["size"][3] = 60  # a 64-byte slot: samples 4..6 of shard 0 move down by 64
        columns["offset"][4:7] -= 64

    rewrite_index(shifted, shift)
    manifest = json.loads((shifted / "manifest.json").read_text())
    shorter = manifest["shards"][0]["size"] - 64  # shard 0 ends 64 bytes earlier
    os.truncate(shifted / manifest["shards"][0]["path"], shorter)
    edit_manifest(shifted, lambda document: document["shards"][0].__setitem__("size", shorter))
    cases = [(short, [1, 3], 3, "raw sample of 70 bytes, expected 90 (6x5x3)"),
             (shifted, [4, 1], 4, "raw sample offset 512 is not at a multiple of the 128-byte stride from the "
                                  "shard's first sample"),
             (shifted, [7, 5], 5, "raw sample offset 640 is not at a multiple of the 128-byte stride from the "
                                  "shard's first sample")]  # rows of two shards
    for folder, indices, bad, message in cases:
        with open_dataset(folder) as dataset:
            shape = raw_shape_of(dataset)
            assert len(dataset.manifest.shards) == 2 and shape == (6, 5, 3)
            boxes = np.array([[0.0, 0.0, 5.0, 6.0]] * len(indices))
            for read in (lambda: crop_resize_raw(dataset, indices, shape, boxes, None, (3, 3)),
                         lambda: read_raw_batch(dataset, indices, shape)):
                with pytest.raises(IndexMismatchError) as caught:
                    read()
                error = caught.value
                assert (error.message, error.sample, error.path) == (message, bad, str(dataset.path))
    with open_dataset(short) as dataset:  # its other samples crop as ever
        crops = crop_resize_raw(dataset, [0, 2], (6, 5, 3), np.array([[0.0, 0.0, 5.0, 6.0]] * 2), None, (3, 3))
        assert crops.shape == (2, 3, 3, 3)


def test_boxes_of_images_of_different_sizes_are_each_sizes_own() -> None:
    """Issue 40: a batch of JPEGs of different sizes draws its seeded boxes in one call (``(N,)``
    widths and heights); row ``k`` is exactly the box the ints ``width[k]``, ``height[k]`` give, the
    fallback for a box that never fits included."""
    rng = np.random.default_rng(7)
    draws = sample_uniforms(5, 1, np.arange(400), RRC_DRAWS)
    widths = rng.integers(1, 2000, 400)
    heights = rng.integers(1, 2000, 400)
    widths[:40], heights[:40] = rng.integers(1, 12, 40), rng.integers(300, 2000, 40)  # too narrow: fallbacks
    for scale in ((0.08, 1.0), (0.9, 1.0)):
        boxes, flips = random_resized_crop_boxes(draws, widths, heights, scale=scale)
        for k in range(len(draws)):
            box, flip = random_resized_crop_boxes(draws[k:k + 1], int(widths[k]), int(heights[k]), scale=scale)
            assert boxes[k].tolist() == box[0].tolist() and bool(flips[k]) == bool(flip[0]), k
            whole, _ = random_resized_crop_boxes(np.tile(draws[k], (3, 1)), int(widths[k]), int(heights[k]),
                                                 scale=scale)
            assert whole[1].tolist() == box[0].tolist(), k  # the one-row path is the array rule's
        assert np.all(boxes[:, 2] <= widths) and np.all(boxes[:, 3] <= heights)


@pytest.mark.parametrize("scale", [(0.08, 1.0), (0.99, 1.0), (0.3, 0.6)])
def test_one_row_draws_equal_the_array_rule_on_many_draws(scale: tuple) -> None:
    """The per-sample path draws one row at a time in Python floats (``rawcrop._one_box``): the
    same boxes and flips as the whole-array rule, fallbacks included."""
    rng = np.random.default_rng(11)
    for width, height in [(500, 375), (375, 500), (7, 900), (900, 7), (1, 1), (4000, 3000)]:
        draws = rng.random((300, RRC_DRAWS))
        boxes, flips = random_resized_crop_boxes(draws, width, height, scale=scale)
        for k in range(len(draws)):
            box, flip = random_resized_crop_boxes(draws[k:k + 1], width, height, scale=scale)
            assert box.shape == (1, 4) and box.dtype == np.float64 and flip.dtype == bool
            assert boxes[k].tolist() == box[0].tolist() and bool(flips[k]) == bool(flip[0]), (width, height, k)
    no_flip = random_resized_crop_boxes(draws[:1], 50, 40, flip=False)[1]
    assert no_flip.tolist() == [False]


def test_one_index_draws_equal_the_array_rule() -> None:
    """``sample_uniforms`` of one index (the per-sample path) takes the same 64-bit integers in
    Python ints: the same floats as the array rule, large seeds, epochs and indices included."""
    rng = np.random.default_rng(5)
    for seed in (0, 1, 2**63 - 1, 2**64 + 5, int(rng.integers(0, 2**62))):
        for epoch in (0, 7, 2**40):
            indices = np.concatenate([rng.integers(0, 2**40, 30), [0, 2**62]])
            whole = sample_uniforms(seed, epoch, indices, RRC_DRAWS)
            for k, index in enumerate(indices.tolist()):
                one = sample_uniforms(seed, epoch, [index], RRC_DRAWS)
                assert one.shape == (1, RRC_DRAWS) and one.dtype == np.float64
                assert one[0].tolist() == whole[k].tolist(), (seed, epoch, index)
    assert sample_uniforms(0, 0, [3], 0).shape == (1, 0)
    with pytest.raises(OptionError, match="non-negative"):
        sample_uniforms(0, 0, [-1], RRC_DRAWS)
