"""Writes deterministic sample image folders (and hostile files) for the demo, tests, benchmarks.

Importable (``sys.path.insert(0, "scripts"); import make_sample``) and runnable::

    python scripts/make_sample.py OUT [--classes N] [--per-class N] [--formats a,b] [--bad]
    python scripts/make_sample.py OUT --big N [--size-kb 110] [--classes 10]

Every file depends only on the arguments (and the Pillow/libjpeg/libwebp versions): images come
from ``numpy.random.default_rng(seed)``, never from global random state.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import struct
import sys
from pathlib import Path
from typing import Callable

import numpy as np
from PIL import Image

__all__ = ["FORMATS", "BAD_FILES", "make_image_folder", "add_bad_files", "make_big_folder",
           "class_name", "main"]


def class_name(index: int) -> str:
    """Folder name of class ``index``: ``class_000``, ``class_001``, ..."""
    return f"class_{index:03d}"


# --- encoders: (RGB uint8 array, quality) -> (file bytes, extension) -------------------------

def _save(img: Image.Image, fmt: str, **options: object) -> bytes:
    buffer = io.BytesIO()
    img.save(buffer, fmt, **options)
    return buffer.getvalue()


def _alpha_ramp(rgb: np.ndarray) -> np.ndarray:
    height, width = rgb.shape[:2]
    ramp = np.linspace(0, 255, width, dtype=np.float64)[None, :].repeat(height, axis=0)
    return np.dstack([rgb, ramp.astype(np.uint8)])


def _gray(rgb: np.ndarray) -> Image.Image:
    return Image.fromarray(rgb).convert("L")


def _png16(rgb: np.ndarray) -> bytes:
    # Full 16-bit range with distinct low bytes, so a decoder that keeps the low byte shows.
    gray = np.asarray(_gray(rgb), dtype=np.uint16)
    values = gray * 257 + (np.arange(gray.size, dtype=np.uint16).reshape(gray.shape) % 251)
    return _save(Image.fromarray(values.astype(np.uint16)), "PNG")  # mode I;16


_ENCODERS: dict[str, tuple[str, Callable[[np.ndarray, int], bytes]]] = {
    "jpeg": (".jpg", lambda rgb, q: _save(Image.fromarray(rgb), "JPEG", quality=q)),
    "jpeg-gray": (".jpg", lambda rgb, q: _save(_gray(rgb), "JPEG", quality=q)),
    "jpeg-cmyk": (".jpg", lambda rgb, q: _save(Image.fromarray(rgb).convert("CMYK"), "JPEG",
                                               quality=q)),
    "png": (".png", lambda rgb, q: _save(Image.fromarray(rgb), "PNG")),
    "png-rgba": (".png", lambda rgb, q: _save(Image.fromarray(_alpha_ramp(rgb)), "PNG")),
    "png-gray": (".png", lambda rgb, q: _save(_gray(rgb), "PNG")),
    "png-palette": (".png", lambda rgb, q: _save(
        Image.fromarray(rgb).quantize(colors=16, dither=Image.Dither.NONE), "PNG")),
    "png16": (".png", lambda rgb, q: _png16(rgb)),
    "webp": (".webp", lambda rgb, q: _save(Image.fromarray(rgb), "WEBP", quality=q, method=4)),
    "gif": (".gif", lambda rgb, q: _save(
        Image.fromarray(rgb).quantize(colors=64, dither=Image.Dither.NONE), "GIF")),
    "bmp": (".bmp", lambda rgb, q: _save(Image.fromarray(rgb), "BMP")),
    "tiff": (".tif", lambda rgb, q: _save(Image.fromarray(rgb), "TIFF")),
}
#: Format names ``make_image_folder`` accepts.
FORMATS = tuple(_ENCODERS)


def _structured_image(rng: np.random.Generator, height: int, width: int,
                      class_index: int) -> np.ndarray:
    """A class-tinted gradient with a random rectangle and noise: compressible, not flat."""
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float64)
    angle = rng.uniform(0, 2 * np.pi)
    ramp = (np.cos(angle) * xx / max(width - 1, 1) + np.sin(angle) * yy / max(height - 1, 1))
    ramp = (ramp - ramp.min()) / max(np.ptp(ramp), 1e-9)
    # Class colours sit at evenly spaced hues, so classes are told apart at a glance.
    hue = (class_index * 0.381966) % 1.0  # golden-ratio spacing
    tint = 0.5 + 0.5 * np.cos(2 * np.pi * (hue + np.array([0.0, 1 / 3, 2 / 3])))
    image = 40 + 180 * ramp[:, :, None] * tint[None, None, :]
    top, left = rng.integers(0, max(height // 2, 1)), rng.integers(0, max(width // 2, 1))
    image[top:top + height // 3, left:left + width // 3] = rng.uniform(0, 255, size=3)
    image += rng.normal(0.0, 12.0, size=image.shape)
    return np.clip(np.rint(image), 0, 255).astype(np.uint8)


def make_image_folder(root: Path, *, classes: int = 3, per_class: int = 8, seed: int = 0,
                      min_size: int = 24, max_size: int = 64, formats: tuple[str, ...] = ("jpeg",),
                      quality: int = 85) -> list[Path]:
    """Write an ImageFolder tree ``root/class_000/img_0000.jpg`` ... of deterministic images.

    Args:
        root: output folder (created if missing; existing files of the same names are replaced).
        classes: number of class folders.
        per_class: images per class.
        seed: seed of the ``numpy.random.default_rng`` that draws every image.
        min_size: smallest width/height in pixels.
        max_size: largest width/height in pixels.
        formats: names from ``FORMATS``, used in turn (image k of the whole folder gets
            ``formats[k % len(formats)]``).
        quality: JPEG/WEBP quality.

    Returns:
        The written files, sorted.

    Raises:
        ValueError: an unknown format name or an empty or inverted size range.
    """
    unknown = [name for name in formats if name not in _ENCODERS]
    if unknown or not formats:
        raise ValueError(f"unknown formats {unknown}; expected a non-empty tuple of {FORMATS}")
    if not 1 <= min_size <= max_size:
        raise ValueError(f"need 1 <= min_size <= max_size, got {min_size}, {max_size}")
    root = Path(root)
    rng = np.random.default_rng(seed)
    written = []
    for class_index in range(classes):
        folder = root / class_name(class_index)
        folder.mkdir(parents=True, exist_ok=True)
        for image_index in range(per_class):
            fmt = formats[(class_index * per_class + image_index) % len(formats)]
            height, width = (int(v) for v in rng.integers(min_size, max_size + 1, size=2))
            pixels = _structured_image(rng, height, width, class_index)
            extension, encode = _ENCODERS[fmt]
            path = folder / f"img_{image_index:04d}{extension}"
            path.write_bytes(encode(pixels, quality))
            written.append(path)
    return sorted(written)


# --- hostile inputs ----------------------------------------------------------------------------

#: What ``add_bad_files`` writes: file name -> the rejection reason a packer build should report.
BAD_FILES = {
    "bad_empty.jpg": "empty-file",
    "bad_truncated.jpg": "truncated",
    "bad_text.jpg": "not-an-image",
    "bad_lfs_pointer.png": "not-an-image",
    "bad_hdf5_stub.h5": "unsupported-format",  # Pillow identifies HDF5 but cannot decode it
    "bad_dangling.jpg": "dangling-symlink",
    ".DS_Store": "hidden-file",
}

_LFS_POINTER = (b"version https://git-lfs.github.com/spec/v1\n"
                b"oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\n"
                b"size 12345\n")
# A real .DS_Store starts with this "Bud1" buddy-allocator header.
_DS_STORE = b"\x00\x00\x00\x01Bud1" + bytes(2040)


def add_bad_files(root: Path) -> dict[str, str]:
    """Add one file of each hostile kind to the class folders of ``root``.

    The files go into the first three class folders (fewer if there are fewer; ``class_000`` is
    created when ``root`` has none). A dangling symlink is skipped, and left out of the result,
    where the platform cannot create symlinks.

    Args:
        root: an ImageFolder tree, e.g. one written by ``make_image_folder``.

    Returns:
        ``{relative POSIX path: expected reason}``, the reasons being those of ``BAD_FILES``.
    """
    root = Path(root)
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) \
        if root.is_dir() else []
    if not folders:
        folders = [root / class_name(0)]
        folders[0].mkdir(parents=True, exist_ok=True)

    def folder(k: int) -> Path:
        return folders[k % len(folders)]

    rng = np.random.default_rng(12345)
    noise = rng.integers(0, 256, size=(64, 64, 3), dtype=np.uint8)
    valid_jpeg = _save(Image.fromarray(noise), "JPEG", quality=95)
    hdf5 = b"\x89HDF\r\n\x1a\n" + bytes(504)  # the HDF5 signature: Pillow's stub plugin, no decoder

    contents = {
        (folder(0), "bad_empty.jpg"): b"",
        # The header survives (it is ~600 of ~10000 bytes); the end-of-image marker does not.
        (folder(0), "bad_truncated.jpg"): valid_jpeg[: len(valid_jpeg) // 2],
        (folder(1), "bad_text.jpg"): b"This is not a JPEG, just some text with a .jpg name.\n",
        (folder(1), "bad_lfs_pointer.png"): _LFS_POINTER,
        (folder(2), "bad_hdf5_stub.h5"): hdf5,
        (folder(0), ".DS_Store"): _DS_STORE,
    }
    written: dict[str, str] = {}
    for (parent, file_name), payload in contents.items():
        path = parent / file_name
        path.write_bytes(payload)
        written[path.relative_to(root).as_posix()] = BAD_FILES[file_name]

    link = folder(2) / "bad_dangling.jpg"
    try:
        if link.is_symlink() or link.exists():
            link.unlink()
        os.symlink("does-not-exist.jpg", link)
    except (OSError, NotImplementedError):
        pass  # e.g. Windows without the symlink privilege
    else:
        written[link.relative_to(root).as_posix()] = BAD_FILES["bad_dangling.jpg"]
    return dict(sorted(written.items()))


# --- benchmark folders -------------------------------------------------------------------------

def _jpeg_near_size(rng: np.random.Generator, target_bytes: int, class_index: int) -> bytes:
    """Encode a photo-like JPEG whose size is close to ``target_bytes`` (quality search)."""
    # ~110 KB at quality 90 for 500x375 with this noise level; scale the area from there.
    area = 187_500 * target_bytes / (110 * 1024)
    width = max(16, int(round((area * 4 / 3) ** 0.5)))
    height = max(16, int(round(width * 3 / 4)))
    pixels = _structured_image(rng, height, width, class_index)
    pixels = np.clip(pixels + rng.normal(0, 18, pixels.shape), 0, 255).astype(np.uint8)
    image = Image.fromarray(pixels)
    low, high, best = 30, 98, b""
    while low <= high:
        quality = (low + high) // 2
        encoded = _save(image, "JPEG", quality=quality)
        if not best or abs(len(encoded) - target_bytes) < abs(len(best) - target_bytes):
            best = encoded
        if len(encoded) < target_bytes:
            low = quality + 1
        else:
            high = quality - 1
    return best


def make_big_folder(root: Path, n: int, size_kb: int = 110, classes: int = 10,
                    seed: int = 0) -> list[Path]:
    """Quickly write ``n`` valid, distinct JPEG files of about ``size_kb`` KiB for benchmarks.

    A few real JPEGs are encoded once; each file is one of them with a unique comment (COM)
    segment inserted after the start-of-image marker, so every file's bytes (and checksum)
    differ while each stays a valid JPEG of the same pixels.

    Args:
        root: output folder; files go to ``root/class_NNN/img_NNNNNNNN.jpg``, file ``i`` in
            class ``i % classes``.
        n: number of files.
        size_kb: approximate size of each file in KiB.
        classes: number of class folders.
        seed: seed for the base images.

    Returns:
        The written files, sorted.

    Raises:
        ValueError: ``n`` is negative, or ``classes`` or ``size_kb`` is below 1.
    """
    if n < 0 or classes < 1 or size_kb < 1:
        raise ValueError(f"need n >= 0, classes >= 1, size_kb >= 1; got {n}, {classes}, "
                         f"{size_kb}")
    root = Path(root)
    rng = np.random.default_rng(seed)
    bases = [_jpeg_near_size(rng, size_kb * 1024, k) for k in range(min(4, max(n, 1)))]
    folders = [root / class_name(k) for k in range(classes)]
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
    written = []
    for i in range(n):
        base = bases[i % len(bases)]
        comment = f"packer sample {i:012d}".encode("ascii")
        segment = b"\xff\xfe" + struct.pack(">H", len(comment) + 2) + comment
        path = folders[i % classes] / f"img_{i:08d}.jpg"
        with open(path, "wb") as out:
            out.write(base[:2])
            out.write(segment)
            out.write(base[2:])
        written.append(path)
    return sorted(written)


# --- command line ------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code (argparse exits with 2 on usage errors)."""
    parser = argparse.ArgumentParser(
        description="Write a deterministic sample ImageFolder tree (or a big JPEG benchmark "
                    "folder) for packer.")
    parser.add_argument("out", type=Path, help="output folder")
    parser.add_argument("--classes", type=int, default=None,
                        help="class folders (default 3, or 10 with --big)")
    parser.add_argument("--per-class", type=int, default=8, help="images per class (default 8)")
    parser.add_argument("--formats", default="jpeg",
                        help=f"comma-separated formats used in turn, from: {','.join(FORMATS)}")
    parser.add_argument("--bad", action="store_true",
                        help="also add one hostile file of each kind; prints them as JSON")
    parser.add_argument("--big", type=int, metavar="N", default=None,
                        help="instead write N ~--size-kb KiB JPEGs for benchmarks")
    parser.add_argument("--size-kb", type=int, default=110, help="file size for --big")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-size", type=int, default=24)
    parser.add_argument("--max-size", type=int, default=64)
    parser.add_argument("--quality", type=int, default=85)
    args = parser.parse_args(argv)

    formats = tuple(name.strip() for name in args.formats.split(",") if name.strip())
    unknown = [name for name in formats if name not in _ENCODERS]
    if unknown or not formats:
        parser.error(f"unknown --formats {unknown}; choose from {','.join(FORMATS)}")
    if not 1 <= args.min_size <= args.max_size:
        parser.error("need 1 <= --min-size <= --max-size")
    if args.big is not None and (args.big < 0 or args.size_kb < 1 or args.classes == 0):
        parser.error("need --big >= 0, --size-kb >= 1 and --classes >= 1")
    if args.big is not None:
        paths = make_big_folder(args.out, args.big, size_kb=args.size_kb,
                                classes=args.classes or 10, seed=args.seed)
    else:
        paths = make_image_folder(args.out, classes=3 if args.classes is None else args.classes,
                                  per_class=args.per_class, seed=args.seed,
                                  min_size=args.min_size, max_size=args.max_size,
                                  formats=formats, quality=args.quality)
    print(f"wrote {len(paths)} images under {args.out}", file=sys.stderr)
    if args.bad:
        bad = add_bad_files(args.out)
        print(f"added {len(bad)} hostile files", file=sys.stderr)
        print(json.dumps(bad, sort_keys=True, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
