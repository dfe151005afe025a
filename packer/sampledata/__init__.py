"""Sample data to follow the documentation with: real photographs in the folders the guides name.

``write_sample_data(OUT)`` (the command ``packer sample-data OUT``) writes, from five small
public-domain and CC0 photographs shipped in ``packer/sampledata/photos/`` (``PHOTOS.md`` there
states each one's source and licence):

* ``imagenet/train/<class>/NNN.jpg``: crops of four photographs (classes ``astronaut``, ``cat``,
  ``coffee``, ``rocket``), each cut at a random place and scale, some mirrored, resized so the
  longer side is 64 to 160 pixels, saved as JPEGs of quality 80 to 92;
* ``imagenet/val/<class>/NNN.jpg``: the same for a validation split that lacks ``cat`` (so a build
  with ``--classes-from`` shows that labels still agree);
* ``cifar/train/<class>/NNN.png``: 32x32 PNG crops, for the small-images guide;
* ``more/<class>/NNN.jpg``: two more cats and a new class, ``galaxy``, for ``packer append``;
* ``list.csv`` (``path,label,caption``, paths relative to ``imagenet/train``) and ``list.jsonl``
  (``{"path", "label", "metadata"}``, paths relative to the file's folder): manifests of the
  training split;
* ``coco/images/*.jpg`` and ``coco/instances.json``: a COCO detection file over the photographs
  (boxes drawn by eye, 0 to 2 per image);
* ``PHOTOS.md``: the photographs' licences.

Every byte depends only on the arguments and the Pillow and libjpeg versions: the crops are drawn
from ``numpy.random.default_rng`` with a fixed seed per image. Nothing is written over: an entry
of ``OUT`` that already exists refuses the call before anything is written, and the entries are
made in a hidden folder inside ``OUT``, then renamed into place.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

from ..errors import OptionError

__all__ = ["CLASSES", "ENTRIES", "SampleData", "write_sample_data"]

#: The training classes, one photograph each.
CLASSES = ("astronaut", "cat", "coffee", "rocket")
#: The class that only ``more/`` holds (a new class for ``packer append``).
NEW_CLASS = "galaxy"
#: What ``write_sample_data`` makes in ``OUT``.
ENTRIES = ("imagenet", "cifar", "more", "coco", "list.csv", "list.jsonl", "PHOTOS.md")
#: Each photograph's objects for the COCO file: (category, x0, y0, x1, y1) as fractions of the
#: width and height, drawn by eye.
_OBJECTS = {
    "astronaut": (("person", 0.05, 0.03, 0.75, 1.0), ("rocket", 0.70, 0.0, 0.93, 0.62)),
    "cat": (("cat", 0.0, 0.0, 0.86, 1.0),),
    "coffee": (("cup", 0.13, 0.03, 0.80, 1.0),),
    "rocket": (("rocket", 0.46, 0.28, 0.54, 0.96),),
    "galaxy": (),
}
#: COCO category ids (the COCO 2017 ids where COCO has the category).
_CATEGORIES = {"person": 1, "cat": 17, "cup": 47, "rocket": 100}


@dataclass(frozen=True)
class SampleData:
    """What ``write_sample_data`` wrote: ``OUT`` and the count of images in each folder."""

    root: Path
    counts: dict[str, int]

    def to_json(self) -> dict[str, object]:
        return {"root": str(self.root), "counts": dict(self.counts), "entries": list(ENTRIES)}


def _photo(name: str) -> Image.Image:
    with resources.files(__name__).joinpath("photos", f"{name}.jpg").open("rb") as file:
        return Image.open(io.BytesIO(file.read())).convert("RGB")


def _crop(photo: Image.Image, rng: np.random.Generator, *, square: bool = False) -> Image.Image:
    """A random crop of 35 to 100 % of the photo's area (aspect 3:4 to 4:3, or square), maybe mirrored."""
    width, height = photo.size
    area = width * height * rng.uniform(0.35, 1.0)
    aspect = 1.0 if square else float(np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3))))
    w = int(min(width, round((area * aspect) ** 0.5)))
    h = int(min(height, round((area / aspect) ** 0.5)))
    if square:
        w = h = min(w, h)
    left = int(rng.integers(0, width - w + 1))
    top = int(rng.integers(0, height - h + 1))
    crop = photo.crop((left, top, left + w, top + h))
    return ImageOps.mirror(crop) if rng.random() < 0.5 else crop


def _save_jpeg(image: Image.Image, path: Path, rng: np.random.Generator) -> None:
    longer = int(rng.integers(64, 161))
    scale = longer / max(image.size)
    size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    path.parent.mkdir(parents=True, exist_ok=True)
    image.resize(size, Image.Resampling.LANCZOS).save(path, "JPEG", quality=int(rng.integers(80, 93)))


def _write_split(root: Path, classes: tuple[str, ...], count: int, seed: int, first: int = 0) -> int:
    written = 0
    for number, name in enumerate(classes):
        photo = _photo(name)
        for i in range(first, first + count):
            rng = np.random.default_rng([seed, number, i])
            _save_jpeg(_crop(photo, rng), root / name / f"{i:03d}.jpg", rng)
            written += 1
    return written


def _write_cifar(root: Path, count: int) -> int:
    for number, name in enumerate(CLASSES):
        photo = _photo(name)
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            rng = np.random.default_rng([3, number, i])
            _crop(photo, rng, square=True).resize((32, 32), Image.Resampling.LANCZOS).save(root / name / f"{i:03d}.png")
    return count * len(CLASSES)


def _write_manifests(out: Path) -> None:
    train = out / "imagenet" / "train"
    files = [f"{name}/{path.name}" for name in CLASSES for path in sorted((train / name).iterdir())]
    with open(out / "list.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["path", "label", "caption"])
        for path in files:
            label = path.split("/")[0]
            writer.writerow([path, label, f"a photo of a {label}"])
    with open(out / "list.jsonl", "w", encoding="utf-8") as handle:
        for number, path in enumerate(files):
            row = {"path": f"imagenet/train/{path}", "label": path.split("/")[0], "metadata": {"n": number}}
            handle.write(json.dumps(row) + "\n")


def _write_coco(root: Path) -> int:
    images_dir = root / "images"
    images_dir.mkdir(parents=True)
    document: dict[str, list[dict[str, object]]] = {
        "images": [], "annotations": [],
        "categories": [{"id": number, "name": name} for name, number in sorted(_CATEGORIES.items(), key=lambda kv: kv[1])]}
    for image_id, name in enumerate((*CLASSES, NEW_CLASS), start=1):
        photo = _photo(name)
        scale = 160 / max(photo.size)
        photo = photo.resize((round(photo.width * scale), round(photo.height * scale)), Image.Resampling.LANCZOS)
        file_name = f"{image_id:012d}.jpg"
        photo.save(images_dir / file_name, "JPEG", quality=88)
        document["images"].append({"id": image_id, "file_name": file_name, "width": photo.width,
                                   "height": photo.height})
        for k, (category, x0, y0, x1, y1) in enumerate(_OBJECTS[name]):
            box = [round(x0 * photo.width, 1), round(y0 * photo.height, 1),
                   round((x1 - x0) * photo.width, 1), round((y1 - y0) * photo.height, 1)]
            document["annotations"].append({"id": 10 * image_id + k, "image_id": image_id,
                                            "category_id": _CATEGORIES[category], "bbox": box,
                                            "area": round(box[2] * box[3], 1), "iscrowd": 0})
    (root / "instances.json").write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    return len(document["images"])


def write_sample_data(out: str | os.PathLike[str], *, per_class: int = 16) -> SampleData:
    """Write the sample folders, manifests and COCO file into ``out`` (see the module docstring).

    Args:
        out: a folder, created when missing; none of ``ENTRIES`` may exist in it.
        per_class: training images per class (the validation split has 2 per class, the
            32x32 set 20, ``more/`` 3 images).

    Returns:
        Where it wrote and how many images went into each folder.

    Raises:
        OptionError: ``per_class`` below 2, ``out`` not a folder, or an entry already there.
    """
    if isinstance(per_class, bool) or not isinstance(per_class, int) or per_class < 2:
        raise OptionError(f"per_class must be an integer of at least 2, got {per_class!r}")
    root = Path(out)
    if root.exists() and not root.is_dir():
        raise OptionError(f"{root} is not a folder: sample data goes into a folder")
    present = [name for name in ENTRIES if os.path.lexists(root / name)]
    if present:
        raise OptionError(f"{root} already holds {', '.join(present)}: sample data never writes over anything; "
                          f"remove them or pick another folder")
    root.mkdir(parents=True, exist_ok=True)
    stage = root / f".packer-sample-data-{os.getpid()}"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir()
    try:
        counts = {
            "imagenet/train": _write_split(stage / "imagenet" / "train", CLASSES, per_class, seed=0),
            "imagenet/val": _write_split(stage / "imagenet" / "val", tuple(c for c in CLASSES if c != "cat"), 2,
                                         seed=1),
            "cifar/train": _write_cifar(stage / "cifar" / "train", 20),
            "more": (_write_split(stage / "more", ("cat",), 2, seed=2, first=100)
                     + _write_split(stage / "more", (NEW_CLASS,), 1, seed=2)),
            "coco/images": _write_coco(stage / "coco"),
        }
        _write_manifests(stage)
        with resources.files(__name__).joinpath("photos", "PHOTOS.md").open("rb") as file:
            (stage / "PHOTOS.md").write_bytes(file.read())
        for name in ENTRIES:
            os.replace(stage / name, root / name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return SampleData(root=root, counts=counts)
