"""Geometry-aware fused transforms: the crop a transform reports is the one its pixels come from,
and boxes, keypoints, masks and depth maps land where the image's pixels land.

The consistency tests draw a bright square (the marker) on a dark image, declare its box, its
centre as a keypoint, and a mask and a 16-bit depth map that mark the same square, then crop
with seeded transforms and check, sample by sample, that the bright pixels of the output image,
the moved box, the moved keypoint and the resampled mask and depth all agree (flips included).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

torch = pytest.importorskip("torch")

from packer.errors import OptionError  # noqa: E402
from packer.writer import BuildOptions, build  # noqa: E402
from packer.format import ImageFormat  # noqa: E402
from packer.rawcrop import AGREEMENT_MAX_ABS, crop_resize_batch  # noqa: E402
from packer.torch import PackedDataset, collate  # noqa: E402
from packer.transforms import CenterCrop, CropGeometry, RandomResizedCrop  # noqa: E402

WIDTH, HEIGHT, MARKER = 192, 128, 24
MASK_LABEL, BACKGROUND_LABEL = 5, 1
NEAR, FAR = 40000, 300  # depth (uint16) inside and outside the marker
FIELDS = ("boxes=float32[N,4]", "labels=int64[N]", "kps=float32[N,1,3]", "mask=image", "depth=image")
SAMPLE_FIELDS = ("image", "index", "boxes", "labels", "kps", "mask", "depth")
GEOMETRY = {"boxes": "xyxy", "labels": "per-box", "kps": ("points", "per-box")}


def marker_position(i: int) -> tuple[int, int]:
    return (i * 37) % (WIDTH - MARKER), (i * 23) % (HEIGHT - MARKER)


def marker_image(i: int) -> np.ndarray:
    x, y = marker_position(i)
    pixels = np.full((HEIGHT, WIDTH, 3), 20, np.uint8)
    pixels[y:y + MARKER, x:x + MARKER] = 235
    return pixels


def encode(pixels: np.ndarray | Image.Image, fmt: str, **options: object) -> bytes:
    image = Image.fromarray(pixels) if isinstance(pixels, np.ndarray) else pixels
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def make_marker_source(root: Path, count: int, image_ext: str) -> Path:
    """A JSONL manifest: marker images, the marker's box (label 5) and a second box (label 9)
    with no marker, their centres as keypoints, a palette mask and a 16-bit depth map."""
    (root / "img").mkdir(parents=True)
    rows = []
    for i in range(count):
        x, y = marker_position(i)
        name = f"img/{i:02d}.{image_ext}"
        (root / name).write_bytes(encode(marker_image(i), "JPEG" if image_ext == "jpg" else "PNG", quality=95))
        labels = np.full((HEIGHT, WIDTH), BACKGROUND_LABEL, np.uint8)
        labels[y:y + MARKER, x:x + MARKER] = MASK_LABEL
        mask = Image.fromarray(labels, mode="P")
        mask.putpalette([0, 0, 0, 255, 255, 255] * 128)
        mask.save(root / f"img/{i:02d}.mask.png")
        depth = np.full((HEIGHT, WIDTH), FAR, np.uint16)
        depth[y:y + MARKER, x:x + MARKER] = NEAR
        Image.fromarray(depth).save(root / f"img/{i:02d}.depth.png")
        second = [4, 100, 20, 120]
        rows.append({"path": name, "label": i % 2,
                     "boxes": [[x, y, x + MARKER, y + MARKER], second], "labels": [5, 9],
                     "kps": [[[x + MARKER / 2, y + MARKER / 2, 2]], [[12, 110, 2]]],
                     "mask": f"img/{i:02d}.mask.png", "depth": f"img/{i:02d}.depth.png"})
    manifest = root / "rows.jsonl"
    manifest.write_text("".join(json.dumps(row) + "\n" for row in rows), "utf-8")
    return manifest


@pytest.fixture(scope="module")
def marker_datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same markers stored as PNG, as JPEG, as tiled JPEG (window decode) and as raw pixels."""
    root = tmp_path_factory.mktemp("markers")
    out = {}
    png = make_marker_source(root / "png-src", 12, "png")
    jpg = make_marker_source(root / "jpg-src", 12, "jpg")
    for name, manifest, codec in (("png", png, "passthrough"), ("jpeg", jpg, "passthrough"),
                                  ("tiled", jpg, "tiled"), ("raw", png, f"raw:size={HEIGHT}x{WIDTH}")):
        out[name] = root / name
        build(manifest, out[name], BuildOptions(fields=FIELDS, codec=codec, shuffle=False), workers=1,
              progress=False)
    return out


def check_sample(sample: dict, geometry: CropGeometry | None, size: tuple[int, int], *, jpeg: bool,
                 flip: bool | None = None, mode: str = "nearest") -> dict:
    """Every consistency check of one cropped sample; returns what it saw (for coverage checks).

    ``mode`` is the transform's ``mask_interpolation``; ``flip`` the sample's flip (default the
    geometry's)."""
    flip = geometry.flip if flip is None and geometry is not None else flip
    out_h, out_w = size
    image = sample["image"].numpy().astype(np.float64).mean(axis=2)  # HWC
    boxes, labels, kps = sample["boxes"].numpy(), sample["labels"].numpy(), sample["kps"].numpy()
    mask, depth = sample["mask"].numpy(), sample["depth"].numpy()
    assert mask.shape == (out_h, out_w) and depth.shape == (out_h, out_w)
    assert depth.dtype == np.uint16 and sample["depth"].dtype == torch.uint16
    assert set(np.unique(mask).tolist()) <= {MASK_LABEL, BACKGROUND_LABEL}  # nearest: no new labels
    assert set(np.unique(depth).tolist()) <= {NEAR, FAR}  # no averaged depths
    np.testing.assert_array_equal(mask == MASK_LABEL, depth == NEAR)  # both follow the same crop
    assert len(boxes) == len(labels) == len(kps)  # per-box rows dropped in step
    assert set(labels.tolist()) <= {5, 9} and boxes.dtype == np.float32
    assert np.all(boxes[:, 0] >= 0) and np.all(boxes[:, 2] <= out_w) and np.all(boxes[:, 1] >= 0)
    assert np.all(boxes[:, 3] <= out_h) and np.all(boxes[:, 2] > boxes[:, 0]) and np.all(boxes[:, 3] > boxes[:, 1])
    rows = np.flatnonzero(labels == 5)
    centres_c = np.arange(out_w) + 0.5
    centres_r = np.arange(out_h) + 0.5
    if len(rows) == 0:  # the marker box was dropped: nothing of it is left, or under a pixel of it
        if geometry is not None:
            x, y = marker_position(int(sample["index"]))
            marker = np.array([[x, y, x + MARKER, y + MARKER]], np.float64)
            left, keep = geometry.map_boxes(marker, 0.0, min_size=0.0, min_area=0.0)
            if keep[0]:  # SanitizeBoundingBoxes' minimums (1 px, 1 px²) dropped what is left of it
                width, height = left[0, 2] - left[0, 0], left[0, 3] - left[0, 1]
                slack = 0.5 if jpeg else 0.0  # geometry() is a DCT-scaled decode's crop within half a pixel
                assert min(width, height) < 1 + slack or width * height < 1 + slack, (width, height)
                return {"visible": False, "flip": geometry.flip}
        assert not np.any(mask == MASK_LABEL)
        assert image.max() < 128
        return {"visible": False, "flip": None if geometry is None else geometry.flip}
    x1, y1, x2, y2 = boxes[rows[0]].astype(np.float64)
    # The mask: exactly the output pixels whose sampling point lies inside the moved box, ignoring
    # points within a hair of an edge. nearest-exact samples at the pixel's centre; nearest (torch's
    # floor(i * in / out)) at its top-left corner before the flip: its top-right corner after one.
    if mode == "nearest":
        assert flip is not None, "the nearest rule's sampling point depends on the flip"
        centres_c = np.arange(out_w) + (1.0 if flip else 0.0)
        centres_r = np.arange(out_h) + 0.0
    inside = ((centres_r[:, None] > y1 + 1e-4) & (centres_r[:, None] < y2 - 1e-4)
              & (centres_c[None, :] > x1 + 1e-4) & (centres_c[None, :] < x2 - 1e-4))
    outside = ((centres_r[:, None] < y1 - 1e-4) | (centres_r[:, None] > y2 + 1e-4)
               | (centres_c[None, :] < x1 - 1e-4) | (centres_c[None, :] > x2 + 1e-4))
    assert np.all(mask[inside] == MASK_LABEL) and not np.any(mask[outside] == MASK_LABEL)
    # The image: its bright pixels fill the moved box, to within a pixel at each edge.
    if x2 - x1 >= 2 and y2 - y1 >= 2:
        bright = np.argwhere(image > 127.5)
        assert len(bright), "the marker box is in the output but no marker pixel is"
        tolerance = 1.0 if not jpeg else 1.5
        assert abs(bright[:, 1].min() - x1) <= tolerance and abs(bright[:, 1].max() + 1 - x2) <= tolerance
        assert abs(bright[:, 0].min() - y1) <= tolerance and abs(bright[:, 0].max() + 1 - y2) <= tolerance
    # The keypoint at the marker's centre: visible exactly when it is in the output, and on the marker.
    u, v, visibility = kps[rows[0], 0]
    in_output = 0 <= u < out_w and 0 <= v < out_h
    assert visibility == (2 if in_output else 0)
    if in_output and x2 - x1 >= 2 and y2 - y1 >= 2:
        assert image[int(v), int(u)] > 127.5
    return {"visible": True, "flip": None if geometry is None else geometry.flip}


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact"])
@pytest.mark.parametrize("codec", ["png", "jpeg", "tiled", "raw"])
@pytest.mark.parametrize("crop", ["rrc", "center"])
def test_box_mask_depth_and_keypoint_land_where_the_marker_lands(marker_datasets: dict[str, Path], codec: str,
                                                                 crop: str, mode: str) -> None:
    transform = (RandomResizedCrop(32, scale=(0.25, 1.0), seed=7, mask_interpolation=mode) if crop == "rrc"
                 else CenterCrop(32, resize=48, mask_interpolation=mode))
    dataset = PackedDataset(marker_datasets[codec], decode=transform, layout="HWC", fields=SAMPLE_FIELDS,
                            geometry=GEOMETRY)
    seen = []
    for epoch in range(4 if crop == "rrc" else 1):
        transform.set_epoch(epoch) if crop == "rrc" else None
        samples = dataset.__getitems__(list(range(len(dataset))))
        for sample in samples:
            i = sample["index"]
            geometry = transform.geometry(WIDTH, HEIGHT, i)
            seen.append(check_sample(sample, geometry, (32, 32), jpeg=codec in ("jpeg", "tiled"), mode=mode))
            second = np.flatnonzero(sample["labels"].numpy() == 9)
            if len(second):  # the box without a marker moved by the same rule
                mapped, keep = geometry.map_boxes(np.array([[4, 100, 20, 120]], np.float32))
                if codec in ("png", "raw"):  # full-resolution decodes: geometry() is the decode's crop
                    np.testing.assert_allclose(sample["boxes"][second[0]].numpy(), mapped[0], atol=1e-4)
    if crop == "rrc":  # the draws cover what the checks are about
        assert {s["flip"] for s in seen} == {True, False}
        assert {s["visible"] for s in seen} == {True, False}
    else:
        assert any(s["visible"] for s in seen)


def test_the_batched_raw_path_and_the_per_sample_path_move_fields_alike(marker_datasets: dict[str, Path]) -> None:
    # HWC: one gather + batched crop (packer.rawcrop); CHW: each sample cropped on its own.
    transform = RandomResizedCrop(32, scale=(0.25, 1.0), seed=3)
    batched = PackedDataset(marker_datasets["raw"], decode=transform, layout="HWC", fields=SAMPLE_FIELDS,
                            geometry=GEOMETRY)
    single = PackedDataset(marker_datasets["raw"], decode=transform, layout="CHW", fields=SAMPLE_FIELDS,
                           geometry=GEOMETRY)
    order = [5, 0, 11, 3, 3]
    one = batched.__getitems__(order)
    assert one.batch is not None  # the batched raw path did run
    other = single.__getitems__(order)
    for a, b in zip(one, other):
        for name in ("boxes", "labels", "kps", "mask", "depth"):
            np.testing.assert_allclose(a[name].numpy(), b[name].numpy(), atol=1e-5, err_msg=name)
        check_sample(a, transform.geometry(WIDTH, HEIGHT, int(a["index"])), (32, 32), jpeg=False)


def test_fields_follow_the_crop_in_dataloader_workers(marker_datasets: dict[str, Path]) -> None:
    transform = RandomResizedCrop(32, scale=(0.25, 1.0), seed=11)
    dataset = PackedDataset(marker_datasets["jpeg"], decode=transform, layout="HWC", fields=SAMPLE_FIELDS,
                            geometry=GEOMETRY)
    loader = torch.utils.data.DataLoader(dataset, batch_size=5, num_workers=2, collate_fn=collate)
    expected = {s["index"]: s for s in dataset.__getitems__(list(range(len(dataset))))}
    for batch in loader:
        assert batch["image"].shape[1:] == (32, 32, 3) and batch["mask"].shape[1:] == (32, 32)
        for j, i in enumerate(batch["index"].tolist()):
            sample = {name: batch[name][j] for name in SAMPLE_FIELDS if name != "index"}
            check_sample({**sample, "index": i}, transform.geometry(WIDTH, HEIGHT, i), (32, 32), jpeg=True)
            for name in ("boxes", "kps", "mask", "image"):  # (seed, epoch, index): the same in a worker
                np.testing.assert_array_equal(sample[name].numpy(), expected[i][name].numpy(), err_msg=name)


def test_crops_are_a_function_of_seed_epoch_and_index(marker_datasets: dict[str, Path]) -> None:
    transform = RandomResizedCrop(32, seed=5)
    dataset = PackedDataset(marker_datasets["png"], decode=transform, fields=("index", "boxes", "mask"),
                            geometry={"boxes": "xyxy"})
    first = {s["index"]: s for s in dataset.__getitems__([0, 1, 2, 3])}
    again = {s["index"]: s for s in dataset.__getitems__([3, 2, 7, 1, 0])}  # other batch, other positions
    for i in range(4):
        np.testing.assert_array_equal(first[i]["boxes"].numpy(), again[i]["boxes"].numpy())
        np.testing.assert_array_equal(first[i]["mask"].numpy(), again[i]["mask"].numpy())
    transform.set_epoch(1)
    moved = {s["index"]: s for s in dataset.__getitems__([0, 1, 2, 3])}
    assert any(not torch.equal(first[i]["mask"], moved[i]["mask"]) for i in range(4))
    assert transform.geometry(WIDTH, HEIGHT, 2) != RandomResizedCrop(32, seed=6).geometry(WIDTH, HEIGHT, 2)
    transform.set_epoch(0)
    np.testing.assert_array_equal(dataset[2]["mask"].numpy(), first[2]["mask"].numpy())


# --- the reported crop is the pixel path's ---------------------------------------------------------

def noise_image(width: int, height: int, seed: int = 0) -> np.ndarray:
    """Smoothed noise: any shift of the crop by a pixel changes the output by far more than rounding."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (height // 3 + 2, width // 3 + 2, 3), dtype=np.uint8)
    return np.asarray(Image.fromarray(small).resize((width, height), Image.Resampling.BICUBIC))


def reference(pixels: np.ndarray, geometry: CropGeometry, *, clip: bool) -> np.ndarray:
    """The crop resampled independently (packer.rawcrop's float kernel) from the reported geometry."""
    out = crop_resize_batch(torch.from_numpy(pixels[None].copy()), np.array([geometry.box]), geometry.size,
                            flips=np.array([geometry.flip]), clip_to_box=clip, kernel="torch")
    return out[0].numpy().astype(np.int64)


@pytest.mark.parametrize("backend", ["torch", "pil"])
@pytest.mark.parametrize("crop", ["rrc", "center"])
@pytest.mark.parametrize("source", ["png", "raw"])
def test_geometry_is_the_crop_the_pixels_come_from(backend: str, crop: str, source: str) -> None:
    pixels = noise_image(97, 71)
    data: object = encode(pixels, "PNG") if source == "png" else pixels
    image_format = ImageFormat.PNG if source == "png" else None
    for index in range(12):
        transform = (RandomResizedCrop((20, 24), seed=1, resize_backend=backend) if crop == "rrc"
                     else CenterCrop((20, 24), resize=30, resize_backend=backend))
        plain = transform(data, image_format, index=index)
        out, geometry = transform.decode_with_geometry(data, image_format, index=index)
        np.testing.assert_array_equal(out, plain)
        assert geometry == transform.geometry(97, 71, index)
        assert geometry.size == (20, 24) and geometry.source_size == (97, 71)
        # torch crops a random box out before resizing; Pillow's box= and a resize-then-crop read around it
        clip = crop == "rrc" and (backend == "torch" or source == "raw")
        difference = np.abs(reference(pixels, geometry, clip=clip) - out.astype(np.int64))
        assert difference.max() <= AGREEMENT_MAX_ABS + 1, (index, difference.max())
        left, top, right, bottom = geometry.box
        shifted = CropGeometry(box=(left + 1, top, right + 1, bottom), flip=geometry.flip, size=geometry.size,
                               source_size=geometry.source_size)
        if right + 1 <= 97:  # the check has teeth: a crop one pixel off does not pass it
            assert np.abs(reference(pixels, shifted, clip=clip) - out.astype(np.int64)).max() > AGREEMENT_MAX_ABS + 1


def test_a_dct_scaled_jpeg_reports_its_rounded_box() -> None:
    pixels = noise_image(400, 300, seed=2)
    data = encode(pixels, "JPEG", quality=95)
    transform = RandomResizedCrop(24, scale=(0.3, 1.0), seed=0)
    scaled = 0
    for index in range(20):
        drawn = transform.geometry(400, 300, index)
        out, used = transform.decode_with_geometry(data, ImageFormat.JPEG, index=index)
        np.testing.assert_array_equal(out, transform(data, ImageFormat.JPEG, index=index))
        assert used.flip == drawn.flip and used.source_size == (400, 300)
        # At DCT scale M/8 the box snaps to whole decoded pixels: within half of one (4/M source pixels).
        step = 8 / min(8, 2 ** int(np.ceil(np.log2(max(8 * 24 / (drawn.box[2] - drawn.box[0]),
                                                         8 * 24 / (drawn.box[3] - drawn.box[1]))))))
        assert max(abs(a - b) for a, b in zip(used.box, drawn.box)) <= step / 2 + 1e-9
        scaled += used.box != drawn.box
    assert scaled  # some crops were decoded at a reduced scale and snapped


def test_batch_geometry_is_the_batched_paths_crop() -> None:
    images = np.stack([noise_image(40, 30, seed=s) for s in range(6)])
    transform = RandomResizedCrop(16, seed=4)
    indices = np.array([9, 2, 2, 40, 7, 0])
    out, geometries = transform.batch_with_geometry(images, indices)
    np.testing.assert_array_equal(out.numpy(), transform.batch(images, indices).numpy())
    assert geometries == transform.batch_geometry(40, 30, indices)
    assert geometries == [transform.geometry(40, 30, int(i)) for i in indices]
    for k, geometry in enumerate(geometries):
        assert np.abs(reference(images[k], geometry, clip=True) - out[k].numpy().astype(np.int64)).max() <= 1


# --- the rules, unit by unit ----------------------------------------------------------------------

def geometry_of(box: tuple[float, float, float, float], flip: bool = False, size: tuple[int, int] = (10, 20),
                source: tuple[int, int] = (100, 50)) -> CropGeometry:
    return CropGeometry(box=box, flip=flip, size=size, source_size=source)


def test_boxes_are_mapped_clipped_and_dropped_by_the_documented_rule() -> None:
    g = geometry_of((10, 5, 50, 25))  # 40x20 source pixels -> 20x10 output: scale 0.5
    boxes = np.array([[10, 5, 50, 25],      # the whole crop
                      [20, 10, 30, 20],     # inside
                      [0, 0, 12, 7],        # a corner: clipped
                      [60, 30, 80, 40],     # outside: dropped
                      [30, 10, 30, 20],     # no width: dropped
                      [np.nan, 0, 20, 20]], np.float32)
    mapped, keep = g.map_boxes(boxes)
    assert keep.tolist() == [True, True, True, False, False, False]
    np.testing.assert_allclose(mapped[:3], [[0, 0, 20, 10], [5, 2.5, 10, 7.5], [0, 0, 1, 1]])
    assert mapped.dtype == np.float32 and g.map_boxes(boxes.astype(np.float64))[0].dtype == np.float64
    # min_visibility: the corner box keeps 2x2 of its 12x7 source pixels (about 4.8 %)
    assert g.map_boxes(boxes, min_visibility=0.04)[1].tolist()[:3] == [True, True, True]
    assert g.map_boxes(boxes, min_visibility=0.05)[1].tolist()[:3] == [True, True, False]
    flipped, _ = geometry_of((10, 5, 50, 25), flip=True).map_boxes(boxes[1:2])
    np.testing.assert_allclose(flipped, [[10, 2.5, 15, 7.5]])  # x1 <= x2 after the mirror
    integer, keep = g.map_boxes(np.array([[20, 10, 30, 20]], np.int64))
    assert integer.dtype == np.float32 and keep.tolist() == [True]


def test_keypoints_outside_the_output_become_invisible() -> None:
    g = geometry_of((10, 5, 50, 25), flip=True)
    points = np.array([[[10, 5, 2], [49, 24, 1], [50, 15, 2], [5, 10, 2], [30, 15, 0]]], np.float32)
    moved = g.map_points(points)
    assert moved.shape == points.shape and moved.dtype == np.float32
    np.testing.assert_allclose(moved[0, :, :2], [[20, 0], [0.5, 9.5], [0, 5], [22.5, 2.5], [10, 5]])
    assert moved[0, :, 2].tolist() == [0, 1, 2, 0, 0]  # x=20 is outside [0, 20); 22.5 too; 0 stays 0
    xy = g.map_points(np.array([[30.0, 15.0]]))
    np.testing.assert_allclose(xy, [[10, 5]])
    with pytest.raises(OptionError, match="2 or 3 values"):
        g.map_points(np.zeros((3, 4)))


def test_nearest_resampling_keeps_values_and_follows_a_half_resolution_mask() -> None:
    full = np.arange(50 * 100, dtype=np.uint16).reshape(50, 100) * 13
    g = geometry_of((10, 5, 50, 25), size=(40, 80))  # one output pixel per half source pixel
    out = g.resample_nearest(full)
    assert out.dtype == np.uint16 and out.shape == (40, 80) and set(out.ravel()) <= set(full.ravel())
    assert out[0, 0] == full[5, 10] and out[-1, -1] == full[24, 49] and out[1, 1] == full[5, 10]
    half = full[::2, ::2]  # the same scene at half the resolution
    out_half = g.resample_nearest(half)
    assert out_half[0, 0] == half[2, 5] and out_half[-1, -1] == half[12, 24]
    flipped = geometry_of((10, 5, 50, 25), flip=True, size=(40, 80)).resample_nearest(full)
    np.testing.assert_array_equal(flipped, out[:, ::-1])
    rgb = np.stack([full, full, full], axis=2)
    assert g.resample_nearest(rgb).shape == (40, 80, 3)


def test_transform_geometry_options_are_checked() -> None:
    with pytest.raises(OptionError, match="min_box_visibility"):
        RandomResizedCrop(8, min_box_visibility=1.5)
    with pytest.raises(OptionError, match="min_box_visibility"):
        CenterCrop(8, resize=8, min_box_visibility=-0.1)
    with pytest.raises(OptionError, match="nothing to crop"):
        RandomResizedCrop(8, seed=0).geometry(0, 10, 1)
    assert "min_box_visibility=0.25" in repr(RandomResizedCrop(8, min_box_visibility=0.25))


def test_min_box_visibility_reaches_the_dataset(marker_datasets: dict[str, Path]) -> None:
    # The marker covers MARKER^2 source pixels; a box is kept only with all of it in the output.
    strict = RandomResizedCrop(32, scale=(0.25, 1.0), seed=7, min_box_visibility=1.0)
    loose = RandomResizedCrop(32, scale=(0.25, 1.0), seed=7)
    strict_ds = PackedDataset(marker_datasets["png"], decode=strict, fields=("index", "boxes", "labels"),
                              geometry={"boxes": "xyxy", "labels": "per-box"})
    loose_ds = PackedDataset(marker_datasets["png"], decode=loose, fields=("index", "boxes", "labels"),
                             geometry={"boxes": "xyxy", "labels": "per-box"})
    partial = 0
    for a, b in zip(strict_ds.__getitems__(list(range(12))), loose_ds.__getitems__(list(range(12)))):
        x, y = marker_position(a["index"])
        geometry = strict.geometry(WIDTH, HEIGHT, a["index"])
        left, top, right, bottom = geometry.box
        whole = left <= x and top <= y and x + MARKER <= right and y + MARKER <= bottom
        assert (5 in a["labels"].tolist()) == whole
        partial += (5 in b["labels"].tolist()) and not whole
    assert partial  # the loose rule kept some partly visible box that the strict one dropped
