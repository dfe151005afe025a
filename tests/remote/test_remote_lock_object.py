"""Where a store has no conditional writes (fsspec's gs:// and az://), the commit takes a lock object
(issue 38): a writer that finds another's fresh lock waits, then refuses with DatasetChangedError
naming the lock, committing nothing; a stale lock (a killed writer's) is taken over; the lock is
removed after the commit. Its documented limits are in docs/guides/object-storage.md."""

from __future__ import annotations

import json
import time

import pytest

from conftest import MemoryTransport, memory_store

import packer
from packer import format as fmt
from packer.errors import DatasetChangedError
from packer.remote import RemoteOptions, parse_url
from packer.remote import upload
from packer.remote.upload import LOCK_NAME, upload_dataset


@pytest.fixture
def unconditional(monkeypatch, tmp_path):
    transport = MemoryTransport()
    transport.conditional = False
    memory_store(monkeypatch, transport)
    monkeypatch.setattr(upload, "LOCK_STALE_S", 1.0)
    monkeypatch.setattr(upload, "LOCK_SETTLE_S", 0.05)
    return transport, RemoteOptions(cache_dir=str(tmp_path / "cache"))


def test_a_fresh_lock_of_another_writer_is_waited_for_then_refused(unconditional, small_dataset, monkeypatch):
    transport, options = unconditional
    url = parse_url("gs://bucket/ds")

    def held_by_another() -> None:  # another writer takes the lock, and keeps it fresh
        transport.objects[f"ds/{LOCK_NAME}"] = json.dumps({"token": "other", "time": time.time() + 3600}).encode()

    with pytest.raises(DatasetChangedError) as caught:
        upload_dataset(small_dataset, url, options, before_commit=held_by_another)
    assert caught.value.message == (f"another writer holds the lock object {LOCK_NAME} of this dataset (this store "
                                    f"has no conditional writes); nothing was committed")
    assert f"ds/{fmt.MANIFEST_NAME}" not in transport.objects  # nothing committed
    assert json.loads(transport.objects[f"ds/{LOCK_NAME}"])["token"] == "other"  # its lock left alone


def test_a_stale_lock_is_taken_over_and_the_lock_is_removed_after(unconditional, small_dataset):
    transport, options = unconditional
    url = parse_url("gs://bucket/ds")
    transport.objects[f"ds/{LOCK_NAME}"] = json.dumps({"token": "killed", "time": time.time() - 60}).encode()
    upload_dataset(small_dataset, url, options)
    assert f"ds/{fmt.MANIFEST_NAME}" in transport.objects and f"ds/{LOCK_NAME}" not in transport.objects
    with packer.open_dataset("gs://bucket/ds", remote=options) as remote, packer.open_dataset(small_dataset) as local:
        assert [bytes(remote.get(i)) for i in range(len(local))] == [bytes(local.get(i)) for i in range(len(local))]


def test_a_lock_packer_did_not_write_counts_as_stale(unconditional, small_dataset):
    transport, options = unconditional
    transport.objects[f"ds/{LOCK_NAME}"] = b"not json"
    upload_dataset(small_dataset, parse_url("gs://bucket/ds"), options)
    assert f"ds/{fmt.MANIFEST_NAME}" in transport.objects
