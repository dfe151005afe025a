"""Regenerate ``formats/vectors/`` (the spec's golden datasets) byte for byte from fixed inputs.

Usage::

    python scripts/make_vectors.py            # rewrite formats/vectors/ in place
    python scripts/make_vectors.py --check    # regenerate into a temp folder, compare, exit 1 on a difference
    python scripts/make_vectors.py --out DIR  # write the vectors somewhere else

Inputs are fixed byte strings (PNG with stored deflate blocks, BMP, GIF and a baseline JPEG
written out in hex), so the vectors do not depend on the Pillow or zlib version. Valid vectors are
built with ``packer.writer.run.build`` (one worker); invalid vectors are a copy of ``valid/base-align512``
(or, for the ``fields-*`` ones, of ``valid/fields``) damaged in exactly one way. After a damage to the index or a shard header, the file is re-hashed,
renamed and the manifest updated, so that the only defect is the one the vector is about (except
the vectors that are about a stale size or checksum). Every invalid vector is opened here once and
must raise its expected error, so a generator bug cannot commit a wrong vector.

The manifest records ``created_by: packer <version>``: bumping the version changes the vectors;
rerun this script and commit the result.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import sys
import tempfile
import zlib
from pathlib import Path
from typing import Any, Callable

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(REPO))

import packer  # noqa: E402
from packer import format as fmt  # noqa: E402
from packer.writer import build  # noqa: E402
from packer.writer.commit import commit_dataset  # noqa: E402
from packer.writer.staging import LOCK_NAME, STAGING_DIR  # noqa: E402
from packer import BuildSettings, LabelSettings, LayoutSettings, RunOptions  # noqa: E402

__all__ = ["generate", "compare_trees", "read_everything", "VALID", "INVALID", "FIELD_INVALID", "main"]

DEFAULT_OUT = REPO / "formats" / "vectors"

# --- fixed input images -------------------------------------------------------------------------


def png_bytes(width: int, height: int, seed: int) -> bytes:
    """An 8-bit RGB PNG whose IDAT is one *stored* deflate block: no compressor involved."""
    raw = b"".join(
        b"\x00" + bytes((seed * 37 + x * 11 + y * 53 + c * 91) & 0xFF for x in range(width) for c in range(3))
        for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    stored = (b"\x78\x01\x01" + struct.pack("<HH", len(raw), len(raw) ^ 0xFFFF) + raw
              + struct.pack(">I", zlib.adler32(raw)))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", stored) + chunk(b"IEND", b"")


def palette_png_bytes(width: int, height: int, seed: int, colours: int = 3) -> bytes:
    """An 8-bit palette PNG (a segmentation mask: pixel values are class ids), IDAT one stored
    deflate block. Pixel ``(x, y)`` is ``(seed + x + 2 * y) % colours``."""
    raw = b"".join(b"\x00" + bytes((seed + x + 2 * y) % colours for x in range(width)) for y in range(height))
    palette = bytes((k * 97 + c * 41) & 0xFF for k in range(colours) for c in range(3))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    stored = (b"\x78\x01\x01" + struct.pack("<HH", len(raw), len(raw) ^ 0xFFFF) + raw
              + struct.pack(">I", zlib.adler32(raw)))
    header = struct.pack(">IIBBBBB", width, height, 8, 3, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"PLTE", palette) + chunk(b"IDAT", stored)
            + chunk(b"IEND", b""))


def palette_pixels(width: int, height: int, seed: int, colours: int = 3) -> list[list[int]]:
    """The values ``palette_png_bytes`` stores, row by row (what decoding as stored gives back)."""
    return [[(seed + x + 2 * y) % colours for x in range(width)] for y in range(height)]


def bmp_bytes(width: int, height: int, seed: int) -> bytes:
    """An uncompressed 24-bit BMP (BITMAPINFOHEADER), rows padded to 4 bytes."""
    row = (width * 3 + 3) & ~3
    pixels = b"".join(
        bytes((seed * 29 + x * 7 + y * 13 + c * 71) & 0xFF for x in range(width) for c in range(3)).ljust(row, b"\0")
        for y in range(height))
    info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 24, 0, len(pixels), 2835, 2835, 0, 0)
    return b"BM" + struct.pack("<IHHI", 14 + 40 + len(pixels), 0, 0, 54) + info + pixels


#: A 1x1 palette GIF89a.
GIF_1X1 = bytes.fromhex("47494638396101000100800000000000ffffff21f90401000000002c00000000010001000002024401003b")
#: An 8x8 grey baseline JPEG (made once with Pillow, quality 50, optimize; frozen here as bytes).
JPEG_8X8 = bytes.fromhex(
    "ffd8ffe000104a46494600010100000100010000ffdb004300100b0c0e0c0a100e0d0e1211101318281a181616"
    "183123251d283a333d3c3933383740485c4e404457453738506d51575f626768673e4d71797064785c656763ff"
    "c0000b080008000801011100ffc40014000100000000000000000000000000000000ffc4001410010000000000"
    "0000000000000000000000ffda0008010100003f003fffd9")

# --- building -------------------------------------------------------------------------------------


def _write_files(root: Path, files: dict[str, bytes]) -> None:
    for relative, data in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def _build(source: Path, out: Path, settings: BuildSettings) -> None:
    build(source, out, settings, RunOptions(workers=1))
    (out / LOCK_NAME).unlink(missing_ok=True)  # the build's lock file is not part of a dataset


def _describe_samples(out: Path, inputs: dict[str, bytes], info: dict[str, tuple[int, int, int, int]],
                      labels: dict[str, int], metadata: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Expected samples in dataset order; every value comes from the inputs, only the order from the index."""
    with packer.open_index(out) as index:
        keys = list(index.keys())
    samples = []
    for key in keys:
        data = inputs[key]
        image_format, width, height, channels = info[key]
        samples.append({"key": key, "label": labels[key], "size": len(data),
                        "xxh3": fmt.checksum_hex(fmt.checksum(data)), "image_format": image_format,
                        "width": width, "height": height, "channels": channels,
                        "metadata": metadata.get(key, {})})
    return samples


def _write_json(path: Path, obj: Any) -> None:
    path.write_bytes((json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))


# (format, width, height, channels) of each fixed input, as the header of the bytes says
_PNG_A, _PNG_B, _PNG_C = png_bytes(5, 3, 1), png_bytes(4, 4, 2), png_bytes(7, 2, 3)
_BMP_A = bmp_bytes(3, 2, 4)
_INFO_PNG_A, _INFO_PNG_B, _INFO_PNG_C = (2, 5, 3, 3), (2, 4, 4, 3), (2, 7, 2, 3)
_INFO_BMP_A, _INFO_GIF, _INFO_JPEG = (5, 3, 2, 3), (4, 1, 1, 1), (1, 8, 8, 1)


def _folder_vector(out: Path, tmp: Path, *, files: dict[str, tuple[bytes, tuple[int, int, int, int]]],
                   classes: list[str], options: BuildSettings, description: str,
                   extra_inputs: dict[str, bytes] | None = None) -> None:
    source = tmp / f"src-{out.name}"
    _write_files(source, {key: data for key, (data, _) in files.items()})
    _write_files(source, extra_inputs or {})
    _build(source, out, options)
    inputs = {key: data for key, (data, _) in files.items()}
    info = {key: i for key, (_, i) in files.items()}
    labels = {key: classes.index(key.split("/")[0]) for key in files}
    samples = _describe_samples(out, inputs, info, labels, {})
    _write_json(out / "expected.json", {
        "description": description, "source": "folder", "settings": options.to_json(),
        "classes": classes, "sample_count": len(samples), "alignment": options.layout.alignment,
        "samples": samples})


def make_base_align512(out: Path, tmp: Path) -> None:
    _folder_vector(out, tmp, files={
        "cat/a.png": (_PNG_A, _INFO_PNG_A), "cat/b.jpg": (JPEG_8X8, _INFO_JPEG), "dog/c.bmp": (_BMP_A, _INFO_BMP_A)},
        classes=["cat", "dog"], options=BuildSettings(layout=LayoutSettings(alignment=512, shard_size=1536, shuffle=False)),
        description="3 samples in 2 shards (2 + 1), alignment 512, no shuffle; every invalid vector but "
                    "the fields-* ones is this dataset damaged in one way")


def make_two_shards_align4096(out: Path, tmp: Path) -> None:
    _folder_vector(out, tmp, files={
        "cat/a.png": (_PNG_A, _INFO_PNG_A), "cat/b.jpg": (JPEG_8X8, _INFO_JPEG),
        "dog/c.bmp": (_BMP_A, _INFO_BMP_A), "dog/d.gif": (GIF_1X1, _INFO_GIF)},
        classes=["cat", "dog"], options=BuildSettings(layout=LayoutSettings(alignment=4096, shard_size=12288, seed=0)),
        description="4 samples (PNG, JPEG, BMP, GIF) in 2 shards of 12288 bytes, alignment 4096, "
                    "shuffled with seed 0")


def make_align1(out: Path, tmp: Path) -> None:
    _folder_vector(out, tmp, files={
        "a/1.png": (_PNG_A, _INFO_PNG_A), "a/2.gif": (GIF_1X1, _INFO_GIF), "b/3.jpg": (JPEG_8X8, _INFO_JPEG),
        "b/4.png": (_PNG_B, _INFO_PNG_B), "c/5.bmp": (_BMP_A, _INFO_BMP_A)},
        classes=["a", "b", "c"], options=BuildSettings(layout=LayoutSettings(alignment=1, shard_size=300, seed=7)),
        description="alignment 1: payloads packed back to back, data_offset 64; shuffled with seed 7")


def make_rejected_gap(out: Path, tmp: Path) -> None:
    _folder_vector(out, tmp, files={
        "a/1.png": (_PNG_A, _INFO_PNG_A), "a/3.bmp": (_BMP_A, _INFO_BMP_A), "a/4.png": (_PNG_C, _INFO_PNG_C)},
        extra_inputs={"a/2.txt": b"not an image, rejected by its bytes\n", "a/.DS_Store": b"hidden",
                      "top-level.png": _PNG_B},
        classes=["a"], options=BuildSettings(layout=LayoutSettings(alignment=512, shard_size=1024, shuffle=False)),
        description="one file per planned shard; planned shard 1 (a/2.txt) is rejected, so the manifest "
                    "lists shards 0, 2 and 3 (a gap in the numbers) and the index's shard column is 0, 1, 2; "
                    "build-report.jsonl lists the three rejected files")


def make_manifest_metadata(out: Path, tmp: Path) -> None:
    source = tmp / "src-manifest-metadata"
    rows = [
        {"path": "img/x.png", "label": 7, "metadata": {"caption": "a red thing", "split": "train"}},
        {"path": "img/\u00f1and\u00fa.jpg", "label": 0, "metadata": {"caption": "\u00fcnicode \u2713", "n": 3}},
        {"path": "img/y.bmp", "label": -1, "metadata": {}},
        {"path": "img/z.gif", "label": 123456789, "metadata": {"nested": {"b": [1, 2], "a": None}}},
    ]
    inputs = {"img/x.png": _PNG_C, "img/\u00f1and\u00fa.jpg": JPEG_8X8, "img/y.bmp": _BMP_A, "img/z.gif": GIF_1X1}
    info = {"img/x.png": _INFO_PNG_C, "img/\u00f1and\u00fa.jpg": _INFO_JPEG, "img/y.bmp": _INFO_BMP_A,
            "img/z.gif": _INFO_GIF}
    _write_files(source, inputs)
    lines = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    (source / "list.jsonl").write_bytes(lines.encode("utf-8"))
    options = BuildSettings(layout=LayoutSettings(alignment=512, shard_size=2048, seed=3))
    _build(source / "list.jsonl", out, options)
    labels = {row["path"]: row["label"] for row in rows}
    metadata = {row["path"]: row["metadata"] for row in rows}
    samples = _describe_samples(out, inputs, info, labels, metadata)
    _write_json(out / "expected.json", {
        "description": "built from a JSONL manifest: integer labels (no classes, so any integer, -1 = "
                       "unlabeled), per-sample JSON metadata (empty for {}), a non-ASCII key; alignment 512",
        "source": "manifest", "settings": options.to_json(), "classes": [], "sample_count": len(samples),
        "alignment": 512, "samples": samples})


#: valid/fields: one row per sample of the JSONL manifest (no label: fields need none). Every kind
#: of §14: a variable array (boxes, with an empty one), a fixed array (depth), a class set with
#: names (one empty, one with a repeat and a non-ASCII name), text (non-ASCII, one empty) and an
#: image field (palette PNG masks the size of their image).
_FIELD_ROWS: list[dict[str, Any]] = [
    {"path": "img/0.png", "boxes": [[0.0, 0.5, 2.0, 3.0], [1.25, 0.0, 5.0, 2.5]], "depth": [1.5, -2.25],
     "tags": ["dog", "cat"], "caption": "a cat and a dog", "mask": "img/0.mask.png"},
    {"path": "img/1.jpg", "boxes": [], "depth": [0.0, 8.0], "tags": [], "caption": "gris 8\u00d78, sans \u00e9tiquette",
     "mask": "img/1.mask.png"},
    {"path": "img/2.bmp", "boxes": [[0, 0, 3, 2]], "depth": [-0.5, 0.125], "tags": ["\u00f1u", "cat", "cat"],
     "caption": "\u00f1u \u2713 \U0001f9ac", "mask": "img/2.mask.png"},
    {"path": "img/3.png", "boxes": [[1, 1, 2, 2], [0, 0, 4, 4], [2, 0, 4, 1]], "depth": [3.0, 0.75],
     "tags": ["dog"], "caption": "", "mask": "img/3.mask.png"},
]
#: The declarations as ``--field`` strings (what a user types) and as the manifest must record them.
_FIELD_OPTIONS = ("boxes=float32[N,4]", "depth=float32[2]", "tags=classes", "caption=text", "mask=image")
_FIELD_IMAGES = {"img/0.png": (_PNG_A, _INFO_PNG_A), "img/1.jpg": (JPEG_8X8, _INFO_JPEG),
                 "img/2.bmp": (_BMP_A, _INFO_BMP_A), "img/3.png": (_PNG_B, _INFO_PNG_B)}


def _field_masks() -> dict[str, tuple[bytes, list[list[int]], tuple[int, int, int, int]]]:
    """mask path -> (PNG bytes, the stored pixel values, (format, width, height, channels))."""
    masks = {}
    for seed, row in enumerate(_FIELD_ROWS):
        _, (_, width, height, _) = _FIELD_IMAGES[row["path"]]
        masks[row["mask"]] = (palette_png_bytes(width, height, seed), palette_pixels(width, height, seed),
                              (2, width, height, 1))
    return masks


def make_fields(out: Path, tmp: Path) -> None:
    source = tmp / "src-fields"
    masks = _field_masks()
    _write_files(source, {key: data for key, (data, _) in _FIELD_IMAGES.items()})
    _write_files(source, {key: data for key, (data, _, _) in masks.items()})
    lines = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in _FIELD_ROWS)
    (source / "rows.jsonl").write_bytes(lines.encode("utf-8"))
    # alignment 64 keeps the vector (and the invalid ones copied from it) small; shard_size 384 is
    # 64 header bytes + 320, room for two padded payloads (128 or 192 bytes) but never three,
    # so the 4 samples land 2 + 2 and the mask field runs parallel to two shards.
    options = BuildSettings(layout=LayoutSettings(alignment=64, shard_size=384, seed=1),
                            labels=LabelSettings(fields=_FIELD_OPTIONS))
    _build(source / "rows.jsonl", out, options)
    # the expected values come from the rows, not from the dataset: class names are numbered in
    # UTF-8 bytes order (as labels are), each sample's ids sorted without repeats
    names = sorted({tag for row in _FIELD_ROWS for tag in row["tags"]}, key=str.encode)
    declarations = [
        {"name": "boxes", "kind": "array", "dtype": "float32", "shape": [-1, 4]},
        {"name": "depth", "kind": "array", "dtype": "float32", "shape": [2]},
        {"name": "tags", "kind": "classes", "num_classes": len(names), "classes": names},
        {"name": "caption", "kind": "text"},
        {"name": "mask", "kind": "image"},
    ]
    rows = {row["path"]: row for row in _FIELD_ROWS}
    samples = _describe_samples(out, {key: data for key, (data, _) in _FIELD_IMAGES.items()},
                                {key: info for key, (_, info) in _FIELD_IMAGES.items()},
                                {key: -1 for key in rows}, {})
    for sample in samples:
        row = rows[sample["key"]]
        mask, pixels, (image_format, width, height, channels) = masks[row["mask"]]
        sample["fields"] = {
            "boxes": [[float(v) for v in box] for box in row["boxes"]],
            "depth": [float(v) for v in row["depth"]],
            "tags": sorted({names.index(tag) for tag in row["tags"]}),
            "caption": row["caption"],
            "mask": {"size": len(mask), "xxh3": fmt.checksum_hex(fmt.checksum(mask)), "image_format": image_format,
                     "width": width, "height": height, "channels": channels, "pixels": pixels},
        }
    _write_json(out / "expected.json", {
        "description": "declared fields (section 14) from a JSONL manifest without labels: boxes float32[N,4] "
                       "(one sample has none), depth float32[2], tags classes with names (one empty set, a "
                       "repeat, a non-ASCII name), caption text (non-ASCII, one empty), mask image (palette "
                       "PNGs) in field shards parallel to the 2 main shards; alignment 64, shuffled with seed 1; "
                       "every fields-* invalid vector is this dataset damaged in one way",
        "source": "manifest", "settings": options.to_json(), "classes": [], "sample_count": len(samples),
        "alignment": 64, "fields": declarations, "samples": samples})


def make_empty(out: Path, tmp: Path) -> None:
    out.mkdir(parents=True)
    (out / STAGING_DIR).mkdir()
    empty64, empty8 = np.zeros(0, np.uint64), np.zeros(0, np.uint8)
    columns = {"shard": np.zeros(0, np.uint32), "offset": empty64, "size": empty64, "checksum": empty64,
               "label": np.zeros(0, np.int64), "width": np.zeros(0, np.uint32), "height": np.zeros(0, np.uint32),
               "channels": empty8, "image_format": empty8, "key_offsets": np.zeros(1, np.uint64), "keys": empty8,
               "meta_offsets": np.zeros(1, np.uint64), "meta": empty8}
    commit_dataset(out, columns, [], classes=(), codec={"name": "passthrough"}, alignment=4096,
                   build_info={"note": "written by scripts/make_vectors.py, not by a build"}, rejected=[],
                   history=[])
    _write_json(out / "expected.json", {
        "description": "zero samples, zero shards: a valid dataset (written with packer.writer.commit.commit_dataset)",
        "source": "none", "settings": {}, "classes": [], "sample_count": 0, "alignment": 4096, "samples": []})


def make_unknown_fields(out: Path, base: Path) -> None:
    """Forward compatibility: things a newer writer may add, which this reader must ignore."""
    shutil.copytree(base, out, symlinks=True)
    rows, columns = _index_columns(out)
    columns["image_format"] = columns["image_format"].copy()
    columns["image_format"][0] = 200  # a reserved value: read as "unknown", never refused
    columns["x_future"] = np.arange(rows, dtype=np.uint32) + 1000  # an index column this reader does not know
    _replace_index(out, _encode_index(rows, columns))
    manifest = _manifest(out)
    manifest["x_future"] = {"note": "a top-level member from a newer writer"}
    manifest["index"]["x_note"] = "an unknown member inside the index entry"
    manifest["shards"][0]["x_note"] = "an unknown member inside a shard entry"
    manifest["codec"]["x_param"] = 1
    _write_manifest(out, manifest)
    (out / "shards" / "shard-00009-0000000000000000.pks").write_bytes(b"a stale file no manifest lists\n")
    (out / "notes.txt").write_bytes(b"readers ignore files the manifest does not list\n")
    expected = json.loads((base / "expected.json").read_bytes())
    expected["samples"][0]["image_format"] = 200
    expected["description"] = ("base-align512 plus an unknown index column, unknown manifest members at three "
                               "levels, a reserved image_format value (200) and unlisted files")
    _write_json(out / "expected.json", expected)


def make_small_records(out: Path, tmp: Path) -> None:
    """Records of ~0.7-1.4 KB with ``alignment="auto"`` (which gives 64, SPEC §3.4), and the page
    blocks (P = 4096) of some runs, worked out here from the index by the spec's formula."""
    sizes = [(14, 16), (16, 20), (18, 22), (20, 22), (15, 18), (17, 20), (19, 21), (16, 16), (20, 20)]
    files = {f"{'ab'[k % 2]}/{k:02d}.png": (png_bytes(w, h, k), (2, w, h, 3)) for k, (w, h) in enumerate(sizes)}
    options = BuildSettings(layout=LayoutSettings(alignment="auto", shard_size=6144, shuffle=False))
    _folder_vector(out, tmp, files=files, classes=["a", "b"], options=options,
                   description="9 PNGs of 0.7-1.4 KB with --alignment auto (chose 64): samples packed at 64 "
                               "bytes, 2 shards; page_blocks lists the 4 KiB page block of some runs (SPEC §3.4)")
    expected = json.loads((out / "expected.json").read_bytes())
    with packer.open_index(out) as index:
        alignment = index.manifest.alignment
        shard = index.index.shard.astype(int).tolist()
        offset = index.index.offset.astype(int).tolist()
        size = index.index.size.astype(int).tolist()
        file_size = [entry.size for entry in index.manifest.shards]
    page = 4096

    def page_block(i: int, j: int) -> dict[str, Any]:
        start = offset[i] - offset[i] % page
        end = min(-(-(offset[j] + size[j]) // page) * page, file_size[shard[j]])
        return {"first": i, "last": j, "shard": shard[i], "start": start, "end": end}

    runs = [(0, 0), (1, 3), (4, 4)] + [(first, last) for first, last in (
        (shard.index(s), len(shard) - 1 - shard[::-1].index(s)) for s in sorted(set(shard)))]
    expected["alignment"] = alignment
    expected["page_size"] = page
    expected["page_blocks"] = [page_block(i, j) for i, j in runs]
    _write_json(out / "expected.json", expected)


#: name -> maker(out, tmp); ``base-align512`` first: the others and the invalid vectors derive from it.
VALID: dict[str, Callable[[Path, Path], None]] = {
    "base-align512": make_base_align512,
    "two-shards-align4096": make_two_shards_align4096,
    "align1": make_align1,
    "rejected-gap": make_rejected_gap,
    "manifest-metadata": make_manifest_metadata,
    "empty": make_empty,
    "fields": make_fields,
    "small-records": make_small_records,
}

# --- mutation helpers ---------------------------------------------------------------------------


def _canonical(obj: Any) -> bytes:
    return (json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def _manifest(folder: Path) -> dict[str, Any]:
    return json.loads((folder / fmt.MANIFEST_NAME).read_bytes())


def _write_manifest(folder: Path, obj: Any) -> None:
    (folder / fmt.MANIFEST_NAME).write_bytes(_canonical(obj))


def _index_bytes(folder: Path) -> bytes:
    return (folder / _manifest(folder)["index"]["path"]).read_bytes()


def _replace_index(folder: Path, data: bytes, *, rename: bool = True, update_manifest: bool = True) -> None:
    """Write new index bytes under their content name and point the manifest at them."""
    manifest = _manifest(folder)
    old = folder / manifest["index"]["path"]
    digest = fmt.checksum(data)
    name = fmt.index_file_name(digest) if rename else manifest["index"]["path"]
    old.unlink()
    (folder / name).write_bytes(data)
    if update_manifest:
        manifest["index"].update(path=name, size=len(data), checksum=fmt.checksum_hex(digest))
        _write_manifest(folder, manifest)


def _index_columns(folder: Path) -> tuple[int, dict[str, np.ndarray]]:
    rows, columns = fmt.parse_column_file(_index_bytes(folder), fmt.INDEX_MAGIC)
    return rows, {name: array.copy() for name, array in columns.items()}


def _encode_index(rows: int, columns: dict[str, np.ndarray]) -> bytes:
    return b"".join(bytes(piece) for piece in fmt.encode_column_file(fmt.INDEX_MAGIC, rows, columns))


def _patch_index_columns(folder: Path, change: Callable[[dict[str, np.ndarray]], int | None]) -> None:
    rows, columns = _index_columns(folder)
    new_rows = change(columns)
    _replace_index(folder, _encode_index(rows if new_rows is None else new_rows, columns))


def _column_entry_offset(data: bytes, name: str) -> int:
    count = struct.unpack_from("<I", data, 32)[0]
    for i in range(count):
        at = fmt.COLUMN_FILE_HEADER_SIZE + i * fmt.COLUMN_ENTRY_SIZE
        if data[at:at + 24].rstrip(b"\0") == name.encode():
            return at
    raise KeyError(name)


def _patch_index_bytes(folder: Path, change: Callable[[bytearray], None]) -> None:
    data = bytearray(_index_bytes(folder))
    change(data)
    _replace_index(folder, bytes(data))


def _shard_path(folder: Path, position: int) -> Path:
    return folder / _manifest(folder)["shards"][position]["path"]


def _replace_shard(folder: Path, position: int, data: bytes, *, update_size: bool = True) -> None:
    """Write new shard bytes under their content name (same number) and update the manifest entry."""
    manifest = _manifest(folder)
    entry = manifest["shards"][position]
    digest = fmt.checksum(data)
    name = fmt.shard_file_name(fmt.shard_number_of(entry["path"]), digest)
    (folder / entry["path"]).unlink()
    (folder / name).write_bytes(data)
    entry.update(path=name, checksum=fmt.checksum_hex(digest))
    if update_size:
        entry["size"] = len(data)
    _write_manifest(folder, manifest)


def _patch_shard_header(folder: Path, position: int, fmt_char: str, at: int, value: Any) -> None:
    data = bytearray(_shard_path(folder, position).read_bytes())
    struct.pack_into("<" + fmt_char, data, at, value)
    _replace_shard(folder, position, bytes(data))


def _edit_manifest(change: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def mutate(folder: Path) -> None:
        manifest = _manifest(folder)
        change(manifest)
        _write_manifest(folder, manifest)
    return mutate


def _set(*path_and_value: Any) -> Callable[[Path], None]:
    *keys, value = path_and_value

    def change(manifest: dict[str, Any]) -> None:
        target = manifest
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value
    return _edit_manifest(change)


def _raw_manifest(transform: Callable[[bytes], bytes]) -> Callable[[Path], None]:
    def mutate(folder: Path) -> None:
        path = folder / fmt.MANIFEST_NAME
        path.write_bytes(transform(path.read_bytes()))
    return mutate


def _shard_name(folder: Path, position: int) -> str:
    return _manifest(folder)["shards"][position]["path"]


# --- invalid vectors ------------------------------------------------------------------------------

_LFS_POINTER = (b"version https://git-lfs.github.com/spec/v1\n"
                b"oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\nsize 1664\n")


def _lfs_pointer_manifest(folder: Path) -> None:
    (folder / fmt.MANIFEST_NAME).write_bytes(_LFS_POINTER)


def _no_manifest(folder: Path) -> None:
    (folder / fmt.MANIFEST_NAME).unlink()
    (folder / STAGING_DIR).mkdir()
    (folder / STAGING_DIR / "README").write_bytes(b"an unfinished build leaves its staging folder here\n")


def _manifest_folder(folder: Path) -> None:
    (folder / fmt.MANIFEST_NAME).unlink()
    (folder / fmt.MANIFEST_NAME).mkdir()
    (folder / fmt.MANIFEST_NAME / "x").write_bytes(b"a folder where manifest.json should be\n")


def _shard_folder(folder: Path) -> None:
    path = _shard_path(folder, 1)
    path.unlink()
    path.mkdir()
    (path / "x").write_bytes(b"a folder where a shard should be\n")


def _swap_shards(manifest: dict[str, Any]) -> None:
    manifest["shards"].reverse()


def _shard_twice(manifest: dict[str, Any]) -> None:
    manifest["shards"].append(dict(manifest["shards"][0]))
    manifest["sample_count"] = sum(s["sample_count"] for s in manifest["shards"])


def _remove_field(name: str) -> Callable[[Path], None]:
    return _edit_manifest(lambda manifest: manifest.pop(name))


def _flip_index_byte(folder: Path) -> None:
    path = folder / _manifest(folder)["index"]["path"]
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # inside zero padding or the meta blob: the size stays right, the hash does not
    path.write_bytes(bytes(data))


def _truncate_index(folder: Path) -> None:
    path = folder / _manifest(folder)["index"]["path"]
    path.write_bytes(path.read_bytes()[:-64])


def _truncate_shard(folder: Path) -> None:
    path = _shard_path(folder, 1)
    path.write_bytes(path.read_bytes()[:-100])


def _extend_shard(folder: Path) -> None:
    path = _shard_path(folder, 1)
    path.write_bytes(path.read_bytes() + bytes(512))


def _extend_shard_and_manifest(folder: Path) -> None:
    _replace_shard(folder, 1, _shard_path(folder, 1).read_bytes() + bytes(512))


def _delete(which: str) -> Callable[[Path], None]:
    def mutate(folder: Path) -> None:
        manifest = _manifest(folder)
        relative = manifest["index"]["path"] if which == "index" else manifest["shards"][1]["path"]
        (folder / relative).unlink()
    return mutate


def _symlink_out(folder: Path) -> None:
    path = _shard_path(folder, 1)
    path.unlink()
    os.symlink("../../outside-the-dataset.pks", path)  # leads out of the dataset folder (dangling)


def _index_file(data: bytes) -> Callable[[Path], None]:
    return lambda folder: _replace_index(folder, data)


def _index_header(fmt_char: str, at: int, value: int) -> Callable[[Path], None]:
    return lambda folder: _patch_index_bytes(folder, lambda data: struct.pack_into("<" + fmt_char, data, at, value))


def _index_entry(column: str, field_offset: int, fmt_char: str, value: Any) -> Callable[[Path], None]:
    def change(data: bytearray) -> None:
        struct.pack_into("<" + fmt_char, data, _column_entry_offset(bytes(data), column) + field_offset, value)
    return lambda folder: _patch_index_bytes(folder, change)


def _overlap_columns(data: bytearray) -> None:
    first = _column_entry_offset(bytes(data), "shard")
    second = _column_entry_offset(bytes(data), "offset")
    struct.pack_into("<Q", data, second + 32, struct.unpack_from("<Q", data, first + 32)[0])


def _column(name: str, row: int, value: int) -> Callable[[Path], None]:
    def change(columns: dict[str, np.ndarray]) -> None:
        columns[name][row] = value
    return lambda folder: _patch_index_columns(folder, change)


def _drop_column(name: str) -> Callable[[Path], None]:
    def change(columns: dict[str, np.ndarray]) -> None:
        del columns[name]
    return lambda folder: _patch_index_columns(folder, change)


def _retype_label(columns: dict[str, np.ndarray]) -> None:
    columns["label"] = columns["label"].astype(np.uint64)


def _short_width(columns: dict[str, np.ndarray]) -> None:
    columns["width"] = columns["width"][:-1]


def _drop_last_row(columns: dict[str, np.ndarray]) -> int:
    rows = len(columns["offset"])
    for name, (_, rule) in fmt.INDEX_COLUMNS.items():
        if rule == "N":
            columns[name] = columns[name][:-1]
    for blob, offsets in (("keys", "key_offsets"), ("meta", "meta_offsets")):
        columns[offsets] = columns[offsets][:-1]
        columns[blob] = columns[blob][:int(columns[offsets][-1])]
    return rows - 1


def _shard_column(values: list[int]) -> Callable[[Path], None]:
    def change(columns: dict[str, np.ndarray]) -> None:
        columns["shard"] = np.asarray(values, dtype=np.uint32)
    return lambda folder: _patch_index_columns(folder, change)


def _decreasing_key_offsets(columns: dict[str, np.ndarray]) -> None:
    key_offsets = columns["key_offsets"]
    key_offsets[1] = key_offsets[2] + 1  # then key_offsets[2] < key_offsets[1]


def _flip_payload_byte(folder: Path) -> None:
    data = bytearray(_shard_path(folder, 0).read_bytes())
    data[512 + 20] ^= 0xFF  # inside sample 0's payload; the shard is re-hashed, the sample is not
    _replace_shard(folder, 0, bytes(data))


def _gzip_magic(folder: Path) -> None:
    data = bytearray(_shard_path(folder, 0).read_bytes())
    data[:8] = b"\x1f\x8b\x08\x00\x00\x00\x00\x00"
    _replace_shard(folder, 0, bytes(data))


def _shard_alignment_256(folder: Path) -> None:
    data = bytearray(_shard_path(folder, 0).read_bytes())
    struct.pack_into("<IQ", data, 12, 256, 256)  # alignment and the matching data_offset
    _replace_shard(folder, 0, bytes(data))


H_VERSION, H_ALIGNMENT, H_DATA_OFFSET, H_COUNT, H_FILE_SIZE, H_NUMBER = 8, 12, 16, 24, 32, 40

#: name -> (requirement, error class, message fragment, stage, what the damage is, mutate(folder)).
#: stage: "open" = open_index/open_dataset raise; "read" = opening works, reading every sample
#: raises (shards are opened lazily); "verify" = reading with verify_checksums=True raises.
INVALID: dict[str, tuple[str, str, str, str, str, Callable[[Path], None]]] = {
    # manifest
    "manifest-missing": ("R42", "NotAPackerFileError", "no manifest.json", "open",
                         "manifest.json deleted; an unfinished build's staging folder is present", _no_manifest),
    "manifest-is-a-folder": ("R44", "NotAPackerFileError", "manifest.json is not a regular file", "open",
                             "manifest.json is a folder", _manifest_folder),
    "manifest-lfs-pointer": ("R31", "NotAPackerFileError", "not a packer manifest (starts with b'version https:",
                             "open", "manifest.json is a git-LFS pointer", _lfs_pointer_manifest),
    "manifest-truncated-json": ("R32", "ManifestError", "not valid UTF-8 JSON", "open",
                                "manifest.json cut in half", _raw_manifest(lambda b: b[:len(b) // 2])),
    "manifest-not-utf8": ("R32", "ManifestError", "not valid UTF-8 JSON", "open",
                          "a class name holds the byte 0xff",
                          _raw_manifest(lambda b: b.replace(b'"cat"', b'"c\xfft"'))),
    "manifest-nan": ("R32", "ManifestError", "NaN is not valid JSON", "open", "sample_count is NaN",
                     _raw_manifest(lambda b: b.replace(b'"sample_count": 3', b'"sample_count": NaN'))),
    "manifest-wrong-format": ("R16", "NotAPackerFileError", "manifest format is 'webdataset'", "open",
                              "format is \"webdataset\"", _set("format", "webdataset")),
    "manifest-version-2": ("R16", "UnsupportedVersionError", "dataset format version 2 is not supported", "open",
                           "format_version is 2", _set("format_version", 2)),
    "manifest-version-string": ("R16", "ManifestError", "field 'format_version' must be an integer, got a string",
                                "open", "format_version is \"1\"", _set("format_version", "1")),
    "manifest-checksum-algorithm": ("R33", "ManifestError", "checksum_algorithm 'crc32' is not 'xxh3_64'", "open",
                                    "checksum_algorithm is \"crc32\"", _set("checksum_algorithm", "crc32")),
    "manifest-alignment-768": ("R34", "ManifestError", "power of two", "open", "alignment is 768",
                               _set("alignment", 768)),
    "manifest-bool-as-int": ("R35", "ManifestError", "field 'sample_count' must be an integer, got a boolean",
                             "open", "sample_count is true", _set("sample_count", True)),
    "manifest-count-2pow63": ("R35", "ManifestError", "field 'sample_count' = 9223372036854775808 outside",
                              "open", "sample_count is 2^63", _set("sample_count", 1 << 63)),
    "manifest-shard-size-2pow62": ("R35", "ManifestError", "field 'size' = 4611686018427387904 outside", "open",
                                   "shards[0].size is 2^62 (sizes must stay below 2^62)",
                                   _set("shards", 0, "size", 1 << 62)),
    "manifest-missing-codec": ("R35", "ManifestError", "lacks required field 'codec'", "open",
                               "the codec member is missing", _remove_field("codec")),
    "manifest-classes-string": ("R35", "ManifestError", "field 'classes' must be an array, got a string", "open",
                                "classes is \"cat,dog\"", _set("classes", "cat,dog")),
    "manifest-checksum-uppercase": ("R35", "ManifestError", "shard 0 checksum must be 16 lowercase hex digits",
                                    "open", "shards[0].checksum in upper case",
                                    _edit_manifest(lambda m: m["shards"][0].update(
                                        checksum=m["shards"][0]["checksum"].upper()))),
    "manifest-history-not-list": ("R35", "ManifestError", "'history' a list of objects", "open",
                                  "history is an object", _set("history", {"build": 1})),
    "path-dotdot": ("R19", "UnsafePathError", "is not a valid dataset path", "open",
                    "shards[1].path goes through 'shards/../'",
                    _edit_manifest(lambda m: m["shards"][1].update(path="shards/../" + m["shards"][1]["path"]))),
    "path-absolute": ("R19", "UnsafePathError", "is not a valid dataset path", "open",
                      "shards[0].path is absolute",
                      _edit_manifest(lambda m: m["shards"][0].update(path="/tmp/" + m["shards"][0]["path"]))),
    "path-short-number": ("R19", "UnsafePathError", "shards/shard-<number, at least 5 digits>", "open",
                          "shards[0].path spells the number with 1 digit",
                          _edit_manifest(lambda m: m["shards"][0].update(
                              path=m["shards"][0]["path"].replace("shard-00000-", "shard-0-")))),
    "index-path-dotdot": ("R19", "UnsafePathError", "index path", "open", "index.path is '../index-<hex>.pki'",
                          _edit_manifest(lambda m: m["index"].update(path="../" + m["index"]["path"]))),
    "symlink-escape": ("R19", "UnsafePathError", "resolves outside the dataset folder", "read",
                       "shard 1 is a symlink to ../../outside-the-dataset.pks", _symlink_out),
    "shards-not-increasing": ("R17", "ManifestError", "is not numbered after the shard before it", "open",
                              "the two shard entries listed in reverse order", _edit_manifest(_swap_shards)),
    "shard-listed-twice": ("R17", "ManifestError", "is not numbered after the shard before it", "open",
                           "shard 0 listed again at the end (sample_count adjusted)", _edit_manifest(_shard_twice)),
    "shard-size-not-multiple": ("R37", "ManifestError", "size 1000 is not a multiple of the alignment 512", "open",
                                "shards[1].size is 1000", _set("shards", 1, "size", 1000)),
    "sample-count-sum": ("R18", "ManifestError", "differs from the sum of the shards' counts", "open",
                         "sample_count is 4, the shards hold 3", _set("sample_count", 4)),
    # index file
    "index-missing": ("R43", "DatasetChangedError", "is missing", "open", "the index file is deleted",
                      _delete("index")),
    "index-truncated": ("R20", "TruncatedFileError", "(truncated)", "open",
                        "the index file lost its last 64 bytes; the manifest is unchanged", _truncate_index),
    "index-checksum-mismatch": ("R39", "ChecksumMismatchError", "index checksum mismatch", "open",
                                "one index byte flipped; size unchanged, manifest unchanged", _flip_index_byte),
    "index-lfs-pointer": ("R1", "NotAPackerFileError", "not a packer index file (starts with b'version ", "open",
                          "the index file is a git-LFS pointer (manifest updated to its size and hash)",
                          _index_file(_LFS_POINTER)),
    "index-short": ("R21", "TruncatedFileError", "shorter than its 64-byte header", "open",
                    "the index file is its first 10 bytes (manifest updated)",
                    lambda folder: _replace_index(folder, _index_bytes(folder)[:10])),
    "index-version-2": ("R2", "UnsupportedVersionError", "index format version 2 is not supported", "open",
                        "index header version is 2", _index_header("I", 8, 2)),
    "index-extended": ("R5", "TruncatedFileError", "(extended)", "open",
                       "64 zero bytes appended to the index (manifest updated)",
                       lambda folder: _replace_index(folder, _index_bytes(folder) + bytes(64))),
    "index-column-count-0": ("R24", "CorruptHeaderError", "column_count 0 outside 1..64", "open",
                             "index column_count is 0", _index_header("I", 32, 0)),
    "index-header-size": ("R25", "CorruptHeaderError", "header_size 960 does not match 13 columns", "open",
                          "index header_size is 960 (64 more than 13 columns need)", _index_header("I", 12, 960)),
    "index-row-count-2pow63": ("R26", "CorruptHeaderError", "row_count 9223372036854775808 exceeds the limit",
                               "open", "index row_count is 2^63", _index_header("Q", 24, 1 << 63)),
    "index-column-bad-name": ("R27", "CorruptHeaderError", "invalid or repeated name 'Label'", "open",
                              "column 'label' renamed 'Label'", _index_entry("label", 0, "24s", b"Label")),
    "index-column-bad-dtype": ("R28", "CorruptHeaderError", "unsupported dtype '<f8'", "open",
                               "column 'label' has dtype '<f8'", _index_entry("label", 24, "8s", b"<f8")),
    "index-columns-overlap": ("R7", "OverlappingRecordsError", "column 'offset' starts at", "open",
                              "column 'offset' starts where column 'shard' starts",
                              lambda folder: _patch_index_bytes(folder, _overlap_columns)),
    "index-column-past-end": ("R6", "OffsetOutOfBoundsError", "runs past the end", "open",
                              "column 'meta' claims 2^61 elements", _index_entry("meta", 40, "Q", 1 << 61)),
    "index-missing-column": ("R8", "CorruptHeaderError", "lacks required column 'checksum'", "open",
                             "the 'checksum' column is absent", _drop_column("checksum")),
    "index-column-wrong-dtype": ("R8", "CorruptHeaderError", "has dtype <u8, expected <i8", "open",
                                 "column 'label' is <u8", lambda f: _patch_index_columns(f, _retype_label)),
    "index-column-wrong-length": ("R8", "IndexMismatchError", "'width' has 2 entries, expected 3", "open",
                                  "column 'width' has N-1 entries", lambda f: _patch_index_columns(f, _short_width)),
    "index-row-count-mismatch": ("R9", "IndexMismatchError", "index holds 2 samples but the manifest's shards hold 3",
                                 "open", "the index lost its last row (a consistent 2-row index)",
                                 lambda f: _patch_index_columns(f, _drop_last_row)),
    "index-shard-out-of-range": ("R10", "OffsetOutOfBoundsError", "names shard 7 but the manifest lists 2", "open",
                                 "sample 2 in shard 7", _column("shard", 2, 7)),
    "index-shard-order": ("R10", "OverlappingRecordsError", "per-shard counts place it in shard 0", "open",
                          "shard column is 0, 1, 1 (the manifest says 2 + 1)", _shard_column([0, 1, 1])),
    "index-size-zero": ("R11", "CorruptHeaderError", "has size 0", "open", "sample 1 has size 0",
                        _column("size", 1, 0)),
    "index-misaligned-offset": ("R12", "MisalignedRecordError", "not a multiple of 512", "open",
                                "sample 1 starts at 1032", _column("offset", 1, 1032)),
    "index-offset-2pow62": ("R29", "OffsetOutOfBoundsError", "beyond 2^62", "open", "sample 2 starts at 2^62",
                            _column("offset", 2, 1 << 62)),
    "index-overlap": ("R13", "OverlappingRecordsError", "starts at 512 but the layout requires 1024", "open",
                      "sample 1 starts at 512, on top of sample 0", _column("offset", 1, 512)),
    "index-gap": ("R13", "OverlappingRecordsError", "starts at 1536 but the layout requires 1024", "open",
                  "sample 1 starts at 1536, leaving a gap", _column("offset", 1, 1536)),
    "index-offset-past-end": ("R14", "OffsetOutOfBoundsError", "is 1024 bytes but its samples end at 1536", "open",
                              "sample 2 (the last of shard 1) is 600 bytes: its aligned end is past the shard",
                              _column("size", 2, 600)),
    "index-key-offsets-decrease": ("R15", "OverlappingRecordsError", "'key_offsets' must start at 0, never decrease",
                                   "open", "key_offsets[1] > key_offsets[2]",
                                   lambda f: _patch_index_columns(f, _decreasing_key_offsets)),
    "label-out-of-range": ("R40", "IndexMismatchError", "has label 2 but the manifest lists 2 classes", "open",
                           "sample 0 has label 2 with classes [cat, dog]", _column("label", 0, 2)),
    # shards
    "shard-missing": ("R43", "DatasetChangedError", "is missing", "read", "shard 1 deleted", _delete("shard")),
    "shard-is-a-folder": ("R44", "NotAPackerFileError", "is not a regular file", "read",
                          "shard 1 is a folder", _shard_folder),
    "shard-truncated": ("R20", "TruncatedFileError", "(truncated)", "read",
                        "shard 1 lost its last 100 bytes; the manifest is unchanged", _truncate_shard),
    "shard-extended": ("R20", "TruncatedFileError", "(extended)", "read",
                       "512 zero bytes appended to shard 1; the manifest is unchanged", _extend_shard),
    "shard-extended-manifest-updated": ("R14", "OffsetOutOfBoundsError", "is 1536 bytes but its samples end at 1024",
                                        "open", "512 zero bytes appended to shard 1, manifest size and hash updated",
                                        _extend_shard_and_manifest),
    "shard-bad-magic": ("R1", "NotAPackerFileError", "not a packer shard (starts with b'\\x1f\\x8b", "read",
                        "shard 0 starts with a gzip magic", _gzip_magic),
    "shard-version-2": ("R2", "UnsupportedVersionError", "shard format version 2 is not supported", "read",
                        "shard 0 header version is 2", lambda f: _patch_shard_header(f, 0, "I", H_VERSION, 2)),
    "shard-alignment-3": ("R3", "CorruptHeaderError", "power of two", "read", "shard 0 header alignment is 3",
                          lambda f: _patch_shard_header(f, 0, "I", H_ALIGNMENT, 3)),
    "shard-data-offset": ("R22", "CorruptHeaderError", "data_offset 64 must be 512", "read",
                          "shard 0 header data_offset is 64",
                          lambda f: _patch_shard_header(f, 0, "Q", H_DATA_OFFSET, 64)),
    "shard-count-2pow63": ("R23", "CorruptHeaderError", "sample_count 9223372036854775808 outside", "read",
                           "shard 0 header sample_count is 2^63",
                           lambda f: _patch_shard_header(f, 0, "Q", H_COUNT, 1 << 63)),
    "shard-file-size-not-multiple": ("R4", "CorruptHeaderError", "file_size 1000 must be a multiple of 512", "read",
                                     "shard 0 header file_size is 1000",
                                     lambda f: _patch_shard_header(f, 0, "Q", H_FILE_SIZE, 1000)),
    "shard-header-size-mismatch": ("R5", "TruncatedFileError", "header says 2048 (truncated)", "read",
                                   "shard 0 header file_size is 2048, the file is 1536 bytes",
                                   lambda f: _patch_shard_header(f, 0, "Q", H_FILE_SIZE, 2048)),
    "shard-header-alignment-mismatch": ("R38", "ManifestError", "disagrees with the manifest", "read",
                                        "shard 0 header alignment 256 (data_offset 256), manifest 512",
                                        _shard_alignment_256),
    "shard-header-count-mismatch": ("R38", "ManifestError", "disagrees with the manifest", "read",
                                    "shard 0 header sample_count is 1, the manifest says 2",
                                    lambda f: _patch_shard_header(f, 0, "Q", H_COUNT, 1)),
    "shard-header-number-mismatch": ("R38", "ManifestError", "disagrees with the manifest", "read",
                                     "shard 1 header shard_number is 5, its name says 1",
                                     lambda f: _patch_shard_header(f, 1, "I", H_NUMBER, 5)),
    "sample-checksum-mismatch": ("R41", "ChecksumMismatchError", "sample checksum mismatch", "verify",
                                 "one payload byte of sample 0 flipped (the shard's own hash updated)",
                                 _flip_payload_byte),
}

# --- invalid vectors of declared fields (section 14), damaged from valid/fields ------------------

#: Positions in valid/fields' manifest ``fields``: the order the build declared them.
F_BOXES, F_DEPTH, F_TAGS, F_CAPTION, F_MASK = range(5)


def _field_shard_path(folder: Path, position: int) -> Path:
    return folder / _manifest(folder)["fields"][F_MASK]["shards"][position]["path"]


def _replace_field_shard(folder: Path, position: int, data: bytes) -> None:
    """Write new bytes for mask shard ``position`` under their content name (same number) and
    update its entry, so that only the damage inside the bytes remains."""
    manifest = _manifest(folder)
    entry = manifest["fields"][F_MASK]["shards"][position]
    digest = fmt.checksum(data)
    name = fmt.field_shard_file_name("mask", fmt.shard_number_of(entry["path"]), digest)
    (folder / entry["path"]).unlink()
    (folder / name).write_bytes(data)
    entry.update(path=name, checksum=fmt.checksum_hex(digest), size=len(data))
    _write_manifest(folder, manifest)


def _field_set(position: int, *path_and_value: Any) -> Callable[[Path], None]:
    """Set a member inside declaration ``position`` of the manifest's ``fields``."""
    return _set("fields", position, *path_and_value)


def _renumber_mask_shard(folder: Path) -> None:
    manifest = _manifest(folder)
    entry = manifest["fields"][F_MASK]["shards"][1]
    name = fmt.field_shard_file_name("mask", 5, fmt.parse_checksum_hex(entry["checksum"]))
    os.replace(folder / entry["path"], folder / name)  # the file moves with its entry: a consistent rename
    entry["path"] = name
    _write_manifest(folder, manifest)


def _mask_shard_header_number(folder: Path) -> None:
    data = bytearray(_field_shard_path(folder, 1).read_bytes())
    struct.pack_into("<I", data, H_NUMBER, 5)
    _replace_field_shard(folder, 1, bytes(data))


def _flip_mask_payload_byte(folder: Path) -> None:
    with packer.open_index(folder) as index:
        spec = index.field_spec("mask")
        shard = int(index.index.shard[0])
        offset = int(index.index.field_columns[spec.image_column("offset")][0])
    data = bytearray(_field_shard_path(folder, shard).read_bytes())
    data[offset + 40] ^= 0xFF  # a byte of sample 0's mask (its PLTE chunk), not of the header or padding
    _replace_field_shard(folder, shard, bytes(data))


def _short_depth(columns: dict[str, np.ndarray]) -> None:
    columns["f_depth"] = columns["f_depth"][:-8]  # one float32[2] record short


def _boxes_offset_off_record(columns: dict[str, np.ndarray]) -> None:
    offsets = columns["f_boxes__offsets"]
    # the first inner offset whose sample holds a box: +4 bytes keeps the column increasing and
    # in bounds, so only the record rule (16-byte rows) is broken
    at = next(i for i in range(1, len(offsets) - 1) if offsets[i + 1] - offsets[i] >= 16)
    offsets[at] += 4


def _tag_id_out_of_range(columns: dict[str, np.ndarray]) -> None:
    ids = columns["f_tags"].view("<i8")
    ids[-1] = 3  # the last id of the last non-empty set: still its largest, so the set stays sorted


def _mask_offset(sample: int, delta: int) -> Callable[[dict[str, np.ndarray]], None]:
    def change(columns: dict[str, np.ndarray]) -> None:
        columns["f_mask__offset"][sample] += np.uint64(delta)
    return change


def _mask_size(sample: int, delta: int) -> Callable[[dict[str, np.ndarray]], None]:
    def change(columns: dict[str, np.ndarray]) -> None:
        columns["f_mask__size"][sample] += np.uint64(delta)
    return change


def _columns(change: Callable[[dict[str, np.ndarray]], Any]) -> Callable[[Path], None]:
    return lambda folder: _patch_index_columns(folder, change)


#: Like ``INVALID``, but each is ``valid/fields`` damaged in one way.
FIELD_INVALID: dict[str, tuple[str, str, str, str, str, Callable[[Path], None]]] = {
    # declarations (R45)
    "fields-name-reserved": ("R45", "ManifestError", "manifest field 3 name 'label' is reserved", "open",
                             "fields[3] (caption) renamed 'label', a name readers already use",
                             _field_set(F_CAPTION, "name", "label")),
    "fields-repeated": ("R45", "ManifestError", "field names must be unique, ['boxes'] repeated", "open",
                        "fields[1] (depth) renamed 'boxes': two declarations named 'boxes'",
                        _field_set(F_DEPTH, "name", "boxes")),
    "fields-bad-dtype": ("R45", "ManifestError", "manifest field 1 (depth) dtype 'float128' is not one of", "open",
                         "fields[1].dtype is 'float128'", _field_set(F_DEPTH, "dtype", "float128")),
    "fields-dtype-not-string": ("R45", "ManifestError", "manifest field 0 (boxes) dtype ['float32'] is not one of",
                                "open", "fields[0].dtype is a list, [\"float32\"]: refused like an unknown name, "
                                "not a TypeError", _field_set(F_BOXES, "dtype", ["float32"])),
    # an image field's shards (R50)
    "fields-image-shards-count": ("R50", "ManifestError", "must list one shard per main shard (2), got 1", "open",
                                  "the mask field lists only its first shard (the second file stays, unlisted)",
                                  _edit_manifest(lambda m: m["fields"][F_MASK]["shards"].pop())),
    "fields-image-shard-number": ("R50", "ManifestError", "(shards/field-mask-00005-6300daef48d33298.pks) must be "
                                  "the 'mask' shard numbered 1 with 2 samples, like main shard 1", "open",
                                  "the mask field's second shard is named (and listed) number 5, parallel to main "
                                  "shard 1", _renumber_mask_shard),
    "fields-image-path-dotdot": ("R50", "UnsafePathError", "shard 1 path "
                                 "'shards/../shards/field-mask-00001-6300daef48d33298.pks' is not a valid dataset path",
                                 "open", "the mask field's second shard path goes through 'shards/../'",
                                 _edit_manifest(lambda m: m["fields"][F_MASK]["shards"][1].update(
                                     path="shards/../" + m["fields"][F_MASK]["shards"][1]["path"]))),
    "fields-shards-not-image": ("R50", "ManifestError", "manifest field 0 (boxes) is not an image field and lists "
                                "shards", "open", "the boxes field (an array) lists the mask field's shards",
                                _edit_manifest(lambda m: m["fields"][F_BOXES].update(
                                    shards=m["fields"][F_MASK]["shards"]))),
    # columns (R46, R47, R49)
    "fields-column-missing": ("R46", "CorruptHeaderError", "lacks required column 'f_caption__offsets'", "open",
                              "the 'f_caption__offsets' column is absent", _drop_column("f_caption__offsets")),
    "fields-fixed-length": ("R46", "IndexMismatchError", "column 'f_depth' has 24 entries, expected 32", "open",
                            "column 'f_depth' (float32[2], 8 bytes a sample) is one record short",
                            _columns(_short_depth)),
    "fields-offsets-not-record-multiple": ("R47", "OverlappingRecordsError",
                                           "is not a multiple of the field's 16-byte record", "open",
                                           "an inner f_boxes__offsets entry moved by 4 bytes, inside a box",
                                           _columns(_boxes_offset_off_record)),
    "fields-class-id-out-of-range": ("R49", "IndexMismatchError", "field 'tags' holds class id 3 outside 0..2",
                                     "open", "a tags id is 3, the field has 3 classes",
                                     _columns(_tag_id_out_of_range)),
    # an image field's payload table (R48)
    "fields-image-payload-gap": ("R48", "OverlappingRecordsError", "field 'mask': starts at 256 but the layout "
                                 "requires 192", "open", "sample 1's mask starts 64 bytes late, leaving a gap",
                                 _columns(_mask_offset(1, 64))),
    "fields-image-past-end": ("R48", "OffsetOutOfBoundsError", "field 'mask': shard 1 "
                              "(shards/field-mask-00001-6300daef48d33298.pks) is 320 bytes but its samples end at "
                              "384", "open", "sample 3's mask (the last of shard 1) is 64 bytes longer: its aligned end is past "
                              "its field shard", _columns(_mask_size(3, 64))),
    # the field's shard files, opened on first use like main shards
    "fields-image-shard-header-number": ("R38", "ManifestError", "(alignment 64, 2 samples, number 5) disagrees "
                                         "with the manifest (alignment 64, 2 samples, number 1)", "read",
                                         "the mask field's second shard has header shard_number 5, its name says 1",
                                         _mask_shard_header_number),
    "fields-image-checksum-mismatch": ("R41", "ChecksumMismatchError",
                                       "field 'mask' checksum mismatch: expected a096e3b65069d4cf", "verify",
                                       "one byte of sample 0's mask flipped (the field shard's own hash updated)",
                                       _flip_mask_payload_byte),
}


def read_everything(dataset: Any) -> None:
    """Read every sample's bytes and every declared field's value (image fields: their bytes),
    as the tests do: the stages ``read`` and ``verify`` are about what this raises."""
    for i in range(len(dataset)):
        dataset.read(i)
    for spec in dataset.fields:
        for i in range(len(dataset)):
            if spec.kind == "image":
                dataset.field_bytes(spec.name, i)
            else:
                dataset.field_value(spec.name, i)


# --- generation -----------------------------------------------------------------------------------


def _check_invalid(folder: Path, expected: dict[str, str]) -> None:
    """Open the damaged dataset as the tests do; raise AssertionError if it fails differently."""
    stage = expected["stage"]

    def matches(exc: packer.PackerError) -> None:
        if type(exc).__name__ != expected["error"] or expected["message"] not in str(exc):
            raise AssertionError(f"raised {type(exc).__name__}: {exc}")

    try:
        dataset = packer.open_dataset(folder, verify_checksums=stage == "verify")
    except packer.PackerError as exc:
        if stage != "open":
            raise AssertionError(f"opening raised {type(exc).__name__}: {exc}") from None
        matches(exc)
        return
    with dataset:
        if stage == "open":
            raise AssertionError("opened without error")
        try:
            read_everything(dataset)
        except packer.PackerError as exc:
            matches(exc)
            return
    raise AssertionError("read every sample without error")


# --- tiled JPEG (section 13) -------------------------------------------------------------------

#: Two small baseline JPEGs (made once with simplejpeg, quality 75; frozen here as bytes): 48x32
#: with 4:2:0 chroma (16x16 MCUs, one per tile) and 40x24 with 4:4:4 (8x8 MCUs, five per tile).
TILED_SOURCES = {
    "color420-48x32": bytes.fromhex(
    "ffd8ffe000104a46494600010100000100010000ffdb004300080606070605080707070909080a0c140d0c0b0b0c1912"
    "130f141d1a1f1e1d1a1c1c20242e2720222c231c1c2837292c30313434341f27393d38323c2e333432ffdb0043010909"
    "090c0b0c180d0d1832211c21323232323232323232323232323232323232323232323232323232323232323232323232"
    "3232323232323232323232323232ffc00011080020003003012200021101031101ffc4001f0000010501010101010100"
    "000000000000000102030405060708090a0bffc400b5100002010303020403050504040000017d010203000411051221"
    "31410613516107227114328191a1082342b1c11552d1f02433627282090a161718191a25262728292a3435363738393a"
    "434445464748494a535455565758595a636465666768696a737475767778797a838485868788898a9293949596979899"
    "9aa2a3a4a5a6a7a8a9aab2b3b4b5b6b7b8b9bac2c3c4c5c6c7c8c9cad2d3d4d5d6d7d8d9dae1e2e3e4e5e6e7e8e9eaf1"
    "f2f3f4f5f6f7f8f9faffc4001f0100030101010101010101010000000000000102030405060708090a0bffc400b51100"
    "020102040403040705040400010277000102031104052131061241510761711322328108144291a1b1c109233352f015"
    "6272d10a162434e125f11718191a262728292a35363738393a434445464748494a535455565758595a63646566676869"
    "6a737475767778797a82838485868788898a92939495969798999aa2a3a4a5a6a7a8a9aab2b3b4b5b6b7b8b9bac2c3c4"
    "c5c6c7c8c9cad2d3d4d5d6d7d8d9dae2e3e4e5e6e7e8e9eaf2f3f4f5f6f7f8f9faffda000c03010002110311003f00f2"
    "e86cca3fc8a1995b19ce403c75cf1efdaa592058dfca01f62f04120e32700fe27f415b46da4892658bcadec02e06386e"
    "9db00f4247b7a524762269118ee03e653839ed8c107d87f2c7435f459ae7aa2bd8517fd7f5ea70e0b15af319096866cc"
    "91a49d380d8ceeee0639ebf8fe75a967a69de7f76319f94ee3cfa7f8fe3deb6ac74a58d657894499dbfc38c743918ebe"
    "a7a56b47a6c7949485040030a3391cf272781c9fd39e2bcecbf0b7fdfd67f79f4d85cc13b24f4316dec8ac4bba33bc01"
    "d010a7b7f9e7f954cb0e58ac8a0b85041dd9dc3a67a71d3f2fceb5cc0c9046b06d119185dd96c124679fcb1edf5a9069"
    "be736f10bc6ae40562305464756f43fcfa74ae6ce33c8b6e8513e93058bee6245624be4ee5763b573f45279e9c1e38ad"
    "8b3d1bcf04843e61c22e1304f5ce3271d4fe59c56b5b69230778dbdd71d720f4f7fafd3a76d3fb1b22950c6307024214"
    "f23ae7f5eded5c197e15cbf7d599f84d0cc7a232e3b36825198d03b00a46c1807a8cfbf3fcbad2ac28494c2f94ed820f"
    "20e463a63fcf3f8eccb6a19c34a3729273c01c13d3a73d71d0fa5482d19a4dd2297000209e08fe9efebc57366d9f3fe0"
    "50fc0fa2c0e22c644164b2396403905b714046080d91ebff00d6eb5a76ba466448873d4819e3038cf4e98e6b62d74d57"
    "6cb404e400847cd8e4e3af503038f63d2b522b28a089c8466908e41ee0e3a8ebfd79ae2cbf0d6fdf5667d3e1f31be88f"
    "ffd9"),
    "color444-40x24": bytes.fromhex(
    "ffd8ffe000104a46494600010100000100010000ffdb004300080606070605080707070909080a0c140d0c0b0b0c1912"
    "130f141d1a1f1e1d1a1c1c20242e2720222c231c1c2837292c30313434341f27393d38323c2e333432ffdb0043010909"
    "090c0b0c180d0d1832211c21323232323232323232323232323232323232323232323232323232323232323232323232"
    "3232323232323232323232323232ffc00011080018002803011100021101031101ffc4001f0000010501010101010100"
    "000000000000000102030405060708090a0bffc400b5100002010303020403050504040000017d010203000411051221"
    "31410613516107227114328191a1082342b1c11552d1f02433627282090a161718191a25262728292a3435363738393a"
    "434445464748494a535455565758595a636465666768696a737475767778797a838485868788898a9293949596979899"
    "9aa2a3a4a5a6a7a8a9aab2b3b4b5b6b7b8b9bac2c3c4c5c6c7c8c9cad2d3d4d5d6d7d8d9dae1e2e3e4e5e6e7e8e9eaf1"
    "f2f3f4f5f6f7f8f9faffc4001f0100030101010101010101010000000000000102030405060708090a0bffc400b51100"
    "020102040403040705040400010277000102031104052131061241510761711322328108144291a1b1c109233352f015"
    "6272d10a162434e125f11718191a262728292a35363738393a434445464748494a535455565758595a63646566676869"
    "6a737475767778797a82838485868788898a92939495969798999aa2a3a4a5a6a7a8a9aab2b3b4b5b6b7b8b9bac2c3c4"
    "c5c6c7c8c9cad2d3d4d5d6d7d8d9dae2e3e4e5e6e7e8e9eaf2f3f4f5f6f7f8f9faffda000c03010002110311003f00f3"
    "45d31a262a086f94739e00f97ffd55fa642a468c1df4b7dfd8f22962baafeb7ff87e8583a73e5e34276c7f333819e39e"
    "7b63e84735f379a67718c6f07abdb5f3fc7cfef3e83095a31e9b7e16b12c5a7bbc8a0265b192067a0e7231ebc73ea7b7"
    "5af8e9626a622574efd3fabb7a7fc1f33dea15a2a3676b69ff00076bff0048d7b0d1ccae8bf7074c15f9893d88e3db8e"
    "febc66bd6c0e15fc6d5efb7f5f93f9791e8d3c524ecf4b795b4feaf7b9b369605627df101840430e83a723f4fcfaf63f"
    "415ea53a30bafcfd7cbfab58edc3e2572a5195d7ebe6fcfe7fe59bf633242a802e493bc8ceec8e00e7838e3bff00315e"
    "4e699b28f338bd3f3bfa7f57f43f0ec2e21c5f35edf77aff00c1dbf2189a6ef54004aa390b838cf6fa9e879f4af8f962"
    "2a6226f54de87b94f10a3f16ebbdfcb5b7ddd7c8dab1d1cc6cd2154f98f5719c75c1fcc7e15ec60706e52e56add7d7b7"
    "4e9fd5cf5218f83717ae9f8faff5f79b5069a61122c6e7cc560c370e4f738e9cf41fe1dfe8fdb428d3575fd79febfd5b"
    "b29629b76e9b7f5dbfaeab594e9e909fdda908e40fbb92781918ea78078e7bf4af90ccb36e7838adfd745dbe7e7dbef3"
    "ddc2d44baebbf6f5b3fe97a943fb395e58b7c6a171962460f19fff0057e5f43e04b112abcc96b7fcbf4f4d3fcbf10c3d"
    "7d1b6dafeada7e7fadcd5b1d14a2282adb89c05c82063afa633e9d307eb5ed60708a4ef24bfaff00875bfe276ac5d972"
    "dffafeb7eafef36edf4b8d1b206573f788c67a11fd3b77f7afa0f6d1a34eed5b4e9f73fe976f43d1862a52b735eeba7d"
    "f7eda7912bda19001f3050b8704f2083d80e9faf6fad7c9e639d4a4b953fc7fafebd55fddc1d754f4bbf5f2d2febff00"
    "00960d3a477daf2ef01b77ca7a0ebfa7181fd057c8ceabaf36e2f7fcff00a7bfcfbdbdba7554135fe5fd7de7ffd9"),
}


def _damage_tiled(tiled: bytes) -> dict[str, tuple[bytes, str, str, list[int] | None, str]]:
    """name -> (bytes, rule, outcome, window, description) for the damaged tiled JPEGs."""
    from packer.codecs.tiles import TILE_SIGNATURE

    table_end = 4 + struct.unpack(">H", tiled[4:6])[0]
    assert tiled[6:14] == TILE_SIGNATURE
    app0_end = table_end + 2 + struct.unpack(">H", tiled[table_end + 2:table_end + 4])[0]
    moved = tiled[:2] + tiled[table_end:app0_end] + tiled[2:table_end] + tiled[app0_end:]
    lengths = 2 + 4 + 18
    last = table_end - 2
    off_by_one = bytearray(tiled)
    off_by_one[last:last + 2] = struct.pack(">H", struct.unpack(">H", tiled[last:last + 2])[0] + 1)
    shifted = bytearray(tiled)
    first, second = struct.unpack(">HH", tiled[lengths:lengths + 4])
    shifted[lengths:lengths + 4] = struct.pack(">HH", first - 1, second + 1)
    return {
        "tables-not-first": (moved, "T1", "whole", None,
                             "the PKTILES segment moved after APP0: not a tiled JPEG"),
        "last-length-plus-one": (bytes(off_by_one), "T2", "whole", None,
                                 "the last tile's length is one too many: the lengths do not add "
                                 "up to the file"),
        "tile-boundary-shifted": (bytes(shifted), "T3", "window-refused", [1, 2, 0, 1],
                                  "one byte moved from tile 0's length to tile 1's: the total "
                                  "adds up, but tile 1 does not start after a marker"),
    }


def make_tiled(folder: Path) -> None:
    """Tiled JPEGs of the fixed sources, their layouts and windows, and three damaged ones."""
    from packer.codecs.tiles import read_layout, transcode, window_jpeg

    folder.mkdir()
    expected: dict[str, Any] = {"images": {}, "damaged": {}}
    for name, source in TILED_SOURCES.items():
        tiled = transcode(source, max_pixels=1 << 20)
        (folder / f"{name}.source.jpg").write_bytes(source)
        (folder / f"{name}.tiled.jpg").write_bytes(tiled)
        layout = read_layout(tiled)
        assert layout is not None, name
        columns, rows = layout.columns, layout.rows
        windows = []
        for window in ((0, columns, 0, rows), (0, 1, 0, 1), (columns - 1, columns, rows - 1, rows),
                       (columns // 2, columns, 0, rows), (0, columns, rows // 2, rows)):
            if window[0] >= window[1] or window[2] >= window[3]:
                continue
            data, x, y = window_jpeg(tiled, layout, *window)
            windows.append({"tiles": list(window), "x": x, "y": y, "size": len(data),
                            "xxh3": fmt.checksum_hex(fmt.checksum(bytes(data)))})
        expected["images"][name] = {
            "source_xxh3": fmt.checksum_hex(fmt.checksum(source)),
            "tiled_xxh3": fmt.checksum_hex(fmt.checksum(tiled)),
            "width": layout.width, "height": layout.height, "tile_width": layout.tile_width,
            "tile_height": layout.tile_height, "columns": columns, "rows": rows,
            "lengths": [int(v) for v in layout.lengths], "windows": windows}
    tiled = (folder / "color420-48x32.tiled.jpg").read_bytes()
    for name, (data, rule, outcome, window, description) in _damage_tiled(tiled).items():
        (folder / f"damaged-{name}.jpg").write_bytes(data)
        layout = read_layout(data)
        assert (layout is None) == (outcome == "whole"), name
        expected["damaged"][name] = {"file": f"damaged-{name}.jpg", "rule": rule,
                                     "outcome": outcome, "window": window,
                                     "description": description}
    _write_json(folder / "expected.json", expected)


# --- perceptual-hashes file (section 16) ----------------------------------------------------------

#: The valid hashes file's identity and table: three samples (hashed, flat, unreadable).
HASHES_INDEX_CHECKSUM = 0x0123456789ABCDEF
HASHES_TABLE = ([[0x8000000000000001, 0x00FF00FF00FF00FF], [0, 0], [0, 0]], [0, 1, 2])


def _hashes_damage(valid: bytes) -> dict[str, tuple[bytes, str, str, str, str]]:
    """name -> (bytes, requirement, error, message fragment, description) for the invalid files."""
    from packer.duplicates import sidecar

    def header(fmt_char: str, at: int, value: int) -> bytes:
        data = bytearray(valid)
        struct.pack_into("<" + fmt_char, data, at, value)
        return bytes(data)

    def reseal(data: bytearray) -> bytes:  # keep the table checksum right, so only the damage is seen
        struct.pack_into("<Q", data, 32, fmt.checksum(bytes(data[sidecar.HEADER:])))
        return bytes(data)

    flipped = bytearray(valid)
    flipped[sidecar.HEADER] ^= 0x01
    bad_status = bytearray(valid)
    bad_status[sidecar.HEADER + 3 * 16 + 1] = 7
    return {
        "empty": (b"", "H1", "NotAPackerFileError", "not a packer hashes file", "an empty file"),
        "short-header": (valid[:40], "H1", "TruncatedFileError", "shorter than its 64-byte header",
                         "the first 40 bytes of a valid file"),
        "wrong-magic": (b"PKINDEX\x00" + valid[8:], "H2", "NotAPackerFileError", "not a packer hashes file",
                        "the magic of an index file"),
        "version-2": (header("I", 8, 2), "H3", "UnsupportedVersionError", "hashes file version 2", "version 2"),
        "algorithm-9": (header("I", 12, 9), "H4", "UnsupportedVersionError", "hash algorithm 9", "algorithm 9"),
        "three-words": (header("I", 40, 3), "H5", "CorruptHeaderError", "expected at most",
                        "hash_words is 3"),
        "truncated": (valid[:-8], "H6", "TruncatedFileError", "(truncated)", "the last 8 bytes cut"),
        "extended": (valid + bytes(8), "H6", "TruncatedFileError", "(extended)", "8 zero bytes appended"),
        "table-flipped": (bytes(flipped), "H7", "ChecksumMismatchError", "hashes table checksum mismatch",
                          "one bit of sample 0's hash flipped, the header's table checksum unchanged"),
        "status-7": (reseal(bad_status), "H8", "CorruptHeaderError", "status 7 is not one of",
                     "sample 1's status is 7 (table checksum updated)"),
        "other-generation": (valid, "H9", "IndexMismatchError", "stale hashes",
                             "a valid file read for a dataset whose index checksum is 0123456789abcdee"),
    }


def make_hashes(folder: Path) -> None:
    """A valid perceptual-hashes file and one damaged copy per reader rule H1-H9 (SPEC §16)."""
    from packer.duplicates.phash import HashTable
    from packer.duplicates.sidecar import encode_hashes

    folder.mkdir()
    hashes, status = HASHES_TABLE
    table = HashTable(hashes=np.array(hashes, dtype=np.uint64), status=np.array(status, dtype=np.uint8))
    valid = encode_hashes(table, HASHES_INDEX_CHECKSUM)
    (folder / "valid.pkh").write_bytes(valid)
    expected: dict[str, Any] = {
        "valid": {"file": "valid.pkh", "index_checksum": fmt.checksum_hex(HASHES_INDEX_CHECKSUM),
                  "sample_count": len(status), "hashes": [[f"{w:016x}" for w in row] for row in hashes],
                  "status": status},
        "invalid": {}}
    for name, (data, requirement, error, message, description) in _hashes_damage(valid).items():
        (folder / f"{name}.pkh").write_bytes(data)
        expected["invalid"][name] = {
            "file": f"{name}.pkh", "requirement": requirement, "error": error, "message": message,
            "description": description,
            "index_checksum": fmt.checksum_hex(HASHES_INDEX_CHECKSUM - (name == "other-generation")),
            "sample_count": len(status)}
    _write_json(folder / "expected.json", expected)


# --- view file (section 17) ------------------------------------------------------------------------

#: The valid view selects samples 0 and 2 of ``valid/base-align512`` (three samples).
VIEW_BASE = "../valid/base-align512"
VIEW_SELECTED = [0, 2]
VIEW_SELECTORS = [{"keys": ["cat/a.png", "dog/c.bmp"]}]


def _views_damage(valid: bytes) -> dict[str, tuple[bytes, str, str, str, str, str]]:
    """name -> (bytes, requirement, error, message fragment, stage, description) for the invalid view files;
    stage ``parse`` (``parse_view`` raises) or ``open`` (the file parses; opening it against its base raises)."""
    from packer import viewfile

    def header(fmt_char: str, at: int, value: int) -> bytes:
        data = bytearray(valid)
        struct.pack_into("<" + fmt_char, data, at, value)
        return bytes(data)

    def reseal(data: bytearray) -> bytes:  # keep the checksum right, so only the damage is seen
        struct.pack_into("<Q", data, 56, fmt.checksum(bytes(data[viewfile.HEADER:])))
        return bytes(data)

    flipped = bytearray(valid)
    flipped[viewfile.HEADER + 1] ^= 0x01
    unsorted = bytearray(valid)
    struct.pack_into("<QQ", unsorted, viewfile.HEADER, 2, 0)
    outside = bytearray(valid)
    struct.pack_into("<Q", outside, viewfile.HEADER + 8, 3)
    description = bytearray(valid)
    at = viewfile.HEADER + 16
    description[at:at + 1] = b"["
    return {
        "empty": (b"", "V1", "NotAPackerFileError", "not a packer view file", "parse", "an empty file"),
        "short-header": (valid[:40], "V1", "TruncatedFileError", "shorter than its 64-byte header", "parse",
                         "the first 40 bytes of a valid file"),
        "wrong-magic": (b"PKHASH\x00\x00" + valid[8:], "V2", "NotAPackerFileError", "not a packer view file", "parse",
                        "the magic of a hashes file"),
        "version-2": (header("I", 8, 2), "V3", "UnsupportedVersionError", "view file version 2", "parse", "version 2"),
        "reserved": (header("I", 12, 1), "V4", "CorruptHeaderError", "reserved 1", "parse", "reserved field 1"),
        "more-than-base": (header("Q", 16, 1), "V4", "CorruptHeaderError", "expected at most as many selected",
                           "parse", "2 selected of a base of 1 sample"),
        "truncated": (valid[:-8], "V5", "TruncatedFileError", "(truncated)", "parse", "the last 8 bytes cut"),
        "extended": (valid + bytes(8), "V5", "TruncatedFileError", "(extended)", "parse", "8 zero bytes appended"),
        "body-flipped": (bytes(flipped), "V6", "ChecksumMismatchError", "view file checksum mismatch", "parse",
                         "one bit of the first sample number flipped, the checksum unchanged"),
        "unsorted": (reseal(unsorted), "V7", "CorruptHeaderError", "strictly ascending", "parse",
                     "sample numbers 2, 0 (checksum updated)"),
        "outside": (reseal(outside), "V7", "CorruptHeaderError", "selects sample 3 of a base of 3 samples", "parse",
                    "sample number 3 of a base of 3 (checksum updated)"),
        "description": (reseal(description), "V8", "CorruptHeaderError", "description is not a JSON object", "parse",
                         "the description's first byte is '[' (checksum updated)"),
        "other-rows": (header("Q", 24, 1), "V9", "IndexMismatchError", "view of", "open",
                       "rows_checksum 1: the base's rows are other samples"),
        "bigger-base": (header("Q", 16, 4), "V9", "IndexMismatchError", "was made of its 4 samples, but the dataset "
                        "now holds 3", "open", "base_samples 4: the base holds 3"),
    }


def make_views(folder: Path, base: Path) -> None:
    """A valid view of ``valid/base-align512`` and one damaged copy per reader rule V1-V9 (SPEC §17)."""
    from packer.dataset import open_index
    from packer.viewfile import ViewFile, encode_view, rows_checksum

    folder.mkdir()
    with open_index(base) as index:
        count = len(index)
        identity = {"base_samples": count, "rows_checksum": rows_checksum(index.index, count),
                    "index_checksum": index.manifest.index.checksum}
        keys = [index.key(i) for i in VIEW_SELECTED]
    valid = encode_view(ViewFile(base=VIEW_BASE, selected=np.array(VIEW_SELECTED, dtype=np.uint64),
                                 selectors=tuple(VIEW_SELECTORS), **identity))
    (folder / "valid.pkview").write_bytes(valid)
    expected: dict[str, Any] = {
        "valid": {"file": "valid.pkview", "base": VIEW_BASE, "selected": VIEW_SELECTED, "keys": keys,
                  "base_samples": count, "rows_checksum": fmt.checksum_hex(identity["rows_checksum"]),
                  "selectors": VIEW_SELECTORS},
        "invalid": {}}
    for name, (data, requirement, error, message, stage, description) in _views_damage(valid).items():
        (folder / f"{name}.pkview").write_bytes(data)
        expected["invalid"][name] = {"file": f"{name}.pkview", "requirement": requirement, "error": error,
                                     "message": message, "stage": stage, "description": description}
    _write_json(folder / "expected.json", expected)


def generate(out: Path) -> None:
    """Write every vector under ``out`` (which must not exist), and a README listing them."""
    out = Path(out)
    out.mkdir(parents=True)
    valid, invalid = out / "valid", out / "invalid"
    valid.mkdir()
    invalid.mkdir()
    with tempfile.TemporaryDirectory(prefix="packer-vectors-") as tmp:
        for name, maker in VALID.items():
            maker(valid / name, Path(tmp))
        make_unknown_fields(valid / "unknown-fields", valid / "base-align512")
    make_tiled(out / "tiled")
    make_hashes(out / "hashes")
    make_views(out / "views", valid / "base-align512")
    for name, (requirement, error, message, stage, description, mutate) in {**INVALID, **FIELD_INVALID}.items():
        base = "fields" if name in FIELD_INVALID else "base-align512"
        folder = invalid / name
        shutil.copytree(valid / base, folder, symlinks=True,
                        ignore=shutil.ignore_patterns("expected.json", fmt.REPORT_NAME))
        mutate(folder)
        expected = {"base": base, "error": error, "message": message, "requirement": requirement, "stage": stage,
                    "description": description}
        try:
            _check_invalid(folder, expected)
        except AssertionError as exc:
            raise SystemExit(f"invalid vector {name}: expected {error} ({message!r}) at {stage}, but {exc}")
        _write_json(folder / "expected.json", expected)
    _write_readme(out)


def _write_readme(out: Path) -> None:
    lines = [
        "# Test vectors (generated: do not edit)",
        "",
        "Produced by `python scripts/make_vectors.py` from fixed input bytes; `tests/format/test_vectors.py`",
        "regenerates them and compares the trees byte for byte, then reads every vector. See",
        "formats/SPEC.md section 12.",
        "",
        "- `valid/<name>/`: a dataset that MUST open; `expected.json` lists every sample in dataset",
        "  order (key, label, size, xxh3 of the bytes, image_format, width, height, channels, metadata)",
        "  and, for a dataset with declared fields (`valid/fields`), the declarations and each sample's",
        "  field values (`fields`).",
        "- `invalid/<name>/`: a valid vector (`base` in `expected.json`: `valid/base-align512`, or",
        "  `valid/fields` for the `fields-*` vectors) damaged in one way; `expected.json` gives the error",
        "  class, a fragment of its message, the requirement id and the stage: `open` (opening raises),",
        "  `read` (opening works, reading every sample and every field value raises: shards and field",
        "  shards are opened lazily) or `verify` (reading with sample checksums on raises).",
        "",
        "## Valid",
        "",
    ]
    for folder in sorted((out / "valid").iterdir()):
        description = json.loads((folder / "expected.json").read_bytes())["description"]
        lines.append(f"- `{folder.name}`: {description}")
    lines += ["", "## Invalid", "", "| Vector | Requirement | Error | Stage | Damage |", "|---|---|---|---|---|"]
    for name, (requirement, error, _message, stage, description, _) in sorted(
            {**INVALID, **FIELD_INVALID}.items(), key=lambda item: (int(item[1][0][1:]), item[0])):
        lines.append(f"| `{name}` | {requirement} | `{error}` | {stage} | {description} |")
    lines += ["", "## Tiled JPEG (section 13)", "",
              "`tiled/`: for each fixed source `NAME.source.jpg`, `NAME.tiled.jpg` is what",
              "`packer.codecs.tiles.transcode` MUST write (byte for byte; it decodes to the source's pixels).",
              "`expected.json` gives each tiled JPEG's layout (size, tile size, columns, rows, every",
              "tile length) and windows cut from it (tiles `[c0, c1, r0, r1]`, origin, size, xxh3 of the",
              "window JPEG). `damaged-*.jpg` break one reader rule each; `outcome` is `whole` (not used",
              "as tiled: decode it whole) or `window-refused` (cutting `window` MUST be refused).", ""]
    for name, (_, rule, outcome, _, description) in sorted(
            _damage_tiled((out / "tiled" / "color420-48x32.tiled.jpg").read_bytes()).items()):
        lines.append(f"- `damaged-{name}.jpg` ({rule}, {outcome}): {description}")
    lines += ["", "## Perceptual-hashes file (section 16)", "",
              "`hashes/valid.pkh` is a valid file of three samples (hashed, flat, unreadable); `expected.json`",
              "gives its identity, hashes and statuses. Each other file breaks one reader rule; reading it",
              "with the identity given MUST raise the error named.", ""]
    valid = (out / "hashes" / "valid.pkh").read_bytes()
    for name, (_, requirement, error, _, description) in _hashes_damage(valid).items():
        lines.append(f"- `{name}.pkh` ({requirement}, `{error}`): {description}")
    lines += ["", "## View file (section 17)", "",
              "`views/valid.pkview` is a view of samples 0 and 2 of `valid/base-align512`; `expected.json`",
              "gives its base, numbers and keys. Each other file breaks one reader rule: at stage `parse`",
              "reading it MUST raise the error named, at `open` opening it against its base MUST.", ""]
    valid = (out / "views" / "valid.pkview").read_bytes()
    for name, (_, requirement, error, _, stage, description) in _views_damage(valid).items():
        lines.append(f"- `{name}.pkview` ({requirement}, {stage}, `{error}`): {description}")
    (out / "README.md").write_bytes(("\n".join(lines) + "\n").encode("utf-8"))


def _tree(root: Path) -> dict[str, tuple[str, bytes]]:
    """relative path -> ("file", bytes) or ("link", target), without following links."""
    entries: dict[str, tuple[str, bytes]] = {}
    for folder, dirs, files in os.walk(root):
        for name in sorted(dirs + files):
            path = Path(folder) / name
            relative = path.relative_to(root).as_posix()
            if path.is_symlink():
                entries[relative] = ("link", os.readlink(path).encode())
            elif path.is_file():
                entries[relative] = ("file", path.read_bytes())
    return entries


def compare_trees(expected: Path, got: Path) -> list[str]:
    """Differences between two vector trees (empty when byte-identical, links compared as links)."""
    a, b = _tree(expected), _tree(got)
    problems = [f"only in {expected}: {p}" for p in sorted(a.keys() - b.keys())]
    problems += [f"only in {got}: {p}" for p in sorted(b.keys() - a.keys())]
    problems += [f"differs: {p}" for p in sorted(a.keys() & b.keys()) if a[p] != b[p]]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder to (re)write (default: formats/vectors)")
    parser.add_argument("--check", action="store_true", help="compare a fresh generation with --out; write nothing")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="packer-vectors-") as tmp:
        fresh = Path(tmp) / "vectors"
        generate(fresh)
        if args.check:
            problems = compare_trees(args.out, fresh)
            for line in problems:
                print(line, file=sys.stderr)
            print("vectors are up to date" if not problems else f"{len(problems)} difference(s)", file=sys.stderr)
            return 1 if problems else 0
        if args.out.exists():
            shutil.rmtree(args.out)
        shutil.copytree(fresh, args.out, symlinks=True)
    total = sum(len(data) for _, data in _tree(args.out).values())
    print(f"wrote {len(VALID) + 1} valid and {len(INVALID) + len(FIELD_INVALID)} invalid vectors to {args.out} "
          f"({total} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
