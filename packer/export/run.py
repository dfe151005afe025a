"""``export()``: select, plan (every name checked), then write through the one safe writer and publish."""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .. import format as fmt
from ..dataset import open_dataset
from ..errors import OptionError, OutputExistsError, UnsafeExportError
from ..location import Location, parse_location
from .folder import write_folder
from .plan import TARGETS, ExportPlan, SampleEntries, SampleNamer, plan_export
from .safewrite import StagedOutput
from .select import select_samples
from .tar import write_tar
from .webdataset import write_webdataset

__all__ = ["EXPORT_TARGETS", "ExportResult", "export"]

EXPORT_TARGETS = tuple(TARGETS)

#: Why an export cannot write to a URL. Its targets are folders, a tar and WebDataset shards, not
#: packer datasets: there is no manifest to write last, so an upload (``packer.remote.upload``, the
#: build's) could be seen half-written and could not be resumed or replaced as one. The local writer
#: publishes with one rename; copying its result up is the store's own tool's job.
_NOT_TO_A_URL = ("an export writes a local folder or tar (not a packer dataset, so there is no manifest to "
                 "upload last and a half-uploaded export could not be told from a whole one); export to a local "
                 "path, then copy it up with your store's tool (aws s3 cp --recursive, gcloud storage cp -r, ...)")

_WRITERS: dict[str, Callable[..., None]] = {"folder": write_folder, "tar": write_tar, "webdataset": write_webdataset}
_SHARD_NAME = re.compile(r"shard-[0-9]{6,}\.tar")


@dataclass
class ExportResult:
    """What an export wrote, and what it skipped (``skip_unsafe``).

    Attributes:
        samples: samples written.
        bytes: their image bytes (side files not counted).
        skipped_unsafe: samples skipped, all reasons together.
        files: files written (folder), 1 (tar), or shards (webdataset).
        skipped: skipped samples per reason (``plan.SKIP_REASONS``).
        skipped_examples: the first skipped samples, ``(key, reason, message)``.
    """

    samples: int = 0
    bytes: int = 0
    skipped_unsafe: int = 0
    files: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    skipped_examples: list[tuple[str, str, str]] = field(default_factory=list)

    def count(self, namer: SampleNamer, sample: SampleEntries) -> None:
        self.samples += 1
        self.bytes += int(namer.ds.sizes[sample.row])

    def to_json(self) -> dict[str, Any]:
        return {"samples": self.samples, "bytes": self.bytes, "skipped_unsafe": self.skipped_unsafe,
                "files": self.files, "skipped": dict(sorted(self.skipped.items())),
                "skipped_examples": [{"key": key, "reason": reason, "message": message}
                                     for key, reason, message in self.skipped_examples]}


def _refusal(plan: ExportPlan, total: int, target: str) -> UnsafeExportError:
    counts = ", ".join(f"{count} {reason}" for reason, count in sorted(plan.skipped.items()))
    key, reason, message = plan.examples[0]
    return UnsafeExportError(
        f"{plan.skipped_count} of the {total} selected samples cannot be exported safely to {target} ({counts}); "
        f"first: {key!r} ({reason}: {message}). Nothing was written; pass --skip-unsafe to export the others "
        f"(the skipped are counted and listed)", skipped=plan.skipped, examples=plan.examples)


def _replaceable(target: str, out: Path) -> Callable[[os.stat_result, int | None], None]:
    """The check before ``overwrite`` replaces an existing OUT as a whole: only what an export of
    this target could have written (a folder of class folders; a folder of shards; a file)."""

    def check(info: os.stat_result, folder_fd: int | None) -> None:
        if not (stat.S_ISREG(info.st_mode) or stat.S_ISLNK(info.st_mode) or stat.S_ISDIR(info.st_mode)):
            raise OutputExistsError("the export target is a device, FIFO or socket; an export replaces a file, "
                                    "a link or a folder it could have written", path=out)
        if folder_fd is None:  # a file or a link: replaced itself, never followed
            return
        if target == "tar":
            raise OutputExistsError("the export target is a folder; a tar export replaces a file only", path=out)
        for name in os.listdir(folder_fd):
            entry = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
            if target == "folder":
                fits = stat.S_ISDIR(entry.st_mode) and not name.startswith(".")
                what = "a folder export holds class folders only"
            else:
                fits = stat.S_ISREG(entry.st_mode) and _SHARD_NAME.fullmatch(name) is not None
                what = "a WebDataset export holds shard-NNNNNN.tar files only"
            if not fits:
                raise OutputExistsError(f"--overwrite replaces the export target as a whole, and it holds {name!r}, "
                                        f"which this export could not have written ({what}); remove it yourself "
                                        f"or choose another path", path=out)

    return check


def _check_target_path(out: Path, dataset: Path | None) -> None:
    """OUT may not be (or hold) the current folder or the dataset's folder, nor lie inside the latter."""
    real_out = os.path.realpath(out)
    holds = [(os.path.realpath(os.getcwd()), "the current folder")]
    if dataset is not None:
        holds.append((os.path.realpath(dataset), "the dataset"))
    for inside, what in holds:
        if os.path.commonpath([real_out, inside]) == real_out:
            raise OptionError(f"the export target {str(out)!r} is {what} or holds it; choose a new path")
    if dataset is not None and os.path.commonpath([real_out, os.path.realpath(dataset)]) == os.path.realpath(dataset):
        raise OptionError(f"the export target {str(out)!r} is inside the dataset folder; choose a path outside it")


def export(dataset: str | os.PathLike[str] | Location, out: str | os.PathLike[str] | Location, *, to: str = "folder",
           classes: list[str] | None = None, samples: str | None = None,
           keys: str | os.PathLike[str] | None = None, samples_per_shard: int = 10_000,
           overwrite: bool = False, skip_unsafe: bool = False) -> ExportResult:
    """Write the selected samples of ``dataset`` to ``out`` (``packer.export``'s docstring).

    Args:
        to: ``folder``, ``tar`` or ``webdataset``.
        classes, samples, keys: the filters (``select.select_samples``).
        samples_per_shard: WebDataset samples per shard.
        overwrite: replace an existing ``out`` as a whole (never written into).
        skip_unsafe: export the samples that are safe and skip (count, list) the others,
            instead of refusing the export.

    Raises:
        UnsafeExportError: some samples cannot be exported safely (and ``skip_unsafe`` is off);
            nothing was written.
        OptionError: a bad target, filter or path (``out`` a URL: an export writes local files),
            or a dataset whose payloads are not the source bytes.
        OutputExistsError: ``out`` exists (and is not an empty folder) without ``overwrite``,
            or holds what this export could not have written.
        FormatError: the dataset is damaged.
    """
    out_path = parse_location(out, what="OUT").local_path(_NOT_TO_A_URL)  # before anything is opened
    if to not in TARGETS:
        raise OptionError(f"--to must be one of {', '.join(EXPORT_TARGETS)}, got {to!r}")
    if isinstance(samples_per_shard, bool) or not isinstance(samples_per_shard, int) or samples_per_shard < 1:
        raise OptionError(f"--samples-per-shard must be a positive integer, got {samples_per_shard!r}")
    _check_target_path(out_path, None)
    staged = StagedOutput(out_path, folder=to != "tar", overwrite=overwrite, check_replaceable=_replaceable(to, out_path))
    staged.preflight()  # fail fast: before reading every sample's names
    with open_dataset(dataset) as ds:
        _check_target_path(out_path, ds.path)  # a dataset URL: its node-cache folder
        codec = ds.manifest.codec.get("name", "passthrough")
        if codec != "passthrough":
            raise OptionError(f"this dataset was built with codec {codec!r}: its payloads are not the source "
                              f"files, so there is nothing to export verbatim (export needs a passthrough build)")
        settings = fmt.recorded_build_settings(ds.manifest.build) or {}  # nested, or older builds' flat options
        checks = settings.get("checks") if isinstance(settings.get("checks"), dict) else {}
        if checks.get("normalize_formats") is True:
            raise OptionError("this dataset was built with --normalize-formats: some payloads are PNGs converted "
                              "from the source files, so there is nothing to export verbatim")
        rows = select_samples(ds, classes=classes, samples=samples, keys=keys)
        namer = SampleNamer(ds, TARGETS[to])
        plan = plan_export(namer, rows)
        if plan.skipped and not skip_unsafe:
            raise _refusal(plan, len(rows), to)
        result = ExportResult(skipped_unsafe=plan.skipped_count, skipped=dict(plan.skipped),
                              skipped_examples=list(plan.examples))
        with staged:
            _WRITERS[to](namer, plan.rows, staged, result, samples_per_shard)
            staged.publish()
    return result
