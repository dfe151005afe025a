"""What every codec is: the ``Codec`` protocol (the write half), the ``CodecReader`` classes (the read
half every reader asks), and the parsing of codec options (``key=value``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Protocol

import numpy as np

from ..errors import DecodeError, ManifestError, OptionError
from .._internal.imageinfo import DEFAULT_MAX_PIXELS, ImageInfo

__all__ = ["Codec", "CodecReader", "EncodedImageReader", "UnknownCodecReader", "RESAMPLE_FILTERS",
           "JPEG_SUBSAMPLING", "MAX_SIDE", "int_option", "choice_option", "check_keys", "parse_size_text"]

#: Pillow filter names accepted by the ``resample`` option.
RESAMPLE_FILTERS = ("lanczos", "bicubic", "bilinear", "box", "nearest")
#: Chroma subsampling modes accepted by the jpeg codec (simplejpeg's ``colorsubsampling``).
JPEG_SUBSAMPLING = ("444", "422", "420", "440", "411")
#: Largest side the codecs produce: the JPEG format's limit is 65535.
MAX_SIDE = 65500
# Resample from at least this many times the final resolution (Pillow's thumbnail default).


class Codec(Protocol):
    """Turns one checked source file into the payload stored in a shard (the write half)."""

    name: str
    #: The read half: the ``CodecReader`` subclass that ``packer.codecs.codec_for`` builds from the
    #: manifest's ``codec`` object.
    reader: type[CodecReader]

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


# --- the read half -------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class CodecReader:
    """The read half of a codec: what a reader asks about a dataset's payloads.

    ``packer.codecs.codec_for(dataset)`` returns the one for a dataset; readers ask it instead of
    comparing codec names. Each codec's class (``Codec.reader``) subclasses this one; the defaults
    here are the cautious answers (not encoded, no fixed shape, no source geometry kept).

    Attributes:
        entry: the manifest's ``codec`` object.
        path: the dataset, for error messages.
        notes: the build summary's ``codec_notes`` (what ``encode`` did, counted by label), or None.
        sample_count: the dataset's number of samples (what the notes are counted against).
    """

    entry: Any
    path: Any = None
    notes: Any = None
    sample_count: Any = None
    #: Payloads are encoded image files (``image_format`` says which) that an image decoder takes:
    #: ``packer.decode``, DALI's ``fn.decoders.image``, nvJPEG.
    encoded: ClassVar[bool] = False
    #: Payloads are decoded pixels of one fixed shape (``sample_shape``), read as views, never decoded.
    stores_pixels: ClassVar[bool] = False

    @property
    def name(self) -> Any:
        """The codec's name as the manifest records it (None when it records none)."""
        return self.entry.get("name") if isinstance(self.entry, Mapping) else None

    def check_decodable(self) -> None:
        """Refuse, before the first sample, payloads this packer cannot turn into pixels (SPEC §6).

        Raises:
            DecodeError: the codec is unknown, or its parameters are not ones packer decodes.
        """

    @property
    def keeps_source_geometry(self) -> bool:
        """Every stored image has its source's pixel grid, so coordinates a source gave in its
        images' pixels (boxes, keypoints) match the stored images."""
        return False

    @property
    def crops_source(self) -> bool:
        """The stored images are crops of their sources (not the whole picture, maybe scaled), so an
        image field stored whole (a mask) cannot follow a crop of them."""
        return False

    @property
    def sample_shape(self) -> tuple[int, int, int] | None:
        """``(height, width, channels)`` of every decoded sample when it is fixed, else None.

        Raises:
            ManifestError: the codec has a fixed shape but its manifest fields are unusable.
        """
        return None

    def pixel_shape(self) -> tuple[int, int, int]:
        """``sample_shape`` for a reader that only reads stored pixels (``packer.gpu.GpuRawBatches``).

        Raises:
            ManifestError: the payloads are not stored pixels, or their shape fields are unusable.
        """
        raise ManifestError(f"codec is {self.name!r}, not 'raw': payloads are encoded images, decode them "
                            f"instead", path=self.path)

    def stored_pixels(self, dataset: Any, i: int, data: np.ndarray) -> np.ndarray | None:
        """Sample ``i``'s payload ``data`` as ``(H, W, C)`` pixels when it stores pixels (a view, no
        copy), or None when it is an encoded image to decode."""
        return None

    def pixels(self, dataset: Any, i: int, data: np.ndarray, *, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
        """Sample ``i``'s ``(H, W, 3)`` uint8 pixels from its payload ``data`` (``packer.decode``'s rule).

        Args:
            dataset: the open dataset (``index``, ``key`` and ``path`` are used).
            i: the sample's index.
            data: its payload, a 1-D uint8 array (a view of the shard is fine).
            max_pixels: the decoder's pixel limit (``packer.codecs.dataset_max_pixels``).

        Raises:
            DecodeError: the payload cannot be turned into pixels; the message names the key.
        """
        raise NotImplementedError(f"{type(self).__name__} does not implement pixels")


class EncodedImageReader(CodecReader):
    """Payloads that are encoded image files, decoded by ``packer.decode.decode_image``."""

    encoded: ClassVar[bool] = True

    @property
    def keeps_source_geometry(self) -> bool:
        return True

    def pixels(self, dataset: Any, i: int, data: np.ndarray, *, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
        from ..decode import decode_image

        try:
            return decode_image(data, int(dataset.index.image_format[i]), max_pixels=max_pixels)
        except DecodeError as exc:
            raise DecodeError(f"{exc.message} (key {dataset.key(i)!r})", path=dataset.path, sample=i) from None


@dataclass(frozen=True, eq=False)
class UnknownCodecReader(CodecReader):
    """A codec this packer does not implement (a newer packer's): its payload bytes read, nothing
    decodes them (SPEC §6).

    Attributes:
        known: the codec names this packer implements, for the message.
    """

    known: tuple[str, ...] = ()

    def check_decodable(self) -> None:
        raise self._refusal()

    def pixels(self, dataset: Any, i: int, data: np.ndarray, *, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
        raise self._refusal()

    def _refusal(self) -> DecodeError:
        return DecodeError(f"the dataset's codec {self.name!r} is not one this packer can decode (it knows "
                           f"{', '.join(self.known)}); upgrade packer, or read the payload bytes without decoding",
                           path=self.path)


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

