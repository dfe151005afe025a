"""``packer build SRC URL`` and ``packer append URL SRC``: pack in a local staging folder, then upload.

The staging folder lives in the node cache (``<cache>/uploads/<dataset key>/build|append``), so a
killed run can be continued with ``resume=True``: the local build resumes as it does for a folder,
and the upload skips every object already in the store (``packer.remote.upload``). The manifest
goes up last: until then the URL holds the previous generation or nothing that opens.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from .. import format as fmt
from ..errors import OptionError, OutputExistsError
from ..remote.options import RemoteOptions, as_remote_options
from ..remote.reader import dataset_key
from ..remote.store import store_for
from ..remote.upload import upload_dataset
from ..remote.url import DatasetURL, parse_url

__all__ = ["build_to_url", "append_to_url", "staging_folder"]

_BASE = ".packer-remote-base"  # the generation an append's staging folder extends


def staging_folder(url: DatasetURL, options: RemoteOptions, kind: str) -> Path:
    return options.cache_root / "uploads" / dataset_key(url, options) / kind


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
    if not run.resume:
        shutil.rmtree(staging, ignore_errors=True)
    staging.parent.mkdir(parents=True, exist_ok=True)
    result = build(source, staging, settings, replace(run, resume=run.resume and staging.exists(), overwrite=False))
    if result is None:  # --part / --plan-only: nothing to upload yet
        return None
    upload_dataset(staging, url, remote, overwrite=run.overwrite or run.resume)
    shutil.rmtree(staging, ignore_errors=True)
    return result


def append_to_url(append: Callable[..., Any], dataset: str, source: Any, *, run: Any, **append_kwargs: Any) -> Any:
    """Append ``source`` to the dataset at URL ``dataset``: the new generation is built next to a copy of
    the current manifest and index, and its new shards, index and manifest are uploaded (manifest last).
    ``run`` is the append's ``RunOptions`` (``run.remote``: how to reach the store; ``run.resume``:
    finish an interrupted upload)."""
    remote, resume = run.remote, run.resume
    from ..remote.reader import RemoteFiles

    url = _writable(dataset)
    settings = as_remote_options(remote)
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
    upload_dataset(staging, url, settings, expect_manifest=files.manifest_bytes)
    shutil.rmtree(staging, ignore_errors=True)
    return result
