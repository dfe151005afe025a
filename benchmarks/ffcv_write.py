"""FFCV's writer over an image folder, for ``bench_build.py`` (run with a Python that has FFCV 1.0.2).

    FFCV_VENV/bin/python benchmarks/ffcv_write.py SRC OUT.beton [--workers N] [--mode bytes|raw]

``--mode bytes`` stores each file's bytes as they are (``BytesField``: FFCV's pass-through, what
packer's pass-through build stores) with an ``IntField`` label; ``--mode raw`` decodes each image
and stores its RGB pixels (``RGBImageField(write_mode="raw")``). The folder is listed the way
ImageFolder lists it (sorted class folders, sorted files). Standalone: it imports nothing of
packer or of the benchmark harness, so it runs in FFCV's own virtualenv.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np


class Folder:
    """(bytes as uint8, label) or (PIL image, label) per file of an ImageFolder tree."""

    def __init__(self, root: str, decode: bool) -> None:
        self.decode = decode
        self.samples = []
        classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
        for label, name in enumerate(classes):
            folder = os.path.join(root, name)
            for file_name in sorted(os.listdir(folder)):
                self.samples.append((os.path.join(folder, file_name), label))

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):  # noqa: ANN204 - FFCV's dataset protocol
        path, label = self.samples[index]
        if self.decode:
            from PIL import Image

            with Image.open(path) as image:
                return image.convert("RGB"), label
        with open(path, "rb") as handle:
            return np.frombuffer(handle.read(), dtype=np.uint8), label


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("src")
    parser.add_argument("out")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--mode", choices=("bytes", "raw"), default="bytes")
    args = parser.parse_args()
    from ffcv.fields import BytesField, IntField, RGBImageField
    from ffcv.writer import DatasetWriter

    field = BytesField() if args.mode == "bytes" else RGBImageField(write_mode="raw")
    writer = DatasetWriter(args.out, {"image": field, "label": IntField()}, num_workers=args.workers)
    writer.from_indexed_dataset(Folder(args.src, decode=args.mode == "raw"))
    with open(args.out, "rb+") as handle:  # durable, as packer's shards and tar + sync are
        os.fsync(handle.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
