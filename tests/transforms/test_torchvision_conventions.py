"""Geometry conventions against torchvision's: the reported crop box stays inside the image, masks
are resized with torchvision's ``NEAREST`` by default (``NEAREST_EXACT`` on request), bit for bit
with torch's kernels, and moved boxes are sanitized with ``SanitizeBoundingBoxes``' ``min_size`` and
``min_area`` (torchvision's defaults). Without torchvision (it does not import beside this venv's
torch), torchvision's rules are torch's ``interpolate`` (which ``v2`` calls for masks) and its
documented formulas written out here; the tests marked ``torchvision`` compare with the real one."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from packer.errors import OptionError  # noqa: E402
from packer.format import ImageFormat  # noqa: E402
from packer.transforms import CenterCrop, CropGeometry, RandomResizedCrop  # noqa: E402
from packer.transforms.geometry import (  # noqa: E402
    DEFAULT_MASK_INTERPOLATION,
    DEFAULT_MIN_BOX_AREA,
    DEFAULT_MIN_BOX_SIZE,
    MASK_INTERPOLATIONS,
)


def _jpeg(width: int, height: int, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


# --- the crop box never extends past the image -------------------------------------------------------

@pytest.mark.parametrize("size", [(427, 333), (333, 427), (639, 479), (101, 77)])
@pytest.mark.parametrize("backend", ["torch", "pil"])
def test_the_reported_crop_box_is_inside_the_image(size: tuple[int, int], backend: str) -> None:
    width, height = size
    data = _jpeg(width, height)
    transforms = [RandomResizedCrop(24, scale=(0.6, 1.0), seed=1, resize_backend=backend),
                  CenterCrop(24, resize=28, resize_backend=backend)]
    for transform in transforms:
        for index in range(40):  # whole-image boxes at a DCT scale of 1/4 or 1/8 included
            pixels, geometry = transform.decode_with_geometry(data, ImageFormat.JPEG, index=index)
            left, top, right, bottom = geometry.box
            assert 0 <= left < right <= width and 0 <= top < bottom <= height, (transform, index, geometry.box)
            assert pixels.shape == (24, 24, 3)


# --- masks: torchvision's NEAREST by default, NEAREST_EXACT on request -------------------------------

def test_the_mask_default_is_torchvisions_nearest() -> None:
    assert DEFAULT_MASK_INTERPOLATION == "nearest" and MASK_INTERPOLATIONS == ("nearest", "nearest-exact")
    assert RandomResizedCrop(8).mask_interpolation == "nearest" == CenterCrop(8, resize=8).mask_interpolation

    class InterpolationMode:  # how torchvision spells it: an enum whose value is torch's mode name
        def __init__(self, value: str) -> None:
            self.value = value

    assert RandomResizedCrop(8, mask_interpolation=InterpolationMode("nearest-exact")).mask_interpolation \
        == "nearest-exact"
    with pytest.raises(OptionError, match="NEAREST / NEAREST_EXACT"):
        RandomResizedCrop(8, mask_interpolation="bilinear")


def _torch_resize(mask: np.ndarray, size: tuple[int, int], mode: str) -> np.ndarray:
    """What torchvision.transforms.v2 does to a tv_tensors.Mask: torch's interpolate, this mode."""
    tensor = torch.from_numpy(np.ascontiguousarray(mask))[None, None].float()
    return F.interpolate(tensor, size=size, mode=mode)[0, 0].to(torch.uint8).numpy()


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact"])
def test_random_crops_resize_masks_bit_for_bit_as_torch(mode: str) -> None:
    rng = np.random.default_rng(0)
    for trial in range(60):
        height, width = int(rng.integers(20, 300)), int(rng.integers(20, 300))
        mask = rng.integers(0, 255, (height, width), dtype=np.uint8)
        out = (int(rng.integers(5, 120)), int(rng.integers(5, 120)))
        transform = RandomResizedCrop(out, scale=(0.05, 1.0), seed=trial, mask_interpolation=mode)
        geometry = transform.geometry(width, height, index=trial)
        left, top, right, bottom = (int(v) for v in geometry.box)
        assert geometry.box == (left, top, right, bottom)  # a random crop is whole pixels
        # torchvision's resized_crop: crop, then resize, then (RandomHorizontalFlip) flip
        expected = _torch_resize(mask[top:bottom, left:right], out, mode)
        if geometry.flip:
            expected = expected[:, ::-1]
        np.testing.assert_array_equal(geometry.resample_nearest(mask, mode), expected, err_msg=str(trial))


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact"])
def test_centre_crops_resize_masks_bit_for_bit_as_torch(mode: str) -> None:
    rng = np.random.default_rng(1)
    for trial in range(40):
        height, width = int(rng.integers(30, 400)), int(rng.integers(30, 400))
        mask = rng.integers(0, 255, (height, width), dtype=np.uint8)
        crop = int(rng.integers(8, 60))
        resize = crop + int(rng.integers(0, 30))
        transform = CenterCrop(crop, resize=resize, resize_backend="torch", mask_interpolation=mode)
        geometry = transform.geometry(width, height)
        # torchvision: Resize(resize) (shorter side; the longer int(resize * long / short)), then CenterCrop
        new_h, new_w = (int(resize * height / width), resize) if width <= height else (resize, int(resize * width / height))
        top, left = int(round((new_h - crop) / 2.0)), int(round((new_w - crop) / 2.0))
        expected = _torch_resize(mask, (new_h, new_w), mode)[top:top + crop, left:left + crop]
        np.testing.assert_array_equal(geometry.resample_nearest(mask, mode), expected, err_msg=str(trial))


def test_the_two_modes_differ_as_documented() -> None:
    mask = np.arange(10, dtype=np.uint8)[None, :].repeat(2, 0)  # column j holds j
    geometry = CropGeometry(box=(0.0, 0.0, 10.0, 2.0), flip=False, size=(2, 4), source_size=(10, 2))
    # 10 -> 4 columns: nearest takes floor(i * 2.5) = 0, 2, 5, 7; nearest-exact floor((i + .5) * 2.5) = 1, 3, 6, 8
    assert geometry.resample_nearest(mask, "nearest")[0].tolist() == [0, 2, 5, 7]
    assert geometry.resample_nearest(mask, "nearest-exact")[0].tolist() == [1, 3, 6, 8]
    assert geometry.resample_nearest(mask)[0].tolist() == [0, 2, 5, 7]


# --- boxes: SanitizeBoundingBoxes(min_size=1, min_area=1) -----------------------------------------------

def _sanitize(boxes: np.ndarray, canvas: tuple[int, int], min_size: float, min_area: float) -> np.ndarray:
    """torchvision.transforms.v2.functional._misc._get_sanitize_bounding_boxes_mask, written out (XYXY)."""
    ws, hs = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    valid = (ws >= min_size) & (hs >= min_size) & (boxes >= 0).all(axis=-1) & (ws * hs >= min_area)
    image_h, image_w = canvas
    valid &= (boxes[:, 0] <= image_w) & (boxes[:, 2] <= image_w)
    valid &= (boxes[:, 1] <= image_h) & (boxes[:, 3] <= image_h)
    return valid


@pytest.mark.parametrize("min_size, min_area", [(DEFAULT_MIN_BOX_SIZE, DEFAULT_MIN_BOX_AREA), (2.0, 1.0),
                                                (1.0, 9.0), (0.0, 0.0)])
def test_moved_boxes_are_sanitized_as_torchvision(min_size: float, min_area: float) -> None:
    assert (DEFAULT_MIN_BOX_SIZE, DEFAULT_MIN_BOX_AREA) == (1.0, 1.0)  # SanitizeBoundingBoxes' defaults
    rng = np.random.default_rng(3)
    geometry = CropGeometry(box=(10.0, 20.0, 110.0, 70.0), flip=True, size=(25, 50), source_size=(200, 100))
    x1 = rng.uniform(-20, 130, 500)
    y1 = rng.uniform(0, 90, 500)
    boxes = np.stack([x1, y1, x1 + rng.exponential(3, 500), y1 + rng.exponential(3, 500)], axis=1)
    mapped, keep = geometry.map_boxes(boxes, min_size=min_size, min_area=min_area)
    _, some_left = geometry.map_boxes(boxes, min_size=0.0, min_area=0.0)  # packer's own rule: any area left
    expected = some_left & _sanitize(mapped.astype(np.float64), geometry.size, min_size, min_area)
    np.testing.assert_array_equal(keep, expected)
    if min_size or min_area:
        assert 0 < keep.sum() < some_left.sum()  # the table has boxes on both sides of the line


def test_a_sliver_box_through_packed_dataset(tmp_path) -> None:
    import json

    from packer.torch import PackedDataset
    from packer.writer import BuildOptions, build

    (tmp_path / "img").mkdir()
    Image.fromarray(np.zeros((40, 40, 3), np.uint8)).save(tmp_path / "img" / "0.png")
    row = {"path": "img/0.png", "label": 0, "boxes": [[10, 10, 10.5, 30], [5, 5, 35, 35]]}
    (tmp_path / "rows.jsonl").write_text(json.dumps(row) + "\n")
    build(tmp_path / "rows.jsonl", tmp_path / "ds", BuildOptions(fields=("boxes=float32[N,4]",)), workers=1,
          progress=False)
    fields = dict(fields=("image", "boxes"), geometry={"boxes": "xyxy"})
    default = PackedDataset(tmp_path / "ds", decode=CenterCrop(40, resize=40), **fields)[0]
    assert default["boxes"].tolist() == [[5.0, 5.0, 35.0, 35.0]]  # the 0.5 px wide box is dropped
    kept = PackedDataset(tmp_path / "ds", decode=CenterCrop(40, resize=40, min_box_size=0, min_box_area=0), **fields)[0]
    assert len(kept["boxes"]) == 2
    with pytest.raises(OptionError, match="min_box_size must be a non-negative number"):
        CenterCrop(40, resize=40, min_box_size=-1)


# --- against the real torchvision (the .venv-tv environment) ----------------------------------------

@pytest.mark.torchvision
def test_masks_and_boxes_match_real_torchvision() -> None:
    pytest.importorskip("torchvision")
    from torchvision import tv_tensors
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms.v2 import SanitizeBoundingBoxes
    from torchvision.transforms.v2 import functional as TF

    rng = np.random.default_rng(5)
    for trial in range(30):
        height, width = int(rng.integers(20, 200)), int(rng.integers(20, 200))
        mask = rng.integers(0, 255, (height, width), dtype=np.uint8)
        out = (int(rng.integers(5, 80)), int(rng.integers(5, 80)))
        geometry = RandomResizedCrop(out, scale=(0.05, 1.0), seed=trial, flip=False).geometry(width, height, trial)
        left, top, right, bottom = (int(v) for v in geometry.box)
        crop = (top, left, bottom - top, right - left, list(out))
        # Each mode against torch's own kernel for that mode (a plain tensor honours the mode)...
        for mode, tv_mode in (("nearest", InterpolationMode.NEAREST), ("nearest-exact", InterpolationMode.NEAREST_EXACT)):
            expected = TF.resized_crop(torch.from_numpy(mask)[None], *crop, interpolation=tv_mode)[0]
            np.testing.assert_array_equal(geometry.resample_nearest(mask, mode), expected.numpy())
        # ...and the default against what a transforms.v2 pipeline does to a Mask: torchvision 0.29
        # resizes tv_tensors.Mask with NEAREST whatever interpolation it is given.
        expected = TF.resized_crop(tv_tensors.Mask(torch.from_numpy(mask)), *crop)
        np.testing.assert_array_equal(geometry.resample_nearest(mask, "nearest"), expected.numpy())
    geometry = CropGeometry(box=(10.0, 20.0, 110.0, 70.0), flip=False, size=(25, 50), source_size=(200, 100))
    x1 = rng.uniform(-20, 130, 300)
    y1 = rng.uniform(0, 90, 300)
    boxes = np.stack([x1, y1, x1 + rng.exponential(3, 300), y1 + rng.exponential(3, 300)], axis=1)
    mapped, keep = geometry.map_boxes(boxes)
    _, some_left = geometry.map_boxes(boxes, min_size=0.0, min_area=0.0)
    candidates = tv_tensors.BoundingBoxes(torch.from_numpy(mapped[some_left]), format="XYXY", canvas_size=(25, 50))
    sanitized = SanitizeBoundingBoxes(labels_getter=None)(candidates)
    np.testing.assert_allclose(sanitized.numpy(), mapped[keep])
