"""The whole build: plan (or reuse the saved plan), pack the planned shards with an engine, finish.

``build`` is the library form of ``packer build``; ``finish`` combines the parts of a split build.
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
from ..errors import BuildError, EmptySourceError, OptionError, OutputExistsError, SourceError
from ..progress import BuildProgress, ListingProgress
from .commit import BuildResult, finish_build, record_empty_build
from .plan import BuildOptions, BuildPlan, load_plan, make_plan, save_plan
from ..sources import SourceOptions, list_source
from ..names import source_name
from ..sources.members import check_unchanged
from .staging import LOCK_NAME, PLAN_NAME, RECORD_DIR, SPOOL_DIR, STAGING_DIR, TEMP_DIR, build_lock, io_error

__all__ = ["build", "finish", "check_workers", "check_output_outside_source", "prepare_plan", "parse_part",
           "shards_of_part", "run_shards", "source_options"]

logger = logging.getLogger("packer.build")


# --- planning ---------------------------------------------------------------------------------

def parse_part(text: str) -> tuple[int, int]:
    """Parse ``"K/N"`` (0-based K) into (K, N)."""
    try:
        k_text, n_text = text.split("/")
        k, n = int(k_text), int(n_text)
    except ValueError:
        raise OptionError(f"--part must look like K/N (e.g. 0/4), got {text!r}") from None
    if not (n >= 1 and 0 <= k < n):
        raise OptionError(f"--part {text}: need 0 <= K < N")
    return k, n


def shards_of_part(shard_count: int, part: int, parts: int) -> list[int]:
    """Planned shards of part ``part`` of ``parts``: round-robin, so parts get similar work."""
    return list(range(part, shard_count, parts))


def options_difference(saved: BuildOptions, asked: BuildOptions) -> str:
    """The options that differ, one ``name: saved X, asked Y`` each (not the two whole sets)."""
    then, now = saved.to_json(), asked.to_json()
    return "; ".join(f"{key}: saved {then.get(key, '(default)')!r}, asked {now.get(key, '(default)')!r}"
                     for key in sorted(set(then) | set(now)) if then.get(key) != now.get(key))


def prepare_plan(source: Path, out: Path, options: BuildOptions, *, root: Path | None = None,
                 reuse: bool = True, progress: bool = False, strict_classes: bool = False,
                 source_kind: str = "auto", label_field: str = "label", image_column: str | None = None,
                 reused_by: str = "--resume") -> BuildPlan:
    """Load the saved plan if it matches, else list the source and save a new plan.

    Args:
        strict_classes: refuse the whole source when a file is not in ``options.classes``
            (``--on-error fail``), instead of rejecting those files.
        reused_by: the option that reuses the saved plan (``--resume``, ``--part``,
            ``--plan-only``), named in the error when the options differ.

    Raises:
        OptionError: a saved plan exists with different options (and ``reuse`` is on): the
            call is wrong, the message names each option that differs.
        SourceError: ``strict_classes`` and the source holds classes not in the list.
    """
    staging = out / STAGING_DIR
    plan_path = staging / PLAN_NAME
    source_root = root if root is not None else (source.parent if source.is_file() else source)
    if reuse and plan_path.exists():
        plan = load_plan(plan_path, source_root)
        _refuse_append_plan(plan, out)
        _check_same_source(plan, source_root)
        if plan.options != options:
            if reused_by == "--resume":
                fix = "use the same options with --resume, or build without --resume to start over"
            else:
                fix = (f"give every --part/--plan-only/--finish step of a split build the options the plan was "
                       f"saved with, or delete {plan_path.parent} to plan it again")
            raise OptionError(f"an unfinished build with different options is in this folder ({reused_by} "
                              f"reuses its saved plan): {options_difference(plan.options, options)}; {fix}",
                              path=out)
        return plan
    created_staging = not staging.exists()
    try:
        with ListingProgress(enabled=progress) as counter:
            listing = list_source(source, source_options(options, root=root, progress=counter.update,
                                                         spool_dir=staging / SPOOL_DIR, source_kind=source_kind,
                                                         label_field=label_field, image_column=image_column,
                                                         on_error="fail" if strict_classes else "skip"))
    except BaseException:
        # a refused source (a bomb, a damaged archive, a full disk) leaves no spool in OUT
        shutil.rmtree(staging / SPOOL_DIR, ignore_errors=True)
        if created_staging:
            shutil.rmtree(staging, ignore_errors=True)
        raise
    plan = make_plan(listing, options, source=source.name)
    try:
        staging.mkdir(parents=True, exist_ok=True)
        (staging / RECORD_DIR).mkdir(exist_ok=True)
        save_plan(plan, plan_path)
    except OSError as exc:
        raise io_error(exc, "saving the build plan", plan_path) from None
    return plan


def source_options(options: BuildOptions, **door: object) -> SourceOptions:
    """The source contract's options for a build with ``options``: the class list, label type and
    size limits the build asks for (``door``: the ``SourceOptions`` fields that say how to read it)."""
    return SourceOptions(fields=options.field_specs, classes=options.classes, label_type=options.label_type,
                         max_file_size=options.max_file_size, **door)  # type: ignore[arg-type]


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

def _check_output(out: Path, overwrite: bool) -> None:
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


def check_workers(workers: int | None) -> None:
    """Refuse a worker count that is not a positive integer (None means: available cores).

    Raises:
        OptionError: naming ``--workers`` and what is allowed.
    """
    if workers is not None and (not isinstance(workers, int) or isinstance(workers, bool) or workers < 1):
        raise OptionError(f"--workers must be a positive number of processes, got {workers!r}")


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


def build(source: str | os.PathLike[str], out: str | os.PathLike[str], options: BuildOptions = BuildOptions(),
          *, workers: int | None = None, overwrite: bool = False, resume: bool = False,
          on_error: str = "skip", root: str | os.PathLike[str] | None = None,
          part: tuple[int, int] | None = None, plan_only: bool = False, engine: str = "local",
          address: str | None = None, source_kind: str = "auto", label_field: str = "label",
          image_column: str | None = None, progress: bool = False, remote: Any = None) -> BuildResult | None:
    """Build a dataset from ``source`` into ``out`` (the library form of ``packer build``).

    ``out`` may be a dataset URL (``s3://bucket/ds``, ``gs://``, ``az://``, ``file://``): the build
    packs into a staging folder of the node cache, then uploads it, the manifest last
    (``packer.writer.remote_out``; ``remote`` takes ``packer.remote.RemoteOptions``).

    Args:
        source: an ImageFolder-layout folder, a ``.csv``/``.jsonl`` manifest, or an archive
            source (tar, tar of tars, zip, WebDataset shards or brace pattern: ``packer/sources/``).
        out: the output folder.
        options: everything that changes the output bytes.
        workers: processes packing shards (default: available cores). Output is identical for any value.
        overwrite: replace an existing dataset (it stays readable until the new manifest lands).
        resume: continue an interrupted build with the same options, reusing finished shards.
        on_error: ``"skip"`` (reject and report bad files) or ``"fail"`` (stop at the first).
        root: the folder manifest paths are relative to (default: the manifest's folder).
        part: ``(K, N)``: pack only part K of N and return None; run ``finish`` afterwards.
        plan_only: list the source and save the plan (for the parts to share), then return None.
        engine: ``"local"`` (process pool) or ``"ray"``.
        address: the Ray cluster address for ``engine="ray"``.
        source_kind: ``"auto"`` (recognised by content) or a kind of ``archives.SOURCE_KINDS``.
        label_field: the WebDataset ``.json`` field, or the Parquet column, that holds the label.
        image_column: the Parquet column holding the images (default: found by its type).
        progress: show a tqdm bar on stderr; off by default in the library (the CLI turns it
            on): library calls only log, to the ``packer`` loggers (warnings reach stderr).

    Returns:
        The BuildResult, or None when only a part was packed.

    Raises:
        SourceError, EmptySourceError, OutputExistsError, BuildLockedError, BuildError.
    """
    location = parse_location(out, what="OUT")
    if location.url is not None:  # packed in a staging folder, then uploaded, the manifest last
        from .remote_out import build_to_url

        return build_to_url(build, source, location.url.text, options, remote=remote, overwrite=overwrite,
                            resume=resume, workers=workers, on_error=on_error, root=root, part=part,
                            plan_only=plan_only, engine=engine, address=address, source_kind=source_kind,
                            label_field=label_field, image_column=image_column, progress=progress)
    out = location.local_path()
    started = time.monotonic()
    source_path, out_path = Path(source), Path(out)
    if on_error not in ("skip", "fail"):
        raise OptionError(f"--on-error must be 'skip' or 'fail', got {on_error!r}")
    options.check()  # before the output folder or its lock file exist
    check_workers(workers)
    check_engine(engine)  # a missing Ray fails here, before listing, planning or any file is written
    if not source_path.exists() and "{" not in str(source):  # a brace pattern names WebDataset shards
        raise SourceError("source does not exist", path=source_path)
    check_output_outside_source(source_path, out_path)
    # --resume continues a build that was replacing a dataset, or that committed and was killed
    # while cleaning up: its saved plan shows it was allowed to write here.
    split = part is not None or plan_only  # one step of a split build: shares the folder with others
    continuing = resume and not split and (out_path / STAGING_DIR / PLAN_NAME).is_file()
    if resume and not split and not overwrite and not continuing and (out_path / fmt.MANIFEST_NAME).is_file():
        # A requeued job after success: the dataset is the result, not an obstacle.
        return _already_complete(source_path, out_path, options, Path(root) if root is not None else None,
                                 started)
    created = not out_path.exists()
    _check_output(out_path, overwrite or split or continuing)
    if split and (out_path / fmt.MANIFEST_NAME).exists() and not overwrite:
        raise OutputExistsError("a dataset already exists here; pass --overwrite to replace it", path=out_path)
    root_path = Path(root) if root is not None else None
    try:
        return _build_locked(source_path, out_path, options, root_path, started, workers=workers,
                             overwrite=overwrite, resume=resume, continuing=continuing, on_error=on_error,
                             part=part, plan_only=plan_only, split=split, engine=engine, address=address,
                             progress=progress, source_kind=source_kind, label_field=label_field,
                             image_column=image_column)
    except SourceError:  # the input is unusable: leave no half-made output behind
        _drop_lock_file(out_path, remove_empty=created)
        raise


def _build_locked(source_path: Path, out_path: Path, options: BuildOptions, root_path: Path | None,
                  started: float, *, workers: int | None, overwrite: bool, resume: bool, continuing: bool,
                  on_error: str, part: tuple[int, int] | None, plan_only: bool, split: bool, engine: str,
                  address: str | None, progress: bool, source_kind: str = "auto",
                  label_field: str = "label", image_column: str | None = None) -> BuildResult | None:
    with build_lock(out_path, shared=split):
        if not (overwrite or continuing) and (out_path / fmt.MANIFEST_NAME).exists():
            # Checked again under the lock: another build may have committed since the check above.
            raise OutputExistsError("a dataset already exists here; pass --overwrite to replace it",
                                    path=out_path)
        staging = out_path / STAGING_DIR
        if not split and not resume and staging.exists():
            shutil.rmtree(staging)  # a stale, unfinished build: start over (use --resume to continue)
        try:
            plan = prepare_plan(source_path, out_path, options, root=root_path, reuse=resume or split,
                                progress=progress, strict_classes=on_error == "fail",
                                source_kind=source_kind, label_field=label_field,
                                image_column=image_column,
                                reused_by="--part" if part is not None else "--plan-only" if plan_only else "--resume")
        except EmptySourceError as exc:
            if not (part is not None and (staging / PLAN_NAME).is_file()):  # not a part of a live split build
                record_empty_build(out_path, exc, options.to_json(), source_kind=getattr(exc, "source_kind", None)
                                   or ("manifest" if source_path.is_file() else "folder"))
            raise
        logger.info("planned %d shard(s) for %d file(s) (%d rejected while listing)", plan.shard_count,
                    len(plan.listing), len(plan.listing.rejected))
        if plan_only:
            return None
        if not split:
            shutil.rmtree(staging / TEMP_DIR, ignore_errors=True)
        shard_ids = (shards_of_part(plan.shard_count, *part) if part is not None
                     else list(range(plan.shard_count)))
        run_shards(plan, out_path, shard_ids, workers=workers, engine=engine, address=address,
                   progress=progress, fail_on_reject=on_error == "fail")
        if part is not None:
            return None
        try:
            result = finish_build(plan, out_path)
        except EmptySourceError as exc:  # every listed file was rejected while packing
            record_empty_build(out_path, exc, options.to_json(), source_kind=plan.listing.kind)
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


def _already_complete(source: Path, out: Path, options: BuildOptions, root: Path | None,
                      started: float) -> BuildResult:
    """``--resume`` on a finished dataset: complete when it was built from this source with these
    options (exit 0, nothing rewritten); otherwise a clear error.

    Raises:
        BuildError: the dataset here was built with other options or from another source.
    """
    from ..dataset import open_index

    with build_lock(out), open_index(out) as index:
        info = index.manifest.build if isinstance(index.manifest.build, dict) else {}
        stored = info.get("options")
        try:
            built_with = BuildOptions(**stored) if isinstance(stored, dict) else None
        except TypeError:
            built_with = None
        if built_with != options:
            asked = options.to_json()
            then = built_with.to_json() if built_with is not None else {}
            differ = ", ".join(f"{k}: built {then.get(k, '?')!r}, asked {v!r}" for k, v in sorted(asked.items())
                               if then.get(k) != v) if built_with is not None else "its options are not recorded"
            raise BuildError(f"--resume: a finished dataset is here, built with other options ({differ}); pass "
                             f"--overwrite to rebuild it, or use the options it was built with", path=out)
        kind = "manifest" if source.is_file() else "folder"
        if info.get("source_kind") not in (None, kind):
            raise BuildError(f"--resume: the finished dataset here was built from a {info.get('source_kind')}, "
                             f"not a {kind}; pass --overwrite to rebuild it", path=out)
        source_root = root if root is not None else (source.parent if source.is_file() else source)
        probes = info.get("source_probes")  # informational: checked for type, never trusted
        for key, size in (probes.items() if isinstance(probes, dict) else ()):
            if (not isinstance(size, int) or isinstance(size, bool) or not key or key.startswith("/")
                    or ".." in key.split("/")):
                continue
            try:
                now = os.stat(source_root / key).st_size
            except OSError:
                now = -1
            if now != size:
                raise BuildError(f"--resume: the finished dataset here was built from a different source: {key!r} "
                                 f"is {'missing' if now < 0 else f'{now} bytes'} under {source_root}, it was "
                                 f"{size} bytes; pass --overwrite to rebuild", path=out)
        shards = index.manifest.shards
        payload = int(index.sizes.sum())
        total = sum(s.size for s in shards) + index.manifest.index.size
        logger.info("%s is already complete (%d samples); nothing to do", out, len(index))
        return BuildResult(path=out, sample_count=len(index), shard_count=len(shards), rejected=[],
                           payload_bytes=payload, total_bytes=total, seconds=time.monotonic() - started,
                           summary=dict(info), classes=tuple(index.classes), already_complete=True,
                           source_verified=isinstance(probes, dict))


def finish(out: str | os.PathLike[str], source: str | os.PathLike[str] | None = None,
           root: str | os.PathLike[str] | None = None, *, overwrite: bool = False) -> BuildResult:
    """Combine the parts of a split build into the dataset (``packer build --finish``).

    Raises:
        BuildError: no split build here, a part is missing, or the staged plan is an append's.
        OutputExistsError: a dataset already exists and ``overwrite`` is off.
    """
    out_path = Path(out)
    plan_path = out_path / STAGING_DIR / PLAN_NAME
    if not plan_path.exists():
        raise BuildError("no split build to finish here (no saved plan); run the parts first", path=out_path)
    source_root = Path(root) if root is not None else (
        (Path(source).parent if Path(source).is_file() else Path(source)) if source is not None else Path("."))
    with build_lock(out_path):
        if (out_path / fmt.MANIFEST_NAME).exists() and not overwrite:
            raise OutputExistsError("a dataset already exists here; pass --overwrite (as the parts did) to "
                                    "replace it", path=out_path)
        plan = load_plan(plan_path, source_root)
        _refuse_append_plan(plan, out_path)
        try:
            return finish_build(plan, out_path)
        except EmptySourceError as exc:
            record_empty_build(out_path, exc, plan.options.to_json(), source_kind=plan.listing.kind)
            raise


# --- engines ----------------------------------------------------------------------------------

def check_engine(engine: str) -> None:
    """Refuse an unknown engine, or ``"ray"`` where Ray is not installed, before any work.

    Raises:
        OptionError: not ``"local"`` or ``"ray"``.
        MissingDependencyError: ``"ray"`` without Ray.
    """
    if engine == "ray":
        from .engines.ray_engine import require_ray

        require_ray()
    elif engine != "local":
        raise OptionError(f"unknown engine {engine!r} (use 'local' or 'ray')")


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
        else:  # "local": check_engine refused anything else before the build started
            from .engines.local import run_local
            run_local(plan, out, shard_ids, workers=workers, progress=bar.update, fail_on_reject=fail_on_reject)
