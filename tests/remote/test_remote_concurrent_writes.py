"""Writes to one URL cannot lose each other (issues 38 and 41): two real processes append (or
overwrite) at once, both having compared the manifest before either writes it; the manifest write
is conditional (If-Match on the ETag compared), so the second fails with DatasetChangedError and
nothing of the first is lost; run again, it lands on top. Two runs from one node share a staging
folder: the second is refused at once. Before: both exited 0 and the first one's samples were gone.

The children hold at a barrier right after their commit-time read of the manifest (a wrapper of
``packer.remote.upload._current_manifest``, which reads it): the first writes at once, the second a
second later, so the race the precondition must catch happens every run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import check_loopback, options_for
from helpers import write_images

import packer
from packer.remote.upload import upload_dataset
from packer.remote.url import parse_url

REPO = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent('''
    import json, os, sys, time
    from pathlib import Path
    kind, url, source, cache, barrier, me, other, delay, endpoint = sys.argv[1:10]
    import packer
    import packer.remote.upload as upload
    from packer.remote import RemoteOptions
    from packer.errors import PackerError

    original = upload._current_manifest
    calls = [0]

    def held(store):
        answer = original(store)
        calls[0] += 1
        if calls[0] == 2:  # the commit-time read (the first is before the objects go up)
            Path(barrier, me).touch()
            deadline = time.monotonic() + 60
            while not Path(barrier, other).exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(float(delay))
        return answer

    upload._current_manifest = held
    options = RemoteOptions(endpoint_url=endpoint, region="us-east-1", cache_dir=cache, backoff_s=0.01,
                            timeout_s=30.0, extent_bytes=64 << 10, request_bytes=256 << 10)
    try:
        if kind == "append":
            packer.append_dataset(url, source, run=packer.RunOptions(workers=1, remote=options))
        else:
            packer.build_dataset(source, url, packer.BuildSettings(layout=packer.LayoutSettings(shard_size=32 << 10)),
                                 packer.RunOptions(workers=1, overwrite=True, remote=options))
        print(json.dumps({"ok": True}))
    except PackerError as exc:
        print(json.dumps({"ok": False, "error": type(exc).__name__, "message": exc.message}))
''')


def _children(tmp_path, s3, kind, url, sources, caches, delays):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    barrier = tmp_path / "barrier"
    barrier.mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_EC2_METADATA_DISABLED": "true"}
    env.pop("AWS_ENDPOINT_URL", None)
    processes = [subprocess.Popen([sys.executable, str(script), kind, url, str(sources[k]), str(caches[k]),
                                   str(barrier), f"p{k}", f"p{1 - k}", str(delays[k]), check_loopback(s3.proxy)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
                 for k in range(2)]
    results = []
    for process in processes:
        out, err = process.communicate(timeout=240)
        assert process.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def _keys(dataset) -> list[str]:
    return sorted(dataset.key(i) for i in range(len(dataset)))


@pytest.mark.timeout(300)
def test_two_appends_at_once_from_two_nodes_lose_nothing(s3, small_dataset, tmp_path):
    url = f"s3://{s3.bucket}/ds"
    upload_dataset(small_dataset, parse_url(url), options_for(s3, tmp_path / "up"))
    write_images(tmp_path / "first", {"fox": 5}, seed=21)
    write_images(tmp_path / "second", {"gnu": 4}, seed=22)
    first, second = _children(tmp_path, s3, "append", url, [tmp_path / "first", tmp_path / "second"],
                              [tmp_path / "node-a", tmp_path / "node-b"], [0.0, 1.5])
    assert first == {"ok": True}, first
    assert second["ok"] is False and second["error"] == "DatasetChangedError", second
    assert "nothing was committed" in second["message"], second
    with packer.open_dataset(url, remote=options_for(s3, tmp_path / "check")) as dataset:
        assert len(dataset) == 125 and "fox" in dataset.classes and "gnu" not in dataset.classes
        assert all(len(dataset.get(i)) for i in range(len(dataset)))  # every object the manifest names is there
    # the loser runs again: it lands on top of the winner's generation, both kept
    packer.append_dataset(url, tmp_path / "second", run=packer.RunOptions(workers=1, remote=options_for(
        s3, tmp_path / "node-b")))
    with packer.open_dataset(url, remote=options_for(s3, tmp_path / "check2")) as dataset, \
            packer.open_dataset(small_dataset) as base:
        assert len(dataset) == 129 and {"fox", "gnu"} <= set(dataset.classes)
        assert set(_keys(base)) < set(_keys(dataset))
        assert [bytes(dataset.get(i)) for i in range(len(base))] == [bytes(base.get(i)) for i in range(len(base))]


@pytest.mark.timeout(300)
def test_two_overwrites_at_once_the_second_fails_and_the_first_is_whole(s3, small_dataset, tmp_path):
    url = f"s3://{s3.bucket}/ds"
    upload_dataset(small_dataset, parse_url(url), options_for(s3, tmp_path / "up"))
    write_images(tmp_path / "first", {"fox": 5}, seed=21)
    write_images(tmp_path / "second", {"gnu": 4}, seed=22)
    first, second = _children(tmp_path, s3, "build", url, [tmp_path / "first", tmp_path / "second"],
                              [tmp_path / "node-a", tmp_path / "node-b"], [0.0, 1.5])
    assert first == {"ok": True}, first
    assert second["ok"] is False and second["error"] == "DatasetChangedError", second
    with packer.open_dataset(url, remote=options_for(s3, tmp_path / "check")) as dataset:
        assert dataset.classes == ("fox",) and len(dataset) == 5
        assert all(len(dataset.get(i)) for i in range(len(dataset)))


@pytest.mark.timeout(300)
def test_a_second_write_from_the_same_node_is_refused_at_once(s3, small_dataset, tmp_path):
    url = f"s3://{s3.bucket}/ds"
    upload_dataset(small_dataset, parse_url(url), options_for(s3, tmp_path / "up"))
    write_images(tmp_path / "first", {"fox": 5}, seed=21)
    write_images(tmp_path / "second", {"gnu": 4}, seed=22)
    node = tmp_path / "node"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("AWS_ENDPOINT_URL", None)
    holder = subprocess.Popen([sys.executable, str(script), "append", url, str(tmp_path / "first"), str(node),
                               str(barrier), "p0", "p1", "0", check_loopback(s3.proxy)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        import time

        deadline = time.monotonic() + 120
        while not (barrier / "p0").exists() and time.monotonic() < deadline:  # the first holds, mid-commit
            time.sleep(0.05)
        assert (barrier / "p0").exists()
        from packer.errors import BuildLockedError

        with pytest.raises(BuildLockedError, match="another packer build or append on this node is writing this URL"):
            packer.append_dataset(url, tmp_path / "second", run=packer.RunOptions(workers=1, remote=options_for(s3, node)))
        (barrier / "p1").touch()  # let the first finish
        out, err = holder.communicate(timeout=120)
    finally:
        holder.kill() if holder.poll() is None else None
    assert json.loads(out.strip().splitlines()[-1]) == {"ok": True}, err[-2000:]
    with packer.open_dataset(url, remote=options_for(s3, tmp_path / "check")) as dataset:
        assert len(dataset) == 125


# --- the same races in this process, at each point a writer can find the other (MemoryTransport) ------

def _racing_store(monkeypatch, tmp_path):
    from conftest import MemoryTransport, memory_store

    transport = MemoryTransport()
    memory_store(monkeypatch, transport)
    return transport, packer.remote.RemoteOptions(cache_dir=str(tmp_path / "cache"))


def _other_manifest(small_dataset) -> bytes:
    return (small_dataset / "manifest.json").read_bytes().replace(b"{", b"{ ", 1)


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_manifest_that_appears_or_changes_during_the_upload_is_found_before_the_commit(
        monkeypatch, tmp_path, small_dataset, overwrite):
    from packer.errors import DatasetChangedError, OutputExistsError

    transport, options = _racing_store(monkeypatch, tmp_path)
    url = parse_url("s3://bucket/ds")
    if overwrite:
        transport.objects["ds/manifest.json"] = b"{}"  # a dataset to replace (not a valid one: nothing retired)

    def another_writer_commits() -> None:
        transport.objects["ds/manifest.json"] = _other_manifest(small_dataset)

    expected = DatasetChangedError if overwrite else OutputExistsError
    with pytest.raises(expected) as caught:
        upload_dataset(small_dataset, url, options, overwrite=overwrite, before_commit=another_writer_commits)
    assert caught.value.message == (
        "the dataset changed while the overwrite was being uploaded (another writer committed first); nothing was "
        "committed: run it again to replace that generation" if overwrite else
        "another writer created a dataset here while this one was being uploaded; nothing was committed (pass "
        "--overwrite to replace it)")
    assert transport.objects["ds/manifest.json"] == _other_manifest(small_dataset)  # the other one's stays


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_manifest_written_between_the_compare_and_the_write_fails_the_precondition(
        monkeypatch, tmp_path, small_dataset, overwrite):
    """The narrowest race: the other writer's manifest lands after this one compared and before it
    writes; the store's precondition (If-None-Match / If-Match) refuses this write."""
    from packer.errors import DatasetChangedError, OutputExistsError

    transport, options = _racing_store(monkeypatch, tmp_path)
    url = parse_url("s3://bucket/ds")
    if overwrite:
        transport.objects["ds/manifest.json"] = b"{}"
    put = transport.put_bytes

    def raced(key, data, **condition):  # type: ignore[no-untyped-def]
        if key.endswith("manifest.json"):
            transport.objects[key] = _other_manifest(small_dataset)  # landed a moment earlier
        put(key, data, **condition)

    monkeypatch.setattr(transport, "put_bytes", raced)
    with pytest.raises(DatasetChangedError if overwrite else OutputExistsError) as caught:
        upload_dataset(small_dataset, url, options, overwrite=overwrite)
    assert ("the manifest's precondition failed" if overwrite else "while this one was committing") \
        in caught.value.message
    assert transport.objects["ds/manifest.json"] == _other_manifest(small_dataset)
