"""``verify``: check every byte of a dataset against its manifest, index and checksums.

One sequential pass per shard does everything. The shard file is read in large chunks
(``os.preadv`` into one reused buffer, with ``POSIX_FADV_SEQUENTIAL`` and a ``WILLNEED`` hint for
the next chunk so the kernel reads ahead while this one is hashed), and each chunk feeds:

* the whole-file xxh3, compared with the manifest's shard checksum;
* the xxh3 of every sample payload lying in it (a payload cut by a chunk boundary is hashed
  with a streaming state), compared with the index's ``checksum`` column;
* a zero test of the header padding and of the alignment padding after every payload (the
  spec requires zeros: nonzero padding means the file was damaged);
* with ``decode=True``, a full decode of every intact payload.

Nothing is read twice, so on a disk the pass runs at the disk's speed: xxh3 hashes several
GB/s per core. Shards are spread over worker processes when there are several.

Why ~800 lines in one module (the house guide is ~700): the shard scan, the field-value checks,
the problem list and the worker pool share private task and result types that travel to forked
workers together; the field-value checks (``_check_field_values`` and the ``_bad_*`` helpers)
are what moves out first if the module grows.

Declared fields (formats/SPEC.md §14) are checked too. An image field's shards (masks, depth
maps) get exactly the pass main shards get (size, header against the manifest, whole-file
checksum, every payload's checksum, zero padding, with ``decode=True`` a decode keeping the
stored values), as tasks of their own beside the main shards. The values of the other fields
live in the index, whose structure ``open_index`` already checked (R46-R49); what is left is
checked here, vectorised and in bounded chunks: text is UTF-8, class sets are sorted without
repeats, ``bool`` bytes are 0 or 1. Problems about a field carry its name (``Problem.field``).

Damage is reported, never raised: a missing, truncated or extended shard file, a bad header,
a damaged sample or an undecodable image each becomes a ``Problem`` naming the shard, the
sample number and its key, and ``verify`` goes on to check everything else. Structural errors
found while opening the manifest and index (``open_index``) make one problem of kind
``"structure"``: without a trusted index nothing else can be checked.
"""

from __future__ import annotations

import dataclasses
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import xxhash

from . import format as fmt
from .errors import (DatasetChangedError, DecodeError, FormatError, NotAPackerFileError, PackerError,
                     TruncatedFileError, UnsafePathError)
from ._internal.files import open_inside
from ._internal.machine import available_cpus

if TYPE_CHECKING:
    from .remote.url import DatasetURL

__all__ = ["Problem", "VerifyReport", "verify", "PROBLEM_KINDS", "CHUNK_SIZE", "BYTES_PER_WORKER",
           "MAX_VALUE_PROBLEMS"]

#: Bytes read per ``preadv``: large enough that syscall and Python overhead vanish next to the
#: copy and the hashing, small enough to stay in the L3-ish range of a worker's memory budget.
CHUNK_SIZE = 16 << 20

#: What each ``Problem.kind`` means.
PROBLEM_KINDS = {
    "structure": "the manifest or index is damaged or inconsistent; nothing else was checked",
    "missing": "a shard file listed by the manifest is missing or cannot be opened",
    "size": "a shard file's size on disk differs from the manifest's",
    "truncated": "samples whose bytes lie past the end of a truncated shard file",
    "header": "a shard header is invalid, disagrees with the manifest, or has nonzero reserved bytes",
    "checksum": "a sample's payload does not hash to its recorded checksum",
    "padding": "nonzero bytes in the alignment padding after a sample's payload",
    "shard-checksum": "a shard file does not hash to the manifest's checksum",
    "decode": "a sample's payload hashes correctly but does not decode as its image format",
    "io": "reading a shard file failed with an I/O error, or the process checking it died",
    "field": "a declared field's value breaks its declaration (text not UTF-8, a class set not sorted "
             "without repeats, a bool byte not 0 or 1)",
    "hashes": "the dataset was built with --hash perceptual and its hashes file is missing, damaged or stale, "
              "or a sample's stored hash is not the hash of its image",
}

#: Bits a stored perceptual hash may differ from the one recomputed here and still match: the
#: hash is float64 arithmetic, and a coefficient within rounding error of zero may flip its bit
#: on another machine (``duplicates.phash``). A hash of another image differs by tens of bits.
HASH_TOLERANCE = 2

#: ``field`` problems listed per field and check; the rest are counted (``VerifyReport.unlisted``)
#: in one summary problem. A writer bug can break every value of a 100M-sample dataset: a
#: Python object per sample would take more memory than the index.
MAX_VALUE_PROBLEMS = 1000
#: Bytes of one field's values checked per step (a group of whole samples): bounds the memory
#: of the vectorised passes whatever the dataset's size.
VALUE_CHUNK_BYTES = 16 << 20

@dataclass(frozen=True)
class Problem:
    """One thing found wrong.

    Attributes:
        kind: one of ``PROBLEM_KINDS``.
        message: what is wrong: expected, got, and where.
        sample: the damaged sample's number, when the problem is about one sample.
        shard: the shard number (position in the manifest), when known.
        key: the damaged sample's key (its source path), when ``sample`` is set.
        path: the file the problem is about (dataset-relative for shards).
        sample_range: ``(first, end)`` sample numbers affected, for problems about many samples
            (a missing shard, a truncated tail).
        field: the declared field the problem is about (its shard, payload or value), else None.
    """

    kind: str
    message: str
    sample: int | None = None
    shard: int | None = None
    key: str | None = None
    path: str | None = None
    sample_range: tuple[int, int] | None = None
    field: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message, "sample": self.sample, "shard": self.shard,
                "key": self.key, "path": self.path, "field": self.field,
                "sample_range": list(self.sample_range) if self.sample_range else None}

    def __str__(self) -> str:
        where = []
        if self.shard is not None:
            where.append(f"shard {self.shard}")
        if self.field is not None:
            where.append(f"field {self.field!r}")
        if self.sample is not None:
            where.append(f"sample {self.sample}" + (f" ({self.key})" if self.key else ""))
        elif self.sample_range is not None:
            first, end = self.sample_range
            where.append(f"samples {first}..{end - 1}")
        prefix = ", ".join(where)
        return f"[{self.kind}] {prefix + ': ' if prefix else ''}{self.message}"


@dataclass
class VerifyReport:
    """The outcome of ``verify``.

    Attributes:
        path: the dataset folder.
        ok: True when no problem was found.
        samples: the dataset's sample count (0 when the index could not be opened).
        shards: the dataset's shard count.
        samples_checked: samples whose payload was read and hashed.
        shards_checked: shard files that were opened and scanned.
        bytes_read: bytes read from shard files.
        seconds: wall time of the whole check.
        decoded: whether payloads were also decoded.
        problems: everything found wrong: the shards' (main and image fields') ordered by shard
            and sample, then the field values'.
        fields: per declared field, what was checked: ``kind``, ``samples_checked`` (values, or
            an image field's payloads hashed), ``problems``; image fields also ``shards``,
            ``shards_checked`` and ``bytes_read``. Empty for a dataset without fields.
        unlisted: damaged field values counted but not listed one by one (past
            ``MAX_VALUE_PROBLEMS`` per field and check; a summary problem says how many).
    """

    path: str
    ok: bool
    samples: int = 0
    shards: int = 0
    samples_checked: int = 0
    shards_checked: int = 0
    bytes_read: int = 0
    seconds: float = 0.0
    decoded: bool = False
    problems: list[Problem] = field(default_factory=list)
    fields: dict[str, dict[str, Any]] = field(default_factory=dict)
    unlisted: int = 0
    #: For a dataset built with ``--hash perceptual``: ``samples_checked`` (stored hashes compared
    #: with the images' recomputed ones) and ``problems``; None when the build kept no hashes.
    hashes: dict[str, Any] | None = None

    @property
    def damaged_samples(self) -> list[int]:
        """Sorted numbers of the samples named by a problem (ranges expanded)."""
        found: set[int] = set()
        for problem in self.problems:
            if problem.sample is not None:
                found.add(problem.sample)
            elif problem.sample_range is not None:
                found.update(range(*problem.sample_range))
        return sorted(found)

    @property
    def damaged_sample_count(self) -> int:
        found: set[int] = set()
        ranged = 0
        for problem in self.problems:
            if problem.sample is not None:
                found.add(problem.sample)
            elif problem.sample_range is not None:
                ranged += problem.sample_range[1] - problem.sample_range[0]
        # ranges (missing shards, lost tails) never overlap single samples; unlisted field values may
        # (a sample with a bad caption and a bad mask): an upper bound then, exact otherwise
        return len(found) + ranged + self.unlisted

    @property
    def megabytes_per_second(self) -> float:
        return self.bytes_read / max(self.seconds, 1e-9) / 1e6

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "path": self.path, "samples": self.samples, "shards": self.shards,
                "samples_checked": self.samples_checked, "shards_checked": self.shards_checked,
                "bytes_read": self.bytes_read, "seconds": round(self.seconds, 6), "decoded": self.decoded,
                "damaged_sample_count": self.damaged_sample_count, "unlisted": self.unlisted,
                "fields": self.fields, "problems": [p.to_json() for p in self.problems],
                **({"hashes": self.hashes} if self.hashes is not None else {})}


@dataclass(frozen=True)
class _ShardTask:
    """Everything one worker needs to scan one shard: paths and the shard's index slice."""

    root: str
    shard: int
    path: str
    size: int
    checksum: int
    sample_count: int
    expected_number: int
    alignment: int
    first_sample: int
    offsets: np.ndarray
    sizes: np.ndarray
    checksums: np.ndarray
    image_formats: np.ndarray
    widths: np.ndarray
    heights: np.ndarray
    channels: np.ndarray
    decode: bool
    max_pixels: int = 0  # the decode limit (dataset_max_pixels); 0 when not decoding
    #: An image field's shard parallel to main shard ``shard`` (its payload columns above); ""
    #: for a main shard. Field payloads are decoded as stored (values kept: masks, depth).
    field: str = ""


@dataclass
class _ShardResult:
    shard: int
    problems: list[Problem]
    bytes_read: int = 0
    samples_checked: int = 0
    scanned: bool = False
    field: str = ""


def _verify_url(url: "DatasetURL", **options: Any) -> "VerifyReport":
    """A dataset in object storage: its objects are copied raw into a temporary folder of the node
    cache (``packer.remote.upload.mirror``), checked there like a folder, and reported by URL."""
    import tempfile

    from .remote.options import RemoteOptions
    from .remote.upload import mirror

    settings = RemoteOptions()
    settings.cache_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="verify-", dir=settings.cache_root) as folder:
        mirror(url, settings, folder)
        # The hashes file of a --hash perceptual build stays with the local build (it is not one
        # of the objects a manifest names): the objects are checked, the hashes are not.
        report = _verify_folder(Path(folder), hashes=False, **options)
    report.path = url.text
    report.problems = [dataclasses.replace(problem, path=url.text + str(problem.path)[len(folder):])
                       if problem.path and str(problem.path).startswith(folder) else problem
                       for problem in report.problems]
    return report


def verify(path: str | os.PathLike[str], *, decode: bool = False, workers: int | None = None,
           progress: bool = False, max_pixels: int | None = None) -> VerifyReport:
    """Check a dataset completely: structure, every shard and sample checksum, padding, headers.

    Args:
        path: the dataset folder.
        decode: also decode every sample whose checksum matches (slow: milliseconds per image).
        workers: processes to scan shards in parallel; ``None`` picks one per available core,
            at most one per shard and one per ``BYTES_PER_WORKER`` (256 MiB) of shards; ``1``
            scans in this process.
        progress: show a tqdm bar on stderr (samples/s and MB/s); off by default in the library
            (the CLI turns it on), so library calls print nothing unless asked.
        max_pixels: with ``decode``, the pixel limit (default: the one the manifest records,
            ``codecs.dataset_max_pixels``, so every image the build accepted decodes).

    Returns:
        A ``VerifyReport``; ``report.ok`` is False when anything is wrong, and
        ``report.problems`` names each damaged shard and sample.

    Raises:
        MissingDependencyError: ``decode=True`` but an image decoder is not installed.

    A dataset built with ``--hash perceptual`` also has its hashes file checked (present, valid,
    for this index) and every stored hash compared with its image's hash computed now
    (``report.hashes``; problems of kind ``hashes``). A dataset at a URL: its objects are checked,
    not the hashes, which stay with the build that computed them.
    """
    from .location import parse_location

    location = parse_location(path, what="the dataset")
    if location.url is not None:  # verify reads the stored bytes raw: a URL's objects are copied first
        return _verify_url(location.url, decode=decode, workers=workers, progress=progress, max_pixels=max_pixels)
    return _verify_folder(location.local_path(), decode=decode, workers=workers, progress=progress,
                          max_pixels=max_pixels)


def _verify_folder(root: Path, *, decode: bool, workers: int | None, progress: bool, max_pixels: int | None,
                   hashes: bool = True) -> VerifyReport:
    """``verify`` of a dataset folder; ``hashes``: check a ``--hash perceptual`` build's hashes file."""
    from .dataset import open_index  # lazy: keep `import packer.verify` light

    started = time.monotonic()
    from .viewfile import is_view_file

    if is_view_file(root):  # a view: only its samples, through the dataset reader
        return _verify_view(root, decode=decode, progress=progress, max_pixels=max_pixels, started=started)
    try:
        index = open_index(root)
    except PackerError as exc:
        return _unopenable(root, exc, started, decode)
    limit = 0
    if decode:
        from . import decode as _decode  # noqa: F401  (fail early if the decoders are missing)
        from .codecs import codec_for, dataset_max_pixels

        try:
            codec_for(index, path=root).check_decodable()  # SPEC 6: refuse an unknown codec
            limit = dataset_max_pixels(index.manifest, max_pixels)
        except PackerError as exc:
            index.close()
            return VerifyReport(path=str(root), ok=False, seconds=time.monotonic() - started, decoded=decode,
                                problems=[Problem(kind="structure", message=exc.message, path=exc.path)])
    try:
        manifest = index.manifest
        ix = index.index
        tasks = []
        for number, entry in enumerate(manifest.shards):
            first, end = index.shard_range(number)
            tasks.append(_ShardTask(
                root=str(root), shard=number, path=entry.path, size=entry.size, checksum=entry.checksum,
                sample_count=entry.sample_count, expected_number=fmt.shard_number_of(entry.path),
                alignment=manifest.alignment, first_sample=first,
                # Views of the mapped index: copied only when pickled for a worker process.
                offsets=ix.offset[first:end], sizes=ix.size[first:end], checksums=ix.checksum[first:end],
                image_formats=ix.image_format[first:end], widths=ix.width[first:end],
                heights=ix.height[first:end], channels=ix.channels[first:end], decode=decode,
                max_pixels=limit))
        tasks += _field_shard_tasks(index, root, decode=decode, max_pixels=limit)
        total_bytes = sum(task.size for task in tasks)
        results = _run_tasks(tasks, workers=workers, progress=progress,
                             total_samples=sum(task.sample_count for task in tasks), total_bytes=total_bytes)
        problems: list[Problem] = []
        report = VerifyReport(path=str(root), ok=True, samples=len(index), shards=len(manifest.shards),
                              decoded=decode)
        report.fields = {spec.name: _field_entry(spec) for spec in manifest.fields}
        order = {spec.name: position + 1 for position, spec in enumerate(manifest.fields)}
        for result in sorted(results, key=lambda r: (r.shard, order.get(r.field, 0))):
            report.bytes_read += result.bytes_read
            if result.field:
                entry = report.fields[result.field]
                entry["bytes_read"] += result.bytes_read
                entry["samples_checked"] += result.samples_checked
                entry["shards_checked"] += int(result.scanned)
                entry["problems"] += len(result.problems)
            else:
                report.samples_checked += result.samples_checked
                report.shards_checked += int(result.scanned)
            for problem in result.problems:
                if problem.sample is not None and problem.key is None:
                    problem = dataclasses.replace(problem, key=index.key(problem.sample))
                problems.append(problem)
        for spec in manifest.fields:
            if spec.kind == "image":
                continue
            found, unlisted = _check_field_values(index, spec)
            report.fields[spec.name]["samples_checked"] = len(index)
            # damaged values, the unlisted ones included (not the summary line that counts them)
            report.fields[spec.name]["problems"] = len(found) - (1 if unlisted else 0) + unlisted
            report.unlisted += unlisted
            problems += found
        if hashes and _built_with_hashes(manifest):
            damaged = {p.sample for p in problems if p.sample is not None}
            for problem in problems:
                if problem.sample_range is not None:
                    damaged.update(range(*problem.sample_range))
            report.hashes, found = _check_hashes(root, index, damaged, workers=workers, progress=progress)
            problems += found
        report.problems = problems
        report.ok = not problems
        report.seconds = time.monotonic() - started
        return report
    finally:
        index.close()


def _unopenable(path: Any, exc: PackerError, started: float, decode: bool) -> VerifyReport:
    """The report of a dataset (or view) that does not open: one structure problem, the error's."""
    problem = Problem(kind="structure", message=str(exc), sample=exc.sample, path=exc.path)
    return VerifyReport(path=str(path), ok=False, seconds=time.monotonic() - started, decoded=decode,
                        problems=[problem])


def _verify_view(path: Path, *, decode: bool, progress: bool, max_pixels: int | None,
                 started: float) -> VerifyReport:
    """A view file: the view itself (SPEC §17), its base's manifest and index (opening checks both),
    then each selected sample's payload against its checksum (and with ``decode`` its pixels against
    the index), shard by shard; samples the view leaves out are not read. Problems name the view's
    sample numbers (``sample_info`` gives the base's)."""
    from .dataset import open_dataset
    from ._internal.progress import BuildProgress

    try:
        ds = open_dataset(path)
    except PackerError as exc:
        return _unopenable(path, exc, started, decode)
    try:
        limit = 0
        if decode:
            from .codecs import codec_for, dataset_max_pixels
            from .decode import decode_image

            try:
                codec_for(ds, path=path).check_decodable()
                limit = dataset_max_pixels(ds.manifest, max_pixels)
            except PackerError as exc:
                return VerifyReport(path=str(path), ok=False, seconds=time.monotonic() - started, decoded=decode,
                                    problems=[Problem(kind="structure", message=exc.message, path=exc.path)])
        ix = ds.index
        report = VerifyReport(path=str(path), ok=True, samples=len(ds), shards=len(ds.manifest.shards), decoded=decode)
        problems: list[Problem] = []
        bar = BuildProgress(len(ds), int(np.asarray(ix.size).sum()), enabled=progress, desc="verifying")
        try:
            for number, entry in enumerate(ds.manifest.shards):
                first, end = ds.shard_range(number)
                if first == end:
                    continue
                try:
                    backend = ds.shard(number)
                except PackerError as exc:
                    problems.append(Problem(kind="missing", shard=number, path=entry.path, sample_range=(first, end),
                                            message=f"cannot open the shard file ({exc.message}): its "
                                                    f"{end - first} selected samples cannot be read"))
                    continue
                report.shards_checked += 1
                for i in range(first, end):
                    offset, size, recorded = int(ix.offset[i]), int(ix.size[i]), int(ix.checksum[i])
                    if offset + size > entry.size or offset + size > backend.size:
                        problems.append(Problem(kind="truncated", shard=number, path=entry.path, sample=i,
                                                message=f"the payload lies past the end of the shard file"))
                        continue
                    data = backend.view(offset, size)
                    digest = fmt.checksum(data)
                    report.bytes_read += size
                    report.samples_checked += 1
                    if digest != recorded:
                        problems.append(Problem(
                            kind="checksum", shard=number, path=entry.path, sample=i,
                            message=f"payload checksum mismatch: the index says {fmt.checksum_hex(recorded)}, the "
                                    f"{size} bytes at offset {offset} hash to {fmt.checksum_hex(digest)}"))
                    elif decode and int(ix.image_format[i]) not in fmt.ImageFormat.PIXEL_FORMATS:
                        try:
                            pixels = decode_image(data, int(ix.image_format[i]), max_pixels=limit)
                        except DecodeError as exc:
                            problems.append(Problem(kind="decode", shard=number, path=entry.path, sample=i,
                                                    message=exc.message))
                        else:
                            width, height = int(ix.width[i]), int(ix.height[i])
                            if width and height and pixels.shape[:2] != (height, width):
                                problems.append(Problem(
                                    kind="decode", shard=number, path=entry.path, sample=i,
                                    message=f"decodes to {pixels.shape[0]}x{pixels.shape[1]} (HxW) pixels but "
                                            f"the index says {height}x{width}"))
                    del data
                    bar.update(1, size)
        finally:
            bar.__exit__(None, None, None)
        for k, problem in enumerate(problems):
            if problem.sample is not None:
                problems[k] = dataclasses.replace(problem, key=ds.key(problem.sample))
        report.problems = problems
        report.ok = not problems
        report.seconds = time.monotonic() - started
        return report
    finally:
        ds.close()


def _built_with_hashes(manifest: fmt.Manifest) -> bool:
    """Whether the build (or an append) recorded ``--hash perceptual``: its hashes file is then part
    of what the build promised, and checked."""
    settings = fmt.recorded_build_settings(manifest.build)
    return isinstance(settings, dict) and settings.get("hash") == "perceptual"


def _check_hashes(root: Path, index: Any, damaged: set[int], *, workers: int | None,
                  progress: bool) -> tuple[dict[str, Any], list[Problem]]:
    """The hashes file of a ``--hash perceptual`` build against the dataset: present, valid, for
    this index (formats/SPEC.md §16, H1-H9), and every stored hash the hash of its sample's image
    as computed now (within ``HASH_TOLERANCE`` bits; samples already reported damaged are skipped)."""
    from .dataset import open_dataset
    from .duplicates.phash import STATUS_NAMES, hamming, hash_dataset
    from .duplicates.sidecar import file_size, parse_hashes
    from ._internal.files import read_capped

    entry: dict[str, Any] = {"samples_checked": 0, "problems": 0}
    name = fmt.HASHES_NAME
    try:
        if not (root / name).exists() and not (root / name).is_symlink():
            raise FileNotFoundError(name)
        data = read_capped(root, name, file_size(len(index)))
        if data is None:
            raise TruncatedFileError(f"{name} is larger than a hashes file of {len(index)} samples", path=root / name)
        stored = parse_hashes(data, path=name, index_checksum=index.manifest.index.checksum,
                              sample_count=len(index))
    except FileNotFoundError:
        entry["problems"] = 1
        return entry, [Problem(kind="hashes", path=name, message=f"the build recorded --hash perceptual, but "
                               f"{name} is missing (`packer inspect --duplicates` writes it again)")]
    except PackerError as exc:
        entry["problems"] = 1
        return entry, [Problem(kind="hashes", path=name, message=f"{name} is unusable: {exc.message}")]
    with open_dataset(root) as dataset:
        fresh = hash_dataset(dataset, workers=workers or available_cpus(), progress=progress)
    checked = np.ones(len(index), dtype=bool)
    checked[sorted(damaged)] = False
    wrong = checked & ((stored.status != fresh.status) | (hamming(stored.hashes, fresh.hashes) > HASH_TOLERANCE))
    problems = []
    for sample in np.flatnonzero(wrong)[:MAX_VALUE_PROBLEMS].tolist():
        if stored.status[sample] != fresh.status[sample]:
            what = (f"is stored as {STATUS_NAMES.get(int(stored.status[sample]))}, recomputed as "
                    f"{STATUS_NAMES.get(int(fresh.status[sample]))}")
        else:
            what = (f"differs from its image's recomputed hash in "
                    f"{int(hamming(stored.hashes[sample], fresh.hashes[sample]))} of 128 bits")
        problems.append(Problem(kind="hashes", sample=sample, key=index.key(sample), path=name,
                                message=f"the stored perceptual hash {what}"))
    entry.update(samples_checked=int(checked.sum()), problems=int(wrong.sum()))
    return entry, problems


def _field_shard_tasks(index: Any, root: Path, *, decode: bool, max_pixels: int) -> list[_ShardTask]:
    """One scan task per image field shard: the same checks as a main shard, against the field's
    own columns (SPEC §14.3: laid out exactly as §3, parallel to main shard ``number``)."""
    tasks = []
    columns = index.index.field_columns
    for spec in index.manifest.fields:
        if spec.kind != "image":
            continue
        part = {name: columns[spec.image_column(name)] for name in ("offset", "size", "checksum", "format",
                                                                   "width", "height", "channels")}
        for number, entry in enumerate(spec.shards):
            first, end = index.shard_range(number)
            tasks.append(_ShardTask(
                root=str(root), shard=number, path=entry.path, size=entry.size, checksum=entry.checksum,
                sample_count=entry.sample_count, expected_number=fmt.shard_number_of(entry.path),
                alignment=index.manifest.alignment, first_sample=first,
                offsets=part["offset"][first:end], sizes=part["size"][first:end],
                checksums=part["checksum"][first:end], image_formats=part["format"][first:end],
                widths=part["width"][first:end], heights=part["height"][first:end],
                channels=part["channels"][first:end], decode=decode, max_pixels=max_pixels, field=spec.name))
    return tasks


def _field_entry(spec: fmt.FieldSpec) -> dict[str, Any]:
    """A field's line of ``VerifyReport.fields``, before anything was checked."""
    entry: dict[str, Any] = {"kind": spec.kind, "samples_checked": 0, "problems": 0}
    if spec.kind == "image":
        entry.update(shards=len(spec.shards), shards_checked=0, bytes_read=0)
    return entry


# --- field values in the index ------------------------------------------------------------------

def _check_field_values(index: Any, spec: fmt.FieldSpec) -> tuple[list[Problem], int]:
    """What ``open_index`` left unchecked about one value field: ``(problems listed, unlisted)``.

    ``open_index`` checked the columns' presence, dtypes and lengths (R46), the offsets (R47) and
    the class ids' range (R49), so every value can be viewed. Here: text is UTF-8 (§14.2: readers
    that decode refuse it otherwise), class sets are sorted ascending without repeats and bool
    bytes are 0 or 1 (§14.1-14.2: what a writer MUST store).
    """
    columns = index.index.field_columns
    values = columns[spec.column]
    offsets = columns[spec.offsets_column] if spec.variable else None
    listed = _ProblemList(index, spec)
    if spec.kind == "text":
        for sample, reason in _bad_text(values, offsets):
            listed.add(sample, f"text is not UTF-8 ({reason}-byte value): it cannot be decoded")
    elif spec.kind == "classes":
        for sample in _unsorted_sets(values, offsets):
            start, stop = int(offsets[sample]), int(offsets[sample + 1])
            ids = values[start:stop].view("<i8")[:16].tolist()
            listed.add(sample, f"class ids {ids}{' ...' if stop - start > 128 else ''} are not sorted ascending "
                               f"without repeats, as a writer must store them")
    elif spec.kind == "array" and spec.dtype == "bool":
        for sample in _bad_bools(values, offsets, spec.record_bytes):
            listed.add(sample, "a bool value is stored as a byte other than 0 or 1")
    return listed.problems, listed.unlisted


class _ProblemList:
    """The ``field`` problems of one field, capped at ``MAX_VALUE_PROBLEMS`` plus one summary."""

    def __init__(self, index: Any, spec: fmt.FieldSpec) -> None:
        self.index, self.spec = index, spec
        self.problems: list[Problem] = []
        self.unlisted = 0
        self.where = index.manifest.index.path

    def add(self, sample: int, message: str) -> None:
        if len(self.problems) < MAX_VALUE_PROBLEMS:
            self.problems.append(Problem(kind="field", message=f"field {self.spec.name!r}: {message}",
                                         sample=sample, shard=self.index.shard_of(sample),
                                         key=self.index.key(sample), path=self.where, field=self.spec.name))
            return
        if self.unlisted == 0:
            self.problems.append(Problem(kind="field", path=self.where, field=self.spec.name, message=""))
        self.unlisted += 1
        self.problems[-1] = dataclasses.replace(
            self.problems[-1], message=f"field {self.spec.name!r}: {self.unlisted} more sample(s) with the same "
                                       f"kind of damage, not listed (the first {MAX_VALUE_PROBLEMS} are)")


def _sample_groups(offsets: np.ndarray, max_bytes: int = 0) -> Any:
    """``(first, end)`` groups of consecutive samples whose values span at most ``max_bytes``
    (``VALUE_CHUNK_BYTES``) of their blob, or a single larger sample."""
    limit = max_bytes or VALUE_CHUNK_BYTES
    count = len(offsets) - 1
    first = 0
    while first < count:
        end = int(np.searchsorted(offsets, int(offsets[first]) + limit, side="right")) - 1
        end = min(max(end, first + 1), count)
        yield first, end
        first = end


def _bad_text(blob: np.ndarray, offsets: np.ndarray) -> Any:
    """``(sample, reason)`` for each text value that is not UTF-8.

    Fast path per group of samples: the group's bytes decode as a whole and no sample after
    its first starts with a continuation byte (``10xxxxxx``), which together mean that every
    sample's slice is valid on its own (each slice starts on a character and the next slice's
    start, not a continuation, ends it). Groups that fail are decoded sample by sample.
    """
    for first, end in _sample_groups(offsets):
        low, high = int(offsets[first]), int(offsets[end])
        starts = offsets[first + 1:end]
        starts = starts[starts < high]
        clean = not np.any((blob[starts.astype(np.int64)] & 0xC0) == 0x80) if len(starts) else True
        if clean:
            try:
                blob[low:high].tobytes().decode("utf-8")
                continue
            except UnicodeDecodeError:
                pass
        for sample in range(first, end):
            try:
                blob[int(offsets[sample]):int(offsets[sample + 1])].tobytes().decode("utf-8")
            except UnicodeDecodeError as exc:
                yield sample, f"{exc.reason} at byte {exc.start} of its {len(exc.object)}"


def _unsorted_sets(blob: np.ndarray, offsets: np.ndarray) -> Any:
    """Samples whose class ids (``<i8``) are not strictly increasing."""
    ids_offsets = offsets // np.uint64(8)
    for first, end in _sample_groups(offsets):
        low, high = int(ids_offsets[first]), int(ids_offsets[end])
        ids = blob[low * 8:high * 8].view("<i8")
        if len(ids) < 2:
            continue
        # a pair (k, k+1) inside one sample must increase; pairs across a sample start do not count
        starts = ids_offsets[first + 1:end].astype(np.int64) - low
        crossing = np.zeros(len(ids), dtype=bool)
        crossing[starts[starts < len(ids)]] = True
        bad = np.flatnonzero((ids[1:] <= ids[:-1]) & ~crossing[1:]) + 1
        if len(bad):
            owners = np.searchsorted(ids_offsets[first:end + 1].astype(np.int64) - low, bad, side="right") - 1
            yield from (first + int(o) for o in np.unique(owners))


def _bad_bools(blob: np.ndarray, offsets: np.ndarray | None, record_bytes: int) -> Any:
    """Samples holding a ``bool`` byte other than 0 or 1 (fixed: a record each; variable: offsets)."""
    if offsets is None:
        rows = len(blob) // max(record_bytes, 1)
        step = max(1, VALUE_CHUNK_BYTES // max(record_bytes, 1))
        for first in range(0, rows, step):
            end = min(rows, first + step)
            bad = np.flatnonzero(blob[first * record_bytes:end * record_bytes] > 1)
            yield from (first + int(s) for s in np.unique(bad // record_bytes))
        return
    for first, end in _sample_groups(offsets):
        low, high = int(offsets[first]), int(offsets[end])
        bad = np.flatnonzero(blob[low:high] > 1)
        if len(bad):
            owners = np.searchsorted(offsets[first:end + 1].astype(np.int64) - low, bad, side="right") - 1
            yield from (first + int(o) for o in np.unique(owners))


#: With ``workers=None``, one process per this many shard bytes at most: below it, forking a
#: pool costs more than it saves (a few hundred MB verify in well under a second).
BYTES_PER_WORKER = 256 << 20


def _default_workers(shards: int, total_bytes: int) -> int:
    return max(1, min(available_cpus(), shards, total_bytes // BYTES_PER_WORKER))


def _run_tasks(tasks: list[_ShardTask], *, workers: int | None, progress: bool, total_samples: int,
               total_bytes: int) -> list[_ShardResult]:
    from ._internal.progress import BuildProgress

    workers = _default_workers(len(tasks), total_bytes) if workers is None else max(1, min(workers, len(tasks)))
    results: list[_ShardResult] = []
    if workers <= 1 or len(tasks) <= 1:
        # One buffer for every shard: a fresh 16 MiB one would be page-faulted (and zeroed by the
        # kernel) again for each shard, a quarter more memory traffic for a 64 MiB shard.
        buffer = bytearray(min(CHUNK_SIZE, max((t.size for t in tasks), default=1)))
        with BuildProgress(total_samples, total_bytes, enabled=progress, desc="verifying") as bar:
            for task in tasks:
                results.append(_scan_shard(task, on_progress=bar.update, buffer=buffer))
        return results
    import multiprocessing

    # fork, like the build engine: no re-import of the caller's __main__ (``python -m packer`` and
    # unguarded scripts stay safe). Every task is submitted, which forks all the workers, before
    # the progress bar starts its monitor thread, so no thread is cloned holding a lock.
    context = multiprocessing.get_context("fork" if os.name == "posix" else "spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures = {pool.submit(_scan_shard, task): task for task in tasks}
        with BuildProgress(total_samples, total_bytes, enabled=progress, desc="verifying") as bar:
            for future in as_completed(futures):
                try:
                    result = future.result()
                except BrokenProcessPool as exc:  # a worker was killed (out of memory, a decoder crash)
                    task = futures[future]
                    result = _ShardResult(shard=task.shard, field=task.field, problems=[Problem(
                        kind="io", shard=task.shard, path=task.path, field=task.field or None,
                        message=f"the process checking this shard died ({exc}); run verify with --workers 1 "
                                f"to see where")])
                bar.update(result.samples_checked, result.bytes_read)
                results.append(result)
    return results


def _scan_shard(task: _ShardTask, on_progress: Callable[[int, int], None] | None = None,
                buffer: bytearray | None = None) -> _ShardResult:
    """Open one shard file and check it; every failure becomes a ``Problem``.

    ``buffer`` (reused across shards by the caller) receives the chunks; one is allocated when
    it is None.
    """
    result = _ShardResult(shard=task.shard, problems=[], field=task.field)
    try:
        _scan_shard_file(task, result, on_progress, buffer)
    finally:
        if task.field:  # every problem found in an image field's shard names the field
            result.problems = [dataclasses.replace(p, field=task.field) for p in result.problems]
    return result


def _scan_shard_file(task: _ShardTask, result: _ShardResult, on_progress: Callable[[int, int], None] | None,
                     buffer: bytearray | None) -> None:
    everything = (task.first_sample, task.first_sample + task.sample_count)
    try:
        fd, _ = open_inside(task.root, task.path)
    except (UnsafePathError, DatasetChangedError, NotAPackerFileError, TruncatedFileError) as exc:
        why = {UnsafePathError: "resolves outside the dataset folder; not read",
               DatasetChangedError: "shard file is missing",
               NotAPackerFileError: "is not a regular file"}.get(type(exc), f"cannot open the shard file ({exc.message})")
        result.problems.append(Problem(
            kind="missing", message=f"{why}: its {task.sample_count} samples cannot be read",
            shard=task.shard, path=task.path, sample_range=everything))
        return
    try:
        _scan_open_shard(fd, task, result, on_progress, buffer)
    except OSError as exc:
        result.problems.append(Problem(kind="io", message=f"reading the shard failed: {exc.strerror or exc}",
                                       shard=task.shard, path=task.path))
    finally:
        os.close(fd)


def _check_header(head: bytes, task: _ShardTask, problems: list[Problem]) -> None:
    """Validate the 64-byte header against the spec (R1-R4) and the manifest (R38)."""

    def add(message: str) -> None:
        problems.append(Problem(kind="header", message=message, shard=task.shard, path=task.path))

    try:
        header = fmt.ShardHeader.parse(head, path=task.path)
    except FormatError as exc:
        add(exc.message)
        return
    if header.alignment != task.alignment:
        add(f"header alignment {header.alignment} disagrees with the manifest's {task.alignment}")
    if header.sample_count != task.sample_count:
        add(f"header sample_count {header.sample_count} disagrees with the manifest's {task.sample_count}")
    if header.file_size != task.size:
        add(f"header file_size {header.file_size} disagrees with the manifest's size {task.size}")
    if header.shard_number != task.expected_number:
        add(f"header shard_number {header.shard_number} disagrees with the file name's {task.expected_number}")
    reserved = fmt.SHARD_HEADER_RESERVED
    if any(head[reserved]):
        add(f"reserved header bytes {reserved.start}..{reserved.stop - 1} are not zero")


class _ShardScan:
    """The per-sample bookkeeping of one shard's sequential pass.

    Samples whose payload and padding lie inside one chunk (nearly all of them, with 16 MiB
    chunks) take ``scan_chunk``'s inline fast path; a sample cut by a chunk boundary goes through
    ``_partial``, which carries a streaming hash (and, when decoding, the bytes) to the next chunk.
    """

    def __init__(self, task: _ShardTask, problems: list[Problem]) -> None:
        self.task = task
        self.problems = problems
        offsets = task.offsets.astype(np.int64)
        ends = offsets + task.sizes.astype(np.int64)
        nexts = np.empty(len(offsets), dtype=np.int64)
        nexts[:-1] = offsets[1:]
        nexts[-1] = task.size  # the index was validated at open: the last sample ends, aligned, here [R14]
        self.offsets, self.ends, self.nexts = offsets.tolist(), ends.tolist(), nexts.tolist()
        self.checksums = task.checksums.tolist()
        self.count = len(self.offsets)
        self.data_offset = fmt.shard_data_offset(task.alignment)
        self.zeros = bytes(min(max(task.alignment, self.data_offset), CHUNK_SIZE))
        self.decoder = _Decoder(task) if task.decode else None
        self.next_sample = 0       # first sample not yet finished
        self.state: Any = None     # streaming hash of a payload cut by a chunk boundary
        self.pieces: list[bytes] = []
        self.padding_reported: set[int] = set()

    def scan_chunk(self, chunk: memoryview, position: int) -> int:
        """Check everything that ends or starts in ``chunk`` (the bytes at ``position``); returns
        how many samples' payloads were completed."""
        end = position + len(chunk)
        if position < self.data_offset and self.data_offset > fmt.SHARD_HEADER_SIZE:
            low, high = max(position, fmt.SHARD_HEADER_SIZE), min(end, self.data_offset)
            if low < high and chunk[low - position:high - position].tobytes() != self.zeros[:high - low]:
                self.problems.append(Problem(
                    kind="header", shard=self.task.shard, path=self.task.path,
                    message=f"nonzero bytes in the header padding ({fmt.SHARD_HEADER_SIZE}..{self.data_offset - 1})"))
        offsets, ends, nexts, checksums = self.offsets, self.ends, self.nexts, self.checksums
        zeros, decoder, digest_of = self.zeros, self.decoder, xxhash.xxh3_64_intdigest
        j, count, done = self.next_sample, self.count, 0
        while j < count:
            start = offsets[j]
            if start >= end:
                break
            stop = nexts[j]
            if start >= position and stop <= end:  # the fast path: all of it is in this chunk
                a, e, b = start - position, ends[j] - position, stop - position
                payload = chunk[a:e]
                digest = digest_of(payload)
                done += 1
                if digest != checksums[j]:
                    self._mismatch(j, digest)
                elif decoder is not None:
                    decoder.check(j, payload, self.problems)
                if b > e and chunk[e:b].tobytes() != zeros[:b - e]:
                    self._bad_padding(j)
                j += 1
                continue
            done += self._partial(j, chunk, position, end)
            if stop > end:
                break
            j += 1
        self.next_sample = j
        return done

    def _partial(self, j: int, chunk: memoryview, position: int, end: int) -> int:
        """The part of sample ``j`` (payload, then padding) inside a chunk that cuts it."""
        start, stop, payload_end = self.offsets[j], self.nexts[j], self.ends[j]
        finished = 0
        low, high = max(start, position), min(payload_end, end)
        if low < high:
            piece = chunk[low - position:high - position]
            if low == start:
                self.state, self.pieces = xxhash.xxh3_64(), []
            self.state.update(piece)
            if self.decoder is not None:
                self.pieces.append(bytes(piece))
            if payload_end <= end:
                digest = self.state.intdigest()
                finished = 1
                if digest != self.checksums[j]:
                    self._mismatch(j, digest)
                elif self.decoder is not None:
                    self.decoder.check(j, b"".join(self.pieces), self.problems)
                self.state, self.pieces = None, []
        low, high = max(payload_end, position), min(stop, end)
        if low < high and chunk[low - position:high - position].tobytes() != self.zeros[:high - low]:
            self._bad_padding(j)
        return finished

    def _mismatch(self, j: int, digest: int) -> None:
        start, size = self.offsets[j], self.ends[j] - self.offsets[j]
        self.problems.append(Problem(
            kind="checksum", shard=self.task.shard, path=self.task.path, sample=self.task.first_sample + j,
            message=f"payload checksum mismatch: the index says {fmt.checksum_hex(self.checksums[j])}, the "
                    f"{size} bytes at offset {start} hash to {fmt.checksum_hex(digest)}"))

    def _bad_padding(self, j: int) -> None:
        if j in self.padding_reported:  # a damaged run of padding cut by a chunk boundary
            return
        self.padding_reported.add(j)
        self.problems.append(Problem(
            kind="padding", shard=self.task.shard, path=self.task.path, sample=self.task.first_sample + j,
            message=f"nonzero bytes in the padding after the payload (bytes {self.ends[j]}..{self.nexts[j] - 1}, "
                    f"which must be zero)"))

    def lost_samples(self, limit: int) -> tuple[int, int] | None:
        """Local [first, end) of the samples whose payload did not fit in the first ``limit`` bytes."""
        first = self.next_sample
        if first < self.count and self.ends[first] <= limit:
            first += 1  # its payload was checked; only its padding is cut off
        return (first, self.count) if first < self.count else None


def _scan_open_shard(fd: int, task: _ShardTask, result: _ShardResult,
                     on_progress: Callable[[int, int], None] | None, buffer: bytearray | None) -> None:
    problems = result.problems
    actual = os.fstat(fd).st_size
    if actual != task.size:
        problems.append(Problem(
            kind="size", message=f"shard file is {actual} bytes on disk but the manifest says {task.size} "
                                 f"({'truncated' if actual < task.size else 'extended'})",
            shard=task.shard, path=task.path))
    limit = min(actual, task.size)
    head = os.pread(fd, fmt.SHARD_HEADER_SIZE, 0)
    _check_header(head, task, problems)
    result.scanned = True

    scan = _ShardScan(task, problems)
    file_hash = xxhash.xxh3_64()
    if buffer is None or len(buffer) > CHUNK_SIZE:
        buffer = bytearray(min(CHUNK_SIZE, max(limit, 1)))
    view = memoryview(buffer)
    advise = hasattr(os, "posix_fadvise")
    if advise:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
    position = 0
    read_error: OSError | None = None
    while position < limit:
        try:
            got = os.preadv(fd, [view[:min(len(buffer), limit - position)]], position)
        except OSError as exc:  # EIO from a bad sector: the rest of this shard cannot be checked
            read_error, limit = exc, position
            break
        if got <= 0:  # the file shrank while we read it
            limit = position
            break
        if advise and position + got < limit:  # the kernel reads the next chunk while we hash this one
            os.posix_fadvise(fd, position + got, min(CHUNK_SIZE, limit - position - got), os.POSIX_FADV_WILLNEED)
        chunk = view[:got]
        file_hash.update(chunk)
        done = scan.scan_chunk(chunk, position)
        del chunk
        result.bytes_read += got
        result.samples_checked += done
        if on_progress is not None:
            on_progress(done, got)
        position += got

    lost = scan.lost_samples(limit)
    if read_error is not None:
        problems.append(Problem(
            kind="io", shard=task.shard, path=task.path,
            sample_range=None if lost is None else (task.first_sample + lost[0], task.first_sample + lost[1]),
            message=f"reading the shard failed at byte {limit}: {read_error.strerror or read_error}; the "
                    f"samples from there on were not checked"))
    elif lost is not None:
        first, end = task.first_sample + lost[0], task.first_sample + lost[1]
        problems.append(Problem(
            kind="truncated", shard=task.shard, path=task.path, sample_range=(first, end),
            message=f"{end - first} sample(s) lie past the end of the file ({limit} bytes) and are lost"))
    elif limit == task.size:
        digest = file_hash.intdigest()
        if digest != task.checksum:
            problems.append(Problem(
                kind="shard-checksum", shard=task.shard, path=task.path,
                message=f"shard checksum mismatch: the manifest says {fmt.checksum_hex(task.checksum)}, the "
                        f"file hashes to {fmt.checksum_hex(digest)}"))


class _Decoder:
    """Decodes intact payloads of one shard and checks the pixels' shape against the index."""

    def __init__(self, task: _ShardTask) -> None:
        from .decode import decode_as_stored, decode_image

        # An image field's payloads are decoded as readers return them: values kept (SPEC §14.3).
        self._decode_image = decode_as_stored if task.field else decode_image
        self.task = task
        self.formats = task.image_formats.tolist()
        self.widths = task.widths.tolist()
        self.heights = task.heights.tolist()
        self.channels = task.channels.tolist()
        self.sizes = task.sizes.tolist()

    def check(self, local: int, data: Any, problems: list[Problem]) -> None:
        task = self.task
        sample = task.first_sample + local

        def add(message: str) -> None:
            problems.append(Problem(kind="decode", message=message, sample=sample, shard=task.shard,
                                    path=task.path))

        width, height, channels = self.widths[local], self.heights[local], self.channels[local]
        if self.formats[local] in fmt.ImageFormat.PIXEL_FORMATS:
            # Stored pixels (codec raw) carry no shape of their own: their size must match the index's.
            if width and height and channels and self.sizes[local] != width * height * channels:
                add(f"raw payload is {self.sizes[local]} bytes, not {height}x{width}x{channels}")
            return
        try:
            pixels = self._decode_image(data, self.formats[local], max_pixels=self.task.max_pixels)
        except DecodeError as exc:
            add(exc.message)
            return
        got_height, got_width = pixels.shape[:2]
        if width and height and (got_width, got_height) != (width, height):
            add(f"decodes to {got_height}x{got_width} (HxW) pixels but the index says {height}x{width}")
