"""A real-world messy image folder, built through the real CLI: every entry is packed or rejected
with a reason, and the build report and index together account for every one of them.

The documented rules this checks (``packer.sources.folder``): every file is a candidate whatever its
extension, the bytes decide; hidden entries and top-level files are rejected; symlinks are
followed (to files and folders, inside or outside the source), a dangling one or a loop is
rejected; nested folders belong to their top-level class; an empty class folder still gets its
label; names are kept byte for byte (unicode, spaces, case, 255-byte names).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from packer import format as fmt
from packer.dataset import open_dataset
from packer._internal.names import unescape_key

REPO = Path(__file__).resolve().parents[2]


def _image_bytes(fmt_name: str, mode: str = "RGB", size: tuple[int, int] = (17, 13), seed: int = 0, **save) -> bytes:
    rng = np.random.default_rng(seed)
    bands = {"RGB": 3, "CMYK": 4, "L": 1, "RGBA": 4}.get(mode)
    if mode == "I;16":
        image = Image.fromarray(rng.integers(0, 65535, size[::-1], dtype=np.uint16))
    elif mode == "P":
        image = Image.fromarray(rng.integers(0, 256, (*size[::-1], 3), dtype=np.uint8)).convert("P")
    else:
        shape = size[::-1] if bands == 1 else (*size[::-1], bands)
        image = Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode)
    buffer = io.BytesIO()
    image.save(buffer, fmt_name, **save)
    return buffer.getvalue()


def make_messy_folder(root: Path, outside: Path) -> tuple[dict[str, str], set[str]]:
    """Write the mess; returns (rejected key -> expected reason, keys expected to be packed)."""
    packed: set[str] = set()
    rejected: dict[str, str] = {}
    cats, dogs, empty = root / "cats", root / "dogs", root / "empty_class"
    for folder in (cats, dogs, empty, outside):
        folder.mkdir(parents=True)

    def put(relative: str, data: bytes, reason: str | None = None) -> None:
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        if reason is None:
            packed.add(relative)
        else:
            rejected[relative] = reason

    jpeg, png = _image_bytes("JPEG", seed=1), _image_bytes("PNG", seed=2)
    put("cats/plain.jpg", jpeg)
    put("cats/zero.jpg", b"", "empty-file")
    put("cats/notes.jpg", b"these are my notes, not a picture\n" * 10, "not-an-image")
    put("cats/page.png", b"<!DOCTYPE html><html><body>404</body></html>", "not-an-image")
    put("cats/lfs.jpg", b"version https://git-lfs.github.com/spec/v1\noid sha256:ab\nsize 1234\n", "not-an-image")
    put("cats/truncated.jpg", _image_bytes("JPEG", size=(64, 64), seed=3)[:400], "truncated")
    put("cats/truncated.png", _image_bytes("PNG", size=(64, 64), seed=4)[:300], "truncated")
    put("cats/cmyk.jpg", _image_bytes("JPEG", "CMYK", seed=5))
    put("cats/progressive.jpg", _image_bytes("JPEG", size=(40, 30), seed=6, progressive=True))
    put("cats/gray16.png", _image_bytes("PNG", "I;16", seed=7))
    put("cats/palette.png", _image_bytes("PNG", "P", seed=8))
    put("cats/rgba.png", _image_bytes("PNG", "RGBA", seed=9))
    put("cats/no_extension", png)
    put("cats/png_named.jpg", png)  # wrong extension: the bytes decide
    put("cats/image.ppm", _image_bytes("PPM", seed=10))  # any format Pillow decodes is packed
    put("cats/café ☕ 猫.jpg", jpeg)
    put("cats/with  spaces .png", png)
    put("cats/" + "x" * 251 + ".png", png)  # a 255-byte name, the usual limit
    put("cats/Case.png", _image_bytes("PNG", seed=11))
    put("cats/case.png", _image_bytes("PNG", seed=12))
    put("cats/.DS_Store", b"\0\0\0\1Bud1", "hidden-file")
    put("cats/.hidden.png", png, "hidden-file")
    put(".git/config", b"[core]\n", None)  # a hidden folder at the top: one rejection for the folder
    packed.discard(".git/config")
    rejected[".git"] = "hidden-file"
    put("README.txt", b"dataset of cats and dogs\n", "not-in-class-folder")
    put("dogs/a/b/c/deep.png", _image_bytes("PNG", seed=13))  # nested: still class "dogs"
    put("dogs/a/sibling.jpg", _image_bytes("JPEG", seed=14))
    put("dogs/bomb.png", _png_header_only(80_000, 80_000), "too-many-pixels")
    put("dogs/bmp.bmp", _image_bytes("BMP", seed=15))
    put("dogs/anim.gif", _image_bytes("GIF", "P", seed=16))
    put("dogs/tiff.tiff", _image_bytes("TIFF", seed=17))
    put("dogs/webp.webp", _image_bytes("WEBP", seed=18))
    # symlinks
    (outside / "far.jpg").write_bytes(_image_bytes("JPEG", seed=19))
    (outside / "sub").mkdir()
    (outside / "sub" / "far2.png").write_bytes(_image_bytes("PNG", seed=20))
    (dogs / "link_inside.jpg").symlink_to(Path("..") / "cats" / "plain.jpg")
    packed.add("dogs/link_inside.jpg")
    (dogs / "link_outside.jpg").symlink_to(outside / "far.jpg")
    packed.add("dogs/link_outside.jpg")
    (dogs / "linked_folder").symlink_to(outside / "sub")
    packed.add("dogs/linked_folder/far2.png")
    (dogs / "dangling.jpg").symlink_to(root / "nowhere.jpg")
    rejected["dogs/dangling.jpg"] = "dangling-symlink"
    (dogs / "loop").symlink_to(Path(".."))  # dogs/loop -> root: a parent of dogs
    rejected["dogs/loop/"] = "symlink-loop"
    (dogs / "self").symlink_to("self")  # a link to itself: ELOOP
    rejected["dogs/self"] = "symlink-loop"
    (dogs / "a" / "b" / "up").symlink_to(Path("..") / "..")  # dogs/a/b/up -> dogs/a
    rejected["dogs/a/b/up/"] = "symlink-loop"
    os.mkfifo(dogs / "fifo.jpg")
    rejected["dogs/fifo.jpg"] = "not-a-file"
    (root / "dangling_class").symlink_to(root / "no_such_folder")
    rejected["dangling_class"] = "dangling-symlink"
    # a name that is not UTF-8
    bad_name = os.fsencode(str(dogs)) + b"/bad-\xff-name.png"
    with open(bad_name, "wb") as handle:
        handle.write(png)
    packed.add("dogs/bad-%FF-name.png")  # not UTF-8: packed under its escaped key (packer/_internal/names.py)
    return rejected, packed


def _png_header_only(width: int, height: int) -> bytes:
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 4096)) + chunk(b"IEND", b""))


def _run_build(src: Path, out: Path, *extra: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "packer", "build", str(src), str(out), "--shard-size", "64K",
                           "-q", "--json", *extra], cwd=REPO, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    assert "Traceback" not in done.stderr.decode()
    return json.loads(done.stdout)


def test_messy_folder_every_entry_accounted_for(tmp_path):
    src, outside = tmp_path / "src", tmp_path / "outside"
    expected_rejected, expected_packed = make_messy_folder(src, outside)
    out = tmp_path / "out"
    summary = _run_build(src, out, "--workers", "2")

    lines = [json.loads(line) for line in (out / fmt.REPORT_NAME).read_text(encoding="utf-8").splitlines()]
    head, rows = lines[0], lines[1:]
    assert head["type"] == "summary"
    rejected = {row["key"]: row["reason"] for row in rows}
    assert all(row["type"] == "rejected" and row["message"] for row in rows)
    assert len(rejected) == len(rows), "a file is reported twice"
    with open_dataset(out, verify_checksums=True) as dataset:
        packed = {dataset.key(i): i for i in range(len(dataset))}
        assert set(dataset.classes) == {"cats", "dogs", "empty_class"}
        assert dataset.classes == tuple(sorted(dataset.classes, key=str.encode))
        for key, i in packed.items():
            name = unescape_key(key, bool(dataset.metadata(i).get("escaped_name")))
            assert dataset.read(i) == (src / os.fsdecode(name)).read_bytes(), key  # passthrough: the file's bytes
            assert dataset.classes[int(dataset.labels[i])] == key.split("/")[0], key

    assert rejected == expected_rejected
    assert set(packed) == expected_packed
    assert not set(packed) & set(rejected)
    assert summary["samples"] == len(expected_packed) and summary["rejected"] == len(expected_rejected)
    assert head["packed"] == len(packed) and head["rejected"] == len(rejected)
    assert head["source_files"] == len(packed) + len(rejected)
    reasons: dict[str, int] = {}
    for reason in rejected.values():
        reasons[reason] = reasons.get(reason, 0) + 1
    assert summary["rejected_by_reason"] == reasons
    print(f"\nmessy folder: {len(packed)} packed, {len(rejected)} rejected: {json.dumps(reasons, sort_keys=True)}")

    # the same mess built again, with one worker: byte-identical
    again = tmp_path / "again"
    _run_build(src, again, "--workers", "1")
    files = lambda root: {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*")  # noqa: E731
                          if p.is_file() and p.name != ".packer.lock"}
    assert files(out) == files(again)


@pytest.mark.skipif(sys.platform != "linux", reason="case-sensitive file system assumed")
def test_case_only_names_are_distinct_samples(tmp_path):
    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    for index, name in enumerate(("A.png", "a.png", "a.PNG")):
        (src / name).write_bytes(_image_bytes("PNG", seed=index))
    summary = _run_build(tmp_path / "src", tmp_path / "out")
    assert summary["samples"] == 3
    with open_dataset(tmp_path / "out") as dataset:
        for name in ("A.png", "a.png", "a.PNG"):
            assert dataset.read(dataset.find(f"c/{name}")) == (src / name).read_bytes()
