"""Writing to object storage: upload a local dataset folder (manifest last, on a precondition), and mirror one down.

``upload_dataset`` is the second half of ``packer build SRC s3://bucket/ds`` (the build packs
into a local staging folder as always): the shard files and the index go up first, in parallel
(a large file as a multipart upload), then the manifest, the commit record. Until the manifest
lands, a reader of the URL sees the previous generation (shard and index names are content
addressed, so no object a committed manifest names is ever replaced) or nothing that opens. An
object already in the store with the name and size of the local file is not sent again, which is
how ``--resume`` continues a killed upload.

**Writes cannot lose each other.** The manifest is written on a precondition: ``If-None-Match: *``
where there was no dataset, ``If-Match: <ETag>`` of the manifest the write was planned against
otherwise (S3 through s3fs or obstore; GCS generation and Azure ETag preconditions through obstore).
Of two appends or overwrites racing to one URL, the second finds the manifest changed and fails
with ``DatasetChangedError`` (or ``OutputExistsError`` for two new builds); the first one's
generation is whole, and nothing of the second is committed (its uploaded objects stay, named by
no manifest; a rerun skips them). Where the transport has no preconditions (fsspec's ``gs://`` and
``az://``), the commit takes a lock object (``.packer/write.lock``) around compare-and-write; its
limits are in ``_CommitGuard``.

**Replaced generations** (``--overwrite``): the objects only the replaced generation names are
kept until the *next* overwrite of the URL, so a job still reading the generation it opened keeps
reading whole, checked samples; the overwrite after that deletes them (exactly the objects of that
older generation that neither of the two newer ones names: ``retire``). They are listed in
``.packer/replaced.json``. A reader of a generation whose objects are gone gets
``DatasetChangedError`` for what its node cache does not hold, never short or mixed samples.

``mirror`` copies a dataset URL's objects, raw and unchecked, into a local folder (``packer
verify URL`` checks that copy, so it reports damage instead of refusing it on entry).
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .. import format as fmt
from ..errors import DatasetChangedError, OutputExistsError, PackerError, RemoteStoreError
from .cache import write_cached
from .options import RemoteOptions
from .reader import read_manifest
from .store import ObjectInfo, PreconditionFailed, Store, store_for
from .url import DatasetURL, object_key

__all__ = ["UploadReport", "dataset_objects", "upload_dataset", "mirror", "retire", "retire_names", "REPLACED_NAME",
           "LOCK_NAME"]

#: The record of the last replaced generation's objects (kept until the next overwrite).
REPLACED_NAME = ".packer/replaced.json"
#: The lock object of a store without conditional writes.
LOCK_NAME = ".packer/write.lock"
#: A lock object older than this is a dead writer's: taken over.
LOCK_STALE_S = 120.0
#: How long a writer waits after writing the lock object before reading it back.
LOCK_SETTLE_S = 0.5


@dataclass
class UploadReport:
    """What an upload did: objects sent, objects already there, bytes sent, the objects of an older
    replaced generation deleted, and the replaced generation's objects kept for its readers."""

    url: str
    uploaded: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    bytes_uploaded: int = 0
    deleted: list[str] = field(default_factory=list)
    retained: list[str] = field(default_factory=list)


def dataset_objects(manifest: fmt.Manifest) -> list[tuple[str, int]]:
    """Every file a manifest names except itself: ``(relative path, size)``, shards then the index."""
    files = [(entry.path, entry.size) for entry in manifest.shards]
    for spec in manifest.fields:
        files.extend((entry.path, entry.size) for entry in getattr(spec, "shards", ()) or ())
    files.append((manifest.index.path, manifest.index.size))
    return files


def _names(manifest_bytes: bytes | None, url: DatasetURL) -> set[str] | None:
    """The objects a manifest names (None: no manifest, or one that does not parse)."""
    if manifest_bytes is None:
        return None
    try:
        manifest = fmt.parse_manifest(manifest_bytes, path=f"{url}/{fmt.MANIFEST_NAME}")
    except PackerError:
        return None
    return {relative for relative, _size in dataset_objects(manifest)}


def upload_dataset(local: str | os.PathLike[str], url: DatasetURL, options: RemoteOptions, *,
                   expect_manifest: bytes | None = None, overwrite: bool = False, workers: int = 8,
                   on_object: Callable[[str, int], None] | None = None,
                   before_commit: Callable[[], None] | None = None) -> UploadReport:
    """Upload the dataset folder ``local`` to ``url``: every file its manifest names, then the manifest.

    Args:
        local: a finished local dataset folder (its manifest committed).
        url: a writable dataset URL.
        expect_manifest: for an append, the manifest the new generation was built on: the store
            must still hold exactly it when the new manifest is written (else nothing is committed).
        overwrite: replace a dataset already at ``url``. The replaced generation's objects stay
            until the next overwrite (its readers keep working); the objects of the generation it
            replaced are deleted then (``retire``).
        workers: files uploaded at once.
        on_object: called with (relative path, bytes) after each object is sent.
        before_commit: called after every object is sent, before the manifest is compared and
            written (the tests interleave two writers there).

    Raises:
        OutputExistsError: a dataset is at ``url`` and neither ``overwrite`` nor an append (or
            another writer created one while this one uploaded).
        DatasetChangedError: the manifest changed since this write was planned (an append's
            base was replaced, or another writer committed first): nothing was committed.
        RemoteStoreError: an upload failed after its retries (nothing was committed).
    """
    if url.read_only:
        raise RemoteStoreError(f"{url.scheme}:// URLs are read-only; build to s3://, gs:// or az://", path=url.text)
    root = Path(local)
    manifest_bytes = (root / fmt.MANIFEST_NAME).read_bytes()
    manifest = fmt.parse_manifest(manifest_bytes, path=root / fmt.MANIFEST_NAME)
    store = store_for(url, options)
    _info, current = _current_manifest(store)
    if expect_manifest is None and current is not None and not overwrite and current != manifest_bytes:
        raise OutputExistsError("a dataset is already here; pass --overwrite to replace it, or use `packer append`",
                                path=url.text)
    if expect_manifest is not None and current != expect_manifest:
        raise DatasetChangedError("the dataset changed while the append was being built (its manifest is not "
                                  "the one the new generation extends); nothing was committed", path=url.text)
    report = UploadReport(url=url.text)
    files = dataset_objects(manifest)
    extra = [fmt.REPORT_NAME] if (root / fmt.REPORT_NAME).is_file() else []

    def send(item: tuple[str, int]) -> None:
        relative, size = item
        object_key("", relative, where=url.text)  # stays inside the dataset (R19)
        source = root / relative
        info = store.head(relative)
        if info is not None and info.size == size and relative != fmt.REPORT_NAME:
            report.skipped.append(relative)
            return
        store.put_file(relative, str(source))
        report.uploaded.append(relative)
        report.bytes_uploaded += size
        if on_object is not None:
            on_object(relative, size)

    with ThreadPoolExecutor(max(1, workers), thread_name_prefix="packer-upload") as pool:
        list(pool.map(send, files + [(name, (root / name).stat().st_size) for name in extra]))
    if before_commit is not None:
        before_commit()
    with _CommitGuard(store, url):
        info, now = _current_manifest(store)
        if expect_manifest is not None and now != expect_manifest:
            raise DatasetChangedError("the dataset changed while the append was being uploaded (another writer "
                                      "committed first); nothing was committed: run the append again",
                                      path=url.text)
        if expect_manifest is None and now != current:
            if current is None:
                raise OutputExistsError("another writer created a dataset here while this one was being uploaded; "
                                        "nothing was committed (pass --overwrite to replace it)", path=url.text)
            raise DatasetChangedError("the dataset changed while the overwrite was being uploaded (another writer "
                                      "committed first); nothing was committed: run it again to replace that "
                                      "generation", path=url.text)
        if now != manifest_bytes:
            _commit(store, url, manifest_bytes, info, replacing=now)
        report.uploaded.append(fmt.MANIFEST_NAME)
    if expect_manifest is None and now is not None and now != manifest_bytes:
        report.deleted, report.retained = retire(store, url, now, manifest_bytes)
    return report


def _unconditional(store: Store, info: ObjectInfo | None) -> bool:
    """Whether a write must go without a precondition (the store has none, or the object's version
    tokens are unknown): then it runs under the lock object."""
    return not store.conditional or (info is not None and not (info.etag or info.version))


def _commit(store: Store, url: DatasetURL, manifest_bytes: bytes, info: ObjectInfo | None,
            replacing: bytes | None) -> None:
    """Write the manifest on its precondition (see the module docstring)."""
    if _unconditional(store, info):
        store.put_bytes(fmt.MANIFEST_NAME, manifest_bytes)  # under the lock object
        return
    try:
        if replacing is None:
            store.put_bytes(fmt.MANIFEST_NAME, manifest_bytes, if_absent=True)
        else:
            store.put_bytes(fmt.MANIFEST_NAME, manifest_bytes, if_match=info)
    except PreconditionFailed:
        if replacing is None:
            raise OutputExistsError("another writer created a dataset here while this one was committing; nothing "
                                    "was committed (pass --overwrite to replace it)", path=url.text) from None
        raise DatasetChangedError("another writer committed a new generation while this one was committing (the "
                                  "manifest's precondition failed); nothing was committed, the other generation is "
                                  "whole: run this write again", path=url.text) from None


def retire(store: Store, url: DatasetURL, old_bytes: bytes, new_bytes: bytes) -> tuple[list[str], list[str]]:
    """After ``new_bytes`` replaced ``old_bytes`` (an overwrite): record the objects only the old
    generation names (kept for its readers until the next overwrite), and delete those the record
    held before: exactly the ones that neither the old nor the new generation (nor the manifest the
    store holds now, if another writer committed meanwhile) names.

    Only names a valid manifest listed, each inside the dataset, are ever deleted; an old manifest
    that does not parse (not a packer dataset) leaves everything as it was. A record that another
    writer changed meanwhile (its precondition fails) leaves everything too: objects may be left
    over, never deleted wrongly.

    Returns:
        ``(deleted, retained)``, both sorted.
    """
    old, new = _names(old_bytes, url), _names(new_bytes, url)
    if old is None or new is None:
        return [], []
    return retire_names(store, url, old, new, fmt.checksum_hex(fmt.checksum(old_bytes)))


def retire_names(store: Store, url: DatasetURL, old: set[str], new: set[str], generation: str
                 ) -> tuple[list[str], list[str]]:
    """``retire`` on the objects the two manifests name (``generation``: the old one's, for the
    record). The rule, a property in tests/remote/test_remote_properties.py: what is deleted is
    exactly the recorded objects minus ``old``, ``new`` and the manifest the store holds now."""
    info, record = _read_record(store)
    earlier = set(record["objects"]) if record is not None else set()
    retained = sorted(old - new)
    document = json.dumps({"version": 1, "generation": generation, "objects": retained}, sort_keys=True).encode()
    try:
        if _unconditional(store, info):
            store.put_bytes(REPLACED_NAME, document)
        elif info is None:
            store.put_bytes(REPLACED_NAME, document, if_absent=True)
        else:
            store.put_bytes(REPLACED_NAME, document, if_match=info)
    except PreconditionFailed:
        return [], retained
    _info, current = _current_manifest(store)
    keep = old | new | (_names(current, url) or set())
    gone = sorted(earlier - keep)
    for relative in gone:
        object_key("", relative, where=url.text)  # stays inside the dataset (R19)
        store.delete(relative)
    return gone, retained


def _read_record(store: Store) -> tuple[ObjectInfo | None, dict[str, Any] | None]:
    """The replaced generation's record and its version tokens (None, None: there is none); a
    record that is not one (hand-edited, another tool's) names no object."""
    info = store.head(REPLACED_NAME)
    if info is None:
        return None, None
    data = store.read_prefix(REPLACED_NAME, 64 << 20, missing_ok=True)
    try:
        record = json.loads(data or b"")
    except ValueError:
        return info, None
    if (not isinstance(record, dict) or not isinstance(record.get("objects"), list)
            or not all(isinstance(name, str) for name in record["objects"])):
        return info, None
    return info, record


def _current_manifest(store: Store) -> tuple[ObjectInfo | None, bytes | None]:
    """The manifest's version tokens (read first) and its bytes (bounded): a change between the
    two reads makes the conditional write fail, never succeed over a manifest not compared."""
    info = store.head(fmt.MANIFEST_NAME)
    return info, read_manifest(store, missing_ok=True)


class _CommitGuard:
    """A lock object around the compare-and-write of a store without conditional writes (a no-op
    where the store has them).

    Limits (docs/guides/object-storage.md): without an atomic create, the lock is taken by writing
    ``LOCK_NAME`` with a unique token, waiting ``LOCK_SETTLE_S`` and reading it back (the last of
    several writers wins and the others see its token); two writers whose writes both take longer
    than that to become visible can both believe they hold it. A lock older than ``LOCK_STALE_S``
    (a killed writer's) is taken over. Writers that do not use packer's protocol are not excluded.
    """

    def __init__(self, store: Store, url: DatasetURL) -> None:
        self.store = store
        self.url = url
        self.token = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex}"
        self.held = False

    def __enter__(self) -> "_CommitGuard":
        if self.store.conditional:
            return self
        deadline = time.monotonic() + LOCK_STALE_S + 10 * LOCK_SETTLE_S
        while True:
            holder = self._holder()
            if holder is None or not time.time() - float(holder.get("time", 0)) <= LOCK_STALE_S:
                self.store.put_bytes(LOCK_NAME, json.dumps({"token": self.token, "time": time.time()}).encode())
                time.sleep(LOCK_SETTLE_S)
                holder = self._holder()
                if holder is not None and holder.get("token") == self.token:
                    self.held = True
                    return self
            if time.monotonic() > deadline:
                raise DatasetChangedError(f"another writer holds the lock object {LOCK_NAME} of this dataset (this "
                                          f"store has no conditional writes); nothing was committed", path=self.url.text)
            time.sleep(LOCK_SETTLE_S)

    def _holder(self) -> dict[str, Any] | None:
        data = self.store.read_prefix(LOCK_NAME, 4096, missing_ok=True)
        if not data:
            return None
        try:
            holder = json.loads(data)
        except ValueError:
            holder = None
        if not isinstance(holder, dict) or not isinstance(holder.get("time", 0), (int, float)):
            return {"token": "?", "time": 0}  # not a lock packer wrote: stale
        return holder

    def __exit__(self, *exc: object) -> None:
        if self.held:
            holder = self._holder()
            if holder is not None and holder.get("token") == self.token:
                self.store.delete(LOCK_NAME)
            self.held = False


def mirror(url: DatasetURL, options: RemoteOptions, dest: str | os.PathLike[str], *, workers: int = 8) -> Path:
    """Copy the objects of the dataset at ``url`` into the local folder ``dest`` (raw, unchecked).

    The manifest is fetched first and every other object is read at the size it records (a
    shorter object is copied short, for ``verify`` to report).

    Raises:
        RemoteStoreError: no manifest, or an object could not be read after its retries.
    """
    store = store_for(url, options)
    target = Path(dest)
    manifest_bytes = read_manifest(store)
    assert manifest_bytes is not None
    manifest = fmt.parse_manifest(manifest_bytes, path=f"{url}/{fmt.MANIFEST_NAME}")
    pieces: list[tuple[str, int, int]] = []
    for relative, size in dataset_objects(manifest):
        object_key("", relative, where=url.text)
        info = store.head(relative)
        if info is None:
            continue  # a missing object: verify reports it
        path = target / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as file:
            file.truncate(info.size)
        step = options.request_bytes
        pieces.extend((relative, start, min(start + step, info.size)) for start in range(0, info.size, step))

    def fetch(piece: tuple[str, int, int]) -> None:
        relative, start, end = piece
        data = store.read_range(relative, start, end)
        fd = os.open(target / relative, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.pwrite(fd, data, start)
        finally:
            os.close(fd)

    with ThreadPoolExecutor(max(1, workers), thread_name_prefix="packer-mirror") as pool:
        list(pool.map(fetch, pieces))
    write_cached(target / fmt.MANIFEST_NAME, [manifest_bytes])
    return target
