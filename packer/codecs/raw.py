"""The ``raw`` codec: decoded HxWxC uint8 pixels at one fixed size, and the views that read them back."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, NamedTuple

import numpy as np

from ..errors import DecodeError, IndexMismatchError, ManifestError, OptionError
from ..format import ImageFormat, align_up
from .._internal.imageinfo import DEFAULT_MAX_PIXELS, ImageInfo
from .base import MAX_SIDE, RESAMPLE_FILTERS, CodecReader, check_keys, choice_option, int_option, parse_size_text
from .resize import decode_for_box, jpeg_dimensions, resample_box

__all__ = ["RawCodec", "RawReader", "RawRun", "raw_sample_shape", "raw_sample_stride", "raw_batch_view",
           "raw_samples_view", "raw_runs"]


class RawReader(CodecReader):
    """Decoded pixels at one fixed size: payloads are viewed, never decoded (the module docstring,
    and the layout of formats/SPEC.md §3.2 that every raw reader checks here)."""

    stores_pixels: ClassVar[bool] = True

    def check_decodable(self) -> None:
        """Refuse a ``layout`` other than ``"HWC"`` or a ``dtype`` other than ``"uint8"`` (SPEC §6).

        Raises:
            DecodeError: the parameters are not the ones packer reads.
        """
        layout, dtype = self.entry.get("layout"), self.entry.get("dtype")
        if layout != "HWC" or dtype != "uint8":
            raise DecodeError(f"raw codec with layout {layout!r} and dtype {dtype!r}: this packer "
                              f"decodes only layout 'HWC', dtype 'uint8'", path=self.path)

    @property
    def keeps_source_geometry(self) -> bool:
        """Only when every source had the target size already, which the build summary counts
        (``codec_notes``: ``kept size``; a dataset built before that note is taken as resampled)."""
        notes = self.notes
        return isinstance(notes, Mapping) and notes.get("kept size") == self.sample_count and len(notes) == 1

    @property
    def crops_source(self) -> bool:
        """The centre crop to the target's aspect ratio (unless every source had the target size)."""
        return not self.keeps_source_geometry

    @property
    def sample_shape(self) -> tuple[int, int, int]:
        return self.pixel_shape()

    def pixel_shape(self) -> tuple[int, int, int]:
        return raw_sample_shape(self.entry, path=self.path)

    def stride(self, alignment: int) -> int:
        """Bytes from one sample's start to the next one's in a shard (``raw_sample_stride``)."""
        return raw_sample_stride(self.pixel_shape(), alignment)

    def stored_pixels(self, dataset: Any, i: int, data: np.ndarray) -> np.ndarray:
        """The payload reshaped to the index's height, width and channels (a view).

        Raises:
            DecodeError: the payload's size is not the index's height x width x channels.
        """
        ix = dataset.index
        shape = (int(ix.height[i]), int(ix.width[i]), int(ix.channels[i]))
        if math.prod(shape) != data.size:
            raise DecodeError(f"raw payload of {data.size} bytes does not hold the index's "
                              f"{shape[0]}x{shape[1]}x{shape[2]} pixels", path=dataset.path, sample=i)
        return data.reshape(shape)

    def pixels(self, dataset: Any, i: int, data: np.ndarray, *, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
        return self.stored_pixels(dataset, i, data)

    def check_index(self, index: Any) -> None:
        """Every row of ``index`` (a ``DatasetIndex``'s columns) is one raw sample: ``sample_shape``'s
        size and ``image_format`` 7. For readers that check the whole index once at open.

        Raises:
            ManifestError: the codec's shape fields are unusable.
            IndexMismatchError: the first row that is not, named.
        """
        shape = self.pixel_shape()
        sample_bytes = shape[0] * shape[1] * shape[2]
        bad = np.flatnonzero((index.size != sample_bytes) | (index.image_format != ImageFormat.RAW))
        if len(bad):
            i = int(bad[0])
            raise IndexMismatchError(
                f"is {int(index.size[i])} bytes of image_format {int(index.image_format[i])}, but the raw codec "
                f"says every sample is {sample_bytes} bytes ({'x'.join(map(str, shape))}) of "
                f"format {ImageFormat.RAW}", path=self.path, sample=i)

    def check_rows(self, dataset: Any, indices: np.ndarray) -> list["RawRun"]:
        """``raw_runs(dataset, indices, sample_shape)``: the batch's rows checked against the layout."""
        return raw_runs(dataset, indices, self.pixel_shape())


@dataclass(frozen=True)
class RawCodec:
    """Decoded ``uint8`` RGB pixels at exactly ``height x width``, HWC (module docstring).

    Attributes:
        height: stored height in pixels.
        width: stored width in pixels.
        resample: Pillow filter, one of ``RESAMPLE_FILTERS``.
    """

    height: int
    width: int
    resample: str = "lanczos"
    name: ClassVar[str] = "raw"
    channels: ClassVar[int] = 3
    OPTIONS: ClassVar[tuple[str, ...]] = ("size", "resample")
    reader: ClassVar[type[RawReader]] = RawReader

    def __post_init__(self) -> None:
        int_option(self.name, "height", str(self.height), 1, MAX_SIDE)
        int_option(self.name, "width", str(self.width), 1, MAX_SIDE)
        choice_option(self.name, "resample", self.resample, RESAMPLE_FILTERS)

    @classmethod
    def from_options(cls, params: Mapping[str, str]) -> "RawCodec":
        """Build from the string options of a codec spec (``size`` is required).

        Raises:
            OptionError: ``size`` missing, an unknown option or a bad value.
        """
        check_keys(cls.name, params, cls.OPTIONS)
        if "size" not in params:
            raise OptionError("codec 'raw' needs a size: raw:size=HxW (e.g. raw:size=224x224, "
                             "or --size 224x224)")
        height, width = parse_size_text(params["size"])
        return cls(height=height, width=width, resample=params.get("resample", "lanczos"))

    @property
    def sample_bytes(self) -> int:
        """Payload size of every sample: ``height * width * 3``."""
        return self.height * self.width * self.channels

    def crop_box(self, width: int, height: int) -> tuple[float, float, float, float]:
        """The centred box of a ``width x height`` source that is resampled to the target.

        The largest box with the target's aspect ratio: the whole of one side, centred on the
        other, in exact (fractional) source pixels.
        """
        scale = max(self.width / width, self.height / height)
        box_w, box_h = min(width, self.width / scale), min(height, self.height / scale)
        left, top = (width - box_w) / 2, (height - box_h) / 2
        return (left, top, left + box_w, top + box_h)

    def encode(self, data: bytes, info: ImageInfo, *, name: str = "") -> tuple[bytes, ImageInfo]:
        """Decode one image and resample its centred box to the target size.

        Raises:
            DecodeError: the source cannot be decoded.
        """
        width, height = info.width, info.height
        if info.image_format == ImageFormat.JPEG:
            header = jpeg_dimensions(data)
            if header is not None:
                width, height = header[0], header[1]
        scale = max(self.width / width, self.height / height) if width and height else 1.0
        pixels, source_w, source_h = decode_for_box(data, info, scale, name)
        box = self.crop_box(source_w, source_h)
        pixels = resample_box(pixels, source_w, source_h, box, self.width, self.height, self.resample)
        payload = np.ascontiguousarray(pixels, dtype=np.uint8).tobytes()
        if len(payload) != self.sample_bytes:  # a decoder contract broke; never store it
            raise DecodeError(f"raw payload is {len(payload)} bytes, expected {self.sample_bytes}",
                              path=name or None)
        return payload, ImageInfo(image_format=ImageFormat.RAW, width=self.width, height=self.height,
                                  channels=self.channels, mode="RGB")

    def note(self, source: bytes, payload: bytes, info: ImageInfo, *,
             source_info: ImageInfo | None = None) -> str | None:
        """``kept size`` when the source already had the target size (its pixel grid is the stored
        one), else ``resampled``: counted in the build summary, and what tells a reader whether
        coordinates given in source pixels (boxes) still match the stored images. ``source_info``:
        the source's probe, when the caller has it (else the source is probed again)."""
        from .._internal.imageinfo import probe_image

        try:
            if source_info is None:
                source_info = probe_image(source, validate="header")
        except Exception:  # noqa: BLE001 - it was decoded a moment ago; never fail a sample on a note
            return "resampled"
        kept = (source_info.width, source_info.height) == (self.width, self.height)
        return "kept size" if kept else "resampled"

    def manifest_entry(self) -> dict[str, Any]:
        return {"name": self.name, "height": self.height, "width": self.width,
                "channels": self.channels, "layout": "HWC", "dtype": "uint8", "fit": "center-crop",
                "resample": self.resample}

    def estimate_sizes(self, source_sizes: np.ndarray) -> np.ndarray:
        return np.full(len(source_sizes), self.sample_bytes, dtype=np.uint64)


# --- reading raw payloads ----------------------------------------------------------------------

def raw_sample_shape(codec_entry: Mapping[str, Any], *, path: object = None) -> tuple[int, int, int]:
    """The ``(height, width, channels)`` of every payload of a ``raw`` dataset.

    Args:
        codec_entry: the manifest's ``codec`` object.
        path: the dataset, for error messages.

    Raises:
        ManifestError: the codec is not ``raw``, or its shape fields are missing or not ``HWC``
            ``uint8`` with positive integer sides and 3 channels (``formats/SPEC.md`` §9: R, G, B;
            every raw reader, the batched crops included, reads three).
    """
    if codec_entry.get("name") != "raw":
        raise ManifestError(f"codec is {codec_entry.get('name')!r}, not 'raw': payloads are encoded "
                            f"images, decode them instead", path=path)
    if codec_entry.get("layout", "HWC") != "HWC" or codec_entry.get("dtype", "uint8") != "uint8":
        raise ManifestError(f"raw codec layout {codec_entry.get('layout')!r} / dtype "
                            f"{codec_entry.get('dtype')!r} is not supported (expected HWC uint8)",
                            path=path)
    shape = []
    for key in ("height", "width", "channels"):
        value = codec_entry.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_SIDE:
            raise ManifestError(f"raw codec field {key!r} must be an integer in 1..{MAX_SIDE}, "
                                f"got {value!r}", path=path)
        shape.append(value)
    if shape[2] != RawCodec.channels:  # the payloads are R, G, B: another count is a damaged or foreign manifest
        raise ManifestError(f"raw codec declares {shape[2]} channels; raw payloads hold exactly "
                            f"{RawCodec.channels} (R, G, B, formats/SPEC.md), so this manifest is damaged or was "
                            f"not written by packer", path=path)
    return shape[0], shape[1], shape[2]


def raw_sample_stride(shape: tuple[int, int, int], alignment: int) -> int:
    """Distance in bytes between consecutive raw samples of one shard: ``align_up(H*W*C, A)``."""
    return align_up(shape[0] * shape[1] * shape[2], alignment)


def raw_batch_view(batch_bytes: Any, count: int, stride: int,
                   shape: tuple[int, int, int]) -> np.ndarray:
    """View a block of ``count`` consecutive raw samples as a ``(count, H, W, C)`` uint8 array.

    Zero-copy: a reshape when ``stride == H*W*C``, else a strided view that skips the padding.
    The view shares memory with ``batch_bytes`` (and is read-only if it is).

    Args:
        batch_bytes: the block, starting at the first sample's first byte: a 1-D uint8 array or
            any buffer (bytes, bytearray, memoryview, mmap).
        count: number of samples in the block.
        stride: bytes from one sample's start to the next (``raw_sample_stride``).
        shape: ``(H, W, C)`` of one sample (``raw_sample_shape``).

    Returns:
        A ``(count, H, W, C)`` uint8 array.

    Raises:
        ValueError: ``stride`` is smaller than a sample, or the block is too short.
    """
    height, width, channels = shape
    sample = height * width * channels
    if count < 0 or stride < sample:
        raise ValueError(f"need count >= 0 and stride >= {sample} (one {height}x{width}x{channels} "
                         f"sample), got count={count}, stride={stride}")
    block = batch_bytes if isinstance(batch_bytes, np.ndarray) else np.frombuffer(batch_bytes, np.uint8)
    block = block.reshape(-1).view(np.uint8)
    needed = (count - 1) * stride + sample if count else 0
    if block.size < needed:
        raise ValueError(f"block holds {block.size} bytes; {count} samples of {sample} bytes every "
                         f"{stride} bytes need {needed}")
    if count == 0:
        return np.empty((0, height, width, channels), dtype=np.uint8)
    if stride == sample:
        return block[:count * sample].reshape(count, height, width, channels)
    return np.lib.stride_tricks.as_strided(
        block, shape=(count, height, width, channels),
        strides=(stride, width * channels, channels, 1), writeable=block.flags.writeable)


def raw_samples_view(data: Any, starts: Any, shape: tuple[int, int, int]) -> np.ndarray:
    """Raw samples at byte positions ``starts`` of ``data`` as a ``(len(starts), H, W, C)`` array.

    Made for ``Dataset.read_batch`` results (``batch.data``, ``batch.starts``): zero-copy when the
    starts are evenly spaced (a run of consecutive samples of one shard, in order), otherwise
    the samples are gathered into a new array.

    Raises:
        ValueError: a sample lies outside ``data``.
    """
    block = data if isinstance(data, np.ndarray) else np.frombuffer(data, np.uint8)
    block = block.reshape(-1).view(np.uint8)
    positions = np.asarray(starts, dtype=np.int64)
    height, width, channels = shape
    sample = height * width * channels
    if positions.size and (positions.min() < 0 or positions.max() + sample > block.size):
        raise ValueError(f"a sample of {sample} bytes at one of {positions.tolist()[:8]} lies "
                         f"outside the {block.size}-byte block")
    if positions.size == 0:
        return np.empty((0, height, width, channels), dtype=np.uint8)
    steps = np.diff(positions)
    if positions.size == 1 or (steps[0] >= sample and np.all(steps == steps[0])):
        stride = int(steps[0]) if positions.size > 1 else sample
        return raw_batch_view(block[int(positions[0]):], len(positions), stride, shape)
    gathered = np.empty((len(positions), height, width, channels), dtype=np.uint8)
    for j, position in enumerate(positions.tolist()):
        gathered[j] = block[position:position + sample].reshape(height, width, channels)
    return gathered


class RawRun(NamedTuple):
    """The samples of a batch that lie in one shard (``raw_runs``).

    Attributes:
        shard: the shard number.
        rows: the batch rows these samples are (int64), or None when they are the whole batch.
        offsets: their byte offsets in the shard (int64), in ``rows`` order.
        positions: their positions in the shard (sample number minus the shard's first).
    """

    shard: int
    rows: np.ndarray | None
    offsets: np.ndarray
    positions: np.ndarray


def raw_runs(dataset: Any, indices: np.ndarray, shape: tuple[int, int, int]) -> list[RawRun]:
    """Check a batch of raw samples against the raw layout and split it by shard: the one layout
    check every raw batch reader makes before it reads a byte (formats/SPEC.md §3.2).

    Every sample is ``H*W*C`` bytes, and within a shard sample ``k`` starts ``k * stride`` bytes
    after the shard's first sample (``raw_sample_stride``). An index that breaks this (hand-made,
    with its checksums kept) would otherwise be read at whatever bytes lie there.

    Args:
        dataset: an open dataset (``index``, ``manifest``, ``stored_layout``, ``stored_rows``,
            ``alignment``, ``path``; a view counts positions in its base's shards).
        indices: the batch's sample indices (int64, in range).
        shape: ``(H, W, C)`` of every sample (``RawReader.sample_shape``).

    Returns:
        One ``RawRun`` per shard the batch touches, in shard order.

    Raises:
        IndexMismatchError: a row of the wrong size, or one off the stride grid of its shard (the
            first such row, named).
    """
    sample = shape[0] * shape[1] * shape[2]
    ix = dataset.index
    wrong_size = ix.size[indices] != sample
    if wrong_size.any():
        bad = int(indices[np.argmax(wrong_size)])
        raise IndexMismatchError(f"raw sample of {int(ix.size[bad])} bytes, expected {sample} "
                                 f"({shape[0]}x{shape[1]}x{shape[2]})", path=dataset.path, sample=bad)
    single = len(dataset.manifest.shards) == 1
    shards = None if single else ix.shard[indices]
    runs = []
    for shard in ([0] if single else np.unique(shards).tolist()):
        first, _, base = dataset.stored_layout(shard)
        rows = None if single else np.flatnonzero(shards == shard)
        mine = indices if rows is None else indices[rows]
        positions = dataset.stored_rows(mine) - first
        offsets = ix.offset[mine].astype(np.int64)
        stride = raw_sample_stride(shape, dataset.shard_alignment(shard))
        misplaced = offsets != base + positions * stride
        if misplaced.any():
            bad = int(mine[np.argmax(misplaced)])
            raise IndexMismatchError(f"raw sample offset {int(ix.offset[bad])} is not at a multiple "
                                     f"of the {stride}-byte stride from the shard's first sample",
                                     path=dataset.path, sample=bad)
        runs.append(RawRun(shard, rows if rows is None or len(rows) < len(indices) else None, offsets, positions))
    return runs
