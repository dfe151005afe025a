"""``packer build``: list the source, plan the shards, pack them in parallel, commit atomically.

The build is split in steps that any scheduler can run (see ``--part`` and ``--finish``):

1. **plan** (one process): list the source, compute the shard plan, save it to
   ``OUT/.packer-build/plan.pkp``. The plan is a pure function of the listing and the options.
2. **pack shards** (any number of processes, machines or Ray tasks): each planned shard is packed
   by one task that reads its files, checks them, writes a temporary file, fsyncs it and renames
   it to its content-addressed name in ``OUT/shards/``, then writes a *shard record* (the
   per-sample offsets, sizes, checksums and rejections) to ``OUT/.packer-build/done/``. A task
   touches nothing another task owns, so tasks can run in any order and be retried.
3. **finish** (one process): check every planned shard has a record from this plan, concatenate
   the records into the index, write the build report, then write ``manifest.json`` last with
   ``os.replace`` and fsync the folder. Only now does the folder open as a dataset.

A build killed at any moment leaves either the previous dataset (its manifest and files are
untouched until the new manifest replaces it) or nothing that opens. ``--resume`` reuses the plan
and every finished shard record.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from . import __version__
from . import format as fmt
from .atomic import fsync_dir, write_atomic
from .codecs import get_codec
from .errors import (BuildError, BuildLockedError, OutputExistsError, PackerError, RejectedImageError,
                     SourceError)
from .imageinfo import probe_image
from .progress import ListingProgress
from .plan import BuildOptions, BuildPlan, load_plan, make_plan, save_plan
from .sources import Rejection, gather_blob, list_source

__all__ = ["build", "BuildResult", "STAGING_DIR", "pack_planned_shard", "finish_build",
           "prepare_plan", "parse_part", "shards_of_part", "build_lock", "ProgressSink"]

STAGING_DIR = ".packer-build"
LOCK_NAME = ".packer.lock"
PLAN_NAME = "plan.pkp"
RECORD_DIR = "done"
TEMP_DIR = "tmp"

#: Called with (files done, bytes done) increments; the local engine forwards them to tqdm.
ProgressSink = Callable[[int, int], None]


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


# --- locking ----------------------------------------------------------------------------------

class build_lock:
    """An ``flock`` on ``OUT/.packer.lock``: exclusive for a build or finish, shared for a part.

    Two builds into one folder cannot both run; the second fails at once with BuildLockedError.
    The kernel drops the lock when the process dies, so a killed build never leaves it held.
    """

    def __init__(self, out: Path, *, shared: bool = False) -> None:
        self.path = out / LOCK_NAME
        self.shared = shared
        self._fd: int | None = None

    def __enter__(self) -> "build_lock":
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise BuildError(f"cannot create the lock file: {exc.strerror}", path=self.path) from None
        try:
            fcntl.flock(self._fd, (fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            self._fd = None
            raise BuildLockedError("another packer build is writing this output folder; wait for it "
                                   "or stop it", path=self.path.parent) from None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


# --- small file helpers -------------------------------------------------------------------------

def _io_error(exc: OSError, what: str, path: object) -> BuildError:
    if exc.errno == errno.ENOSPC:
        return BuildError(f"the disk is full while {what}; free space and run again with --resume", path=path)
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return BuildError(f"permission denied while {what} (is the output folder writable?)", path=path)
    return BuildError(f"I/O error while {what}: {exc.strerror or exc}", path=path)


# --- planning ---------------------------------------------------------------------------------

def parse_part(text: str) -> tuple[int, int]:
    """Parse ``"K/N"`` (0-based K) into (K, N)."""
    try:
        k_text, n_text = text.split("/")
        k, n = int(k_text), int(n_text)
    except ValueError:
        raise SourceError(f"--part must look like K/N (e.g. 0/4), got {text!r}") from None
    if not (n >= 1 and 0 <= k < n):
        raise SourceError(f"--part {text}: need 0 <= K < N")
    return k, n


def shards_of_part(shard_count: int, part: int, parts: int) -> list[int]:
    """Planned shards of part ``part`` of ``parts``: round-robin, so parts get similar work."""
    return list(range(part, shard_count, parts))


def prepare_plan(source: Path, out: Path, options: BuildOptions, *, root: Path | None = None,
                 reuse: bool = True, progress: bool = False) -> BuildPlan:
    """Load the saved plan if it matches, else list the source and save a new plan.

    Raises:
        BuildError: a saved plan exists with different options (and ``reuse`` is on).
    """
    staging = out / STAGING_DIR
    plan_path = staging / PLAN_NAME
    source_root = root if root is not None else (source.parent if source.is_file() else source)
    if reuse and plan_path.exists():
        plan = load_plan(plan_path, source_root)
        _refuse_append_plan(plan, out)
        _check_same_source(plan, source_root)
        if plan.options != options:
            raise BuildError(
                f"an unfinished build with different options is in this folder "
                f"(saved {plan.options.to_json()}, asked {options.to_json()}); use the same options, "
                f"or build without --resume to start over", path=out)
        return plan
    with ListingProgress(enabled=progress) as counter:
        listing = list_source(source, root, progress=counter.update)
    plan = make_plan(listing, options, source=source.name)
    try:
        staging.mkdir(parents=True, exist_ok=True)
        (staging / RECORD_DIR).mkdir(exist_ok=True)
        save_plan(plan, plan_path)
    except OSError as exc:
        raise _io_error(exc, "saving the build plan", plan_path) from None
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
    count = len(listing)
    for i in sorted({int(x) for x in np.linspace(0, count - 1, num=min(probes, count))}):
        key = listing.key(i)
        try:
            size = os.stat(source_root / key).st_size
        except OSError:
            size = -1
        if size != int(listing.sizes[i]):
            raise BuildError(f"the unfinished build here was planned from a different source: {key!r} is "
                             f"{'missing' if size < 0 else f'{size} bytes'} under {source_root}, the plan says "
                             f"{int(listing.sizes[i])} bytes; point SRC at the same folder, or start over "
                             f"without --resume", path=source_root)


# --- packing one planned shard ----------------------------------------------------------------

_RECORD_COLUMNS = ("source", "offset", "size", "checksum", "width", "height", "channels", "image_format")


def _record_path(out: Path, shard: int) -> Path:
    return out / STAGING_DIR / RECORD_DIR / f"shard-{shard:05d}.pkr"


@dataclass
class SegmentResult:
    """One packed slice of a planned shard: a temp file of aligned payloads and their rows.

    Segment 0's file starts with the (zeroed) header region; the others start at their first
    payload. Every segment's length is a multiple of the alignment, so appending segments in
    order gives exactly the bytes a single writer would have written.
    """

    shard: int
    segment: int
    path: str
    length: int
    rows: dict[str, list[int]]
    rejected: list[dict[str, str]]
    notes: dict[str, int] = field(default_factory=dict)  # the codec's labels, counted


def segment_count(plan: BuildPlan, shard: int, wanted: int, min_bytes: int = 16 << 20) -> int:
    """How many segments to split planned shard ``shard`` into: ``wanted``, but none under ``min_bytes``."""
    members = plan.shard_members(shard)
    if wanted <= 1 or len(members) < 2:
        return 1
    total = int(plan.listing.sizes[members].sum())
    return max(1, min(wanted, len(members), total // min_bytes))


def _segment_members(plan: BuildPlan, shard: int, segment: int, segments: int) -> np.ndarray:
    members = plan.shard_members(shard)
    bounds = np.linspace(0, len(members), segments + 1).astype(np.int64)
    return members[bounds[segment]:bounds[segment + 1]]


def _temp_dir(out: Path, shard: int) -> Path:
    temp_dir = out / STAGING_DIR / TEMP_DIR
    try:
        temp_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _io_error(exc, f"writing shard {shard}", temp_dir) from None
    return temp_dir


def pack_segment(plan: BuildPlan, out: Path, shard: int, segment: int = 0, segments: int = 1, *,
                 progress: ProgressSink | None = None, fail_on_reject: bool = False) -> SegmentResult:
    """Read, check and write one segment of planned shard ``shard`` to a temp file.

    Raises:
        BuildError: an output I/O error (disk full, permissions), or a rejection with ``fail_on_reject``.
    """
    options = plan.options
    codec = get_codec(options.codec)
    alignment = options.alignment
    listing = plan.listing
    members = _segment_members(plan, shard, segment, segments)
    rows: dict[str, list[int]] = {name: [] for name in _RECORD_COLUMNS}
    rejected: list[dict[str, str]] = []
    notes: dict[str, int] = {}
    temp = _temp_dir(out, shard) / f"shard-{shard:05d}.seg-{segment:03d}.{os.getpid()}.partial"
    position = fmt.shard_data_offset(alignment) if segment == 0 else 0
    pending_files = pending_bytes = 0
    last_report = time.monotonic()
    try:
        with open(temp, "wb", buffering=8 << 20) as handle:
            handle.write(bytes(position))
            for source_index in members.tolist():
                key = listing.key(source_index)
                payload, info, rejection, note = _load_and_check(
                    listing.root, key, int(listing.sizes[source_index]), options, codec)
                pending_files += 1
                if note is not None:
                    notes[note] = notes.get(note, 0) + 1
                if rejection is not None:
                    if fail_on_reject:
                        raise BuildError(f"{rejection.reason}: {rejection.message} (--on-error fail)",
                                         path=listing.root / key)
                    rejected.append(rejection.to_json())
                else:
                    size = len(payload)
                    handle.write(payload)
                    padding = fmt.align_up(size, alignment) - size
                    if padding:
                        handle.write(bytes(padding))
                    rows["source"].append(source_index)
                    rows["offset"].append(position)
                    rows["size"].append(size)
                    rows["checksum"].append(fmt.checksum(payload))
                    rows["width"].append(info.width)
                    rows["height"].append(info.height)
                    rows["channels"].append(info.channels)
                    rows["image_format"].append(info.image_format)
                    position += size + padding
                    pending_bytes += size
                now = time.monotonic()
                if progress and now - last_report > 0.2:
                    progress(pending_files, pending_bytes)
                    pending_files = pending_bytes = 0
                    last_report = now
    except OSError as exc:
        temp.unlink(missing_ok=True)
        raise _io_error(exc, f"writing shard {shard}", temp) from None
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    if progress and (pending_files or pending_bytes):
        progress(pending_files, pending_bytes)
    return SegmentResult(shard=shard, segment=segment, path=str(temp), length=position, rows=rows,
                         rejected=rejected, notes=notes)


def _append_file(target: Any, source_path: str, length: int) -> None:
    """Append ``length`` bytes of a file to ``target`` in the kernel (copy_file_range), no user-space copy."""
    with open(source_path, "rb") as source:
        copied = 0
        while copied < length:
            n = os.copy_file_range(source.fileno(), target.fileno(), length - copied)
            if n == 0:
                raise BuildError(f"segment file ended after {copied} of {length} bytes", path=source_path)
            copied += n


def assemble_shard(plan: BuildPlan, out: Path, shard: int, parts: Sequence[SegmentResult]) -> dict[str, Any]:
    """Join a planned shard's segments (in order) into its file, commit it, and write its record.

    Raises:
        BuildError: an output I/O error.
    """
    parts = sorted(parts, key=lambda p: p.segment)
    alignment = plan.options.alignment
    first = Path(parts[0].path)
    rows: dict[str, list[int]] = {name: [] for name in _RECORD_COLUMNS}
    rejected: list[dict[str, str]] = []
    notes: dict[str, int] = {}
    try:
        with open(first, "r+b") as handle:
            position = 0
            for part in parts:
                if part.segment:
                    handle.seek(position)
                    _append_file(handle, part.path, part.length)
                    os.unlink(part.path)
                for name in _RECORD_COLUMNS:
                    values = part.rows[name]
                    rows[name].extend([v + position for v in values] if name == "offset" else values)
                rejected.extend(part.rejected)
                for note, count in part.notes.items():
                    notes[note] = notes.get(note, 0) + count
                position += part.length
            count = len(rows["source"])
            number = plan.first_shard_number + shard
            if count:
                header = fmt.ShardHeader(alignment=alignment, sample_count=count, file_size=position,
                                         shard_number=number)
                handle.seek(0)
                handle.write(header.encode()[: fmt.SHARD_HEADER_SIZE])
                handle.flush()
                os.fsync(handle.fileno())
        record: dict[str, Any] = {"shard": shard, "plan": fmt.checksum_hex(plan.fingerprint),
                                  "sample_count": count, "rejected": rejected}
        if notes:
            record["codec_notes"] = notes
        if count:
            digest = _hash_file(first)
            final_name = fmt.shard_file_name(number, digest)
            (out / fmt.SHARD_DIR).mkdir(exist_ok=True)
            os.replace(first, out / final_name)
            fsync_dir(out / fmt.SHARD_DIR)
            record.update(path=final_name, size=position, checksum=fmt.checksum_hex(digest))
        else:
            first.unlink()
        _write_record(_record_path(out, shard), record, rows)
        return record
    except OSError as exc:
        for part in parts:
            Path(part.path).unlink(missing_ok=True)
        raise _io_error(exc, f"writing shard {shard}", first) from None
    except BaseException:
        for part in parts:
            Path(part.path).unlink(missing_ok=True)
        raise


def shard_is_done(plan: BuildPlan, out: Path, shard: int) -> bool:
    """Whether planned shard ``shard`` has a valid record from this plan (resume, parts)."""
    return _read_record(_record_path(out, shard), plan.fingerprint, out) is not None


def pack_planned_shard(plan: BuildPlan, out: Path, shard: int, *, progress: ProgressSink | None = None,
                       fail_on_reject: bool = False) -> dict[str, Any]:
    """Pack planned shard ``shard``: write its file and its record. Returns the record header.

    Idempotent: a shard whose record already exists for this plan is not packed again.

    Raises:
        BuildError: an output I/O error (disk full, permissions), or a rejection with
            ``fail_on_reject``.
    """
    existing = _read_record(_record_path(out, shard), plan.fingerprint, out)
    if existing is not None:
        if progress:
            progress(len(plan.shard_members(shard)), 0)
        return existing[0]
    part = pack_segment(plan, out, shard, progress=progress, fail_on_reject=fail_on_reject)
    return assemble_shard(plan, out, shard, [part])


def _load_and_check(root: Path, key: str, listed_size: int, options: BuildOptions, codec: Any
                    ) -> tuple[bytes, Any, Rejection | None, str | None]:
    """Read one source file and check it; a bad file becomes a Rejection, never an exception.

    Returns ``(payload, info, rejection, note)``: ``note`` is the codec's label for what it did
    (``Codec.note``), counted in the build summary, or None.
    """
    path = root / key
    try:
        with open(path, "rb") as source:
            data = source.read()
    except FileNotFoundError:
        return b"", None, Rejection(key, "missing", "the file vanished after it was listed"), None
    except PermissionError as exc:
        return b"", None, Rejection(key, "unreadable", f"permission denied: {exc.strerror}"), None
    except OSError as exc:
        return b"", None, Rejection(key, "unreadable", f"read failed: {exc.strerror or exc}"), None
    if len(data) != listed_size:
        return b"", None, Rejection(key, "changed-during-build",
                                    f"listed as {listed_size} bytes, read {len(data)} bytes"), None
    try:
        info = probe_image(data, name=key, validate=options.validate, max_pixels=options.max_pixels)
        payload, info = codec.encode(data, info, name=key)
    except RejectedImageError as exc:
        return b"", None, Rejection(key, exc.reason, exc.message), None
    except PackerError as exc:
        return b"", None, Rejection(key, "decode-failed", exc.message), None
    note = codec.note(data, payload, info) if hasattr(codec, "note") else None
    return payload, info, None, note


def _hash_file(path: Path) -> int:
    hasher = fmt.Hasher()
    with open(path, "rb", buffering=0) as handle:
        buffer = bytearray(16 << 20)
        view = memoryview(buffer)
        while True:
            n = handle.readinto(buffer)
            if not n:
                break
            hasher.update(view[:n])
    return hasher.intdigest()


def _write_record(path: Path, header: dict[str, Any], rows: dict[str, list[int]]) -> None:
    dtypes = {"source": np.uint64, "offset": np.uint64, "size": np.uint64, "checksum": np.uint64,
              "width": np.uint32, "height": np.uint32, "channels": np.uint8, "image_format": np.uint8}
    columns = {name: np.asarray(rows[name], dtype=dtypes[name]) for name in _RECORD_COLUMNS}
    columns["header"] = np.frombuffer(json.dumps(header, sort_keys=True).encode(), dtype=np.uint8)
    write_atomic(path, fmt.encode_column_file(fmt.PLAN_MAGIC, len(columns["source"]), columns))


def _read_record(path: Path, fingerprint: int, out: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    """A shard record, if present, from this plan, and its shard file is still there intact in size."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        _, columns = fmt.parse_column_file(data, fmt.PLAN_MAGIC, path=path, kind="shard record")
        header = json.loads(columns.pop("header").tobytes())
    except (PackerError, KeyError, ValueError):
        return None  # a damaged record is redone, not trusted
    if header.get("plan") != fmt.checksum_hex(fingerprint):
        return None
    if header["sample_count"]:
        shard_path = out / header["path"]
        try:
            if shard_path.stat().st_size != header["size"]:
                return None
        except OSError:
            return None
    return header, columns


# --- finishing ----------------------------------------------------------------------------------

def finish_build(plan: BuildPlan, out: Path, *, history: Sequence[dict[str, Any]] = (),
                 cleanup: bool = True) -> BuildResult:
    """Assemble the index, report and manifest from every shard record of ``plan``.

    Raises:
        BuildError: a planned shard has no record from this plan (a part is missing or was built
            from another plan), or a shard file is missing or the wrong size.
    """
    missing, headers, records = [], [], []
    for shard in range(plan.shard_count):
        found = _read_record(_record_path(out, shard), plan.fingerprint, out)
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
    if not live:
        # No dataset, so no build report either: the reasons go in the message.
        reasons: dict[str, int] = {}
        for r in list(listing.rejected) + [Rejection(**r) for h in headers for r in h["rejected"]]:
            reasons[r.reason] = reasons.get(r.reason, 0) + 1
        shown = ", ".join(f"{n} {reason}" for reason, n in sorted(reasons.items()))
        raise BuildError(f"every one of the {len(listing)} source files was rejected ({shown}); nothing to pack",
                         path=out)
    shards = [fmt.ShardEntry(path=headers[i]["path"], size=headers[i]["size"],
                             checksum=int(headers[i]["checksum"], 16), sample_count=headers[i]["sample_count"])
              for i in live]
    source = np.concatenate([records[i]["source"] for i in live]).astype(np.int64)
    counts = np.array([h["sample_count"] for h in (headers[i] for i in live)], dtype=np.int64)
    keys, key_offsets = gather_blob(listing.key_blob, listing.key_offsets, source)
    meta, meta_offsets = gather_blob(listing.meta_blob, listing.meta_offsets, source)
    columns = {
        "shard": np.repeat(np.arange(len(live), dtype=np.uint32), counts),
        "offset": np.concatenate([records[i]["offset"] for i in live]),
        "size": np.concatenate([records[i]["size"] for i in live]),
        "checksum": np.concatenate([records[i]["checksum"] for i in live]),
        "label": listing.labels[source].astype(np.int64),
        "width": np.concatenate([records[i]["width"] for i in live]),
        "height": np.concatenate([records[i]["height"] for i in live]),
        "channels": np.concatenate([records[i]["channels"] for i in live]),
        "image_format": np.concatenate([records[i]["image_format"] for i in live]),
        "key_offsets": key_offsets, "keys": keys, "meta_offsets": meta_offsets, "meta": meta,
    }
    rejected = list(listing.rejected) + [Rejection(**r) for h in headers for r in h["rejected"]]
    options = plan.options
    codec = get_codec(options.codec)
    build_info = {
        "options": options.to_json(),
        "source_kind": listing.kind,
        "source_files": len(listing) + len(listing.rejected),
        "packed": int(len(source)),
        "rejected": len(rejected),
        "planned_shards": plan.shard_count,
        "tool": f"packer {__version__}",
    }
    notes: dict[str, int] = {}
    for header in headers:
        for note, count in header.get("codec_notes", {}).items():
            notes[note] = notes.get(note, 0) + int(count)
    if notes:  # e.g. {"tiled": 9980, "kept: progressive": 20}
        build_info["codec_notes"] = dict(sorted(notes.items()))
    return commit_dataset(out, columns, shards, classes=listing.classes, codec=codec.manifest_entry(),
                          alignment=options.alignment, build_info=build_info, rejected=rejected,
                          history=list(history), cleanup=cleanup)


def commit_dataset(out: Path, columns: dict[str, np.ndarray], shards: list[fmt.ShardEntry], *,
                   classes: Sequence[str], codec: dict[str, Any], alignment: int,
                   build_info: dict[str, Any], rejected: list[Rejection], history: list[dict[str, Any]],
                   cleanup: bool = True) -> BuildResult:
    """Write index, report and (last) manifest; then remove files no manifest references.

    Also used by ``append`` (which passes the old shards plus new ones and ``cleanup=False``).
    """
    rows = len(columns["offset"])
    fmt.validate_index(rows, columns, shards, alignment, path="(new index)")  # never commit a bad index
    index_pieces = fmt.encode_column_file(fmt.INDEX_MAGIC, rows, columns)
    index_size = sum(memoryview(p).nbytes for p in index_pieces)
    staging_index = out / STAGING_DIR / "index.pki"
    try:
        index_digest = write_atomic(staging_index, index_pieces)
        index_name = fmt.index_file_name(index_digest)
        os.replace(staging_index, out / index_name)
        report_lines = [json.dumps({"type": "summary", **build_info}, sort_keys=True)]
        report_lines += [json.dumps({"type": "rejected", **r.to_json()}, sort_keys=True, ensure_ascii=False)
                         for r in sorted(rejected, key=lambda r: r.key.encode())]
        # Staged until after the commit point: the dataset in place keeps its own report until
        # the manifest that replaces it has landed.
        staged_report = out / STAGING_DIR / fmt.REPORT_NAME
        staged_report.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(staged_report, [("\n".join(report_lines) + "\n").encode()])
        manifest = fmt.Manifest(
            sample_count=rows, alignment=alignment, codec=codec, classes=tuple(classes),
            index=fmt.FileEntry(path=index_name, size=index_size, checksum=index_digest),
            shards=tuple(shards), build=build_info, history=tuple(history),
            created_by=f"packer {__version__}")
        write_atomic(out / fmt.MANIFEST_NAME, [fmt.dump_manifest(manifest)])  # the commit point
        os.replace(staged_report, out / fmt.REPORT_NAME)
        fsync_dir(out)
    except OSError as exc:
        raise _io_error(exc, "writing the index and manifest", out) from None
    if cleanup:
        _remove_unreferenced(out, {s.path for s in shards} | {index_name})
        shutil.rmtree(out / STAGING_DIR, ignore_errors=True)
    payload = int(columns["size"].sum())
    total = sum(s.size for s in shards) + index_size
    return BuildResult(path=out, sample_count=rows, shard_count=len(shards), rejected=rejected,
                       payload_bytes=payload, total_bytes=total, summary=build_info)


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
    for name in (fmt.MANIFEST_NAME, fmt.REPORT_NAME):
        for path in out.glob(f".{name}.*.tmp"):
            path.unlink(missing_ok=True)


# --- the whole build --------------------------------------------------------------------------

def _check_output(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise SourceError("output exists and is not a folder", path=out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _io_error(exc, "creating the output folder", out) from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise BuildError("the output folder is not writable", path=out)
    if (out / fmt.MANIFEST_NAME).exists() and not overwrite:
        raise OutputExistsError("a dataset already exists here; pass --overwrite to replace it", path=out)


def build(source: str | os.PathLike[str], out: str | os.PathLike[str], options: BuildOptions = BuildOptions(),
          *, workers: int | None = None, overwrite: bool = False, resume: bool = False,
          on_error: str = "skip", root: str | os.PathLike[str] | None = None,
          part: tuple[int, int] | None = None, plan_only: bool = False, engine: str = "local",
          address: str | None = None,
          progress: bool = True) -> BuildResult | None:
    """Build a dataset from ``source`` into ``out`` (the library form of ``packer build``).

    Args:
        source: an ImageFolder-layout folder, or a ``.csv``/``.jsonl`` manifest.
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
        progress: show a tqdm bar on stderr.

    Returns:
        The BuildResult, or None when only a part was packed.

    Raises:
        SourceError, EmptySourceError, OutputExistsError, BuildLockedError, BuildError.
    """
    started = time.monotonic()
    source_path, out_path = Path(source), Path(out)
    if on_error not in ("skip", "fail"):
        raise SourceError(f"--on-error must be 'skip' or 'fail', got {on_error!r}")
    options.check()  # before the output folder or its lock file exist
    if not source_path.exists():
        raise SourceError("source does not exist", path=source_path)
    # --resume continues a build that was replacing a dataset, or that committed and was killed
    # while cleaning up: its saved plan shows it was allowed to write here.
    split = part is not None or plan_only  # one step of a split build: shares the folder with others
    continuing = resume and not split and (out_path / STAGING_DIR / PLAN_NAME).is_file()
    _check_output(out_path, overwrite or split or continuing)
    if split and (out_path / fmt.MANIFEST_NAME).exists() and not overwrite:
        raise OutputExistsError("a dataset already exists here; pass --overwrite to replace it", path=out_path)
    root_path = Path(root) if root is not None else None
    with build_lock(out_path, shared=split):
        if not (overwrite or continuing) and (out_path / fmt.MANIFEST_NAME).exists():
            # Checked again under the lock: another build may have committed since the check above.
            raise OutputExistsError("a dataset already exists here; pass --overwrite to replace it",
                                    path=out_path)
        staging = out_path / STAGING_DIR
        if not split and not resume and staging.exists():
            shutil.rmtree(staging)  # a stale, unfinished build: start over (use --resume to continue)
        plan = prepare_plan(source_path, out_path, options, root=root_path, reuse=resume or split,
                            progress=progress)
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
        result = finish_build(plan, out_path)
    result.seconds = time.monotonic() - started
    return result


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
        return finish_build(plan, out_path)


# --- engines ----------------------------------------------------------------------------------

def run_shards(plan: BuildPlan, out: Path, shard_ids: list[int], *, workers: int | None, engine: str,
               address: str | None, progress: bool, fail_on_reject: bool) -> None:
    """Pack the given planned shards with the chosen engine, showing one progress bar."""
    from .progress import BuildProgress

    total_files = int(sum(plan.shard_starts[s + 1] - plan.shard_starts[s] for s in shard_ids))
    total_bytes = int(sum(int(plan.listing.sizes[plan.shard_members(s)].sum()) for s in shard_ids))
    with BuildProgress(total_files, total_bytes, enabled=progress) as bar:
        if engine == "ray":
            from .engines.ray_engine import run_with_ray
            run_with_ray(plan, out, shard_ids, address=address, progress=bar.update,
                         fail_on_reject=fail_on_reject)
        elif engine == "local":
            from .engines.local import run_local
            run_local(plan, out, shard_ids, workers=workers, progress=bar.update, fail_on_reject=fail_on_reject)
        else:
            raise SourceError(f"unknown engine {engine!r} (use 'local' or 'ray')")
