"""The ``jpeg`` codec: re-encoded JPEGs, optionally smaller (cheap decode at training size)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

import numpy as np

from ..errors import DecodeError
from ..format import ImageFormat
from .._internal.imageinfo import ImageInfo
from .base import (JPEG_SUBSAMPLING, MAX_SIDE, RESAMPLE_FILTERS, EncodedImageReader, check_keys, choice_option,
                   int_option)
from .resize import decode_for_box, jpeg_dimensions, resample_box

__all__ = ["JpegCodec", "JpegReader"]


class JpegReader(EncodedImageReader):
    """Re-encoded JPEGs: the source's pixel grid unless the build shrank them (``max_size``)."""

    @property
    def keeps_source_geometry(self) -> bool:
        return self.entry.get("max_size") is None


@dataclass(frozen=True)
class JpegCodec:
    """Decode, shrink so one side is at most ``max_size``, re-encode as JPEG (module docstring).

    Attributes:
        max_size: the largest allowed length of ``side`` in pixels; None keeps the size.
        quality: JPEG quality, 1-100.
        side: ``"longer"`` or ``"shorter"``: which side ``max_size`` bounds.
        subsampling: chroma subsampling, one of ``JPEG_SUBSAMPLING``.
        resample: Pillow filter, one of ``RESAMPLE_FILTERS``.
    """

    max_size: int | None = None
    quality: int = 90
    side: str = "longer"
    subsampling: str = "420"
    resample: str = "lanczos"
    name: ClassVar[str] = "jpeg"
    OPTIONS: ClassVar[tuple[str, ...]] = ("max_size", "quality", "side", "subsampling", "resample")
    reader: ClassVar[type[JpegReader]] = JpegReader

    def __post_init__(self) -> None:
        if self.max_size is not None:
            int_option(self.name, "max_size", str(self.max_size), 1, MAX_SIDE)
        int_option(self.name, "quality", str(self.quality), 1, 100)
        choice_option(self.name, "side", self.side, ("longer", "shorter"))
        choice_option(self.name, "subsampling", self.subsampling, JPEG_SUBSAMPLING)
        choice_option(self.name, "resample", self.resample, RESAMPLE_FILTERS)

    @classmethod
    def from_options(cls, params: Mapping[str, str]) -> "JpegCodec":
        """Build from the string options of a codec spec.

        Raises:
            OptionError: an unknown option or a bad value.
        """
        check_keys(cls.name, params, cls.OPTIONS)
        values: dict[str, Any] = dict(params)
        if "max_size" in values:
            values["max_size"] = int_option(cls.name, "max_size", values["max_size"], 1, MAX_SIDE)
        if "quality" in values:
            values["quality"] = int_option(cls.name, "quality", values["quality"], 1, 100)
        return cls(**values)

    def target_size(self, width: int, height: int) -> tuple[int, int]:
        """The (width, height) a ``width x height`` source is stored at."""
        if self.max_size is None:
            return width, height
        bounded = max(width, height) if self.side == "longer" else min(width, height)
        if bounded <= self.max_size:
            return width, height
        scale = self.max_size / bounded
        return (min(width, max(1, round(width * scale))), min(height, max(1, round(height * scale))))

    def encode(self, data: bytes, info: ImageInfo, *, name: str = "") -> tuple[bytes, ImageInfo]:
        """Decode, shrink and re-encode one image.

        Raises:
            DecodeError: the source cannot be decoded or the JPEG cannot be encoded.
        """
        import simplejpeg

        width, height = info.width, info.height
        if info.image_format == ImageFormat.JPEG:
            header = jpeg_dimensions(data)
            if header is not None:
                width, height = header[0], header[1]
        out_w, out_h = self.target_size(width, height)
        scale = min(out_w / width, out_h / height) if width and height else 1.0
        pixels, source_w, source_h = decode_for_box(data, info, scale, name)
        if (source_w, source_h) != (width, height):  # the header disagreed with the pixels
            out_w, out_h = self.target_size(source_w, source_h)
        pixels = resample_box(pixels, source_w, source_h, (0, 0, source_w, source_h), out_w, out_h,
                               self.resample)
        try:
            payload = simplejpeg.encode_jpeg(np.ascontiguousarray(pixels), quality=self.quality,
                                             colorspace="RGB", colorsubsampling=self.subsampling)
        except Exception as exc:  # noqa: BLE001 - report any encoder failure as this sample's
            raise DecodeError(f"cannot encode the {out_h}x{out_w} (HxW) image as JPEG: {exc}",
                              path=name or None) from None
        return payload, ImageInfo(image_format=ImageFormat.JPEG, width=out_w, height=out_h,
                                  channels=3, mode="RGB")

    def manifest_entry(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"name": self.name, "quality": self.quality, "side": self.side,
                                 "subsampling": self.subsampling, "resample": self.resample,
                                 "channels": 3}
        if self.max_size is not None:
            entry["max_size"] = self.max_size
        return entry

    def estimate_sizes(self, source_sizes: np.ndarray) -> np.ndarray:
        sizes = np.asarray(source_sizes, dtype=np.uint64)
        if self.max_size is None or self.side != "longer":
            return sizes
        # At most max_size^2 pixels; photos at quality 90 with 4:2:0 take well under a byte each.
        bound = np.uint64(max(1, self.max_size * self.max_size * (self.quality + 10) // 100))
        return np.minimum(sizes, bound)
