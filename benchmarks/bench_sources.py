"""Build time from each source kind against reading the container once, and memory against member count.

    python benchmarks/bench_sources.py [--images 2000] [--size-kb 110] [--workers 2] [--members 20000,100000]
                                       [--rounds 2] [--work DIR]

In one run, with the page cache warm (each step runs once to warm up, then is timed in
``--rounds`` interleaved rounds, ``harness.interleave``; the median round is shown):
  1. the same JPEGs as a folder, an uncompressed tar, a tar of class tars (ImageNet's layout),
     a stored zip, WebDataset shards (1,000 samples each, .jpg + .cls), a Parquet file in the
     HuggingFace layout (when pyarrow is installed) and a gzipped tar;
  2. the baseline for each: reading it once (``cat`` the container, or every file of the folder,
     to /dev/null), and for the gzipped tar ``gzip -dc`` (the decompressor's speed);
  3. ``packer build`` from each (pass-through, header validation; through the library, so no
     interpreter start-up is timed), and its ratio to its baseline and to the folder build;
  4. memory: peak RSS (largest process) of a build from an uncompressed tar of N tiny JPEG members,
     for each N in ``--members``: flat in N means bounded memory in the number of members.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

import harness
import make_sample

PYTHON = sys.executable


def run_shell(command: str) -> None:
    subprocess.run(command, shell=True, check=True, stdout=subprocess.DEVNULL)


def library_build(source: Path | str, out: Path, workers: int) -> None:
    """``packer build`` through the library, in this process (no interpreter start-up in the time)."""
    from packer.writer import build
    from packer.writer.plan import BuildOptions

    build(source, out, BuildOptions(), workers=workers, overwrite=True, progress=False)


def build_command(source: Path | str, out: Path, workers: int) -> list[str]:
    return [PYTHON, "-m", "packer", "build", str(source), str(out), "--workers", str(workers), "-q",
            "--overwrite", "--json"]


def add_member(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    archive.addfile(info, io.BytesIO(data))


def make_sources(work: Path, folder: Path) -> dict[str, tuple[Path | str, str]]:
    """Every container kind from ``folder``; name -> (source, baseline shell command)."""
    files = sorted(p for p in folder.rglob("*.jpg"))
    rel = [p.relative_to(folder).as_posix() for p in files]
    sources: dict[str, tuple[Path | str, str]] = {
        "folder": (folder, f"find '{folder}' -type f -print0 | xargs -0 -n 256 cat > /dev/null")}
    tar = work / "data.tar"
    if not tar.exists():
        with tarfile.open(tar, "w") as archive:
            for path, name in zip(files, rel):
                add_member(archive, name, path.read_bytes())
    sources["tar"] = (tar, f"cat '{tar}' > /dev/null")
    tot = work / "train.tar"
    if not tot.exists():
        classes: dict[str, list[int]] = {}
        for i, name in enumerate(rel):
            classes.setdefault(name.split("/")[0], []).append(i)
        with tarfile.open(tot, "w") as archive:
            for cls, members in classes.items():
                buffer = io.BytesIO()
                with tarfile.open(fileobj=buffer, mode="w") as inner:
                    for i in members:
                        add_member(inner, rel[i].split("/", 1)[1], files[i].read_bytes())
                add_member(archive, f"{cls}.tar", buffer.getvalue())
    sources["tar of tars"] = (tot, f"cat '{tot}' > /dev/null")
    zpath = work / "data.zip"
    if not zpath.exists():
        with zipfile.ZipFile(zpath, "w", zipfile.ZIP_STORED) as archive:
            for path, name in zip(files, rel):
                archive.write(path, name)
    sources["zip (stored)"] = (zpath, f"cat '{zpath}' > /dev/null")
    wds = work / "wds"
    if not wds.exists():
        wds.mkdir()
        for shard in range(0, len(files), 1000):
            with tarfile.open(wds / f"train-{shard // 1000:06d}.tar", "w") as archive:
                for i in range(shard, min(shard + 1000, len(files))):
                    add_member(archive, f"{i:08d}.jpg", files[i].read_bytes())
                    add_member(archive, f"{i:08d}.cls", str(int(rel[i].split("/")[0].split("_")[-1])).encode())
    shards = sorted(wds.iterdir())
    pattern = str(wds / f"train-{{000000..{len(shards) - 1:06d}}}.tar")
    sources["webdataset (pattern)"] = (pattern, f"cat '{wds}'/*.tar > /dev/null")
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:  # the parquet extra is optional
        pq = None
    if pq is not None:
        parquet = work / "data.parquet"
        if not parquet.exists():
            image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
            table = pa.table({"image": pa.array([{"bytes": p.read_bytes(), "path": n} for p, n in zip(files, rel)],
                                                type=image_type),
                              "label": pa.array([int(n.split("/")[0].split("_")[-1]) for n in rel])})
            pq.write_table(table, parquet, row_group_size=500, compression="none")
        sources["parquet (HF layout)"] = (parquet, f"cat '{parquet}' > /dev/null")
    gz = work / "data.tar.gz"
    if not gz.exists():
        subprocess.run(f"gzip -1 -c '{tar}' > '{gz}'", shell=True, check=True)
    sources["tar.gz (gzip -1)"] = (gz, f"gzip -dc '{gz}' > /dev/null")
    return sources


def tiny_jpeg_tar(path: Path, members: int) -> None:
    """An uncompressed tar of ``members`` distinct ~700-byte JPEGs in 10 class folders."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (90, 120, 200)).save(buffer, "JPEG", quality=50)
    base = buffer.getvalue()
    with tarfile.open(path, "w") as archive:
        for i in range(members):
            comment = f"m{i:010d}".encode()
            data = base[:2] + b"\xff\xfe" + (len(comment) + 2).to_bytes(2, "big") + comment + base[2:]
            add_member(archive, f"c{i % 10}/{i:09d}.jpg", data)


def peak_rss_mb(command: list[str]) -> tuple[float, float]:
    """(seconds, peak RSS in MB of the largest process) of ``command``, measured in a fresh child."""
    probe = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
             "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
             "print(time.perf_counter() - t, max(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, 0))")
    out = subprocess.run([PYTHON, "-c", probe, *command], check=True, capture_output=True, text=True).stdout.split()
    return float(out[0]), float(out[1]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--size-kb", type=int, default=110)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--members", default="20000,100000")
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-sources-"))
    work.mkdir(parents=True, exist_ok=True)
    folder = work / "folder"
    if not folder.exists():
        make_sample.make_big_folder(folder, args.images, size_kb=args.size_kb, classes=10)
    sources = make_sources(work, folder)
    total = sum(p.stat().st_size for p in folder.rglob("*.jpg"))
    print(f"{args.images} JPEGs, {total / 1e6:.0f} MB, {args.workers} workers, warm page cache, {work}")
    rows: list[dict[str, object]] = []
    out = work / "out"
    folder_rate = None
    for name, (source, baseline) in sources.items():
        run_shell(baseline)
        library_build(source, out, args.workers)  # warm-up
        results = harness.interleave([
            (f"read once ({name})", lambda baseline=baseline: harness.measure(lambda: run_shell(baseline),
                                                                              items=total / 1e6)),
            (f"build from {name}", lambda source=source: harness.measure(
                lambda: library_build(source, out, args.workers), items=total / 1e6))], args.rounds, log=None)
        base, built = harness.summarize(results)
        folder_rate = folder_rate or built.rate
        rows.append({"source": name, "baseline_s": total / 1e6 / base.rate, "build_s": total / 1e6 / built.rate,
                     "ratio": base.rate / built.rate, "ratio_to_folder": folder_rate / built.rate,
                     "build_cpu_ms_per_mb": built.cpu_ms})
        print(harness.table([base, built], unit="MB", name_width=34, columns=[
            ("vs folder", lambda row: f"{row.rate / folder_rate:.2f}x" if row is built else "")]), flush=True)
        shutil.rmtree(out, ignore_errors=True)
    print(f"\n{'members':>9} {'tar MB':>7} {'build':>8} {'peak RSS':>9}")
    for count in [int(n) for n in args.members.split(",")]:
        tar = work / f"tiny-{count}.tar"
        if not tar.exists():
            tiny_jpeg_tar(tar, count)
        seconds, rss = peak_rss_mb(build_command(tar, work / "out-tiny", args.workers))
        rows.append({"members": count, "build_s": seconds, "peak_rss_mb": rss})
        print(f"{count:>9} {tar.stat().st_size / 1e6:>7.0f} {seconds:>7.1f}s {rss:>7.0f}MB")
        shutil.rmtree(work / "out-tiny", ignore_errors=True)
    (work / "bench_sources.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
