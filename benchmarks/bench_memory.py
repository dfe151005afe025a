"""Measures DataLoader worker memory of packer's readers against an ImageFolder baseline, as ratios.

Usage::

    python benchmarks/bench_memory.py [--out bench-out/memory] [--samples 1000000] [--small 1000]
        [--workers 2] [--iterate 512] [--batch-size 32] [--json]

What it does, in one run:

1. Synthesises two datasets cheaply, written directly in the packer format (no per-file build):
   ``--small`` and ``--samples`` copies of one tiny real JPEG (8x8, ~350 bytes), alignment 1,
   1000 classes, keys like ``class_042/img_0001234.jpg``. Reused on later runs.
2. For each reader and size, in a fresh child process (so the parents do not share anything):
   builds the dataset object as a training script would, starts a ``DataLoader`` with
   ``--workers`` persistent worker processes (fork), iterates ``--iterate`` samples (the same
   random positions for every reader), then reads every live worker's ``/proc/<pid>/smaps``
   (see the columns below).
3. Readers: ``PackedDataset`` (map-style, batched ``__getitems__``), ``PackedIterableDataset``
   (random order) and an **emulation of torchvision's ImageFolder**: torchvision is not
   installable beside the CPU torch here, so ``ImageFolderLike`` reproduces what
   ``torchvision.datasets.ImageFolder`` holds and does per sample: ``self.samples``, a Python
   list of ``(path, class_index)`` tuples built with ``os.path.join`` (plus ``self.targets``, a
   list of ints, and ``self.imgs`` aliasing ``samples``), and ``__getitem__`` that looks up
   ``self.samples[i]``, opens the file with PIL, converts to RGB (``default_loader``) and turns
   it into a CHW uint8 tensor (``PILToTensor``). Only the files the workers visit are created
   (hard links to the one JPEG), so the 1M-entry list points at real files where it is read.
4. Each reader runs twice: ``iterate`` (just the samples), and ``iterate+epoch`` where each
   worker first makes the per-sample Python lookups of its share of a *whole epoch* (what each
   ``__getitem__`` does before opening the image: ``samples[i]`` for ImageFolder, the index rows
   for packer; ``worker_init_fn``). That is what a worker has done by the end of every epoch,
   minus the image I/O: in a forked worker, each ``samples[i]`` bumps the refcounts of a tuple
   and a string inherited from the parent, which copies their pages (copy-on-read, the classic
   ImageFolder memory growth), while numpy index rows are read from a shared file mapping and
   copy nothing. (A full ``gc.collect()`` in a worker adds ~30 MiB to every reader alike, from
   torch's own objects; CPython untracks tuples of strings and ints, so the collector does not
   copy ``samples`` by itself.)
5. Times ``open_dataset`` on the large dataset (warm page cache; median of 5 rounds,
   ``harness``), and prints the
   pickled size of each dataset object.

Columns: ``own`` is the worker's private *anonymous* memory (heap, Python objects, pages copied
on write from the parent): what the worker alone costs, and the number an ImageFolder list
grows. ``USS`` is the kernel's private total, which also counts page-cache pages of files no
other process maps at the moment: shard bytes read through a mapping (on recent kernels a fault
maps a whole large folio, so with these 350-byte samples a few hundred random reads map most of
a shard). ``PSS`` splits shared pages (libraries, the index, shard page cache) among their users.

Ratios are within this run: packer large vs small (growth per worker, should be ~1x), and
ImageFolder vs packer at the large size.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import harness
from synthetic import CLASSES, make_synthetic_dataset, sample_key, tiny_jpeg

__all__ = ["tiny_jpeg", "make_synthetic_dataset", "ImageFolderLike", "worker_memory", "measure", "main"]


class ImageFolderLike:
    """What ``torchvision.datasets.ImageFolder`` holds and does per sample (see the module docstring)."""

    def __init__(self, root: str, num_samples: int, classes: int = CLASSES) -> None:
        import PIL.Image  # noqa: F401  (torchvision imports PIL with the module, before any fork)

        self.root = root
        self.classes = [f"class_{c:03d}" for c in range(classes)]
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        # DatasetFolder.make_dataset: one (os.path.join(root, class, fname), class_index) per file.
        self.samples = [(os.path.join(root, sample_key(i, i % classes)), i % classes) for i in range(num_samples)]
        self.targets = [s[1] for s in self.samples]
        self.imgs = self.samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        import torch
        from PIL import Image

        path, target = self.samples[index]
        with open(path, "rb") as handle:  # torchvision.datasets.folder.pil_loader
            img = Image.open(handle).convert("RGB")
        return torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1), target  # PILToTensor


def worker_memory(pid: int) -> dict[str, int]:
    """A process's memory from ``/proc/<pid>/smaps``, in bytes.

    Returns:
        ``rss``; ``pss``; ``uss`` (private clean + private dirty, the kernel's definition, which
        also counts page-cache pages of files that no other process maps at the moment: shard
        bytes read through a mapping); ``own``: private *anonymous* memory, what the process
        alone costs (heap, Python objects, pages copied on write from the parent), excluding
        page cache and shared-memory batches in transit.
    """
    totals = {"rss": 0, "pss": 0, "uss": 0, "own": 0}
    current: dict[str, int] = {}
    name = ""

    def close_mapping() -> None:
        private = current.get("Private_Clean", 0) + current.get("Private_Dirty", 0)
        totals["uss"] += private
        if not name or name.startswith("[heap]") or name.startswith("[stack") or name.startswith("[anon"):
            totals["own"] += private
        else:  # a file mapping: only its copied-on-write (anonymous) pages are the process's own
            totals["own"] += min(private, current.get("Anonymous", 0))

    with open(f"/proc/{pid}/smaps") as handle:
        for line in handle:
            parts = line.split()
            if not parts:
                continue
            if not parts[0].endswith(":"):  # a mapping header: "start-end perms offset dev inode [path]"
                if current:
                    close_mapping()
                current = {}
                name = " ".join(parts[5:]) if len(parts) > 5 else ""
            elif len(parts) >= 3 and parts[2] == "kB":
                key = parts[0][:-1]
                current[key] = int(parts[1]) * 1024
                if key in ("Rss", "Pss"):
                    totals[key.lower()] += current[key]
    if current:
        close_mapping()
    return totals


def _touch_epoch_share(worker_id: int) -> None:
    """Do the per-sample lookups of this worker's share of a whole epoch (no image I/O).

    ``worker_init_fn`` of the ``epoch`` scenario: exactly the Python-level accesses each
    ``__getitem__`` makes before opening the image (``samples[i]`` for ImageFolder, the index
    rows for packer), for every sample a worker serves in an epoch with ``--workers`` workers.
    """
    import torch.utils.data as data

    info = data.get_worker_info()
    dataset = info.dataset
    if isinstance(dataset, ImageFolderLike):
        samples = dataset.samples
        for i in range(worker_id, len(samples), info.num_workers):
            path, target = samples[i]
    else:
        ix = dataset.dataset.index
        shard, offset, size, label = ix.shard, ix.offset, ix.size, ix.label
        for i in range(worker_id, len(offset), info.num_workers):
            shard[i], offset[i], size[i], label[i]


def visit_positions(num_samples: int, count: int, seed: int = 0) -> list[int]:
    """The random sample positions every reader visits (same spread for every size)."""
    rng = np.random.Generator(np.random.PCG64(seed))
    return rng.choice(num_samples, size=min(count, num_samples), replace=False).tolist()


def measure(kind: str, path: str, num_samples: int, *, workers: int, iterate: int, batch_size: int,
            epoch_access: bool) -> dict[str, Any]:
    """Run one reader in this process and measure its workers (see the module docstring)."""
    import torch
    import torch.utils.data as data

    from packer import ReadOrder
    from packer.torch import PackedDataset, PackedIterableDataset, collate

    positions = visit_positions(num_samples, iterate)
    init = _touch_epoch_share if epoch_access else None
    if kind == "packer":
        dataset: Any = PackedDataset(path)
        loader = data.DataLoader(dataset, sampler=positions, batch_size=batch_size, num_workers=workers,
                                 collate_fn=collate, persistent_workers=True, worker_init_fn=init)
    elif kind == "packer-iterable":
        dataset = PackedIterableDataset(path, batch_size=batch_size, order=ReadOrder("random", seed=0))
        loader = data.DataLoader(dataset, batch_size=None, num_workers=workers, persistent_workers=True,
                                 worker_init_fn=init)
    elif kind == "imagefolder":
        dataset = ImageFolderLike(path, num_samples)
        loader = data.DataLoader(dataset, sampler=positions, batch_size=batch_size, num_workers=workers,
                                 persistent_workers=True, worker_init_fn=init)
    else:
        raise ValueError(kind)
    pickled = len(pickle.dumps(dataset))
    iterator = iter(loader)
    seen = 0
    for images, _labels in iterator:
        seen += len(images)
        if seen >= iterate:
            break
    time.sleep(0.2)
    workers_memory = [worker_memory(w.pid) for w in iterator._workers]  # private API: fine for a bench
    parent = worker_memory(os.getpid())
    del iterator, loader
    return {"kind": kind, "num_samples": num_samples, "epoch": epoch_access, "seen": seen, "pickled_bytes": pickled,
            "parent": parent, "workers": workers_memory,
            "worker_uss": float(np.mean([w["uss"] for w in workers_memory])),
            "worker_own": float(np.mean([w["own"] for w in workers_memory])),
            "worker_pss": float(np.mean([w["pss"] for w in workers_memory]))}


def _prepare_imagefolder(root: Path, num_samples: int, payload: bytes, iterate: int) -> None:
    """Create the files the workers will visit: hard links to one JPEG."""
    root.mkdir(parents=True, exist_ok=True)
    source = root / "image.jpg"
    if not source.exists():
        source.write_bytes(payload)
    for i in visit_positions(num_samples, iterate):
        path = root / sample_key(i, i % CLASSES)
        if not path.exists():
            path.parent.mkdir(exist_ok=True)
            os.link(source, path)


def _time_open(path: Path, repeats: int = 5) -> float:
    """Median seconds of ``open_dataset`` + ``close`` over ``repeats`` rounds."""
    from packer.dataset import open_dataset

    results = harness.interleave([("open", lambda: harness.measure(lambda: open_dataset(path).close(), items=1))],
                                 repeats, log=None)
    return 1 / harness.summarize(results)[0].rate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench-out/memory")
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--small", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--iterate", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--kinds", default="packer,packer-iterable,imagefolder")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", nargs=4, metavar=("KIND", "PATH", "N", "GC"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        kind, path, count, epoch_access = args.child
        result = measure(kind, path, int(count), workers=args.workers, iterate=args.iterate,
                         batch_size=args.batch_size, epoch_access=epoch_access == "1")
        print(json.dumps(result))
        return 0

    out = Path(args.out)
    payload = tiny_jpeg()
    sizes = sorted({args.small, args.samples})
    paths: dict[tuple[str, int], Path] = {}
    for count in sizes:
        started = time.perf_counter()
        paths[("packer", count)] = make_synthetic_dataset(out / f"packed-{count}", count, payload)
        paths[("imagefolder", count)] = out / f"imagefolder-{count}"
        _prepare_imagefolder(paths[("imagefolder", count)], count, payload, args.iterate)
        print(f"dataset of {count} samples ready in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    open_seconds = _time_open(paths[("packer", max(sizes))])

    results = []
    for kind in args.kinds.split(","):
        for count in sizes:
            for epoch_access in (False, True):
                path = paths[("imagefolder" if kind == "imagefolder" else "packer", count)]
                command = [sys.executable, __file__, "--workers", str(args.workers), "--iterate", str(args.iterate),
                           "--batch-size", str(args.batch_size), "--child", kind, str(path), str(count),
                           "1" if epoch_access else "0"]
                done = subprocess.run(command, check=True, capture_output=True, text=True)
                results.append(json.loads(done.stdout.strip().splitlines()[-1]))
                print(f"measured {kind} n={count} epoch={epoch_access}", file=sys.stderr)

    def pick(kind: str, count: int, epoch_access: bool) -> dict[str, Any] | None:
        for r in results:
            if r["kind"] == kind and r["num_samples"] == count and r["epoch"] == epoch_access:
                return r
        return None

    mib = 1 << 20
    big, small = max(sizes), min(sizes)
    summary: dict[str, Any] = {"open_dataset_seconds": open_seconds, "results": results, "ratios": {}}
    report = sys.stderr if args.json else sys.stdout  # --json: one JSON document on stdout, the table on stderr
    print(f"\nworker memory: {args.workers} workers, {args.iterate} samples visited, batch {args.batch_size}",
          file=report)
    print("per worker (mean): own = private anonymous memory, USS = all private pages, PSS", file=report)
    print(f"{'reader':<16}{'samples':>9}{'epoch':>7}{'own':>10}{'USS':>10}{'PSS':>10}{'parent PSS':>12}"
          f"{'pickled':>11}", file=report)
    for r in results:
        print(f"{r['kind']:<16}{r['num_samples']:>9}{'yes' if r['epoch'] else 'no':>7}"
              f"{r['worker_own'] / mib:>8.1f}Mi{r['worker_uss'] / mib:>8.1f}Mi{r['worker_pss'] / mib:>8.1f}Mi"
              f"{r['parent']['pss'] / mib:>10.1f}Mi{r['pickled_bytes']:>10}B", file=report)
    print(file=report)
    for epoch_access in (False, True):
        tag = "iterate+epoch" if epoch_access else "iterate"
        for kind in args.kinds.split(","):
            a, b = pick(kind, big, epoch_access), pick(kind, small, epoch_access)
            if a and b:
                summary["ratios"][f"{kind} {tag} own {big}/{small}"] = a["worker_own"] / b["worker_own"]
                print(f"[{tag}] {kind}: per worker, {big} vs {small} samples: "
                      f"own x{a['worker_own'] / b['worker_own']:.2f} "
                      f"({(a['worker_own'] - b['worker_own']) / mib:+.1f} MiB); USS "
                      f"{(a['worker_uss'] - b['worker_uss']) / mib:+.1f} MiB", file=report)
        p, f = pick("packer", big, epoch_access), pick("imagefolder", big, epoch_access)
        if p and f:
            summary["ratios"][f"imagefolder/packer {tag} own {big}"] = f["worker_own"] / p["worker_own"]
            print(f"[{tag}] ImageFolder-like / PackedDataset at {big} samples, per worker: own "
                  f"x{f['worker_own'] / p['worker_own']:.2f} ({(f['worker_own'] - p['worker_own']) / mib:+.1f} MiB), "
                  f"PSS x{f['worker_pss'] / p['worker_pss']:.2f}; parent PSS "
                  f"x{f['parent']['pss'] / p['parent']['pss']:.2f}", file=report)
    print(f"\nopen_dataset on {big} samples: {open_seconds * 1000:.1f} ms (median of 5, warm cache; "
          f"{'OK' if open_seconds < 0.1 else 'OVER'} the 100 ms budget)", file=report)
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
