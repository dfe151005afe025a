"""Benchmarks the shard backends (mmap, pread, direct) against each other in one run, as ratios.

Usage::

    python benchmarks/bench_backends.py [--out bench-out/backends] [--samples 2000] [--size-kb 110]
        [--codec passthrough] [--batch-size 256] [--block 64] [--chunk 8M] [--repeats 2]
        [--modes chunks,sequential,block,random] [--backends mmap,pread,direct] [--threads 1,4]
        [--drop-caches] [--json]

It builds (once, reused on later runs) a dataset of ``--samples`` JPEGs of about ``--size-kb``
KiB, then times, for each backend:

* ``chunks``: every shard read front to back in ``--chunk`` blocks (``read_into`` into a
  4 KiB-aligned buffer): the raw byte-moving speed, what a GPU loader's big block reads see;
* ``sequential``: ``Dataset.read_batch`` over consecutive batches (one coalesced read per batch);
* ``block``: block-shuffled order, blocks of ``--block`` consecutive samples in random order
  (shuffled inside the block), ``--batch-size`` per batch: a few coalesced reads per batch;
* ``random``: fully shuffled order: one read per sample.

``--threads 1,4`` repeats everything with that many reader threads (each with its own
``Dataset``, like DataLoader workers): O_DIRECT reads are synchronous, with no read-ahead, so
one reader waits on every request while several keep the device busy.

Each measurement runs *cold* (the shards' pages evicted from the page cache first, with
``posix_fadvise(DONTNEED)`` on every shard, or the whole cache with ``--drop-caches``, root only)
and *warm* (every shard read once before). ``direct`` never uses the page cache, so its cold and
warm numbers differ only by device-side caching. The residency of the shards in the page cache
before each run is measured with ``mincore`` and printed. The backends of one mode and cache
state run in ``--repeats`` interleaved rounds (``harness.interleave``); ratios (median MB/s, CPU
per MB) are against ``mmap`` in the same mode and cache state of the same run; absolute MB/s
depend on the disk and the machine's load.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import mmap
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

import harness

MODES = ("chunks", "sequential", "block", "random")
BACKENDS = ("mmap", "pread", "direct")


def parse_bytes(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


# --- page cache control ---------------------------------------------------------------------

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]


def resident_fraction(paths: list[Path]) -> float:
    """Fraction of the files' pages present in the page cache (``mincore``)."""
    page = mmap.PAGESIZE
    resident = total = 0
    for path in paths:
        size = path.stat().st_size
        if not size:
            continue
        with open(path, "rb") as handle, mmap.mmap(handle.fileno(), size, prot=mmap.PROT_READ) as mapping:
            pages = (size + page - 1) // page
            vector = (ctypes.c_ubyte * pages)()
            view = memoryview(mapping)
            try:
                # A read-only mapping cannot give its address through from_buffer; ask numpy instead.
                array = np.frombuffer(view, dtype=np.uint8)
                result = _libc.mincore(ctypes.c_void_p(array.ctypes.data), ctypes.c_size_t(size), vector)
                del array
            finally:
                view.release()
            if result != 0:
                return float("nan")
            resident += sum(byte & 1 for byte in vector)
            total += pages
    return resident / total if total else 0.0


def warm(paths: list[Path]) -> None:
    buffer = bytearray(16 << 20)
    for path in paths:
        with open(path, "rb", buffering=0) as handle:
            while handle.readinto(buffer):
                pass


# --- the dataset ---------------------------------------------------------------------------------

def ensure_dataset(out: Path, samples: int, size_kb: int, codec: str) -> Path:
    """Build (or reuse) the benchmark dataset; returns its folder."""
    from packer.writer import build
    from packer.writer.plan import BuildOptions

    stamp = {"samples": samples, "size_kb": size_kb, "codec": codec, "version": 1}
    dataset = out / f"ds-{codec.replace(':', '_').replace(',', '_').replace('=', '')}"
    stamp_path = dataset / ".bench-stamp.json"
    if stamp_path.exists() and json.loads(stamp_path.read_text()) == stamp:
        return dataset
    source = out / f"src-{samples}-{size_kb}"
    if not (source / ".complete").exists():
        import make_sample  # scripts/ (on sys.path through harness)

        print(f"writing {samples} source JPEGs of ~{size_kb} KiB to {source} ...", file=sys.stderr)
        make_sample.make_big_folder(source, samples, size_kb=size_kb)
        (source / ".complete").write_text("ok\n")
    print(f"building {dataset} (codec {codec}) ...", file=sys.stderr)
    build(source, dataset, BuildOptions(codec=codec, shard_size=64 << 20), overwrite=True, progress=False)
    stamp_path.write_text(json.dumps(stamp))
    return dataset


# --- the measurements -------------------------------------------------------------------------

def batch_orders(count: int, mode: str, batch_size: int, block: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    if mode == "sequential":
        order = np.arange(count)
    elif mode == "random":
        order = rng.permutation(count)
    elif mode == "block":
        starts = rng.permutation(np.arange(0, count, block))
        order = np.concatenate([rng.permutation(np.arange(s, min(s + block, count))) for s in starts])
    else:
        raise ValueError(mode)
    return [order[i:i + batch_size] for i in range(0, count, batch_size)]


def _in_threads(threads: int, work: Callable[[int], tuple[int, int]]) -> tuple[float, int, int]:
    """Run ``work(thread_number)`` in ``threads`` threads; returns (seconds, bytes, reads)."""
    totals: list[tuple[int, int]] = [(0, 0)] * threads
    errors: list[BaseException] = []

    def body(k: int) -> None:
        try:
            totals[k] = work(k)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
            errors.append(exc)

    started = time.perf_counter()
    if threads == 1:
        body(0)
    else:
        pool = [threading.Thread(target=body, args=(k,)) for k in range(threads)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()
    seconds = time.perf_counter() - started
    if errors:
        raise errors[0]
    return seconds, sum(t[0] for t in totals), sum(t[1] for t in totals)


def run_batches(dataset_path: Path, backend: str, batches: list[np.ndarray], threads: int) -> tuple[float, int, int]:
    """Read every batch with ``Dataset.read_batch``; thread k takes batches k, k+threads, ..."""
    from packer.dataset import open_dataset

    # One Dataset per thread: its open-shard cache is per reader, like one per DataLoader worker.
    readers = [open_dataset(dataset_path, backend=backend) for _ in range(threads)]

    sizes, shard_of = readers[0].index.size, readers[0].index.shard
    stats = []  # (payload bytes, coalesced reads) of each batch, computed outside the timing
    for indices in batches:
        unique = np.unique(indices)
        runs = 1 + np.count_nonzero((np.diff(unique) != 1) | (np.diff(shard_of[unique]) != 0))
        stats.append((int(sizes[unique].sum()), int(runs) if len(unique) else 0))

    def work(k: int) -> tuple[int, int]:
        ds = readers[k]
        for indices in batches[k::threads]:
            ds.read_batch(indices)
        mine = stats[k::threads]
        return sum(s[0] for s in mine), sum(s[1] for s in mine)

    try:
        return _in_threads(threads, work)
    finally:
        for ds in readers:
            ds.close()


def run_chunks(dataset_path: Path, backend: str, chunk: int, threads: int) -> tuple[float, int, int]:
    """Read every shard front to back in ``chunk`` pieces; thread k takes pieces k, k+threads, ..."""
    from packer.dataset import open_dataset
    from packer.backends.buffers import aligned_empty

    readers = [open_dataset(dataset_path, backend=backend) for _ in range(threads)]
    pieces = [(number, offset, min(chunk, entry.size - offset))
              for number, entry in enumerate(readers[0].manifest.shards)
              for offset in range(0, entry.size, chunk)]

    def work(k: int) -> tuple[int, int]:
        ds, buffer = readers[k], aligned_empty(chunk)
        nbytes = reads = 0
        for number, offset, length in pieces[k::threads]:
            ds.shard(number).read_into(offset, buffer[:length])
            nbytes += length
            reads += 1
        return nbytes, reads

    try:
        return _in_threads(threads, work)
    finally:
        for ds in readers:
            ds.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bench-out/backends"))
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--size-kb", type=int, default=110)
    parser.add_argument("--codec", default="passthrough")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--block", type=int, default=64, help="samples per block in block-shuffled order")
    parser.add_argument("--chunk", default="8M", help="read size of the chunks mode")
    parser.add_argument("--threads", default="1", help="comma-separated reader thread counts, e.g. 1,4")
    parser.add_argument("--repeats", type=int, default=2, help="runs per measurement; the best is kept")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--drop-caches", action="store_true", help="drop the whole page cache (root) for cold runs")
    parser.add_argument("--json", action="store_true", help="print the results as one JSON document")
    args = parser.parse_args(argv)

    modes = [m for m in args.modes.split(",") if m]
    backends = [b for b in args.backends.split(",") if b]
    if "mmap" not in backends:
        backends.insert(0, "mmap")  # the baseline of every ratio
    chunk = parse_bytes(args.chunk)
    dataset = ensure_dataset(args.out, args.samples, args.size_kb, args.codec)

    from packer.dataset import open_index

    index = open_index(dataset)
    shard_paths = [dataset / entry.path for entry in index.manifest.shards]
    count = len(index)
    payload_total = int(index.index.size.sum())
    index.close()
    print(f"dataset {dataset}: {count} samples, {len(shard_paths)} shards, {payload_total / 1e6:.1f} MB payload; "
          f"uid {os.getuid()}; cold = {'drop_caches' if args.drop_caches else 'posix_fadvise(DONTNEED)'}",
          file=sys.stderr)

    thread_counts = [int(t) for t in args.threads.split(",") if t]
    results: list[dict[str, Any]] = []
    tables: list[str] = []
    for cache in ("cold", "warm"):
        if cache == "warm":
            warm(shard_paths)
        for threads in thread_counts:
            for mode in modes:
                residency: dict[str, list[float]] = {}
                rounds = iter(range(10**9))

                def one(backend: str, mode: str = mode, threads: int = threads, cache: str = cache
                        ) -> harness.Stretch:
                    if cache == "cold" and not harness.evict(shard_paths, whole_cache=args.drop_caches):
                        sys.exit("cannot evict the shards from the page cache (--drop-caches needs root)")
                    residency.setdefault(backend, []).append(resident_fraction(shard_paths))
                    if mode == "chunks":
                        work: Callable[[], tuple[float, int, int]] = lambda: run_chunks(dataset, backend, chunk,
                                                                                          threads)
                    else:
                        orders = batch_orders(count, mode, args.batch_size, args.block, seed=next(rounds))
                        work = lambda: run_batches(dataset, backend, orders, threads)  # noqa: E731
                    measured: dict[str, Any] = {}

                    def body() -> dict[str, Any]:
                        seconds, nbytes, reads = work()
                        measured.update(bytes=nbytes, reads=reads)
                        return {"items": nbytes / 1e6, "reads": reads}
                    return harness.measure(body)

                stretches = harness.interleave([(backend, lambda b=backend: one(b)) for backend in backends],
                                               args.repeats, log=None)
                rows = harness.summarize(stretches, baseline="mmap")
                tables.append(f"{cache}, {threads} thread(s), {mode}:\n" + harness.table(
                    rows, unit="MB", name_width=8, columns=[
                        ("reads", lambda row: f"{row.extra.get('reads', 0):,}"),
                        ("cached before", lambda row: f"{min(residency[row.name]):.0%}")]))
                for row in rows:
                    results.append({"cache": cache, "threads": threads, "mode": mode, "backend": row.name,
                                    "mb_per_s": row.rate, "cpu_ms_per_mb": row.cpu_ms, "reads": row.extra.get("reads"),
                                    "resident_before": min(residency[row.name]), "ratio_vs_mmap": row.ratio,
                                    "cpu_ratio_vs_mmap": row.cpu_ratio})

    if args.json:
        print(json.dumps({"dataset": str(dataset), "samples": count, "shards": len(shard_paths),
                          "payload_bytes": payload_total, "batch_size": args.batch_size, "block": args.block,
                          "chunk": chunk, "results": results}, indent=2, sort_keys=True))
    else:
        print("\n\n".join(tables))
    return 0


if __name__ == "__main__":
    sys.exit(main())
