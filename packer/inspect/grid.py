"""``inspect --grid``: a contact sheet PNG of sample thumbnails, each captioned with its class.

People spot a wrong label, a channel swap or a folder of blank images faster by looking than by
reading statistics. Samples are decoded with ``packer.decode`` (the same rule training uses), so
the sheet shows what a data loader would see. A sample that fails its checksum or does not
decode gets a grey tile marked "!" instead of stopping the sheet.

Declared fields (formats/SPEC.md §14) are drawn on the thumbnails, because a box off by its
width or a mask flipped against its image is what detection and segmentation datasets get
wrong: a boxes field (``float32[N,4]``, in the main image's pixels, ``xyxy`` unless told
otherwise) as rectangle outlines in ``BOX_COLOUR``, and a mask (an ``image`` field, decoded as
stored) as a semi-transparent colour per value, value 0 (background) left clear. Both are
picked automatically when the dataset has exactly one field that looks like one
(``overlay_fields``), or named.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, BinaryIO, Sequence

import numpy as np

from ..errors import OptionError, PackerError

__all__ = ["contact_sheet", "pick_samples", "overlay_fields", "mask_colours", "CAPTION_HEIGHT", "BOX_COLOUR",
           "BOX_FORMATS", "MASK_ALPHA"]

#: Height in pixels of the caption strip under each thumbnail.
CAPTION_HEIGHT = 14
_BACKGROUND = (24, 24, 24)
_FAILED = (128, 128, 128)
_TEXT = (235, 235, 235)
#: Box outlines: a saturated yellow reads on photos and next to every mask colour.
BOX_COLOUR = (255, 221, 0)
#: How a boxes field's 4 numbers are spelt: corners, COCO's corner + size, or YOLO's centre + size.
BOX_FORMATS = ("xyxy", "xywh", "cxcywh")
#: Opacity (0-255) of a mask's colours over the thumbnail.
MASK_ALPHA = 120
#: Names that make a field an automatic overlay (substrings, lower case).
_BOX_NAMES = ("box", "bbox")
_MASK_NAMES = ("mask", "seg")


def overlay_fields(index: Any, boxes: str | None = "auto", mask: str | None = "auto") -> tuple[str | None, str | None]:
    """The fields a contact sheet draws: ``(boxes field, mask field)``, None where nothing is drawn.

    Args:
        index: an open ``DatasetIndex`` or ``Dataset``.
        boxes: a field name, None (no boxes), or ``"auto"``: the one float ``array`` field of
            shape ``[N,4]`` whose name contains "box" (none when there are zero or several).
        mask: a field name, None, or ``"auto"``: the one ``image`` field whose name contains
            "mask" or "seg".

    Raises:
        OptionError: a named field that does not exist or cannot be drawn that way.
    """
    specs = index.fields

    def auto(test: Any) -> str | None:
        found = [spec.name for spec in specs if test(spec)]
        return found[0] if len(found) == 1 else None

    def is_boxes(spec: Any) -> bool:
        return spec.kind == "array" and spec.shape == (-1, 4)

    if boxes == "auto":
        boxes = auto(lambda spec: is_boxes(spec) and spec.dtype.startswith("float")
                     and any(word in spec.name for word in _BOX_NAMES))
    elif boxes is not None:
        spec = index.field_spec(boxes)
        if not is_boxes(spec):
            raise OptionError(f"--boxes {boxes}: field {spec.describe()} is not an [N,4] array of boxes")
    if mask == "auto":
        mask = auto(lambda spec: spec.kind == "image" and any(word in spec.name for word in _MASK_NAMES))
    elif mask is not None:
        spec = index.field_spec(mask)
        if spec.kind != "image":
            raise OptionError(f"--mask {mask}: field {spec.describe()} is not an image field")
    return boxes, mask


def mask_colours() -> np.ndarray:
    """``(256, 4)`` uint8 RGBA: entry 0 clear (background), the others distinct saturated hues.

    Hues step by the golden ratio, so neighbouring class ids (1, 2, 3...) get far-apart colours.
    """
    import colorsys

    colours = np.zeros((256, 4), dtype=np.uint8)
    for value in range(1, 256):
        r, g, b = colorsys.hsv_to_rgb((value * 0.618033988749895) % 1.0, 0.85, 1.0)
        colours[value] = (round(r * 255), round(g * 255), round(b * 255), MASK_ALPHA)
    return colours


def _colour_mask(values: np.ndarray) -> np.ndarray:
    """A decoded mask as RGBA: one colour per value (2-D masks; values above 255 wrap), or its
    own colours where it is not black (colour masks)."""
    if values.ndim == 3:
        rgb = values[..., :3].astype(np.uint8) if values.dtype == np.uint8 else np.clip(values[..., :3], 0, 255).astype(np.uint8)
        alpha = np.where(rgb.any(axis=-1), MASK_ALPHA, 0).astype(np.uint8)
        return np.concatenate([rgb, alpha[..., None]], axis=-1)
    ids = np.nan_to_num(values, nan=0.0).astype(np.int64) if values.dtype.kind == "f" else values.astype(np.int64)
    wrapped = np.where(ids == 0, 0, (ids - 1) % 255 + 1)
    return mask_colours()[wrapped]


def _xyxy(boxes: np.ndarray, box_format: str, normalized: bool, width: int, height: int) -> np.ndarray:
    """``(N, 4)`` boxes in ``box_format`` as corners in source pixels (float64)."""
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    if box_format == "xywh":
        b = np.stack([b[:, 0], b[:, 1], b[:, 0] + b[:, 2], b[:, 1] + b[:, 3]], axis=1)
    elif box_format == "cxcywh":
        b = np.stack([b[:, 0] - b[:, 2] / 2, b[:, 1] - b[:, 3] / 2, b[:, 0] + b[:, 2] / 2, b[:, 1] + b[:, 3] / 2], axis=1)
    if normalized:
        b = b * np.array([width, height, width, height], dtype=np.float64)
    return b


def pick_samples(sample_count: int, count: int, seed: int = 0) -> list[int]:
    """``count`` distinct sample numbers drawn with ``seed``, sorted (all of them if fewer).

    Sorted so that reading them walks each shard forward.
    """
    count = max(0, min(count, sample_count))
    rng = np.random.default_rng(seed)
    return sorted(int(i) for i in rng.choice(sample_count, size=count, replace=False)) if count else []


def contact_sheet(dataset: Any, out_png: str | os.PathLike[str] | BinaryIO, *, count: int = 64, columns: int = 8,
                  thumb: int = 96, seed: int = 0, indices: Sequence[int] | None = None,
                  max_pixels: int | None = None, boxes: str | None = "auto", mask: str | None = "auto",
                  box_format: str = "xyxy", box_normalized: bool = False) -> dict[str, Any]:
    """Draw thumbnails of some samples into one PNG grid.

    Args:
        dataset: an open ``Dataset`` (``packer.open_dataset``).
        out_png: where to write the PNG: a path (replaced if it exists; ``inspect`` refuses an
            existing file without ``--force``) or a writable binary file object.
        count: how many samples, drawn at random with ``seed`` when ``indices`` is not given.
        columns: tiles per row (fewer when there are fewer samples).
        thumb: the side of each square thumbnail cell, in pixels.
        seed: seed of the random pick.
        indices: exactly which samples to draw, in this order (overrides ``count`` and ``seed``).
        max_pixels: the decode limit (default: what the manifest records, else the default).
        boxes: the boxes field to outline (``overlay_fields``: ``"auto"``, a name, or None).
        mask: the image field to overlay (``"auto"``, a name, or None).
        box_format: ``"xyxy"`` (corners, the default), ``"xywh"`` (COCO) or ``"cxcywh"`` (YOLO).
        box_normalized: the boxes are fractions of the image's width and height, not pixels.

    Returns:
        ``{"path", "width", "height", "columns", "rows", "samples", "failed", "boxes", "mask",
        "boxes_drawn", "mask_failed"}``: the image size and the sample numbers drawn, those
        drawn as "!" tiles, the overlay fields (None when not drawn), how many boxes were
        outlined, and the samples whose mask failed its checksum or did not decode (their
        thumbnail is shown without it).

    Raises:
        OptionError: ``columns`` or ``thumb`` is below 1.
        OptionError: an overlay field that does not exist or does not fit, or an unknown
            ``box_format``.
        DecodeError: the manifest's codec is not one this packer decodes (SPEC section 6).
        PackerError: the PNG cannot be written (exit code 3).
    """
    from PIL import Image, ImageDraw, ImageFont, ImageOps

    from ..codecs import check_decodable, dataset_max_pixels
    from ..decode import decode_image
    from ..format import checksum

    if columns < 1 or thumb < 1:
        raise OptionError(f"columns and thumb must be at least 1, got {columns} and {thumb}")
    if box_format not in BOX_FORMATS:
        raise OptionError(f"box format must be one of {', '.join(BOX_FORMATS)}, got {box_format!r}")
    check_decodable(dataset.manifest.codec, path=getattr(dataset, "path", None))  # SPEC 6
    boxes, mask = overlay_fields(dataset, boxes, mask)
    boxes_drawn = 0
    mask_failed: list[int] = []
    limit = dataset_max_pixels(dataset.manifest, max_pixels)
    chosen = list(indices) if indices is not None else pick_samples(len(dataset), count, seed)
    cols = max(1, min(columns, len(chosen)))
    rows = max(1, -(-len(chosen) // cols))
    cell_height = thumb + CAPTION_HEIGHT
    sheet = Image.new("RGB", (cols * thumb, rows * cell_height), _BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    font = ImageFont.load_default()
    classes = dataset.classes
    failed: list[int] = []
    for position, i in enumerate(chosen):
        left, top = (position % cols) * thumb, (position // cols) * cell_height
        label = int(dataset.labels[i])
        caption = classes[label] if 0 <= label < len(classes) else (str(label) if label >= 0 else "")
        tile = None
        try:
            data = dataset.get(i)
            if checksum(data) == int(dataset.index.checksum[i]):
                pixels = decode_image(data, int(dataset.index.image_format[i]), name=dataset.key(i),
                                      max_pixels=limit)
                # contain(): shrink big images and enlarge small ones to fill the cell, aspect kept.
                tile = ImageOps.contain(Image.fromarray(pixels), (thumb - 2, thumb - 2),
                                        Image.Resampling.BILINEAR)
                source_size = (pixels.shape[1], pixels.shape[0])
            del data
        except PackerError:
            tile = None
        if tile is None:
            failed.append(i)
            draw.rectangle([left + 1, top + 1, left + thumb - 2, top + thumb - 2], fill=_FAILED)
            draw.text((left + thumb // 2, top + thumb // 2), "!", fill=(255, 255, 255), font=font, anchor="mm")
        else:
            if mask is not None:
                overlay = _mask_overlay(dataset, mask, i, tile.size, limit)
                if overlay is None:
                    mask_failed.append(i)
                else:
                    tile = Image.alpha_composite(tile.convert("RGBA"), overlay).convert("RGB")
            origin = (left + (thumb - tile.width) // 2, top + (thumb - tile.height) // 2)
            sheet.paste(tile, origin)
            if boxes is not None:
                boxes_drawn += _draw_boxes(draw, dataset.field_value(boxes, i), origin, tile.size, source_size,
                                           box_format, box_normalized, max(1, thumb // 96))
        try:
            draw.text((left + 2, top + thumb + 1), _fit(draw, caption, font, thumb - 4), fill=_TEXT, font=font)
        except UnicodeError:  # Pillow's built-in bitmap font (no FreeType) only covers Latin-1
            ascii_caption = caption.encode("ascii", "replace").decode("ascii")
            draw.text((left + 2, top + thumb + 1), _fit(draw, ascii_caption, font, thumb - 4), fill=_TEXT, font=font)
    where = out_png if isinstance(out_png, (str, os.PathLike)) else getattr(out_png, "name", None)
    try:
        sheet.save(Path(out_png) if isinstance(out_png, (str, os.PathLike)) else out_png, format="PNG")
    except OSError as exc:
        raise PackerError(f"cannot write the contact sheet: {exc.strerror or exc}", path=where) from None
    return {"path": None if where is None else str(where), "width": sheet.width, "height": sheet.height,
            "columns": cols, "rows": rows, "samples": chosen, "failed": failed, "boxes": boxes, "mask": mask,
            "boxes_drawn": boxes_drawn, "mask_failed": mask_failed}


def _mask_overlay(dataset: Any, name: str, i: int, size: tuple[int, int], limit: int) -> Any:
    """Sample ``i``'s mask as an RGBA image of ``size`` (nearest neighbour: values never blend),
    or None when its bytes fail their checksum or do not decode."""
    from PIL import Image

    from ..decode import decode_as_stored
    from ..format import checksum

    spec = dataset.field_spec(name)
    columns = dataset.index.field_columns
    try:
        data = dataset.field_bytes(name, i)
        if checksum(data) != int(columns[spec.image_column("checksum")][i]):
            return None
        values = decode_as_stored(data, int(columns[spec.image_column("format")][i]),
                                  name=f"{dataset.key(i)} (field {name!r})", max_pixels=limit)
    except PackerError:
        return None
    return Image.fromarray(_colour_mask(values), "RGBA").resize(size, Image.Resampling.NEAREST)


def _draw_boxes(draw: Any, boxes: np.ndarray, origin: tuple[int, int], tile_size: tuple[int, int],
                source_size: tuple[int, int], box_format: str, normalized: bool, line: int) -> int:
    """Outline ``boxes`` (source pixels) on a thumbnail pasted at ``origin``; returns how many
    were drawn (boxes outside the image or not finite are skipped)."""
    (left, top), (tile_width, tile_height), (width, height) = origin, tile_size, source_size
    corners = _xyxy(boxes, box_format, normalized, width, height)
    scale = np.array([tile_width / width, tile_height / height] * 2)
    drawn = 0
    for x1, y1, x2, y2 in (corners * scale).tolist():
        if not all(np.isfinite((x1, y1, x2, y2))):
            continue
        x1, x2 = sorted((x1, x2))
        y1, y2 = sorted((y1, y2))
        if x2 <= 0 or y2 <= 0 or x1 >= tile_width or y1 >= tile_height:
            continue
        # a box's right/bottom edge is the pixel before x2 (pixel x covers [x, x+1)), clipped to the tile
        a = (left + max(0, int(np.floor(x1))), top + max(0, int(np.floor(y1))))
        b = (left + min(tile_width - 1, max(0, int(np.ceil(x2)) - 1)),
             top + min(tile_height - 1, max(0, int(np.ceil(y2)) - 1)))
        draw.rectangle([a, (max(a[0], b[0]), max(a[1], b[1]))], outline=BOX_COLOUR, width=line)
        drawn += 1
    return drawn


def _fit(draw: Any, text: str, font: Any, width: int) -> str:
    """``text``, cut with an ellipsis so that it fits in ``width`` pixels."""
    if draw.textlength(text, font=font) <= width:
        return text
    while text and draw.textlength(text + "..", font=font) > width:
        text = text[:-1]
    return text + ".." if text else ""
