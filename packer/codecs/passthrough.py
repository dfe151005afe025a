"""The ``passthrough`` codec: the source file's bytes, verbatim."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

import numpy as np

from .._internal.imageinfo import ImageInfo
from .base import EncodedImageReader, check_keys

__all__ = ["PassthroughCodec", "PassthroughReader"]


class PassthroughReader(EncodedImageReader):
    """The source files, decoded as they are: every pixel grid is the source's."""


@dataclass(frozen=True)
class PassthroughCodec:
    """Stores the source bytes unchanged."""

    name: str = "passthrough"
    OPTIONS: ClassVar[tuple[str, ...]] = ()
    reader: ClassVar[type[PassthroughReader]] = PassthroughReader

    @classmethod
    def from_options(cls, params: Mapping[str, str]) -> "PassthroughCodec":
        check_keys("passthrough", params, cls.OPTIONS)
        return cls()

    def encode(self, data: bytes, info: ImageInfo, *, name: str = "") -> tuple[bytes, ImageInfo]:
        return data, info

    def manifest_entry(self) -> dict[str, Any]:
        return {"name": self.name}

    def estimate_sizes(self, source_sizes: np.ndarray) -> np.ndarray:
        return np.asarray(source_sizes, dtype=np.uint64)
