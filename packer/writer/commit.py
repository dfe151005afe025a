"""Finishing a build: the index from the shard records, the build report, and the manifest last.

``manifest.json`` is the commit record: until it is replaced, the folder opens as the previous
dataset (or as nothing), so a build killed at any moment leaves no dataset that looks complete.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .._version import __version__
from .. import format as fmt
from ..codecs import get_codec
from ..errors import BuildError
from .._internal.atomic import fsync_dir, write_atomic
from ..fields import IMAGE_COLUMNS
from ..sources.fieldvalues import specs_with_shards
from .plan import BuildPlan
from .probes import FILE_KINDS, listing_probes
from .settings import BuildSettings
from .records import read_record, record_path
from ..sources.blobs import gather_blob
from ..sources import Rejection, SourceListing, empty_source_error
from .staging import STAGING_DIR, io_error

__all__ = ["BuildResult", "finish_build", "assemble_index", "commit_dataset", "recorded_max_pixels",
           "record_empty_build", "record_hashes"]

@dataclass
class BuildResult:
    """What a finished build produced."""

    path: Path
    sample_count: int
    shard_count: int
    rejected: list[Rejection]
    payload_bytes: int
    total_bytes: int
    seconds: float = 0.0
    summary: dict[str, Any] = field(default_factory=dict)
    classes: tuple[str, ...] = ()
    #: ``--resume`` found this dataset already finished from the same source and options.
    already_complete: bool = False
    #: for ``already_complete``: the source was spot-checked against the recorded file sizes.
    source_verified: bool = True
    #: how the class names were numbered (``SourceListing.class_order``); None when unknown.
    class_order: str | None = None




def finish_build(plan: BuildPlan, out: Path, *, history: Sequence[dict[str, Any]] = (),
                 cleanup: bool = True) -> BuildResult:
    """Assemble the index, report and manifest from every shard record of ``plan``.

    Raises:
        BuildError: a planned shard has no record from this plan (a part is missing or was built
            from another plan), or a shard file is missing or the wrong size.
    """
    missing, headers, records = [], [], []
    for shard in range(plan.shard_count):
        found = read_record(record_path(out, shard), plan.fingerprint, out)
        if found is None:
            missing.append(shard)
        else:
            headers.append(found[0])
            records.append(found[1])
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
        raise BuildError(f"{len(missing)} of {plan.shard_count} planned shards are not packed yet "
                         f"(shards {shown}); run the missing parts, or the build with --resume", path=out)
    listing = plan.listing
    live = [i for i, h in enumerate(headers) if h["sample_count"]]
    rejected = list(listing.rejected) + [Rejection(**r) for h in headers for r in h["rejected"]]
    if not live:
        # No dataset: the caller writes the build report (``record_empty_build``) so the names survive.
        raise empty_source_error(f"every one of the {len(listing)} listed source files was rejected; nothing "
                                 f"to pack", rejected, path=out)
    columns, shards, source = assemble_index(listing, [headers[i] for i in live], [records[i] for i in live])
    fields = _field_declarations(listing, [headers[i] for i in live])
    settings = plan.settings
    codec = get_codec(settings.codec)
    probes = plan.source_probes
    if probes is None and listing.kind in FILE_KINDS:  # a plan saved before the probes were planned
        probes = listing_probes(listing)
    build_info: dict[str, Any] = {
        # What decides the bytes, the source's kind (detected once) included (SPEC §6.1).
        "settings": settings.to_json(),
        "label_type": listing.label_type,
        "source_files": len(listing) + len(listing.rejected),
        "packed": int(len(source)),
        "rejected": len(rejected),
        "planned_shards": plan.shard_count,
        "tool": f"packer {__version__}",
        "source": plan.source,
    }
    if probes is not None:
        # A spread of the source's files and their sizes (writer/probes.py): `--resume` on the
        # finished dataset checks them to tell "this source, already done" from "another source".
        build_info["source_probes"] = probes
    notes: dict[str, int] = {}
    for header in headers:
        for note, count in header.get("codec_notes", {}).items():
            notes[note] = notes.get(note, 0) + int(count)
    if listing.warnings:
        build_info["warnings"] = list(listing.warnings)
    if notes:  # e.g. {"tiled": 9980, "kept: progressive": 20}
        build_info["codec_notes"] = dict(sorted(notes.items()))
    hashes = record_hashes([records[i] for i in live]) if settings.hash == "perceptual" else None
    result = commit_dataset(out, columns, shards, classes=listing.classes, codec=codec.manifest_entry(),
                            alignment=plan.alignment, build_info=build_info, rejected=rejected,
                            history=list(history), cleanup=cleanup,
                            max_pixels=recorded_max_pixels(settings.checks.max_pixels),
                            fields=fields, hashes=hashes)
    result.class_order = listing.class_order
    return result


def record_hashes(records: Sequence[dict[str, np.ndarray]]) -> Any:
    """The perceptual hashes the workers left in packed shards' records (``--hash perceptual``),
    in index order, as a ``duplicates.HashTable``."""
    from ..duplicates.phash import HashTable

    def column(name: str, dtype: Any) -> np.ndarray:
        return np.concatenate([np.asarray(r[name], dtype=dtype) for r in records] or [np.zeros(0, dtype)])

    hashes = np.stack([column("phash_lo", np.uint64), column("phash_hi", np.uint64)], axis=1)
    return HashTable(hashes=hashes, status=column("phash_status", np.uint8))


def _field_declarations(listing: SourceListing, headers: Sequence[dict[str, Any]]) -> tuple[fmt.FieldSpec, ...]:
    """The manifest's field declarations: image fields with the shard entries the records name."""
    if listing.fields is None:
        return ()
    shards = {spec.name: [fmt.ShardEntry(path=h["fields"][spec.name]["path"], size=h["fields"][spec.name]["size"],
                                         checksum=int(h["fields"][spec.name]["checksum"], 16),
                                         sample_count=h["sample_count"]) for h in headers]
              for spec in listing.fields.image_specs}
    return specs_with_shards(listing.fields.specs, shards)


def recorded_max_pixels(*limits: int | None) -> int | None:
    """The ``limits.max_pixels`` to record: the largest limit used, None unless above the default.

    Readers default to ``DEFAULT_MAX_PIXELS``; a build (or append) that accepted larger images
    records its limit so that every accepted image also decodes when read back. A lower limit
    is not recorded: every image it accepted is within the readers' default anyway.
    """
    from .._internal.imageinfo import DEFAULT_MAX_PIXELS

    largest = max([DEFAULT_MAX_PIXELS, *(value for value in limits if value is not None)])
    return None if largest == DEFAULT_MAX_PIXELS else largest


def _report_lines(build_info: dict[str, Any], rejected: Sequence[Rejection]) -> bytes:
    lines = [json.dumps({"type": "summary", **build_info}, sort_keys=True, allow_nan=False, ensure_ascii=False)]
    lines += [json.dumps({"type": "rejected", **r.to_json()}, sort_keys=True, ensure_ascii=False)
              for r in sorted(rejected, key=lambda r: r.key.encode("utf-8", "surrogateescape"))]
    return ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape")


def commit_dataset(out: Path, columns: dict[str, np.ndarray], shards: list[fmt.ShardEntry], *,
                   classes: Sequence[str], codec: dict[str, Any], alignment: int,
                   build_info: dict[str, Any], rejected: list[Rejection], history: list[dict[str, Any]],
                   cleanup: bool = True, max_pixels: int | None = None,
                   fields: Sequence[fmt.FieldSpec] = (), hashes: Any = None) -> BuildResult:
    """Write index, report and (last) manifest; then remove files no manifest references.

    Also used by ``append`` (which passes the old shards plus new ones and ``cleanup=False``).
    ``max_pixels`` is recorded as the manifest's ``limits.max_pixels`` (None: the default);
    ``fields`` are the declared fields (image fields with their shard entries); ``hashes`` (a
    ``duplicates.HashTable``, one row per sample, ``--hash perceptual``) is written as the hashes
    file for the new index (formats/SPEC.md §16) before the manifest: until the manifest lands it
    describes an index no manifest names, and is stale by its own identity.
    """
    rows = len(columns["offset"])
    if classes:  # informational: lets two datasets' class lists be compared at a glance
        build_info = {**build_info, "classes_checksum": fmt.class_list_checksum(classes)}
    # never commit a bad index
    fmt.validate_index(rows, columns, shards, alignment, path="(new index)", fields=fields)
    report = out / fmt.REPORT_NAME
    if report.is_dir() and not report.is_symlink():
        # A FIFO or a link in its place is simply replaced; a folder cannot be. Checked before
        # the commit point: failing afterwards would report a committed build as failed.
        raise BuildError(f"{fmt.REPORT_NAME} is a folder, not a regular file; remove it and run again",
                         path=report)
    index_pieces = fmt.encode_column_file(fmt.INDEX_MAGIC, rows, columns)
    index_size = sum(memoryview(p).nbytes for p in index_pieces)
    staging_index = out / STAGING_DIR / "index.pki"
    try:
        index_digest = write_atomic(staging_index, index_pieces).digest
        index_name = fmt.index_file_name(index_digest)
        os.replace(staging_index, out / index_name)
        if hashes is not None:
            from ..duplicates.sidecar import encode_hashes

            write_atomic(out / fmt.HASHES_NAME, [encode_hashes(hashes, index_digest)])
        # Durable before the manifest that names it: otherwise a power cut can keep the new
        # manifest and lose the index rename, and the dataset no longer opens.
        fsync_dir(out)
        # Staged until after the commit point: the dataset in place keeps its own report until
        # the manifest that replaces it has landed.
        staged_report = out / STAGING_DIR / fmt.REPORT_NAME
        staged_report.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(staged_report, [_report_lines(build_info, rejected)])
        manifest = fmt.Manifest(
            sample_count=rows, alignment=alignment, codec=codec, classes=tuple(classes),
            index=fmt.FileEntry(path=index_name, size=index_size, checksum=index_digest),
            shards=tuple(shards), build=build_info, history=tuple(history),
            created_by=f"packer {__version__}", max_pixels=max_pixels, fields=tuple(fields))
        # The commit point; write_atomic fsyncs the folder, so the report below never lands
        # beside the old manifest.
        write_atomic(out / fmt.MANIFEST_NAME, [fmt.dump_manifest(manifest)])
        os.replace(staged_report, out / fmt.REPORT_NAME)
        fsync_dir(out)
    except OSError as exc:
        raise io_error(exc, "writing the index and manifest", out) from None
    if cleanup:
        _remove_unreferenced(out, {s.path for s in shards} | {index_name}
                             | {s.path for spec in fields for s in spec.shards})
        shutil.rmtree(out / STAGING_DIR, ignore_errors=True)
    payload = int(columns["size"].sum())
    total = sum(s.size for s in shards) + index_size
    return BuildResult(path=out, sample_count=rows, shard_count=len(shards), rejected=rejected,
                       payload_bytes=payload, total_bytes=total, summary=build_info, classes=tuple(classes))


def record_empty_build(out: Path, error: Exception, settings: BuildSettings) -> None:
    """A build that packed nothing: write its build report (every rejection, with its reason) and
    remove the working folder, so OUT holds no half-made build that ``--resume`` would continue.

    An existing dataset in OUT (``--overwrite``) keeps its own report; the new one then goes
    only into the error message. Best effort: a report that cannot be written never hides the
    error the build is raising.
    """
    rejected: list[Rejection] = list(getattr(error, "rejected", []))
    try:
        if not (out / fmt.MANIFEST_NAME).exists() and out.is_dir():
            summary = {"packed": 0, "rejected": len(rejected), "error": str(error), "settings": settings.to_json(),
                       "tool": f"packer {__version__}"}
            write_atomic(out / fmt.REPORT_NAME, [_report_lines(summary, rejected)])
            error.args = (f"{error.args[0]}; every rejection is in {out / fmt.REPORT_NAME}",) + error.args[1:]
            if hasattr(error, "message"):
                error.message = f"{error.message}; every rejection is in {out / fmt.REPORT_NAME}"
    except OSError:
        pass
    shutil.rmtree(out / STAGING_DIR, ignore_errors=True)


def _remove_unreferenced(out: Path, keep: set[str]) -> None:
    """Delete shard and index files no longer referenced (a replaced dataset, a killed build).

    Readers that still map them keep their pages (POSIX unlink semantics); a reader that opens
    one later gets DatasetChangedError.
    """
    for path in list((out / fmt.SHARD_DIR).glob("*.pks")) + list(out.glob("index-*.pki")):
        relative = path.relative_to(out).as_posix()
        if relative not in keep:
            path.unlink(missing_ok=True)
    # Temp files of a killed build's write_atomic (we hold the lock: no writer owns them now).
    for name in (fmt.MANIFEST_NAME, fmt.REPORT_NAME, fmt.HASHES_NAME):
        for path in out.glob(f".{name}.*.tmp"):
            path.unlink(missing_ok=True)


#: The per-sample index columns a shard record carries, concatenated as they are.
_RECORD_INDEX_COLUMNS = ("offset", "size", "checksum", "width", "height", "channels", "image_format")


def assemble_index(listing: SourceListing, headers: Sequence[dict[str, Any]], records: Sequence[dict[str, np.ndarray]],
                   *, previous: Any = None, previous_shards: int = 0
                   ) -> tuple[dict[str, np.ndarray], list[fmt.ShardEntry], np.ndarray]:
    """The index columns and shard entries of packed shards, after an existing index if given.

    Args:
        listing: the listing the shards were planned from (keys, labels, metadata).
        headers, records: each non-empty packed shard's record header and columns, in order.
        previous: an existing index's ``IndexColumns`` (``packer append``): its rows come first.
        previous_shards: the existing manifest's shard count: the new shards' positions follow.

    Returns:
        ``(columns, new shard entries, listing rows of the new samples)``.
    """
    shards = [fmt.ShardEntry(path=h["path"], size=h["size"], checksum=int(h["checksum"], 16),
                             sample_count=h["sample_count"]) for h in headers]
    source = (np.concatenate([r["source"] for r in records]) if records else np.zeros(0)).astype(np.int64)
    counts = np.array([h["sample_count"] for h in headers], dtype=np.int64)
    first_shard = previous_shards if previous is not None else 0
    keys, key_offsets = gather_blob(listing.key_blob, listing.key_offsets, source)
    meta, meta_offsets = gather_blob(listing.meta_blob, listing.meta_offsets, source)
    columns = {"shard": np.repeat(np.arange(first_shard, first_shard + len(headers), dtype=np.uint32), counts)}
    columns.update({name: np.concatenate([r[name] for r in records]) for name in _RECORD_INDEX_COLUMNS})
    columns["label"] = listing.labels[source].astype(np.int64)
    columns.update(key_offsets=key_offsets, keys=keys, meta_offsets=meta_offsets, meta=meta)
    if previous is not None:
        for name in ("shard", "label", *_RECORD_INDEX_COLUMNS, "keys", "meta"):
            columns[name] = np.concatenate([getattr(previous, name), columns[name]])
        for name, blob in (("key_offsets", previous.key_offsets), ("meta_offsets", previous.meta_offsets)):
            columns[name] = np.concatenate([blob, columns[name][1:] + blob[-1]])
    order = ("shard", "offset", "size", "checksum", "label", "width", "height", "channels", "image_format",
             "key_offsets", "keys", "meta_offsets", "meta")
    ordered = {name: columns[name] for name in order}
    if listing.fields is not None:
        if previous is not None:
            raise BuildError("append does not support datasets with declared fields yet")
        ordered.update(listing.fields.index_columns(source))
        for spec in listing.fields.image_specs:
            for part, typestr in IMAGE_COLUMNS.items():
                ordered[spec.image_column(part)] = np.concatenate(
                    [r[f"{spec.name}__{part}"] for r in records]).astype(np.dtype(typestr))
    return ordered, shards, source
