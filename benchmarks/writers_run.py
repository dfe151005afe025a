"""One writer writing one set, timed inside its own process, for ``bench_writers.py``.

    PYTHON benchmarks/writers_run.py WRITER SET OUT [--jpegs DIR] [--workers 2]

prints one JSON line: ``{"seconds", "cpu_seconds", "items", "bytes", ...}``. WRITER is ``packer``
(``packer.Writer``), ``packer-noshuffle``, ``mds`` (MosaicML ``MDSWriter``), ``wds`` (WebDataset
``ShardWriter``), ``ffcv`` (FFCV ``DatasetWriter``), ``litdata`` (``litdata.optimize``), or for the
``resize`` job ``packer-pack`` (``packer.pack``), ``litdata`` and ``mp-mds`` (a
``multiprocessing.Pool`` feeding an ``MDSWriter``). SET is ``small`` (50,000 32x32 RGB arrays and
labels, made in memory before the clock starts), ``jpeg`` (the JPEG files of ``--jpegs`` read
into memory first: 5,000 ImageNet-size images) or ``resize`` (decode each JPEG file, resize its
shorter side to 256, re-encode at quality 90, pack: the optimize-style job, ``--workers``
processes). The clock covers writing and closing (the output complete on disk); CPU time counts
this process and its children (``getrusage``). Standalone: it imports packer only for packer's
writers, so the peers run in their own virtualenv (``--peers-python``, ``--ffcv-python``).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

SMALL_COUNT = 50_000


def cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def small_set() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, (SMALL_COUNT, 32, 32, 3), dtype=np.uint8), rng.integers(0, 10, SMALL_COUNT)


def jpeg_files(folder: str) -> list[str]:
    return sorted(str(path) for path in Path(folder).glob("*.jpg"))


def resize_256(path: str) -> bytes:
    """Decode, resize the shorter side to 256 (bilinear, as torchvision's Resize), re-encode at quality 90."""
    from PIL import Image

    with Image.open(path) as image:
        image = image.convert("RGB")
        width, height = image.size
        scale = 256 / min(width, height)
        image = image.resize((max(1, round(width * scale)), max(1, round(height * scale))), Image.BILINEAR)
        out = io.BytesIO()
        image.save(out, "JPEG", quality=90)
        return out.getvalue()


def label_of(path: str) -> int:
    return int(Path(path).stem.rsplit("-", 1)[-1])


# --- packer ---------------------------------------------------------------------------------------------

def run_packer(kind: str, out: str, images: list, labels: list, workers: int, shuffle: bool = True) -> dict:
    import packer

    codec = "raw:size=32x32" if kind == "small" else "passthrough"
    started = time.perf_counter()
    with packer.Writer(out, codec=codec, workers=workers, shuffle=shuffle) as writer:
        for image, label in zip(images, labels):
            writer.write(image, int(label))
        spooled = time.perf_counter() - started
        spool_bytes = writer._spool.position  # noqa: SLF001 - what the spool costs, for the note
    return {"write_loop_seconds": spooled, "spool_bytes": spool_bytes}


def _packer_fn(path: str) -> dict:
    return {"image": resize_256(path), "label": label_of(path)}


def run_packer_pack(out: str, paths: list[str], workers: int) -> dict:
    import packer

    packer.pack(paths, out, _packer_fn, workers=workers)
    return {}


# --- the peers -------------------------------------------------------------------------------------------

def run_mds(kind: str, out: str, images: list, labels: list) -> dict:
    from streaming import MDSWriter

    columns = {"image": "ndarray:uint8:32,32,3" if kind == "small" else "bytes", "label": "int"}
    with MDSWriter(out=out, columns=columns, compression=None, progress_bar=False, size_limit=1 << 28) as writer:
        for image, label in zip(images, labels):
            writer.write({"image": image, "label": int(label)})
    return {}


def run_wds(kind: str, out: str, images: list, labels: list) -> dict:
    import webdataset as wds

    os.makedirs(out, exist_ok=True)
    suffix = "npy" if kind == "small" else "jpg"
    with wds.ShardWriter(os.path.join(out, "shard-%06d.tar"), maxsize=1 << 28, verbose=0) as writer:
        for number, (image, label) in enumerate(zip(images, labels)):
            writer.write({"__key__": f"{number:09d}", suffix: image, "cls": int(label)})
    return {}


class _Indexed:
    def __init__(self, images: list, labels: list, kind: str) -> None:
        self.images, self.labels, self.kind = images, labels, kind

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):  # noqa: ANN204 - FFCV's dataset protocol
        image = self.images[i] if self.kind == "small" else np.frombuffer(self.images[i], dtype=np.uint8)
        return image, int(self.labels[i])


def run_ffcv(kind: str, out: str, images: list, labels: list, workers: int) -> dict:
    from ffcv.fields import BytesField, IntField, RGBImageField
    from ffcv.writer import DatasetWriter

    os.makedirs(out, exist_ok=True)
    field = RGBImageField(write_mode="raw") if kind == "small" else BytesField()
    writer = DatasetWriter(os.path.join(out, "data.beton"), {"image": field, "label": IntField()}, num_workers=workers)
    writer.from_indexed_dataset(_Indexed(images, labels, kind))
    return {}


def _litdata_sample(item: tuple) -> dict:
    return {"image": item[0], "label": int(item[1])}


def _litdata_resize(path: str) -> dict:
    return {"image": resize_256(path), "label": label_of(path)}


def run_litdata(out: str, inputs: list, fn, workers: int) -> dict:  # noqa: ANN001
    from litdata import optimize

    optimize(fn=fn, inputs=inputs, output_dir=out, num_workers=workers, chunk_bytes="64MB", mode="overwrite")
    return {}


def _mds_resize(path: str) -> tuple[bytes, int]:
    return resize_256(path), label_of(path)


def run_mp_mds(out: str, paths: list[str], workers: int) -> dict:
    import multiprocessing

    from streaming import MDSWriter

    with multiprocessing.get_context("fork").Pool(workers) as pool, \
            MDSWriter(out=out, columns={"image": "bytes", "label": "int"}, compression=None, progress_bar=False,
                      size_limit=1 << 28) as writer:
        for image, label in pool.imap(_mds_resize, paths, chunksize=16):
            writer.write({"image": image, "label": label})
    return {}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("writer")
    parser.add_argument("set", choices=("small", "jpeg", "resize"))
    parser.add_argument("out")
    parser.add_argument("--jpegs", help="the folder of JPEG files (sets jpeg and resize)")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    if args.set == "small":
        data, targets = small_set()
        images, labels = list(data), targets.tolist()
    elif args.set == "jpeg":
        paths = jpeg_files(args.jpegs)
        images = [Path(path).read_bytes() for path in paths]
        labels = [label_of(path) for path in paths]
    else:
        paths = jpeg_files(args.jpegs)
        images, labels = paths, [label_of(path) for path in paths]
    cpu0 = cpu_seconds()
    started = time.perf_counter()
    if args.writer in ("packer", "packer-noshuffle"):
        extra = run_packer(args.set, args.out, images, labels, args.workers, shuffle=args.writer == "packer")
    elif args.writer == "packer-pack":
        extra = run_packer_pack(args.out, images, args.workers)
    elif args.writer == "mds":
        extra = run_mds(args.set, args.out, images, labels)
    elif args.writer == "wds":
        extra = run_wds(args.set, args.out, images, labels)
    elif args.writer == "ffcv":
        extra = run_ffcv(args.set, args.out, images, labels, args.workers)
    elif args.writer == "litdata":
        if args.set == "resize":
            extra = run_litdata(args.out, images, _litdata_resize, args.workers)
        else:
            # LitData starts its workers afresh: the samples travel to them as the inputs
            extra = run_litdata(args.out, list(zip(images, labels)), _litdata_sample, args.workers)
    elif args.writer == "mp-mds":
        extra = run_mp_mds(args.out, images, args.workers)
    else:
        parser.error(f"unknown writer {args.writer!r}")
    seconds = time.perf_counter() - started
    cpu = cpu_seconds() - cpu0
    size = sum(path.stat().st_size for path in Path(args.out).rglob("*") if path.is_file())
    print(json.dumps({"seconds": seconds, "cpu_seconds": cpu, "items": len(images), "bytes": size, **extra}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
