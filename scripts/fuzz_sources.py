"""Structure-aware fuzzing of the source doors: every input packs or is refused with a PackerError.

    python scripts/fuzz_sources.py [--seconds 60] [--seed 0] [--kinds tar,zip,webdataset,parquet,coco]
                                   [--keep FOLDER] [--json]

Each case builds a source the way a hostile or broken one looks, not as random bytes: tar
headers with lying sizes, bad checksums, links, devices, odd names, concatenated parts, class
tars inside tars, compressed or cut streams; zip central directories whose entries overlap,
point outside the file, declare terabytes, zip64 extras, encryption, unknown methods; WebDataset
member sets with repeated, missing, oversized or malformed label and metadata members, with and
without declared fields; Parquet schemas with every column type in the label and image places,
null and huge values, ClassLabel metadata that repeats, is deep or is not a list; COCO documents
with every member of the wrong type. Each case is built with ``packer.writer.build`` (one
worker, in this process) and must end in one of two ways:

* a dataset that opens and reads back (every sample's bytes), or
* a ``PackerError`` (typed, with a message);

never another exception, a hang (``--case-seconds``, SIGALRM) or unbounded memory (the case's
``tracemalloc`` peak is bounded by ``--case-memory``). A failing case's source is kept under
``--keep`` (default: a temporary folder, printed) with the traceback.

The last line printed is ``source fuzzing: {json}`` (cases per kind, outcomes, failures), read
by ``scripts/reliability_report.py``; ``tests/sources/test_fuzz_sources.py`` runs a bounded
pass in CI. The builders (``tar_header``, ``zip_archive``, ...) are importable for tests.
"""

from __future__ import annotations

import argparse
import bz2
import gzip
import io
import json
import lzma
import os
import random
import shutil
import signal
import struct
import sys
import tempfile
import time
import tracemalloc
import traceback
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

REPO = Path(__file__).resolve().parents[1]
try:  # the packer on the path (an install, PYTHONPATH), else this checkout's
    import packer  # noqa: F401
except ImportError:
    sys.path.insert(0, str(REPO))

KINDS = ("tar", "zip", "webdataset", "parquet", "coco")


# --- images ----------------------------------------------------------------------------------------

def images(count: int = 6, seed: int = 0) -> list[bytes]:
    """Small valid JPEG and PNG files."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        buffer = io.BytesIO()
        pixels = rng.integers(0, 255, (8 + i, 10, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(buffer, "JPEG" if i % 2 else "PNG")
        out.append(buffer.getvalue())
    return out


# --- tar ----------------------------------------------------------------------------------------------

def _octal(value: int, width: int) -> bytes:
    return (b"%0*o" % (width - 1, value))[-(width - 1):] + b"\x00"


def tar_header(name: bytes, size: int, *, kind: bytes = b"0", linkname: bytes = b"", mode: int = 0o644,
               size_field: bytes | None = None, checksum: bool = True, magic: bytes = b"ustar\x0000") -> bytes:
    """One 512-byte ustar header; ``size_field`` replaces the size's 12 bytes as written (a lie,
    garbage, base-256), ``checksum=False`` leaves a wrong checksum."""
    block = bytearray(512)
    block[0:100] = name[:100].ljust(100, b"\x00")
    block[100:108] = _octal(mode, 8)
    block[108:116] = _octal(0, 8)
    block[116:124] = _octal(0, 8)
    block[124:136] = size_field if size_field is not None else _octal(size, 12)
    block[136:148] = _octal(0, 12)
    block[148:156] = b" " * 8
    block[156:157] = kind
    block[157:257] = linkname[:100].ljust(100, b"\x00")
    block[257:265] = magic[:8].ljust(8, b"\x00")
    total = sum(block) + (0 if checksum else 7)
    block[148:156] = b"%06o\x00 " % (total & 0o777777)
    return bytes(block)


def tar_member(name: bytes, data: bytes, **header: Any) -> bytes:
    """A header and its data padded to 512 bytes (``header``: ``tar_header``'s options)."""
    return tar_header(name, len(data), **header) + data + b"\x00" * (-len(data) % 512)


def tar_archive(members: list[bytes], *, end: bool = True) -> bytes:
    """Members (``tar_member``) and the end-of-archive marker."""
    return b"".join(members) + (b"\x00" * 1024 if end else b"")


# --- zip ----------------------------------------------------------------------------------------------

@dataclass
class ZipEntry:
    """One zip member, and what its central directory entry claims about it.

    ``points_to``: the index of another entry whose local header this entry's directory record
    names (overlapping members); ``header_offset``/``compress_size``/``file_size``/``crc``
    override the claims; ``zip64``: the sizes (and offset) go in a zip64 extra field.
    """

    name: bytes
    data: bytes
    method: int = 0  # 0 stored, 8 deflated
    flags: int = 0
    points_to: int | None = None
    header_offset: int | None = None
    compress_size: int | None = None
    file_size: int | None = None
    crc: int | None = None
    zip64: bool = False
    external_attr: int = 0o100644 << 16


def zip_archive(entries: list[ZipEntry], *, comment: bytes = b"", cut_directory: int = 0) -> bytes:
    """Local headers and data, then a central directory saying whatever each entry claims."""
    out = bytearray()
    where: list[int] = []
    stored: list[tuple[bytes, int]] = []
    for entry in entries:
        payload = entry.data
        if entry.method == 8:
            compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
            payload = compressor.compress(entry.data) + compressor.flush()
        crc = zlib.crc32(entry.data)
        where.append(len(out))
        stored.append((payload, crc))
        out += struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, entry.flags, entry.method, 0, 0, crc,
                           len(payload), len(entry.data), len(entry.name), 0)
        out += entry.name + payload
    directory = bytearray()
    for number, entry in enumerate(entries):
        payload, crc = stored[number]
        offset = where[entry.points_to] if entry.points_to is not None else where[number]
        offset = entry.header_offset if entry.header_offset is not None else offset
        compress = entry.compress_size if entry.compress_size is not None else len(payload)
        size = entry.file_size if entry.file_size is not None else len(entry.data)
        crc = entry.crc if entry.crc is not None else crc
        extra = b""
        if entry.zip64 or compress >= 0xFFFFFFFF or size >= 0xFFFFFFFF or offset >= 0xFFFFFFFF:
            extra = struct.pack("<HHQQQ", 1, 24, size, compress, offset)
            size32 = compress32 = offset32 = 0xFFFFFFFF
        else:
            size32, compress32, offset32 = size, compress, offset
        directory += struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 45, 20, entry.flags, entry.method, 0, 0,
                                 crc & 0xFFFFFFFF, compress32 & 0xFFFFFFFF, size32 & 0xFFFFFFFF, len(entry.name),
                                 len(extra), 0, 0, 0, entry.external_attr & 0xFFFFFFFF, offset32 & 0xFFFFFFFF)
        directory += entry.name + extra
    start = len(out)
    if cut_directory:
        directory = directory[:-cut_directory]
    out += directory
    out += struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, len(entries) & 0xFFFF, len(entries) & 0xFFFF,
                       len(directory), start, len(comment)) + comment
    return bytes(out)


# --- the generators: one case = a source on disk and how to build it ------------------------------

@dataclass
class Case:
    kind: str
    source: Path
    options: dict[str, Any] = field(default_factory=dict)   # settings by their flat names (shard_size, classes, ...)
    build: dict[str, Any] = field(default_factory=dict)     # source settings (source_kind, root, label_field, ...)


_NAMES = [b"cat/a.jpg", b"dog/b.png", b"cat/../x.jpg", b"/abs.jpg", b".hidden/c.jpg", b"cat/.DS_Store",
          b"top.jpg", b"cat/caf\xe9.jpg", b"cat/", b"", b"a" * 99, b"cat/x.jpg\x00y", b"emu/e.jpg", b"cat/a.jpg",
          "cat/ünï.jpg".encode(), b"c:\\win.jpg", b"cat/d.txt", b"cat/inner.tar"]


def _member_data(rng: random.Random, pool: list[bytes]) -> bytes:
    choice = rng.random()
    if choice < 0.8:
        return rng.choice(pool)
    if choice < 0.87:
        return bytes(rng.randrange(0, 3000))
    if choice < 0.94:
        return rng.choice(pool)[: rng.randrange(1, 200)]
    return rng.randbytes(rng.randrange(0, 2000))


def gen_tar(rng: random.Random, folder: Path, pool: list[bytes]) -> Case:
    members = []
    hostile = rng.random() < 0.5  # half the cases are sound archives with odd members
    for _ in range(rng.randrange(0, 9)):
        name = rng.choice(_NAMES) if hostile or rng.random() < 0.3 else rng.choice(_NAMES[:2] + _NAMES[12:13])
        data = _member_data(rng, pool)
        header: dict[str, Any] = {}
        roll = rng.random() if hostile else 0.3 + 0.7 * rng.random()
        if roll < 0.08:
            header["kind"] = rng.choice([b"1", b"2", b"3", b"4", b"5", b"6", b"S", b"x", b"g", b"L", b"K", b"7", b"Z"])
            header["linkname"] = rng.choice([b"cat/a.jpg", b"/etc/passwd", b"../../x"])
        elif roll < 0.16:
            lie = rng.choice([len(data) + rng.randrange(1, 5000), max(0, len(data) - rng.randrange(1, 600)),
                              1 << 40, (1 << 63) - 1])
            header["size_field"] = _octal(lie, 12) if lie < 8 ** 11 else b"\x80" + lie.to_bytes(11, "big")
        elif roll < 0.2:
            header["size_field"] = rng.choice([b"garbage!!!!\x00", b"\xff" * 12, b"-1\x00" + b" " * 9, b"\x00" * 12])
        elif roll < 0.24:
            header["checksum"] = False
        elif roll < 0.27:
            header["magic"] = rng.choice([b"", b"ustar  \x00", b"xxxxxxxx"])
        elif roll < 0.4:  # a class tar, perhaps with a lying inner member
            inner = [tar_member(rng.choice([b"i.jpg", b"j.png", b"../k.jpg", b"l.jpg"]), rng.choice(pool))
                     for _ in range(rng.randrange(1, 4))]
            if rng.random() < 0.5:
                last = inner[-1]
                size = int(last[124:135], 8) + rng.randrange(1, 4000)
                inner[-1] = tar_header(last[:100].rstrip(b"\x00"), size) + last[512:]
            data = tar_archive(inner, end=rng.random() < 0.8)
            name = rng.choice([b"cat.tar", b"dog.tar", b"x/inner.tar"])
        members.append(tar_member(name, data, **header))
    raw = tar_archive(members, end=not hostile or rng.random() < 0.8)
    if rng.random() < 0.15:  # concatenated parts
        raw = raw + tar_archive([tar_member(b"emu/z.jpg", rng.choice(pool))]) + (b"\x00" * rng.randrange(0, 3000))
    if hostile and rng.random() < 0.15:
        raw = raw + rng.randbytes(rng.randrange(1, 1200))  # trailing garbage
    if hostile and rng.random() < 0.15:
        raw = raw[: rng.randrange(0, len(raw) + 1)]  # cut anywhere
    compression = rng.choice([None, None, None, "gz", "bz2", "xz"])
    suffix = ".tar"
    if compression == "gz":
        raw = gzip.compress(raw) + (gzip.compress(tar_archive([tar_member(b"owl/o.jpg", pool[0])]))
                                   if rng.random() < 0.3 else b"")
        suffix += ".gz"
    elif compression == "bz2":
        raw, suffix = bz2.compress(raw), suffix + ".bz2"
    elif compression == "xz":
        raw, suffix = lzma.compress(raw), suffix + ".xz"
    if compression and hostile and rng.random() < 0.15:
        raw = raw[: rng.randrange(0, len(raw) + 1)]
    path = folder / f"source{suffix}"
    path.write_bytes(raw)
    kind = rng.choice(["auto", "auto", "tar", "webdataset"])
    return Case("tar", path, _rules(rng), {"source_kind": kind})


def gen_zip(rng: random.Random, folder: Path, pool: list[bytes]) -> Case:
    entries = []
    for number in range(rng.randrange(0, 8)):
        entry = ZipEntry(rng.choice(_NAMES), _member_data(rng, pool), method=rng.choice([0, 8]))
        roll = rng.random()
        if roll < 0.15 and number:
            entry.points_to = rng.randrange(0, number)  # overlapping members
        elif roll < 0.25:
            entry.compress_size = rng.choice([1 << 40, (1 << 63) - 1, 0, 0xFFFFFFFE, len(entry.data) * 3 + 7])
            entry.zip64 = rng.random() < 0.7
        elif roll < 0.32:
            entry.file_size = rng.choice([1 << 40, 0, 5 << 30, (1 << 64) - 1, len(entry.data) + 1])
            entry.zip64 = True
        elif roll < 0.38:
            entry.header_offset = rng.choice([0, 1, 1 << 40, (1 << 64) - 1, 0xFFFFFFFF - 1])
            entry.zip64 = rng.random() < 0.5
        elif roll < 0.42:
            entry.crc = rng.randrange(0, 1 << 32)
        elif roll < 0.46:
            entry.flags = 1  # encrypted
        elif roll < 0.5:
            entry.method = rng.choice([0, 8])
            entry.external_attr = rng.choice([0o120777 << 16, 0o010644 << 16, 0o040755 << 16, 0])
        elif roll < 0.53:
            entry.method = 99  # unknown (the data is stored)
        entries.append(entry)
    raw = zip_archive(entries, cut_directory=rng.choice([0] * 9 + [rng.randrange(1, 40)]))
    if rng.random() < 0.08:
        raw = raw[: rng.randrange(0, len(raw) + 1)]
    path = folder / "source.zip"
    path.write_bytes(raw)
    return Case("zip", path, _rules(rng), {"source_kind": rng.choice(["auto", "zip"])})


_WDS_SUFFIXES = ["jpg", "png", "cls", "json", "txt", "mask.png", "npy", "JPG", "a.txt", "caption.txt", "jpeg"]
_LABELS = [b"0", b"1", b"7", b" 007\n", b"-3", b"cat", b"dog", b"", b"1_0", b"\xd9\xa3", b"9" * 30,
           b"\xff\xfe", b"3.0"]
_JSON_DOCS = [{"label": 1}, {"label": "cat"}, {"label": None}, {"label": 3.5}, {"label": True}, {"label": ""},
              {"label": [1, 2]}, {"label": 1 << 70}, {"boxes": [[1, 2, 3, 4]]}, {"label": "\ud800"}, [], "x", 5]


def gen_webdataset(rng: random.Random, folder: Path, pool: list[bytes]) -> Case:
    members = []
    for sample in range(rng.randrange(0, 6)):
        key = rng.choice([f"{sample:04d}", f"k/{sample:03d}", "same", "a.b", ""])
        for _ in range(rng.randrange(0, 5) if rng.random() < 0.9 else rng.randrange(20, 80)):
            suffix = rng.choice(_WDS_SUFFIXES)
            if suffix in ("jpg", "png", "JPG", "jpeg", "mask.png"):
                data = _member_data(rng, pool)
            elif suffix == "cls":
                data = rng.choice(_LABELS)
            elif suffix == "json":
                choice = rng.random()
                if choice < 0.7:
                    data = json.dumps(rng.choice(_JSON_DOCS)).encode("utf-8", "surrogatepass")
                elif choice < 0.8:
                    data = b"[" * rng.randrange(60, 3000) + b"]" * 5
                elif choice < 0.9:
                    data = b'{"label": NaN, "x": 1e999}'
                else:
                    data = rng.randbytes(rng.randrange(0, 300))
            else:
                data = rng.choice([b"a caption", "ünï".encode(), b"\xff\xfe", bytes(rng.randrange(0, 3000))])
            header: dict[str, Any] = {}
            if rng.random() < 0.01:
                header["size_field"] = _octal(len(data) + rng.randrange(1, 3000), 12)
            members.append(tar_member(f"{key}.{suffix}".encode(), data, **header))
    raw = tar_archive(members, end=rng.random() < 0.95)
    path = folder / "shard-000000.tar"
    path.write_bytes(gzip.compress(raw) if rng.random() < 0.2 else raw)
    fields: tuple[str, ...] = ()
    if rng.random() < 0.35:
        fields = tuple(rng.sample(["mask=image@mask.png", "caption=text@txt", "boxes=float32[N,4]", "tags=classes",
                                   "w=float32"], rng.randrange(1, 3)))
    rules = _rules(rng)
    if fields:
        rules["fields"] = fields
    return Case("webdataset", path, rules, {"source_kind": rng.choice(["auto", "webdataset"]),
                                            "label_field": rng.choice(["label", "label", "x"])})


def gen_parquet(rng: random.Random, folder: Path, pool: list[bytes]) -> Case:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = rng.randrange(0, 7)
    columns: dict[str, Any] = {}
    image_kind = rng.choice(["struct", "struct", "binary", "binary", "string", "missing", "large_binary"])
    values = [rng.choice(pool + pool + [b"", None, b"not an image"]) for _ in range(rows)]
    if image_kind == "struct":
        paths = [rng.choice([None, "a.jpg", "../x.jpg", "cat/b.png", "", "a.jpg", "x\x00y"]) for _ in range(rows)]
        columns["image"] = pa.array([{"bytes": v, "path": p} for v, p in zip(values, paths)],
                                    type=pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    elif image_kind == "binary":
        columns["img"] = pa.array(values, type=pa.binary())
    elif image_kind == "large_binary":
        columns["jpg"] = pa.array(values, type=pa.large_binary())
    elif image_kind == "string":
        columns["image"] = pa.array([str(v)[:20] if v else None for v in values], type=pa.string())
    label_kind = rng.choice(["int", "int", "str", "str", "bool", "float", "null", "missing", "list", "huge"])
    if label_kind == "int":
        columns["label"] = pa.array([rng.choice([0, 1, 2, 5, -1, None]) for _ in range(rows)], type=pa.int64())
    elif label_kind == "str":
        columns["label"] = pa.array([rng.choice(["cat", "dog", "1", " 1", "", None]) for _ in range(rows)])
    elif label_kind == "bool":
        columns["label"] = pa.array([rng.choice([True, False, None]) for _ in range(rows)])
    elif label_kind == "float":
        columns["label"] = pa.array([rng.choice([1.5, 2.0, None]) for _ in range(rows)])
    elif label_kind == "null":
        columns["label"] = pa.array([None] * rows, type=pa.null())
    elif label_kind == "list":
        columns["label"] = pa.array([[1, 2]] * rows)
    elif label_kind == "huge":
        columns["label"] = pa.array([rng.choice([(1 << 63) - 1, 3]) for _ in range(rows)], type=pa.uint64()) \
            if rows else pa.array([], type=pa.uint64())
    table = pa.table(columns) if columns else pa.table({"other": pa.array([1] * rows)})
    if rng.random() < 0.5:
        names: Any = rng.choice([["cat", "dog", "emu"], ["cat", "cat", "dog"], [], ["a", 3], "cat", None,
                                 ["x\ud800"], [""]])
        hf: Any = {"info": {"features": {"label": {"_type": "ClassLabel", "names": names}}}}
        text = json.dumps(hf, ensure_ascii=True)
        if rng.random() < 0.1:
            text = "[" * 5000
        table = table.replace_schema_metadata({b"huggingface": text.encode()})
    path = folder / "data.parquet"
    pq.write_table(table, path)
    if rng.random() < 0.1:
        raw = path.read_bytes()
        path.write_bytes(raw[: rng.randrange(4, max(5, len(raw)))])
    return Case("parquet", path, _rules(rng), {"source_kind": rng.choice(["auto", "parquet"]),
                                               "image_column": rng.choice([None] * 8 + ["image", "label"])})


def gen_coco(rng: random.Random, folder: Path, pool: list[bytes]) -> Case:
    images_dir = folder / "images"
    images_dir.mkdir()
    for number, data in enumerate(pool[:4]):
        (images_dir / f"{number}.jpg").write_bytes(data)
    junk = [None, "x", 1.5, True, [], {}, -1, 1 << 70, float("nan"), "../0.jpg", "\ud800"]
    images_list: list[Any] = []
    for number in range(rng.randrange(0, 6)):
        entry: Any = {"id": rng.choice([number, number, 0, 1 << 70, "1"]),
                      "file_name": rng.choice([f"{number % 5}.jpg", f"{number}.jpg", "missing.jpg", "../0.jpg", 3])}
        if rng.random() < 0.1:
            entry = rng.choice(junk)
        images_list.append(entry)
    annotations = []
    for _ in range(rng.randrange(0, 8)):
        ann: Any = {"id": rng.randrange(100), "image_id": rng.choice([0, 1, 2, 9, "0", None]),
                    "category_id": rng.choice([1, 2, 3, None, "1"]),
                    "bbox": rng.choice([[1, 2, 3, 4], [0, 0, -1, 2], [1, 2, 3], ["a", 1, 2, 3], [1e39, 0, 1, 1],
                                        [float("nan"), 0, 1, 1], None]),
                    "iscrowd": rng.choice([0, 1, 2, True, None]), "area": rng.choice([1.0, -1, "x", 1e40])}
        if rng.random() < 0.1:
            ann = rng.choice(junk)
        elif rng.random() < 0.85:  # a sound annotation
            ann = {"id": rng.randrange(100), "image_id": rng.randrange(5), "category_id": rng.choice([1, 2]),
                   "bbox": [rng.randrange(5), rng.randrange(5), rng.randrange(1, 9), rng.randrange(1, 9)]}
        annotations.append(ann)
    categories: Any = [{"id": 1, "name": "cat"}, {"id": 2, "name": "dog"}]
    roll = rng.random()
    if roll < 0.05:
        categories = [{"id": 1, "name": "cat"}, {"id": 1, "name": "dog"}]
    elif roll < 0.1:
        categories = [{"id": 1, "name": "cat"}, {"id": 2, "name": "cat"}]
    elif roll < 0.13:
        categories = rng.choice(junk)
    document: Any = {"images": images_list, "annotations": annotations, "categories": categories}
    if rng.random() < 0.1:
        del document[rng.choice(["images", "annotations", "categories"])]
    text = json.dumps(document, allow_nan=True).encode("utf-8", "surrogatepass")
    roll = rng.random()
    if roll < 0.05:
        text = b'{"images": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    elif roll < 0.1:
        text = text[: rng.randrange(0, len(text) + 1)]
    path = folder / "instances.json"
    path.write_bytes(text)
    rules = _rules(rng)
    rules.pop("classes", None) if rng.random() < 0.8 else None
    return Case("coco", path, rules, {"root": images_dir, "source_kind": rng.choice(["auto", "coco"])})


def _rules(rng: random.Random) -> dict[str, Any]:
    """The contract's options, varied: class lists, label types, limits."""
    rules: dict[str, Any] = {"shard_size": rng.choice([8192, 1 << 20])}
    roll = rng.random()
    if roll < 0.2:
        rules["classes"] = rng.choice([("cat", "dog"), ("dog", "cat", "emu"), ("0", "1")])
    if rng.random() < 0.2:
        rules["label_type"] = rng.choice(["int", "str"])
    if rng.random() < 0.1:
        rules["max_file_size"] = rng.choice([1, 100, 2000])
    return rules


GENERATORS: dict[str, Callable[[random.Random, Path, list[bytes]], Case]] = {
    "tar": gen_tar, "zip": gen_zip, "webdataset": gen_webdataset, "parquet": gen_parquet, "coco": gen_coco}


# --- running cases -------------------------------------------------------------------------------------

class _Hang(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Hang("the case ran past its time limit")


def run_case(case: Case, out: Path) -> str:
    """Build ``case``; returns the outcome (``packed`` or the PackerError class name). Raises
    anything else (the fuzzer's failure)."""
    from packer import BuildSettings, RunOptions, SourceSettings
    from packer import format as fmt
    from packer.dataset import open_dataset
    from packer.errors import PackerError
    from packer.writer import build

    try:
        source = SourceSettings(**{("kind" if name == "source_kind" else name): value
                                   for name, value in case.build.items()})
        settings = BuildSettings.from_json(fmt.regroup_build_options(case.options), unrecorded_source=source)
        result = build(case.source, out, settings, RunOptions(workers=1))
    except PackerError as exc:
        if not str(exc):
            raise AssertionError(f"a {type(exc).__name__} without a message") from exc
        return type(exc).__name__
    assert result is not None
    with open_dataset(out, verify_checksums=True) as dataset:  # the dataset opens and reads back
        for row in range(len(dataset)):
            dataset.read(row)
            json.dumps(dataset.metadata(row), allow_nan=False)  # strict JSON, Unicode text
            for spec in dataset.fields:
                dataset.value(spec.name, row)
        assert len(dataset) == result.sample_count
    return "packed"


@dataclass
class Report:
    cases: dict[str, int] = field(default_factory=dict)
    outcomes: dict[str, int] = field(default_factory=dict)
    by_kind: dict[str, dict[str, int]] = field(default_factory=dict)
    failures: list[dict[str, Any]] = field(default_factory=list)
    peak_bytes: int = 0
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"cases": sum(self.cases.values()), "by_kind": dict(sorted(self.cases.items())),
                "outcomes": dict(sorted(self.outcomes.items())), "failures": len(self.failures),
                "outcomes_by_kind": {kind: dict(sorted(n.items())) for kind, n in sorted(self.by_kind.items())},
                "peak_mib": round(self.peak_bytes / (1 << 20), 1), "seconds": round(self.seconds, 1)}


def fuzz(seconds: float, seed: int, kinds: tuple[str, ...] = KINDS, keep: Path | None = None,
         case_seconds: int = 30, case_memory: int = 512 << 20, max_cases: int | None = None) -> Report:
    """Run cases round-robin over ``kinds`` for ``seconds`` (or ``max_cases``)."""
    import logging

    logging.getLogger("packer").setLevel(logging.ERROR)  # rejections and warnings are the point here
    rng = random.Random(seed)
    pool = images(seed=seed)
    report = Report()
    work = Path(tempfile.mkdtemp(prefix="fuzz-sources-"))
    keep = keep or work / "failures"
    started = time.monotonic()
    previous = signal.signal(signal.SIGALRM, _alarm)
    number = 0
    try:
        while time.monotonic() - started < seconds and (max_cases is None or number < max_cases):
            kind = kinds[number % len(kinds)]
            case_seed = rng.randrange(1 << 32)
            folder = work / f"case-{number:06d}"
            folder.mkdir()
            case = GENERATORS[kind](random.Random(case_seed), folder, pool)
            tracemalloc.start()
            signal.alarm(case_seconds)
            try:
                outcome = run_case(case, folder / "out")
                _, peak = tracemalloc.get_traced_memory()
                if peak > case_memory:
                    raise AssertionError(f"the case held {peak >> 20} MiB (limit {case_memory >> 20} MiB)")
                report.peak_bytes = max(report.peak_bytes, peak)
                report.outcomes[outcome] = report.outcomes.get(outcome, 0) + 1
                mine = report.by_kind.setdefault(kind, {})
                mine[outcome] = mine.get(outcome, 0) + 1
                shutil.rmtree(folder, ignore_errors=True)
            except BaseException as exc:  # noqa: BLE001 - every other ending is the failure being looked for
                if isinstance(exc, KeyboardInterrupt):
                    raise
                kept = keep / f"{kind}-{case_seed}"
                kept.parent.mkdir(parents=True, exist_ok=True)
                shutil.rmtree(kept, ignore_errors=True)
                shutil.move(str(folder), kept)
                (kept / "traceback.txt").write_text("".join(traceback.format_exception(exc)))
                report.failures.append({"kind": kind, "seed": case_seed, "error": f"{type(exc).__name__}: {exc}"[:300],
                                        "kept": str(kept)})
            finally:
                signal.alarm(0)
                tracemalloc.stop()
            report.cases[kind] = report.cases.get(kind, 0) + 1
            number += 1
    finally:
        signal.signal(signal.SIGALRM, previous)
        report.seconds = time.monotonic() - started
        if not report.failures:
            shutil.rmtree(work, ignore_errors=True)
    return report


def replay(kind: str, case_seed: int, seed: int = 0) -> str:
    """Build one case again (from a failure's kind and seed) and return its outcome."""
    folder = Path(tempfile.mkdtemp(prefix="fuzz-replay-"))
    case = GENERATORS[kind](random.Random(case_seed), folder, images(seed=seed))
    return run_case(case, folder / "out")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--keep", type=Path, default=None, help="Folder for failing cases (default: a temporary one).")
    parser.add_argument("--case-seconds", type=int, default=30)
    parser.add_argument("--replay", default=None, metavar="KIND:SEED", help="Build one case again and print its outcome.")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.replay:
        kind, case_seed = args.replay.split(":")
        print(replay(kind, int(case_seed), args.seed))
        return 0
    kinds = tuple(k for k in args.kinds.split(",") if k)
    unknown = set(kinds) - set(KINDS)
    if unknown:
        parser.error(f"unknown kinds {sorted(unknown)}; choose from {', '.join(KINDS)}")
    report = fuzz(args.seconds, args.seed, kinds, args.keep, args.case_seconds)
    for failure in report.failures:
        print(f"FAILED {failure['kind']}:{failure['seed']}: {failure['error']} (kept in {failure['kept']})",
              file=sys.stderr)
    print(f"source fuzzing: {json.dumps(report.to_json(), sort_keys=True)}")
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
