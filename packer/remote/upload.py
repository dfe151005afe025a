"""Writing to object storage: upload a local dataset folder (manifest last), and mirror one down.

``upload_dataset`` is the second half of ``packer build SRC s3://bucket/ds`` (the build packs
into a local staging folder as always): the shard files and the index go up first, in parallel
(a large file as a multipart upload), then the manifest, the commit record. Until the manifest
lands, a reader of the URL sees the previous generation (shard and index names are content
addressed, so no object a committed manifest names is ever replaced) or nothing that opens. An
object already in the store with the name and size of the local file is not sent again, which is
how ``--resume`` continues a killed upload.

``mirror`` copies a dataset URL's objects, raw and unchecked, into a local folder (``packer
verify URL`` checks that copy, so it reports damage instead of refusing it on entry).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .. import format as fmt
from ..errors import DatasetChangedError, OutputExistsError, PackerError, RemoteStoreError
from .cache import write_atomic
from .options import RemoteOptions
from .store import Store, store_for
from .url import DatasetURL, object_key

__all__ = ["UploadReport", "dataset_objects", "upload_dataset", "mirror"]


@dataclass
class UploadReport:
    """What an upload did: objects sent, objects already there, bytes sent, and the replaced
    generation's objects deleted after the new manifest landed."""

    url: str
    uploaded: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    bytes_uploaded: int = 0
    deleted: list[str] = field(default_factory=list)


def dataset_objects(manifest: fmt.Manifest) -> list[tuple[str, int]]:
    """Every file a manifest names except itself: ``(relative path, size)``, shards then the index."""
    files = [(entry.path, entry.size) for entry in manifest.shards]
    for spec in manifest.fields:
        files.extend((entry.path, entry.size) for entry in getattr(spec, "shards", ()) or ())
    files.append((manifest.index.path, manifest.index.size))
    return files


def upload_dataset(local: str | os.PathLike[str], url: DatasetURL, options: RemoteOptions, *,
                   expect_manifest: bytes | None = None, overwrite: bool = False, workers: int = 8,
                   on_object: Callable[[str, int], None] | None = None) -> UploadReport:
    """Upload the dataset folder ``local`` to ``url``: every file its manifest names, then the manifest.

    Args:
        local: a finished local dataset folder (its manifest committed).
        url: a writable dataset URL.
        expect_manifest: for an append, the manifest the new generation was built on: the store
            must still hold exactly it when the new manifest is written (else nothing is committed).
        overwrite: replace a dataset already at ``url``. Once the new manifest has landed, the
            objects only the old manifest names are deleted (a store would otherwise keep every
            replaced generation): a reader still at the old generation then reads what its node
            cache holds, and gets ``DatasetChangedError`` for anything else.
        workers: files uploaded at once.
        on_object: called with (relative path, bytes) after each object is sent.

    Raises:
        OutputExistsError: a dataset is at ``url`` and neither ``overwrite`` nor an append.
        DatasetChangedError: an append whose base manifest was replaced meanwhile.
        RemoteStoreError: an upload failed after its retries (nothing was committed).
    """
    if url.read_only:
        raise RemoteStoreError(f"{url.scheme}:// URLs are read-only; build to s3://, gs:// or az://", path=url.text)
    root = Path(local)
    manifest_bytes = (root / fmt.MANIFEST_NAME).read_bytes()
    manifest = fmt.parse_manifest(manifest_bytes, path=root / fmt.MANIFEST_NAME)
    store = store_for(url, options)
    current = _current_manifest(store)
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
    if expect_manifest is not None and _current_manifest(store) != expect_manifest:
        raise DatasetChangedError("the dataset changed while the append was being uploaded; nothing was committed",
                                  path=url.text)
    store.put_bytes(fmt.MANIFEST_NAME, manifest_bytes)  # the commit record, last
    report.uploaded.append(fmt.MANIFEST_NAME)
    if expect_manifest is None and current is not None and current != manifest_bytes:
        report.deleted = _delete_replaced(store, current, manifest, url)
    return report


def _delete_replaced(store: Store, old_bytes: bytes, new: fmt.Manifest, url: DatasetURL) -> list[str]:
    """Delete the objects the replaced manifest names and the new one does not (after the commit).

    Only names a valid old manifest lists, each inside the dataset, are deleted: never an object
    the new generation uses, never one outside the prefix. An old manifest that does not parse
    (not a packer dataset) leaves everything as it was.
    """
    try:
        old = fmt.parse_manifest(old_bytes, path=f"{url}/{fmt.MANIFEST_NAME}")
    except PackerError:
        return []
    keep = {relative for relative, _size in dataset_objects(new)}
    gone = sorted({relative for relative, _size in dataset_objects(old)} - keep)
    for relative in gone:
        object_key("", relative, where=url.text)  # stays inside the dataset (R19)
        store.delete(relative)
    return gone


def _current_manifest(store: Store) -> bytes | None:
    if store.head(fmt.MANIFEST_NAME) is None:
        return None
    return store.read_object(fmt.MANIFEST_NAME)


def mirror(url: DatasetURL, options: RemoteOptions, dest: str | os.PathLike[str], *, workers: int = 8) -> Path:
    """Copy the objects of the dataset at ``url`` into the local folder ``dest`` (raw, unchecked).

    The manifest is fetched first and every other object is read at the size it records (a
    shorter object is copied short, for ``verify`` to report).

    Raises:
        RemoteStoreError: no manifest, or an object could not be read after its retries.
    """
    store = store_for(url, options)
    target = Path(dest)
    manifest_bytes = store.read_object(fmt.MANIFEST_NAME)
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
    write_atomic(target / fmt.MANIFEST_NAME, [manifest_bytes])
    return target
