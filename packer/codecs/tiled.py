"""The ``tiled`` codec: baseline JPEGs losslessly re-tiled with restart markers (formats/SPEC.md §13)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

import numpy as np

from ..errors import MissingDependencyError
from ..format import ImageFormat
from .._internal.imageinfo import ImageInfo
from .base import MAX_SIDE, EncodedImageReader, check_keys

__all__ = ["TiledCodec", "TiledReader"]


class TiledReader(EncodedImageReader):
    """Tiled JPEGs are JPEGs to every decoder, with the source's pixels (``packer.transforms`` cuts
    the tiles under a crop itself); other payloads are the source files."""


@dataclass(frozen=True)
class TiledCodec:
    """Stores baseline JPEGs losslessly re-tiled (``packer.tiles``), everything else as is."""

    name: str = "tiled"
    OPTIONS: ClassVar[tuple[str, ...]] = ()
    reader: ClassVar[type[TiledReader]] = TiledReader
    # The probe has already applied the build's --max-pixels; this only bounds the transcoder.
    _MAX_PIXELS: ClassVar[int] = MAX_SIDE * MAX_SIDE

    @classmethod
    def from_options(cls, params: Mapping[str, str]) -> "TiledCodec":
        from .tiles import TILED_FIX, transcoder_available

        check_keys("tiled", params, cls.OPTIONS)
        if not transcoder_available():
            raise MissingDependencyError("codec 'tiled' needs packer's compiled extension packer.codecs._jpegtiles, "
                                         "which was not built when packer was installed (no C compiler?): "
                                         + TILED_FIX)
        return cls()

    def encode(self, data: bytes, info: ImageInfo, *, name: str = "") -> tuple[bytes, ImageInfo]:
        """The tiled JPEG, or ``data`` itself when it is not a JPEG that can be tiled."""
        from .tiles import transcode

        if info.image_format != ImageFormat.JPEG:
            return data, info
        try:
            return transcode(data, max_pixels=self._MAX_PIXELS), info
        except ValueError:  # progressive, arithmetic, 12-bit, damaged: a valid file kept as is
            return data, info

    def note(self, source: bytes, payload: bytes, info: ImageInfo, *,
             source_info: ImageInfo | None = None) -> str | None:
        """``tiled``, or why an image was stored as it is (``kept: progressive``, ``kept: not a JPEG
        (png)``). Counted in the build summary so a mostly-progressive or mostly-PNG source shows."""
        from .tiles import untiled_reason

        if info.image_format != ImageFormat.JPEG:
            return f"kept: not a JPEG ({ImageFormat.NAMES.get(int(info.image_format), 'unknown')})"
        return "tiled" if payload is not source else f"kept: {untiled_reason(source)}"

    def manifest_entry(self) -> dict[str, Any]:
        return {"name": self.name, "version": 1}

    def estimate_sizes(self, source_sizes: np.ndarray) -> np.ndarray:
        return np.asarray(source_sizes, dtype=np.uint64)
