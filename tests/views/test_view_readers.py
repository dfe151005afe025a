"""Every reader reads a view as a dataset, without a line of its own for views: the samples of an
epoch are the view's, each with the bytes of its base sample (issue 36 item 2)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from helpers import write_images

import packer

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def view_path(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("view-readers")
    write_images(root / "src", {"cat": 9, "dog": 13, "emu": 6}, size=20)
    packer.build_dataset(root / "src", root / "ds", packer.BuildSettings(
        layout=packer.LayoutSettings(shard_size=16 << 10, alignment=512)))
    (path,) = packer.view(root / "ds", root / "v.pkview", classes="dog,emu")
    return path


def _expected(view_path: Path) -> dict[int, bytes]:
    with packer.open_dataset(view_path) as view:
        base = packer.open_dataset(view.view.base_location(view_path))
        assert len(base.manifest.shards) > 1  # the view crosses shards
        return {i: bytes(base.get(int(view.base_rows[i]))) for i in range(len(view))}


def _pairs(batch) -> dict[int, bytes]:
    """A dict batch (``fields=("index", "image")``, not decoded) as index -> bytes."""
    return {int(i): bytes(image.numpy()) for i, image in zip(batch["index"].tolist(), batch["image"])}


def test_packed_dataset_with_a_batch_sampler_and_dataloader_workers(view_path):
    from torch.utils.data import DataLoader

    from packer.torch import PackedBatchSampler, PackedDataset

    expected = _expected(view_path)
    dataset = PackedDataset(view_path, decode=False, fields=("index", "image", "label"))
    sampler = PackedBatchSampler(dataset, batch_size=4, order=packer.ReadOrder("block", seed=2))
    loader = DataLoader(dataset, batch_sampler=sampler, num_workers=2, collate_fn=lambda samples: samples)
    seen = {int(s["index"]): bytes(s["image"]) for batch in loader for s in batch}
    assert seen == expected and len(sampler) == 5
    assert {int(s["label"]) for batch in loader for s in batch} == {1, 2}


def test_packed_iterable_dataset_with_workers(view_path):
    from torch.utils.data import DataLoader

    from packer.torch import PackedIterableDataset

    expected = _expected(view_path)
    data = PackedIterableDataset(view_path, batch_size=3, decode=False, fields=("index", "image"),
                                 order=packer.ReadOrder("random", seed=1))
    loader = DataLoader(data, batch_size=None, num_workers=2)
    seen = {}
    for batch in loader:
        seen.update(_pairs(batch))
    assert seen == expected


def test_threaded_loader_reads_the_view_and_resumes(view_path):
    from packer.threaded import ThreadedLoader

    expected = _expected(view_path)
    loader = ThreadedLoader(view_path, batch_size=4, decode=False, fields=("index", "image"), threads=2,
                            order=packer.ReadOrder("block", seed=4))
    seen = {}
    for batch in loader:
        seen.update(_pairs(batch))
    assert seen == expected
    iterator = iter(loader)
    first = list(_pairs(next(iterator))) + list(_pairs(next(iterator)))
    state = loader.state_dict(batches_consumed=2)
    iterator.close()
    again = ThreadedLoader(view_path, batch_size=4, decode=False, fields=("index", "image"), threads=1,
                           order=packer.ReadOrder("block", seed=4))
    again.load_state_dict(state)
    rest = [i for batch in again for i in _pairs(batch)]
    assert sorted(first + rest) == sorted(expected)


def test_decoded_images_and_labels_come_from_the_base(view_path):
    from packer.torch import PackedDataset

    with packer.open_dataset(view_path) as view:
        base = packer.open_dataset(view.view.base_location(view_path))
        mine = PackedDataset(view_path, layout="HWC")
        theirs = PackedDataset(base, layout="HWC")
        for i in (0, 7, len(view) - 1):
            image, label = mine[i]
            other, other_label = theirs[int(view.base_rows[i])]
            assert np.array_equal(np.asarray(image), np.asarray(other)) and label == other_label


def test_grain_source_reads_the_view(view_path):
    pytest.importorskip("grain")
    from packer.grain import PackedDataSource

    expected = _expected(view_path)
    source = PackedDataSource(view_path, fields=("index", "image"), decode=False)
    assert len(source) == len(expected)
    assert {int(source[i]["index"]): bytes(source[i]["image"]) for i in range(len(source))} == expected


def test_a_view_of_stored_pixels_takes_the_raw_batch_path(tmp_path):
    from packer.threaded import ThreadedLoader
    from packer.torch import PackedDataset
    from packer import errors

    write_images(tmp_path / "src", {"cat": 10, "dog": 10}, size=16)
    packer.build_dataset(tmp_path / "src", tmp_path / "ds", packer.BuildSettings(
        codec="raw:size=8x8", layout=packer.LayoutSettings(shard_size=40 << 10, alignment=4096)))
    (path,) = packer.view(tmp_path / "ds", tmp_path / "v.pkview", classes="dog")
    view, base = PackedDataset(path, layout="HWC"), PackedDataset(tmp_path / "ds", layout="HWC")
    rows = view.dataset.base_rows
    assert len(base.dataset.manifest.shards) > 1 and rows.tolist() != list(range(rows[0], rows[0] + len(rows)))
    images = view.__getitems__([0, 3, 9, 5])  # the batched raw path: one layout check, counted in the base's shards
    for k, i in enumerate([0, 3, 9, 5]):
        assert np.array_equal(np.asarray(images[k][0]), np.asarray(base[int(rows[i])][0]))
    loader = ThreadedLoader(path, batch_size=4, threads=2, order="sequential")
    assert sum(len(images) for images, _ in loader) == 10
    with pytest.raises(errors.OptionError, match="a view of stored pixels \\(codec raw\\) as a stream is not supported"):
        packer.Mixture([path, tmp_path / "ds"])
