"""What the small-record layout (``--alignment auto``, formats/SPEC.md §3.4) costs or saves the readers.

Usage::

    .venv/bin/python benchmarks/bench_alignment.py [--images 8000] [--rounds 3] [--batch-size 256]
        [--out bench-out/alignment] [--json FILE]

A 32x32 RGB sample stored ``--codec raw`` is 3,072 bytes; at the default alignment of 4,096 every
sample takes a whole 4 KiB block, so a quarter of the shard is padding. A 2 KB PNG stored as it
is (pass-through) pays twice its size in padding. ``--alignment auto`` (the default) packs such
records at 64 bytes and reads runs of them as whole 4 KiB page blocks. This script builds the same
``--images`` 32x32 PNGs four times: raw and pass-through, each at ``--alignment 4096`` and at the
default (``auto``: 64 for both), and times, in interleaved rounds (``harness.interleave``), random
batches of ``--batch-size`` read through:

* ``read_batch`` with the ``mmap`` backend (the default): the coalesced gather of the payloads;
* ``read_batch`` with the ``direct`` backend (O_DIRECT): each run's 4 KiB page block read straight
  into the batch buffer (skipped where the file system refuses O_DIRECT);
* the batched raw crop path (raw datasets): ``PackedDataset(decode=RandomResizedCrop(32, seed=0),
  layout="HWC").__getitems__``, one gather and one vectorised crop per batch.

Every dataset is read once first, so the rounds run from the page cache; the table gives the
median round's samples/s and CPU per sample, with ratios against the 4096-aligned dataset of
the same codec, and each dataset's size on disk and padding share.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import harness  # noqa: E402
import make_sample  # noqa: E402

import packer  # noqa: E402
from packer.errors import DirectIOUnsupportedError  # noqa: E402


def build(source: Path, out: Path, codec: str, alignment: int | str) -> Path:
    if not (out / "manifest.json").is_file():
        settings = packer.BuildSettings(layout=packer.LayoutSettings(alignment=alignment), codec=codec)
        packer.build_dataset(source, out, settings, packer.RunOptions(workers=2, progress=False))
    return out


def on_disk(path: Path) -> dict[str, Any]:
    with packer.open_dataset(path) as ds:
        payload = int(ds.index.size.sum())
        shards = sum(shard.size for shard in ds.manifest.shards)
        alignment = ds.alignment
    return {"alignment": alignment, "shard_mb": round(shards / 1e6, 2), "payload_mb": round(payload / 1e6, 2),
            "size_over_payload": round(shards / payload, 3)}


def reader(path: Path, backend: str, batch_size: int, batches: int) -> Callable[[], harness.Stretch] | None:
    try:
        ds = packer.open_dataset(path, backend=backend)
        ds.read_batch(np.arange(min(len(ds), 8)))
    except DirectIOUnsupportedError:
        return None
    rng = np.random.default_rng(0)
    orders = [rng.permutation(len(ds))[:batch_size] for _ in range(batches)]
    for order in orders:  # warm: every round reads from the page cache
        ds.read_batch(order)

    def body() -> int:
        for order in orders:
            ds.read_batch(order)
        return batch_size * batches

    return lambda: harness.measure(body)


def raw_crops(path: Path, batch_size: int, batches: int) -> Callable[[], harness.Stretch]:
    from packer.torch import PackedDataset
    from packer.transforms import RandomResizedCrop

    data = PackedDataset(path, decode=RandomResizedCrop(32, seed=0), layout="HWC")
    rng = np.random.default_rng(1)
    orders = [rng.permutation(len(data))[:batch_size].tolist() for _ in range(batches)]
    data.__getitems__(orders[0])

    def body() -> int:
        for order in orders:
            data.__getitems__(order)
        return batch_size * batches

    return lambda: harness.measure(body)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=8000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--out", type=Path, default=Path("bench-out/alignment"))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    source = args.out / "png32"
    if not source.is_dir():
        make_sample.make_image_folder(source, classes=10, per_class=args.images // 10, seed=0, min_size=32,
                                      max_size=32, formats=("png",))
    datasets = {
        ("raw", 4096): build(source, args.out / "raw-4096", "raw:size=32x32", 4096),
        ("raw", "auto"): build(source, args.out / "raw-auto", "raw:size=32x32", "auto"),
        ("passthrough", 4096): build(source, args.out / "png-4096", "passthrough", 4096),
        ("passthrough", "auto"): build(source, args.out / "png-auto", "passthrough", "auto"),
    }
    load = harness.machine_load()
    report: dict[str, Any] = {"images": args.images, "batch_size": args.batch_size, "datasets": {}, "tables": {}}
    for (codec, alignment), path in datasets.items():
        report["datasets"][f"{codec} alignment {alignment}"] = on_disk(path)
        print(f"{codec:>12} --alignment {alignment:>4}: {on_disk(path)}")
    for codec in ("raw", "passthrough"):
        candidates = []
        for (kind, alignment), path in datasets.items():
            if kind != codec:
                continue
            for backend in ("mmap", "direct"):
                run = reader(path, backend, args.batch_size, args.batches)
                if run is not None:
                    candidates.append((f"{codec} {alignment}: read_batch {backend}", run))
            if codec == "raw":
                candidates.append((f"{codec} {alignment}: batched RandomResizedCrop", raw_crops(
                    path, args.batch_size, args.batches // 4)))
        results = harness.interleave(candidates, args.rounds, unit="samples")
        for base in {name.split(": ", 1)[1] for name, _ in candidates}:
            rows = harness.summarize({name: results[name] for name, _ in candidates if name.endswith(base)})
            print(harness.table(rows, unit="samples", name_width=48))
            report["tables"][f"{codec}: {base}"] = [row.as_dict() for row in rows]
    print(harness.describe_load(load, harness.machine_load()))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
