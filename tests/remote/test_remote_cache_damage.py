"""The node cache proves what it serves (issue 38): an extent file's size and every sample's xxh3 are
checked when it is mapped, not only when it was written; a damaged file (truncated, emptied,
zeroed, a flipped byte, deleted) is fetched again once and the epoch gives the same bytes; damage
that comes back is a ChecksumMismatchError naming the object. The cached index and shard headers
are checked too. Before: the next epoch exited 0 with short or empty samples."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import options_for

import packer
from packer.errors import ChecksumMismatchError
from packer.remote.reader import RemoteFiles
from packer.remote.upload import upload_dataset
from packer.remote.url import parse_url


def _extent_files(cache: Path) -> list[Path]:
    found = []
    for folder, _dirs, files in os.walk(cache):
        if f"{os.sep}extents{os.sep}" in folder + os.sep:
            found.extend(Path(folder) / name for name in files if not name.startswith("."))
    return sorted(found)


def damage(path: Path, how: str) -> None:
    """Damage a cache file the way a failing disk or a stray program does."""
    data = bytearray(path.read_bytes())
    if how == "truncate":
        path.write_bytes(bytes(data[:len(data) // 3]))
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "zero":
        path.write_bytes(bytes(len(data)))
    elif how == "flip":  # a byte of the extent's first sample (the padding between samples is never served)
        data[3] ^= 0x40
        path.write_bytes(bytes(data))
    elif how == "delete":
        path.unlink()
    elif how == "extend":
        path.write_bytes(bytes(data) + b"\0" * 100)
    else:
        raise AssertionError(how)


@pytest.fixture
def cached(s3, small_dataset, tmp_path):
    """A dataset on the loopback server, read once through a node cache: (url, cache, expected bytes)."""
    url = f"s3://{s3.bucket}/ds"
    upload_dataset(small_dataset, parse_url(url), options_for(s3, tmp_path / "up"))
    cache = tmp_path / "cache"
    with packer.open_dataset(small_dataset) as local:
        expect = [bytes(local.get(i)) for i in range(len(local))]
    with packer.open_dataset(url, remote=options_for(s3, cache)) as remote:
        assert [bytes(remote.get(i)) for i in range(len(remote))] == expect
    return url, cache, expect


@pytest.mark.parametrize("how", ["truncate", "empty", "zero", "flip", "delete", "extend"])
def test_a_damaged_extent_is_fetched_again_once_and_the_epoch_is_whole(s3, cached, how):
    url, cache, expect = cached
    victims = _extent_files(cache)
    victim = victims[len(victims) // 2]
    damage(victim, how)
    shard, (start, end) = victim.parent.name, victim.name.split("-")
    s3.reset()
    with packer.open_dataset(url, remote=options_for(s3, cache)) as remote:  # the next epoch, another process
        assert [bytes(remote.get(i)) for i in range(len(remote))] == expect
        stats = remote.remote_stats()
    assert stats["downloads"] == 1 and stats["repaired"] == (0 if how == "delete" else 1), stats
    gets = [e for e in s3.log() if e["method"] == "GET" and "/shards/" in e["path"]]
    assert [e["range"] for e in gets] == [f"bytes={start}-{int(end) - 1}"], gets  # that extent, once
    assert victim.stat().st_size == int(end) - int(start)


def test_damage_that_comes_back_after_the_refetch_names_the_object(s3, cached, monkeypatch):
    url, cache, _expect = cached
    victim = _extent_files(cache)[0]
    damage(victim, "flip")
    fetch = RemoteFiles._fetch_now

    def fetch_then_damaged_again(self, family, extent, **kwargs):
        fetch(self, family, extent, **kwargs)
        damage(Path(self._extent_path(family, extent)), "zero")  # a disk that keeps failing

    monkeypatch.setattr(RemoteFiles, "_fetch_now", fetch_then_damaged_again)
    with packer.open_dataset(url, remote=options_for(s3, cache)) as remote:
        shard_path = remote.manifest.shards[int(victim.parent.name)].path
        with pytest.raises(ChecksumMismatchError) as caught:
            for i in range(len(remote)):
                remote.get(i)
    assert caught.value.path == f"{url}/{shard_path}"
    message = caught.value.message
    assert message.startswith(f"the node cache's copy of bytes {victim.name} of this object is damaged")
    assert "fetched again, it is damaged" in message and str(victim) in message


def test_a_damaged_cached_index_or_header_is_fetched_again(s3, cached):
    url, cache, expect = cached
    index = next(cache.rglob("index-*.pki"))
    damage(index, "flip")
    header = sorted(cache.rglob("headers/main-*"))[0]
    damage(header, "zero")
    s3.reset()
    with packer.open_dataset(url, remote=options_for(s3, cache)) as remote:
        assert [bytes(remote.get(i)) for i in range(len(remote))] == expect
        index_name, shard_name = remote.manifest.index.path, remote.manifest.shards[0].path
    paths = [(e["path"], e["range"]) for e in s3.log() if e["method"] == "GET"]
    assert sum(1 for path, _ in paths if path.endswith(index_name)) == 1  # the index, again, once
    assert any(path.endswith(shard_name) and rng == "bytes=0-63" for path, rng in paths)  # the header, again


@pytest.mark.parametrize("how", ["flip", "zero", "truncate"])
def test_a_file_this_process_checked_is_checked_again_once_it_changes(s3, cached, monkeypatch, how):
    """A reopened dataset does not hash again what this process already checked (the warm path of a
    restart loop), unless the file changed since (its inode, size, mtime or ctime)."""
    import time

    url, cache, expect = cached
    time.sleep(0.1)  # the files have settled (file times tick coarsely)
    with packer.open_dataset(url, remote=options_for(s3, cache)) as remote:
        assert [bytes(remote.get(i)) for i in range(len(remote))] == expect  # checked, remembered
    hashed = []
    check = RemoteFiles._first_bad_sample
    monkeypatch.setattr(RemoteFiles, "_first_bad_sample",
                        lambda self, family, extent, piece: hashed.append(extent) or check(self, family, extent, piece))
    with packer.open_dataset(url, remote=options_for(s3, cache)) as remote:
        assert [bytes(remote.get(i)) for i in range(len(remote))] == expect
    assert hashed == []  # nothing hashed twice
    damage(_extent_files(cache)[1], how)
    with packer.open_dataset(url, remote=options_for(s3, cache)) as remote:
        assert [bytes(remote.get(i)) for i in range(len(remote))] == expect
        assert remote.remote_stats()["repaired"] == 1
