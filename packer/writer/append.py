"""``packer append DATASET SRC``: add samples as new shards and commit a new manifest generation.

Existing shard files are never rewritten: the new samples go into new shards numbered after the
last one, a new index (old rows + new rows) gets a new content-addressed name, and the manifest is
replaced atomically. A reader that opened the old manifest keeps its old index and shards (no
file it uses is removed or changed). Class names that are new get the next label ids; existing
ids never change. Each generation is recorded in the manifest's ``history``.
"""

from __future__ import annotations

import os
import shutil
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from .. import format as fmt
from ..dataset import open_index
from ..location import parse_location
from ..errors import OptionError
from ..errors import BuildError, EmptySourceError, PackerError, SourceError
from .._internal.files import iter_json_lines
from .commit import BuildResult, assemble_index, commit_dataset, record_hashes, recorded_max_pixels
from .plan import make_plan, save_plan
from .records import read_record, record_path
from .settings import BuildSettings, RunOptions, labels_for_append, run_from_legacy, settings_from_record
from ..sources import Rejection, SourceListing, SourceOptions, detect_kind, list_source, select_rows
from .run import check_output_outside_source, run_shards, source_options
from .staging import APPEND_SPOOL_DIR, PLAN_NAME, RECORD_DIR, STAGING_DIR, build_lock

__all__ = ["append", "settings_from_manifest"]


def _drop_existing_keys(listing: SourceListing, existing: set[bytes]) -> SourceListing:
    """Reject source files whose key is already in the dataset (a sample is appended once)."""
    keep = np.ones(len(listing), dtype=bool)
    for i in range(len(listing)):
        start, end = int(listing.key_offsets[i]), int(listing.key_offsets[i + 1])
        if listing.key_blob[start:end].tobytes() in existing:
            keep[i] = False
            listing.rejected.append(Rejection(listing.key(i), "duplicate-entry", "already in the dataset"))
    return listing if keep.all() else select_rows(listing, keep)


def append(dataset: str | os.PathLike[str], source: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None,
           seed: int | None = None, run: RunOptions | None = None, **legacy: Any) -> BuildResult:
    """Append the images of ``source`` to ``dataset`` as new shards (``packer.append_dataset``; the
    library form of ``packer append``).

    The dataset's recorded build settings (``build.settings``, or the flat options older datasets
    recorded) are reused: layout, codec, checks, a fixed class list, the label type, and the
    door options (label field, image column); the new source's kind is detected from its bytes
    and ``root`` is its root. ``seed`` defaults to the original seed plus the generation number, so
    each generation is shuffled differently but reproducibly. ``run``: how this run goes
    (``workers``, ``progress``; ``resume`` and ``remote`` for a dataset URL); the old keywords
    ``workers=``, ``progress=``, ``remote=``, ``resume=`` still work for one release (deprecated).

    Raises:
        BuildError, EmptySourceError, BuildLockedError, PackerError (a damaged dataset).
    """
    if legacy:
        unknown = sorted(set(legacy) - {"workers", "progress", "remote", "resume"})
        if unknown:
            raise OptionError(f"packer.append_dataset() got an unexpected keyword argument {unknown[0]!r} (how the "
                              f"run goes is run=packer.RunOptions(...))")
        warnings.warn(f"packer.append_dataset: {', '.join(f'{k}=' for k in legacy)} are deprecated and will be "
                      f"removed in the next release; pass run=packer.RunOptions("
                      f"{', '.join(f'{k}=' for k in legacy)})", DeprecationWarning, stacklevel=2)
    run = run_from_legacy(run, legacy, call="packer.append_dataset")
    location = parse_location(dataset, what="DATASET")
    if location.url is not None:
        from .remote_out import append_to_url  # a new generation built locally, then uploaded (manifest last)

        # the existing samples are read through the URL (the staging folder holds its manifest and index)
        return append_to_url(_append, location.url.text, source, root=root, seed=seed, run=run,
                             read_from=location.url.text)
    return _append(location.local_path(), source, root=root, seed=seed, run=run)


def _append(dataset: str | os.PathLike[str], source: str | os.PathLike[str], *, root: str | os.PathLike[str] | None,
            seed: int | None, run: RunOptions, read_from: str | None = None) -> BuildResult:
    started = time.monotonic()
    out = Path(dataset)
    run.check()
    if not out.is_dir():
        raise SourceError("the dataset to append to is not a folder (expected a dataset folder holding "
                          "manifest.json)", path=out)
    if Path(source).exists():
        check_output_outside_source(Path(source), out)
    with build_lock(out):
        old = open_index(out)
        manifest = old.manifest
        if manifest.fields:
            raise OptionError(f"append does not support datasets with declared fields yet "
                              f"({', '.join(spec.name for spec in manifest.fields)}); rebuild the dataset "
                              f"from all its sources instead", path=out)
        # history holds generation 0 (the build) once anything was appended
        generation = len(manifest.history) if manifest.history else 1
        settings = _generation_settings(manifest, generation, seed)
        # The new source's own kind (detected once, here) and root; the recorded door options.
        settings = replace(settings, source=replace(settings.source, kind=detect_kind(source), root=root))
        spool = out / APPEND_SPOOL_DIR  # a compressed archive or Parquet source, decompressed once
        try:
            # Labels go through the source contract with the dataset's class list as the given
            # list: a name outside it gets the next label (or, when the dataset was built with a
            # fixed list, --classes, is rejected as unknown-class: never an id other splits lack);
            # a sample without a label is rejected when the dataset has class names.
            listing = list_source(Path(source), append_source_options(settings, manifest, spool))
            classes = listing.classes
            listing = _drop_existing_keys(listing, _existing_keys(old.index))
            if len(listing) == 0:
                raise EmptySourceError("every file of the new source is already in the dataset or rejected",
                                       path=Path(source))
            last_number = manifest.shards[-1].number if manifest.shards else -1
            existing = _Existing(read_from or out, run.remote if read_from else None)
            plan = _plan_generation(existing, listing, settings, Path(source), first_shard_number=last_number + 1)
            staging = out / STAGING_DIR
            shutil.rmtree(staging, ignore_errors=True)
            try:
                (staging / RECORD_DIR).mkdir(parents=True)
                save_plan(plan, staging / PLAN_NAME)
                run_shards(plan, out, list(range(plan.shard_count)), workers=run.workers, engine="local",
                           address=None, progress=run.progress, fail_on_reject=False)
                result, new_rejected = _commit_generation(out, old, plan, classes, generation, Path(source).name,
                                                          existing)
            except BaseException:
                _discard_failed_append(out)
                raise
            shutil.rmtree(staging, ignore_errors=True)
        finally:
            shutil.rmtree(spool, ignore_errors=True)
    result.rejected = new_rejected
    result.seconds = time.monotonic() - started
    return result


class _Existing:
    """Where an append reads the samples already in the dataset (its folder, or for a URL the URL:
    the staging folder of a URL's append holds its manifest and index, not its shards)."""

    def __init__(self, where: Any, remote: Any) -> None:
        self.where, self.remote = where, remote

    def open(self) -> Any:
        from ..dataset import open_dataset

        return open_dataset(self.where, remote=self.remote)


def _plan_generation(existing: _Existing, listing: SourceListing, settings: BuildSettings, source: Path, *,
                     first_shard_number: int) -> Any:
    """The new generation's plan; with ``--reject-duplicates`` recorded, files whose bytes a sample
    of the dataset (or an earlier new file) has are rejected first, naming the sample kept.

    Raises:
        EmptySourceError: every new file was such a copy.
    """
    where = {"source": source.name, "first_shard_number": first_shard_number}
    if not settings.checks.reject_duplicates:
        return make_plan(listing, settings, **where)
    dataset = existing.open()
    try:
        plan = make_plan(listing, settings, existing=dataset, **where)
    finally:
        dataset.close()
    if len(plan.listing) == 0:
        raise EmptySourceError(f"every file of the new source has the bytes of a sample already in the dataset "
                               f"({len(listing)} rejected as duplicate-content; --reject-duplicates is recorded "
                               f"in the dataset's build settings)", path=source)
    return plan


def append_source_options(settings: BuildSettings, manifest: fmt.Manifest, spool: Path) -> SourceOptions:
    """The source contract's options for appending to a dataset: its class list is the given
    list, extended by new names unless the dataset was built with a fixed list (``--classes``);
    a dataset without names (``()``: integer labels, or none) takes integer labels or none."""
    fixed = settings.labels.classes is not None
    return source_options(replace(settings, labels=labels_for_append(settings, tuple(manifest.classes))),
                          spool_dir=spool, new_classes="reject" if fixed else "extend")


def _generation_settings(manifest: fmt.Manifest, generation: int, seed: int | None) -> BuildSettings:
    """The dataset's recorded build settings (``settings_from_manifest``), reseeded for this generation."""
    settings = settings_from_manifest(manifest)
    layout = settings.layout
    return replace(settings, layout=replace(layout, seed=layout.seed + generation if seed is None else seed))


def _existing_keys(index: Any) -> set[bytes]:
    return {bytes(index.keys[int(a):int(b)]) for a, b in zip(index.key_offsets[:-1], index.key_offsets[1:])}


def _commit_generation(out: Path, old: Any, plan: Any, classes: tuple[str, ...], generation: int,
                       source_name: str, existing: _Existing) -> tuple[BuildResult, list[Rejection]]:
    """Old rows + the packed new shards -> a new index, report and manifest (the commit point)."""
    manifest = old.manifest
    listing = plan.listing
    headers, records = [], []
    for shard in range(plan.shard_count):
        found = read_record(record_path(out, shard), plan.fingerprint, out)
        if found is None:
            raise BuildError(f"planned shard {shard} of the append did not complete", path=out)
        if found[0]["sample_count"]:
            headers.append(found[0])
            records.append(found[1])
    new_rejected = list(listing.rejected) + [Rejection(**r) for h in headers for r in h["rejected"]]
    if not headers:
        raise BuildError(f"every one of the {len(listing)} new files was rejected", path=out)
    old_shards = len(manifest.shards)
    columns, new_shards, source_rows = assemble_index(listing, headers, records, previous=old.index,
                                                      previous_shards=old_shards)
    history = list(manifest.history) or [{
        "generation": 0, "kind": "build", "samples": manifest.sample_count, "shards": old_shards,
        "classes": len(manifest.classes), "settings": fmt.json_ready(fmt.recorded_build_settings(manifest.build))}]
    history.append({"generation": generation, "kind": "append", "source": source_name,
                    "samples": int(len(source_rows)), "shards": len(new_shards), "rejected": len(new_rejected),
                    "classes": len(classes), "first_shard_number": plan.first_shard_number,
                    "settings": plan.settings.to_json()})
    old_rejected = _previous_rejections(out)
    build_info = fmt.json_ready(dict(manifest.build))
    build_info.update(packed=manifest.sample_count + int(len(source_rows)),
                      rejected=len(old_rejected) + len(new_rejected))
    hashes = _hashes_after_append(existing, records) if plan.settings.hash == "perceptual" else None
    old.close()
    result = commit_dataset(out, columns, list(manifest.shards) + new_shards, classes=classes, codec=manifest.codec,
                            alignment=manifest.alignment, build_info=build_info,
                            rejected=old_rejected + new_rejected, history=history, cleanup=False,
                            max_pixels=recorded_max_pixels(manifest.max_pixels, plan.settings.checks.max_pixels),
                            hashes=hashes)
    return result, new_rejected


def _hashes_after_append(existing: _Existing, records: list[dict[str, np.ndarray]]) -> Any:
    """The hashes file's table for the new index (a dataset built with ``--hash perceptual``): the
    existing samples' hashes from the dataset's hashes file (a URL's: in the node cache; recomputed
    when it is missing, stale or damaged: ``duplicates.sidecar.load_or_compute``), then the new
    samples' from the workers."""
    from ..duplicates.phash import HashTable
    from ..duplicates.sidecar import load_or_compute
    from .._internal.machine import available_cpus

    dataset = existing.open()
    try:
        before, _ = load_or_compute(dataset, workers=available_cpus(), store=False)
    finally:
        dataset.close()
    added = record_hashes(records)
    return HashTable(hashes=np.concatenate([before.hashes, added.hashes]),
                     status=np.concatenate([before.status, added.status]))


def _discard_failed_append(out: Path) -> None:
    """After a failed append: remove its staging folder and the new shard files no manifest uses.

    The manifest on disk decides what is kept (the old one, unless the failure came after the
    commit), so a failure can never cost a sample that a manifest references.
    """
    shutil.rmtree(out / STAGING_DIR, ignore_errors=True)
    try:
        current = fmt.parse_manifest((out / fmt.MANIFEST_NAME).read_bytes())
    except (OSError, PackerError):
        return  # cannot tell what is referenced: keep every file
    keep = {entry.path for entry in current.shards}
    for path in (out / fmt.SHARD_DIR).glob("*.pks"):
        if path.relative_to(out).as_posix() not in keep:
            path.unlink(missing_ok=True)


def _previous_rejections(out: Path) -> list[Rejection]:
    """The rejected entries of earlier generations, kept in the new build report.

    The report is informational: read with the bounded, regular-file-only rules of files.py,
    and lines that are not rejection objects with string fields are dropped, never trusted.
    """
    rejected = []
    for entry in iter_json_lines(out, fmt.REPORT_NAME, must_contain=b'"rejected"'):
        fields = [entry.get("key"), entry.get("reason"), entry.get("message")]
        if entry.get("type") == "rejected" and all(isinstance(f, str) for f in fields):
            rejected.append(Rejection(*fields))
    return rejected


def settings_from_manifest(manifest: fmt.Manifest) -> BuildSettings:
    """The build settings recorded in an (informative) manifest, validated member by member
    (``settings.settings_from_record``): a member that is missing, of the wrong type or out of
    range (a hand edit, another writer) falls back to the default instead of failing the append;
    the alignment always comes from the manifest's normative ``alignment`` and the codec from its
    normative ``codec`` entry. Reads the nested ``build.settings`` and the flat ``build.options``
    of datasets built before it alike."""
    settings = settings_from_record(manifest.build, alignment=manifest.alignment, codec=manifest.codec)
    if settings is None:
        settings = settings_from_record({"settings": {}}, alignment=manifest.alignment, codec=manifest.codec)
    return settings  # type: ignore[return-value]
