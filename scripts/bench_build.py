"""Is pass-through packing I/O-bound? Time ``packer build`` against plainly reading every source file.

    python scripts/bench_build.py [--images 3000] [--size-kb 110] [--workers N] [--work DIR]

In one run: make (or reuse) a folder of ~110 KB JPEGs, then
  1. baselines: ``cat`` every file (read only), and ``cat`` them all into one file + fsync (the
     I/O floor of any packer: read every byte once, write it once, durably),
  2. ``packer build`` (pass-through, header validation; ``--shard-size``, default 128M),
  3. ``packer build --validate full`` (decodes every image),
each run once to warm up and once measured, with the page cache warm, then (as root, which can
drop the page cache) cold. Prints MB/s and the ratios to both baselines.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_sample  # noqa: E402
from pagecache import drop_all  # noqa: E402


def read_all(root: Path, workers: int) -> float:
    """The baseline: list the folder and ``cat`` every file, ``workers`` cats in parallel."""
    start = time.perf_counter()
    subprocess.run(f"find '{root}' -type f -print0 | xargs -0 -P {workers} -n 256 cat > /dev/null",
                   shell=True, check=True)
    return time.perf_counter() - start


def copy_all(root: Path, out: Path, workers: int) -> float:
    """The I/O floor of packing: read every file and write it into one output file, then fsync."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    start = time.perf_counter()
    subprocess.run(f"find '{root}' -type f -print0 | xargs -0 -n 256 cat > '{out}/all.bin' && sync -f '{out}/all.bin'",
                   shell=True, check=True)
    return time.perf_counter() - start


def run_build(root: Path, out: Path, workers: int, *extra: str) -> float:
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "packer", "build", str(root), str(out), "-q", "--workers", str(workers),
                    *extra], check=True)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--size-kb", type=int, default=110)
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--work", type=Path, default=None, help="where to put images and outputs")
    parser.add_argument("--shard-size", default="128M")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.gettempdir()) / "packer-bench-build"
    images = work / f"images-{args.images}-{args.size_kb}k"
    if not images.exists():
        print(f"writing {args.images} JPEGs of ~{args.size_kb} KB to {images} ...", flush=True)
        make_sample.make_big_folder(images, args.images, size_kb=args.size_kb)
    out = work / "dataset"
    rows = []
    rounds = [("warm", False)] + ([("cold", True)] if os.geteuid() == 0 else [])
    for label, cold in rounds:
        for name, runner in (
            ("cat all files (read only)", lambda: read_all(images, args.workers)),
            ("cat all files > one file + fsync", lambda: copy_all(images, out, args.workers)),
            ("packer build", lambda: run_build(images, out, args.workers, "--shard-size", args.shard_size)),
            ("packer build --validate full",
             lambda: run_build(images, out, args.workers, "--shard-size", args.shard_size, "--validate", "full")),
        ):
            if cold and not drop_all():
                print("cannot drop the page cache (not root?): skipping the cold round")
                break
            runner()  # warm-up (and page-cache fill for the warm round)
            if cold:
                drop_all()
            seconds = runner()
            rows.append((label, name, seconds))
    total = sum(p.stat().st_size for p in images.rglob("*") if p.is_file())
    print(f"\n{args.images} files, {total / 1e6:.0f} MB, {args.workers} workers, shard size {args.shard_size}")
    read_only, copy = {}, {}
    print(f"{'cache':6} {'step':34} {'seconds':>8} {'MB/s':>8} {'images/s':>9} {'vs read':>8} {'vs copy':>8}")
    for label, name, seconds in rows:
        read_only.setdefault(label, seconds)
        if "fsync" in name:
            copy[label] = seconds
        base = copy.get(label)
        print(f"{label:6} {name:34} {seconds:8.2f} {total / seconds / 1e6:8.0f} {args.images / seconds:9.0f} "
              f"{seconds / read_only[label]:7.2f}x {f'{seconds / base:7.2f}x' if base else '':>8}")
    print("\n(ratios = time / baseline time. 'vs copy' compares with the I/O any packer must do: read every"
          " file once and write it once, durably; 1.00x means packing costs no more than that copy.)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
