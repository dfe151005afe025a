"""A view of a dataset at a URL (issue 36 item 2): the view file is local, its base a URL read
through the node cache; readers, verify and a DataLoader with workers read only its samples."""

from __future__ import annotations

import pytest

from conftest import options_for

import packer
from packer.remote.upload import upload_dataset
from packer.remote.url import parse_url
from packer.viewfile import parse_view


def test_a_view_of_a_url_reads_its_samples_through_the_node_cache(s3, small_dataset, tmp_path):
    url = f"s3://{s3.bucket}/ds"
    upload_dataset(small_dataset, parse_url(url), options_for(s3, tmp_path / "up"))
    options = options_for(s3, tmp_path / "cache")
    (path,) = packer.view(url, tmp_path / "v.pkview", where="label == 1", remote=options)
    assert parse_view(path.read_bytes()).base == url  # a URL is kept as given, never made relative
    with packer.open_dataset(small_dataset) as local, packer.open_dataset(path, remote=options) as view:
        rows = [i for i in range(len(local)) if local.labels[i] == 1]
        assert view.base_rows.tolist() == rows and view.url == url
        assert [bytes(view.get(i)) for i in range(len(view))] == [bytes(local.get(i)) for i in rows]
        view.plan_reads(range(len(view)))  # the prefetch plan is the base's sample numbers
        batch = view.read_batch(list(range(len(view))))
        assert [bytes(batch[j]) for j in range(len(view))] == [bytes(local.get(i)) for i in rows]


def test_a_view_of_a_url_in_a_dataloader_with_two_workers(s3, small_dataset, tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    from packer.torch import PackedBatchSampler, PackedDataset

    url = f"s3://{s3.bucket}/ds"
    upload_dataset(small_dataset, parse_url(url), options_for(s3, tmp_path / "up"))
    options = options_for(s3, tmp_path / "cache")
    (path,) = packer.view(url, tmp_path / "v.pkview", classes=[0], remote=options)
    opened = packer.open_dataset(path, remote=options)
    dataset = PackedDataset(opened, decode=False, fields=("index", "image"))
    loader = DataLoader(dataset, batch_sampler=PackedBatchSampler(dataset, batch_size=2, order="block"),
                        num_workers=2, collate_fn=lambda samples: samples)
    seen = {int(s["index"]): bytes(s["image"]) for batch in loader for s in batch}
    opened.close()  # its fetch threads end here, not in a later test's forks
    with packer.open_dataset(small_dataset) as local:
        rows = [i for i in range(len(local)) if local.labels[i] == 0]
        assert seen == {k: bytes(local.get(i)) for k, i in enumerate(rows)} and torch is not None


def test_a_mixture_of_a_folder_a_url_and_a_view_in_one_dataloader_with_two_workers(s3, small_dataset, tmp_path):
    from collections import Counter

    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    from packer.order import IndexSpace, ReadOrder
    from packer.torch import PackedBatchSampler, PackedDataset

    url = f"s3://{s3.bucket}/ds"
    upload_dataset(small_dataset, parse_url(url), options_for(s3, tmp_path / "up"))
    options = options_for(s3, tmp_path / "cache")
    (view,) = packer.view(small_dataset, tmp_path / "v.pkview", classes=[0])
    with packer.open_dataset(view) as opened:
        chosen = len(opened)
    remote = packer.open_dataset(url, remote=options)

    def mixture():
        return packer.Mixture([packer.Stream(small_dataset, weight=1), packer.Stream(remote, weight=1),
                               packer.Stream(view, repeat=2)], epoch_size=2 * chosen + 20, seed=1)

    mixed = mixture()
    want = Counter(IndexSpace(mixed).epoch_order(ReadOrder("block", seed=3), 0).tolist())
    data = PackedDataset(mixed, decode=False, fields=("index", "image", "stream"))
    loader = DataLoader(data, batch_sampler=PackedBatchSampler(data, batch_size=4, order=ReadOrder("block", seed=3)),
                        num_workers=2, collate_fn=lambda samples: samples)
    got = [(int(s["index"]), int(s["stream"]), bytes(s["image"])) for batch in loader for s in batch]
    assert Counter(i for i, _, _ in got) == want
    with packer.open_dataset(small_dataset) as local, packer.open_dataset(view) as cats:
        for index, stream, data_bytes in got:
            local_number = index - int(mixed.offsets[stream])
            source = cats if stream == 2 else local
            assert data_bytes == bytes(source.get(local_number))
    assert Counter(s for _, s, _ in got) == {0: 10, 1: 10, 2: 2 * chosen}
    mixed.close()
    remote.close()  # its fetch threads end here, not in a later test's forks
