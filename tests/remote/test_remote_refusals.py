"""Every refusal of packer.remote, reached through a public door: bad options, bad URLs, a backend
that reads local files, writing to a read-only URL, an upload over a dataset or over a changed
one, a manifest over the limit, a damaged index, damage that turns out to be a new generation,
an extent that another process evicts as soon as it is fetched, and obstore in a forked child.
Each checks the error's class and message."""

from __future__ import annotations

import os

import boto3
import pytest

from conftest import fake_fsspec_store, options_for

import packer
from packer import format as fmt
from packer.errors import (ChecksumMismatchError, DatasetChangedError, ManifestError, OptionError, OutputExistsError,
                           RemoteStoreError, UnsafePathError)
from packer.remote import RemoteOptions, parse_url
from packer.remote.upload import upload_dataset


# --- options ------------------------------------------------------------------------------------

@pytest.mark.parametrize("changes, message", [
    ({"transport": "boto"}, "unknown transport 'boto'; choose one of fsspec, obstore"),
    ({"in_flight": 0}, "RemoteOptions.in_flight must be a positive integer, got 0"),
    ({"extent_bytes": True}, "RemoteOptions.extent_bytes must be a positive integer, got True"),
    ({"cache_bytes": -1}, "RemoteOptions.cache_bytes must be 0 (no bound) or a positive integer, got -1"),
    ({"deadline_s": 0}, "RemoteOptions.deadline_s must be a positive number, got 0"),
    ({"timeout_s": "5"}, "RemoteOptions.timeout_s must be a positive number, got '5'"),
    # issue 38: every misconfiguration names the setting (these were a TypeError, an AttributeError,
    # "Invalid endpoint" retried until the deadline, and a Rust panic out of obstore)
    ({"endpoint_url": "localhost:9000"}, "RemoteOptions.endpoint_url must be an http:// or https:// URL of the store "
                                         "(e.g. http://127.0.0.1:9000), got 'localhost:9000'"),
    ({"endpoint_url": 9000}, "RemoteOptions.endpoint_url must be an http:// or https:// URL of the store (e.g. "
                             "http://127.0.0.1:9000), got 9000"),
    ({"region": 5}, "RemoteOptions.region must be a region name such as 'us-east-1', got 5"),
    ({"storage_options": ["anon"]}, "RemoteOptions.storage_options must be a dict of the transport client's keyword "
                                    "arguments, got list"),
])
def test_bad_remote_options_are_refused(changes, message):
    with pytest.raises(OptionError) as caught:
        packer.open_dataset("s3://bucket/ds", remote=changes)  # a dict of fields: refused before any request
    assert caught.value.message == message


def test_a_storage_option_the_client_does_not_take_is_named(tmp_path):
    with pytest.raises(OptionError) as caught:
        packer.open_dataset("s3://bucket/ds", remote={"storage_options": {"no_such_setting": 1},
                                                      "cache_dir": str(tmp_path), "endpoint_url": "http://127.0.0.1:9"})
    assert caught.value.message.startswith("RemoteOptions.storage_options does not fit fsspec's s3 client: ")
    assert "no_such_setting" in caught.value.message and caught.value.path == "s3://bucket/ds"


def test_a_cache_folder_that_cannot_be_made_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("PACKER_CACHE_DIR", "/proc/no-such-cache")  # /proc refuses a new folder, even to root
    with pytest.raises(OptionError) as caught:
        packer.open_dataset("s3://bucket/ds")
    assert caught.value.message == ("$PACKER_CACHE_DIR cannot be created (No such file or directory): the node cache "
                                    "must be a writable local folder")
    assert caught.value.path == "/proc/no-such-cache"


def test_unknown_option_names_and_types_are_refused():
    with pytest.raises(OptionError, match=r"unknown remote option\(s\) cache, inflight; known: .*in_flight"):
        packer.open_dataset("s3://bucket/ds", remote={"cache": "/tmp", "inflight": 2})
    with pytest.raises(OptionError, match="remote= takes RemoteOptions or a dict, got list"):
        packer.open_dataset("s3://bucket/ds", remote=["in_flight", 2])


def test_request_bytes_is_at_least_the_extent():
    assert RemoteOptions(extent_bytes=8 << 20, request_bytes=1 << 20).request_bytes == 8 << 20


# --- URLs ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, message", [
    ("bucket/ds", "'bucket/ds' is not a URL (expected scheme://bucket/path"),
    ("ftp://host/ds", "unsupported URL scheme 'ftp' in 'ftp://host/ds'"),
    ("s3://bucket/ds?versionId=3", "a dataset URL takes no query or fragment"),
    ("s3://bucket/ds#x", "a dataset URL takes no query or fragment"),
    ("file://server/share/ds", "a file:// URL names a local folder (file:///path), got host 'server'"),
    ("s3://key:secret@bucket/ds", "credentials do not go in a dataset URL"),
    ("s3:///ds", "no bucket in 's3:///ds'"),
    ("https:///ds", "no host in 'https:///ds'"),
    ("s3://bucket/a/../b", "the path of 's3://bucket/a/../b' is not a plain key prefix"),
    ("gs://bucket/a//b", "the path of 'gs://bucket/a//b' is not a plain key prefix"),
])
def test_bad_urls_are_refused(text, message):
    with pytest.raises(OptionError) as caught:
        parse_url(text)
    assert caught.value.message.startswith(message), caught.value.message


def test_a_bad_url_is_refused_by_open_dataset_too():
    with pytest.raises(OptionError, match="unsupported URL scheme 'ftp'"):
        packer.open_dataset("ftp://host/ds")


@pytest.mark.parametrize("relative", ["../other/index.pki", "/etc/passwd", "shards/../../x", "a\\b", ""])
def test_a_key_that_leaves_the_dataset_is_refused(relative):
    with pytest.raises(UnsafePathError, match="does not stay inside the dataset") as caught:
        parse_url("s3://bucket/ds").key(relative)
    assert caught.value.path == "s3://bucket/ds"


def test_local_path_is_only_for_file_urls(tmp_path):
    assert parse_url(f"file://{tmp_path}/").local_path == str(tmp_path)
    with pytest.raises(OptionError, match="s3://bucket/ds is not a file:// URL"):
        parse_url("s3://bucket/ds").local_path  # noqa: B018


def test_a_local_file_backend_is_refused_for_a_url():
    with pytest.raises(OptionError, match="backend 'direct' reads local files; a dataset URL is read through the "
                                          "node cache"):
        packer.open_dataset("s3://bucket/ds", backend="direct")


# --- writing -------------------------------------------------------------------------------------

def test_building_to_a_read_only_url_is_refused(small_dataset, tmp_path):
    from packer.writer import build

    with pytest.raises(OptionError, match="https:// URLs are read-only; build to s3://, gs:// or az://"):
        build(tmp_path / "src", "https://example.invalid/ds")
    with pytest.raises(RemoteStoreError, match="http:// URLs are read-only") as caught:
        upload_dataset(small_dataset, parse_url("http://127.0.0.1:9/ds"), RemoteOptions(cache_dir=str(tmp_path)))
    assert caught.value.path == "http://127.0.0.1:9/ds"


def _other_dataset(tmp_path):
    from helpers import write_images

    from packer.writer import BuildOptions, build

    write_images(tmp_path / "other-src", {"x": 3})
    build(tmp_path / "other-src", tmp_path / "other", BuildOptions(), workers=1)
    return tmp_path / "other"


def test_an_upload_over_a_dataset_or_a_changed_one_is_refused(s3, small_dataset, tmp_path):
    url = parse_url(f"s3://{s3.bucket}/ds")
    options = options_for(s3, tmp_path / "cache")
    upload_dataset(small_dataset, url, options)
    other = _other_dataset(tmp_path)
    with pytest.raises(OutputExistsError, match="a dataset is already here; pass --overwrite") as caught:
        upload_dataset(other, url, options)
    assert caught.value.path == url.text
    # an append whose base is not what the store holds: refused before anything is sent
    with pytest.raises(DatasetChangedError, match="changed while the append was being built"):
        upload_dataset(other, url, options, expect_manifest=b'{"not": "it"}')
    # the base replaced while the append's objects go up: refused before the manifest
    current = (small_dataset / fmt.MANIFEST_NAME).read_bytes()
    client = boto3.client("s3", endpoint_url=s3.direct, region_name="us-east-1")

    def replace_base(relative, size):
        client.put_object(Bucket=s3.bucket, Key="ds/manifest.json", Body=current.replace(b"{", b"{ ", 1))

    with pytest.raises(DatasetChangedError, match=r"changed while the append was being uploaded \(another writer committed first\); nothing was committed"):
        upload_dataset(other, url, options, expect_manifest=current, on_object=replace_base)
    body = client.get_object(Bucket=s3.bucket, Key="ds/manifest.json")["Body"].read()
    assert body == current.replace(b"{", b"{ ", 1)  # the other dataset's manifest never landed


# --- reading: what the store holds is refused when wrong --------------------------------------

def test_a_manifest_over_the_limit_is_refused(monkeypatch, tmp_path):
    fake = fake_fsspec_store(monkeypatch, "gcs", "gcsfs", "GCSFileSystem")
    fake.store["/big/ds/manifest.json"] = _Blob(b" " * (fmt.MAX_MANIFEST_BYTES + 1))
    with pytest.raises(ManifestError, match=f"manifest is over the {fmt.MAX_MANIFEST_BYTES} bytes limit") as caught:
        packer.open_dataset("gs://big/ds", remote=RemoteOptions(cache_dir=str(tmp_path)))
    assert caught.value.path == "gs://big/ds/manifest.json"


def _Blob(data: bytes):
    from fsspec.implementations.memory import MemoryFile

    return MemoryFile(None, None, data)


def test_an_index_that_does_not_match_its_manifest_twice_is_refused(monkeypatch, small_dataset, tmp_path):
    fake = fake_fsspec_store(monkeypatch, "gcs", "gcsfs", "GCSFileSystem")
    options = RemoteOptions(cache_dir=str(tmp_path / "cache"))
    upload_dataset(small_dataset, parse_url("gs://damaged/ds"), options)
    with packer.open_dataset(small_dataset) as local:
        index_path = local.manifest.index.path
    key = f"/damaged/ds/{index_path}"
    damaged = bytearray(fake.store[key].getvalue())
    damaged[-1] ^= 0xFF
    fake.store[key] = _Blob(bytes(damaged))
    with pytest.raises(ChecksumMismatchError, match="the index fetched twice does not match the manifest") as caught:
        packer.open_dataset("gs://damaged/ds", remote=options)
    assert caught.value.path == f"gs://damaged/ds/{index_path}"


def test_damage_that_comes_with_a_new_manifest_is_a_changed_dataset(s3, small_dataset, tmp_path):
    url = f"s3://{s3.bucket}/ds"
    upload_dataset(small_dataset, parse_url(url), options_for(s3, tmp_path / "up"))
    with packer.open_dataset(small_dataset) as local:
        victim = len(local) - 1  # in another extent than sample 0
        info = local.sample_info(victim)
    client = boto3.client("s3", endpoint_url=s3.direct, region_name="us-east-1")
    with packer.open_dataset(url, remote=options_for(s3, tmp_path / "cache")) as remote:
        remote.get(0)  # open and cache the first extent's shard header
        key = f"ds/{info['shard_path']}"
        body = bytearray(client.get_object(Bucket=s3.bucket, Key=key)["Body"].read())
        body[info["offset"]] ^= 0xFF  # another writer replaced the dataset: its bytes differ ...
        client.put_object(Bucket=s3.bucket, Key=key, Body=bytes(body))
        manifest = (small_dataset / fmt.MANIFEST_NAME).read_bytes()
        client.put_object(Bucket=s3.bucket, Key="ds/manifest.json", Body=manifest.replace(b"{", b"{ ", 1))
        with pytest.raises(DatasetChangedError, match="has a new manifest generation .* refusing to mix") as caught:
            remote.get(victim)  # ... and so does its manifest: not damage, a new generation
    assert caught.value.path == url


# --- obstore and fork -----------------------------------------------------------------------------

def test_obstore_is_refused_in_a_child_forked_after_the_parent_used_it(s3, small_dataset, tmp_path):
    """The refusal runs in the forked child (coverage does not follow a child that leaves with
    ``os._exit``: scripts/promise_unreached.txt lists the site with this test's name)."""
    pytest.importorskip("obstore")
    url = f"s3://{s3.bucket}/ds"
    upload_dataset(small_dataset, parse_url(url), options_for(s3, tmp_path / "up"))
    options = options_for(s3, tmp_path / "cache", transport="obstore")
    with packer.open_dataset(url, remote=options) as remote:
        remote.get(0)  # the parent's runtime is in use
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            packer.open_dataset(url, remote=options.with_(cache_dir=str(tmp_path / "child")))
            os.write(write, b"opened")
        except RemoteStoreError as exc:
            os.write(write, exc.message.encode()[:4000])
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            os.write(write, f"{type(exc).__name__}: {exc}".encode()[:4000])
        os._exit(0)
    os.close(write)
    message = os.read(read, 4096).decode()
    os.waitpid(pid, 0)
    assert message.startswith("transport='obstore' cannot run in a process forked from one that already used it")
    assert "multiprocessing_context='spawn'" in message


def test_obstore_refuses_a_process_that_inherited_another_ones_runtime(s3, small_dataset, tmp_path, monkeypatch):
    """The forked child's check, in the test process (where coverage sees it): the runtime was
    started by another process (the parent, whose module state a fork copies), so opening refuses
    with the fix before any request, naming the URL."""
    pytest.importorskip("obstore")
    from packer.remote import store

    url = f"s3://{s3.bucket}/ds"
    upload_dataset(small_dataset, parse_url(url), options_for(s3, tmp_path / "up"))
    s3.reset()
    monkeypatch.setattr(store, "_OBSTORE_PID", os.getppid())  # what a child forked after the parent used it holds
    with pytest.raises(RemoteStoreError) as caught:
        packer.open_dataset(url, remote=options_for(s3, tmp_path / "cache", transport="obstore"))
    assert caught.value.path == url
    assert caught.value.message == ("transport='obstore' cannot run in a process forked from one that already used it "
                                    "(its tokio runtime does not survive fork: the request would hang); use the "
                                    "default transport='fsspec', or start workers with "
                                    "multiprocessing_context='spawn'")
    assert s3.log() == []  # refused before any request
    monkeypatch.setattr(store, "_OBSTORE_PID", os.getpid())  # this process's own runtime: used again
    with packer.open_dataset(url, remote=options_for(s3, tmp_path / "cache", transport="obstore")) as remote:
        assert len(remote) == 120


# --- the cache bound ----------------------------------------------------------------------------

def test_an_extent_evicted_as_soon_as_it_enters_is_fetched_again_then_refused(s3, small_dataset, tmp_path,
                                                                              monkeypatch):
    """Another process sharing the node cache with a tiny bound evicts each extent between its fetch
    and this reader's mapping of it: fetched three times, then a RemoteStoreError that names the URL
    and the bound, instead of fetching forever."""
    from packer.remote.cache import evict
    from packer.remote.reader import RemoteFiles

    url = f"s3://{s3.bucket}/ds"
    upload_dataset(small_dataset, parse_url(url), options_for(s3, tmp_path / "up"))
    cache = tmp_path / "cache"
    fetch = RemoteFiles._fetch_now
    fetched: list[int] = []

    def fetch_then_evicted(self, family: str, extent: int) -> None:
        fetch(self, family, extent)
        fetched.append(extent)
        _total, removed = evict(cache, 1, lambda path, mtime: (0.0, mtime))  # the other process: all of it goes
        assert removed > 0

    monkeypatch.setattr(RemoteFiles, "_fetch_now", fetch_then_evicted)
    with packer.open_dataset(url, remote=options_for(s3, cache, cache_bytes=4096)) as remote:
        with pytest.raises(RemoteStoreError) as caught:
            remote.get(5)
        assert fetched == [fetched[0]] * 3 and remote.remote_stats()["downloads"] == 3
    assert caught.value.path == url
    assert caught.value.message == (f"extent {fetched[0]} left the cache as soon as it entered (cache_bytes 4096 is "
                                    f"too small for the read-ahead)")
