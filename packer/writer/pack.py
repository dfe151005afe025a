"""Packing planned shards: read and check each source file, write aligned payloads, commit the shard.

A planned shard is packed by one task (or, when there are fewer shards than workers, as several
segments joined in order with ``copy_file_range``: the same bytes a single writer would write).
A task touches nothing another task owns, so tasks can run in any order and be retried.
"""

from __future__ import annotations

import mmap
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .. import format as fmt
from ..codecs import get_codec
from ..errors import BuildError, PackerError, RejectedImageError
from .._internal.files import FolderReader
from ..duplicates.phash import hash_payload
from .._internal.imageinfo import DEFAULT_MAX_PIXELS, probe_image
from .._internal.atomic import fsync_dir
from .._internal.names import source_name
from .._internal.pillowformats import normalize_to_png
from ..sources.members import MemberReader
from .plan import BuildPlan
from .settings import BuildSettings
from ..sources.fieldvalues import FIELD_REJECTION
from .records import read_record, record_columns, record_path, write_record
from ..sources import Rejection
from .sourcefiles import read_listed
from .staging import STAGING_DIR, TEMP_DIR, io_error

__all__ = ["ProgressSink", "SegmentResult", "segment_count", "pack_segment", "assemble_shard",
           "shard_is_done", "pack_planned_shard"]

#: Called with (files done, bytes done) increments; the local engine forwards them to tqdm.
ProgressSink = Callable[[int, int], None]


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
    #: image fields (formats/SPEC.md §14): field name -> (temp file, length), laid out like ``path``
    field_files: dict[str, tuple[str, int]] = field(default_factory=dict)


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
        raise io_error(exc, f"writing shard {shard}", temp_dir) from None
    return temp_dir


class _PayloadWriter:
    """One segment's payload file: aligned payloads written in order, with their offsets."""

    def __init__(self, path: Path, position: int, alignment: int) -> None:
        self.path = path
        self.position = position
        self.alignment = alignment
        self.handle = open(path, "wb", buffering=8 << 20)
        self.handle.write(bytes(position))
        self._zeros = memoryview(bytes(alignment))  # padding is a view of these, not a new object

    def write(self, payload: bytes) -> int:
        """Append one payload and its padding; returns its offset."""
        offset = self.position
        size = len(payload)
        self.handle.write(payload)
        padding = -size % self.alignment
        if padding:
            self.handle.write(self._zeros[:padding])
        self.position += size + padding
        return offset

    def close(self) -> None:
        self.handle.close()


def pack_segment(plan: BuildPlan, out: Path, shard: int, segment: int = 0, segments: int = 1, *,
                 progress: ProgressSink | None = None, fail_on_reject: bool = False) -> SegmentResult:
    """Read, check and write one segment of planned shard ``shard`` to a temp file.

    With image fields, each sample's second images are read and checked too (a sample whose
    field image is bad is rejected whole) and written to one temp file per field, laid out like
    the main one, so the field's shard runs parallel to the main shard.

    Raises:
        BuildError: an output I/O error (disk full, permissions), or a rejection with ``fail_on_reject``.
    """
    settings = plan.settings
    codec = get_codec(settings.codec)
    alignment = plan.alignment
    listing = plan.listing
    image_fields = listing.fields.image_specs if listing.fields is not None else ()
    members = _segment_members(plan, shard, segment, segments)
    hashes = settings.hash == "perceptual"
    rows: dict[str, list[int]] = {name: [] for name in record_columns(image_fields, hashes=hashes)}
    rejected: list[dict[str, str]] = []
    notes: dict[str, int] = {}
    hash_limit = max(settings.checks.max_pixels, DEFAULT_MAX_PIXELS)  # the readers' limit for this dataset
    stem = f"shard-{shard:05d}.seg-{segment:03d}"
    temp_dir = _temp_dir(out, shard)
    temp = temp_dir / f"{stem}.{os.getpid()}.partial"
    field_temps = {spec.name: temp_dir / f"{stem}.{spec.name}.{os.getpid()}.partial" for spec in image_fields}
    start = fmt.shard_data_offset(alignment) if segment == 0 else 0
    pending_files = pending_bytes = 0
    last_report = time.monotonic()
    writers: list[_PayloadWriter] = []
    # Per-sample values as plain lists, taken from the listing's arrays once per segment.
    sizes = listing.sizes[members].tolist()
    stamps = (listing.stamps[members].tolist() if len(listing.stamps) == len(listing.sizes)
              else [0] * len(members))
    key_blob = listing.key_blob
    key_starts = listing.key_offsets[members].tolist()
    key_ends = listing.key_offsets[members + 1].tolist()
    try:
        with MemberReader(listing.members) as archive, FolderReader(listing.root) as files:
            main = _PayloadWriter(temp, start, alignment)
            writers.append(main)
            field_writers = {}
            for spec in image_fields:
                field_writers[spec.name] = _PayloadWriter(field_temps[spec.name], start, alignment)
                writers.append(field_writers[spec.name])
            for position, source_index in enumerate(members.tolist()):
                key = key_blob[key_starts[position]:key_ends[position]].tobytes().decode("utf-8")
                size = sizes[position]
                # an archive source's member is read by offset (build/members.py); a file by path
                member = archive.read(source_index, size) if listing.members is not None else None
                payload, info, rejection, note = _load_and_check(
                    files, key, size, settings, codec, stamps[position], member=member,
                    name=source_name(key, listing.metadata(source_index)) if "%" in key else None)
                pending_files += 1
                extra: list[tuple[bytes, Any]] = []
                if rejection is None:
                    for spec in image_fields:
                        loaded = _load_field_image(listing, spec.name, source_index, key, settings, archive, files)
                        if isinstance(loaded, Rejection):
                            rejection = loaded
                            break
                        extra.append(loaded)
                if note is not None and rejection is None:
                    notes[note] = notes.get(note, 0) + 1
                if rejection is not None:
                    if fail_on_reject:
                        raise BuildError(f"{rejection.reason}: {rejection.message} (--on-error fail)",
                                         path=listing.root / key)
                    rejected.append(rejection.to_json())
                else:
                    rows["source"].append(source_index)
                    _add_payload_row(rows, "", main.write(payload), payload, info)
                    if hashes:  # the stored payload's hash, as `packer inspect --duplicates` would compute it
                        words, status = hash_payload(payload, info.image_format, height=info.height,
                                                     width=info.width, channels=info.channels, name=key,
                                                     max_pixels=hash_limit)
                        rows["phash_lo"].append(int(words[0]))
                        rows["phash_hi"].append(int(words[1]))
                        rows["phash_status"].append(status)
                    for spec, (field_payload, field_info) in zip(image_fields, extra):
                        _add_payload_row(rows, f"{spec.name}__", field_writers[spec.name].write(field_payload),
                                         field_payload, field_info)
                    pending_bytes += len(payload)
                now = time.monotonic()
                if progress and now - last_report > 0.2:
                    progress(pending_files, pending_bytes)
                    pending_files = pending_bytes = 0
                    last_report = now
            for writer in writers:
                writer.close()
    except OSError as exc:
        _discard(writers, [temp, *field_temps.values()])
        raise io_error(exc, f"writing shard {shard}", temp) from None
    except BaseException:
        _discard(writers, [temp, *field_temps.values()])
        raise
    if progress and (pending_files or pending_bytes):
        progress(pending_files, pending_bytes)
    return SegmentResult(shard=shard, segment=segment, path=str(temp), length=main.position, rows=rows,
                         rejected=rejected, notes=notes,
                         field_files={name: (str(field_temps[name]), writer.position)
                                      for name, writer in field_writers.items()})


def _discard(writers: Sequence[_PayloadWriter], paths: Sequence[Path]) -> None:
    for writer in writers:
        try:
            writer.close()
        except OSError:
            pass
    for path in paths:
        path.unlink(missing_ok=True)


def _add_payload_row(rows: dict[str, list[int]], prefix: str, offset: int, payload: bytes, info: Any) -> None:
    """One packed payload's record row (``prefix``: ``""`` for the main image, ``"<field>__"``)."""
    rows[prefix + "offset"].append(offset)
    rows[prefix + "size"].append(len(payload))
    rows[prefix + "checksum"].append(fmt.checksum(payload))
    rows[prefix + "width"].append(info.width)
    rows[prefix + "height"].append(info.height)
    rows[prefix + "channels"].append(info.channels)
    rows[prefix + ("format" if prefix else "image_format")].append(info.image_format)


def _load_field_image(listing: Any, name: str, source_index: int, key: str, settings: BuildSettings,
                      archive: MemberReader, files: FolderReader) -> tuple[bytes, Any] | Rejection:
    """Read and check a sample's second image of field ``name``: stored as it is (pass-through,
    whatever the main codec: a mask must keep its exact values), header-checked like any image.

    A file source's second image is a file under the root; an archive source's is a member read
    by offset like the sample's image (``MemberReader.read(..., field=name)``)."""
    table = listing.fields
    field_key = table.image_key(name, source_index)
    size = int(table.image_sizes[name][source_index])
    if size > settings.checks.max_file_size:
        return Rejection(key, FIELD_REJECTION, f"field {name!r} ({field_key}) is {size} bytes; the limit "
                                               f"(--max-file-size) is {settings.checks.max_file_size}")
    inside: bool | None = True
    if listing.members is not None:
        data, reason, message = archive.read(source_index, size, field=name)
        if reason:
            return Rejection(key, FIELD_REJECTION, f"field {name!r} ({field_key}): {message} ({reason})")
    else:
        data, inside = read_listed(files, field_key, field_key, size)
    if isinstance(data, Rejection):
        return Rejection(key, FIELD_REJECTION, f"field {name!r} ({field_key}): {data.message} ({data.reason})")
    try:
        info = probe_image(data, name=field_key, validate=settings.checks.validate, max_pixels=settings.checks.max_pixels)
    except RejectedImageError as exc:
        message = exc.message
        if exc.reason == "not-an-image" and not (inside or files.resolves_inside(field_key)):
            message = _quiet_message(data, field_key, settings)
        return Rejection(key, FIELD_REJECTION, f"field {name!r} ({field_key}): {message} ({exc.reason})")
    except PackerError as exc:
        return Rejection(key, FIELD_REJECTION, f"field {name!r} ({field_key}): {exc.message}")
    except Exception as exc:  # noqa: BLE001 - one hostile file must never abort the whole build
        return Rejection(key, FIELD_REJECTION, f"field {name!r} ({field_key}): {type(exc).__name__}: {exc}")
    return data, info


def _append_file(target: Any, source_path: str, length: int) -> None:
    """Append ``length`` bytes of a file to ``target`` in the kernel (copy_file_range), no user-space copy."""
    with open(source_path, "rb") as source:
        copied = 0
        while copied < length:
            n = os.copy_file_range(source.fileno(), target.fileno(), length - copied)
            if n == 0:
                raise BuildError(f"segment file ended after {copied} of {length} bytes", path=source_path)
            copied += n


def _join_segments(target: Path, parts: Sequence[tuple[str, int]]) -> int:
    """Append segment files 1.. to segment 0's file ``target`` (in the kernel); returns the length."""
    position = parts[0][1]
    with open(target, "r+b") as handle:
        for path, length in parts[1:]:
            handle.seek(position)
            _append_file(handle, path, length)
            os.unlink(path)
            position += length
    return position


def _commit_payload_file(path: Path, out: Path, *, alignment: int, count: int, length: int, number: int,
                         name_of: Callable[[int], str]) -> dict[str, Any]:
    """Write the shard header into a joined payload file, sync it, and move it to its final name."""
    header = fmt.ShardHeader(alignment=alignment, sample_count=count, file_size=length, shard_number=number)
    with open(path, "r+b") as handle:
        handle.write(header.encode()[: fmt.SHARD_HEADER_SIZE])
        handle.flush()
        os.fsync(handle.fileno())
    digest = _hash_file(path)
    final_name = name_of(digest)
    (out / fmt.SHARD_DIR).mkdir(exist_ok=True)
    os.replace(path, out / final_name)
    return {"path": final_name, "size": length, "checksum": fmt.checksum_hex(digest)}


def assemble_shard(plan: BuildPlan, out: Path, shard: int, parts: Sequence[SegmentResult]) -> dict[str, Any]:
    """Join a planned shard's segments (in order) into its file, commit it, and write its record.

    Image fields' payload files are joined and committed the same way, before the record that
    names them all.

    Raises:
        BuildError: an output I/O error.
    """
    parts = sorted(parts, key=lambda p: p.segment)
    alignment = plan.alignment
    first = Path(parts[0].path)
    image_fields = [spec.name for spec in plan.listing.fields.image_specs] if plan.listing.fields is not None else []
    columns = record_columns(plan.listing.fields.image_specs if plan.listing.fields is not None else (),
                             hashes=plan.settings.hash == "perceptual")
    rows: dict[str, list[int]] = {name: [] for name in columns}
    rejected: list[dict[str, str]] = []
    notes: dict[str, int] = {}
    temps = [Path(part.path) for part in parts] + [Path(part.field_files[name][0]) for part in parts
                                                   for name in image_fields]
    try:
        positions = {"": 0, **{name: 0 for name in image_fields}}
        for part in parts:
            for name in columns:
                values = part.rows[name]
                owner = name.partition("__")[0] if "__" in name else ""
                if name.endswith("offset"):
                    values = [v + positions[owner] for v in values]
                rows[name].extend(values)
            positions[""] += part.length
            for field_name in image_fields:
                positions[field_name] += part.field_files[field_name][1]
            rejected.extend(part.rejected)
            for note, count in part.notes.items():
                notes[note] = notes.get(note, 0) + count
        count = len(rows["source"])
        number = plan.first_shard_number + shard
        record: dict[str, Any] = {"shard": shard, "plan": fmt.checksum_hex(plan.fingerprint),
                                  "sample_count": count, "rejected": rejected}
        if notes:
            record["codec_notes"] = notes
        if count:
            field_entries = {}
            for field_name in image_fields:
                field_parts = [part.field_files[field_name] for part in parts]
                length = _join_segments(Path(field_parts[0][0]), field_parts)
                field_entries[field_name] = _commit_payload_file(
                    Path(field_parts[0][0]), out, alignment=alignment, count=count, length=length, number=number,
                    name_of=lambda digest, field_name=field_name: fmt.field_shard_file_name(field_name, number, digest))
            length = _join_segments(first, [(part.path, part.length) for part in parts])
            record.update(_commit_payload_file(first, out, alignment=alignment, count=count, length=length,
                                               number=number, name_of=lambda digest: fmt.shard_file_name(number, digest)))
            fsync_dir(out / fmt.SHARD_DIR)
            if field_entries:
                record["fields"] = field_entries
        else:
            for path in temps:
                path.unlink(missing_ok=True)
        write_record(record_path(out, shard), record, rows)
        return record
    except OSError as exc:
        for path in temps:
            path.unlink(missing_ok=True)
        raise io_error(exc, f"writing shard {shard}", first) from None
    except BaseException:
        for path in temps:
            path.unlink(missing_ok=True)
        raise


def shard_is_done(plan: BuildPlan, out: Path, shard: int) -> bool:
    """Whether planned shard ``shard`` has a valid record from this plan (resume, parts)."""
    return read_record(record_path(out, shard), plan.fingerprint, out) is not None


def pack_planned_shard(plan: BuildPlan, out: Path, shard: int, *, progress: ProgressSink | None = None,
                       fail_on_reject: bool = False) -> dict[str, Any]:
    """Pack planned shard ``shard``: write its file and its record. Returns the record header.

    Idempotent: a shard whose record already exists for this plan is not packed again.

    Raises:
        BuildError: an output I/O error (disk full, permissions), or a rejection with
            ``fail_on_reject``.
    """
    existing = read_record(record_path(out, shard), plan.fingerprint, out)
    if existing is not None:
        if progress:
            progress(len(plan.shard_members(shard)), 0)
        return existing[0]
    part = pack_segment(plan, out, shard, progress=progress, fail_on_reject=fail_on_reject)
    return assemble_shard(plan, out, shard, [part])


def _load_and_check(files: FolderReader, key: str, listed_size: int, settings: BuildSettings, codec: Any,
                    listed_stamp: int = 0, member: tuple[bytes, str, str] | None = None,
                    name: bytes | None = None
                    ) -> tuple[bytes, Any, Rejection | None, str | None]:
    """Read one source file and check it; a bad file becomes a Rejection, never an exception.

    ``member``: an archive member already read (``MemberReader.read``: data, reason, message).
    ``name``: the file's real relative name when ``key`` is its escaped form (``packer._internal.names``).
    Returns ``(payload, info, rejection, note)``: ``note`` is the codec's label for what it did
    (``Codec.note``), counted in the build summary, or None.
    """
    if member is not None:
        if member[1]:
            return b"", None, Rejection(key, member[1], member[2]), None
        return _check(member[0], key, settings, codec)
    relative = key if name is None else os.fsdecode(name)  # an escaped key names other bytes
    if listed_size > settings.checks.max_file_size:
        return b"", None, Rejection(key, "file-too-large",
                                    f"is {listed_size} bytes; the limit (--max-file-size) is "
                                    f"{settings.checks.max_file_size}"), None
    data, inside = read_listed(files, relative, key, listed_size, listed_stamp)
    if isinstance(data, Rejection):
        return b"", None, data, None
    return _check(data, key, settings, codec,
                  quote_bytes=True if inside else lambda: files.resolves_inside(relative))


def _check(data: bytes, key: str, settings: BuildSettings, codec: Any, *,
           quote_bytes: bool | Callable[[], bool] = True) -> tuple[bytes, Any, Rejection | None, str | None]:
    """Probe and encode one source's bytes (a file's or an archive member's).

    ``quote_bytes``: False for a file outside the source (a link to ``/etc/passwd``): a rejection
    never quotes its bytes. A callable is asked only when a rejection would quote them (resolving
    the path is left to the rare file that needs it).
    """
    converted = None
    try:
        info = probe_image(data, name=key, validate=settings.checks.validate, max_pixels=settings.checks.max_pixels)
        if settings.checks.normalize_formats:  # --normalize-formats: rare formats become PNG (pillowformats)
            png = normalize_to_png(data, info.image_format, path=key, max_pixels=settings.checks.max_pixels)
            if png is not None:
                converted = f"png from {fmt.ImageFormat.NAMES.get(info.image_format, 'other')}"
                data = png
                info = probe_image(data, name=key, validate="header", max_pixels=settings.checks.max_pixels)
        source_info = info
        payload, info = codec.encode(data, info, name=key)
    except RejectedImageError as exc:
        message = exc.message
        if exc.reason == "not-an-image" and not (quote_bytes() if callable(quote_bytes) else quote_bytes):
            message = _quiet_message(data, key, settings)  # never the bytes of a file outside the source
        return b"", None, Rejection(key, exc.reason, message), None
    except PackerError as exc:
        return b"", None, Rejection(key, "decode-failed", exc.message), None
    except Exception as exc:  # noqa: BLE001 - one hostile file must never abort the whole build
        return b"", None, Rejection(key, "decode-failed",
                                    f"the {settings.codec} codec failed on it: {type(exc).__name__}: {exc}"), None
    note = codec.note(data, payload, info, source_info=source_info) if hasattr(codec, "note") else None
    return payload, info, None, converted if converted is not None and note is None else note


def _quiet_message(data: bytes, key: str, settings: BuildSettings) -> str:
    """The not-an-image message that does not quote the file's bytes (a file outside the source)."""
    try:
        probe_image(data, name=key, validate=settings.checks.validate, max_pixels=settings.checks.max_pixels, show_bytes=False)
    except RejectedImageError as quiet:
        return quiet.message
    return "bytes that are not an image (not quoted: the file lies outside the source folder)"


def _hash_file(path: Path) -> int:
    """The xxh3 of a finished shard file, hashed from a mapping of the page cache (no copy out)."""
    hasher = fmt.Hasher()
    with open(path, "rb", buffering=0) as handle:
        size = os.fstat(handle.fileno()).st_size
        if size:
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)  # one fault-in, not one per page
            with mmap.mmap(handle.fileno(), size, flags=flags, prot=mmap.PROT_READ) as mapping:
                hasher.update(mapping)
    return hasher.intdigest()
