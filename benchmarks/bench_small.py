"""Small images at memory speed: CIFAR-like (and Tiny-ImageNet-like) loaders compared in one run.

Usage::

    .venv/bin/python benchmarks/bench_small.py [--images 50000] [--size 32]
        [--workers 2] [--threads 2] [--batch-size 512] [--rounds 3] [--out bench-out/small]
        [--raw224 2000] [--json FILE]

What one run does:

1. Writes ``--images`` PNGs of ``--size`` x ``--size`` pixels in 10 class folders
   (``make_sample.make_image_folder``; reused when already there), and packs them twice:
   as they are (``--codec passthrough``) and as decoded pixels (``--codec raw``). Everything is
   read once first, so every measurement runs from the page cache.
2. **Training-style**, RandomResizedCrop(``--size``) + horizontal flip to uint8, batch
   ``--batch-size``, random order, for every loader:

   * ``imagefolder``: torchvision ``ImageFolder`` + ``RandomResizedCrop`` + ``RandomHorizontalFlip``
     + ``PILToTensor`` in a DataLoader with ``--workers`` workers. When torchvision does not
     import beside this torch (the CPU build of ``.venv``: "operator torchvision::nms does not
     exist"), ``peers_common.ImageFolderLike`` + the same transform transcribed from
     torchvision's PIL path (get_params on torch's RNG, PIL crop + bilinear resize, flip,
     tensor), and the table says ``(emulated)``;
   * ``packer pass-through``: ``PackedDataset(decode=RandomResizedCrop(size))`` +
     ``PackedBatchSampler`` + ``collate`` (the default wiring), ``--workers`` workers (decodes each PNG);
   * ``packer raw batched, N workers``: the same over the raw dataset: each batch is one
     gather + one vectorised crop-resize (``packer.rawcrop``) in a worker;
   * ``packer raw batched, main process``: the same with ``num_workers=0``;
   * ``packer raw threaded, T threads``: ``packer.threaded.ThreadedLoader``.

   The loaders run in ``--rounds`` interleaved rounds (``harness.interleave``: background load
   hits all of them alike); the table shows the median round's images/s and CPU ms per image
   over all rounds (workers + main process), with their ratios to ImageFolder's.
3. **Raw batch reads** (no augmentation), random batches: ``read_raw_batch`` (one gather per
   batch, one thread), ``ThreadedLoader(decode=True)``, a ``memcpy`` (``numpy.copyto``) of
   the same number of bytes from one cache-resident buffer, and the gather's floor: the same
   random rows copied out of anonymous memory as large as the dataset in 4 KB pages (no file, no
   index), in samples/s and GB/s.
4. **Where the time goes**: ms per batch of each stage of the raw batched path (gather, draws,
   resample) and of ImageFolder's per-image path (file read, PIL decode, transform, collate).
5. With ``--raw224 N``: N raw 224x224 samples; random batch reads against a ``memcpy`` of the
   same bytes (GB/s), and RandomResizedCrop(224) per-sample vs batched.

Timings on a shared machine are noisy: read the ratios, which compare loaders measured in the
same run. The header states the machine's load before and after the loaders' rounds (1-minute
load average, and the kernel's CPU pressure: the share of time some task waited for a core).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np

import harness
import make_sample
from peers_common import (ensure_small_images, ensure_small_packed, forever, have_torchvision, image_folder,
                          loader_imagefolder, loader_packer_default, measure_training, tv_train_transform)


TARGETS = {"raw_vs_imagefolder": 25.0, "raw_batch_reads_per_s": 2_000_000}


# --- data -----------------------------------------------------------------------------------------

def warm(folder: Path) -> None:
    harness.warm(p for p in folder.rglob("*") if p.is_file())


# --- loaders (ImageFolder and packer's default wiring: peers_common) -------------------------------

def loader_threaded(packed: Path, threads: int, batch: int, size: int, *, decode: Any = None) -> Any:
    from packer import ReadOrder
    from packer.threaded import ThreadedLoader
    from packer.transforms import RandomResizedCrop
    return ThreadedLoader(packed, batch_size=batch, order=ReadOrder("random", seed=0), threads=threads,
                          decode=RandomResizedCrop(size, seed=0) if decode is None else decode)


def training_table(runs: list[tuple[str, Callable[[], Any]]], *, rounds: int, images: int,
                   warmup: int) -> list[harness.Row]:
    """Each loader ``rounds`` times, interleaved (``peers_common.measure_training``), against the first."""
    return measure_training(runs, rounds=rounds, warmup=warmup, images=images * rounds)


# --- raw reads and stages -------------------------------------------------------------------------

median_rate = harness.median_rate


def raw_reads(raw: Path, batch: int, threads: int) -> dict[str, float]:
    from packer.dataset import open_dataset
    from packer.rawcrop import raw_shape_of, read_raw_batch

    dataset = open_dataset(raw)
    shape = raw_shape_of(dataset)
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, len(dataset), batch) for _ in range(64)]
    out = np.empty((batch, *shape), dtype=np.uint8)
    source = np.random.default_rng(1).integers(0, 255, size=out.size, dtype=np.uint8).reshape(out.shape)
    state = {"k": 0}

    def gather() -> int:
        read_raw_batch(dataset, batches[state["k"] % 64], shape, out=out)
        state["k"] += 1
        return batch

    def memcpy() -> int:
        np.copyto(out, source)
        return batch

    # The floor of a random gather: the same rows copied at random from anonymous memory as large
    # as the dataset (no file, no index), in 4 KB pages as the page cache maps a shard (numpy would
    # ask for huge pages, which cut the TLB misses of scattered rows: 1.4x faster here).
    import mmap

    from packer.codecs import raw_sample_stride
    stride = raw_sample_stride(shape, dataset.alignment)
    sample_bytes = int(np.prod(shape))
    anonymous = mmap.mmap(-1, len(dataset) * stride)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        anonymous.madvise(mmap.MADV_NOHUGEPAGE)
    far = np.frombuffer(anonymous, dtype=np.uint8)
    far[:] = 1
    far_rows = np.lib.stride_tricks.as_strided(far, (len(dataset), sample_bytes), (stride, 1))
    far_positions = [(b * stride).astype(np.int64) for b in batches]
    flat_out = out.reshape(batch, sample_bytes)
    try:  # the same copy loop read_raw_batch uses, when it is built
        from packer._rawresample import gather as copy_rows
    except ImportError:
        copy_rows = None

    def random_rows() -> int:
        if copy_rows is not None:
            copy_rows(far, out, far_positions[state["k"] % 64], None, sample_bytes)
        else:
            flat_out[...] = far_rows[batches[state["k"] % 64]]
        state["k"] += 1
        return batch

    threaded = loader_threaded(raw, threads, batch, 0, decode=True)
    stream = forever(threaded)

    def threaded_body() -> int:
        return len(next(stream)[1])

    rates = {}
    for _ in range(3):  # interleaved: the three see the same background load
        for name, body in (("memcpy", memcpy), ("random_rows", random_rows), ("read_raw_batch", gather),
                           ("threaded", threaded_body)):
            rates.setdefault(name, []).append(harness.timed_loop(body, 0.5))
    stream.close()
    del far, far_rows, far_positions
    anonymous.close()
    result = {}
    for name, values in rates.items():
        rate = statistics.median(values)
        result[f"{name}_samples_per_s"] = rate
        result[f"{name}_gb_per_s"] = rate * sample_bytes / 1e9
    return result


def stages_raw(raw: Path, batch: int, size: int) -> dict[str, float]:
    """ms per batch of each stage of the batched raw path (one thread)."""
    import torch

    from packer.dataset import open_dataset
    from packer.rawcrop import (RRC_DRAWS, crop_resize_batch, random_resized_crop_boxes, raw_shape_of,
                                read_raw_batch, sample_uniforms)

    dataset = open_dataset(raw)
    shape = raw_shape_of(dataset)
    indices = np.random.default_rng(0).integers(0, len(dataset), batch)
    pixels = read_raw_batch(dataset, indices, shape)
    boxes, flips = random_resized_crop_boxes(sample_uniforms(0, 0, indices, RRC_DRAWS), shape[1], shape[0])
    out = torch.empty((batch, size, size, 3), dtype=torch.uint8)

    def per_batch(fn: Callable[[], Any]) -> float:
        return 1e3 / median_rate(lambda: (fn(), 1)[1], repeats=3, min_seconds=0.3)

    return {"gather": per_batch(lambda: read_raw_batch(dataset, indices, shape)),
            "draws": per_batch(lambda: random_resized_crop_boxes(
                sample_uniforms(0, 0, indices, RRC_DRAWS), shape[1], shape[0])),
            "resample": per_batch(lambda: crop_resize_batch(pixels, boxes, (size, size), flips=flips, out=out))}


def stages_imagefolder(src: Path, batch: int, size: int) -> dict[str, float]:
    """ms per batch (``batch`` images) of each stage of ImageFolder's per-image path (one process)."""
    import io

    import torch
    from PIL import Image

    dataset = image_folder(src, None)
    paths = [dataset.samples[i][0] for i in np.random.default_rng(0).integers(0, len(dataset), 256)]
    blobs = [open(p, "rb").read() for p in paths]
    decoded = [Image.open(io.BytesIO(b)).convert("RGB") for b in blobs]
    transform = tv_train_transform(size)
    tensors = [transform(img) for img in decoded]
    labels = list(range(len(tensors)))
    scale = batch / len(paths)

    def timed(fn: Callable[[], Any]) -> float:
        return scale * 1e3 / median_rate(lambda: (fn(), 1)[1], repeats=3, min_seconds=0.3)

    return {"file read": timed(lambda: [open(p, "rb").read() for p in paths]),
            "PIL decode": timed(lambda: [Image.open(io.BytesIO(b)).convert("RGB") for b in blobs]),
            "crop+resize+flip+tensor": timed(lambda: [transform(img) for img in decoded]),
            "collate": timed(lambda: torch.utils.data.default_collate(list(zip(tensors, labels))))}


def raw224(out: Path, count: int, batch: int, threads: int) -> dict[str, float]:
    """N raw 224x224 samples: batch reads vs memcpy of the same bytes; RRC(224) per-sample vs batched."""
    from packer.transforms import RandomResizedCrop

    src = out / f"src224-{count}"
    if not (src / f".done-{count}").exists():
        make_sample.make_image_folder(src, classes=10, per_class=count // 10, seed=0, min_size=224,
                                      max_size=256, formats=("jpeg",))
        (src / f".done-{count}").write_text("ok")
    raw = ensure_small_packed(src, out / f"raw224-{count}", "raw:size=224x224", 2)
    warm(raw)
    result = {f"reads_{k}": v for k, v in raw_reads(raw, batch, threads).items()}
    from packer.dataset import open_dataset
    from packer.rawcrop import raw_shape_of, read_raw_batch

    dataset = open_dataset(raw)
    shape = raw_shape_of(dataset)
    indices = np.random.default_rng(0).integers(0, len(dataset), 64)
    pixels = read_raw_batch(dataset, indices, shape)
    transform = RandomResizedCrop(224, seed=0, resize_backend="torch")

    def per_sample() -> int:
        for k, i in enumerate(indices.tolist()):
            transform(pixels[k], 7, index=i)
        return len(indices)

    def batched() -> int:
        transform.batch(pixels, indices)
        return len(indices)

    result["rrc224_per_sample_images_per_s"] = median_rate(per_sample)
    result["rrc224_batched_images_per_s"] = median_rate(batched)
    return result


# --- main -----------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=50_000)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--per-round", type=int, default=None,
                        help="images timed per loader per round (default: one epoch, at most 50,000)")
    parser.add_argument("--out", type=Path, default=Path("bench-out/small"))
    parser.add_argument("--raw224", type=int, default=0, help="also measure N raw 224x224 samples")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    import torch

    out = args.out
    src = out / f"src{args.size}-{args.images}"
    print(f"writing {args.images} {args.size}x{args.size} PNGs to {src} ...", file=sys.stderr)
    ensure_small_images(src, args.images, args.size)
    passthrough = ensure_small_packed(src, out / f"pass{args.size}-{args.images}", "passthrough", 2)
    raw = ensure_small_packed(src, out / f"raw{args.size}-{args.images}", f"raw:size={args.size}x{args.size}", 2)
    for folder in (src, passthrough, raw):
        warm(folder)
    emulated = not have_torchvision()
    size, batch, workers, threads = args.size, args.batch_size, args.workers, args.threads
    per_round = args.per_round or min(args.images, 50_000)
    runs = [
        ("imagefolder" + (" (emulated)" if emulated else ""),
         lambda: loader_imagefolder(src, workers, batch, size)),
        (f"packer pass-through, {workers} workers", lambda: loader_packer_default(passthrough, workers, batch, size)),
        (f"packer raw batched, {workers} workers", lambda: loader_packer_default(raw, workers, batch, size)),
        ("packer raw batched, main process", lambda: loader_packer_default(raw, 0, batch, size)),
        (f"packer raw threaded, {threads} threads", lambda: loader_threaded(raw, threads, batch, size)),
    ]
    print(f"training-style loaders, RandomResizedCrop({size}) + flip, batch {batch}:", file=sys.stderr)
    load_before = harness.machine_load()
    table = training_table(runs, rounds=args.rounds, images=per_round, warmup=2)
    reads = raw_reads(raw, batch, threads)
    stages = {"raw batched": stages_raw(raw, batch, size),
              "imagefolder": stages_imagefolder(src, batch, size)}
    extra = raw224(out, args.raw224, 256, threads) if args.raw224 else None

    load_after = harness.machine_load()
    disk = {name: sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
            for name, path in (("png files", src), ("pass-through", passthrough), ("raw", raw))}
    print(f"\n{args.images:,} {size}x{size} PNGs, RandomResizedCrop({size}) + flip, uint8, batch {batch}, "
          f"random order, {args.rounds} interleaved rounds (median), {os.cpu_count()} cores, "
          f"torch {torch.__version__} ({torch.get_num_threads()} intra-op threads)")
    print(f"machine load (1-min load average; CPU pressure, share of time some task waited for a core): "
          f"before {load_before['loadavg_1m']:.2f} / {load_before['cpu_pressure_avg60']}, after "
          f"{load_after['loadavg_1m']:.2f} / {load_after['cpu_pressure_avg60']} (other work on the machine)")
    print(harness.table(table, unit="images", name_width=40))
    print(f"\nraw batch reads (no augmentation), random batches of {batch}:")
    print(f"  memcpy of the same bytes   {reads['memcpy_samples_per_s']:>14,.0f} samples/s "
          f"{reads['memcpy_gb_per_s']:6.2f} GB/s (one buffer, cache-resident)")
    print(f"  random rows, anonymous mem {reads['random_rows_samples_per_s']:>14,.0f} samples/s "
          f"{reads['random_rows_gb_per_s']:6.2f} GB/s (the same rows, no file, 4 KB pages: the gather's floor)")
    print(f"  read_raw_batch, 1 thread   {reads['read_raw_batch_samples_per_s']:>14,.0f} samples/s "
          f"{reads['read_raw_batch_gb_per_s']:6.2f} GB/s "
          f"({reads['read_raw_batch_samples_per_s'] / reads['memcpy_samples_per_s']:.2f}x memcpy, "
          f"{reads['read_raw_batch_samples_per_s'] / reads['random_rows_samples_per_s']:.2f}x random rows)")
    print(f"  ThreadedLoader, {threads} threads  {reads['threaded_samples_per_s']:>14,.0f} samples/s "
          f"{reads['threaded_gb_per_s']:6.2f} GB/s")
    print(f"\nwhere the time goes, ms per batch of {batch}:")
    for name, parts in stages.items():
        print(f"  {name:<12} " + ", ".join(f"{k} {v:.2f}" for k, v in parts.items())
              + f"  (total {sum(parts.values()):.2f})")
    print(f"\ndisk: " + ", ".join(f"{k} {v / 1e6:,.1f} MB" for k, v in disk.items()))
    if extra:
        print(f"\nraw 224x224 ({args.raw224} samples), random batches of 256:")
        print(f"  memcpy {extra['reads_memcpy_gb_per_s']:.2f} GB/s, read_raw_batch "
              f"{extra['reads_read_raw_batch_gb_per_s']:.2f} GB/s "
              f"({extra['reads_read_raw_batch_gb_per_s'] / extra['reads_memcpy_gb_per_s']:.2f}x), "
              f"ThreadedLoader {extra['reads_threaded_gb_per_s']:.2f} GB/s")
        print(f"  RandomResizedCrop(224): per-sample {extra['rrc224_per_sample_images_per_s']:,.0f} "
              f"images/s, batched {extra['rrc224_batched_images_per_s']:,.0f} images/s")
    best_raw = max(row.ratio for row in table if "raw" in row.name)
    print(f"\ntargets: raw >= {TARGETS['raw_vs_imagefolder']:.0f}x ImageFolder: {best_raw:.1f}x "
          f"{'PASS' if best_raw >= TARGETS['raw_vs_imagefolder'] else 'FAIL'}; raw batch reads >= "
          f"{TARGETS['raw_batch_reads_per_s']:,}/s: {reads['read_raw_batch_samples_per_s']:,.0f} "
          f"{'PASS' if reads['read_raw_batch_samples_per_s'] >= TARGETS['raw_batch_reads_per_s'] else 'FAIL'}")
    if args.json:
        args.json.write_text(json.dumps({"table": [row.as_dict() for row in table], "reads": reads, "stages": stages, "disk": disk,
                                         "raw224": extra, "emulated_imagefolder": emulated,
                                         "load": {"before": load_before, "after": load_after},
                                         "machine": platform.platform(), "args": vars(args)},
                                        default=str, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
