"""``run_bench``: the loader a training job would use (a ``DataLoader`` over ``packer.torch``, or a
plain in-process loop without torch), warmed up, then timed with every process's CPU accounted.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict
from typing import Any, Callable, Iterator

import numpy as np

from ..codecs import codec_for, dataset_max_pixels
from ..dataset import Dataset, open_dataset
from ..errors import MissingDependencyError
from .._internal.machine import available_cpus
from ..order import ReadOrder, epoch_order, index_blocks
from .diagnosis import advise, diagnose, format_counts, idle_note, idle_workers, raw_codec_note, small_dataset_note
from .options import DEFAULT_SIZE, HEADROOM, BenchOptions, BenchResult
from .procstat import child_pids, process_cpu_seconds, run_queue_seconds, storage_read_bytes

# A timed run shorter than this (seconds) is flagged: too short for steady numbers.
_MIN_SECONDS = 1.0


# --- the loaders --------------------------------------------------------------------------------

def default_size(dataset: Dataset) -> tuple[int, int]:
    """The ``rrc``/``center`` output ``(height, width)`` when ``--size`` is not given.

    The stored size for a ``raw`` dataset and for images whose median shorter side is under
    ``DEFAULT_SIZE`` (a 32x32 dataset cropped to 224 would time an upsampling: 12x slower than
    the loader at the stored size, measured); ``DEFAULT_SIZE`` square otherwise.
    """
    shape = codec_for(dataset).sample_shape
    if shape is not None:
        return int(shape[0]), int(shape[1])
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
    from ..transforms import CenterCrop, RandomResizedCrop
    if options.decode == "rrc":
        return RandomResizedCrop(size)
    shorter = min(size)
    return CenterCrop(size, resize=shorter if options.size is None else max(shorter, round(shorter * 256 / 224)))


class _Batches:
    """Iterates batches forever (epoch after epoch) and knows each batch's payload bytes."""

    def __init__(self) -> None:
        self.batch_bytes: list[int] = []
        self.batches_per_epoch: int | None = None

    def __iter__(self) -> Iterator[Any]:  # pragma: no cover - overridden
        raise NotImplementedError

    def close(self) -> None:
        pass


class _TorchBatches(_Batches):
    def __init__(self, dataset: Dataset, options: BenchOptions, workers: int, size: tuple[int, int]) -> None:
        super().__init__()
        import torch.utils.data as torch_data

        from ..torch import PackedBatchSampler, PackedDataset, PackedIterableDataset, collate

        decode = _decoder(options, size)
        order = _one_process_order(options)
        sizes = dataset.index.size
        self._epoch_setter: Callable[[int], None]
        common: dict[str, Any] = {"num_workers": workers, "pin_memory": options.pin_memory,
                                  "persistent_workers": workers > 0}
        if workers > 0:
            common["prefetch_factor"] = 2
        if options.reader == "map":
            data = PackedDataset(dataset, decode=decode, layout=options.layout)
            sampler = PackedBatchSampler(data, batch_size=options.batch_size, order=order)
            recorder = _RecordingSampler(sampler, sizes, self.batch_bytes)
            self.batches_per_epoch = len(sampler)
            self.loader = torch_data.DataLoader(data, batch_sampler=recorder, collate_fn=collate,
                                                **common)
            self._epoch_setter = sampler.set_epoch
        else:
            data = PackedIterableDataset(dataset, batch_size=options.batch_size, order=order, decode=decode,
                                         layout=options.layout)
            self.loader = torch_data.DataLoader(data, batch_size=None, **common)
            self._iterable = data
            self._epoch_setter = data.set_epoch
            self.batches_per_epoch = data.plan().num_batches
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


def _one_process_order(options: BenchOptions) -> ReadOrder:
    """The order the bench reads: the one asked for, all of it in this process (rank 0 of 1)."""
    return ReadOrder(options.order, seed=options.seed, rank=0, world_size=1)


class _ThreadedBatches(_Batches):
    """``packer.threaded.ThreadedLoader``: batches made on threads of this process, no hand-off."""

    def __init__(self, dataset: Dataset, options: BenchOptions, threads: int, size: tuple[int, int]) -> None:
        super().__init__()
        from ..threaded import ThreadedLoader

        self.loader = ThreadedLoader(dataset, batch_size=options.batch_size, decode=_decoder(options, size),
                                     layout=options.layout, order=_one_process_order(options), threads=threads,
                                     pin_memory=options.pin_memory, fields=("image", "label", "index"))
        self._sizes = dataset.index.size
        self.batches_per_epoch = len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        epoch = 0
        while True:
            self.loader.set_epoch(epoch)
            for batch in self.loader:
                indices = np.asarray(batch["index"])
                self.batch_bytes.append(int(self._sizes[indices].sum()))
                yield batch["image"], indices
            epoch += 1


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
        # what the payloads are: encoded images to decode, or pixels (raw) the crops take as (H, W, 3) arrays
        self.codec = codec_for(dataset)
        if self.decode is not False:
            self.codec.check_decodable()  # SPEC §6, as every decoding reader
        self.max_pixels = dataset_max_pixels(dataset.manifest)
        ix = dataset.index
        self.blocks = (index_blocks(ix.offset, ix.size, ix.shard, 4 << 20)
                       if options.order == "block" else None)
        self.batches_per_epoch = math.ceil(len(dataset) / options.batch_size)

    def __iter__(self) -> Iterator[Any]:
        dataset, options, decode, codec = self.dataset, self.options, self.decode, self.codec
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
                    yield [codec.pixels(dataset, i, np.frombuffer(batch[j], dtype=np.uint8), max_pixels=self.max_pixels)
                           for j, i in enumerate(indices.tolist())], indices
                else:
                    out = np.empty((len(indices), *decode.output_shape), dtype=np.uint8)
                    for j, i in enumerate(indices.tolist()):
                        data = np.frombuffer(batch[j], dtype=np.uint8)
                        stored = codec.stored_pixels(dataset, i, data)
                        decode(data if stored is None else stored, int(formats[i]), rng, out=out[j])
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
    if loader in ("auto", "torch", "threaded"):
        try:
            import torch  # noqa: F401
        except ImportError:
            if loader != "auto":
                raise MissingDependencyError(
                    f"--loader {loader} needs PyTorch: pip install 'packer-shards[torch]'") from None
            loader = "simple"
            notes.append("torch is not installed: measured a plain in-process loop (one process, "
                         "no DataLoader workers); pip install 'packer-shards[torch]' to measure the "
                         "DataLoader a training job would use")
        else:
            loader = "threaded" if loader == "threaded" else "torch"
    threads = None
    if loader == "threaded":  # --workers counts its threads; the batches are made in this process
        threads = max(1, cores if options.workers is None else options.workers)
    workers = 0 if loader in ("simple", "threaded") else (cores if options.workers is None else options.workers)
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
                        else _ThreadedBatches(dataset, options, threads or 1, size) if loader == "threaded"
                        else _SimpleBatches(dataset, options, size))
    shown_size = f" {size[0]}x{size[1]}" if crops else ""
    hands = f"{threads} thread(s)" if threads else f"{workers} worker(s)"
    say(f"benchmarking {path}: {len(dataset)} samples, loader {loader}, {hands}, "
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
        formats = format_counts(dataset)
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
        storage_bytes=int(sum(reads)) if reads else None, threads=threads,
        batches_per_epoch=source.batches_per_epoch)
    result.idle_workers = idle_workers(result)
    note = idle_note(result)
    if note is not None:
        result.notes.append(note)
    result.diagnosis = diagnose(result)
    if options.target_rate is not None:
        result.required_rate = round(HEADROOM * options.target_rate, 3)
        result.meets_target = result.samples_per_s >= result.required_rate
        result.advice = advise(result, options)
    return result
