"""packer.tvtensors with the real torchvision (``make test-torchvision``: torchvision does not
import beside the main venv's torch): a v2 pipeline applied to packer's samples equals the same
pipeline applied to torchvision's own ``CocoDetection`` and ``VOCSegmentation`` samples, wrapped
by ``wrap_dataset_for_transforms_v2``, for the same images."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytestmark = pytest.mark.torchvision

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision", reason="needs torchvision: make test-torchvision")
from torchvision import datasets as tv_datasets  # noqa: E402
from torchvision import tv_tensors  # noqa: E402
from torchvision.transforms import v2  # noqa: E402

from packer import OptionError  # noqa: E402
from packer.sources.coco import coco_categories  # noqa: E402
from packer.tvtensors import TvTensorDataset, collate_pairs  # noqa: E402
from packer.writer import build  # noqa: E402
from packer.writer.plan import BuildOptions  # noqa: E402

CATEGORIES = [{"id": 3, "name": "car"}, {"id": 1, "name": "person"}, {"id": 18, "name": "dog"}]


def _pixels(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    # smooth gradients plus noise: resampling differences would show, and PNG keeps them exactly
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // width, y * 255 // height, (x + y) * 255 // (width + height)], -1)
    return np.clip(base + rng.integers(-20, 20, base.shape), 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def coco(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A COCO source of 6 PNG images (0-3 boxes each, one crowd box) and its packer build."""
    root = tmp_path_factory.mktemp("coco")
    images = root / "images"
    images.mkdir()
    rng = np.random.default_rng(3)
    document: dict = {"images": [], "annotations": [], "categories": CATEGORIES}
    for i in range(6):
        height, width = 40 + 4 * i, 56 - 2 * i
        name = f"{i:06d}.png"
        Image.fromarray(_pixels(rng, height, width)).save(images / name)
        document["images"].append({"id": 100 + i, "file_name": name, "width": width, "height": height})
        for k in range(i % 4):
            x, y = 2.0 + 6 * k, 3.5 + 2 * k
            w, h = 12.0 + 3 * k, 15.25 + k
            document["annotations"].append({"id": 1000 + 10 * i + k, "image_id": 100 + i, "bbox": [x, y, w, h],
                                            "category_id": CATEGORIES[(i + k) % 3]["id"], "area": w * h,
                                            "iscrowd": int(k == 2)})
    (root / "instances.json").write_text(json.dumps(document))
    build(root / "instances.json", root / "packed", BuildOptions(shard_size=16 << 10), root=images, workers=1)
    return {"images": images, "annotations": root / "instances.json", "packed": root / "packed"}


@pytest.fixture(scope="module")
def voc(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A VOC 2012 segmentation layout of 4 images with palette masks, and its packer build."""
    root = tmp_path_factory.mktemp("voc")
    base = root / "VOCdevkit" / "VOC2012"
    for folder in ("JPEGImages", "SegmentationClass", "ImageSets/Segmentation"):
        (base / folder).mkdir(parents=True)
    rng = np.random.default_rng(5)
    names, rows = [], []
    for i in range(4):
        name = f"2012_{i:06d}"
        height, width = 36 + 2 * i, 48
        # PNG bytes under VOC's .jpg name: Pillow (torchvision) and packer both decide by the bytes
        Image.fromarray(_pixels(rng, height, width)).save(base / "JPEGImages" / f"{name}.jpg", format="PNG")
        ids = np.zeros((height, width), np.uint8)
        ids[5:30, 4 + 8 * i:24 + 8 * i] = 1 + i % 3
        ids[0:3, :] = 255  # VOC's "void" border value
        mask = Image.fromarray(ids, mode="P")
        mask.putpalette([0, 0, 0, 128, 0, 0, 0, 128, 0, 128, 128, 0] + [224, 224, 192] * 252)
        mask.save(base / "SegmentationClass" / f"{name}.png")
        names.append(name)
        rows.append({"path": f"JPEGImages/{name}.jpg", "mask": f"SegmentationClass/{name}.png", "name": name})
    (base / "ImageSets" / "Segmentation" / "train.txt").write_text("\n".join(names) + "\n")
    (base / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    build(base / "rows.jsonl", root / "packed", BuildOptions(shard_size=16 << 10, fields=("mask=image", "name=text")),
          workers=1)
    return {"root": root, "packed": root / "packed"}


def _pipeline(sanitize: bool = True) -> v2.Compose:
    return v2.Compose([
        v2.ToImage(),  # torchvision's PIL image -> tv_tensors.Image; packer's passes through
        v2.RandomResizedCrop((32, 40), scale=(0.3, 1.0), antialias=True),
        v2.RandomHorizontalFlip(),
        v2.RandomPhotometricDistort(p=1.0),
        v2.ToDtype(torch.float32, scale=True),
        *([v2.SanitizeBoundingBoxes(min_size=1.0)] if sanitize else []),
    ])


def test_a_v2_pipeline_gives_the_same_detection_samples_as_torchvisions_coco(coco):
    reference = tv_datasets.wrap_dataset_for_transforms_v2(
        tv_datasets.CocoDetection(str(coco["images"]), str(coco["annotations"])),
        target_keys={"image_id", "boxes", "labels"})
    packed = TvTensorDataset(coco["packed"], fields=("image", "image_id", "boxes", "labels"))
    coco_ids = [coco_id for coco_id, _ in coco_categories(packed.dataset.field_spec("labels").source)]
    by_image_id = {int(packed[i][1]["image_id"]): i for i in range(len(packed))}
    compared = boxes_seen = 0
    for j in range(len(reference)):
        # torchvision's wrapper gives an image without annotations no "boxes" at all, which
        # SanitizeBoundingBoxes refuses; packer gives it (0, 4) boxes
        empty = "boxes" not in reference[j][1]
        pipeline = _pipeline(sanitize=not empty)
        for seed in (0, 1, 2):
            torch.manual_seed(seed)
            theirs_image, theirs = pipeline(*reference[j])
            i = by_image_id[theirs["image_id"]]
            torch.manual_seed(seed)
            ours_image, ours = pipeline(*packed[i])
            assert type(ours_image) is tv_tensors.Image and ours_image.dtype == torch.float32
            assert torch.equal(ours_image, theirs_image)
            if empty:
                assert ours["boxes"].shape == (0, 4) and ours["labels"].shape == (0,)
                continue
            assert isinstance(ours["boxes"], tv_tensors.BoundingBoxes)
            assert ours["boxes"].format == theirs["boxes"].format == tv_tensors.BoundingBoxFormat.XYXY
            assert ours["boxes"].canvas_size == theirs["boxes"].canvas_size == (32, 40)
            torch.testing.assert_close(ours["boxes"].as_subclass(torch.Tensor),
                                       theirs["boxes"].as_subclass(torch.Tensor), atol=1e-4, rtol=0)
            assert [coco_ids[k] for k in ours["labels"].tolist()] == theirs["labels"].tolist()
            compared += 1
            boxes_seen += len(theirs["boxes"])
    assert compared == 12 and boxes_seen > 10  # boxes survived the crops (not a vacuous comparison)


def test_before_any_transform_the_samples_are_torchvisions(coco):
    reference = tv_datasets.wrap_dataset_for_transforms_v2(
        tv_datasets.CocoDetection(str(coco["images"]), str(coco["annotations"])),
        target_keys={"image_id", "boxes", "labels"})
    packed = TvTensorDataset(coco["packed"], fields=("image", "image_id", "boxes", "labels"))
    by_image_id = {int(packed[i][1]["image_id"]): i for i in range(len(packed))}
    for j in range(len(reference)):
        theirs_image, theirs = reference[j]
        ours_image, ours = packed[by_image_id[theirs["image_id"]]]
        assert torch.equal(ours_image, v2.functional.pil_to_tensor(theirs_image))
        if "boxes" not in theirs:
            assert len(ours["boxes"]) == 0
            continue
        assert ours["boxes"].canvas_size == theirs["boxes"].canvas_size == tuple(ours_image.shape[-2:])
        torch.testing.assert_close(ours["boxes"].as_subclass(torch.Tensor), theirs["boxes"].as_subclass(torch.Tensor))


def test_masks_move_with_the_image_like_torchvisions_voc_segmentation(voc):
    raw = tv_datasets.VOCSegmentation(str(voc["root"]), year="2012", image_set="train")
    reference = tv_datasets.wrap_dataset_for_transforms_v2(raw)
    packed = TvTensorDataset(voc["packed"], fields=("image", "mask", "name"))
    by_name = {packed[i][1]["name"]: i for i in range(len(packed))}
    pipeline = _pipeline(sanitize=False)  # no boxes here
    for j in range(len(reference)):
        name = Path(raw.images[j]).stem
        for seed in (0, 1):
            torch.manual_seed(seed)
            theirs_image, theirs_mask = pipeline(*reference[j])
            torch.manual_seed(seed)
            ours_image, ours = pipeline(*packed[by_name[name]])
            assert type(ours["mask"]) is tv_tensors.Mask and ours["mask"].dtype == torch.uint8
            assert torch.equal(ours_image, theirs_image)
            assert torch.equal(ours["mask"].reshape(theirs_mask.shape), theirs_mask)
            assert set(torch.unique(ours["mask"]).tolist()) <= {0, 1, 2, 3, 255}


def test_batches_and_options(coco):
    packed = TvTensorDataset(coco["packed"], transforms=v2.Compose([v2.Resize((20, 24), antialias=True)]))
    assert packed.fields == ("image", "boxes", "labels", "iscrowd", "area", "image_id")
    assert packed.boxes == ("boxes",) and packed.masks == ()
    loader = torch.utils.data.DataLoader(packed, batch_size=4, collate_fn=collate_pairs, num_workers=1)
    images, targets = next(iter(loader))
    assert [tuple(image.shape) for image in images] == [(3, 20, 24)] * 4
    assert all(target["boxes"].canvas_size == (20, 24) for target in targets)
    assert all(len(target["boxes"]) == len(target["labels"]) == len(target["iscrowd"]) for target in targets)
    with pytest.raises(OptionError, match="must start with 'image'"):
        TvTensorDataset(coco["packed"], fields=("boxes", "image"))
    with pytest.raises(OptionError, match="decode=False"):
        TvTensorDataset(coco["packed"], decode=False)
    with pytest.raises(OptionError, match="declared as an array of shape"):
        TvTensorDataset(coco["packed"], fields=("image", "area"), boxes=("area",))
    with pytest.raises(OptionError, match="box_format"):
        TvTensorDataset(coco["packed"], box_format="xyxy")
    with pytest.raises(OptionError, match="mask field 'area' must be among the fields and declared as an image"):
        TvTensorDataset(coco["packed"], fields=("image", "area"), masks=("area",))
    xywh = TvTensorDataset(coco["packed"], fields=("image", "boxes"), box_format="XYWH")
    assert xywh[0][1]["boxes"].format == tv_tensors.BoundingBoxFormat.XYWH
