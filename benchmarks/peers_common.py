"""What the peer comparisons share: the peers' loaders, the small-image set, the training-style measurement.

``bench_peers.py``, ``bench_small.py`` and ``bench_detection.py`` import this module (and
``harness``), never each other (``tests/project/test_layers.py`` checks it):

* **the ImageFolder baseline**: torchvision's ``ImageFolder`` + ``RandomResizedCrop`` +
  ``RandomHorizontalFlip`` + ``PILToTensor`` when torchvision imports, else ``ImageFolderLike``
  and ``EmulatedTrainTransform``, a transcription of what they do (``os.scandir`` listing into a
  list of ``(path, label)``, ``PIL.Image.open(...).convert("RGB")``, get_params on torch's RNG,
  PIL crop + bilinear resize, flip, tensor);
* **the other peers**: webdataset tar shards and loader, FFCV ``.beton`` writer and loader;
* **the small-image set** (PNGs of ``size`` x ``size`` in 10 classes, CIFAR-like) and packer's
  default DataLoader wiring over it;
* **training-style measurement**: ``loader_stretch`` times a loader's batches after a warm-up
  (``harness.measure``: wall, CPU of this process and its workers, the workers' PSS),
  ``measure_training`` runs loaders in interleaved rounds and returns ``harness.Row``s against
  the first.
"""

from __future__ import annotations

import gc
import io
import json
import math
import os
import random
import tarfile
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

import harness
import make_sample

__all__ = ["have_torchvision", "tv_train_transform", "EmulatedTrainTransform", "pil_loader", "bytes_loader",
           "ImageFolderLike", "image_folder", "loader_imagefolder", "ensure_wds", "loader_webdataset", "have_ffcv",
           "ensure_ffcv", "loader_ffcv", "ensure_small_images", "ensure_small_packed", "loader_packer_default",
           "worker_pss", "forever", "batch_length", "loader_stretch", "measure_training"]


# --- the ImageFolder baseline -------------------------------------------------------------------

def have_torchvision() -> bool:
    try:
        import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001 - e.g. "operator torchvision::nms does not exist"
        return False
    return True


def tv_train_transform(size: int = 224) -> Callable[[Any], Any]:
    """torchvision's RandomResizedCrop(size) + RandomHorizontalFlip + PILToTensor (uint8 CHW)."""
    if have_torchvision():
        from torchvision import transforms as T
        return T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.PILToTensor()])
    return EmulatedTrainTransform(size)


class EmulatedTrainTransform:
    """torchvision's PIL path, transcribed: get_params on torch's RNG, crop, resize, flip."""

    def __init__(self, size: int = 224) -> None:
        self.size = size

    def __call__(self, img: Any) -> Any:
        import torch
        from PIL import Image

        width, height = img.size
        area = width * height
        log_ratio = (math.log(3 / 4), math.log(4 / 3))
        box = None
        for _ in range(10):
            target_area = area * torch.empty(1).uniform_(0.08, 1.0).item()
            aspect = math.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1]).item())
            w = int(round(math.sqrt(target_area * aspect)))
            h = int(round(math.sqrt(target_area / aspect)))
            if 0 < w <= width and 0 < h <= height:
                i = torch.randint(0, height - h + 1, size=(1,)).item()
                j = torch.randint(0, width - w + 1, size=(1,)).item()
                box = (j, i, j + w, i + h)
                break
        if box is None:
            box = (0, 0, width, height)
        img = img.crop(box).resize((self.size, self.size), Image.Resampling.BILINEAR)
        if torch.rand(1) < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return torch.from_numpy(np.array(img, copy=True)).permute(2, 0, 1).contiguous()


def pil_loader(path: str) -> Any:
    from PIL import Image
    with open(path, "rb") as f:  # torchvision.datasets.folder.pil_loader
        return Image.open(f).convert("RGB")


def bytes_loader(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


class ImageFolderLike:
    """torchvision.datasets.ImageFolder's listing and __getitem__, for when it won't import."""

    def __init__(self, root: str, transform: Callable[[Any], Any] | None = None,
                 loader: Callable[[str], Any] = pil_loader) -> None:
        self.classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self.samples = []
        for c in self.classes:
            for dirpath, _, names in sorted(os.walk(os.path.join(root, c), followlinks=True)):
                for name in sorted(names):
                    if name.lower().endswith((".jpg", ".jpeg", ".png")):
                        self.samples.append((os.path.join(dirpath, name), self.class_to_idx[c]))
        self.targets = [s[1] for s in self.samples]
        self.transform, self.loader = transform, loader

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        path, target = self.samples[index]
        sample = self.loader(path)
        return (self.transform(sample) if self.transform else sample), target


def image_folder(root: Path, transform: Callable[[Any], Any] | None,
                 loader: Callable[[str], Any] = pil_loader) -> Any:
    if have_torchvision():
        from torchvision.datasets import ImageFolder
        return ImageFolder(str(root), transform=transform, loader=loader)
    return ImageFolderLike(str(root), transform, loader)


def loader_imagefolder(src: Path, workers: int, batch: int, size: int = 224) -> Any:
    """``DataLoader(image_folder(src, tv_train_transform(size)), shuffle=True)`` with ``workers`` workers."""
    from torch.utils.data import DataLoader
    dataset = image_folder(src, tv_train_transform(size))
    return DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=workers,
                      persistent_workers=workers > 0, drop_last=False)


# --- webdataset -----------------------------------------------------------------------------------

def ensure_wds(files: list[Path], src: Path, out: Path, shards: int) -> list[Path]:
    """Tar shards ``{key}.jpg`` + ``{key}.cls``, samples in a shuffled order (seed 0)."""
    done = out / "done.json"
    if done.exists() and json.loads(done.read_text()) == {"count": len(files), "shards": shards}:
        return sorted(out.glob("shard-*.tar"))
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("shard-*.tar"):
        old.unlink()
    classes = sorted(p.name for p in src.iterdir() if p.is_dir())
    label_of = {name: i for i, name in enumerate(classes)}
    order = list(range(len(files)))
    random.Random(0).shuffle(order)
    per_shard = math.ceil(len(files) / shards)
    paths = []
    for s in range(shards):
        path = out / f"shard-{s:05d}.tar"
        with tarfile.open(path, "w") as tar:
            for i in order[s * per_shard:(s + 1) * per_shard]:
                key = f"{i:08d}"
                for suffix, payload in (("jpg", files[i].read_bytes()),
                                        ("cls", str(label_of[files[i].parent.name]).encode())):
                    info = tarfile.TarInfo(f"{key}.{suffix}")
                    info.size = len(payload)
                    tar.addfile(info, io.BytesIO(payload))
        paths.append(path)
    done.write_text(json.dumps({"count": len(files), "shards": shards}))
    return paths



def loader_webdataset(shards: list[Path], workers: int, batch: int) -> Any:
    import webdataset as wds
    from torch.utils.data import DataLoader
    transform = tv_train_transform()
    dataset = (wds.WebDataset([str(p) for p in shards], shardshuffle=len(shards), empty_check=False)
               .shuffle(1000).decode("pil").to_tuple("jpg", "cls")
               .map_tuple(transform, int).batched(batch))
    return DataLoader(dataset, batch_size=None, num_workers=workers, persistent_workers=workers > 0)



# --- FFCV -----------------------------------------------------------------------------------------

def have_ffcv() -> str | None:
    """Why FFCV cannot run here, or None when it imports."""
    try:
        import ffcv  # noqa: F401
        from ffcv.loader import Loader  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure means "skip FFCV"
        return f"{type(exc).__name__}: {exc}"
    return None


class _PILFolder:
    """(PIL image, label) of an ImageFolder tree, in sorted order: what FFCV's writer reads."""

    def __init__(self, root: Path) -> None:
        self.samples = image_folder(root, None, loader=bytes_loader).samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        path, label = self.samples[index]
        return pil_loader(path), label


def ensure_ffcv(src: Path, out: Path, mode: str, workers: int) -> Path:
    """Write (or reuse) an FFCV ``.beton`` of ``src``: ``mode`` ``"jpg"`` (quality 90) or ``"raw"``."""
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter

    count = len(image_folder(src, None, loader=bytes_loader))
    done = out.with_suffix(".done")
    if out.exists() and done.exists() and done.read_text() == f"{count} {mode}":
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    writer = DatasetWriter(str(out), {"image": RGBImageField(write_mode=mode, jpeg_quality=90),
                                      "label": IntField()}, num_workers=max(1, workers))
    writer.from_indexed_dataset(_PILFolder(src))
    done.write_text(f"{count} {mode}")
    return out


def loader_ffcv(path: Path, workers: int, batch: int, size: int) -> Any:
    """FFCV's training pipeline: RandomResizedCrop + flip -> uint8 NCHW (``ToTorchImage``), random order."""
    from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip, Squeeze, ToTensor, ToTorchImage

    return Loader(str(path), batch_size=batch, num_workers=workers, order=OrderOption.RANDOM, os_cache=True,
                  drop_last=False, seed=0,
                  pipelines={"image": [RandomResizedCropRGBImageDecoder((size, size)), RandomHorizontalFlip(),
                                       ToTensor(), ToTorchImage()],
                             "label": [IntDecoder(), ToTensor(), Squeeze()]})


# --- the small-image set --------------------------------------------------------------------------

def ensure_small_images(root: Path, count: int, size: int) -> None:
    """``count`` PNGs of ``size`` x ``size`` in 10 class folders (``make_sample``; reused when there)."""
    marker = root / f".done-{count}-{size}"
    if marker.exists():
        return
    make_sample.make_image_folder(root, classes=10, per_class=count // 10, seed=0, min_size=size,
                                  max_size=size, formats=("png",))
    marker.write_text("ok")


def ensure_small_packed(src: Path, out: Path, codec: str, workers: int) -> Path:
    """``src`` packed with ``codec`` into ``out`` (reused when a dataset is there)."""
    if not (out / "manifest.json").exists():
        from packer.writer import build
        from packer.writer.plan import BuildOptions
        build(src, out, BuildOptions(codec=codec, shard_size=256 << 20), workers=workers, progress=False)
    return out


def loader_packer_default(packed: Path, workers: int, batch: int, size: int, *, decode: Any = None) -> Any:
    """packer's default wiring: ``PackedDataset(decode=RandomResizedCrop(size, seed=0))`` +
    ``PackedBatchSampler`` + ``collate`` in a DataLoader (``decode`` replaces the crop)."""
    from torch.utils.data import DataLoader

    from packer import ReadOrder
    from packer.torch import PackedBatchSampler, PackedDataset, collate
    from packer.transforms import RandomResizedCrop
    dataset = PackedDataset(packed, decode=RandomResizedCrop(size, seed=0) if decode is None else decode)
    sampler = PackedBatchSampler(dataset, batch_size=batch, order=ReadOrder("random", seed=0))
    return DataLoader(dataset, batch_sampler=sampler, collate_fn=collate, num_workers=workers,
                      persistent_workers=workers > 0)


# --- training-style measurement -------------------------------------------------------------------

def worker_pss(pid: int, exclude: str) -> tuple[int, int] | None:
    """``(PSS, PSS outside mappings of files under exclude)`` of a process, in bytes.

    A worker that memory-maps the shards counts the page-cache pages it touched in its PSS
    (shared with the kernel's cache, reclaimable); a worker that read()s files does not. The
    second number leaves those file mappings out, so the two kinds compare like with like.
    """
    total = outside = 0
    name = ""
    try:
        with open(f"/proc/{pid}/smaps") as handle:
            for line in handle:
                parts = line.split()
                if not parts:
                    continue
                if not parts[0].endswith(":"):
                    name = " ".join(parts[5:]) if len(parts) > 5 else ""
                elif parts[0] == "Pss:":
                    value = int(parts[1]) * 1024
                    total += value
                    if not name.startswith(exclude):
                        outside += value
    except OSError:
        return None
    return total, outside


def forever(loader: Any) -> Iterator[Any]:
    """Batches of ``loader``, epoch after epoch (``set_epoch`` where the loader has one)."""
    epoch = 0
    while True:
        for target in (loader, getattr(loader, "batch_sampler", None), getattr(loader, "dataset", None)):
            if hasattr(target, "set_epoch"):
                target.set_epoch(epoch)
        yield from loader
        epoch += 1


def batch_length(batch: Any) -> int:
    """Samples in a batch: ``(images, labels)`` tuples, FFCV's ``[images, labels]``, or dict batches."""
    if isinstance(batch, dict):
        first = batch["image"] if "image" in batch else next(iter(batch.values()))
        return len(first)
    return len(batch[1])


def loader_stretch(make: Callable[[], Any], *, warmup: int, images: int, exclude: str = "") -> harness.Stretch:
    """Make a loader, discard ``warmup`` batches, then time ``images`` samples (``harness.measure``:
    wall, CPU of this process and its workers); the workers' PSS goes into ``extra``."""
    loader = make()
    iterator = forever(loader)
    for _ in range(warmup):
        next(iterator)

    def body() -> dict[str, Any]:
        seen = 0
        while seen < images:
            seen += batch_length(next(iterator))
        pss = [p for p in (worker_pss(pid, exclude) for pid in harness.child_pids()) if p is not None]
        return {"items": seen, "worker_pss_mb": [round(p[0] / 2**20, 1) for p in pss],
                "worker_pss_excl_shards_mb": [round(p[1] / 2**20, 1) for p in pss]}

    stretch = harness.measure(body)
    iterator.close()
    inner = getattr(loader, "_iterator", None)
    if inner is not None and hasattr(inner, "_shutdown_workers"):
        inner._shutdown_workers()
    if hasattr(loader, "close") and not hasattr(loader, "_iterator"):
        try:
            loader.close()
        except Exception:  # noqa: BLE001 - a peer's close is not what is measured
            pass
    del loader, iterator
    gc.collect()
    return stretch


def measure_training(runs: list[tuple[str, Callable[[], Any]]], *, rounds: int, warmup: int,
                     images: int, exclude: str = "") -> list[harness.Row]:
    """Each loader ``rounds`` times, interleaved; ``harness.Row``s against the first loader."""
    per_round = max(1, images // rounds)
    results = harness.interleave([(name, lambda make=make: loader_stretch(make, warmup=warmup, images=per_round,
                                                                          exclude=exclude))
                                  for name, make in runs], rounds, unit="images")
    return harness.summarize(results)
