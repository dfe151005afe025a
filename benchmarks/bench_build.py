"""Is pass-through packing I/O-bound? Time ``packer build`` against plainly reading every source file.

    python benchmarks/bench_build.py [--images 3000] [--size-kb 110] [--workers N] [--rounds 2] [--work DIR]

In one run: make (or reuse) a folder of ~110 KB JPEGs, then, in ``--rounds`` interleaved rounds
(``harness.interleave``), with the page cache warm (and, as root, which can drop the page cache,
cold as well):
  1. baselines: ``cat`` every file (read only), and ``cat`` them all into one file + fsync (the
     I/O floor of any packer: read every byte once, write it once, durably),
  2. ``packer build`` (pass-through, header validation; ``--shard-size``, default 128M),
  3. ``packer build --validate full`` (decodes every image),
  4. ``packer build --codec tiled`` (the lossless re-tiling transcode) with ``--tiled``.
Prints MB/s, images/s and CPU ms per image (the subprocesses' CPU), with ratios to the copy.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import harness
import make_sample


def read_all(root: Path, workers: int) -> None:
    """The baseline: list the folder and ``cat`` every file, ``workers`` cats in parallel."""
    subprocess.run(f"find '{root}' -type f -print0 | xargs -0 -P {workers} -n 256 cat > /dev/null",
                   shell=True, check=True)


def copy_all(root: Path, out: Path, workers: int) -> None:
    """The I/O floor of packing: read every file and write it into one output file, then fsync."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    subprocess.run(f"find '{root}' -type f -print0 | xargs -0 -n 256 cat > '{out}/all.bin' && sync -f '{out}/all.bin'",
                   shell=True, check=True)


def run_build(root: Path, out: Path, workers: int, *extra: str) -> None:
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "packer", "build", str(root), str(out), "-q", "--workers", str(workers),
                    *extra], check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--size-kb", type=int, default=110)
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--work", type=Path, default=None, help="where to put images and outputs")
    parser.add_argument("--shard-size", default="128M")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tiled", action="store_true", help="also time a --codec tiled build")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.gettempdir()) / "packer-bench-build"
    images = work / f"images-{args.images}-{args.size_kb}k"
    if not images.exists():
        print(f"writing {args.images} JPEGs of ~{args.size_kb} KB to {images} ...", flush=True)
        make_sample.make_big_folder(images, args.images, size_kb=args.size_kb)
    out = work / "dataset"
    build = ("--shard-size", args.shard_size)
    steps = [("cat all files > one file + fsync", lambda: copy_all(images, out, args.workers)),
             ("cat all files (read only)", lambda: read_all(images, args.workers)),
             ("packer build", lambda: run_build(images, out, args.workers, *build)),
             ("packer build --validate full", lambda: run_build(images, out, args.workers, *build, "--validate", "full"))]
    if args.tiled:
        steps.append(("packer build --codec tiled", lambda: run_build(images, out, args.workers, *build,
                                                                      "--codec", "tiled")))
    total = sum(p.stat().st_size for p in images.rglob("*") if p.is_file())
    caches = ["warm"] + (["cold"] if os.geteuid() == 0 else [])
    before = harness.machine_load()
    for cache in caches:
        def timed(step: object) -> harness.Stretch:
            if cache == "cold" and not harness.drop_all():
                raise SystemExit("cannot drop the page cache (not root?)")
            return harness.measure(step, items=args.images)  # type: ignore[arg-type]
        for _, step in steps:
            step()  # warm-up (and page-cache fill for the warm round)
        results = harness.interleave([(name, lambda step=step: timed(step)) for name, step in steps], args.rounds,
                                     unit="images")
        rows = harness.summarize(results)
        print(f"\n{cache} page cache: {args.images} files, {total / 1e6:.0f} MB, {args.workers} workers, shard size "
              f"{args.shard_size}, {args.rounds} interleaved rounds (median)")
        print(harness.table(rows, unit="images", name_width=34,
                            columns=[("MB/s", lambda row: f"{row.rate * total / args.images / 1e6:,.0f}")]))
    print(harness.describe_load(before, harness.machine_load()))
    print("(ratios = against reading every file once and writing it once, durably; CPU counts the subprocesses)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
