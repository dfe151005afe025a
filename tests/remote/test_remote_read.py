"""Reading a dataset from a loopback S3 server: the same bytes as the folder, through the node cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import options_for

import packer
from packer.remote.upload import upload_dataset
from packer.remote.url import parse_url


def _upload(s3, local: Path, cache: Path, name: str = "ds", **changes):
    url = f"s3://{s3.bucket}/{name}"
    upload_dataset(local, parse_url(url), options_for(s3, cache, **changes))
    return url


def test_every_sample_reads_as_in_the_folder(s3, small_dataset, tmp_path):
    url = _upload(s3, small_dataset, tmp_path / "up")
    with packer.open_dataset(small_dataset) as local, \
            packer.open_dataset(url, remote=options_for(s3, tmp_path / "cache")) as remote:
        assert remote.url == url and remote.location == url and remote.backend_name == "remote"
        assert len(remote) == len(local) and remote.classes == local.classes
        for i in range(len(local)):
            assert bytes(remote.get(i)) == bytes(local.get(i))
        order = np.random.default_rng(0).permutation(len(local))[:50]
        batch, expect = remote.read_batch(order), local.read_batch(order)
        assert [bytes(batch[j]) for j in range(len(order))] == [bytes(expect[j]) for j in range(len(order))]


def test_each_extent_is_downloaded_once_and_survives_a_reopen(s3, small_dataset, tmp_path):
    url = _upload(s3, small_dataset, tmp_path / "up")
    options = options_for(s3, tmp_path / "cache")
    s3.reset()
    with packer.open_dataset(url, remote=options) as remote:
        remote.plan_reads(np.arange(len(remote)))
        for i in range(len(remote)):
            remote.get(i)
        stats = remote.remote_stats()
    ranges = [(e["path"], e["range"]) for e in s3.log() if e["method"] == "GET" and e["range"]]
    assert len(ranges) == len(set(ranges))  # never a byte twice
    assert stats["downloads"] > 1
    s3.reset()
    with packer.open_dataset(url, remote=options) as again:  # a restart: the cache holds everything
        for i in range(len(again)):
            again.get(i)
    shard_gets = [e for e in s3.log() if e["method"] == "GET" and "/shards/" in e["path"]]
    assert shard_gets == []
