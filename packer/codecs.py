"""Codecs: how a checked source image becomes the payload bytes stored in a shard.

A codec is named in the build options as ``name`` or ``name:key=value,...`` (the *codec spec*,
``BuildOptions.codec``) and recorded in the manifest's ``codec`` object with every parameter, so
readers know what the payload bytes are. Four codecs exist:

``passthrough`` (the default)
    Stores the source file's bytes verbatim: no decoding, no quality loss. ``image_format``,
    ``width``, ``height`` and ``channels`` in the index describe the source file. Takes no options.
    Manifest: ``{"name": "passthrough"}``.

``tiled`` — lossless, faster random crops
    Baseline JPEGs are rewritten by ``packer.tiles.transcode``: the same DCT coefficients (every
    decoder shows exactly the same pixels), with a restart marker after every tile of 16 pixels
    or so, re-optimised Huffman tables and a table of tile lengths in APP9 segments, so that
    ``packer.transforms.RandomResizedCrop`` decodes only the tiles under its crop
    (formats/SPEC.md, "Tiled JPEG"). Sizes stay within a few per cent of the source's (the
    optimised tables usually pay for the markers). Everything else is stored as is, like
    ``passthrough``: other formats, and JPEGs that cannot be tiled losslessly (progressive,
    arithmetic-coded, 12-bit, multi-scan) or that the transcoder finds damaged. The index's
    ``image_format``/``width``/``height``/``channels`` describe the image, unchanged. Takes no
    options; needs the compiled ``packer._jpegtiles`` (built at install with a C compiler) to
    *build*, nothing extra to read. Costs about 3.4 ms of CPU per 110 KB JPEG at build time.
    Manifest: ``{"name": "tiled", "version": 1}``.

``jpeg`` — re-encoded JPEG, e.g. ``jpeg:max_size=256,quality=90``
    Decodes the source, shrinks it so its longer side (``side=longer``, the default) or its
    shorter side (``side=shorter``) is at most ``max_size`` pixels, keeping the aspect ratio
    (never enlarging; without ``max_size`` the size is kept), and encodes it with simplejpeg
    (libjpeg-turbo) at ``quality`` (1-100, default 90) with chroma ``subsampling`` (``420``
    default, ``422``, ``440``, ``411`` or ``444``). Target sizes round to the nearest pixel, at
    least 1. Payloads are baseline JFIF JPEGs with no EXIF or ICC data; ``image_format`` is 1
    (jpeg), ``width``/``height`` are those of the stored JPEG and ``channels`` is 3.
    Manifest: ``{"name": "jpeg", "quality": 90, "max_size": 256, "side": "longer",
    "subsampling": "420", "resample": "lanczos", "channels": 3}`` (``max_size`` absent when
    not set).

``raw`` — decoded pixels at a fixed size, e.g. ``raw:size=224x224`` (height x width; ``size=224``
is square)
    Decodes the source and resamples the largest centred box of the source that has the target
    aspect ratio to exactly ``height x width`` pixels: a resize so that the image covers the
    target, then a centre crop, done as one resampling of the exact (sub-pixel) centred box, so
    there is no intermediate rounding. Small sources are enlarged. The payload is
    ``height * width * 3`` bytes: ``uint8`` R, G, B, in ``HWC`` order (row-major, channels
    last), exactly ``numpy.ndarray.tobytes()`` of a C-contiguous ``(height, width, 3)`` array.
    ``image_format`` is 7 (raw), ``width``/``height`` are the target's, ``channels`` is 3.
    Manifest: ``{"name": "raw", "height": 224, "width": 224, "channels": 3, "layout": "HWC",
    "dtype": "uint8", "fit": "center-crop", "resample": "lanczos"}``.

Batches of raw samples. Every raw payload has the same size ``H*W*3``, so within one shard
sample ``i+1`` starts exactly ``stride = align_up(H*W*3, alignment)`` bytes after sample ``i``
(formats/SPEC.md §3.2). A run of ``k`` consecutive samples of one shard is therefore one block
of ``(k-1)*stride + H*W*3`` bytes starting at the first sample's offset: one read, then
``raw_batch_view`` turns it into a ``(k, H, W, 3)`` array without copying (a strided view; a
plain reshape when ``stride == H*W*3``). With alignment 4096 the block is also aligned for
O_DIRECT and GPUDirect Storage (§3.3); the padding costs less than 4 KiB per sample (for
224x224x3 = 150528 bytes: stride 151552, 0.7 %). A batch that crosses a shard boundary is one
such block per shard.

Non-RGB sources (both ``jpeg`` and ``raw``). Pixels come from ``packer.decode.decode_image``
and follow its rule exactly: grayscale (``L``, ``1``) is replicated to R = G = B; alpha
(``RGBA``, ``LA``, ``PA``, palette with transparency) is dropped, not composited, so a
transparent pixel keeps its stored colour; palette images become their palette colours; CMYK
and YCCK JPEGs become ``R = (255 - C) * (255 - K) / 255`` (likewise G, B) with no colour
profile; 16-bit images keep the high byte of each sample; 32-bit float gray is rounded and
clipped to 0..255. EXIF orientation and ICC profiles are not applied (pixels as encoded), and
the re-encoded JPEG carries neither, so the stored image is exactly what every decoder shows.
The first frame of animated or multi-page files is used. Both codecs store 3 channels.

Resampling. Pillow's ``Image.resize`` with the ``resample`` filter (``lanczos`` by default;
``bicubic``, ``bilinear``, ``box`` or ``nearest``) and ``reducing_gap=2.0``. JPEG sources that
are at least twice as large as needed are first decoded smaller by libjpeg-turbo's DCT scaling
(``simplejpeg.decode_jpeg(min_width=, min_height=)``), never below twice the final resolution
of the box: the same trade-off as Pillow's ``Image.thumbnail(reducing_gap=2.0)``. Measured on a
2000x1500 photo-like JPEG to 256x192: 13 ms, against 27 ms for a full decode and a resize with
``reducing_gap`` and 40 ms without (mean absolute difference to the exact Lanczos result: 0.4
level). A typical 500x375 JPEG costs about 5 ms per image with ``lanczos`` and 2.5 ms with
``bilinear`` at build time; reading it back, the 256-pixel JPEG decodes in 0.2 ms against 1.3 ms
for the source. Output depends only on the input bytes and the parameters (and the Pillow and
libjpeg-turbo versions).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Protocol

import numpy as np

from .errors import BuildError, DecodeError, ManifestError
from .format import ImageFormat, align_up
from .imageinfo import ImageInfo

__all__ = [
    "Codec", "PassthroughCodec", "TiledCodec", "JpegCodec", "RawCodec", "CODECS", "get_codec",
    "parse_codec_spec", "format_codec_spec", "merge_codec_options", "raw_sample_shape",
    "raw_sample_stride", "raw_batch_view", "raw_samples_view",
]

#: Pillow filter names accepted by the ``resample`` option.
RESAMPLE_FILTERS = ("lanczos", "bicubic", "bilinear", "box", "nearest")
#: Chroma subsampling modes accepted by the jpeg codec (simplejpeg's ``colorsubsampling``).
JPEG_SUBSAMPLING = ("444", "422", "420", "440", "411")
#: Largest side the codecs produce: the JPEG format's limit is 65535.
MAX_SIDE = 65500
# Resample from at least this many times the final resolution (Pillow's thumbnail default).
_REDUCING_GAP = 2.0


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

def _int_option(codec: str, key: str, value: str, low: int, high: int) -> int:
    try:
        number = int(value)
    except ValueError:
        raise BuildError(f"codec {codec!r}: {key}={value!r} is not an integer") from None
    if not low <= number <= high:
        raise BuildError(f"codec {codec!r}: {key}={number} is out of range {low}..{high}")
    return number


def _choice_option(codec: str, key: str, value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise BuildError(f"codec {codec!r}: {key}={value!r} is not one of {', '.join(choices)}")
    return value


def _check_keys(codec: str, params: Mapping[str, str], allowed: tuple[str, ...]) -> None:
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        hint = f"it takes {', '.join(allowed)}" if allowed else "it takes no options"
        raise BuildError(f"codec {codec!r} has no option {', '.join(map(repr, unknown))}; {hint}")


def parse_size_text(text: str, *, what: str = "size") -> tuple[int, int]:
    """Parse ``"224x160"`` (height x width) or ``"224"`` (square) into ``(height, width)``.

    Raises:
        BuildError: not two positive integers separated by ``x``, or a side above 65500.
    """
    parts = text.lower().replace("×", "x").split("x")
    if len(parts) == 1:
        parts = parts * 2
    if len(parts) != 2:
        raise BuildError(f"codec 'raw': {what}={text!r} must look like HxW (e.g. 224x224) or N")
    height, width = (_int_option("raw", what, part.strip(), 1, MAX_SIDE) for part in parts)
    return height, width


# --- shared pixel work -----------------------------------------------------------------------

def _resample_filter(name: str) -> Any:
    from PIL import Image

    return {"lanczos": Image.Resampling.LANCZOS, "bicubic": Image.Resampling.BICUBIC,
            "bilinear": Image.Resampling.BILINEAR, "box": Image.Resampling.BOX,
            "nearest": Image.Resampling.NEAREST}[name]


def _jpeg_dimensions(data: bytes | memoryview) -> tuple[int, int, str] | None:
    """(width, height, colorspace) from a JPEG header, or None when simplejpeg cannot read it."""
    import simplejpeg

    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    except Exception:  # noqa: BLE001 - decode_image's Pillow fallback will have its say
        return None
    return int(width), int(height), str(colorspace)


def _decode_for_box(data: bytes | memoryview, info: ImageInfo, box_scale: float,
                    name: str) -> tuple[np.ndarray, int, int]:
    """Decode ``data`` to RGB, possibly reduced in the DCT domain, for a box scaled by ``box_scale``.

    ``box_scale`` is output pixels per source pixel. A JPEG is decoded at a reduced size only when
    the reduced image still has at least ``_REDUCING_GAP`` times the final resolution; everything
    else goes through ``decode_image`` at full size.

    Returns:
        (pixels, source_width, source_height): ``pixels`` may be smaller than the source; box
        coordinates in source pixels must be scaled by ``pixels`` size / source size.
    """
    from .decode import decode_image

    if info.image_format == ImageFormat.JPEG and box_scale * _REDUCING_GAP <= 0.5:
        header = _jpeg_dimensions(data)
        # CMYK/YCCK go through decode_image, whose rule converts them (simplejpeg's may differ).
        if header is not None and header[2] not in ("CMYK", "YCCK"):
            import simplejpeg

            width, height = header[0], header[1]
            need_w = math.ceil(width * box_scale * _REDUCING_GAP)
            need_h = math.ceil(height * box_scale * _REDUCING_GAP)
            try:
                pixels = simplejpeg.decode_jpeg(data, colorspace="RGB", min_width=need_w,
                                                min_height=need_h, min_factor=2)
            except Exception:  # noqa: BLE001 - strict mode refuses some files; decode_image retries
                pixels = None
            if pixels is not None:
                return pixels, width, height
    pixels = decode_image(data, info.image_format, name=name)
    return pixels, pixels.shape[1], pixels.shape[0]


def _resample_box(pixels: np.ndarray, source_w: int, source_h: int,
                  box: tuple[float, float, float, float], out_w: int, out_h: int,
                  resample: str) -> np.ndarray:
    """Resample ``box`` (in source pixel coordinates) of ``pixels`` to ``out_h x out_w`` RGB."""
    from PIL import Image

    have_h, have_w = pixels.shape[:2]
    if (have_w, have_h) == (out_w, out_h) and box == (0, 0, have_w, have_h):
        return pixels
    fx, fy = have_w / source_w, have_h / source_h
    scaled = (box[0] * fx, box[1] * fy, box[2] * fx, box[3] * fy)
    image = Image.fromarray(pixels).resize((out_w, out_h), _resample_filter(resample),
                                                  box=scaled, reducing_gap=_REDUCING_GAP)
    return np.asarray(image)


# --- codecs ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PassthroughCodec:
    """Stores the source bytes unchanged."""

    name: str = "passthrough"
    OPTIONS: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_options(cls, params: Mapping[str, str]) -> "PassthroughCodec":
        _check_keys("passthrough", params, cls.OPTIONS)
        return cls()

    def encode(self, data: bytes, info: ImageInfo, *, name: str = "") -> tuple[bytes, ImageInfo]:
        return data, info

    def manifest_entry(self) -> dict[str, Any]:
        return {"name": self.name}

    def estimate_sizes(self, source_sizes: np.ndarray) -> np.ndarray:
        return np.asarray(source_sizes, dtype=np.uint64)


@dataclass(frozen=True)
class TiledCodec:
    """Stores baseline JPEGs losslessly re-tiled (``packer.tiles``), everything else as is."""

    name: str = "tiled"
    OPTIONS: ClassVar[tuple[str, ...]] = ()
    # The probe has already applied the build's --max-pixels; this only bounds the transcoder.
    _MAX_PIXELS: ClassVar[int] = MAX_SIDE * MAX_SIDE

    @classmethod
    def from_options(cls, params: Mapping[str, str]) -> "TiledCodec":
        from .tiles import transcoder_available

        _check_keys("tiled", params, cls.OPTIONS)
        if not transcoder_available():
            raise BuildError("codec 'tiled' needs packer's compiled extension packer._jpegtiles, "
                             "which was not built when packer was installed (no C compiler?); "
                             "reinstall packer where a C compiler is available")
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

    def note(self, source: bytes, payload: bytes, info: ImageInfo) -> str | None:
        """``tiled``, or why a JPEG was kept as it is (``kept: progressive``, ...); None for other
        formats. Counted in the build summary so a mostly-progressive source shows."""
        from .tiles import untiled_reason

        if info.image_format != ImageFormat.JPEG:
            return None
        return "tiled" if payload is not source else f"kept: {untiled_reason(source)}"

    def manifest_entry(self) -> dict[str, Any]:
        return {"name": self.name, "version": 1}

    def estimate_sizes(self, source_sizes: np.ndarray) -> np.ndarray:
        return np.asarray(source_sizes, dtype=np.uint64)


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

    def __post_init__(self) -> None:
        if self.max_size is not None:
            _int_option(self.name, "max_size", str(self.max_size), 1, MAX_SIDE)
        _int_option(self.name, "quality", str(self.quality), 1, 100)
        _choice_option(self.name, "side", self.side, ("longer", "shorter"))
        _choice_option(self.name, "subsampling", self.subsampling, JPEG_SUBSAMPLING)
        _choice_option(self.name, "resample", self.resample, RESAMPLE_FILTERS)

    @classmethod
    def from_options(cls, params: Mapping[str, str]) -> "JpegCodec":
        """Build from the string options of a codec spec.

        Raises:
            BuildError: an unknown option or a bad value.
        """
        _check_keys(cls.name, params, cls.OPTIONS)
        values: dict[str, Any] = dict(params)
        if "max_size" in values:
            values["max_size"] = _int_option(cls.name, "max_size", values["max_size"], 1, MAX_SIDE)
        if "quality" in values:
            values["quality"] = _int_option(cls.name, "quality", values["quality"], 1, 100)
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
            header = _jpeg_dimensions(data)
            if header is not None:
                width, height = header[0], header[1]
        out_w, out_h = self.target_size(width, height)
        scale = min(out_w / width, out_h / height) if width and height else 1.0
        pixels, source_w, source_h = _decode_for_box(data, info, scale, name)
        if (source_w, source_h) != (width, height):  # the header disagreed with the pixels
            out_w, out_h = self.target_size(source_w, source_h)
        pixels = _resample_box(pixels, source_w, source_h, (0, 0, source_w, source_h), out_w, out_h,
                               self.resample)
        try:
            payload = simplejpeg.encode_jpeg(np.ascontiguousarray(pixels), quality=self.quality,
                                             colorspace="RGB", colorsubsampling=self.subsampling)
        except Exception as exc:  # noqa: BLE001 - report any encoder failure as this sample's
            raise DecodeError(f"cannot encode the {out_w}x{out_h} image as JPEG: {exc}",
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

    def __post_init__(self) -> None:
        _int_option(self.name, "height", str(self.height), 1, MAX_SIDE)
        _int_option(self.name, "width", str(self.width), 1, MAX_SIDE)
        _choice_option(self.name, "resample", self.resample, RESAMPLE_FILTERS)

    @classmethod
    def from_options(cls, params: Mapping[str, str]) -> "RawCodec":
        """Build from the string options of a codec spec (``size`` is required).

        Raises:
            BuildError: ``size`` missing, an unknown option or a bad value.
        """
        _check_keys(cls.name, params, cls.OPTIONS)
        if "size" not in params:
            raise BuildError("codec 'raw' needs a size: raw:size=HxW (e.g. raw:size=224x224, "
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
            header = _jpeg_dimensions(data)
            if header is not None:
                width, height = header[0], header[1]
        scale = max(self.width / width, self.height / height) if width and height else 1.0
        pixels, source_w, source_h = _decode_for_box(data, info, scale, name)
        box = self.crop_box(source_w, source_h)
        pixels = _resample_box(pixels, source_w, source_h, box, self.width, self.height, self.resample)
        payload = np.ascontiguousarray(pixels, dtype=np.uint8).tobytes()
        if len(payload) != self.sample_bytes:  # a decoder contract broke; never store it
            raise DecodeError(f"raw payload is {len(payload)} bytes, expected {self.sample_bytes}",
                              path=name or None)
        return payload, ImageInfo(image_format=ImageFormat.RAW, width=self.width, height=self.height,
                                  channels=self.channels, mode="RGB")

    def manifest_entry(self) -> dict[str, Any]:
        return {"name": self.name, "height": self.height, "width": self.width,
                "channels": self.channels, "layout": "HWC", "dtype": "uint8", "fit": "center-crop",
                "resample": self.resample}

    def estimate_sizes(self, source_sizes: np.ndarray) -> np.ndarray:
        return np.full(len(source_sizes), self.sample_bytes, dtype=np.uint64)


#: Codec name -> class; each class has ``from_options(params)``.
CODECS: dict[str, Any] = {"passthrough": PassthroughCodec, "tiled": TiledCodec, "jpeg": JpegCodec,
                          "raw": RawCodec}


# --- codec specs -------------------------------------------------------------------------------

def parse_codec_spec(spec: str) -> tuple[str, dict[str, str]]:
    """Split ``"jpeg:quality=90,max_size=256"`` into ``("jpeg", {"quality": "90", "max_size": "256"})``.

    Raises:
        BuildError: an option that is not ``key=value``, or a key given twice.
    """
    name, _, rest = spec.partition(":")
    params: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            raise BuildError(f"codec option {item!r} in {spec!r} must look like key=value")
        if key in params:
            raise BuildError(f"codec option {key!r} is given twice in {spec!r}")
        params[key] = value
    return name.strip(), params


def format_codec_spec(name: str, params: Mapping[str, str]) -> str:
    """The canonical spec text: ``name`` or ``name:key=value,...`` with keys sorted."""
    if not params:
        return name
    return f"{name}:" + ",".join(f"{key}={params[key]}" for key in sorted(params))


def merge_codec_options(spec: str, options: Mapping[str, str | None]) -> str:
    """Add options (e.g. from ``--quality``) to a codec spec and validate the result.

    Args:
        spec: the codec spec, e.g. ``"jpeg"`` or ``"jpeg:quality=80"``.
        options: key -> value; ``None`` values are ignored.

    Returns:
        The canonical spec (``format_codec_spec``) holding every option.

    Raises:
        BuildError: an option conflicts with a different value in ``spec``, the codec does not
            take it, or the result is not a valid codec.
    """
    name, params = parse_codec_spec(spec)
    for key, value in options.items():
        if value is None:
            continue
        value = str(value).strip()
        if key in params and params[key] != value:
            raise BuildError(f"codec option {key} is given twice with different values: "
                             f"{key}={params[key]} in {spec!r} and {key}={value}")
        params[key] = value
    merged = format_codec_spec(name, params)
    get_codec(merged)
    return merged


def get_codec(spec: str) -> Codec:
    """The codec named by ``spec`` (``name`` or ``name:key=value,...``).

    Raises:
        BuildError: unknown codec, unknown option or bad value; the message names the codec,
            the option and what is allowed.
    """
    name, params = parse_codec_spec(spec)
    factory = CODECS.get(name)
    if factory is None:
        raise BuildError(f"unknown codec {name!r}; available: {', '.join(sorted(CODECS))}")
    return factory.from_options(params)


# --- reading raw payloads ----------------------------------------------------------------------

def raw_sample_shape(codec_entry: Mapping[str, Any], *, path: object = None) -> tuple[int, int, int]:
    """The ``(height, width, channels)`` of every payload of a ``raw`` dataset.

    Args:
        codec_entry: the manifest's ``codec`` object.
        path: the dataset, for error messages.

    Raises:
        ManifestError: the codec is not ``raw``, or its shape fields are missing or not ``HWC``
            ``uint8`` with positive integer sides.
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
