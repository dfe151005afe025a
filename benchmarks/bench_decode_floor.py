"""The JPEG loader against its decode floor: CPU per image of each wiring over the decode and resize alone.

Usage::

    .venv/bin/python benchmarks/bench_decode_floor.py [--images 2000] [--workers 2] [--batch-size 64]
        [--rounds 3] [--codecs tiled,passthrough] [--unseeded] [--out bench-out/floor] [--json FILE]

Issue 40: take the JPEG loader's overhead per image (the crop draw, per-sample objects, collate,
the hand-off between threads or processes) to at most 10 % of its *decode floor*, and make threads
at least as fast as worker processes. What one run does, per codec of ``--codecs`` (``tiled``:
``--codec tiled``, the crop's tiles cut out and decoded; ``passthrough``: the JPEG as it came, a
whole decode at the crop's DCT scale), over ``--images`` ImageNet-like JPEGs (about 110 KB,
``make_sample.make_big_folder``; built once and reused, read once so everything runs from the
page cache), RandomResizedCrop(224) + flip to uint8, batches of ``--batch-size``:

* **the floor** (the baseline): one image after another in one thread, nothing but the work every
  wiring must do: cut the crop's tile window (``_jpegtiles.window``), decode it at the crop's DCT
  scale (simplejpeg), cut the whole-pixel crop out, resize it (torch's antialiased bilinear
  kernel, called as ``interpolate`` calls it) and flip it into its slot of a batch. The crop boxes are drawn beforehand, outside the
  timing (drawing them is overhead). Its pixels are checked equal to ``RandomResizedCrop``'s;
* the floor's images split between ``--workers`` threads running at once, no loader: what running
  decoders side by side costs on this machine (shared caches and memory, the neighbours' load),
  for reading the wirings' rows, which all decode two at a time;
* ``RandomResizedCrop`` called per sample, one thread (the fused transform's own Python: box
  draw, checks, dispatch);
* ``PackedDataset.load_batch``, one thread (``__getitems__`` decoding into one batch tensor +
  ``collate``);
* the ordinary wiring: ``DataLoader(PackedDataset, batch_sampler=PackedBatchSampler,
  collate_fn=collate)`` with ``--workers`` worker processes (persistent);
* ``PackedDataLoader(num_workers=--workers)`` as ``worker_mode="auto"`` picks it (the row says
  what it picked), and with ``worker_mode="threads"`` when that is not what auto picked;
* ``ThreadedLoader(threads=--workers)``.

Crops are seeded (``RandomResizedCrop(224, seed=0)``, epoch 0), so every row and every round
decodes exactly the same crops of the same images: the rows differ only in what they do around
the decode. ``--unseeded`` adds the default unseeded transform's rows (each process or thread
draws its own crops: the same distribution, not the same crops). torch runs one intra-op thread in
this process (``torch.set_num_threads(1)``, as DataLoader workers do and as ``bench_peers.py``
sets it), so a single-thread row is one core's work.

Rows run in ``--rounds`` interleaved rounds (``harness.interleave``); the table gives the median
round's images/s and CPU ms per image over all rounds (this process and its workers), with ratios
to the floor, and the overhead over the floor (CPU per image / floor's - 1); CPU per image is the
steadier figure on a shared machine. Targets: every wiring's overhead at most 10 % of the floor;
``ThreadedLoader`` at least as fast as the DataLoader's worker processes (images/s).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable

import harness
import make_sample
import numpy as np

TARGET_OVERHEAD = 0.10
CROP = 224
CODECS = ("tiled", "passthrough")


# --- data ---------------------------------------------------------------------------------------

def ensure_jpegs(root: Path, count: int) -> list[Path]:
    """``count`` ImageNet-like JPEGs (about 110 KB) in 10 class folders, reused when there."""
    files = sorted(root.glob("class_*/*.jpg")) if root.exists() else []
    if len(files) != count:
        for old in files:
            old.unlink()
        files = make_sample.make_big_folder(root, count, size_kb=110)
    return files


def ensure_packed(src: Path, out: Path, count: int, codec: str, workers: int) -> Path:
    """``src`` packed with ``codec`` into ``out`` (reused when a dataset of ``count`` samples is there)."""
    import packer

    manifest = out / "manifest.json"
    if manifest.exists():
        existing = json.loads(manifest.read_text())
        if (existing.get("sample_count"), existing.get("codec", {}).get("name")) == (count, codec):
            return out
    packer.build_dataset(src, out, packer.BuildSettings(codec=codec),
                         packer.RunOptions(workers=workers, overwrite=True, progress=False))
    return out


# --- the floor ----------------------------------------------------------------------------------

class Floor:
    """The decode floor of a dataset's images under a seeded ``RandomResizedCrop``.

    ``plan`` draws every image's box and flip and picks its DCT scale beforehand (what the
    transform draws for sample ``i`` at its epoch); ``run`` then does only the work: window,
    scaled decode, whole-pixel crop, antialiased resize, flip into the batch slot. The steps and
    their order are ``packer.transforms.fused``'s torch path, so the pixels are the transform's
    (``check`` says so).
    """

    def __init__(self, dataset: Any, transform: Any, indices: np.ndarray, batch_size: int) -> None:
        import simplejpeg

        from packer.transforms.fused import _dct_scale

        self.dataset, self.transform = dataset, transform
        self.out = np.empty((batch_size, *transform.output_shape), np.uint8)
        self.plans = []
        for i in indices.tolist():
            height, width = simplejpeg.decode_jpeg_header(dataset.get(i))[:2]
            box, flip = transform._draw(width, height, None, i)
            scale = _dct_scale(box[2] - box[0], box[3] - box[1], transform.size)
            self.plans.append((i, width, height, box, flip, scale))

    def run(self) -> int:
        import simplejpeg
        import torch
        import torch.nn.functional as functional

        from packer.codecs.tiles import cut_window, window_margin

        # interpolate(bilinear, antialias=True)'s own op, without its Python argument checks
        resize = getattr(torch._C._nn, "_upsample_bilinear2d_aa", None) or (
            lambda source, size, _corners, _scales: functional.interpolate(source, size=size, mode="bilinear",
                                                                           antialias=True))
        get, out, slots = self.dataset.get, self.out, len(self.out)
        out_size = self.transform.size
        for k, (i, width, height, box, flip, m) in enumerate(self.plans):
            data = get(i)
            window = cut_window(data, box, window_margin(m))
            x = y = 0
            if window is not None:
                data, x, y, width_w, height_w = window
            else:
                width_w, height_w = width, height
            scaled = {} if m == 8 else {"min_width": math.ceil(width_w * m / 8),
                                        "min_height": math.ceil(height_w * m / 8)}
            pixels = simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=True, **scaled)
            f = m / 8
            # only the decoded pixels wholly inside the image (fused.py's rule), then the whole-pixel crop
            inside_w = max(1, math.floor((width - x) * f + 1e-9))
            inside_h = max(1, math.floor((height - y) * f + 1e-9))
            pixels = pixels[:inside_h, :inside_w]
            rows, cols = pixels.shape[:2]
            x0 = min(max(int((box[0] - x) * f + 0.5), 0), cols - 1)
            y0 = min(max(int((box[1] - y) * f + 0.5), 0), rows - 1)
            x1 = min(max(int((box[2] - x) * f + 0.5), x0 + 1), cols)
            y1 = min(max(int((box[3] - y) * f + 0.5), y0 + 1), rows)
            crop = np.ascontiguousarray(pixels[y0:y1, x0:x1])  # channels-last 1xCxHxW below
            resized = resize(torch.from_numpy(crop.reshape(1, *crop.shape).transpose(0, 3, 1, 2)), out_size,
                             False, None).numpy()[0].transpose(1, 2, 0)
            if flip:
                resized = torch.flip(torch.from_numpy(resized), [1]).numpy()
            np.copyto(out[k % slots], resized)
        return len(self.plans)

    def check(self) -> bool:
        """The first batch's pixels equal ``transform(data, out=..., index=i)``'s."""
        count = min(len(self.out), len(self.plans))
        saved, self.plans = self.plans, self.plans[:count]
        try:
            self.run()
        finally:
            self.plans = saved
        expected = np.empty_like(self.out)
        for k, (i, *_rest) in enumerate(self.plans[:count]):
            self.transform(np.frombuffer(self.dataset.get(i), np.uint8), None, out=expected[k], index=i)
        return bool(np.array_equal(expected[:count], self.out[:count]))


def parallel_floor(floor: Floor, threads: int) -> Callable[[], int]:
    """The floor's images split between ``threads`` threads running at once: what running that many
    decoders side by side costs on this machine (shared caches, memory, the neighbours' load),
    with no loader around them."""
    import threading

    parts = []
    for k in range(threads):
        part = Floor.__new__(Floor)
        part.dataset, part.transform = floor.dataset, floor.transform
        part.out, part.plans = np.empty_like(floor.out), floor.plans[k::threads]
        parts.append(part)

    def run() -> int:
        workers = [threading.Thread(target=part.run) for part in parts]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        return sum(len(part.plans) for part in parts)
    return run


# --- the wirings ----------------------------------------------------------------------------------

def per_sample(dataset: Any, transform: Any, indices: np.ndarray, batch_size: int) -> Callable[[], int]:
    """``transform(bytes, format, out=slot, index=i)`` for each image, one thread."""
    out = np.empty((batch_size, *transform.output_shape), np.uint8)
    formats = dataset.index.image_format

    def run() -> int:
        for k, i in enumerate(indices.tolist()):
            transform(np.frombuffer(dataset.get(i), np.uint8), int(formats[i]), out=out[k % batch_size], index=i)
        return len(indices)
    return run


def load_batches(packed: Any, indices: np.ndarray, batch_size: int) -> Callable[[], int]:
    """``PackedDataset.load_batch`` of each batch of ``indices``, one thread."""
    def run() -> int:
        seen = 0
        for begin in range(0, len(indices), batch_size):
            seen += len(packed.load_batch(indices[begin:begin + batch_size])[1])
        return seen
    return run


def epochs(loader: Any) -> Callable[[], int]:
    """One epoch of ``loader`` (its batches counted); the first epoch runs once outside the timing,
    so persistent workers and pools start before the rounds."""
    def run() -> int:
        return sum(len(labels) for _, labels in loader)
    run()
    return run


def wirings(path: Path, args: argparse.Namespace, decode: Callable[[], Any]) -> list[tuple[str, Callable[[], int]]]:
    from torch.utils.data import DataLoader

    from packer import ReadOrder
    from packer.threaded import ThreadedLoader
    from packer.torch import PackedBatchSampler, PackedDataLoader, PackedDataset, collate

    workers, batch = args.workers, args.batch_size
    order = ReadOrder("random", seed=0)
    rows: list[tuple[str, Callable[[], int]]] = []
    dataset = PackedDataset(path, decode=decode())
    rows.append((f"DataLoader + PackedBatchSampler + collate, {workers} processes",
                 epochs(DataLoader(dataset, batch_sampler=PackedBatchSampler(dataset, batch_size=batch, order=order),
                                   collate_fn=collate, num_workers=workers, persistent_workers=True))))
    auto = PackedDataLoader(PackedDataset(path, decode=decode()), batch_size=batch, order=order,
                            num_workers=workers, persistent_workers=True)
    rows.append((f"PackedDataLoader auto ({workers} {auto.worker_mode})", epochs(auto)))
    if auto.worker_mode != "threads":
        try:
            threads = PackedDataLoader(PackedDataset(path, decode=decode()), batch_size=batch, order=order,
                                       num_workers=workers, worker_mode="threads")
        except Exception as exc:  # noqa: BLE001 - a version that refuses threads for JPEGs says why
            print(f"PackedDataLoader(worker_mode='threads') refused: {exc}", file=sys.stderr)
        else:
            rows.append((f"PackedDataLoader, {workers} threads", epochs(threads)))
    rows.append((f"ThreadedLoader, {workers} threads",
                 epochs(ThreadedLoader(path, batch_size=batch, order=order, threads=workers, decode=decode(),
                                       layout="CHW"))))
    return rows


def candidates(path: Path, args: argparse.Namespace) -> tuple[list[tuple[str, Callable[[], int]]], bool]:
    from packer.dataset import open_dataset
    from packer.torch import PackedDataset
    from packer.transforms import RandomResizedCrop

    dataset = open_dataset(path)
    indices = np.random.default_rng(0).permutation(len(dataset))
    floor = Floor(dataset, RandomResizedCrop(CROP, seed=0), indices, args.batch_size)
    identical = floor.check()
    rows = [("floor: window + decode + resize + flip, 1 thread", floor.run),
            (f"floor, {args.workers} threads at once (no loader)", parallel_floor(floor, args.workers)),
            ("RandomResizedCrop per sample, 1 thread",
             per_sample(dataset, RandomResizedCrop(CROP, seed=0), indices, args.batch_size)),
            ("PackedDataset.load_batch, 1 thread",
             load_batches(PackedDataset(path, decode=RandomResizedCrop(CROP, seed=0)), indices, args.batch_size))]
    rows += wirings(path, args, lambda: RandomResizedCrop(CROP, seed=0))
    if args.unseeded:
        rows += [(f"{name} (unseeded)", run) for name, run in wirings(path, args, lambda: RandomResizedCrop(CROP))]
    return rows, identical


# --- report -------------------------------------------------------------------------------------

def overhead(row: harness.Row) -> str:
    return f"{100 * (row.cpu_ratio - 1):+.1f} %"


def report(codec: str, rows: list[harness.Row], identical: bool) -> tuple[list[str], dict[str, Any]]:
    floor = rows[0]
    lines = [harness.table(rows, unit="images", name_width=62, columns=[("over floor", overhead)]),
             f"floor: {floor.cpu_ms:.3f} CPU ms/image; its pixels equal RandomResizedCrop's: "
             f"{'yes' if identical else 'NO'}"]
    wiring_rows = [row for row in rows[1:] if "1 thread" not in row.name and "unseeded" not in row.name
                   and not row.name.startswith("floor")]
    worst = max(wiring_rows, key=lambda row: row.cpu_ratio)
    met = worst.cpu_ratio - 1 <= TARGET_OVERHEAD
    lines.append(f"largest overhead of a wiring: {overhead(worst)} ({worst.name}); target at most "
                 f"{100 * TARGET_OVERHEAD:.0f} %: {'met' if met else 'NOT met'}")
    processes = next(row for row in rows if row.name.startswith("DataLoader + "))
    threaded = next(row for row in rows if row.name.startswith("ThreadedLoader") and "unseeded" not in row.name)
    faster = threaded.rate >= processes.rate
    lines.append(f"ThreadedLoader / DataLoader processes: {threaded.rate / processes.rate:.2f}x images/s, "
                 f"{threaded.cpu_ms / processes.cpu_ms:.2f}x CPU per image; target at least 1.00x images/s: "
                 f"{'met' if faster else 'NOT met'}")
    summary = {"codec": codec, "floor_cpu_ms": floor.cpu_ms, "floor_pixels_identical": identical,
               "rows": [row.as_dict() for row in rows], "overhead_target_met": met,
               "threads_target_met": faster}
    return lines, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=2, help="worker processes, and threads")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--codecs", default=",".join(CODECS), help="tiled, passthrough, or both")
    parser.add_argument("--unseeded", action="store_true", help="also the unseeded transform's wirings")
    parser.add_argument("--out", type=Path, default=Path("bench-out/floor"))
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    codecs = [codec for codec in args.codecs.split(",") if codec]
    if not codecs or set(codecs) - set(CODECS):
        parser.error(f"--codecs takes {', '.join(CODECS)}")

    import torch

    import packer
    torch.set_num_threads(1)  # as in a DataLoader worker: one core per decoding thread
    command = " ".join([os.path.relpath(sys.executable), *sys.argv])
    print(f"command: {command}\npacker: {Path(packer.__file__).parent}", file=sys.stderr)
    src = args.out / "src"
    files = ensure_jpegs(src, args.images)
    mean_kb = sum(f.stat().st_size for f in files) / len(files) / 1024
    results: dict[str, Any] = {"command": command, "images": args.images, "mean_kb": mean_kb,
                               "workers": args.workers, "batch_size": args.batch_size, "rounds": args.rounds,
                               "python": platform.python_version(), "torch": torch.__version__, "codecs": []}
    before = harness.machine_load()
    failed = False
    for codec in codecs:
        path = ensure_packed(src, args.out / codec, args.images, codec, args.workers)
        harness.warm(p for p in path.rglob("*") if p.is_file())
        rows, identical = candidates(path, args)
        print(f"\n== {codec}: {args.images} JPEGs of {mean_kb:.0f} KB, RandomResizedCrop({CROP}) + flip -> uint8, "
              f"batch {args.batch_size}, one epoch per round", file=sys.stderr)
        started = time.perf_counter()
        measured = harness.summarize(harness.interleave(
            [(name, lambda run=run: harness.measure(run)) for name, run in rows], args.rounds, unit="images"))
        lines, summary = report(codec, measured, identical)
        summary["seconds"] = time.perf_counter() - started
        results["codecs"].append(summary)
        print(f"\n{codec} ({args.images} images, {args.rounds} rounds):")
        print("\n".join(lines))
        failed |= not identical
    after = harness.machine_load()
    print(harness.describe_load(before, after))
    results["load_before"], results["load_after"] = before, after
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, sort_keys=True))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
