"""The whole build: plan (or reuse the saved plan), pack the planned shards with an engine, finish.

``build`` is the library form of ``packer build`` (``packer.build_dataset``): it takes the build's
``BuildSettings`` (what is recorded) and this run's ``RunOptions`` (how it runs); ``finish``
combines the parts of a split build. The source's kind is detected once, at the start
(``sources.detect_kind``), and travels in the settings: the plan, the listing, the report and
the manifest all record it, and ``--resume`` compares it; nothing guesses it from the path.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from .. import format as fmt
from ..location import parse_location
from ..errors import BuildError, EmptySourceError, OptionError, OutputExistsError, PackerError, SourceError
from .._internal.progress import BuildProgress, ListingProgress
from .commit import BuildResult, finish_build, record_empty_build
from .plan import BuildPlan, load_plan, make_plan, save_plan
from .probes import FILE_KINDS, probe_mismatch, source_probes
from .settings import BuildSettings, RunOptions, parse_part, settings_and_run
from ..sources import SourceOptions, detect_kind, list_source, source_root
from .._internal.names import source_name
from ..sources.members import check_unchanged
from .staging import LOCK_NAME, PLAN_NAME, RECORD_DIR, SPOOL_DIR, STAGING_DIR, TEMP_DIR, build_lock, io_error

__all__ = ["build", "finish", "check_output", "check_output_outside_source", "prepare_plan", "parse_part",
           "shards_of_part", "run_shards", "source_options"]

logger = logging.getLogger("packer.build")


# --- planning ---------------------------------------------------------------------------------

def shards_of_part(shard_count: int, part: int, parts: int) -> list[int]:
    """Planned shards of part ``part`` of ``parts``: round-robin, so parts get similar work."""
    return list(range(part, shard_count, parts))


def source_options(settings: BuildSettings, **run: Any) -> SourceOptions:
    """The source contract's options for a build with ``settings``: its source and label settings
    as they are, its file-size limit; ``run``: how this listing runs (spool folder, progress,
    on_error, new_classes)."""
    return SourceOptions(source=settings.source, labels=settings.labels,
                         max_file_size=settings.checks.max_file_size, **run)


def _kind_refusal(then: str, now: str, what: str, fix: str, out: Path) -> BuildError:
    """The source given is of another kind than the one recorded (``what``: "... was built from")."""
    return BuildError(f"{what} a {then}, not a {now}; {fix}", path=out)


def prepare_plan(source: Path, out: Path, settings: BuildSettings, *, reuse: bool = True, progress: bool = False,
                 strict_classes: bool = False, reused_by: str = "--resume") -> BuildPlan:
    """Load the saved plan if it matches, else list the source and save a new plan.

    Args:
        settings: the build's settings, with the source kind detected (``detect_kind``).
        strict_classes: refuse the whole source when a file is not in the class list
            (``--on-error fail``), instead of rejecting those files.
        reused_by: the option that reuses the saved plan (``--resume``, ``--part``,
            ``--plan-only``), named in the error when the settings differ.

    Raises:
        OptionError: a saved plan exists with different settings (and ``reuse`` is on): the
            call is wrong, the message names each option that differs, as the user types it.
        BuildError: the saved plan was made from a source of another kind, or another source.
        SourceError: ``strict_classes`` and the source holds classes not in the list.
    """
    staging = out / STAGING_DIR
    plan_path = staging / PLAN_NAME
    kind = settings.source.kind
    if reuse and plan_path.exists():
        plan = load_plan(plan_path, source_root(source, kind, settings.source.root), source=settings.source)
        _refuse_append_plan(plan, out)
        if plan.settings.source.kind != kind:
            raise _kind_refusal(plan.settings.source.kind, kind, f"the unfinished build here ({reused_by} reuses "
                                f"its saved plan) was planned from", f"point SRC at the same source, or delete {plan_path.parent} "
                                f"to plan it again", out)
        _check_same_source(plan, source_root(source, kind, settings.source.root))
        if plan.settings != settings:
            if reused_by == "--resume":
                fix = "use the same options with --resume, or build without --resume to start over"
            else:
                fix = (f"give every --part/--plan-only/--finish step of a split build the options the plan was "
                       f"saved with, or delete {plan_path.parent} to plan it again")
            raise OptionError(f"an unfinished build with different options is in this folder ({reused_by} "
                              f"reuses its saved plan): {'; '.join(plan.settings.differences(settings))}; {fix}",
                              path=out)
        return plan
    created_staging = not staging.exists()
    try:
        with ListingProgress(enabled=progress) as counter:
            listing = list_source(source, source_options(settings, progress=counter.update,
                                                         spool_dir=staging / SPOOL_DIR,
                                                         on_error="fail" if strict_classes else "skip"))
    except BaseException:
        # a refused source (a bomb, a damaged archive, a full disk) leaves no spool in OUT
        shutil.rmtree(staging / SPOOL_DIR, ignore_errors=True)
        if created_staging:
            shutil.rmtree(staging, ignore_errors=True)
        raise
    plan = make_plan(listing, settings, source=source.name, source_probes=source_probes(source, kind, listing))
    try:
        staging.mkdir(parents=True, exist_ok=True)
        (staging / RECORD_DIR).mkdir(exist_ok=True)
        save_plan(plan, plan_path)
    except OSError as exc:
        raise io_error(exc, "saving the build plan", plan_path) from None
    return plan


def _refuse_append_plan(plan: BuildPlan, out: Path) -> None:
    """An interrupted ``packer append`` left its plan here: it must never be finished as a build
    (that would replace the dataset with only the appended samples)."""
    if plan.first_shard_number != 0:
        raise BuildError("the unfinished work in this folder is an interrupted `packer append`, not a build; "
                         "run the same `packer append` again (it starts over), or build without "
                         "--resume/--part to replace the dataset", path=out)


def _check_same_source(plan: BuildPlan, source_root: Path, probes: int = 16) -> None:
    """A reused plan must describe this source: spot-check a spread of listed files' sizes.

    Listing ten million files again for every part would cost more than the check is worth;
    a spread of probes catches a part pointed at the wrong folder or a re-generated source.
    """
    listing = plan.listing
    if listing.members is not None:  # an archive source: the archives themselves must be unchanged
        check_unchanged(listing.members)
        return
    count = len(listing)
    for i in sorted({int(x) for x in np.linspace(0, count - 1, num=min(probes, count))}):
        key = listing.key(i)
        try:
            real = source_name(key, listing.metadata(i))  # an escaped key names other bytes
            size = os.stat(source_root / (key if real is None else os.fsdecode(real))).st_size
        except OSError:
            size = -1
        if size != int(listing.sizes[i]):
            raise BuildError(f"the unfinished build here was planned from a different source: {key!r} is "
                             f"{'missing' if size < 0 else f'{size} bytes'} under {source_root}, the plan says "
                             f"{int(listing.sizes[i])} bytes; point SRC at the same folder, or start over "
                             f"without --resume", path=source_root)


# --- packing one planned shard ----------------------------------------------------------------

def check_output(out: Path, overwrite: bool) -> None:
    """Make OUT (a folder) if needed and refuse one that is not a writable folder, or that holds a
    dataset unless ``overwrite``.

    Raises:
        SourceError, BuildError, OutputExistsError.
    """
    if out.exists() and not out.is_dir():
        raise SourceError("output exists and is not a folder", path=out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise io_error(exc, "creating the output folder", out) from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise BuildError("the output folder is not writable", path=out)
    if (out / fmt.MANIFEST_NAME).exists() and not overwrite:
        raise OutputExistsError("a dataset already exists here; pass --overwrite to replace it", path=out)


def check_output_outside_source(source: Path, out: Path) -> None:
    """Refuse an output folder equal to, or inside, an image-folder source.

    A dataset inside its own source would be listed by the next build: ``shards/`` becomes a
    class and every label after it shifts. (A manifest source lists its files explicitly, so an
    output next to it is fine.)

    Raises:
        SourceError: OUT is SRC or lies inside it (exit 2).
    """
    if not source.is_dir():
        return
    real_source = os.path.realpath(source)
    real_out = os.path.realpath(out)
    if os.path.commonpath([real_source, real_out]) == real_source:
        where = "is the source folder" if real_out == real_source else "is inside the source folder"
        raise SourceError(f"the output folder {where} ({real_source}): the next build would pack the "
                          f"dataset's own files as images; choose an OUT outside SRC", path=out)


def build(source: str | os.PathLike[str], out: str | os.PathLike[str], settings: BuildSettings | None = None,
          run: RunOptions | None = None, **legacy: Any) -> BuildResult | None:
    """Build a dataset from ``source`` into ``out`` (``packer.build_dataset``; the library form of
    ``packer build``).

    ``out`` may be a dataset URL (``s3://bucket/ds``, ``gs://``, ``az://``, ``file://``): the build
    packs into a staging folder of the node cache, then uploads it, the manifest last
    (``packer.writer.remote_out``; ``run.remote`` takes ``packer.remote.RemoteOptions``).

    Args:
        source: an ImageFolder-layout folder, a ``.csv``/``.tsv``/``.jsonl`` manifest, an archive
            (tar, tar of tars, compressed tar, zip), WebDataset shards (a tar, a folder, a brace
            pattern), Parquet, a COCO annotation file, or a Hugging Face ``save_to_disk`` folder.
        out: the output folder or URL.
        settings: what the build records and what decides its bytes (``packer.BuildSettings``;
            default: every default). Its source kind is detected from the source's bytes
            (unless it names one) and recorded.
        run: how this run goes (``packer.RunOptions``: workers, engine, part, resume, ...).
        legacy: the old spelling, for one release (a ``BuildOptions`` as ``settings`` or
            ``options=``, and ``workers=``, ``root=``, ``source_kind=``, ...): converted by
            ``settings.settings_and_run`` with a ``DeprecationWarning``.

    Returns:
        The BuildResult, or None when only a part was packed or only the plan was saved.

    Raises:
        SourceError, EmptySourceError, OutputExistsError, BuildLockedError, BuildError, OptionError.
    """
    settings, run = settings_and_run(settings, run, legacy)
    location = parse_location(out, what="OUT")
    if location.url is not None:  # packed in a staging folder, then uploaded, the manifest last
        from .remote_out import build_to_url

        return build_to_url(_build, source, location.url.text, settings, run)
    return _build(source, location.local_path(), settings, run)


def _build(source: str | os.PathLike[str], out: str | os.PathLike[str], settings: BuildSettings,
           run: RunOptions) -> BuildResult | None:
    started = time.monotonic()
    source_path, out_path = Path(source), Path(out)
    settings.check()  # before the output folder or its lock file exist
    run.check()
    check_engine(run.engine)  # a missing Ray fails here, before listing, planning or any file is written
    if not source_path.exists() and "{" not in str(source):  # a brace pattern names WebDataset shards
        raise SourceError("source does not exist", path=source_path)
    check_output_outside_source(source_path, out_path)
    settings = settings.detected(detect_kind(source, settings.source.kind))  # once: recorded from here on
    # --resume continues a build that was replacing a dataset, or that committed and was killed
    # while cleaning up: its saved plan shows it was allowed to write here.
    continuing = run.resume and not run.split and (out_path / STAGING_DIR / PLAN_NAME).is_file()
    if (run.resume and not run.split and not run.overwrite and not continuing
            and (out_path / fmt.MANIFEST_NAME).is_file()):
        # A requeued job after success: the dataset is the result, not an obstacle.
        return _already_complete(source_path, out_path, settings, started)
    created = not out_path.exists()
    check_output(out_path, run.overwrite or run.split or continuing)
    if run.split and (out_path / fmt.MANIFEST_NAME).exists() and not run.overwrite:
        raise OutputExistsError("a dataset already exists here; pass --overwrite to replace it", path=out_path)
    try:
        return _build_locked(source_path, out_path, settings, run, started, continuing=continuing)
    except SourceError:  # the input is unusable: leave no half-made output behind
        _drop_lock_file(out_path, remove_empty=created)
        raise


def _build_locked(source_path: Path, out_path: Path, settings: BuildSettings, run: RunOptions, started: float, *,
                  continuing: bool) -> BuildResult | None:
    with build_lock(out_path, shared=run.split):
        if not (run.overwrite or continuing) and (out_path / fmt.MANIFEST_NAME).exists():
            # Checked again under the lock: another build may have committed since the check above.
            raise OutputExistsError("a dataset already exists here; pass --overwrite to replace it",
                                    path=out_path)
        staging = out_path / STAGING_DIR
        if not run.split and not run.resume and staging.exists():
            shutil.rmtree(staging)  # a stale, unfinished build: start over (use --resume to continue)
        try:
            plan = prepare_plan(source_path, out_path, settings, reuse=run.resume or run.split, progress=run.progress,
                                strict_classes=run.on_error == "fail",
                                reused_by="--part" if run.part is not None else "--plan-only" if run.plan_only
                                else "--resume")
        except EmptySourceError as exc:
            if not (run.part is not None and (staging / PLAN_NAME).is_file()):  # not a part of a live split build
                record_empty_build(out_path, exc, settings)
            raise
        logger.info("planned %d shard(s) for %d file(s) (%d rejected while listing)", plan.shard_count,
                    len(plan.listing), len(plan.listing.rejected))
        if run.plan_only:
            return None
        if not run.split:
            shutil.rmtree(staging / TEMP_DIR, ignore_errors=True)
        shard_ids = (shards_of_part(plan.shard_count, *run.part) if run.part is not None
                     else list(range(plan.shard_count)))
        run_shards(plan, out_path, shard_ids, workers=run.workers, engine=run.engine, address=run.address,
                   progress=run.progress, fail_on_reject=run.on_error == "fail")
        if run.part is not None:
            return None
        try:
            result = finish_build(plan, out_path)
        except EmptySourceError as exc:  # every listed file was rejected while packing
            record_empty_build(out_path, exc, plan.settings)
            raise
    result.seconds = time.monotonic() - started
    logger.info("committed %d samples in %d shard(s) to %s", result.sample_count, result.shard_count, out_path)
    return result


def _drop_lock_file(out: Path, *, remove_empty: bool) -> None:
    """A build refused for its input leaves no lock file or staging behind: OUT then holds only
    the build report of a build that packed nothing, or (if this build created it) is gone."""
    if (out / fmt.MANIFEST_NAME).exists() or (out / STAGING_DIR).exists():
        return
    (out / LOCK_NAME).unlink(missing_ok=True)
    if remove_empty:
        try:
            out.rmdir()  # only if empty: never removes anything but the folder this build made
        except OSError:
            pass


def _recorded_settings(info: dict[str, Any], asked: BuildSettings) -> BuildSettings | None:
    """The settings a finished dataset's build record holds (strictly read: a record that does
    not parse is no record), the door options older records lack taken as asked."""
    nested = fmt.recorded_build_settings(info)
    if nested is None:
        return None
    try:
        return BuildSettings.from_json(nested, unrecorded_source=asked.source)
    except PackerError:
        return None


def _already_complete(source: Path, out: Path, settings: BuildSettings, started: float) -> BuildResult:
    """``--resume`` on a finished dataset: complete when it was built from this source (of the same
    kind, its probed files unchanged) with these settings (exit 0, nothing rewritten); otherwise a
    clear error.

    Raises:
        BuildError: the dataset here was built from a source of another kind, from another
            source, or with other settings.
    """
    from ..dataset import open_index

    with build_lock(out), open_index(out) as index:
        info = index.manifest.build if isinstance(index.manifest.build, dict) else {}
        built_with = _recorded_settings(info, settings)
        if built_with is None:
            raise BuildError("--resume: a finished dataset is here, but its build settings are not recorded; "
                             "pass --overwrite to rebuild it", path=out)
        kind = settings.source.kind
        if built_with.source.kind != kind:
            raise _kind_refusal(built_with.source.kind, kind, "--resume: the finished dataset here was built from",
                                "pass --overwrite to rebuild it", out)
        differ = built_with.differences(settings, then="built", now="asked")
        if differ:
            raise BuildError(f"--resume: a finished dataset is here, built with other options ({'; '.join(differ)}); "
                             f"pass --overwrite to rebuild it, or use the options it was built with", path=out)
        probes = info.get("source_probes")
        # Records before the nested settings probed archive members by key: no file to check.
        checkable = isinstance(probes, dict) and ("settings" in info or kind in FILE_KINDS)
        changed = probe_mismatch(source, kind, settings.source.root, probes) if checkable else None
        if changed:
            raise BuildError(f"--resume: the finished dataset here was built from a different source: {changed}; "
                             f"pass --overwrite to rebuild", path=out)
        shards = index.manifest.shards
        payload = int(index.sizes.sum())
        total = sum(s.size for s in shards) + index.manifest.index.size
        logger.info("%s is already complete (%d samples); nothing to do", out, len(index))
        return BuildResult(path=out, sample_count=len(index), shard_count=len(shards), rejected=[],
                           payload_bytes=payload, total_bytes=total, seconds=time.monotonic() - started,
                           summary=dict(info), classes=tuple(index.classes), already_complete=True,
                           source_verified=checkable)


def finish(out: str | os.PathLike[str], source: str | os.PathLike[str] | None = None,
           root: str | os.PathLike[str] | None = None, *, overwrite: bool = False) -> BuildResult:
    """Combine the parts of a split build into the dataset (``packer build --finish``), with the
    settings its saved plan records.

    Raises:
        BuildError: no split build here, a part is missing, or the staged plan is an append's.
        OutputExistsError: a dataset already exists and ``overwrite`` is off.
    """
    out_path = Path(out)
    plan_path = out_path / STAGING_DIR / PLAN_NAME
    if not plan_path.exists():
        raise BuildError("no split build to finish here (no saved plan); run the parts first", path=out_path)
    with build_lock(out_path):
        if (out_path / fmt.MANIFEST_NAME).exists() and not overwrite:
            raise OutputExistsError("a dataset already exists here; pass --overwrite (as the parts did) to "
                                    "replace it", path=out_path)
        plan = load_plan(plan_path, Path("."))
        if source is not None:  # the keys' folder, by the kind the plan recorded (informative here)
            plan.listing.root = source_root(source, plan.settings.source.kind, root)
        _refuse_append_plan(plan, out_path)
        try:
            return finish_build(plan, out_path)
        except EmptySourceError as exc:
            record_empty_build(out_path, exc, plan.settings)
            raise


# --- engines ----------------------------------------------------------------------------------

def check_engine(engine: str) -> None:
    """Refuse ``"ray"`` where Ray is not installed, before any work (an unknown engine is refused by
    ``RunOptions.check``).

    Raises:
        MissingDependencyError: ``"ray"`` without Ray.
    """
    if engine == "ray":
        from .engines.ray_engine import require_ray

        require_ray()


def run_shards(plan: BuildPlan, out: Path, shard_ids: list[int], *, workers: int | None, engine: str,
               address: str | None, progress: bool, fail_on_reject: bool) -> None:
    """Pack the given planned shards with the chosen engine, showing one progress bar."""
    total_files = int(sum(plan.shard_starts[s + 1] - plan.shard_starts[s] for s in shard_ids))
    total_bytes = int(sum(int(plan.listing.sizes[plan.shard_members(s)].sum()) for s in shard_ids))
    with BuildProgress(total_files, total_bytes, enabled=progress) as bar:
        if engine == "ray":
            from .engines.ray_engine import run_with_ray
            run_with_ray(plan, out, shard_ids, address=address, progress=bar.update,
                         fail_on_reject=fail_on_reject)
        else:  # "local": RunOptions.check refused anything else before the build started
            from .engines.local import run_local
            run_local(plan, out, shard_ids, workers=workers, progress=bar.update, fail_on_reject=fail_on_reject)
