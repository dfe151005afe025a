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

Damage is reported, never raised: a missing, truncated or extended shard file, a bad header,
a damaged sample or an undecodable image each becomes a ``Problem`` naming the shard, the
sample number and its key, and ``verify`` goes on to check everything else. Structural errors
found while opening the manifest and index (``open_index``) make one problem of kind
``"structure"``: without a trusted index nothing else can be checked.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import xxhash

from . import format as fmt
from .errors import (DatasetChangedError, DecodeError, FormatError, NotAPackerFileError, PackerError,
                     TruncatedFileError, UnsafePathError)
from .files import open_inside
from .machine import available_cpus

__all__ = ["Problem", "VerifyReport", "verify", "PROBLEM_KINDS", "CHUNK_SIZE", "BYTES_PER_WORKER"]

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
}

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
    """

    kind: str
    message: str
    sample: int | None = None
    shard: int | None = None
    key: str | None = None
    path: str | None = None
    sample_range: tuple[int, int] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message, "sample": self.sample, "shard": self.shard,
                "key": self.key, "path": self.path,
                "sample_range": list(self.sample_range) if self.sample_range else None}

    def __str__(self) -> str:
        where = []
        if self.shard is not None:
            where.append(f"shard {self.shard}")
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
        problems: everything found wrong, ordered by shard and sample.
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
        return len(found) + ranged  # ranges (missing shards, lost tails) never overlap single samples

    @property
    def megabytes_per_second(self) -> float:
        return self.bytes_read / max(self.seconds, 1e-9) / 1e6

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "path": self.path, "samples": self.samples, "shards": self.shards,
                "samples_checked": self.samples_checked, "shards_checked": self.shards_checked,
                "bytes_read": self.bytes_read, "seconds": round(self.seconds, 6), "decoded": self.decoded,
                "damaged_sample_count": self.damaged_sample_count,
                "problems": [p.to_json() for p in self.problems]}


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


@dataclass
class _ShardResult:
    shard: int
    problems: list[Problem]
    bytes_read: int = 0
    samples_checked: int = 0
    scanned: bool = False


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
    """
    from .dataset import open_index  # lazy: keep `import packer.verify` light

    started = time.monotonic()
    root = Path(path)
    try:
        index = open_index(root)
    except PackerError as exc:
        problem = Problem(kind="structure", message=str(exc), sample=exc.sample, path=exc.path)
        return VerifyReport(path=str(root), ok=False, seconds=time.monotonic() - started, decoded=decode,
                            problems=[problem])
    limit = 0
    if decode:
        from . import decode as _decode  # noqa: F401  (fail early if the decoders are missing)
        from .codecs import check_decodable, dataset_max_pixels

        try:
            check_decodable(index.manifest.codec, path=root)  # SPEC 6: refuse an unknown codec
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
        total_bytes = sum(entry.size for entry in manifest.shards)
        results = _run_tasks(tasks, workers=workers, progress=progress, total_samples=len(index),
                             total_bytes=total_bytes)
        problems: list[Problem] = []
        report = VerifyReport(path=str(root), ok=True, samples=len(index), shards=len(manifest.shards),
                              decoded=decode)
        for result in sorted(results, key=lambda r: r.shard):
            report.bytes_read += result.bytes_read
            report.samples_checked += result.samples_checked
            report.shards_checked += int(result.scanned)
            for problem in result.problems:
                if problem.sample is not None and problem.key is None:
                    problem = Problem(kind=problem.kind, message=problem.message, sample=problem.sample,
                                      shard=problem.shard, key=index.key(problem.sample), path=problem.path,
                                      sample_range=problem.sample_range)
                problems.append(problem)
        report.problems = problems
        report.ok = not problems
        report.seconds = time.monotonic() - started
        return report
    finally:
        index.close()


#: With ``workers=None``, one process per this many shard bytes at most: below it, forking a
#: pool costs more than it saves (a few hundred MB verify in well under a second).
BYTES_PER_WORKER = 256 << 20


def _default_workers(shards: int, total_bytes: int) -> int:
    return max(1, min(available_cpus(), shards, total_bytes // BYTES_PER_WORKER))


def _run_tasks(tasks: list[_ShardTask], *, workers: int | None, progress: bool, total_samples: int,
               total_bytes: int) -> list[_ShardResult]:
    from .progress import BuildProgress

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
                    result = _ShardResult(shard=task.shard, problems=[Problem(
                        kind="io", shard=task.shard, path=task.path,
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
    result = _ShardResult(shard=task.shard, problems=[])
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
        return result
    try:
        _scan_open_shard(fd, task, result, on_progress, buffer)
    except OSError as exc:
        result.problems.append(Problem(kind="io", message=f"reading the shard failed: {exc.strerror or exc}",
                                       shard=task.shard, path=task.path))
    finally:
        os.close(fd)
    return result


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
        from .decode import decode_image

        self._decode_image = decode_image
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
        if self.formats[local] == fmt.ImageFormat.RAW:
            # Raw pixels carry no shape of their own: their size must match the index's.
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
