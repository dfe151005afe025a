"""Decode-and-resize for the codecs that re-encode at build time (``jpeg``, ``raw``)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..format import ImageFormat
from .._internal.imageinfo import ImageInfo

__all__ = ["REDUCING_GAP", "resample_filter", "jpeg_dimensions", "decode_for_box", "resample_box"]

# Resample from at least this many times the final resolution: Pillow's ``Image.thumbnail``
# default, the build-time quality/speed trade-off (README, "codecs").
REDUCING_GAP = 2.0


def resample_filter(name: str) -> Any:
    from PIL import Image

    return {"lanczos": Image.Resampling.LANCZOS, "bicubic": Image.Resampling.BICUBIC,
            "bilinear": Image.Resampling.BILINEAR, "box": Image.Resampling.BOX,
            "nearest": Image.Resampling.NEAREST}[name]


def jpeg_dimensions(data: bytes | memoryview) -> tuple[int, int, str] | None:
    """(width, height, colorspace) from a JPEG header, or None when simplejpeg cannot read it."""
    import simplejpeg

    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    except Exception:  # noqa: BLE001 - decode_image's Pillow fallback will have its say
        return None
    return int(width), int(height), str(colorspace)


def decode_for_box(data: bytes | memoryview, info: ImageInfo, box_scale: float,
                    name: str) -> tuple[np.ndarray, int, int]:
    """Decode ``data`` to RGB, possibly reduced in the DCT domain, for a box scaled by ``box_scale``.

    ``box_scale`` is output pixels per source pixel. A JPEG is decoded at a reduced size only when
    the reduced image still has at least ``REDUCING_GAP`` times the final resolution; everything
    else goes through ``decode_image`` at full size.

    Returns:
        (pixels, source_width, source_height): ``pixels`` may be smaller than the source; box
        coordinates in source pixels must be scaled by ``pixels`` size / source size.
    """
    from ..decode import PILLOW_JPEG_COLORSPACES, decode_image

    if info.image_format == ImageFormat.JPEG and box_scale * REDUCING_GAP <= 0.5:
        header = jpeg_dimensions(data)
        # CMYK/YCCK go through decode_image, whose rule converts them (simplejpeg's may differ).
        if header is not None and header[2] not in PILLOW_JPEG_COLORSPACES:
            import simplejpeg

            width, height = header[0], header[1]
            need_w = math.ceil(width * box_scale * REDUCING_GAP)
            need_h = math.ceil(height * box_scale * REDUCING_GAP)
            try:
                pixels = simplejpeg.decode_jpeg(data, colorspace="RGB", min_width=need_w,
                                                min_height=need_h, min_factor=2)
            except Exception:  # noqa: BLE001 - strict mode refuses some files; decode_image retries
                pixels = None
            if pixels is not None:
                return pixels, width, height
    pixels = decode_image(data, info.image_format, name=name)
    return pixels, pixels.shape[1], pixels.shape[0]


def resample_box(pixels: np.ndarray, source_w: int, source_h: int,
                  box: tuple[float, float, float, float], out_w: int, out_h: int,
                  resample: str) -> np.ndarray:
    """Resample ``box`` (in source pixel coordinates) of ``pixels`` to ``out_h x out_w`` RGB."""
    from PIL import Image

    have_h, have_w = pixels.shape[:2]
    if (have_w, have_h) == (out_w, out_h) and box == (0, 0, have_w, have_h):
        return pixels
    fx, fy = have_w / source_w, have_h / source_h
    scaled = (box[0] * fx, box[1] * fy, box[2] * fx, box[3] * fy)
    image = Image.fromarray(pixels).resize((out_w, out_h), resample_filter(resample),
                                                  box=scaled, reducing_gap=REDUCING_GAP)
    return np.asarray(image)

