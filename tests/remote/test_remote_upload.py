"""Writing to object storage (``packer.remote.upload``) against an in-memory S3
(``conftest.MemoryTransport``): which objects an upload sends, skips and counts, which precondition
the manifest is written on, which refusal a race or an existing dataset gets (and that nothing is
committed then), exactly which objects an overwrite records and deletes, the lock object of a store
without conditional writes, and what ``mirror`` copies."""

from __future__ import annotations

import json
import time
import types
from pathlib import Path
from typing import Any

import pytest

from conftest import MemoryTransport, memory_store
from helpers import write_images

import packer
from packer import format as fmt
from packer.errors import DatasetChangedError, OutputExistsError, RemoteStoreError, UnsafePathError
from packer.remote import RemoteOptions, parse_url
from packer.remote import upload
from packer.remote.store import ObjectInfo, Store
from packer.remote.upload import (LOCK_NAME, REPLACED_NAME, UploadReport, dataset_objects, mirror, retire,
                                  retire_names, upload_dataset)

URL = parse_url("s3://bucket/ds")


def _build(root: Path, name: str, counts: dict[str, int], seed: int) -> Path:
    write_images(root / f"{name}-src", counts, size=16, seed=seed)
    packer.build_dataset(root / f"{name}-src", root / name, packer.BuildSettings(
        codec="raw:size=16x16", layout=packer.LayoutSettings(shard_size=8 << 10, seed=seed, alignment=4096)),
        packer.RunOptions(workers=1))
    return root / name


@pytest.fixture(scope="module")
def generations(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three small datasets with no shard in common (A, B, C), each 4-5 shards, an index and a report."""
    root = tmp_path_factory.mktemp("generations")
    return {"A": _build(root, "A", {"a": 3, "b": 2}, 1), "B": _build(root, "B", {"a": 2, "b": 2}, 2),
            "C": _build(root, "C", {"c": 4}, 3)}


class Recording(MemoryTransport):
    """MemoryTransport that logs each write and delete with its keyword arguments."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, str, dict[str, Any]]] = []

    def put_file(self, key: str, path: str) -> None:
        self.log.append(("put_file", key, {}))
        super().put_file(key, path)

    def put_bytes(self, key: str, data: bytes, **kwargs: Any) -> None:
        self.log.append(("put_bytes", key, {k: v for k, v in kwargs.items()}))
        super().put_bytes(key, data, **kwargs)

    def delete(self, key: str) -> None:
        self.log.append(("delete", key, {}))
        super().delete(key)


@pytest.fixture
def memory(monkeypatch, tmp_path) -> tuple[Recording, RemoteOptions]:
    transport = Recording()
    memory_store(monkeypatch, transport)
    return transport, RemoteOptions(cache_dir=str(tmp_path / "cache"), backoff_s=0.001, request_bytes=4096,
                                    extent_bytes=4096)


def _files(folder: Path) -> dict[str, int]:
    """What a dataset's manifest names, with sizes."""
    manifest = fmt.parse_manifest((folder / fmt.MANIFEST_NAME).read_bytes())
    return dict(dataset_objects(manifest))


def _stored(transport: MemoryTransport) -> set[str]:
    return {key[len("ds/"):] for key in transport.objects if key.startswith("ds/")}


def _etag(data: bytes) -> str:
    """The ETag MemoryTransport gives ``data`` (S3's: the MD5 of the bytes, quoted)."""
    return MemoryTransport._etag(types.SimpleNamespace(objects={"k": data}), "k")  # type: ignore[arg-type]


def _manifest_writes(transport: Recording) -> list[dict[str, Any]]:
    return [kwargs for kind, key, kwargs in transport.log if kind == "put_bytes" and key == f"ds/{fmt.MANIFEST_NAME}"]


# --- what an upload sends -------------------------------------------------------------------------


def test_a_new_upload_sends_every_object_then_the_manifest_on_if_absent(memory, generations):
    transport, options = memory
    files = _files(generations["A"])
    seen: list[tuple[str, int]] = []
    report = upload_dataset(generations["A"], URL, options, on_object=lambda name, size: seen.append((name, size)),
                            workers=0)
    report_size = (generations["A"] / fmt.REPORT_NAME).stat().st_size
    assert sorted(report.uploaded[:-1]) == sorted([*files, fmt.REPORT_NAME])
    assert report.uploaded[-1] == fmt.MANIFEST_NAME
    assert report.skipped == [] and report.deleted == [] and report.retained == []
    assert report.bytes_uploaded == sum(files.values()) + report_size
    assert sorted(seen) == sorted(list(files.items()) + [(fmt.REPORT_NAME, report_size)])
    assert report.url == "s3://bucket/ds"
    assert _stored(transport) == set(files) | {fmt.REPORT_NAME, fmt.MANIFEST_NAME}
    assert transport.objects[f"ds/{fmt.MANIFEST_NAME}"] == (generations["A"] / fmt.MANIFEST_NAME).read_bytes()
    assert _manifest_writes(transport) == [{"if_absent": True}]
    assert [entry[1] for entry in transport.log][-1] == f"ds/{fmt.MANIFEST_NAME}"  # the commit record last


def test_a_dataset_objects_lists_shards_field_shards_then_the_index():
    entry = lambda path, size: types.SimpleNamespace(path=path, size=size)  # noqa: E731
    manifest = types.SimpleNamespace(
        shards=[entry("shards/a", 1), entry("shards/b", 2)],
        fields=[types.SimpleNamespace(shards=[entry("fields/m/s", 3)]), types.SimpleNamespace(shards=None),
                types.SimpleNamespace()],
        index=entry("index.pki", 4))
    assert dataset_objects(manifest) == [("shards/a", 1), ("shards/b", 2), ("fields/m/s", 3), ("index.pki", 4)]


def test_an_upload_again_skips_what_is_there_and_writes_no_manifest(memory, generations):
    transport, options = memory
    upload_dataset(generations["A"], URL, options)
    transport.log.clear()
    report = upload_dataset(generations["A"], URL, options)
    assert sorted(report.skipped) == sorted(_files(generations["A"]))
    assert report.uploaded == [fmt.REPORT_NAME, fmt.MANIFEST_NAME]  # the report is always sent again
    assert report.bytes_uploaded == (generations["A"] / fmt.REPORT_NAME).stat().st_size
    assert [entry[:2] for entry in transport.log] == [("put_file", f"ds/{fmt.REPORT_NAME}")]


def test_an_object_of_another_size_is_sent_again(memory, generations):
    transport, options = memory
    files = _files(generations["A"])
    shard = sorted(name for name in files if name.startswith("shards/"))[0]
    transport.objects[f"ds/{shard}"] = b"short"
    other = sorted(name for name in files if name.startswith("shards/"))[1]
    transport.objects[f"ds/{other}"] = b"y" * files[other]  # the same size: taken as sent (the resume rule)
    report = upload_dataset(generations["A"], URL, options)
    assert shard in report.uploaded and other in report.skipped
    assert transport.objects[f"ds/{shard}"] == (generations["A"] / shard).read_bytes()


def test_a_read_only_url_is_refused_before_anything_is_read(memory, generations):
    transport, options = memory
    with pytest.raises(RemoteStoreError) as caught:
        upload_dataset(generations["A"], parse_url("https://127.0.0.1:9/ds"), options)
    assert caught.value.message == "https:// URLs are read-only; build to s3://, gs:// or az://"
    assert caught.value.path == "https://127.0.0.1:9/ds"
    assert transport.calls == {}


# --- refusals and races ---------------------------------------------------------------------------


def test_an_upload_over_a_dataset_needs_overwrite(memory, generations):
    transport, options = memory
    upload_dataset(generations["A"], URL, options)
    before = dict(transport.objects)
    transport.log.clear()
    with pytest.raises(OutputExistsError) as caught:
        upload_dataset(generations["B"], URL, options)
    assert caught.value.message == "a dataset is already here; pass --overwrite to replace it, or use `packer append`"
    assert caught.value.path == "s3://bucket/ds"
    assert transport.objects == before and transport.log == []


def test_an_append_whose_base_changed_is_refused_at_once(memory, generations):
    transport, options = memory
    upload_dataset(generations["A"], URL, options)
    transport.log.clear()
    with pytest.raises(DatasetChangedError) as caught:
        upload_dataset(generations["B"], URL, options, expect_manifest=b"{}")
    assert caught.value.message == ("the dataset changed while the append was being built (its manifest is not the "
                                    "one the new generation extends); nothing was committed")
    assert caught.value.path == "s3://bucket/ds"
    assert transport.log == []


def test_an_append_commits_on_the_etag_of_its_base_and_deletes_nothing(memory, generations):
    transport, options = memory
    upload_dataset(generations["A"], URL, options)
    base = transport.objects[f"ds/{fmt.MANIFEST_NAME}"]
    etag = transport._etag(f"ds/{fmt.MANIFEST_NAME}")
    transport.log.clear()
    report = upload_dataset(generations["B"], URL, options, expect_manifest=base)
    assert _manifest_writes(transport) == [{"if_match": ObjectInfo(size=len(base), etag=etag)}]
    assert report.deleted == [] and report.retained == []
    assert f"ds/{REPLACED_NAME}" not in transport.objects
    assert transport.objects[f"ds/{fmt.MANIFEST_NAME}"] == (generations["B"] / fmt.MANIFEST_NAME).read_bytes()


def test_an_append_whose_base_changes_during_the_upload_commits_nothing(memory, generations):
    transport, options = memory
    upload_dataset(generations["A"], URL, options)
    base = transport.objects[f"ds/{fmt.MANIFEST_NAME}"]

    def another_writer() -> None:
        transport.objects[f"ds/{fmt.MANIFEST_NAME}"] = (generations["C"] / fmt.MANIFEST_NAME).read_bytes()

    with pytest.raises(DatasetChangedError) as caught:
        upload_dataset(generations["B"], URL, options, expect_manifest=base, before_commit=another_writer)
    assert caught.value.message == ("the dataset changed while the append was being uploaded (another writer "
                                    "committed first); nothing was committed: run the append again")
    assert caught.value.path == "s3://bucket/ds"
    assert transport.objects[f"ds/{fmt.MANIFEST_NAME}"] == (generations["C"] / fmt.MANIFEST_NAME).read_bytes()


def test_a_dataset_created_during_a_new_upload_is_not_overwritten(memory, generations):
    transport, options = memory

    def another_writer() -> None:
        transport.objects[f"ds/{fmt.MANIFEST_NAME}"] = (generations["C"] / fmt.MANIFEST_NAME).read_bytes()

    with pytest.raises(OutputExistsError) as caught:
        upload_dataset(generations["A"], URL, options, before_commit=another_writer)
    assert caught.value.message == ("another writer created a dataset here while this one was being uploaded; nothing "
                                    "was committed (pass --overwrite to replace it)")
    assert caught.value.path == "s3://bucket/ds"
    assert _manifest_writes(transport) == []


def test_an_overwrite_raced_by_another_commit_is_refused(memory, generations):
    transport, options = memory
    upload_dataset(generations["A"], URL, options)

    def another_writer() -> None:
        transport.objects[f"ds/{fmt.MANIFEST_NAME}"] = (generations["C"] / fmt.MANIFEST_NAME).read_bytes()

    transport.log.clear()
    with pytest.raises(DatasetChangedError) as caught:
        upload_dataset(generations["B"], URL, options, overwrite=True, before_commit=another_writer)
    assert caught.value.message == ("the dataset changed while the overwrite was being uploaded (another writer "
                                    "committed first); nothing was committed: run it again to replace that "
                                    "generation")
    assert caught.value.path == "s3://bucket/ds"
    assert _manifest_writes(transport) == [] and not any(kind == "delete" for kind, _, _ in transport.log)


class _LosesTheRace(Recording):
    """A store where another writer's manifest lands between the compare and the conditional write."""

    def put_bytes(self, key: str, data: bytes, **kwargs: Any) -> None:
        if key.endswith(fmt.MANIFEST_NAME) and kwargs:
            self.objects[key] = b'{"another": "writer"}'
        super().put_bytes(key, data, **kwargs)


@pytest.mark.parametrize("first", [False, True])
def test_a_manifest_written_between_the_compare_and_the_write_fails_its_precondition(monkeypatch, tmp_path,
                                                                                    generations, first):
    transport = _LosesTheRace()
    memory_store(monkeypatch, transport)
    options = RemoteOptions(cache_dir=str(tmp_path / "cache"), backoff_s=0.001)
    if first:
        with pytest.raises(OutputExistsError) as caught:
            upload_dataset(generations["A"], URL, options)
        assert caught.value.message == ("another writer created a dataset here while this one was committing; nothing "
                                        "was committed (pass --overwrite to replace it)")
    else:
        transport.objects[f"ds/{fmt.MANIFEST_NAME}"] = (generations["A"] / fmt.MANIFEST_NAME).read_bytes()
        with pytest.raises(DatasetChangedError) as caught:
            upload_dataset(generations["B"], URL, options, overwrite=True)
        assert caught.value.message == ("another writer committed a new generation while this one was committing (the "
                                        "manifest's precondition failed); nothing was committed, the other generation "
                                        "is whole: run this write again")
    assert caught.value.path == "s3://bucket/ds"
    assert transport.objects[f"ds/{fmt.MANIFEST_NAME}"] == b'{"another": "writer"}'


def test_a_store_without_preconditions_writes_plainly_under_the_lock(memory, generations, monkeypatch):
    transport, options = memory
    transport.conditional = False
    monkeypatch.setattr(upload, "LOCK_SETTLE_S", 0.0)
    upload_dataset(generations["A"], URL, options)
    assert _manifest_writes(transport) == [{}]
    locks = [(kind, kwargs) for kind, key, kwargs in transport.log if key == f"ds/{LOCK_NAME}"]
    assert locks == [("put_bytes", {}), ("delete", {})]


def test_a_manifest_without_version_tokens_is_replaced_without_a_precondition(memory, generations, monkeypatch):
    transport, options = memory
    upload_dataset(generations["A"], URL, options)
    monkeypatch.setattr(upload, "LOCK_SETTLE_S", 0.0)
    head = transport.head
    transport.head = lambda key: ObjectInfo(size=head(key).size, etag=None)  # type: ignore[method-assign]
    transport.log.clear()
    upload_dataset(generations["B"], URL, options, overwrite=True)
    assert _manifest_writes(transport) == [{}]


# --- generation deletes ---------------------------------------------------------------------------


def test_overwrites_keep_the_replaced_generation_and_delete_the_one_before(memory, generations):
    transport, options = memory
    a, b, c = (set(_files(generations[name])) for name in "ABC")
    assert not (a & b) and not (b & c) and not (a & c)
    upload_dataset(generations["A"], URL, options)
    report = upload_dataset(generations["B"], URL, options, overwrite=True)
    assert report.deleted == [] and report.retained == sorted(a)
    old_manifest = (generations["A"] / fmt.MANIFEST_NAME).read_bytes()
    assert _manifest_writes(transport)[-1] == {"if_match": ObjectInfo(size=len(old_manifest), etag=_etag(old_manifest))}
    record = json.loads(transport.objects[f"ds/{REPLACED_NAME}"])
    assert record == {"version": 1, "objects": sorted(a), "generation": fmt.checksum_hex(fmt.checksum(
        (generations["A"] / fmt.MANIFEST_NAME).read_bytes()))}
    assert a | b <= _stored(transport)  # a reader of A keeps reading
    transport.log.clear()
    report = upload_dataset(generations["C"], URL, options, overwrite=True)
    assert report.deleted == sorted(a) and report.retained == sorted(b)
    assert sorted(key[3:] for kind, key, _ in transport.log if kind == "delete") == sorted(a)
    assert _stored(transport) == b | c | {fmt.MANIFEST_NAME, fmt.REPORT_NAME, REPLACED_NAME}
    assert json.loads(transport.objects[f"ds/{REPLACED_NAME}"])["objects"] == sorted(b)
    record_writes = [kwargs for kind, key, kwargs in transport.log if key == f"ds/{REPLACED_NAME}"]
    assert list(record_writes[0]) == ["if_match"]


def test_an_overwrite_back_to_an_older_generation_deletes_none_of_it(memory, generations):
    transport, options = memory
    a, b = set(_files(generations["A"])), set(_files(generations["B"]))
    upload_dataset(generations["A"], URL, options)
    upload_dataset(generations["B"], URL, options, overwrite=True)
    report = upload_dataset(generations["A"], URL, options, overwrite=True)
    assert report.deleted == [] and report.retained == sorted(b)
    assert a | b <= _stored(transport)


def test_retire_deletes_the_record_minus_both_generations_and_the_current_manifest(memory, generations):
    transport, options = memory
    store = Store(URL, options, transport=transport)
    c = set(_files(generations["C"]))
    transport.objects[f"ds/{fmt.MANIFEST_NAME}"] = (generations["C"] / fmt.MANIFEST_NAME).read_bytes()
    for name in ("x", "y", "z", "w", *c):
        transport.objects[f"ds/{name}"] = b"1"
    transport.objects[f"ds/{REPLACED_NAME}"] = json.dumps({"objects": ["x", "y", "z", "w", *sorted(c)]}).encode()
    deleted, retained = retire_names(store, URL, {"y", "q"}, {"z"}, "gen")
    assert deleted == ["w", "x"]  # y is the replaced one's, z the new one's, c's the current manifest's
    assert retained == ["q", "y"]
    assert _stored(transport) >= {"y", "z"} | c and not ({"w", "x"} & _stored(transport))
    assert json.loads(transport.objects[f"ds/{REPLACED_NAME}"]) == {"generation": "gen", "objects": ["q", "y"],
                                                                     "version": 1}


@pytest.mark.parametrize("record", [b"not json", b"[]", b'{"objects": "x"}', b'{"objects": ["x", 3]}',
                                    b'{"other": ["x"]}', b""])
def test_a_record_that_is_not_one_names_no_object(memory, record):
    transport, options = memory
    store = Store(URL, options, transport=transport)
    transport.objects.update({"ds/x": b"1", f"ds/{REPLACED_NAME}": record})
    deleted, retained = retire_names(store, URL, {"old"}, {"new"}, "g")
    assert (deleted, retained) == ([], ["old"])
    assert "ds/x" in transport.objects
    assert [kwargs for kind, key, kwargs in transport.log if key == f"ds/{REPLACED_NAME}"] == [
        {"if_match": ObjectInfo(size=len(record), etag=_etag(record))}]


def test_the_first_record_is_written_if_absent_and_a_lost_race_deletes_nothing(memory):
    transport, options = memory
    store = Store(URL, options, transport=transport)
    assert retire_names(store, URL, {"b", "a"}, {"c"}, "g") == ([], ["a", "b"])
    assert transport.log == [("put_bytes", f"ds/{REPLACED_NAME}", {"if_absent": True})]
    transport.objects["ds/gone-soon"] = b"1"
    transport.objects[f"ds/{REPLACED_NAME}"] = json.dumps({"objects": ["gone-soon"]}).encode()
    original = transport.put_bytes

    def changed_meanwhile(key: str, data: bytes, **kwargs: Any) -> None:
        transport.objects[key] = b'{"objects": []}'
        original(key, data, **kwargs)

    transport.put_bytes = changed_meanwhile  # type: ignore[method-assign]
    assert retire_names(store, URL, {"old"}, {"new"}, "g") == ([], ["old"])
    assert "ds/gone-soon" in transport.objects


def test_a_record_without_preconditions_is_written_plainly(memory):
    transport, options = memory
    transport.conditional = False
    store = Store(URL, options, transport=transport)
    transport.objects.update({"ds/x": b"1", f"ds/{REPLACED_NAME}": b'{"objects": ["x"]}'})
    assert retire_names(store, URL, {"old"}, set(), "g") == (["x"], ["old"])
    assert [entry for entry in transport.log if entry[1] == f"ds/{REPLACED_NAME}"] == [
        ("put_bytes", f"ds/{REPLACED_NAME}", {})]


def test_a_recorded_name_out_of_the_dataset_is_never_deleted(memory):
    transport, options = memory
    store = Store(URL, options, transport=transport)
    transport.objects.update({"ds/x": b"1", f"ds/{REPLACED_NAME}": b'{"objects": ["../escape", "x"]}'})
    with pytest.raises(UnsafePathError, match="'../escape' does not stay inside the dataset") as caught:
        retire_names(store, URL, set(), set(), "g")
    assert caught.value.path == "s3://bucket/ds"
    assert "ds/x" in transport.objects and not any(kind == "delete" for kind, _, _ in transport.log)


def test_retire_needs_two_manifests_that_parse(memory, generations):
    transport, options = memory
    store = Store(URL, options, transport=transport)
    good = (generations["A"] / fmt.MANIFEST_NAME).read_bytes()
    assert retire(store, URL, b"{}", good) == ([], [])
    assert retire(store, URL, good, b"not json") == ([], [])
    assert transport.log == []
    deleted, retained = retire(store, URL, good, (generations["B"] / fmt.MANIFEST_NAME).read_bytes())
    assert deleted == [] and retained == sorted(_files(generations["A"]))
    assert json.loads(transport.objects[f"ds/{REPLACED_NAME}"])["generation"] == fmt.checksum_hex(fmt.checksum(good))


def test_upload_report_defaults():
    report = UploadReport(url="u")
    assert (report.uploaded, report.skipped, report.bytes_uploaded, report.deleted, report.retained) == (
        [], [], 0, [], [])
    assert UploadReport(url="v").uploaded is not report.uploaded


# --- the lock object ------------------------------------------------------------------------------


@pytest.fixture
def lock_store(memory, monkeypatch):
    transport, options = memory
    transport.conditional = False
    monkeypatch.setattr(upload, "LOCK_SETTLE_S", 0.01)
    monkeypatch.setattr(upload, "LOCK_STALE_S", 0.2)
    return transport, Store(URL, options, transport=transport)


def test_a_conditional_store_takes_no_lock(memory):
    transport, options = memory
    with upload._CommitGuard(Store(URL, options, transport=transport), URL) as guard:
        assert guard.held is False
    assert transport.calls == {}


def test_the_lock_is_taken_held_and_removed(lock_store):
    transport, store = lock_store
    guard = upload._CommitGuard(store, URL)
    assert guard.token.count(":") == 2 and len(guard.token.rsplit(":", 1)[1]) == 32
    with guard:
        holder = json.loads(transport.objects[f"ds/{LOCK_NAME}"])
        assert holder["token"] == guard.token and abs(holder["time"] - time.time()) < 5
        assert guard.held is True
    assert f"ds/{LOCK_NAME}" not in transport.objects and guard.held is False


def test_a_lock_taken_over_meanwhile_is_left_to_its_holder(lock_store):
    transport, store = lock_store
    with upload._CommitGuard(store, URL):
        transport.objects[f"ds/{LOCK_NAME}"] = json.dumps({"token": "other", "time": time.time()}).encode()
    assert json.loads(transport.objects[f"ds/{LOCK_NAME}"])["token"] == "other"
    with upload._CommitGuard(store, URL) as guard:
        del transport.objects[f"ds/{LOCK_NAME}"]
    assert guard.held is False


def test_a_fresh_lock_is_waited_for_until_it_goes_stale(lock_store):
    transport, store = lock_store
    transport.objects[f"ds/{LOCK_NAME}"] = json.dumps({"token": "other", "time": time.time()}).encode()
    started = time.monotonic()
    with upload._CommitGuard(store, URL) as guard:
        assert json.loads(transport.objects[f"ds/{LOCK_NAME}"])["token"] == guard.token
    assert time.monotonic() - started >= 0.2


def test_a_lock_that_stays_fresh_is_refused_after_the_stale_time(lock_store):
    transport, store = lock_store
    transport.objects[f"ds/{LOCK_NAME}"] = json.dumps({"token": "other", "time": time.time() + 3600}).encode()
    started = time.monotonic()
    with pytest.raises(DatasetChangedError) as caught:
        with upload._CommitGuard(store, URL):
            pass
    assert 0.2 <= time.monotonic() - started < 5
    assert caught.value.path == "s3://bucket/ds"
    assert json.loads(transport.objects[f"ds/{LOCK_NAME}"])["token"] == "other"


def test_a_lock_whose_write_another_overwrote_is_not_held(lock_store, monkeypatch):
    transport, store = lock_store
    guard = upload._CommitGuard(store, URL)
    original = transport.put_bytes
    writes = []

    def overwritten(key: str, data: bytes, **kwargs: Any) -> None:
        original(key, data, **kwargs)
        writes.append(key)
        if len(writes) == 1:  # the first write is overwritten by a fresh writer's
            transport.objects[key] = json.dumps({"token": "other", "time": time.time()}).encode()

    transport.put_bytes = overwritten  # type: ignore[method-assign]
    with guard:
        assert guard.held and len(writes) == 2  # waited for the other lock to go stale, then took it


@pytest.mark.parametrize("data, holder", [
    (b"", None), (b"not json", {"token": "?", "time": 0}), (b"[1]", {"token": "?", "time": 0}),
    (b'{"time": "soon"}', {"token": "?", "time": 0}), (b'{"token": "t"}', {"token": "t"}),
    (b'{"token": "t", "time": 5}', {"token": "t", "time": 5}),
])
def test_what_a_lock_object_says(lock_store, data, holder):
    transport, store = lock_store
    if data:
        transport.objects[f"ds/{LOCK_NAME}"] = data
    assert upload._CommitGuard(store, URL)._holder() == holder


# --- mirror ---------------------------------------------------------------------------------------


def test_mirror_copies_each_object_at_its_stored_size(memory, generations, tmp_path):
    transport, options = memory
    upload_dataset(generations["A"], URL, options)
    files = _files(generations["A"])
    shards = sorted(name for name in files if name.startswith("shards/"))
    transport.objects[f"ds/{shards[0]}"] = transport.objects[f"ds/{shards[0]}"][:5000]  # short: copied short
    del transport.objects[f"ds/{shards[1]}"]  # missing: left out, for verify to report
    transport.calls.clear()
    target = mirror(URL, options.with_(request_bytes=4096), tmp_path / "copy", workers=0)
    assert target == tmp_path / "copy"
    assert (target / fmt.MANIFEST_NAME).read_bytes() == (generations["A"] / fmt.MANIFEST_NAME).read_bytes()
    assert (target / shards[0]).read_bytes() == (generations["A"] / shards[0]).read_bytes()[:5000]
    assert not (target / shards[1]).exists()
    for name in set(files) - set(shards[:2]):
        assert (target / name).read_bytes() == (generations["A"] / name).read_bytes(), name
    # the manifest, then each object in ranges of request_bytes (8 KiB shards: 2; the short one: 2)
    sizes = [len(data) for key, data in transport.objects.items() if key[3:] in files]
    assert transport.calls["get_range"] == 1 + sum(-(-size // 4096) for size in sizes)
    assert transport.calls["head"] == len(files)


def test_mirror_of_a_url_without_a_dataset_is_refused(memory, tmp_path):
    _transport, options = memory
    with pytest.raises(RemoteStoreError, match=r"GET manifest.json failed: .*the object does not exist"):
        mirror(URL, options, tmp_path / "copy")


def test_mirror_of_a_manifest_that_does_not_parse_names_it(memory, tmp_path):
    transport, options = memory
    transport.objects[f"ds/{fmt.MANIFEST_NAME}"] = b'{"format": "something else"}'
    with pytest.raises(packer.errors.PackerError) as caught:
        mirror(URL, options, tmp_path / "copy")
    assert caught.value.path == f"s3://bucket/ds/{fmt.MANIFEST_NAME}"
    assert not (tmp_path / "copy").exists()


def test_a_record_deleted_between_its_head_and_its_read_names_no_object(memory):
    transport, options = memory
    store = Store(URL, options, transport=transport)
    transport.objects.update({"ds/x": b"1", f"ds/{REPLACED_NAME}": b'{"objects": ["x"]}'})
    transport.fail["get_range"] = FileNotFoundError("deleted meanwhile")
    info, record = upload._read_record(store)
    assert info is not None and info.size == len(b'{"objects": ["x"]}') and record is None


def test_a_record_over_64_mib_is_not_read_whole(memory):
    transport, options = memory
    store = Store(URL, options, transport=transport)
    padding = "p" * ((64 << 20) + 10)
    record = json.dumps({"objects": ["x"], "padding": padding}).encode()
    transport.objects.update({"ds/x": b"1", f"ds/{REPLACED_NAME}": record})
    assert upload._read_record(store)[1] is None  # cut at the bound: not JSON, names no object
    assert retire_names(store, URL, set(), set(), "g") == ([], [])
    assert "ds/x" in transport.objects


def test_a_record_without_version_tokens_is_replaced_plainly(memory):
    transport, options = memory
    store = Store(URL, options, transport=transport)
    transport.objects.update({"ds/x": b"1", f"ds/{REPLACED_NAME}": b'{"objects": ["x"]}'})
    head = transport.head
    transport.head = lambda key: ObjectInfo(size=head(key).size, etag=None)  # type: ignore[method-assign]
    assert retire_names(store, URL, {"old"}, set(), "g") == (["x"], ["old"])
    assert [kwargs for kind, key, kwargs in transport.log if key == f"ds/{REPLACED_NAME}"] == [{}]


def test_a_lock_object_over_its_bound_counts_as_stale(lock_store):
    transport, store = lock_store
    lock = json.dumps({"token": "other", "time": time.time() + 3600, "pad": ""}).encode()
    exact = lock[:-2] + b"x" * (4097 - len(lock)) + lock[-2:]  # 4097 bytes: read whole (the bound plus one)
    assert len(exact) == 4097
    transport.objects[f"ds/{LOCK_NAME}"] = exact
    assert upload._CommitGuard(store, URL)._holder()["token"] == "other"
    over = lock[:-2] + b"x" * (4098 - len(lock)) + lock[-2:]
    transport.objects[f"ds/{LOCK_NAME}"] = over
    assert upload._CommitGuard(store, URL)._holder() == {"token": "?", "time": 0}


def test_a_folder_without_a_report_uploads_without_one(memory, generations, tmp_path):
    import shutil

    transport, options = memory
    folder = tmp_path / "no-report"
    shutil.copytree(generations["A"], folder)
    (folder / fmt.REPORT_NAME).unlink()
    report = upload_dataset(folder, URL, options)
    assert fmt.REPORT_NAME not in report.uploaded and f"ds/{fmt.REPORT_NAME}" not in transport.objects


def test_a_local_manifest_that_does_not_parse_is_named(memory, tmp_path):
    _transport, options = memory
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / fmt.MANIFEST_NAME).write_bytes(b"{}")
    with pytest.raises(packer.errors.PackerError) as caught:
        upload_dataset(tmp_path / "bad", URL, options)
    assert caught.value.path == str(tmp_path / "bad" / fmt.MANIFEST_NAME)


class _Clock:
    """``time`` for the upload module: wall and monotonic time move only when it sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_a_fresh_lock_is_waited_for_exactly_the_stale_time_and_ten_settles(memory, monkeypatch):
    transport, options = memory
    transport.conditional = False
    store = Store(URL, options, transport=transport)
    clock = _Clock()
    monkeypatch.setattr(upload, "time", clock)
    monkeypatch.setattr(upload, "LOCK_STALE_S", 1.0)
    monkeypatch.setattr(upload, "LOCK_SETTLE_S", 0.125)
    transport.objects[f"ds/{LOCK_NAME}"] = json.dumps({"token": "other", "time": 1e12}).encode()
    with pytest.raises(DatasetChangedError):
        with upload._CommitGuard(store, URL):
            pass
    assert clock.sleeps == [0.125] * 19  # refused once past 1.0 + 10 * 0.125 s


def test_a_lock_exactly_the_stale_time_old_is_still_held(memory, monkeypatch):
    transport, options = memory
    transport.conditional = False
    store = Store(URL, options, transport=transport)
    clock = _Clock()
    monkeypatch.setattr(upload, "time", clock)
    monkeypatch.setattr(upload, "LOCK_STALE_S", 1.0)
    monkeypatch.setattr(upload, "LOCK_SETTLE_S", 0.125)
    transport.objects[f"ds/{LOCK_NAME}"] = json.dumps({"token": "other", "time": 999.0}).encode()
    with upload._CommitGuard(store, URL) as guard:
        assert guard.held
    assert clock.sleeps[0] == 0.125 and len(clock.sleeps) == 2  # waited one settle, then took it over
    transport.objects[f"ds/{LOCK_NAME}"] = json.dumps({"token": "other"}).encode()  # no time: stale
    clock.sleeps.clear()
    with upload._CommitGuard(store, URL) as guard:
        assert guard.held
    assert clock.sleeps == [0.125]
