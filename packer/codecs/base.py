"""What every codec is: the ``Codec`` protocol, and the parsing of codec options (``key=value``)."""

from __future__ import annotations

from typing import Any, Mapping, Protocol

import numpy as np

from ..errors import OptionError
from ..imageinfo import ImageInfo

__all__ = ["Codec", "RESAMPLE_FILTERS", "JPEG_SUBSAMPLING", "MAX_SIDE", "int_option", "choice_option", "check_keys",
           "parse_size_text"]

#: Pillow filter names accepted by the ``resample`` option.
RESAMPLE_FILTERS = ("lanczos", "bicubic", "bilinear", "box", "nearest")
#: Chroma subsampling modes accepted by the jpeg codec (simplejpeg's ``colorsubsampling``).
JPEG_SUBSAMPLING = ("444", "422", "420", "440", "411")
#: Largest side the codecs produce: the JPEG format's limit is 65535.
MAX_SIDE = 65500
# Resample from at least this many times the final resolution (Pillow's thumbnail default).


class Codec(Protocol):
    """Turns one checked source file into the payload stored in a shard."""

    name: str

    def encode(self, data: bytes, info: ImageInfo, *, name: str = "") -> tuple[bytes, ImageInfo]:
        """Return the payload to store and the ``ImageInfo`` describing that payload.

        Raises:
            DecodeError: the source cannot be decoded (the build rejects the file).
        """

    def manifest_entry(self) -> dict[str, Any]:
        """The manifest's ``codec`` object: the name and every parameter."""

    def estimate_sizes(self, source_sizes: np.ndarray) -> np.ndarray:
        """Expected payload sizes for the given source file sizes (for planning shards)."""

    # Optional: ``note(source, payload, info) -> str | None``, a short label for what ``encode``
    # did with one file, counted per label in the build summary (``codec_notes``).


# --- option parsing ------------------------------------------------------------------------

def int_option(codec: str, key: str, value: str, low: int, high: int) -> int:
    try:
        number = int(value)
    except ValueError:
        raise OptionError(f"codec {codec!r}: {key}={value!r} is not an integer") from None
    if not low <= number <= high:
        raise OptionError(f"codec {codec!r}: {key}={number} is out of range {low}..{high}")
    return number


def choice_option(codec: str, key: str, value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise OptionError(f"codec {codec!r}: {key}={value!r} is not one of {', '.join(choices)}")
    return value


def check_keys(codec: str, params: Mapping[str, str], allowed: tuple[str, ...]) -> None:
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        hint = f"it takes {', '.join(allowed)}" if allowed else "it takes no options"
        raise OptionError(f"codec {codec!r} has no option {', '.join(map(repr, unknown))}; {hint}")


def parse_size_text(text: str, *, what: str = "size") -> tuple[int, int]:
    """Parse ``"224x160"`` (height x width) or ``"224"`` (square) into ``(height, width)``.

    Raises:
        OptionError: not two positive integers separated by ``x``, or a side above 65500.
    """
    parts = text.lower().replace("×", "x").split("x")
    if len(parts) == 1:
        parts = parts * 2
    if len(parts) != 2:
        raise OptionError(f"codec 'raw': {what}={text!r} must look like HxW (e.g. 224x224) or N")
    height, width = (int_option("raw", what, part.strip(), 1, MAX_SIDE) for part in parts)
    return height, width

