"""``packer build SRC URL`` and ``packer append URL SRC``: pack in a local staging folder, then upload.

The staging folder lives in the node cache (``<cache>/uploads/<dataset key>/build|append``), so a
killed run can be continued with ``resume=True``: the local build resumes as it does for a folder,
and the upload skips every object already in the store (``packer.remote.upload``). The manifest
goes up last, on a precondition (``packer.remote.upload``): until then the URL holds the previous
generation or nothing that opens, and of two writers racing to one URL the second fails with a typed
error, committing nothing. Two runs writing one URL from one node would share the staging folder:
the second is refused at once (``BuildLockedError``), before it touches it.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator

from .. import format as fmt
from ..errors import BuildError, BuildLockedError, OptionError, OutputExistsError, PackerError
from ..remote.options import RemoteOptions, as_remote_options
from ..remote.reader import dataset_key
from ..remote.store import store_for
from ..remote.upload import upload_dataset
from ..remote.url import DatasetURL, parse_url

__all__ = ["build_to_url", "append_to_url", "staging_folder"]

_BASE = ".packer-remote-base"  # the generation an append's staging folder extends


def staging_folder(url: DatasetURL, options: RemoteOptions, kind: str) -> Path:
    return options.cache_root / "uploads" / dataset_key(url, options) / kind


@contextmanager
def _node_lock(url: DatasetURL, options: RemoteOptions) -> Iterator[None]:
    """An ``flock`` on ``<cache>/uploads/<dataset key>/.packer.lock``: one build or append of a URL
    per node at a time (they share the staging folder); the kernel drops it if the process dies."""
    folder = options.cache_root / "uploads" / dataset_key(url, options)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / ".packer.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise BuildError(f"cannot create the upload lock in the node cache: {exc.strerror}", path=folder) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BuildLockedError("another packer build or append on this node is writing this URL (its staging "
                                   "folder in the node cache is locked); wait for it or stop it",
                                   path=url.text) from None
        yield
    finally:
        os.close(fd)


def _writable(text: str) -> DatasetURL:
    url = parse_url(text)
    if url.read_only:
        raise OptionError(f"{url.scheme}:// URLs are read-only; build to s3://, gs:// or az://")
    return url


def build_to_url(build: Callable[..., Any], source: Any, out: str, settings: Any, run: Any) -> Any:
    """Build ``source`` with ``build`` (``packer.writer.run``'s, passed in: no import cycle) into a
    staging folder, then upload it to ``out`` (see the module docstring). ``settings`` and ``run``
    are the build's ``BuildSettings`` and ``RunOptions`` (``run.remote``: how to reach the store)."""
    url = _writable(out)
    remote = as_remote_options(run.remote)
    store = store_for(url, remote)
    if not run.overwrite and not run.resume and store.head(fmt.MANIFEST_NAME) is not None:
        raise OutputExistsError("a dataset is already here; pass --overwrite to replace it, --resume to finish "
                                "an interrupted upload, or use `packer append`", path=url.text)
    staging = staging_folder(url, remote, "build")
    with _node_lock(url, remote):
        if not run.resume:
            shutil.rmtree(staging, ignore_errors=True)
        staging.parent.mkdir(parents=True, exist_ok=True)
        result = build(source, staging, settings, replace(run, resume=run.resume and staging.exists(), overwrite=False))
        if result is None:  # --part / --plan-only: nothing to upload yet
            return None
        upload_dataset(staging, url, remote, overwrite=run.overwrite or run.resume)
        _keep_hashes(staging, url, remote)
        shutil.rmtree(staging, ignore_errors=True)
    return result


def _keep_hashes(staging: Path, url: DatasetURL, options: RemoteOptions) -> None:
    """A ``--hash perceptual`` build's hashes file goes where ``packer inspect --duplicates`` looks for
    a URL's (the node cache's folder of the new generation, SPEC §16), never to the store. Best
    effort: the file is checked against the generation when read, and recomputed if it is not there."""
    made = staging / fmt.HASHES_NAME
    if not made.is_file():
        return
    from ..remote.reader import RemoteFiles

    try:
        files = RemoteFiles(url, options)
        try:
            shutil.copyfile(made, files.folder / fmt.HASHES_NAME)
        finally:
            files.close()
    except (OSError, PackerError):
        pass


def append_to_url(append: Callable[..., Any], dataset: str, source: Any, *, run: Any, **append_kwargs: Any) -> Any:
    """Append ``source`` to the dataset at URL ``dataset``: the new generation is built next to a copy of
    the current manifest and index, and its new shards, index and manifest are uploaded (manifest last).
    ``run`` is the append's ``RunOptions`` (``run.remote``: how to reach the store; ``run.resume``:
    finish an interrupted upload)."""
    remote, resume = run.remote, run.resume
    from ..remote.reader import RemoteFiles

    url = _writable(dataset)
    settings = as_remote_options(remote)
    with _node_lock(url, settings):
        files = RemoteFiles(url, settings)
        staging = staging_folder(url, settings, "append")
        marker = staging / _BASE
        done = (resume and marker.is_file() and marker.read_text() == files.generation
                and (staging / fmt.MANIFEST_NAME).is_file()
                and (staging / fmt.MANIFEST_NAME).read_bytes() != files.manifest_bytes)
        result = None
        if not done:
            shutil.rmtree(staging, ignore_errors=True)
            (staging / fmt.SHARD_DIR).mkdir(parents=True)
            index_path = files.manifest.index.path
            (staging / index_path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(files.root / index_path, staging / index_path)
            (staging / fmt.MANIFEST_NAME).write_bytes(files.manifest_bytes)
            marker.write_text(files.generation)
            result = append(staging, source, run=run, **append_kwargs)
        # the commit is conditional on the manifest the new generation extends (If-Match)
        upload_dataset(staging, url, settings, expect_manifest=files.manifest_bytes)
        _keep_hashes(staging, url, settings)
        shutil.rmtree(staging, ignore_errors=True)
    return result
