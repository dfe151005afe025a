"""Every remote read is bounded (issue 38): a deadline per request with its body, for both
transports (a body trickling one byte every half second is cut off, retried, then named); the
manifest read as a bounded stream (its limit checked while reading); the index and shards fetched
by their declared sizes (an object larger than declared is not downloaded whole, nor twice); a web
server that ignores Range requests is named for what it does."""

from __future__ import annotations

import shutil
import time

import boto3
import numpy as np
import pytest

from conftest import options_for

import packer
from packer import format as fmt
from packer.errors import ManifestError, RemoteStoreError, TruncatedFileError
from packer.remote.upload import upload_dataset
from packer.remote.url import parse_url

TRANSPORTS = ["fsspec", "obstore"]


def _upload(s3, local, cache, name="ds"):
    url = f"s3://{s3.bucket}/{name}"
    upload_dataset(local, parse_url(url), options_for(s3, cache))
    return url


def _client(s3):
    return boto3.client("s3", endpoint_url=s3.direct, region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing")


def _transport(name):
    if name == "obstore":
        pytest.importorskip("obstore")
    return name


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_trickling_body_is_cut_off_by_the_request_deadline(s3, small_dataset, tmp_path, transport):
    """Every shard GET trickles (headers at once, one byte per 0.5 s): a socket timeout never fires,
    the request deadline (timeout_s, body included) does; after the attempts, the error names the
    shard and the range. Before: fsspec waited for the whole body (hours for one extent)."""
    url = _upload(s3, small_dataset, tmp_path / "up")
    options = options_for(s3, tmp_path / "cache", transport=_transport(transport), timeout_s=1.0, retries=2,
                          deadline_s=20.0)
    with packer.open_dataset(url, remote=options) as remote:
        s3.configure(fault_rate=1.0, faults=["trickle"], paths=["/shards/"], trickle_s=0.5)
        started = time.monotonic()
        with pytest.raises(RemoteStoreError) as caught:
            remote.get(len(remote) - 1)
        took = time.monotonic() - started
    assert took < 15, took
    message = caught.value.message
    assert "shards/shard-" in message and "bytes " in message and "2 attempts" in message, message
    assert caught.value.path == url


@pytest.mark.timeout(180)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_trickling_bodies_among_good_ones_give_the_same_bytes(s3, small_dataset, tmp_path, transport):
    url = _upload(s3, small_dataset, tmp_path / "up")
    order = np.random.default_rng(4).permutation(120)
    with packer.open_dataset(small_dataset) as local:
        expect = [bytes(local.get(int(i))) for i in order]
    s3.configure(fault_rate=0.3, faults=["trickle"], paths=["/shards/"], trickle_s=0.5, seed=3)
    options = options_for(s3, tmp_path / "cache", transport=_transport(transport), timeout_s=1.0, retries=12,
                          extent_bytes=32 << 10, request_bytes=64 << 10)
    with packer.open_dataset(url, remote=options) as remote:
        remote.plan_reads(order)
        assert [bytes(remote.get(int(i))) for i in order] == expect
        assert remote.remote_stats()["retried"] > 0
    assert any(entry["fault"] == "trickle" for entry in s3.log())


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_manifest_over_the_limit_is_refused_while_reading(s3, small_dataset, tmp_path, monkeypatch, transport):
    """The limit is checked on the stream: the GET asks for the limit plus one byte, so an 8 MiB
    manifest under a 1 MiB limit costs 1 MiB + 1 byte, not 8 MiB (a 1 GiB one: 64 MiB, not 1 GiB)."""
    limit = 1 << 20
    monkeypatch.setattr(fmt, "MAX_MANIFEST_BYTES", limit)
    _client(s3).put_object(Bucket=s3.bucket, Key="big/manifest.json", Body=b" " * (8 << 20))
    s3.reset()
    options = options_for(s3, tmp_path / "cache", transport=_transport(transport))
    with pytest.raises(ManifestError, match=f"manifest is over the {limit} bytes limit") as caught:
        packer.open_dataset(f"s3://{s3.bucket}/big", remote=options)
    assert caught.value.path == f"s3://{s3.bucket}/big/manifest.json"
    gets = [entry for entry in s3.log() if entry["method"] == "GET" and entry["path"].endswith("manifest.json")]
    assert gets and all(entry["bytes"] <= limit + 1 for entry in gets), gets


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_index_larger_than_declared_is_read_to_its_size_once(s3, small_dataset, tmp_path, transport):
    url = _upload(s3, small_dataset, tmp_path / "up")
    with packer.open_dataset(small_dataset) as local:
        entry = local.manifest.index
    client = _client(s3)
    body = client.get_object(Bucket=s3.bucket, Key=f"ds/{entry.path}")["Body"].read()
    client.put_object(Bucket=s3.bucket, Key=f"ds/{entry.path}", Body=body + bytes(4 << 20))
    s3.reset()
    with pytest.raises(TruncatedFileError, match=f"larger than the {entry.size} bytes the manifest records") as caught:
        packer.open_dataset(url, remote=options_for(s3, tmp_path / "cache", transport=_transport(transport)))
    assert caught.value.path == f"{url}/{entry.path}"
    gets = [e for e in s3.log() if e["method"] == "GET" and e["path"].endswith(entry.path)]
    assert len(gets) == 1 and gets[0]["bytes"] == entry.size + 1, gets  # once, and never past its size + 1


def test_an_index_shorter_than_declared_is_named(s3, small_dataset, tmp_path):
    url = _upload(s3, small_dataset, tmp_path / "up")
    with packer.open_dataset(small_dataset) as local:
        entry = local.manifest.index
    client = _client(s3)
    body = client.get_object(Bucket=s3.bucket, Key=f"ds/{entry.path}")["Body"].read()
    client.put_object(Bucket=s3.bucket, Key=f"ds/{entry.path}", Body=body[:100])
    with pytest.raises(TruncatedFileError, match=f"the index object is 100 bytes, not the {entry.size} the manifest "
                                                 f"records"):
        packer.open_dataset(url, remote=options_for(s3, tmp_path / "cache"))


def test_a_shard_larger_than_declared_is_read_by_ranges_inside_its_size(s3, small_dataset, tmp_path):
    url = _upload(s3, small_dataset, tmp_path / "up")
    with packer.open_dataset(small_dataset) as local:
        shard = local.manifest.shards[0]
        expect = [bytes(local.get(i)) for i in range(len(local))]
    client = _client(s3)
    body = client.get_object(Bucket=s3.bucket, Key=f"ds/{shard.path}")["Body"].read()
    client.put_object(Bucket=s3.bucket, Key=f"ds/{shard.path}", Body=body + bytes(2 << 20))
    s3.reset()
    with packer.open_dataset(url, remote=options_for(s3, tmp_path / "cache")) as remote:
        assert [bytes(remote.get(i)) for i in range(len(remote))] == expect
    for entry in s3.log():
        if entry["method"] == "GET" and entry["path"].endswith(shard.path):
            assert entry["range"], entry  # never the whole object
            end = int(entry["range"].split("-")[1])
            assert end < shard.size, entry


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_server_without_range_requests_is_named(plain_http, small_dataset, tmp_path, transport):
    """``python -m http.server`` answers a Range request with 200 and the whole file: the manifest and
    index are read whole (their bound is what was asked), a shard range is refused naming the
    server's behaviour, never "got 65536 of 64 bytes"."""
    base, folder = plain_http
    shutil.copytree(small_dataset, folder / "ds")
    options = packer.remote.RemoteOptions(cache_dir=str(tmp_path / "cache"), transport=_transport(transport),
                                          retries=2, backoff_s=0.01, timeout_s=10.0)
    with pytest.raises(RemoteStoreError) as caught:
        with packer.open_dataset(f"{base}/ds", remote=options) as remote:
            remote.get(0)
    message = caught.value.message
    assert "does not serve byte ranges" in message or "Range request not supported" in message, message
    assert "206 Partial Content" in message and "got " not in message, message
    assert caught.value.path == f"{base}/ds"
