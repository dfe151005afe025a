"""Faults between packer and the store: transient ones give the same bytes, permanent ones a typed
error naming shard and range, damage a re-fetch then a typed error naming the sample, a new
manifest generation a refusal; and a forked process never uses its parent's client."""

from __future__ import annotations

import os
import pickle

import boto3
import numpy as np
import pytest

from conftest import options_for

import packer
from packer import format as fmt
from packer.errors import ChecksumMismatchError, DatasetChangedError, RemoteStoreError
from packer.remote.store import store_for
from packer.remote.upload import upload_dataset
from packer.remote.url import parse_url


def _upload(s3, local, cache, name="ds"):
    url = f"s3://{s3.bucket}/{name}"
    upload_dataset(local, parse_url(url), options_for(s3, cache))
    return url


def _stream(dataset, order):
    return [bytes(dataset.read_batch(order[k:k + 16])[j]) for k in range(0, len(order), 16)
            for j in range(len(order[k:k + 16]))]


@pytest.mark.parametrize("rate", [0.01, 0.25])
def test_transient_faults_give_a_bit_identical_stream(s3, small_dataset, tmp_path, rate):
    url = _upload(s3, small_dataset, tmp_path / "up")
    order = np.random.default_rng(5).permutation(120)
    with packer.open_dataset(small_dataset) as local:
        expect = _stream(local, order)
    s3.configure(fault_rate=rate, seed=11, slow_s=0.6, methods=["GET", "HEAD"])
    options = options_for(s3, tmp_path / "cache", extent_bytes=16 << 10, request_bytes=32 << 10, timeout_s=0.4,
                          retries=12)
    with packer.open_dataset(url, remote=options) as remote:
        remote.plan_reads(order)
        assert _stream(remote, order) == expect
    faults = {entry["fault"] for entry in s3.log() if entry["fault"]}
    if rate > 0.1:  # most kinds were injected (a seeded draw), and still the same bytes
        assert len(faults) >= 3, faults


def test_a_permanent_failure_names_the_shard_and_range(s3, small_dataset, tmp_path):
    url = _upload(s3, small_dataset, tmp_path / "up")
    options = options_for(s3, tmp_path / "cache", retries=3)
    with packer.open_dataset(url, remote=options) as remote:
        remote.get(0)  # headers cached
        s3.configure(fault_rate=1.0, faults=["503"])
        shard = remote.manifest.shards[remote.shard_of(len(remote) - 1)].path
        with pytest.raises(RemoteStoreError) as caught:
            remote.get(len(remote) - 1)
    assert shard in caught.value.message and "bytes " in caught.value.message and "3 attempts" in caught.value.message


def test_a_missing_dataset_is_a_typed_error(s3, tmp_path):
    with pytest.raises(RemoteStoreError, match="manifest.json"):
        packer.open_dataset(f"s3://{s3.bucket}/nothing-here", remote=options_for(s3, tmp_path / "cache"))


def _client(s3):
    return boto3.client("s3", endpoint_url=s3.direct, region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing")


def test_damaged_bytes_are_fetched_again_once_then_name_the_sample(s3, small_dataset, tmp_path):
    url = _upload(s3, small_dataset, tmp_path / "up")
    with packer.open_dataset(small_dataset) as local:
        victim = 7
        info = local.sample_info(victim)
    key = f"ds/{info['shard_path']}"
    client = _client(s3)
    body = bytearray(client.get_object(Bucket=s3.bucket, Key=key)["Body"].read())
    body[info["offset"] + 3] ^= 0xFF
    client.put_object(Bucket=s3.bucket, Key=key, Body=bytes(body))
    s3.reset()
    with packer.open_dataset(url, remote=options_for(s3, tmp_path / "cache")) as remote:
        with pytest.raises(ChecksumMismatchError) as caught:
            remote.get(victim)
    assert caught.value.sample == victim and info["shard_path"] in str(caught.value)
    gets = [e for e in s3.log() if e["method"] == "GET" and e["path"].endswith(info["shard_path"]) and e["range"]
            and not e["range"].startswith("bytes=0-")]
    assert len(gets) == 2  # the range, then once again


def test_a_new_manifest_generation_is_refused_not_mixed(s3, small_dataset, tmp_path):
    url = _upload(s3, small_dataset, tmp_path / "up")
    options = options_for(s3, tmp_path / "cache")
    remote = packer.open_dataset(url, remote=options)
    state = pickle.dumps(remote)  # what a DataLoader worker receives
    manifest = (small_dataset / fmt.MANIFEST_NAME).read_bytes()
    _client(s3).put_object(Bucket=s3.bucket, Key="ds/manifest.json", Body=manifest.replace(b"{", b"{ ", 1))
    with pytest.raises(DatasetChangedError, match="new manifest generation"):
        pickle.loads(state)
    remote.close()


def test_a_forked_process_makes_its_own_client(s3, small_dataset, tmp_path):
    url = _upload(s3, small_dataset, tmp_path / "up")
    options = options_for(s3, tmp_path / "cache")
    parent = store_for(parse_url(url), options)
    with packer.open_dataset(url, remote=options) as remote:
        first = bytes(remote.get(0))
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: a new client, and reads still work
            ok = store_for(parse_url(url), options) is not parent and bytes(remote.get(len(remote) - 1)) != b""
            os.write(write, b"1" if ok else b"0")
            os._exit(0)
        os.close(write)
        assert os.read(read, 1) == b"1"
        os.waitpid(pid, 0)
        assert bytes(remote.get(0)) == first
