"""Builders shared by test files in several folders: image folders, a source with declared fields,
a hand-edited index, decompression bombs, small index tables, and the CLI runners of the hostile-input
tests. (``tests/`` is on ``sys.path``: its conftest.)"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from PIL import Image

from packer import format as fmt


def write_images(root: Path, classes: dict[str, int], *, seed: int = 0, size: int = 24) -> list[Path]:
    rng = np.random.default_rng(seed)
    paths = []
    for name, count in classes.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            path = root / name / f"{i:03d}.jpg"
            pixels = rng.integers(0, 255, (size + i % 5, size, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(path, quality=80)
            paths.append(path)
    return paths


def dataset_files(path: Path) -> dict[str, bytes]:
    """Every file of a dataset except the lock: name -> bytes."""
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file() and p.name != ".packer.lock"}


# --- build and read ---------------------------------------------------------------------------------

def make_field_source(root: Path, count: int = 8) -> Path:
    (root / "img").mkdir(parents=True)
    rows = []
    for i in range(count):
        Image.fromarray(np.full((16 + i, 24, 3), 10 * i, np.uint8)).save(root / "img" / f"{i}.jpg", quality=90)
        mask = Image.fromarray((np.arange(24)[None, :] % (i + 2)).astype(np.uint8).repeat(16 + i, 0), mode="P")
        mask.putpalette([0, 0, 0, 255, 0, 0] * 128)
        mask.save(root / "img" / f"{i}.mask.png")
        rows.append({"path": f"img/{i}.jpg", "label": i % 2, "boxes": [[i, i, i + 4, i + 5]] * (i % 3),
                     "tags": ["cat", "dog", "owl"][: i % 4], "caption": f"a photo number {i} ✓",
                     "depth": [i / 4, i / 2], "mask": f"img/{i}.mask.png"})
    manifest = root / "rows.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows), "utf-8")
    return manifest


FIELDS = ("boxes=float32[N,4]", "tags=classes", "caption=text", "depth=float32[2]", "mask=image")


def rewrite_index(folder: Path, change: Callable[[dict[str, np.ndarray]], None]) -> None:
    """A hand-made index: ``change`` edits writable copies of the columns; the manifest's index
    entry (name, size, checksum) is made to match, so only what ``change`` did is wrong."""
    document = json.loads((folder / fmt.MANIFEST_NAME).read_text("utf-8"))
    old = folder / document["index"]["path"]
    rows, columns = fmt.parse_column_file(old.read_bytes(), fmt.INDEX_MAGIC)
    columns = {name: np.array(column) for name, column in columns.items()}
    change(columns)
    data = b"".join(bytes(p) for p in fmt.encode_column_file(fmt.INDEX_MAGIC, rows, columns))
    old.unlink()
    digest = fmt.checksum(data)
    (folder / fmt.index_file_name(digest)).write_bytes(data)
    document["index"] = {"path": fmt.index_file_name(digest), "size": len(data), "checksum": fmt.checksum_hex(digest)}
    (folder / fmt.MANIFEST_NAME).write_text(json.dumps(document), "utf-8")


# --- images: bombs, animations, exotic modes ----------------------------------------------------------

def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def png_bomb(width: int = 100_000, height: int = 100_000) -> bytes:
    """A ~6 KB PNG whose header says width x height gray pixels (10 gigapixels by default)."""
    rows = zlib.compress(b"\0" * (1 + width) * 64, 9)
    return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + _png_chunk(b"IDAT", rows) + _png_chunk(b"IEND", b""))


def jpeg_bomb(width: int = 65_000, height: int = 65_000) -> bytes:
    """A small baseline JPEG with its SOF0 dimensions rewritten to width x height."""
    buffer = io.BytesIO()
    Image.new("L", (16, 16)).save(buffer, "JPEG")
    data = bytearray(buffer.getvalue())
    sof = data.index(b"\xff\xc0")
    struct.pack_into(">HH", data, sof + 5, height, width)
    return bytes(data)


def gif_bomb() -> bytes:
    buffer = io.BytesIO()
    Image.new("P", (4, 4)).save(buffer, "GIF")
    data = bytearray(buffer.getvalue())
    struct.pack_into("<HH", data, 6, 65535, 65535)  # logical screen
    image_descriptor = data.index(b"\x2c")
    struct.pack_into("<HH", data, image_descriptor + 5, 65535, 65535)
    return bytes(data)


def bmp_bomb() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buffer, "BMP")
    data = bytearray(buffer.getvalue())
    struct.pack_into("<ii", data, 18, 50_000, 50_000)
    return bytes(data)


BOMBS = {"png": png_bomb, "jpeg": jpeg_bomb, "gif": gif_bomb, "bmp": bmp_bomb}


# --- small sources, index tables and the spec's vectors ---------------------------------------------

def png_folder(root: Path, count: int, *, seed: int = 0, bad: int = 0) -> Path:
    """``count`` noisy PNGs (heights 12 + i) alternating between cat/ and dog/, and ``bad`` files that are not images."""
    rng = np.random.default_rng(seed)
    for i in range(count):
        folder = root / ("cat" if i % 2 else "dog")
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (12 + i, 16, 3), dtype=np.uint8)).save(folder / f"{i:03d}.png")
    for i in range(bad):
        (root / "dog" / f"bad{i}.png").write_bytes(b"not an image at all")
    return root


TWO_SHARDS = [fmt.ShardEntry("shards/shard-00000-00000000000000aa.pks", 16384, 1, 2),
              fmt.ShardEntry("shards/shard-00001-00000000000000bb.pks", 8192, 2, 1)]


def index_columns(**changes: Any) -> dict[str, np.ndarray]:
    """A valid 3-sample index over TWO_SHARDS (alignment 4096), with ``changes`` applied."""
    dtypes = {name: typestr for name, (typestr, _) in fmt.INDEX_COLUMNS.items()}
    values: dict[str, Any] = {
        "shard": [0, 0, 1], "offset": [4096, 8192, 4096], "size": [100, 5000, 10], "checksum": [1, 2, 3],
        "label": [0, 1, 0], "width": [1, 2, 3], "height": [1, 2, 3], "channels": [3, 3, 1],
        "image_format": [1, 2, 1], "key_offsets": [0, 1, 2, 3], "keys": list(b"abc"),
        "meta_offsets": [0, 0, 0, 0], "meta": []}
    values.update(changes)
    return {name: np.array(value, dtype=dtypes[name]) if not isinstance(value, np.ndarray) else value
            for name, value in values.items()}


VECTORS = Path(__file__).resolve().parents[1] / "formats" / "vectors"


def edit_manifest(folder: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Apply ``change`` to a dataset's manifest document in place (the index checksum is left as it was)."""
    manifest = json.loads((folder / fmt.MANIFEST_NAME).read_text())
    change(manifest)
    (folder / fmt.MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, sort_keys=True))


def jpeg_bytes(height: int, width: int, **options: Any) -> bytes:
    """A JPEG of smooth gradients plus a little noise (``options`` go to Pillow's encoder)."""
    rng = np.random.default_rng(3)
    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([x % 256, y % 256, (x + y) % 256], axis=-1) + rng.integers(0, 20, (height, width, 3))
    buffer = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buffer, "JPEG", **options)
    return buffer.getvalue()


def png_bytes(seed: int, size: tuple[int, int] = (10, 14), grey: bool = False) -> bytes:
    """The bytes of a noisy RGB (or grey) PNG."""
    rng = np.random.default_rng(seed)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, size if grey else (*size, 3), dtype=np.uint8)).save(out, "PNG")
    return out.getvalue()


def make_png_classes(root: Path, count: int = 10, seed: int = 0) -> Path:
    """Noisy PNGs of different sizes in two class folders (so payloads need padding)."""
    rng = np.random.default_rng(seed)
    for i in range(count):
        folder = root / ("a" if i % 2 else "b")
        folder.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, (20 + i, 24 + 2 * i, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{i}.png")
    return root


# --- hostile input: the CLI in a subprocess or in this process, trial counts ----------------------------

REPO = Path(__file__).resolve().parents[1]

#: Trials per kind of hostile input, printed at the end of a session that ran tests/hostile/
#: (tests/hostile/conftest.py) for scripts/reliability_report.py.
HOSTILE_TRIALS: dict[str, int] = {}


def count_trial(label: str, n: int = 1) -> None:
    HOSTILE_TRIALS[label] = HOSTILE_TRIALS.get(label, 0) + n


def strict_json(text: str) -> Any:
    """json.loads that refuses NaN, Infinity and -Infinity (what RFC 8259 allows)."""
    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


def noisy_png(path: Path, seed: int = 0, size: tuple[int, int] = (12, 16)) -> Path:
    """Write a PNG of RGB noise at ``path`` (folders made)."""
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(path)
    return path


def noisy_png_classes(root: Path, classes: int = 2, per_class: int = 3) -> Path:
    """An image folder ``class{c}/img{i}.png`` of noisy PNGs."""
    for c in range(classes):
        for i in range(per_class):
            noisy_png(root / f"class{c}" / f"img{i}.png", seed=c * 10 + i)
    return root


def run_cli(argv: list[str], timeout: float = 60) -> tuple[int, str]:
    """``packer ARGV`` in a subprocess: (exit status, stdout + stderr)."""
    done = subprocess.run([sys.executable, "-m", "packer", *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    return done.returncode, done.stdout + done.stderr


def run_main(argv: list[str]) -> tuple[int, str, str]:
    """``packer.cli.main(argv)`` in this process: (exit status, stdout, stderr)."""
    from packer.cli import main

    out, err = io.StringIO(), io.StringIO()
    code: Any = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as exc:
            code = exc.code
        except Exception:  # noqa: BLE001 - reported as a failure with its traceback
            import traceback
            return 99, out.getvalue(), err.getvalue() + traceback.format_exc()
    return (code if isinstance(code, int) else (0 if code is None else 1)), out.getvalue(), err.getvalue()


def copy_dataset(ds: Path, target: Path) -> Path:
    shutil.copytree(ds, target)
    return target


def noisy_jpeg(seed: int = 0, size: tuple[int, int] = (48, 64)) -> bytes:
    """The bytes of a JPEG of RGB noise."""
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)).save(
        buffer, "JPEG", quality=85)
    return buffer.getvalue()


def packer_on_path(home: Path) -> dict[str, str]:
    """An environment for running documented commands in ``home``: ``packer`` on PATH (this
    interpreter's ``python -m packer``), HOME set to ``home``, this checkout importable."""
    bin_dir = home / "bin"
    bin_dir.mkdir()
    (bin_dir / "packer").write_text(f"#!/bin/sh\nexec {sys.executable} -m packer \"$@\"\n")
    (bin_dir / "packer").chmod(0o755)
    env = dict(os.environ)
    env.update(HOME=str(home), PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")])))
    return env


def with_source(settings: Any, **source: Any) -> Any:
    """``settings`` (a ``packer.BuildSettings``) with its source settings changed (``root=``, ``kind=``, ...)."""
    from dataclasses import replace

    return replace(settings, source=replace(settings.source, **source))


@contextlib.contextmanager
def pillow_headers_only() -> Any:
    """Within: ``probe_image`` asks Pillow for every header (``imageheaders.parse_header`` says None)."""
    import packer._internal.imageinfo as imageinfo

    saved = imageinfo.parse_header
    imageinfo.parse_header = lambda view, image_format: None
    try:
        yield
    finally:
        imageinfo.parse_header = saved


def probe_outcome(data: bytes, **options: Any) -> tuple[Any, ...]:
    """What ``probe_image`` says about ``data``: ``("ok", ImageInfo)`` or ``("rejected", reason, message)``."""
    from packer.errors import RejectedImageError
    from packer._internal.imageinfo import probe_image

    try:
        return ("ok", probe_image(data, **options))
    except RejectedImageError as exc:
        return ("rejected", exc.reason, exc.message)


def assert_headers_agree_with_pillow(data: bytes, **options: Any) -> None:
    """``probe_image`` with the header parsers says exactly what it says with Pillow alone."""
    fast = probe_outcome(data, **options)
    with pillow_headers_only():
        slow = probe_outcome(data, **options)
    assert fast == slow, (data[:64], fast, slow)
# --- photo-like images and their near-duplicates (tests of packer.duplicates) -----------------------

def photo_like(seed: int, size: tuple[int, int] = (192, 256)) -> np.ndarray:
    """An RGB image with the statistics of a photograph rather than of noise: smooth shading at
    several scales, a few soft-edged shapes and a little grain (``size`` is height, width)."""
    from PIL import Image, ImageDraw, ImageFilter

    rng = np.random.default_rng(seed)
    height, width = size
    field = np.zeros((height, width, 3), dtype=np.float64)
    for scale in (4, 8, 16):
        coarse = rng.normal(0, 60 / scale ** 0.5, (scale, scale, 3))
        field += np.asarray(Image.fromarray(coarse.astype(np.float32)[:, :, 0]).resize(
            (width, height), Image.Resampling.BICUBIC))[:, :, None] * np.array([1.0, 0.9, 0.8])
    image = Image.fromarray(np.clip(field + 128, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(3, 7))):
        x0, y0 = int(rng.integers(0, width - 20)), int(rng.integers(0, height - 20))
        x1, y1 = x0 + int(rng.integers(15, width // 2)), y0 + int(rng.integers(15, height // 2))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)((x0, y0, x1, y1), fill=colour)
    image = image.filter(ImageFilter.GaussianBlur(1.5))
    grain = rng.normal(0, 4, (height, width, 3))
    return np.clip(np.asarray(image, dtype=np.float64) + grain, 0, 255).astype(np.uint8)


def encode(pixels: np.ndarray, kind: str = "jpg", quality: int = 90) -> bytes:
    """``pixels`` as JPEG (``jpg``) or PNG bytes."""
    from PIL import Image

    out = io.BytesIO()
    if kind == "png":
        Image.fromarray(pixels).save(out, "PNG")
    else:
        Image.fromarray(pixels).save(out, "JPEG", quality=quality)
    return out.getvalue()


def near_copy(pixels: np.ndarray, kind: str, seed: int = 0) -> bytes:
    """A near-duplicate of ``pixels`` of one kind: ``quality``, ``resize``, ``crop``, ``jitter``,
    ``png`` or ``flip`` (the kinds benchmarks/bench_duplicates.py plants)."""
    from PIL import Image, ImageEnhance

    rng = np.random.default_rng(seed)
    image = Image.fromarray(pixels)
    height, width = pixels.shape[:2]
    if kind == "quality":
        return encode(pixels, quality=int(rng.integers(40, 76)))
    if kind == "resize":
        factor = 0.6 if seed % 2 else 1.6
        return encode(np.asarray(image.resize((round(width * factor), round(height * factor)),
                                              Image.Resampling.LANCZOS)))
    if kind == "crop":
        dx, dy = int(width * 0.03), int(height * 0.03)
        return encode(pixels[dy // 2:height - (dy - dy // 2), dx // 2:width - (dx - dx // 2)])
    if kind == "jitter":
        image = ImageEnhance.Brightness(image).enhance(1.08)
        return encode(np.asarray(ImageEnhance.Contrast(image).enhance(0.92)))
    if kind == "png":
        return encode(pixels, "png")
    if kind == "flip":
        return encode(np.ascontiguousarray(pixels[:, ::-1]))
    raise ValueError(kind)


# --- headless Chromium (Debian's ``chromium``; ``make test`` installs it) ----------------------------

def chromium() -> str:
    """The headless browser's command; skips the test without one, unless ``PACKER_REQUIRE_BROWSER=1``
    (set by ``make test``) makes its absence a failure."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("PACKER_REQUIRE_BROWSER") == "1":
            pytest.fail("PACKER_REQUIRE_BROWSER=1 but chromium is not installed (apt-get install chromium)")
        pytest.skip("headless Chromium is not installed (apt-get install chromium)")
    return found


def run_chromium(page: Path, profile: Path, *args: str) -> tuple[str, list[str]]:
    """Load ``page`` headless with a fresh profile; returns stdout and the page's console messages."""
    command = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
               "--enable-logging=stderr", "--v=0", *args, page.resolve().as_uri()]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, console
