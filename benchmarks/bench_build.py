"""Is pass-through packing I/O-bound? Time ``packer build`` against copying the same files.

    python benchmarks/bench_build.py [--images 3000] [--size-kb 110] [--workers N] [--rounds 2] [--work DIR]
    python benchmarks/bench_build.py --peers [--small 50000 | --source DIR] [--cold] [--rounds 5]

In one run: make (or reuse) a folder of ~110 KB JPEGs (``--small N``: N PNGs of 32x32 in 10
classes; ``--source``: a folder you have), then, in ``--rounds`` interleaved rounds
(``harness.interleave``), with the page cache warm (and with ``--cold``, or as root, cold too):
  1. baselines: ``cat`` every file (read only), and ``cat`` them all into one file + fsync (the
     I/O floor of any packer: read every byte once, write it once, durably),
  2. ``packer build`` (pass-through, header validation; ``--shard-size``, default 128M),
  3. ``packer build --validate full`` (decodes every image; not with ``--peers``),
  4. ``packer build --codec tiled`` (the lossless re-tiling transcode) with ``--tiled``.
With ``--peers``, the baselines are the peers instead: ``tar cf`` of the folder + ``sync`` of the
tar (what a user would otherwise do to get one file), and FFCV's writer storing the same bytes
(``ffcv_write.py --mode bytes``, run by ``--ffcv-python``, skipped with a message when FFCV is
not there); the ratio table is against ``tar`` + sync. Cold rounds evict the source files from
the page cache first (``posix_fadvise(DONTNEED)`` per file; no root needed, other files keep
their pages). Prints MB/s, images/s and CPU per image (the subprocesses' CPU), the ratios of the
median round, and the median of the per-round ratios of wall time (each candidate against the
baseline of the same round: the steadier figure when the machine is shared).
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
                    *extra], check=True, env=_packer_env())


def _packer_env() -> dict[str, str]:
    # the checkout this script belongs to, whatever packer the interpreter has installed
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(harness.REPO),
                                                                      os.environ.get("PYTHONPATH")]))}


def tar_sync(root: Path, out: Path) -> None:
    """The peer baseline: one tar of the folder, made durable (``sync -f`` of the tar)."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    subprocess.run(f"tar cf '{out}/all.tar' -C '{root}' . && sync -f '{out}/all.tar'", shell=True, check=True)


def ffcv_write(python: str, root: Path, out: Path, workers: int) -> None:
    """FFCV's writer storing every file's bytes (``BytesField``) and its label, fsynced."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    subprocess.run([python, str(Path(__file__).with_name("ffcv_write.py")), str(root), str(out / "all.beton"),
                    "--workers", str(workers), "--mode", "bytes"], check=True)


def ffcv_missing(python: str | None) -> str | None:
    """Why FFCV's writer cannot run, or None."""
    if not python or not Path(python).exists():
        return f"no FFCV interpreter ({python or 'none given'}; --ffcv-python)"
    done = subprocess.run([python, "-c", "import ffcv.writer"], capture_output=True)
    return None if done.returncode == 0 else "ffcv does not import: " + done.stderr.decode()[-200:]


def pair_ratios(results: dict[str, list[harness.Stretch]], baseline: str) -> dict[str, float]:
    """Each candidate's median over rounds of (its wall seconds / the baseline's in that round)."""
    import statistics

    base = results[baseline]
    return {name: statistics.median(s.seconds / b.seconds for s, b in zip(stretches, base))
            for name, stretches in results.items() if stretches}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--size-kb", type=int, default=110)
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--work", type=Path, default=None, help="where to put images and outputs")
    parser.add_argument("--shard-size", default="128M")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tiled", action="store_true", help="also time a --codec tiled build")
    parser.add_argument("--source", type=Path, default=None, help="an image folder to build (instead of generating)")
    parser.add_argument("--small", type=int, default=0, help="generate this many 32x32 PNGs instead of JPEGs")
    parser.add_argument("--peers", action="store_true", help="against tar + sync and FFCV's writer")
    parser.add_argument("--ffcv-python", default=os.environ.get("FFCV_PYTHON", "ffcv-venv/bin/python"),
                        help="a Python with FFCV 1.0.2 (its own virtualenv; default $FFCV_PYTHON)")
    parser.add_argument("--cold", action="store_true", help="also cold rounds (source files evicted first)")
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.gettempdir()) / "packer-bench-build"
    if args.source is not None:
        images = args.source
    elif args.small:
        images = work / f"png32-{args.small}"
        if not (images / ".done").exists():
            print(f"writing {args.small} PNGs of 32x32 to {images} ...", flush=True)
            make_sample.make_image_folder(images, classes=10, per_class=args.small // 10, seed=0, min_size=32,
                                          max_size=32, formats=("png",))
            (images / ".done").write_text("ok")
    else:
        images = work / f"images-{args.images}-{args.size_kb}k"
        if not images.exists():
            print(f"writing {args.images} JPEGs of ~{args.size_kb} KB to {images} ...", flush=True)
            make_sample.make_big_folder(images, args.images, size_kb=args.size_kb)
    files = sorted(p for p in images.rglob("*") if p.is_file() and not p.name.startswith("."))
    count = len(files)
    out = work / "dataset"
    build = ("--shard-size", args.shard_size)
    if args.peers:
        steps = [("tar + sync", lambda: tar_sync(images, work / "tar")),
                 ("packer build", lambda: run_build(images, out, args.workers, *build))]
        missing = ffcv_missing(args.ffcv_python)
        if missing is None:
            steps.append(("FFCV writer (bytes)", lambda: ffcv_write(args.ffcv_python, images, work / "ffcv",
                                                                    args.workers)))
        else:
            print(f"skipping FFCV: {missing}", flush=True)
    else:
        steps = [("cat all files > one file + fsync", lambda: copy_all(images, out, args.workers)),
                 ("cat all files (read only)", lambda: read_all(images, args.workers)),
                 ("packer build", lambda: run_build(images, out, args.workers, *build)),
                 ("packer build --validate full",
                  lambda: run_build(images, out, args.workers, *build, "--validate", "full"))]
    if args.tiled:
        steps.append(("packer build --codec tiled", lambda: run_build(images, out, args.workers, *build,
                                                                      "--codec", "tiled")))
    total = sum(p.stat().st_size for p in files)
    caches = ["warm"] + (["cold"] if args.cold or os.geteuid() == 0 else [])
    before = harness.machine_load()
    report = {"command": sys.argv, "files": count, "bytes": total, "workers": args.workers, "rounds": args.rounds,
              "caches": {}}
    for cache in caches:
        def timed(step: object) -> harness.Stretch:
            if cache == "cold":
                harness.evict(files)  # this source's pages only: the machine is shared
            return harness.measure(step, items=count)  # type: ignore[arg-type]
        for _, step in steps:
            step()  # warm-up (and page-cache fill for the warm round)
        results = harness.interleave([(name, lambda step=step: timed(step)) for name, step in steps], args.rounds,
                                     unit="images")
        rows = harness.summarize(results)
        pairs = pair_ratios(results, steps[0][0])
        print(f"\n{cache} page cache: {count} files, {total / 1e6:.0f} MB, {args.workers} workers, shard size "
              f"{args.shard_size}, {args.rounds} interleaved rounds (median)")
        print(harness.table(rows, unit="images", name_width=34, columns=[
            ("MB/s", lambda row: f"{row.rate * total / count / 1e6:,.0f}"),
            ("CPU us/file", lambda row: f"{row.cpu_ms * 1e3:,.1f}"),
            ("time/base", lambda row: f"{pairs[row.name]:.2f}x")]))
        report["caches"][cache] = [{**row.as_dict(), "median_pair_time_ratio": pairs[row.name]} for row in rows]
    after = harness.machine_load()
    print(harness.describe_load(before, after))
    print(f"(ratios = against '{steps[0][0]}' in the same run; time/base = median over rounds of the wall-time "
          f"ratio within a round; CPU counts the subprocesses)")
    if args.json is not None:
        import json

        report["load"] = {"before": before, "after": after}
        args.json.write_text(json.dumps(report, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
