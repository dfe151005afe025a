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
does not, ``advise`` says what to change, reading the measurement: busy workers mean decoding is
the limit (more workers, a fused decode transform, smaller images, GPU decoding with DALI); idle
workers mean the bytes do not arrive fast enough (block shuffle, another backend, faster
storage) or the main process is the limit.
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
    "SMALL_IMAGE_SIDE",
    "raw_codec_note",
    "format_report",
    "process_cpu_seconds",
    "run_queue_seconds",
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
# A process whose CPU time covers this share of the timed wall-clock is busy (CPU-bound).
_BUSY = 0.8


@dataclass(frozen=True)
class BenchOptions:
    """How to build the loader under test (the CLI's options, one to one).

    Attributes:
        batch_size: samples per batch.
        workers: DataLoader worker processes (``None``: the cores this process may use).
        order: ``sequential``, ``random`` or ``block`` (see ``packer.order``).
        decode: one of ``DECODE_MODES``.
        size: output size of the ``rrc`` and ``center`` transforms.
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
    size: int = 224
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
            if getattr(self, name) < 1:
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

def _decoder(options: BenchOptions) -> bool | Callable[..., Any]:
    if options.decode == "none":
        return False
    if options.decode == "full":
        return True
    from .transforms import CenterCrop, RandomResizedCrop
    if options.decode == "rrc":
        return RandomResizedCrop(options.size)
    return CenterCrop(options.size, resize=max(options.size, round(options.size * 256 / 224)))


class _Batches:
    """Iterates batches forever (epoch after epoch) and knows each batch's payload bytes."""

    def __init__(self) -> None:
        self.batch_bytes: list[int] = []

    def __iter__(self) -> Iterator[Any]:  # pragma: no cover - overridden
        raise NotImplementedError

    def close(self) -> None:
        pass


class _TorchBatches(_Batches):
    def __init__(self, dataset: Dataset, options: BenchOptions, workers: int) -> None:
        super().__init__()
        import torch.utils.data as torch_data

        from .torch import PackedBatchSampler, PackedDataset, PackedIterableDataset, collate

        decode = _decoder(options)
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

    def __init__(self, dataset: Dataset, options: BenchOptions) -> None:
        super().__init__()
        self.dataset = dataset
        self.options = options
        self.decode = _decoder(options)
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
                        decode(batch[j], int(formats[i]), rng, out=out[j])
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
    for note in notes:
        say(f"note: {note}")

    source: _Batches = (_TorchBatches(dataset, options, workers) if loader == "torch"
                        else _SimpleBatches(dataset, options))
    say(f"benchmarking {path}: {len(dataset)} samples, loader {loader}, {workers} worker(s), "
        f"batch {options.batch_size}, order {options.order}, decode {options.decode}, "
        f"backend {options.backend}; {options.warmup} warm-up + {options.batches} timed batches")
    iterator: Any = iter(source)
    try:
        for _ in range(options.warmup):
            next(iterator)
        pids = child_pids() if workers else []
        me = os.getpid()
        cpu_before = {pid: process_cpu_seconds(pid) for pid in pids}
        wait_before = {pid: run_queue_seconds(pid) for pid in [*pids, me]}
        main_before = time.process_time()
        start = time.perf_counter()
        samples = 0
        for _ in range(options.batches):
            samples += _batch_length(next(iterator))
        seconds = max(time.perf_counter() - start, 1e-9)
        main_cpu = (time.process_time() - main_before) / seconds
        cpu_after = {pid: process_cpu_seconds(pid) for pid in pids}
        wait_after = {pid: run_queue_seconds(pid) for pid in [*pids, me]}
    finally:
        iterator.close()
        source.close()
        dataset.close()

    worker_cpu = _shares(cpu_before, cpu_after, pids, seconds) if workers else None
    worker_wait = _shares(wait_before, wait_after, pids, seconds) if workers else None
    main_wait_list = _shares(wait_before, wait_after, [me], seconds)
    timed = source.batch_bytes[options.warmup:options.warmup + options.batches]
    payload = int(sum(timed))
    result = BenchResult(
        dataset=getattr(dataset, 'location', str(path)), num_samples=len(dataset), loader=loader,
        options=asdict(options), workers=workers, cores=cores, samples=samples,
        batches=options.batches, payload_bytes=payload, seconds=round(seconds, 6),
        samples_per_s=round(samples / seconds, 3), mb_per_s=round(payload / seconds / 1e6, 3),
        worker_cpu=worker_cpu, main_cpu=round(main_cpu, 3), worker_wait=worker_wait,
        main_wait=main_wait_list[0] if main_wait_list else None, target_rate=options.target_rate,
        notes=notes, codec=str(dataset.manifest.codec.get("name", "")))
    if options.target_rate is not None:
        result.required_rate = round(HEADROOM * options.target_rate, 3)
        result.meets_target = result.samples_per_s >= result.required_rate
        result.advice = advise(result, options)
        if raw_note is not None and result.advice:
            result.advice.insert(1, "rebuild with --codec raw (see the note on small images): "
                                    "no decode on read, and random crops of whole batches")
    return result


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


def _busy(cpu: list[float] | None, wait: list[float] | None) -> bool:
    """Processes that ran or waited for a CPU most of the time are CPU-bound."""
    if not cpu:
        return False
    waiting = wait if wait and len(wait) == len(cpu) else [0.0] * len(cpu)
    return float(np.mean([c + w for c, w in zip(cpu, waiting)])) >= _BUSY


def advise(result: BenchResult, options: BenchOptions) -> list[str]:
    """What to change when the loader delivers less than ``HEADROOM`` x the target rate.

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
    workers = result.workers
    cpu_bound = _busy(result.worker_cpu, result.worker_wait) if workers else _busy(
        [result.main_cpu], None if result.main_wait is None else [result.main_wait])
    if result.loader == "simple":
        advice.append("install torch (pip install 'packer-shards[torch]') and use DataLoader workers: "
                      "this run decoded in one process")
    if cpu_bound and workers < result.cores:
        suggested = min(result.cores, max(workers + 1, math.ceil(max(workers, 1) * factor)))
        advice.append(f"use more workers: the {workers or 'main'} process(es) are CPU-bound and "
                      f"only {max(workers, 1)} of {result.cores} cores are used; try "
                      f"--workers {suggested}")
    if cpu_bound and options.decode != "none":
        if options.decode == "full":
            advice.append("decode with a fused transform (packer.transforms.RandomResizedCrop / "
                          "CenterCrop, `--decode rrc`): it crops and resizes while decoding "
                          "instead of decoding full-size images and transforming them")
        if options.decode == "rrc" and result.codec == "passthrough":
            advice.append("rebuild with --codec tiled: the same pixels (lossless), and a random "
                          "crop then decodes only the JPEG tiles under it (about 1.5x faster "
                          "per image at ImageNet sizes)")
        advice.append("re-encode the images smaller (e.g. shorter side 256-320 px, JPEG quality "
                      "~90) and rebuild: decoding time grows with the pixel count and bytes")
        advice.append("decode on the GPU with NVIDIA DALI (nvJPEG; packer's DALI reader): the "
                      "CPU then only moves bytes")
    if not cpu_bound:
        if options.order == "random":
            advice.append("use the block shuffle (--order block): whole blocks are read with "
                          "large sequential reads instead of one small random read per sample")
        needed_mb = required * mean_bytes / 1e6
        advice.append(f"the workers wait on reads: at {required:,.0f} samples/s the loader needs "
                      f"about {needed_mb:,.0f} MB/s and got {result.mb_per_s:,.0f} MB/s; try "
                      f"another --backend (pread, direct), warm the page cache, or copy the "
                      f"dataset to faster local storage")
        if result.main_cpu >= _BUSY:
            advice.append("the main process is busy (collating or pinning batches): use larger "
                          "batches or fewer, larger per-sample transforms in the workers")
    return advice


def format_report(result: BenchResult) -> str:
    """The human-readable summary printed to stderr."""
    opts = result.options
    lines = [f"packer bench {result.dataset}",
             f"  loader      {result.loader}, {result.workers} worker(s) on {result.cores} core(s), "
             f"reader {opts['reader']}, order {opts['order']}, backend {opts['backend']}",
             f"  decode      {opts['decode']}" + (f" {opts['size']}px" if opts["decode"] in ("rrc", "center")
                                                  else "") + f", layout {opts['layout']}, batch "
             f"{opts['batch_size']}",
             f"  timed       {result.batches} batches ({result.samples} samples) in "
             f"{result.seconds:.2f} s after {opts['warmup']} warm-up",
             f"  throughput  {result.samples_per_s:,.1f} samples/s, {result.mb_per_s:,.1f} MB/s",
             f"  CPU         main {result.main_cpu:.2f} core(s)" + (
                 "" if result.worker_cpu is None else
                 ", workers " + " ".join(f"{c:.2f}" for c in result.worker_cpu) + " core(s) each")]
    waits = [result.main_wait or 0.0, *(result.worker_wait or [])]
    if max(waits) >= 0.1:
        lines.append(f"  contention  waiting for a CPU: main {waits[0]:.2f}" + (
            "" if not result.worker_wait else
            ", workers " + " ".join(f"{w:.2f}" for w in result.worker_wait))
            + " of the time (other processes share these cores)")
    if result.target_rate is not None:
        verdict = "OK" if result.meets_target else "TOO SLOW"
        lines.append(f"  target      {result.target_rate:,.1f} samples/s x {HEADROOM} = "
                     f"{result.required_rate:,.1f} needed: {verdict} "
                     f"({result.samples_per_s / max(result.target_rate, 1e-9):.2f}x the target)")
        for item in result.advice[1:]:
            lines.append(f"  - {item}")
    for note in result.notes:
        lines.append(f"  note: {note}")
    return "\n".join(lines)

