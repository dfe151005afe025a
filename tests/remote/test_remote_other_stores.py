"""``gs://`` and ``az://`` datasets: URL parsing, the transports' clients, and a whole upload and
read through packer's fsspec transport over stand-ins for gcsfs and adlfs (in-memory filesystems
registered under their protocols). What this does not check: the real GCS and Azure wire protocols
(no emulator of either installs from the package registries this project uses)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import fake_fsspec_store

import packer
from packer.errors import MissingDependencyError, OptionError, RemoteStoreError
from packer.remote import RemoteOptions, parse_url
from packer.remote.store import FsspecTransport, ObstoreTransport
from packer.remote.upload import upload_dataset


@pytest.mark.parametrize("text, scheme, bucket, prefix", [
    ("gs://my-bucket/imagenet/train", "gs", "my-bucket", "imagenet/train"),
    ("gs://my-bucket", "gs", "my-bucket", ""),
    ("az://container/a%20b/ds/", "az", "container", "a b/ds"),
    ("GS://B/x", "gs", "B", "x"),
])
def test_gs_and_az_urls_parse(text, scheme, bucket, prefix):
    url = parse_url(text)
    assert (url.scheme, url.bucket, url.prefix) == (scheme, bucket, prefix)
    assert not url.read_only and url.key("index.pki") == (f"{prefix}/index.pki" if prefix else "index.pki")


@pytest.mark.parametrize("scheme, protocol, module, name", [("gs", "gcs", "gcsfs", "GCSFileSystem"),
                                                           ("az", "az", "adlfs", "AzureBlobFileSystem")])
def test_a_dataset_uploads_to_and_reads_from_gs_and_az(monkeypatch, small_dataset, tmp_path, scheme, protocol,
                                                       module, name):
    fake = fake_fsspec_store(monkeypatch, protocol, module, name)
    url = f"{scheme}://both-{scheme}/team/ds"  # a bucket of its own: clients are kept per process and bucket
    options = RemoteOptions(cache_dir=str(tmp_path / "cache"), extent_bytes=64 << 10, request_bytes=128 << 10,
                            storage_options={"project": "p"} if scheme == "gs" else {"account_name": "acct"})
    report = upload_dataset(small_dataset, parse_url(url), options)
    assert report.uploaded[-1] == "manifest.json"
    assert f"/both-{scheme}/team/ds/manifest.json" in fake.store  # the key is bucket/prefix/name
    assert fake.made[-1].get("project" if scheme == "gs" else "account_name")  # storage_options reach the client
    order = np.random.default_rng(2).permutation(120)
    with packer.open_dataset(url, remote=options) as remote, packer.open_dataset(small_dataset) as local:
        remote.plan_reads(order)
        batch, expect = remote.read_batch(order), local.read_batch(order)
        assert [bytes(batch[j]) for j in range(len(order))] == [bytes(expect[j]) for j in range(len(order))]
        assert remote.url == url


@pytest.mark.parametrize("scheme, package, extra", [("gs", "gcsfs", "gcs"), ("az", "adlfs", "azure"),
                                                   ("s3", "s3fs", "s3"), ("https", "aiohttp", "http")])
def test_a_missing_transport_names_the_narrow_extra(monkeypatch, tmp_path, scheme, package, extra):
    import importlib
    import sys

    monkeypatch.setitem(sys.modules, package, None)  # import fails as if not installed
    monkeypatch.delitem(importlib.import_module("fsspec.registry")._registry,
                        {"gs": "gcs", "az": "az", "s3": "s3", "https": "https"}[scheme], raising=False)
    with pytest.raises(MissingDependencyError, match=rf"pip install 'packer-shards\[{extra}\]'") as caught:
        packer.open_dataset(f"{scheme}://bucket/ds", remote=RemoteOptions(cache_dir=str(tmp_path)))
    assert package in caught.value.message or "filesystem" in caught.value.message


def test_obstore_clients_for_gs_and_az_are_built_without_a_request(tmp_path):
    pytest.importorskip("obstore")
    options = RemoteOptions(transport="obstore", cache_dir=str(tmp_path))
    gs = ObstoreTransport(parse_url("gs://bucket/ds"), options)
    assert type(gs.store).__name__ == "GCSStore"
    az = ObstoreTransport(parse_url("az://container/ds"), options.with_(storage_options={"account_name": "acct"}))
    assert type(az.store).__name__ == "AzureStore"


def test_an_az_url_without_an_account_is_a_typed_error(tmp_path):
    pytest.importorskip("obstore")
    with pytest.raises(OptionError, match="obstore client for az://container/ds: .*Account must be specified") as caught:
        ObstoreTransport(parse_url("az://container/ds"), RemoteOptions(transport="obstore", cache_dir=str(tmp_path)))
    assert caught.value.path == "az://container/ds"


def test_fsspec_maps_each_scheme_to_its_protocol(monkeypatch, tmp_path):
    fake = fake_fsspec_store(monkeypatch, "gcs", "gcsfs", "GCSFileSystem")
    transport = FsspecTransport(parse_url("gs://empty/p"), RemoteOptions(cache_dir=str(tmp_path)))
    assert isinstance(transport.fs, fake) and transport._path("p/manifest.json") == "empty/p/manifest.json"
    with pytest.raises(RemoteStoreError, match="GET manifest.json failed: .*not retried"):
        packer.open_dataset("gs://empty/p", remote=RemoteOptions(cache_dir=str(tmp_path), retries=1))
