#!/usr/bin/env python3
"""Detection-style loading: packer (image + boxes + labels, RandomResizedCrop 512) against a
torchvision ``CocoDetection``-style loader with transforms-v2-style box handling, in one run.

Usage (from the repository root)::

    python benchmarks/bench_detection.py [--images 2000] [--workers 2] [--batch-size 32]
        [--rounds 3] [--out bench-out/detection] [--json FILE]

(``benchmarks/bench_peers.py --detection`` runs the same measurement beside the classification table.)

What one run does:

1. Writes ``--images`` ImageNet-like JPEGs (500x375, ~110 KB, ``make_sample``) and a COCO
   ``instances.json`` with 1-12 random boxes per image over 8 categories (a fixed seed), and
   packs them with ``packer build instances.json OUT --root images/`` (the COCO source: boxes
   XYXY pixels, labels, iscrowd, area, image_id).
2. **Training-style, same work for everyone**: RandomResizedCrop(512) + horizontal flip applied
   to the image *and* its boxes (boxes clipped to the crop, empty ones dropped with their
   labels), uint8 images, batches of ``--batch-size``, ``--workers`` DataLoader workers, random
   order, the detection collate (images stacked, per-image boxes/labels as lists):
   * baseline: ``CocoDetectionLike`` = torchvision's ``CocoDetection`` (COCO json indexed by
     image id, ``PIL.Image.open(...).convert("RGB")``, the annotation dicts as the target) plus
     a transform that does what ``transforms.v2`` does for ``RandomResizedCrop`` +
     ``RandomHorizontalFlip`` + ``SanitizeBoundingBoxes`` on PIL images and XYXY boxes. With
     torchvision importable (the bench virtualenv of ``bench_peers.py``), the real
     ``CocoDetection`` + ``wrap_dataset_for_transforms_v2`` + ``transforms.v2`` are measured too.
   * packer: ``PackedDataset(fields=("image", "boxes", "labels"), decode=RandomResizedCrop(512),
     geometry={"boxes": "xyxy", "labels": "per-box"}, layout="HWC")`` with
     ``PackedBatchSampler`` (HWC, like the baseline's ``np.array(image)``).
3. **Raw iteration with fields**: ``read_batch`` of 256 random samples with and without the
   fixed-width ``image_id`` field gathered alongside (the cost of an extra fixed column).

Loaders run in ``--rounds`` interleaved rounds (``harness.interleave``); the table shows the
median round's images/s and CPU ms per image over all rounds (workers + main process), and
ratios to the baseline measured in the same run. The machine is shared: read the ratios.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np

import harness
import make_sample
from peers_common import have_torchvision, measure_training

CATEGORIES = [{"id": 10 + 3 * k, "name": f"thing{k}"} for k in range(8)]
SIZE = 512


def make_coco(root: Path, count: int, seed: int = 0) -> tuple[Path, Path]:
    """``root/images/*.jpg`` and ``root/instances.json`` (boxes as COCO XYWH floats)."""
    images_dir = root / "images"
    done = root / "done.json"
    if done.exists() and json.loads(done.read_text()) == {"count": count, "seed": seed}:
        return root / "instances.json", images_dir
    files = make_sample.make_big_folder(root / "gen", count, size_kb=110)
    images_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    images, annotations = [], []
    from PIL import Image

    for number, path in enumerate(sorted(files)):
        name = f"{number:08d}.jpg"
        os.replace(path, images_dir / name)
        with Image.open(images_dir / name) as img:
            width, height = img.size
        images.append({"id": number + 1, "file_name": name, "width": width, "height": height})
        for _ in range(rng.randint(1, 12)):
            w, h = rng.uniform(8, width / 2), rng.uniform(8, height / 2)
            x, y = rng.uniform(0, width - w), rng.uniform(0, height - h)
            annotations.append({"id": len(annotations) + 1, "image_id": number + 1,
                                "category_id": rng.choice(CATEGORIES)["id"], "bbox": [x, y, w, h],
                                "area": w * h, "iscrowd": 0})
    (root / "instances.json").write_text(json.dumps({"images": images, "annotations": annotations,
                                                     "categories": CATEGORIES}))
    done.write_text(json.dumps({"count": count, "seed": seed}))
    return root / "instances.json", images_dir


def ensure_packed(instances: Path, images_dir: Path, out: Path, workers: int) -> Path:
    from packer.writer import build
    from packer.writer.plan import BuildOptions

    if not (out / "manifest.json").exists():
        build(instances, out, BuildOptions(), root=images_dir, workers=max(workers, 1), overwrite=True,
              progress=False)
    return out


# --- the baseline: CocoDetection + a transforms-v2-style joint transform -------------------------

class CocoDetectionLike:
    """torchvision.datasets.CocoDetection's indexing and __getitem__ (json + PIL), for when it
    won't import: ``(PIL image, list of annotation dicts)``."""

    def __init__(self, root: Path, instances: Path, transforms: Any) -> None:
        document = json.loads(instances.read_text())
        self.images = {img["id"]: img for img in document["images"]}
        self.ids = sorted(self.images)
        self.anns: dict[int, list[dict[str, Any]]] = {i: [] for i in self.ids}
        for ann in document["annotations"]:
            self.anns[ann["image_id"]].append(ann)
        self.categories = {c["id"]: k for k, c in enumerate(sorted(document["categories"], key=lambda c: c["id"]))}
        self.root, self.transforms = root, transforms

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        from PIL import Image

        image_id = self.ids[index]
        image = Image.open(self.root / self.images[image_id]["file_name"]).convert("RGB")
        return self.transforms(image, self.anns[image_id], self.categories)


class V2StyleTransform:
    """What transforms.v2 does for RandomResizedCrop(size) + RandomHorizontalFlip +
    SanitizeBoundingBoxes + PILToTensor on a PIL image with XYXY boxes: torchvision's crop
    rule on torch's RNG, PIL crop + bilinear resize, boxes shifted/scaled/clipped/flipped,
    boxes under 1 pixel dropped with their labels."""

    def __init__(self, size: int = SIZE) -> None:
        self.size = size

    def __call__(self, image: Any, anns: list[dict[str, Any]], categories: dict[int, int]) -> tuple[Any, Any]:
        import torch
        from PIL import Image

        boxes = torch.tensor([a["bbox"] for a in anns], dtype=torch.float32).reshape(-1, 4)
        boxes[:, 2:] += boxes[:, :2]  # XYWH -> XYXY (wrap_dataset_for_transforms_v2)
        labels = torch.tensor([categories[a["category_id"]] for a in anns], dtype=torch.int64)
        width, height = image.size
        area = width * height
        left, top, w, h = 0, 0, width, height
        for _ in range(10):
            target = area * torch.empty(1).uniform_(0.08, 1.0).item()
            aspect = math.exp(torch.empty(1).uniform_(math.log(3 / 4), math.log(4 / 3)).item())
            cw, ch = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
            if 0 < cw <= width and 0 < ch <= height:
                top = torch.randint(0, height - ch + 1, size=(1,)).item()
                left = torch.randint(0, width - cw + 1, size=(1,)).item()
                w, h = cw, ch
                break
        image = image.crop((left, top, left + w, top + h)).resize((self.size, self.size), Image.Resampling.BILINEAR)
        scale = torch.tensor([self.size / w, self.size / h] * 2)
        boxes = ((boxes - torch.tensor([left, top, left, top], dtype=torch.float32)) * scale).clamp(0, self.size)
        if torch.rand(1) < 0.5:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            boxes = torch.stack([self.size - boxes[:, 2], boxes[:, 1], self.size - boxes[:, 0], boxes[:, 3]], 1)
        keep = ((boxes[:, 2] - boxes[:, 0]) >= 1) & ((boxes[:, 3] - boxes[:, 1]) >= 1)
        pixels = torch.from_numpy(np.array(image, copy=True))  # HWC uint8, like packer's layout="HWC"
        return pixels, {"boxes": boxes[keep], "labels": labels[keep]}


def detection_collate(batch: list[tuple[Any, Any]]) -> tuple[Any, list[Any]]:
    import torch

    images = torch.stack([image for image, _ in batch])
    return images, [target for _, target in batch]


def loader_baseline(images_dir: Path, instances: Path, workers: int, batch: int) -> Any:
    from torch.utils.data import DataLoader

    dataset = CocoDetectionLike(images_dir, instances, V2StyleTransform())
    return DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=workers, collate_fn=detection_collate,
                      persistent_workers=workers > 0)


def loader_torchvision(images_dir: Path, instances: Path, workers: int, batch: int) -> Any:
    import torch
    from torch.utils.data import DataLoader
    from torchvision.datasets import CocoDetection, wrap_dataset_for_transforms_v2
    from torchvision.transforms import v2

    transforms = v2.Compose([v2.RandomResizedCrop(SIZE, antialias=True), v2.RandomHorizontalFlip(),
                             v2.SanitizeBoundingBoxes(), v2.PILToTensor()])
    dataset = wrap_dataset_for_transforms_v2(CocoDetection(str(images_dir), str(instances), transforms=transforms),
                                             target_keys=("boxes", "labels"))

    def collate(batch: list[tuple[Any, Any]]) -> tuple[Any, list[Any]]:
        return torch.stack([image for image, _ in batch]), [target for _, target in batch]

    return DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=workers, collate_fn=collate,
                      persistent_workers=workers > 0)


def loader_packer(packed: Path, workers: int, batch: int) -> Any:
    from packer import ReadOrder
    from packer.torch import PackedBatchSampler, PackedDataLoader, PackedDataset, collate
    from packer.transforms import RandomResizedCrop

    dataset = PackedDataset(packed, fields=("image", "boxes", "labels"), decode=RandomResizedCrop(SIZE),
                            geometry={"boxes": "xyxy", "labels": "per-box"}, layout="HWC")
    sampler = PackedBatchSampler(dataset, batch_size=batch, order=ReadOrder("random", seed=0))
    return PackedDataLoader(dataset, batch_sampler=sampler, num_workers=workers, collate_fn=collate,
                            persistent_workers=workers > 0)


def raw_field_rates(packed: Path, batch: int = 256, seconds: float = 0.5, rounds: int = 5) -> dict[str, float]:
    """read_batch samples/s with and without gathering a fixed-width field alongside: the two
    alternate for ``rounds`` rounds (the machine's noise hits both), median round each."""
    from packer.dataset import open_dataset

    with open_dataset(packed) as ds:
        n = len(ds)
        rng = np.random.default_rng(0)
        image_id = ds.field_array("image_id")

        def plain() -> int:
            ds.read_batch(rng.integers(0, n, batch))
            return batch

        def with_field() -> int:
            idx = rng.integers(0, n, batch)
            ds.read_batch(idx)
            np.asarray(image_id[idx])
            return batch

        results = harness.interleave([("read_batch", lambda: harness.measure(harness.run_for(plain, seconds))),
                                      ("read_batch + image_id",
                                       lambda: harness.measure(harness.run_for(with_field, seconds)))],
                                     rounds, log=None)
    return {row.name: row.rate for row in harness.summarize(results)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--per-round", type=int, default=0, help="images per timed round (default: --images)")
    parser.add_argument("--out", type=Path, default=Path("bench-out/detection"))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    return run(args)


def run(args: argparse.Namespace) -> int:
    instances, images_dir = make_coco(args.out / "src", args.images)
    packed = ensure_packed(instances, images_dir, args.out / "packed", args.workers)
    runs = [("CocoDetection-like + v2-style RRC(512)", lambda: loader_baseline(images_dir, instances, args.workers,
                                                                                 args.batch_size))]
    if have_torchvision():
        runs.append(("torchvision CocoDetection + transforms.v2", lambda: loader_torchvision(
            images_dir, instances, args.workers, args.batch_size)))
    runs.append(("packer fields + RandomResizedCrop(512)", lambda: loader_packer(packed, args.workers,
                                                                                args.batch_size)))
    per_round = args.per_round or args.images
    load = harness.machine_load()
    results = measure_training(runs, rounds=args.rounds, warmup=2, images=per_round * args.rounds,
                               exclude=str(packed))
    print(f"\ndetection-style load: {args.images} JPEGs 500x375, RRC({SIZE}) + flip on image and boxes, "
          f"batch {args.batch_size}, {args.workers} workers, {args.rounds} interleaved rounds (median); "
          + harness.describe_load(load, harness.machine_load()))
    print(harness.table(results, unit="images", name_width=48))
    rates = raw_field_rates(packed)
    plain = rates["read_batch"]
    print("\nraw read_batch(256), random order, one process:")
    for name, rate in rates.items():
        print(f"  {name:28} {rate:12,.0f} samples/s  {rate / plain:5.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"training": [row.as_dict() for row in results], "raw": rates}, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
