"""Does ``packer verify`` run as fast as reading the shards? Time it against plain reads, same run.

    python benchmarks/bench_verify.py [--images 3000] [--size-kb 110] [--workers N] [--rounds 3] [--work DIR]

Builds (or reuses) a dataset of ~110 KB JPEGs from ``make_sample.make_big_folder`` (about 330 MB
for 3000 images), then alternates, ``--rounds`` times:

  * ``cat``: ``cat`` every shard file to /dev/null, one process (what "reading the shards" costs);
  * ``preadv``: the same reads verify issues (16 MiB ``os.preadv`` chunks) with no hashing;
  * ``verify``: ``packer.verify.verify(workers=1)``: whole-file xxh3, per-sample xxh3, padding;
  * ``cat xN`` and ``verify xN``: N shards read in parallel (N = ``--workers``), when N > 1.

Each is measured cold (the dataset's pages evicted with ``posix_fadvise(DONTNEED)``, which needs
no root and touches no other file; ``--drop-caches`` uses ``/proc/sys/vm/drop_caches`` instead
when run as root) and warm (files already in the page cache). Prints the median MB/s per mode,
CPU ms per MB, and the ratios to ``cat`` (1.0 = as fast as reading). Numbers on a shared or
virtual machine are noisy: compare the ratios, not the absolute speeds.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

import harness
import make_sample

from packer.dataset import open_index
from packer.verify import CHUNK_SIZE, verify
from packer.writer import build
from packer.writer.plan import BuildOptions


def dataset_files(folder: Path) -> list[Path]:
    with open_index(folder) as index:
        return [folder / entry.path for entry in index.manifest.shards]


def resident_fraction(files: list[Path]) -> float | None:
    """Share of the files' pages in the page cache, via util-linux ``fincore`` when present."""
    if shutil.which("fincore") is None:
        return None
    done = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES,SIZE",
                           *map(str, files)], capture_output=True, text=True)
    if done.returncode:
        return None
    resident = total = 0
    for line in done.stdout.split("\n"):
        if line.strip():
            res, size = line.split()
            resident, total = resident + int(res), total + int(size)
    return resident / total if total else None


def cat(files: list[Path], parallel: int = 1) -> None:
    subprocess.run(f"printf '%s\\0' {' '.join(repr(str(f)) for f in files)} | xargs -0 -P {parallel} -n 1 cat "
                   f"> /dev/null", shell=True, check=True)


def preadv(files: list[Path]) -> None:
    buffer = bytearray(CHUNK_SIZE)
    view = memoryview(buffer)
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            position, size = 0, os.fstat(fd).st_size
            while position < size:
                position += os.preadv(fd, [view], position)
        finally:
            os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--size-kb", type=int, default=110)
    parser.add_argument("--shard-size", type=int, default=64 << 20)
    parser.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "packer-bench-verify")
    parser.add_argument("--drop-caches", action="store_true",
                        help="evict with /proc/sys/vm/drop_caches (root; affects the whole machine)")
    args = parser.parse_args()

    source, out = args.work / f"src-{args.images}-{args.size_kb}", args.work / f"ds-{args.images}-{args.size_kb}"
    complete = source.with_name(source.name + ".complete")  # outside the source: never packed
    if not complete.exists():
        shutil.rmtree(source, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)
        make_sample.make_big_folder(source, args.images, size_kb=args.size_kb)
        complete.touch()
    if not (out / "manifest.json").exists():
        build(source, out, BuildOptions(shard_size=args.shard_size), workers=args.workers, overwrite=True,
              progress=False)
    files = dataset_files(out)
    total = sum(f.stat().st_size for f in files)
    print(f"dataset: {out} ({args.images} images, {len(files)} shards, {total / 1e6:.0f} MB); "
          f"{os.cpu_count()} CPUs; chunk {CHUNK_SIZE >> 20} MiB")

    def run_verify(workers: int) -> None:
        report = verify(out, workers=workers, progress=False)
        if not report.ok:
            raise SystemExit(f"verify found problems in the benchmark dataset: {report.problems[:3]}")

    modes: dict[str, Callable[[], None]] = {"cat": lambda: cat(files), "preadv": lambda: preadv(files),
                                            "verify": lambda: run_verify(1)}
    if args.workers > 1 and len(files) > 1:
        modes[f"cat x{args.workers}"] = lambda: cat(files, args.workers)
        modes[f"verify x{args.workers}"] = lambda: run_verify(args.workers)
    residency: list[float] = []
    megabytes = total / 1e6

    def stretch(cache: str, body: Callable[[], None]) -> harness.Stretch:
        if cache == "cold":
            if not harness.evict(files, whole_cache=args.drop_caches):
                sys.exit("cannot evict the dataset from the page cache (--drop-caches needs root)")
            fraction = resident_fraction(files)
            if fraction is not None:
                residency.append(fraction)
        else:
            body()  # warm the cache (and the code path) before timing
        return harness.measure(body, items=megabytes)

    tables = {}
    for cache in ("cold", "warm"):
        results = harness.interleave([(name, lambda body=body, cache=cache: stretch(cache, body))
                                      for name, body in modes.items()], args.rounds, unit="MB")
        tables[cache] = harness.table(harness.summarize(results), unit="MB", name_width=12)
    if residency:
        print(f"after eviction, {100 * max(residency):.1f} % of the shard bytes were still cached (worst round)")
    else:
        print("fincore not found: could not confirm the eviction")
    for cache, text in tables.items():
        print(f"\n{cache} page cache, {args.rounds} rounds (median):\n{text}")
    print("(1.00x = as fast as reading the shards with cat)")


if __name__ == "__main__":
    main()
