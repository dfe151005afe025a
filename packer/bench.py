"""Measures a packed dataset's loader as configured and says whether it can feed the model.

``run_bench(path, BenchOptions(...))`` builds the loader a training job would use (PyTorch's
``DataLoader`` over ``packer.torch``'s readers and samplers when torch is installed, else a
plain in-process loop), discards ``warmup`` batches (worker start-up, first touches of the
index and shards), then times ``batches`` batches. It reports samples/s, payload MB/s, and the
CPU each process used while timing: each DataLoader worker's (the children of this process,
read from ``/proc/<pid>/task/*/schedstat``, nanosecond on-CPU times; no psutil), and the main
process's.

With a ``target_rate`` (the samples/s the model consumes) the pipeline should deliver at least
``HEADROOM`` (1.5) times that: step times vary, workers share cores with the training process,
and a loader running at exactly the model's rate makes the GPU wait at every hiccup. When it
does not, ``advise`` says what to change. It first reads the measurement (``diagnose``), from
the workers that worked (an idle worker says nothing about the others):

* ``oversubscribed``: the run's processes want more CPU than there are cores, and the workers
  wait for a CPU much of the time: use at most N workers.
* ``contended``: the workers wait for a CPU although this run fits the cores: other processes
  use them.
* ``cpu-bound``: the workers compute all the time: more workers while cores are idle, then
  cheaper work, which depends on what is stored (``--codec tiled`` and nvJPEG for JPEGs, another
  codec for PNGs, crops on the GPU for raw pixels, nothing about decoding raw pixels).
* ``main-bound``: the main process collates or pins all the time.
* ``read-bound``: the workers neither compute nor wait for a CPU, and the bytes came from
  storage (``/proc/<pid>/io``'s ``read_bytes``): they wait for reads.
* ``handoff-bound``: nobody is busy although the bytes came from the page cache: batches wait in
  the hand-off between processes (queues, pickling), which small samples feel most.

Whatever the verdict, a dataset smaller than a batch is flagged (every "batch" was the whole
dataset), and the output size defaults to the stored size for raw datasets and images smaller
than 224 pixels (timing an upsampling is not timing the loader).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from .dataset import Dataset, open_dataset
from .errors import MissingDependencyError
from .machine import available_cpus
from .order import ORDERS, epoch_order, index_blocks

__all__ = [
    "BenchOptions",
    "BenchResult",
    "DECODE_MODES",
    "READERS",
    "LOADERS",
    "HEADROOM",
    "run_bench",
    "advise",
    "diagnose",
    "DIAGNOSES",
    "DEFAULT_SIZE",
    "default_size",
    "SMALL_IMAGE_SIDE",
    "raw_codec_note",
    "format_report",
    "process_cpu_seconds",
    "run_queue_seconds",
    "storage_read_bytes",
    "child_pids",
]

#: What each sample is turned into: ``none`` (stored bytes), ``full`` (``decode_image``: full
#: size, so the batch is a list), ``rrc`` (fused ``RandomResizedCrop`` + flip), ``center``
#: (fused resize + ``CenterCrop``, evaluation).
DECODE_MODES = ("none", "full", "rrc", "center")
#: ``map``: ``PackedDataset`` + ``PackedBatchSampler``; ``iterable``: ``PackedIterableDataset``.
READERS = ("map", "iterable")
#: ``auto``: torch's DataLoader when torch imports, else the in-process loop; ``torch``: require
#: torch; ``simple``: the in-process loop (no workers).
LOADERS = ("auto", "torch", "simple")
#: Encoded images whose median longer side is at most this are "small": decoding them costs
#: less than the per-sample Python around it, and ``--codec raw`` (decoded pixels, batched
#: crops) is the fast path.
SMALL_IMAGE_SIDE = 96
#: How much faster than the model's consumption the loader should be.
HEADROOM = 1.5
#: The ``rrc``/``center`` output size for images at least this large (else the stored size).
DEFAULT_SIZE = 224
#: What ``diagnose`` can say of a run (see the module docstring).
DIAGNOSES = ("oversubscribed", "contended", "cpu-bound", "main-bound", "read-bound", "handoff-bound")
# A process whose CPU time covers this share of the timed wall-clock is busy (CPU-bound).
_BUSY = 0.8
# A worker that ran or waited for a CPU less than this share of the time had (almost) nothing to
# do: it says nothing about how the others spent theirs.
_ACTIVE = 0.1
# Workers that wait for a CPU this share of their runnable time are short of cores.
_CPU_WAIT = 0.25
# Runnable demand (cores) above the cores by more than this is this run's own oversubscription;
# less, and the waiting comes from other processes.
_OVER = 0.5
# Storage reads below this share of the payload: the bytes came from the page cache.
_FROM_CACHE = 0.1
# A timed run shorter than this (seconds) is flagged: too short for steady numbers.
_MIN_SECONDS = 1.0


@dataclass(frozen=True)
class BenchOptions:
    """How to build the loader under test (the CLI's options, one to one).

    Attributes:
        batch_size: samples per batch.
        workers: DataLoader worker processes (``None``: the cores this process may use).
        order: ``sequential``, ``random`` or ``block`` (see ``packer.order``).
        decode: one of ``DECODE_MODES``.
        size: output size of the ``rrc`` and ``center`` transforms (``None``: ``default_size``,
            the stored size for raw datasets and small images, else ``DEFAULT_SIZE``).
        layout: ``HWC`` (channels-last, what ``normalize_on_gpu`` takes) or ``CHW``.
        backend: the dataset backend (``mmap``, ``pread``, ``direct``).
        reader: one of ``READERS``.
        loader: one of ``LOADERS``.
        batches: batches timed after the warm-up.
        warmup: batches read and discarded first.
        pin_memory: pin batches in the main process (as for GPU training).
        seed: seed of the read order.
        target_rate: samples/s the model consumes; ``None`` for no verdict.
    """

    batch_size: int = 256
    workers: int | None = None
    order: str = "random"
    decode: str = "rrc"
    size: int | None = None
    layout: str = "HWC"
    backend: str = "mmap"
    reader: str = "map"
    loader: str = "auto"
    batches: int = 50
    warmup: int = 5
    pin_memory: bool = False
    seed: int = 0
    target_rate: float | None = None

    def __post_init__(self) -> None:
        checks = [("order", self.order, ORDERS), ("decode", self.decode, DECODE_MODES),
                  ("reader", self.reader, READERS), ("loader", self.loader, LOADERS),
                  ("layout", self.layout, ("HWC", "CHW"))]
        for name, value, allowed in checks:
            if value not in allowed:
                raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")
        for name in ("batch_size", "batches", "size"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.warmup < 0 or (self.workers is not None and self.workers < 0):
            raise ValueError("warmup and workers must not be negative")
        if self.target_rate is not None and not self.target_rate > 0:
            raise ValueError(f"target_rate must be positive, got {self.target_rate}")


@dataclass
class BenchResult:
    """What one run measured; ``to_dict()`` is the ``--json`` document's body."""

    dataset: str
    num_samples: int
    loader: str
    options: dict[str, Any]
    workers: int
    cores: int
    samples: int
    batches: int
    payload_bytes: int
    seconds: float
    samples_per_s: float
    mb_per_s: float
    worker_cpu: list[float] | None
    main_cpu: float
    worker_wait: list[float] | None = None
    main_wait: float | None = None
    target_rate: float | None = None
    required_rate: float | None = None
    meets_target: bool | None = None
    advice: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    codec: str = ""  # the dataset's codec name (manifest)
    #: Samples by stored format name (``{"jpeg": 9000, "png": 12}``).
    formats: dict[str, int] = field(default_factory=dict)
    #: The median stored image ``[height, width]`` (None for an empty dataset).
    image_size: list[int] | None = None
    #: The ``rrc``/``center`` output ``[height, width]`` this run used (None for other decodes).
    size: list[int] | None = None
    #: ``diagnose``'s verdict (one of ``DIAGNOSES``).
    diagnosis: str | None = None
    #: Bytes the run's processes read from storage while timed (``/proc/<pid>/io``), or None.
    storage_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- /proc accounting ---------------------------------------------------------------------------

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _read_stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    return text[text.rfind(")") + 2:].split()


def process_cpu_seconds(pid: int) -> float | None:
    """CPU seconds process ``pid`` used so far (all its threads, user + system), or None.

    Sums the nanosecond on-CPU times of ``/proc/<pid>/task/*/schedstat``; falls back to
    utime + stime of ``/proc/<pid>/stat``, which count in clock ticks (10 ms: too coarse for a
    short run).
    """
    try:
        total = 0
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat", "rb") as f:
                total += int(f.read().split()[0])
        return total / 1e9
    except (OSError, IndexError, ValueError):
        pass
    fields = _read_stat(pid)
    if fields is None or len(fields) < 13:
        return None
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # fields 14 and 15 of stat(5)


def run_queue_seconds(pid: int) -> float | None:
    """Seconds process ``pid``'s main thread spent runnable but waiting for a CPU, or None.

    From ``/proc/<pid>/schedstat`` (on-CPU ns, run-queue wait ns, timeslices). A worker that
    waits here is CPU-bound on cores shared with other processes, not waiting on I/O.
    """
    try:
        with open(f"/proc/{pid}/schedstat", "rb") as f:
            fields = f.read().split()
        return int(fields[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def storage_read_bytes(pid: int) -> int | None:
    """Bytes process ``pid`` caused to be read from storage so far (``read_bytes`` of
    ``/proc/<pid>/io``: page-cache hits are not counted, mmap page faults are), or None."""
    try:
        with open(f"/proc/{pid}/io", "rb") as f:
            for line in f:
                if line.startswith(b"read_bytes:"):
                    return int(line.split()[1])
    except (OSError, IndexError, ValueError):
        pass
    return None


def child_pids(parent: int | None = None) -> list[int]:
    """Pids of the live child processes of ``parent`` (default: this process), from /proc."""
    parent = os.getpid() if parent is None else parent
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    children = []
    for entry in entries:
        if entry.isdigit():
            fields = _read_stat(int(entry))
            if fields is not None and len(fields) > 1 and fields[1] == str(parent):
                children.append(int(entry))
    return sorted(children)


# --- the loaders --------------------------------------------------------------------------------

def default_size(dataset: Dataset) -> tuple[int, int]:
    """The ``rrc``/``center`` output ``(height, width)`` when ``--size`` is not given.

    The stored size for a ``raw`` dataset and for images whose median shorter side is under
    ``DEFAULT_SIZE`` (a 32x32 dataset cropped to 224 would time an upsampling: 12x slower than
    the loader at the stored size, measured); ``DEFAULT_SIZE`` square otherwise.
    """
    from .codecs import raw_sample_shape

    if dataset.manifest.codec.get("name") == "raw":
        height, width, _ = raw_sample_shape(dataset.manifest.codec, path=dataset.path)
        return int(height), int(width)
    stored = _median_size(dataset)
    if stored is not None and min(stored) < DEFAULT_SIZE:
        return stored
    return DEFAULT_SIZE, DEFAULT_SIZE


def _median_size(dataset: Dataset) -> tuple[int, int] | None:
    ix = dataset.index
    known = (ix.height > 0) & (ix.width > 0)
    if not np.any(known):
        return None
    return int(np.median(ix.height[known])), int(np.median(ix.width[known]))


def _decoder(options: BenchOptions, size: tuple[int, int]) -> bool | Callable[..., Any]:
    if options.decode == "none":
        return False
    if options.decode == "full":
        return True
    from .transforms import CenterCrop, RandomResizedCrop
    if options.decode == "rrc":
        return RandomResizedCrop(size)
    shorter = min(size)
    return CenterCrop(size, resize=shorter if options.size is None else max(shorter, round(shorter * 256 / 224)))


class _Batches:
    """Iterates batches forever (epoch after epoch) and knows each batch's payload bytes."""

    def __init__(self) -> None:
        self.batch_bytes: list[int] = []

    def __iter__(self) -> Iterator[Any]:  # pragma: no cover - overridden
        raise NotImplementedError

    def close(self) -> None:
        pass


class _TorchBatches(_Batches):
    def __init__(self, dataset: Dataset, options: BenchOptions, workers: int, size: tuple[int, int]) -> None:
        super().__init__()
        import torch.utils.data as torch_data

        from .torch import PackedBatchSampler, PackedDataset, PackedIterableDataset, collate

        decode = _decoder(options, size)
        sizes = dataset.index.size
        self._epoch_setter: Callable[[int], None]
        common: dict[str, Any] = {"num_workers": workers, "pin_memory": options.pin_memory,
                                  "persistent_workers": workers > 0}
        if workers > 0:
            common["prefetch_factor"] = 2
        if options.reader == "map":
            data = PackedDataset(dataset, decode=decode, layout=options.layout)
            sampler = PackedBatchSampler(data, batch_size=options.batch_size, order=options.order,
                                         seed=options.seed, rank=0, world_size=1)
            recorder = _RecordingSampler(sampler, sizes, self.batch_bytes)
            self.loader = torch_data.DataLoader(data, batch_sampler=recorder, collate_fn=collate,
                                                **common)
            self._epoch_setter = sampler.set_epoch
        else:
            data = PackedIterableDataset(dataset, batch_size=options.batch_size, order=options.order,
                                         seed=options.seed, rank=0, world_size=1, decode=decode,
                                         layout=options.layout)
            self.loader = torch_data.DataLoader(data, batch_size=None, **common)
            self._iterable = data
            self._epoch_setter = data.set_epoch
        self._sizes = sizes
        self._reader = options.reader

    def __iter__(self) -> Iterator[Any]:
        epoch = 0
        while True:
            self._epoch_setter(epoch)
            if self._reader == "iterable":
                plan = self._iterable.plan()
                self.batch_bytes.extend(int(self._sizes[plan.batch(k)].sum())
                                        for k in range(plan.num_batches))
            yield from self.loader
            epoch += 1

    def close(self) -> None:
        iterator = getattr(self.loader, "_iterator", None)
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()


class _RecordingSampler:
    """Wraps a batch sampler and notes each batch's payload bytes as the loader asks for it.

    The DataLoader returns batches in the order its sampler yields them, so the k-th recorded
    entry belongs to the k-th batch the loop receives, however far the loader prefetches.
    """

    def __init__(self, sampler: Any, sizes: np.ndarray, out: list[int]) -> None:
        self.sampler = sampler
        self.sizes = sizes
        self.out = out

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.sampler:
            self.out.append(int(self.sizes[batch].sum()))
            yield batch


class _SimpleBatches(_Batches):
    """The in-process loop: coalesced ``read_batch`` and decoding into one preallocated array."""

    def __init__(self, dataset: Dataset, options: BenchOptions, size: tuple[int, int]) -> None:
        super().__init__()
        self.dataset = dataset
        self.options = options
        self.decode = _decoder(options, size)
        # raw payloads are pixels without a shape: the crops take them as (H, W, 3) arrays
        self.raw_shape: tuple[int, int, int] | None = None
        if dataset.manifest.codec.get("name") == "raw":
            from .codecs import raw_sample_shape

            self.raw_shape = tuple(raw_sample_shape(dataset.manifest.codec, path=dataset.path))  # type: ignore[assignment]
        ix = dataset.index
        self.blocks = (index_blocks(ix.offset, ix.size, ix.shard, 4 << 20)
                       if options.order == "block" else None)

    def __iter__(self) -> Iterator[Any]:
        dataset, options, decode = self.dataset, self.options, self.decode
        sizes = dataset.index.size
        formats = dataset.index.image_format
        rng = np.random.default_rng(options.seed)
        epoch = 0
        while True:
            order = epoch_order(options.order, len(dataset), seed=options.seed, epoch=epoch,
                                blocks=self.blocks)
            for begin in range(0, len(order), options.batch_size):
                indices = order[begin:begin + options.batch_size]
                self.batch_bytes.append(int(sizes[indices].sum()))
                batch = dataset.read_batch(indices)
                if decode is False:
                    yield batch, indices
                elif decode is True:
                    from .decode import decode_image
                    yield [decode_image(batch[j], int(formats[i]))
                           for j, i in enumerate(indices.tolist())], indices
                else:
                    out = np.empty((len(indices), *decode.output_shape), dtype=np.uint8)
                    for j, i in enumerate(indices.tolist()):
                        data: Any = batch[j]
                        if self.raw_shape is not None:
                            data = np.frombuffer(data, dtype=np.uint8).reshape(self.raw_shape)
                        decode(data, int(formats[i]), rng, out=out[j])
                    yield out, indices
            epoch += 1


def _batch_length(batch: tuple[Any, Any]) -> int:
    """Samples in a batch: every loader here yields ``(images, labels or indices)``."""
    return len(batch[1])


# --- the run ------------------------------------------------------------------------------------

def _shares(before: dict[int, float | None], after: dict[int, float | None], pids: list[int],
            seconds: float) -> list[float] | None:
    """Per-process (after - before) / seconds, for the processes readable both times."""
    readings = []
    for pid in pids:
        first, last = before.get(pid), after.get(pid)
        if first is not None and last is not None:
            readings.append(round((last - first) / seconds, 3))
    return readings or None


def run_bench(path: str | os.PathLike[str], options: BenchOptions = BenchOptions(), *,
              log: Callable[[str], None] | None = None) -> BenchResult:
    """Time the loader over ``path`` as ``options`` configure it.

    Args:
        path: the dataset folder.
        options: the loader's configuration and the run's length.
        log: receives progress and notes (e.g. ``click.echo`` to stderr); None is quiet.

    Returns:
        The measurement, with ``advice`` filled in by ``advise`` when there is a target rate.

    Raises:
        PackerError: the dataset cannot be opened or a sample cannot be read or decoded.
        MissingDependencyError: ``loader="torch"`` without torch installed.
    """
    say = log or (lambda _message: None)
    dataset = open_dataset(path, backend=options.backend)
    cores = available_cpus()
    notes: list[str] = []
    loader = options.loader
    if loader in ("auto", "torch"):
        try:
            import torch  # noqa: F401
        except ImportError:
            if loader == "torch":
                raise MissingDependencyError(
                    "--loader torch needs PyTorch: pip install 'packer-shards[torch]'") from None
            loader = "simple"
            notes.append("torch is not installed: measured a plain in-process loop (one process, "
                         "no DataLoader workers); pip install 'packer-shards[torch]' to measure the "
                         "DataLoader a training job would use")
        else:
            loader = "torch"
    workers = 0 if loader == "simple" else (cores if options.workers is None else options.workers)
    if loader == "simple" and options.workers:
        notes.append(f"--workers {options.workers} ignored: the in-process loop has no workers")
    raw_note = raw_codec_note(dataset)
    if raw_note is not None:
        notes.append(raw_note)
    size = (options.size, options.size) if options.size is not None else default_size(dataset)
    stored = _median_size(dataset)
    crops = options.decode in ("rrc", "center")
    if crops and stored is not None and (size[0] > stored[0] or size[1] > stored[1]):
        notes.append(f"--size {options.size} is larger than the stored images (median {stored[0]}x{stored[1]}, HxW): "
                     f"this run times upsampling them; leave --size out to crop at the stored size")
    if len(dataset) < options.batch_size:
        notes.append(small_dataset_note(len(dataset), options.batch_size))
    for note in notes:
        say(f"note: {note}")

    others = set(child_pids())  # children from before this run (a caller's own workers) are not ours
    source: _Batches = (_TorchBatches(dataset, options, workers, size) if loader == "torch"
                        else _SimpleBatches(dataset, options, size))
    shown_size = f" {size[0]}x{size[1]}" if crops else ""
    say(f"benchmarking {path}: {len(dataset)} samples, loader {loader}, {workers} worker(s), "
        f"batch {options.batch_size}, order {options.order}, decode {options.decode}{shown_size}, "
        f"backend {options.backend}; {options.warmup} warm-up + {options.batches} timed batches")
    iterator: Any = iter(source)
    try:
        for _ in range(options.warmup):
            next(iterator)
        pids = [pid for pid in child_pids() if pid not in others] if workers else []
        me = os.getpid()
        cpu_before = {pid: process_cpu_seconds(pid) for pid in pids}
        wait_before = {pid: run_queue_seconds(pid) for pid in [*pids, me]}
        read_before = {pid: storage_read_bytes(pid) for pid in [*pids, me]}
        main_before = time.process_time()
        start = time.perf_counter()
        samples = 0
        for _ in range(options.batches):
            samples += _batch_length(next(iterator))
        seconds = max(time.perf_counter() - start, 1e-9)
        main_cpu = (time.process_time() - main_before) / seconds
        cpu_after = {pid: process_cpu_seconds(pid) for pid in pids}
        wait_after = {pid: run_queue_seconds(pid) for pid in [*pids, me]}
        read_after = {pid: storage_read_bytes(pid) for pid in [*pids, me]}
    finally:
        iterator.close()
        source.close()
        formats = _format_counts(dataset)
        dataset.close()

    worker_cpu = _shares(cpu_before, cpu_after, pids, seconds) if workers else None
    worker_wait = _shares(wait_before, wait_after, pids, seconds) if workers else None
    main_wait_list = _shares(wait_before, wait_after, [me], seconds)
    reads = [read_after[pid] - read_before[pid] for pid in read_before  # type: ignore[operator]
             if read_before[pid] is not None and read_after.get(pid) is not None]
    if seconds < _MIN_SECONDS:
        notes.append(f"the timed batches took {seconds:.2f} s, too short for steady numbers: time more of them "
                     f"(--batches {math.ceil(options.batches * 2 * _MIN_SECONDS / seconds)})")
    timed = source.batch_bytes[options.warmup:options.warmup + options.batches]
    payload = int(sum(timed))
    result = BenchResult(
        dataset=getattr(dataset, 'location', str(path)), num_samples=len(dataset), loader=loader,
        options=asdict(options), workers=workers, cores=cores, samples=samples,
        batches=options.batches, payload_bytes=payload, seconds=round(seconds, 6),
        samples_per_s=round(samples / seconds, 3), mb_per_s=round(payload / seconds / 1e6, 3),
        worker_cpu=worker_cpu, main_cpu=round(main_cpu, 3), worker_wait=worker_wait,
        main_wait=main_wait_list[0] if main_wait_list else None, target_rate=options.target_rate,
        notes=notes, codec=str(dataset.manifest.codec.get("name", "")), formats=formats,
        image_size=None if stored is None else list(stored), size=list(size) if crops else None,
        storage_bytes=int(sum(reads)) if reads else None)
    result.diagnosis = diagnose(result)
    if options.target_rate is not None:
        result.required_rate = round(HEADROOM * options.target_rate, 3)
        result.meets_target = result.samples_per_s >= result.required_rate
        result.advice = advise(result, options)
    return result


def small_dataset_note(num_samples: int, batch_size: int) -> str:
    """What a dataset smaller than one batch does to the measurement."""
    return (f"the dataset holds {num_samples} samples, fewer than one batch of {batch_size}: every timed "
            f"\"batch\" was the whole dataset ({num_samples} samples), so per-batch costs weigh "
            f"{batch_size / max(num_samples, 1):.1f}x more than in training; bench with --batch-size "
            f"{num_samples} or less, or on a larger dataset")


def raw_codec_note(dataset: Dataset) -> str | None:
    """For a dataset of small encoded images: say that ``--codec raw`` is the fast path, and its
    disk cost (at the median image size and this dataset's alignment); else None.

    Small images (median longer side up to ``SMALL_IMAGE_SIDE``) decode in tens of
    microseconds, so a loader's time goes to the per-sample path around the decode. Raw pixels
    skip the decode and let ``RandomResizedCrop``/``CenterCrop`` crop a whole batch at once
    (``packer.rawcrop``), in DataLoader workers or in ``packer.threaded.ThreadedLoader``.
    """
    from .codecs import raw_sample_stride

    count = len(dataset)
    if count == 0 or dataset.manifest.codec.get("name") == "raw":
        return None
    ix = dataset.index
    height, width = int(np.median(ix.height)), int(np.median(ix.width))
    if max(height, width) > SMALL_IMAGE_SIDE or min(height, width) < 1:
        return None
    shape = (height, width, 3)
    stride = raw_sample_stride(shape, dataset.alignment)
    raw_bytes = count * stride
    current = sum(shard.size for shard in dataset.manifest.shards)
    packed = raw_sample_stride(shape, 64)
    note = (f"small images (median {width}x{height} px): --codec raw is the fast path for them "
            f"(decoded pixels, no decode on read; RandomResizedCrop/CenterCrop then crop whole "
            f"batches at once, packer.rawcrop, also in the in-process packer.threaded."
            f"ThreadedLoader). `packer build SRC OUT --codec raw --size {height}x{width}` stores "
            f"{stride:,} bytes per image at this dataset's alignment ({dataset.alignment}): "
            f"{raw_bytes / 1e6:,.1f} MB for {count:,} images, {raw_bytes / max(current, 1):.1f}x "
            f"the {current / 1e6:,.1f} MB of these shards")
    if packed < stride:
        note += (f" (with --alignment 64: {packed:,} bytes per image, "
                 f"{count * packed / 1e6:,.1f} MB)")
    return note


def _format_counts(dataset: Dataset) -> dict[str, int]:
    from . import format as fmt

    values, counts = np.unique(dataset.index.image_format, return_counts=True)
    return {fmt.ImageFormat.NAMES.get(int(v), f"format-{int(v)}"): int(n)
            for v, n in zip(values.tolist(), counts.tolist())}


def diagnose(result: BenchResult) -> str:
    """What limited the run, from its CPU accounting: one of ``DIAGNOSES``.

    Only the workers that worked count (an idle worker, one the loader had no batch for, would
    pull an average down): ``cpu + wait`` is the share of the time a worker was running or
    runnable. Runnable demand above the cores with workers waiting for a CPU is
    oversubscription; waiting while the run fits the cores is contention from other processes.
    """
    main = result.main_cpu + (result.main_wait or 0.0)
    if not result.workers or not result.worker_cpu:
        waiting = result.main_wait or 0.0
        if waiting >= _CPU_WAIT * max(main, 1e-9) and main >= _BUSY:
            return "contended"
        return "cpu-bound" if main >= _BUSY else _blocked(result)
    waits = result.worker_wait if result.worker_wait and len(result.worker_wait) == len(result.worker_cpu) \
        else [0.0] * len(result.worker_cpu)
    pairs = list(zip(result.worker_cpu, waits))
    active = [(c, w) for c, w in pairs if c + w >= _ACTIVE] or pairs
    runnable = sum(c + w for c, w in pairs) + main
    busy = sum(c + w for c, w in active)
    if busy / len(active) >= _BUSY:  # the working workers were running or runnable: CPU is the limit
        waiting = sum(w for _, w in active) / max(busy, 1e-9)
        if waiting >= _CPU_WAIT:
            return "oversubscribed" if runnable > result.cores + _OVER else "contended"
        return "cpu-bound"
    if main >= _BUSY:
        return "main-bound"
    return _blocked(result)  # blocked most of the time, neither running nor waiting for a CPU


def _blocked(result: BenchResult) -> str:
    """Processes blocked most of the time: on storage reads, or (bytes from the page cache) on the
    hand-off of batches between processes."""
    if result.storage_bytes is not None and result.payload_bytes > 0 and \
            result.storage_bytes < _FROM_CACHE * result.payload_bytes:
        return "handoff-bound"
    return "read-bound"


def _share(formats: dict[str, int], *names: str) -> float:
    total = sum(formats.values())
    return sum(formats.get(name, 0) for name in names) / total if total else 0.0


def _cpu_advice(result: BenchResult, options: BenchOptions) -> list[str]:
    """Cheaper work per sample, for what is stored: raw pixels, JPEGs, or other formats."""
    advice: list[str] = []
    size = result.size
    stored = result.image_size
    if options.decode in ("rrc", "center") and size and stored and (size[0] > stored[0] or size[1] > stored[1]):
        advice.append(f"crop at the stored size (leave --size out): {size[0]}x{size[1]} upsamples the "
                      f"{stored[0]}x{stored[1]} images, which costs more than reading them")
    if result.codec == "raw":  # pixels: nothing is decoded; nvJPEG, tiling, re-encoding do not apply
        if options.decode in ("rrc", "center"):
            advice.append("raw pixels are not decoded: the time goes to cropping and resizing each batch; "
                          "crop on the GPU with packer.gpu.GpuRawBatches(decode=RandomResizedCrop(...)), or "
                          "in the training process with packer.threaded.ThreadedLoader (no worker processes)")
        else:
            advice.append("raw pixels are not decoded: the time goes to moving batches between processes; "
                          "packer.threaded.ThreadedLoader (threads, no worker processes) or packer.gpu."
                          "GpuRawBatches (straight to the GPU) avoid that")
        return advice
    if options.decode == "none":
        advice.append("no decoding was timed (--decode none): the workers are busy moving bytes; use fewer, "
                      "larger batches, or time the decode your training uses")
        return advice
    if options.decode == "full":
        advice.append("decode with a fused transform (packer.transforms.RandomResizedCrop / "
                      "CenterCrop, `--decode rrc`): it crops and resizes while decoding "
                      "instead of decoding full-size images and transforming them")
    if raw_codec_applies(result):  # tiny images: the decode is not the cost, the per-sample path is
        advice.append("rebuild with --codec raw (small images, see the note): no decode on read, "
                      "and random crops of whole batches")
        return advice
    jpegs = _share(result.formats, "jpeg")
    if jpegs >= 0.5:
        if options.decode == "rrc" and result.codec == "passthrough":
            advice.append("rebuild with --codec tiled: the same pixels (lossless), and a random "
                          "crop then decodes only the JPEG tiles under it (about 1.5x faster "
                          "per image at ImageNet sizes)")
        if stored is None or min(stored) > 320:
            advice.append("re-encode the images smaller (e.g. --codec jpeg --max-size 320 --resize-side "
                          "shorter) and rebuild: decoding time grows with the pixel count")
        advice.append("decode the JPEGs on the GPU with NVIDIA DALI (nvJPEG; packer.dali) or packer.gpu."
                      "GpuJpegBatches: the CPU then only moves bytes")
    else:
        ranked = sorted(result.formats.items(), key=lambda kv: -kv[1])
        kinds = ", ".join(f"{n:,} {name}" for name, n in ranked[:3]) or "formats unknown"
        advice.append(f"most images are not JPEGs ({kinds}): nvJPEG and --codec tiled are for JPEGs; "
                      f"rebuild with --codec jpeg (lossy, much cheaper to decode than PNG's zlib) or, "
                      f"for small images, --codec raw (no decode on read)")
    return advice


def advise(result: BenchResult, options: BenchOptions) -> list[str]:
    """What to change when the loader delivers less than ``HEADROOM`` x the target rate.

    Reads ``diagnose(result)``, the dataset's codec, stored formats and image size in ``result``
    (so a test can inject any situation), and the options that were measured.

    Args:
        result: the measurement (``target_rate`` set).
        options: the configuration that was measured.

    Returns:
        Suggestions, most likely first; empty when the target is met or there is no target.
    """
    if result.target_rate is None or result.samples_per_s >= HEADROOM * result.target_rate:
        return []
    required = HEADROOM * result.target_rate
    factor = required / max(result.samples_per_s, 1e-9)
    mean_bytes = result.payload_bytes / max(result.samples, 1)
    advice = [f"the loader delivers {result.samples_per_s:,.0f} samples/s; the model needs "
              f"{result.target_rate:,.0f}/s and the loader should deliver {HEADROOM}x that "
              f"({required:,.0f}/s): {factor:.1f}x more is needed"]
    if result.num_samples < options.batch_size:
        advice.append(small_dataset_note(result.num_samples, options.batch_size))
    diagnosis = result.diagnosis or diagnose(result)
    workers = result.workers
    if result.loader == "simple":
        advice.append("install torch (pip install 'packer-shards[torch]') and use DataLoader workers: "
                      "this run decoded in one process")
    main = result.main_cpu + (result.main_wait or 0.0)
    if diagnosis == "oversubscribed":
        limit = max(1, result.cores - int(main + 0.5))
        pairs = zip(result.worker_cpu or [], result.worker_wait or [])
        active = [(c, w) for c, w in pairs if c + w >= _ACTIVE]
        waited = sum(w for _, w in active) / max(sum(c + w for c, w in active), 1e-9)
        advice.append(f"use at most {limit} worker{'s' if limit > 1 else ''}: {workers} workers on {result.cores} "
                      f"core(s) waited for a CPU {waited:.0%} of the time they were runnable; more workers than "
                      f"cores add switching and memory, not throughput (--workers {limit})")
        return advice
    if diagnosis == "contended":
        advice.append(f"the processes of this run waited for a CPU although they fit the {result.cores} core(s): "
                      f"other processes use these cores; measure again on an idle machine, or keep cores "
                      f"free for the loader")
        return advice + _cpu_advice(result, options)  # the work competes for CPU: cheaper work still helps
    if diagnosis == "cpu-bound":
        if workers < result.cores and result.loader != "simple":
            suggested = min(result.cores, max(workers + 1, math.ceil(max(workers, 1) * factor)))
            advice.append(f"use more workers: the {workers or 'main'} process(es) are CPU-bound and "
                          f"only {max(workers, 1)} of {result.cores} cores are used; try "
                          f"--workers {suggested}")
        advice += _cpu_advice(result, options)
        return advice
    if diagnosis == "handoff-bound":
        advice.append("the bytes came from the page cache and no process was busy: batches wait in the hand-off "
                      "between the workers and the main process (queues, pickling, shared memory), which small "
                      "samples feel most; read in the training process with packer.threaded.ThreadedLoader "
                      "(threads, no hand-off), or use larger batches (fewer hand-offs per sample)")
        return advice
    if diagnosis == "main-bound":
        pinning = " or pin in the training loop's own stream" if options.pin_memory else ""
        advice.append(f"the main process is busy (collating{' and pinning' if options.pin_memory else ''} "
                      f"batches) while the workers wait: return whole-batch tensors from the workers "
                      f"(packer's batched readers) rather than per-sample objects{pinning}")
        return advice
    if options.order == "random":
        advice.append("use the block shuffle (--order block): whole blocks are read with "
                      "large sequential reads instead of one small random read per sample")
    needed_mb = required * mean_bytes / 1e6
    others = ", ".join(b for b in ("mmap", "pread", "direct") if b != options.backend)
    cache = "" if options.backend == "direct" else ", warm the page cache"
    advice.append(f"the workers wait on reads: at {required:,.0f} samples/s the loader needs "
                  f"about {needed_mb:,.0f} MB/s and got {result.mb_per_s:,.0f} MB/s; try "
                  f"another --backend ({others}){cache}, or copy the dataset to faster local storage")
    return advice


def raw_codec_applies(result: BenchResult) -> bool:
    """Encoded images small enough for ``--codec raw`` to be the fast path (``raw_codec_note``)."""
    stored = result.image_size
    return bool(stored) and max(stored) <= SMALL_IMAGE_SIDE and min(stored) >= 1


_DIAGNOSIS_TEXT = {
    "oversubscribed": "more runnable processes than cores; the workers waited for a CPU",
    "contended": "the workers waited for a CPU that other processes held",
    "cpu-bound": "the workers computed all the time",
    "main-bound": "the main process (collate, pin) computed all the time",
    "read-bound": "the workers waited for bytes from storage, not for a CPU",
    "handoff-bound": "no process was busy and the bytes came from the page cache: batches waited between processes",
}


def format_report(result: BenchResult) -> str:
    """The human-readable summary printed to stderr."""
    opts = result.options
    lines = [f"packer bench {result.dataset}",
             f"  loader      {result.loader}, {result.workers} worker(s) on {result.cores} core(s), "
             f"reader {opts['reader']}, order {opts['order']}, backend {opts['backend']}",
             f"  decode      {opts['decode']}" + (f" {result.size[0]}x{result.size[1]}" if result.size else "")
             + f", layout {opts['layout']}, batch {opts['batch_size']}",
             f"  timed       {result.batches} batches ({result.samples} samples) in "
             f"{result.seconds:.2f} s after {opts['warmup']} warm-up",
             f"  throughput  {result.samples_per_s:,.1f} samples/s, {result.mb_per_s:,.1f} MB/s",
             f"  CPU         main {result.main_cpu:.2f} core(s)" + (
                 "" if result.worker_cpu is None else
                 ", workers " + " ".join(f"{c:.2f}" for c in result.worker_cpu) + " core(s) each")]
    waits = [result.main_wait or 0.0, *(result.worker_wait or [])]
    if max(waits) >= 0.1:
        why = ("this run's processes outnumber the cores" if result.diagnosis == "oversubscribed"
               else "other processes share these cores")
        lines.append(f"  contention  waiting for a CPU: main {waits[0]:.2f}" + (
            "" if not result.worker_wait else
            ", workers " + " ".join(f"{w:.2f}" for w in result.worker_wait))
            + f" of the time ({why})")
    if result.diagnosis is not None:
        lines.append(f"  limit       {result.diagnosis}: {_DIAGNOSIS_TEXT[result.diagnosis]}")
    if result.target_rate is not None:
        verdict = "OK" if result.meets_target else "TOO SLOW"
        lines.append(f"  target      {result.target_rate:,.1f} samples/s x {HEADROOM} = "
                     f"{result.required_rate:,.1f} needed: {verdict} "
                     f"({result.samples_per_s / max(result.target_rate, 1e-9):.2f}x the target)")
        for item in result.advice[1:]:
            lines.append(f"  - {item}")
    for note in result.notes:
        if note not in result.advice:  # a note the advice repeats is printed once
            lines.append(f"  note: {note}")
    return "\n".join(lines)

