"""A seeded crop's boxes are drawn once per batch on the readers' batched path (issue 40: a draw per
sample cost ~0.1-0.2 ms of numpy calls, a fifth of a tiled JPEG's decode), with exactly the pixels
and crops of the per-sample path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from packer import BuildSettings, LayoutSettings, RunOptions  # noqa: E402
from packer.dataset import open_dataset  # noqa: E402
from packer.torch import PackedDataset  # noqa: E402
from packer.transforms import CenterCrop, RandomResizedCrop  # noqa: E402
from packer.writer import build  # noqa: E402

N = 24


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import make_sample

    root = tmp_path_factory.mktemp("batch-draws")
    make_sample.make_image_folder(root / "src", classes=3, per_class=N // 3, seed=9, min_size=24, max_size=90,
                                  formats=("png", "jpeg"))
    out = {}
    for codec in ("passthrough", "tiled"):
        out[codec] = root / codec
        build(root / "src", out[codec], BuildSettings(codec=codec, layout=LayoutSettings(shard_size=64 << 10)),
              RunOptions(workers=1, progress=False))
    return out


def _per_sample(path: Path, transform, indices) -> np.ndarray:
    with open_dataset(path) as dataset:
        return np.stack([transform(np.frombuffer(dataset.get(i), np.uint8), int(dataset.index.image_format[i]),
                                   index=i) for i in indices])


@pytest.mark.parametrize("codec", ["passthrough", "tiled"])
def test_batches_with_draws_made_per_batch_equal_the_per_sample_path(packed: dict[str, Path], codec: str) -> None:
    indices = np.random.default_rng(0).permutation(N)
    for epoch in (0, 3):
        transform = RandomResizedCrop(20, seed=4)
        transform.set_epoch(epoch)
        dataset = PackedDataset(packed[codec], decode=transform, layout="HWC")
        images, labels = dataset.load_batch(indices)
        assert images.shape == (N, 20, 20, 3)
        np.testing.assert_array_equal(images.numpy(), _per_sample(packed[codec], transform, indices))


def test_a_draw_made_for_another_size_is_drawn_again(packed: dict[str, Path]) -> None:
    transform = RandomResizedCrop(16, seed=2)
    with open_dataset(packed["tiled"]) as dataset:
        for i in range(N):
            data = np.frombuffer(dataset.get(i), np.uint8)
            image_format = int(dataset.index.image_format[i])
            width, height = int(dataset.index.width[i]), int(dataset.index.height[i])
            drawn = transform._seeded_draws([width], [height], [i])[0]
            assert drawn[:2] == (width, height)
            want, geometry = transform.decode_with_geometry(data, image_format, index=i)
            got, got_geometry = transform._decode_drawn(data, image_format, None, i, drawn, True)
            np.testing.assert_array_equal(got, want)
            assert got_geometry == geometry
            # a draw for the wrong size (an index that disagrees with the stored image) is not used
            wrong = (width + 1, height, (0.0, 0.0, 1.0, 1.0), True)
            np.testing.assert_array_equal(transform._decode_drawn(data, image_format, None, i, wrong, False)[0], want)


def test_only_seeded_transforms_with_recorded_sizes_draw_per_batch() -> None:
    assert RandomResizedCrop(16)._seeded_draws([40], [30], [0]) is None  # a generator's draws stay in order
    assert CenterCrop(16)._seeded_draws([40], [30], [0]) is None
    assert RandomResizedCrop(16, seed=0)._seeded_draws([40, 0], [30, 30], [0, 1]) is None  # a size not recorded
    assert RandomResizedCrop(16, seed=0)._seeded_draws([], [], []) == []


def test_a_subclass_that_overrides_the_call_is_called_per_sample(packed: dict[str, Path]) -> None:
    calls = []

    class Counting(RandomResizedCrop):
        def __call__(self, data, image_format=None, rng=None, *, out=None, name="", index=None):
            calls.append(index)
            return super().__call__(data, image_format, rng, out=out, name=name, index=index)

    dataset = PackedDataset(packed["passthrough"], decode=Counting(16, seed=1), layout="HWC")
    images, _ = dataset.load_batch([3, 1, 2])
    assert calls == [3, 1, 2]
    np.testing.assert_array_equal(images.numpy(), _per_sample(packed["passthrough"], RandomResizedCrop(16, seed=1),
                                                              [3, 1, 2]))
