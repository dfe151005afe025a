"""Codecs: how a checked source image becomes the payload bytes stored in a shard.

A codec is named in the build options as ``name`` or ``name:key=value,...`` (the *codec spec*,
``BuildOptions.codec``) and recorded in the manifest's ``codec`` object with every parameter, so
readers know what the payload bytes are. Four codecs exist (described below), each one module
here holding both of its halves.

What a codec implements. The *write half* is a class with the ``Codec`` protocol (``base``):
``name``, ``from_options(params)`` (parse and check the spec's options, ``OptionError`` naming the
option), ``encode(data, info, name=)`` (the payload and the ``ImageInfo`` describing it),
``manifest_entry()`` (the manifest's ``codec`` object, every parameter), ``estimate_sizes``
(payload sizes for planning shards) and optionally ``note`` (a label per file counted in the build
summary). Its ``reader`` attribute names the *read half*, a ``CodecReader`` subclass (``base``)
that ``codec_for(dataset)`` builds from the manifest's ``codec`` object; it answers what readers
ask, so no reader compares codec names:

- ``check_decodable()``: refuse parameters this packer cannot read (SPEC §6, ``DecodeError``);
- ``pixels(dataset, i, data, max_pixels=)``: the ``(H, W, 3)`` pixels of one payload, and
  ``stored_pixels(dataset, i, data)``: its pixels as a view when the payload *is* pixels (else
  None: an encoded image, for a decoder or a fused transform);
- ``encoded``: payloads are encoded image files that any image decoder (``packer.decode``, DALI,
  nvJPEG) takes; ``stores_pixels``: payloads are pixels of one fixed shape;
- ``sample_shape``: that fixed ``(H, W, C)``, or None; ``pixel_shape()`` the same for a reader
  that reads only pixels (refusing other codecs);
- ``keeps_source_geometry``: stored pixel grids are the sources' (boxes given in source pixels
  still match); ``crops_source``: stored images are crops of their sources (an image field stored
  whole cannot follow a crop).

A fixed-size pixel codec (``RawReader``) adds the batch side: ``stride(alignment)``,
``check_rows`` (the layout check of a batch, ``raw_runs``), ``check_index`` (of the whole index)
and the zero-copy views ``raw_batch_view`` / ``raw_samples_view``. A new codec is one new module
(or class pair) here and one entry in ``CODECS``; a new ``image_format`` value it stores goes in
``packer.format.ImageFormat`` (with ``PIXEL_FORMATS`` when its payloads are pixels). A name that
is not in ``CODECS`` reads as an ``UnknownCodecReader``: payload bytes only, and every decoding
reader refuses it when it opens, naming the codec and the ones this packer knows.

The four codecs:

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
    options; needs the compiled ``packer.codecs._jpegtiles`` (built at install with a C compiler) to
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
of the box: the same trade-off as Pillow's ``Image.thumbnail(reducing_gap=2.0)``
(``codecs.resize``; the measurements are in ``docs/design-notes.md``, "Build-time resampling").
Output depends only on the input bytes and the parameters (and the Pillow and libjpeg-turbo
versions).
"""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import OptionError
from .base import Codec, CodecReader, EncodedImageReader, UnknownCodecReader
from .jpeg import JpegCodec, JpegReader
from .passthrough import PassthroughCodec, PassthroughReader
from .raw import (RawCodec, RawReader, RawRun, raw_batch_view, raw_runs, raw_sample_shape, raw_sample_stride,
                  raw_samples_view)
from .tiled import TiledCodec, TiledReader

__all__ = [
    "Codec", "PassthroughCodec", "TiledCodec", "JpegCodec", "RawCodec", "CODECS", "get_codec",
    "parse_codec_spec", "format_codec_spec", "merge_codec_options", "codec_for", "CodecReader",
    "EncodedImageReader", "PassthroughReader", "TiledReader", "JpegReader", "RawReader", "UnknownCodecReader",
    "RawRun", "check_decodable", "dataset_max_pixels", "keeps_source_geometry", "raw_sample_shape",
    "raw_sample_stride", "raw_batch_view", "raw_samples_view", "raw_runs",
]

CODECS: dict[str, Any] = {"passthrough": PassthroughCodec, "tiled": TiledCodec, "jpeg": JpegCodec,
                          "raw": RawCodec}


# --- codec specs -------------------------------------------------------------------------------

def parse_codec_spec(spec: str) -> tuple[str, dict[str, str]]:
    """Split ``"jpeg:quality=90,max_size=256"`` into ``("jpeg", {"quality": "90", "max_size": "256"})``.

    Raises:
        OptionError: an option that is not ``key=value``, or a key given twice.
    """
    name, _, rest = spec.partition(":")
    params: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            raise OptionError(f"codec option {item!r} in {spec!r} must look like key=value")
        if key in params:
            raise OptionError(f"codec option {key!r} is given twice in {spec!r}")
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
        OptionError: an option conflicts with a different value in ``spec``, the codec does not
            take it, or the result is not a valid codec.
    """
    name, params = parse_codec_spec(spec)
    for key, value in options.items():
        if value is None:
            continue
        value = str(value).strip()
        if key in params and params[key] != value:
            raise OptionError(f"codec option {key} is given twice with different values: "
                             f"{key}={params[key]} in {spec!r} and {key}={value}")
        params[key] = value
    merged = format_codec_spec(name, params)
    get_codec(merged)
    return merged


def get_codec(spec: str) -> Codec:
    """The codec named by ``spec`` (``name`` or ``name:key=value,...``).

    Raises:
        OptionError: unknown codec, unknown option or bad value; the message names the codec,
            the option and what is allowed.
    """
    name, params = parse_codec_spec(spec)
    factory = CODECS.get(name)
    if factory is None:
        raise OptionError(f"unknown codec {name!r}; available: {', '.join(sorted(CODECS))}")
    return factory.from_options(params)



# --- the read half: what readers ask (formats/SPEC.md section 6) ---------------------------------

def codec_for(source: Any, *, path: object = None) -> CodecReader:
    """The read half of a dataset's codec: the one object a reader asks about the payloads.

    Args:
        source: an open dataset (``Dataset``, ``DatasetIndex``: anything with a ``manifest``), a
            ``Manifest``, or a manifest's ``codec`` object alone (then the build summary's notes
            are unknown: ``raw`` is taken as resampled).
        path: the dataset, for error messages (default: ``source.path`` when it has one).

    Returns:
        The codec's ``CodecReader`` (``Codec.reader``); an ``UnknownCodecReader`` for a name this
        packer does not implement, which reads nothing but refuses to decode (SPEC §6).
    """
    manifest = getattr(source, "manifest", source)
    if path is None:
        path = getattr(source, "path", None)
    entry = getattr(manifest, "codec", manifest)
    build = getattr(manifest, "build", None)
    notes = build.get("codec_notes") if isinstance(build, Mapping) else None
    name = entry.get("name") if isinstance(entry, Mapping) else None
    factory = CODECS.get(name) if isinstance(name, str) else None
    if factory is None:
        return UnknownCodecReader(entry, path=path, known=tuple(sorted(CODECS)))
    return factory.reader(entry, path=path, notes=notes, sample_count=getattr(manifest, "sample_count", None))


def check_decodable(codec_entry: Any, *, path: object = None) -> None:
    """Refuse to decode payloads whose manifest ``codec`` this packer does not implement.

    SPEC section 6: a reader that decodes payloads MUST refuse a codec name it does not
    implement (``{"name": "zstd-future"}`` is not a JPEG to guess at), and a ``raw`` codec whose
    ``layout`` is not ``"HWC"`` or whose ``dtype`` is not ``"uint8"``. Readers that only return
    payload bytes need not call it. ``codec_for(codec_entry).check_decodable()``, for callers
    that hold the manifest's ``codec`` object.

    Args:
        codec_entry: the manifest's ``codec`` object (``Manifest.codec``).
        path: the dataset, for the error message.

    Raises:
        DecodeError: the codec is unknown or its parameters are not decodable (exit 1).
    """
    codec_for(codec_entry, path=path).check_decodable()


def keeps_source_geometry(manifest: Any) -> bool:
    """Whether every stored image of a dataset has its source's pixel grid
    (``codec_for(manifest).keeps_source_geometry``).

    ``passthrough`` and ``tiled`` store the source's pixels; ``jpeg`` does unless it resized
    (``max_size``); ``raw`` resamples (and centre-crops) to one size, so it keeps the grid only
    when every source had that size already, which its build summary counts (``codec_notes``:
    ``kept size``; a dataset built before that note is taken as resampled). Coordinates a source
    gave in its images' pixels (boxes, keypoints) only match stored images that keep it.
    """
    return codec_for(manifest).keeps_source_geometry


def dataset_max_pixels(manifest: Any, override: int | None = None) -> int:
    """The pixel limit a decoding reader applies to a dataset.

    The build records its ``--max-pixels`` in the manifest (``limits.max_pixels``) when it is
    not the default, so an image the build accepted is never refused when it is read back.

    Args:
        manifest: the dataset's ``Manifest``.
        override: the caller's own limit (e.g. ``verify --max-pixels``), which wins.

    Raises:
        OptionError: ``override`` is not a positive integer.
    """
    from .._internal.imageinfo import DEFAULT_MAX_PIXELS

    if override is not None:
        if not isinstance(override, int) or isinstance(override, bool) or override < 1:
            raise OptionError(f"max_pixels must be a positive number of pixels, got {override!r}")
        return override
    recorded = getattr(manifest, "max_pixels", None)
    return recorded if isinstance(recorded, int) and recorded >= 1 else DEFAULT_MAX_PIXELS
