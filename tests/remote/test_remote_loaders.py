"""The torch readers over a URL: two ranks x two DataLoader workers share one node cache, every
sample is read exactly once, and no byte is downloaded twice on the node."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import numpy as np
import pytest

from conftest import options_for

torch = pytest.importorskip("torch")

import packer  # noqa: E402
from packer.remote.upload import upload_dataset  # noqa: E402
from packer.remote.url import parse_url  # noqa: E402


def _rank(url: str, options, rank: int, out: str) -> None:
    from torch.utils.data import DataLoader

    from packer.torch import PackedBatchSampler, PackedDataset

    dataset = PackedDataset(packer.open_dataset(url, remote=options), decode=False, fields=("index", "image"))
    sampler = PackedBatchSampler(dataset, batch_size=8, order="block", seed=3, rank=rank, world_size=2)
    loader = DataLoader(dataset, batch_sampler=sampler, num_workers=2, collate_fn=lambda samples: samples)
    seen = []
    for batch in loader:
        for sample in batch:
            seen.append((int(sample["index"]), bytes(sample["image"])))
    np.save(out, np.array([i for i, _ in seen], dtype=np.int64))
    Path(out + ".bytes").write_bytes(b"".join(data for _, data in seen))


def _coverage(log: list[dict]) -> tuple[int, int]:
    """(bytes requested by shard range GETs, distinct bytes among them)."""
    total, spans = 0, {}
    for entry in log:
        if entry["method"] != "GET" or not entry["range"] or "/shards/" not in entry["path"]:
            continue
        start, end = (int(x) for x in entry["range"].split("=")[1].split("-"))
        total += end + 1 - start
        spans.setdefault(entry["path"], set()).update(range(start, end + 1))
    return total, sum(len(s) for s in spans.values())


def test_two_ranks_two_workers_share_one_cache(s3, small_dataset, tmp_path):
    url = f"s3://{s3.bucket}/ds"
    upload_dataset(small_dataset, parse_url(url), options_for(s3, tmp_path / "up"))
    options = options_for(s3, tmp_path / "node-cache", in_flight=4)
    s3.reset()
    context = multiprocessing.get_context("fork")
    ranks = [context.Process(target=_rank, args=(url, options, r, str(tmp_path / f"rank{r}.npy"))) for r in (0, 1)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(120)
        assert process.exitcode == 0
    seen = np.concatenate([np.load(tmp_path / f"rank{r}.npy") for r in (0, 1)])
    with packer.open_dataset(small_dataset) as local:
        assert np.array_equal(np.sort(seen), np.arange(len(local)))  # every sample exactly once
        expect = b"".join(bytes(local.get(i)) for i in np.load(tmp_path / "rank0.npy"))
        assert (tmp_path / "rank0.npy.bytes").read_bytes() == expect
    total, distinct = _coverage(s3.log())
    assert total > 0 and total == distinct  # no byte downloaded twice on the node


def test_iterable_dataset_and_threaded_loader_read_a_url(s3, small_dataset, tmp_path):
    from packer.threaded import ThreadedLoader
    from packer.torch import PackedIterableDataset

    url = f"s3://{s3.bucket}/ds"
    upload_dataset(small_dataset, parse_url(url), options_for(s3, tmp_path / "up"))
    options = options_for(s3, tmp_path / "cache")
    remote = packer.open_dataset(url, remote=options)
    iterable = PackedIterableDataset(remote, batch_size=16, order="random", seed=1, decode=False)
    threaded = ThreadedLoader(remote, batch_size=16, order="random", seed=1, decode=False)
    with packer.open_dataset(small_dataset) as local:
        reference = ThreadedLoader(local, batch_size=16, order="random", seed=1, decode=False)
        expect = [labels.tolist() for _, labels in reference]
        assert [labels.tolist() for _, labels in threaded] == expect
        assert sum(len(labels) for _, labels in iterable) == len(local)
