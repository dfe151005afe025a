"""Builders shared by test files in several folders: image folders, a source with declared fields,
a hand-edited index, and decompression bombs. (``tests/`` is on ``sys.path``: its conftest.)"""

from __future__ import annotations

import io
import json
import struct
import zlib
from pathlib import Path
from typing import Callable

import numpy as np
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
