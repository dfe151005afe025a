"""Writing from Python: ``packer.Writer`` and ``packer.pack`` against the peers' writers (issue 35).

Three measurements, each in the same run, rounds interleaved, every candidate in a fresh process
(``writers_run.py``: the data is in memory before its clock starts; the clock stops when the
output is complete on disk):

1. **small**: 50,000 in-memory 32x32 RGB arrays with labels. ``packer.Writer`` (``raw:size=32x32``,
   2 packing workers) vs MosaicML ``MDSWriter`` (an ``ndarray`` column), WebDataset
   ``ShardWriter`` (``.npy``), FFCV ``DatasetWriter`` (``RGBImageField(write_mode="raw")``, 2
   workers) and ``litdata.optimize`` (2 workers).
2. **jpeg**: 5,000 ImageNet-size JPEG files' bytes, in memory: the same writers, each storing
   the bytes as they are (packer's pass-through, MDS ``bytes``, ``.jpg`` members, FFCV
   ``BytesField``, LitData's bytes).
3. **resize**: the optimize-style job on those 5,000 files, 2 workers: decode, resize the
   shorter side to 256, re-encode at quality 90, pack. ``packer.pack`` vs ``litdata.optimize`` and
   a ``multiprocessing.Pool`` feeding an ``MDSWriter``.

packer's rows also show what its spool costs: the seconds of the write loop (every sample's
bytes appended to the spool) and the bytes spooled, which are written a second time into the
shards at the end.

    python benchmarks/bench_writers.py --peers-python /tmp/peers-venv/bin/python \\
        --ffcv-python $FFCV_VENV/bin/python --rounds 3

The peers are not packer's dependencies: install them in a virtualenv of their own (one that also
sees packer's, e.g. through a ``.pth``) and name its Python with ``--peers-python`` (or
``PEERS_PYTHON``); FFCV with ``--ffcv-python`` (or ``FFCV_PYTHON``). A peer whose interpreter is
missing or cannot import it is skipped with a message.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np

from harness import Stretch, describe_load, interleave, machine_load, summarize, table

HERE = Path(__file__).resolve().parent
RUNNER = HERE / "writers_run.py"
#: The peers each set compares, and the module each needs.
PEERS = {"mds": "streaming", "wds": "webdataset", "litdata": "litdata", "ffcv": "ffcv.writer", "mp-mds": "streaming"}
NAMES = {"packer": "packer.Writer", "packer-noshuffle": "packer.Writer (shuffle=False)", "packer-pack": "packer.pack",
         "mds": "MDSWriter", "wds": "webdataset.ShardWriter", "ffcv": "FFCV DatasetWriter",
         "litdata": "litdata.optimize", "mp-mds": "multiprocessing + MDSWriter"}
SETS = {"small": ["packer", "packer-noshuffle", "mds", "wds", "ffcv", "litdata"],
        "jpeg": ["packer", "packer-noshuffle", "mds", "wds", "ffcv", "litdata"],
        "resize": ["packer-pack", "litdata", "mp-mds"]}


def make_jpegs(folder: Path, count: int) -> Path:
    """``count`` ImageNet-size JPEGs (about 500x375, quality 90, 100-150 KB: smooth shapes plus
    grain, so they compress like photos), named ``NNNNN-LABEL.jpg``; made once and kept."""
    from PIL import Image

    done = folder / f".done-{count}"
    if done.is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    sizes = [(500, 375), (375, 500), (500, 333), (640, 480), (500, 400)]
    for number in range(count):
        width, height = sizes[number % len(sizes)]
        coarse = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
        base = np.asarray(Image.fromarray(coarse).resize((width, height), Image.BICUBIC), dtype=np.int16)
        grain = rng.integers(-12, 13, (height, width, 3), dtype=np.int16)
        pixels = np.clip(base + grain, 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(folder / f"{number:05d}-{number % 10}.jpg", "JPEG", quality=90)
    done.write_text("ok")
    return folder


def missing(python: str | None, module: str) -> str | None:
    if not python or not Path(python).exists():
        return f"no interpreter ({python or 'none given'})"
    done = subprocess.run([python, "-c", f"import {module}"], capture_output=True)
    return None if done.returncode == 0 else f"{module} does not import: {done.stderr.decode()[-160:]}"


def runner(python: str, writer: str, kind: str, out: Path, jpegs: Path, workers: int) -> Callable[[], Stretch]:
    def run() -> Stretch:
        shutil.rmtree(out, ignore_errors=True)
        environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
        done = subprocess.run([python, str(RUNNER), writer, kind, str(out), "--jpegs", str(jpegs), "--workers",
                               str(workers)], capture_output=True, text=True, env=environment)
        if done.returncode != 0:
            raise RuntimeError(f"{writer} on {kind} failed: {done.stderr[-2000:]}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
        shutil.rmtree(out, ignore_errors=True)
        extra = {key: value for key, value in result.items() if key not in ("seconds", "cpu_seconds", "items")}
        return Stretch(items=result["items"], seconds=result["seconds"], cpu_seconds=result["cpu_seconds"],
                       extra=extra)

    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench-writers"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sets", default="small,jpeg,resize")
    parser.add_argument("--jpeg-count", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--peers-python", default=os.environ.get("PEERS_PYTHON"))
    parser.add_argument("--ffcv-python", default=os.environ.get("FFCV_PYTHON"))
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    jpegs = make_jpegs(args.work / "jpegs", args.jpeg_count)
    everything: dict[str, Any] = {}
    load_before = machine_load()
    for kind in args.sets.split(","):
        candidates = []
        for writer in SETS[kind]:
            python = (args.ffcv_python if writer == "ffcv" else args.peers_python) if writer in PEERS else sys.executable
            if writer in PEERS:
                why = missing(python, PEERS[writer])
                if why:
                    print(f"skipping {NAMES[writer]} on {kind}: {why}", file=sys.stderr)
                    continue
            candidates.append((NAMES[writer], runner(python, writer, kind, args.work / f"out-{writer}", jpegs,
                                                     args.workers)))
        print(f"\n== {kind} ({args.rounds} rounds, interleaved) ==", file=sys.stderr)
        results = interleave(candidates, args.rounds, unit="samples")
        ours = candidates[0][0]
        peers = [name for name, _ in candidates if not name.startswith("packer")]
        rows = summarize(results, baseline=ours)
        fastest = max((row for row in rows if row.name in peers), key=lambda row: row.rate, default=None)
        print(table(rows, unit="samples", baseline=ours,
                    columns=[("MB", lambda row: f"{row.extra.get('bytes', 0) / 1e6:.0f}"),
                             ("s (median)", lambda row: f"{row.items / len(row.rates) / row.rate:.2f}")]))
        if fastest is not None:
            mine = rows[0]
            print(f"{ours} / fastest peer ({fastest.name}): {mine.rate / fastest.rate:.2f}x samples/s, "
                  f"{mine.cpu_ms / fastest.cpu_ms:.2f}x CPU per sample")
        if kind != "resize":
            loop = [s.extra.get("write_loop_seconds", 0.0) for s in results[ours]]
            total = [s.seconds for s in results[ours]]
            spool = results[ours][-1].extra.get("spool_bytes", 0)
            print(f"packer.Writer's spool: {spool / 1e6:.0f} MB spooled then written again into the shards; "
                  f"the write loop (spooling) took {np.median(loop):.2f} s of {np.median(total):.2f} s (median)")
        everything[kind] = [row.as_dict() for row in rows]
    print(describe_load(load_before, machine_load()))
    if args.json:
        args.json.write_text(json.dumps(everything, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
