"""``inspect --grid``: a contact sheet PNG of sample thumbnails, each captioned with its class.

People spot a wrong label, a channel swap or a folder of blank images faster by looking than by
reading statistics. Samples are decoded with ``packer.decode`` (the same rule training uses), so
the sheet shows what a data loader would see. A sample that fails its checksum or does not
decode gets a grey tile marked "!" instead of stopping the sheet.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, BinaryIO, Sequence

import numpy as np

from ..errors import PackerError

__all__ = ["contact_sheet", "pick_samples", "CAPTION_HEIGHT"]

#: Height in pixels of the caption strip under each thumbnail.
CAPTION_HEIGHT = 14
_BACKGROUND = (24, 24, 24)
_FAILED = (128, 128, 128)
_TEXT = (235, 235, 235)


def pick_samples(sample_count: int, count: int, seed: int = 0) -> list[int]:
    """``count`` distinct sample numbers drawn with ``seed``, sorted (all of them if fewer).

    Sorted so that reading them walks each shard forward.
    """
    count = max(0, min(count, sample_count))
    rng = np.random.default_rng(seed)
    return sorted(int(i) for i in rng.choice(sample_count, size=count, replace=False)) if count else []


def contact_sheet(dataset: Any, out_png: str | os.PathLike[str] | BinaryIO, *, count: int = 64, columns: int = 8,
                  thumb: int = 96, seed: int = 0, indices: Sequence[int] | None = None,
                  max_pixels: int | None = None) -> dict[str, Any]:
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

    Returns:
        ``{"path", "width", "height", "columns", "rows", "samples", "failed"}``: the image size
        and the sample numbers drawn, and those drawn as "!" tiles.

    Raises:
        ValueError: ``columns`` or ``thumb`` is below 1.
        DecodeError: the manifest's codec is not one this packer decodes (SPEC section 6).
        PackerError: the PNG cannot be written (exit code 3).
    """
    from PIL import Image, ImageDraw, ImageFont, ImageOps

    from ..codecs import check_decodable, dataset_max_pixels
    from ..decode import decode_image
    from ..format import checksum

    if columns < 1 or thumb < 1:
        raise ValueError(f"columns and thumb must be at least 1, got {columns} and {thumb}")
    check_decodable(dataset.manifest.codec, path=getattr(dataset, "path", None))  # SPEC 6
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
            del data
        except PackerError:
            tile = None
        if tile is None:
            failed.append(i)
            draw.rectangle([left + 1, top + 1, left + thumb - 2, top + thumb - 2], fill=_FAILED)
            draw.text((left + thumb // 2, top + thumb // 2), "!", fill=(255, 255, 255), font=font, anchor="mm")
        else:
            sheet.paste(tile, (left + (thumb - tile.width) // 2, top + (thumb - tile.height) // 2))
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
            "columns": cols, "rows": rows, "samples": chosen, "failed": failed}


def _fit(draw: Any, text: str, font: Any, width: int) -> str:
    """``text``, cut with an ellipsis so that it fits in ``width`` pixels."""
    if draw.textlength(text, font=font) <= width:
        return text
    while text and draw.textlength(text + "..", font=font) > width:
        text = text[:-1]
    return text + ".." if text else ""
