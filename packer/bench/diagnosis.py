"""What limited a ``packer bench`` run (``diagnose``), what to change (``advise``), and the report.

The thresholds below read the per-process CPU shares of ``BenchResult``; each verdict is
explained in the package docstring.
"""

from __future__ import annotations

import math

import numpy as np

from ..dataset import Dataset
from .options import HEADROOM, SMALL_IMAGE_SIDE, BenchOptions, BenchResult

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
    from ..codecs import codec_for, raw_sample_stride
    from ..writer.plan import choose_alignment
    from ..writer.settings import DEFAULT_SHARD_SIZE

    count = len(dataset)
    if count == 0 or codec_for(dataset).stores_pixels:
        return None
    ix = dataset.index
    height, width = int(np.median(ix.height)), int(np.median(ix.width))
    if max(height, width) > SMALL_IMAGE_SIDE or min(height, width) < 1:
        return None
    shape = (height, width, 3)
    # what `--codec raw` would choose with the default --alignment auto (formats/SPEC.md §3.4)
    alignment = choose_alignment(np.full(1, height * width * 3, dtype=np.uint64), DEFAULT_SHARD_SIZE)
    stride = raw_sample_stride(shape, alignment)
    raw_bytes = count * stride
    current = sum(shard.size for shard in dataset.manifest.shards)
    note = (f"small images (median {width}x{height} px): --codec raw is the fast path for them "
            f"(decoded pixels, no decode on read; RandomResizedCrop/CenterCrop then crop whole "
            f"batches at once, packer.rawcrop, also in the in-process packer.threaded."
            f"ThreadedLoader). `packer build SRC OUT --codec raw --size {height}x{width}` stores "
            f"{stride:,} bytes per image (--alignment auto packs them at {alignment} bytes): "
            f"{raw_bytes / 1e6:,.1f} MB for {count:,} images, {raw_bytes / max(current, 1):.1f}x "
            f"the {current / 1e6:,.1f} MB of these shards")
    return note


def idle_workers(result: BenchResult) -> int:
    """The workers that ran or waited for a CPU less than a tenth of the timed run: they had no batch."""
    if not result.worker_cpu:
        return 0
    waits = result.worker_wait if result.worker_wait and len(result.worker_wait) == len(result.worker_cpu) \
        else [0.0] * len(result.worker_cpu)
    return sum(1 for c, w in zip(result.worker_cpu, waits) if c + w < _ACTIVE)


def idle_note(result: BenchResult) -> str | None:
    """What the idle workers say about the run, or None when every worker worked.

    A DataLoader deals each epoch's batches to its workers in turn, starting again from worker 0
    every epoch: with fewer batches in an epoch than workers, the workers past the last batch
    never get one, whatever the dataset's size.
    """
    idle, workers = result.idle_workers, result.workers
    if not idle:
        return None
    batch = result.options.get("batch_size")
    per_epoch = result.batches_per_epoch
    if per_epoch is not None and per_epoch < workers:
        return (f"{idle} of {workers} workers sat idle: an epoch of {result.num_samples:,} samples holds "
                f"{per_epoch} batch{'es' if per_epoch > 1 else ''} of {batch}, and the DataLoader hands each "
                f"epoch's batches to its workers in turn from worker 0, so the workers past the "
                f"{per_epoch}{_ordinal(per_epoch)} never get one; the run measured {workers - idle} "
                f"worker(s), not {workers}: use --workers {per_epoch}, or a smaller --batch-size so that an "
                f"epoch holds a batch for every worker")
    return (f"{idle} of {workers} workers sat idle (they ran less than {_ACTIVE:.0%} of the time): the other "
            f"workers kept up, so something else set the pace (the main process, the reads); the run measured "
            f"{workers - idle} worker(s), not {workers}")


def _ordinal(n: int) -> str:
    return "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")


def format_counts(dataset: Dataset) -> dict[str, int]:
    from .. import format as fmt

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
    # the working workers were running or runnable: CPU is the limit; with idle workers, one busy
    # worker is the limit too (an epoch's few batches go to the same workers every epoch)
    uneven = result.idle_workers > 0 and max(c + w for c, w in active) >= _BUSY
    if busy / len(active) >= _BUSY or uneven:
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
    if _stores_pixels(result):  # nothing is decoded; nvJPEG, tiling, re-encoding do not apply
        if options.decode in ("rrc", "center"):
            threaded = "" if result.loader == "threaded" else (
                ", or in the training process with packer.threaded.ThreadedLoader (no worker processes; "
                "--loader threaded measures it)")
            advice.append("raw pixels are not decoded: the time goes to cropping and resizing each batch; "
                          f"crop on the GPU with packer.gpu.GpuRawBatches(decode=RandomResizedCrop(...)){threaded}")
        else:
            advice.append("raw pixels are not decoded: the time goes to moving batches between processes; "
                          "packer.threaded.ThreadedLoader (threads, no worker processes; --loader threaded) or "
                          "packer.gpu.GpuRawBatches (straight to the GPU) avoid that")
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
    note = idle_note(result)
    if note is not None:
        advice.append(note)
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
        if result.loader == "threaded" and (result.threads or 1) < result.cores:
            advice.append(f"use more threads: {result.threads} thread(s) on {result.cores} cores; try "
                          f"--workers {result.cores} (ThreadedLoader's threads)")
        elif workers - result.idle_workers < result.cores and result.loader == "torch" and not result.idle_workers:
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
                      "(threads, no hand-off: measure it with --loader threaded), or use larger batches "
                      "(fewer hand-offs per sample)")
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


def _stores_pixels(result: BenchResult) -> bool:
    """The benchmarked dataset's payloads were pixels (codec ``raw``), not images to decode."""
    from ..codecs import codec_for

    return codec_for({"name": result.codec}).stores_pixels


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
    hands = f"{result.threads} thread(s)" if result.threads else f"{result.workers} worker(s)"
    lines = [f"packer bench {result.dataset}",
             f"  loader      {result.loader}, {hands} on {result.cores} core(s), "
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
        idle = (f"; {result.idle_workers} of {result.workers} workers sat idle (see the note)"
                if result.idle_workers else "")
        why = _DIAGNOSIS_TEXT[result.diagnosis]
        if result.diagnosis == "cpu-bound" and not result.workers:  # no worker processes: this one computed
            why = "this process computed all the time" + (" (the loader's threads)" if result.threads else "")
        lines.append(f"  limit       {result.diagnosis}: {why}{idle}")
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
