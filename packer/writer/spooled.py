"""Samples written from Python, from spools to a dataset: the output (a folder or a URL), its lock
and staging, and the commit, through the same steps as ``packer build``.

``packer.Writer`` and ``packer.pack`` spool samples (``sources/python.py``); this module owns what
happens around and after: the output folder is checked and locked as a build's is, the spools
live in its staging folder (``OUT/.packer-build/spool``), and at the end the spools' listing goes
through the source contract (``apply_contract``), the seeded plan (``make_plan``), the packing
engines (``run_shards``: the same checks and codec as every file of a build) and the commit
(``finish_build``: the manifest last), then the staging folder goes. A URL output spools into the
node cache (beside the build staging folder ``remote_out`` uses) and commits through
``remote_out.build_to_url``: packed locally, uploaded, the manifest last.

Nothing here runs while samples are written: a killed writer leaves a staging folder and no
manifest (nothing opens), removed by the next build, Writer or pack into the same output.
"""

from __future__ import annotations

import logging
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from .. import format as fmt
from ..errors import BuildError, EmptySourceError, OptionError, OutputExistsError
from ..location import parse_location
from ..sources import apply_contract
from ..sources.listing import RawListing
from ..sources.members import check_unchanged
from .commit import BuildResult, finish_build, record_empty_build
from .plan import BuildPlan, load_plan, make_plan, save_plan
from .run import check_engine, check_output, run_shards, source_options
from .settings import BuildSettings, LayoutSettings, RunOptions, SourceSettings
from .staging import LOCK_NAME, PLAN_NAME, RECORD_DIR, SPOOL_DIR, STAGING_DIR, TEMP_DIR, build_lock, io_error

__all__ = ["UNSET", "python_settings", "PythonOutput", "open_output", "commit_listing", "print_summary"]

logger = logging.getLogger("packer.build")

#: The shorthand keywords of ``packer.Writer`` and ``packer.pack``, and where each goes.
_LAYOUT = ("shard_size", "alignment", "shuffle", "seed")
_RUN = ("workers", "engine", "address", "on_error", "overwrite", "progress", "remote")
UNSET: Any = object()


def python_settings(settings: BuildSettings | None, run: RunOptions | None, *, call: str, classes: Any = None,
                    fields: Any = None, codec: Any = UNSET, label_type: Any = UNSET, **keywords: Any
                    ) -> tuple[BuildSettings, RunOptions]:
    """The ``(BuildSettings, RunOptions)`` of a Writer or pack: ``settings`` and ``run`` as given
    (default: every default), with the shorthand keywords (``classes``, ``fields``, ``codec``,
    ``shard_size``, ``seed``, ``workers``, ``on_error``, ...) set on them, and the source kind
    ``"python"``.

    Raises:
        OptionError: a keyword given both as a shorthand and in ``settings``/``run`` with another
            value, a source kind other than ``"python"``, an unknown keyword, impossible settings.
    """
    unknown = sorted(set(keywords) - set(_LAYOUT) - set(_RUN))
    if unknown:
        raise OptionError(f"{call}() got an unexpected keyword argument {unknown[0]!r}")
    if settings is None:
        settings = BuildSettings()
    if not isinstance(settings, BuildSettings):
        raise OptionError(f"{call}: settings must be a packer.BuildSettings, got {type(settings).__name__}")
    if run is None:
        run = RunOptions()
    if not isinstance(run, RunOptions):
        raise OptionError(f"{call}: run must be a packer.RunOptions, got {type(run).__name__}")
    if settings.source.kind not in ("auto", "python"):
        raise OptionError(f"{call}: samples written from Python record the source kind 'python', not "
                          f"{settings.source.kind!r}")
    defaults = BuildSettings()

    def given(value: Any, current: Any, default: Any, name: str) -> Any:
        if value is UNSET or value is None and default is None:
            return current
        if current != default and current != value:
            raise OptionError(f"{call}: {name}= is given twice (as a keyword and in settings/run) with different "
                              f"values; give it once")
        return value

    layout = settings.layout
    for name in _LAYOUT:
        if name in keywords:
            layout = replace(layout, **{name: given(keywords[name], getattr(layout, name),
                                                    getattr(LayoutSettings(), name), name)})
    labels = settings.labels
    if classes is not None:
        labels = replace(labels, classes=given(tuple(classes) if isinstance(classes, list) else classes,
                                               labels.classes, None, "classes"), classes_origin="classes=")
    if fields is not None:
        labels = replace(labels, fields=tuple(given(tuple(fields), labels.fields, (), "fields")))
    if label_type is not UNSET:
        labels = replace(labels, label_type=given(label_type, labels.label_type, "auto", "label_type"))
    settings = replace(settings, source=SourceSettings(kind="python", label_field=settings.source.label_field),
                       layout=layout, labels=labels,
                       codec=given(codec, settings.codec, defaults.codec, "codec"))
    for name in _RUN:
        if name in keywords:
            run = replace(run, **{name: given(keywords[name], getattr(run, name), getattr(RunOptions(), name), name)})
    settings.check()
    run.check()
    return settings, run


# --- the output ------------------------------------------------------------------------------------------

class PythonOutput:
    """A locked output for samples written from Python: ``spool_dir`` to spool into, ``commit`` to
    make the dataset, ``close`` to let go (removing the staging folder unless it is to be resumed).

    Local: OUT itself, locked like a build (``build_lock``), its staging ``OUT/.packer-build``.
    URL: a folder of the node cache holds the spools; the dataset is packed in the staging folder
    ``remote_out`` uses, uploaded, the manifest last.
    """

    def __init__(self, out: Any, run: RunOptions, *, call: str, keep: bool = False, shared: bool = False) -> None:
        self.run = run
        self.call = call
        self.keep = keep  # resume / part: the staging folder of an earlier run is kept and reused
        location = parse_location(out, what="OUT")
        self.url = location.url
        self._lock: build_lock | None = None
        self.created = False
        if self.url is not None:
            self._open_url(shared)
        else:
            self._open_local(location.local_path(), shared)

    def _open_local(self, out: Path, shared: bool) -> None:
        self.folder = out
        self.created = not out.exists()
        resuming = self.keep and (out / STAGING_DIR).is_dir()
        allowed = self.run.overwrite or resuming or shared
        if not allowed and (out / fmt.MANIFEST_NAME).exists():
            raise OutputExistsError("a dataset already exists here; pass overwrite=True to replace it", path=out)
        check_output(out, overwrite=True)
        self._lock = build_lock(out, shared=shared).__enter__()
        if not (self.run.overwrite or resuming or shared) and (out / fmt.MANIFEST_NAME).exists():
            self.close(failed=True)
            raise OutputExistsError("a dataset already exists here; pass overwrite=True to replace it", path=out)
        self.staging = out / STAGING_DIR
        if not self.keep:
            shutil.rmtree(self.staging, ignore_errors=True)  # a killed writer's or build's: start over
        self.spool_dir = self.staging / SPOOL_DIR
        try:
            self.spool_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self.close(failed=True)
            raise io_error(exc, "creating the spool folder", self.spool_dir) from None

    def _open_url(self, shared: bool) -> None:
        from ..remote.options import as_remote_options
        from ..remote.store import store_for
        from .remote_out import staging_folder

        if self.url.read_only:  # type: ignore[union-attr]
            raise OptionError(f"{self.url.scheme}:// URLs are read-only; write to s3://, gs:// or az://")  # type: ignore[union-attr]
        remote = as_remote_options(self.run.remote)
        if not (self.run.overwrite or self.keep) and store_for(self.url, remote).head(fmt.MANIFEST_NAME) is not None:
            raise OutputExistsError("a dataset is already here; pass overwrite=True to replace it",
                                    path=self.url.text)  # type: ignore[union-attr]
        self.staging = staging_folder(self.url, remote, "python")  # type: ignore[arg-type]
        self.folder = self.staging
        if not self.keep:
            shutil.rmtree(self.staging, ignore_errors=True)
        self.staging.mkdir(parents=True, exist_ok=True)
        self._lock = build_lock(self.staging, shared=shared).__enter__()
        self.spool_dir = self.staging / SPOOL_DIR
        self.spool_dir.mkdir(parents=True, exist_ok=True)

    def commit(self, raw: Callable[[], RawListing], settings: BuildSettings, *, source: str,
               reuse_plan: bool = False) -> BuildResult:
        """List the spools (``raw``) and make the dataset, as ``packer build`` does.

        Raises:
            SourceError, EmptySourceError (the report is written), BuildError, OptionError.
        """
        if self.url is None:
            return commit_listing(raw(), self.folder, settings, self.run, source=source, reuse_plan=reuse_plan)
        from .remote_out import build_to_url

        def build_in(_: Any, staging: Path, settings: BuildSettings, run: RunOptions) -> BuildResult:
            staging.mkdir(parents=True, exist_ok=True)
            with build_lock(staging):
                return commit_listing(raw(), staging, settings, run, source=source, reuse_plan=run.resume)

        return build_to_url(build_in, None, self.url.text, settings, replace(self.run, resume=reuse_plan))

    def close(self, *, failed: bool, keep_staging: bool | None = None) -> None:
        """Let go of the output: remove the staging folder (unless a failed run keeps it for
        ``resume``: ``keep_staging``, default as opened), the lock file of an output that holds no
        dataset, and an output folder this run created and left empty."""
        keep = self.keep if keep_staging is None else keep_staging
        staging = getattr(self, "staging", None)
        if staging is not None and ((failed and not keep) or (not failed and self.url is not None)):
            shutil.rmtree(staging, ignore_errors=True)
        if self._lock is not None:
            self._lock.__exit__(None, None, None)
            self._lock = None
        if self.url is None and hasattr(self, "folder"):
            folder = self.folder
            if not (folder / fmt.MANIFEST_NAME).exists() and not (folder / STAGING_DIR).exists():
                (folder / LOCK_NAME).unlink(missing_ok=True)
                if self.created:
                    try:
                        folder.rmdir()  # only if empty (a report of a build that packed nothing stays)
                    except OSError:
                        pass


def open_output(out: Any, run: RunOptions, *, call: str, keep: bool = False, shared: bool = False) -> PythonOutput:
    """A ``PythonOutput`` for ``out`` (a folder or a URL).

    Raises:
        OutputExistsError: a dataset is there and ``run.overwrite`` is off.
        BuildLockedError: another build or writer holds the output.
        OptionError: a read-only URL.
    """
    return PythonOutput(out, run, call=call, keep=keep, shared=shared)


# --- the commit ------------------------------------------------------------------------------------------

def commit_listing(raw: RawListing, out: Path, settings: BuildSettings, run: RunOptions, *, source: str,
                   reuse_plan: bool = False) -> BuildResult:
    """The build's steps for a door's listing, in ``out`` (locked by the caller): the source
    contract, the seeded plan (saved in the staging folder; reused with ``reuse_plan`` when it
    was made from these settings and the same spools), packing with the engine ``run`` names,
    and the commit, the manifest last.

    Raises:
        SourceError, EmptySourceError (after writing the build report), BuildError, OptionError.
    """
    started = time.monotonic()
    check_engine(run.engine)
    staging = out / STAGING_DIR
    plan_path = staging / PLAN_NAME
    plan = _saved_plan(plan_path, raw, settings) if reuse_plan and plan_path.is_file() else None
    if plan is None:
        try:
            listing = apply_contract(raw, source_options(settings, on_error=run.on_error))
        except EmptySourceError as exc:
            record_empty_build(out, exc, settings)
            raise
        plan = make_plan(listing, settings, source=source)
        try:
            (staging / RECORD_DIR).mkdir(parents=True, exist_ok=True)
            save_plan(plan, plan_path)
        except OSError as exc:
            raise io_error(exc, "saving the build plan", plan_path) from None
        shutil.rmtree(staging / TEMP_DIR, ignore_errors=True)
    logger.info("planned %d shard(s) for %d sample(s) written from Python (%d rejected while listing)",
                plan.shard_count, len(plan.listing), len(plan.listing.rejected))
    run_shards(plan, out, list(range(plan.shard_count)), workers=run.workers, engine=run.engine,
               address=run.address, progress=run.progress, fail_on_reject=run.on_error == "fail")
    try:
        result = finish_build(plan, out)
    except EmptySourceError as exc:  # every listed sample was rejected while packing
        record_empty_build(out, exc, plan.settings)
        raise
    result.seconds = time.monotonic() - started
    return result


def _saved_plan(path: Path, raw: RawListing, settings: BuildSettings) -> BuildPlan | None:
    """The plan an interrupted run saved, when it was made from these settings and these spools
    (same files, same sizes and times); otherwise None (plan again)."""
    try:
        plan = load_plan(path, raw.root)
    except BuildError:
        return None
    if plan.settings != settings or plan.listing.members is None or raw.members is None:
        return None
    if plan.listing.members.containers != raw.members.containers:
        return None
    try:
        check_unchanged(plan.listing.members)
    except BuildError:
        return None
    return plan


def print_summary(result: BuildResult | None, out: Any, *, what: str) -> None:
    """The build's summary on stderr (``progress=True``): samples, shards, bytes, time, rejections."""
    if result is None:
        return
    stream = sys.stderr
    if result.already_complete:
        print(f"{out} is already complete: {result.sample_count} samples in {result.shard_count} shard(s)",
              file=stream)
        return
    print(f"{what}: packed {result.sample_count} samples into {result.shard_count} shard(s) in {out} "
          f"({result.total_bytes / 1e6:.1f} MB, {result.seconds:.1f} s)", file=stream)
    if result.rejected:
        reasons: dict[str, int] = {}
        for rejection in result.rejected:
            reasons[rejection.reason] = reasons.get(rejection.reason, 0) + 1
        listed = ", ".join(f"{n} {reason}" for reason, n in sorted(reasons.items()))
        print(f"rejected {len(result.rejected)} sample(s): {listed}; see {fmt.REPORT_NAME}", file=stream)

