"""Sources that change or lie while a build reads them: files swapped for FIFOs, links to /dev/zero,
files that grow, shrink or are rewritten after listing, sparse multi-gigabyte files, hostile TIFF
headers, folders 1200 levels deep and JPEGs with data after the image. The build rejects the
entry with a reason and goes on, reads at most what it planned, and never hangs."""

from __future__ import annotations
import io
import math
import os
import struct
import subprocess
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from packer import format as fmt
from packer.dataset import open_index
from packer.errors import OptionError
from packer.writer import build
from packer import BuildSettings, RunOptions
from packer import CheckSettings

from helpers import count_trial, noisy_jpeg, noisy_png, noisy_png_classes, run_cli


# --- class 1: header parsers, seen from a build ---------------------------------------------------


def _tiff(strip_byte_counts: tuple[int, int, bytes]) -> bytes:
    tag, field_type, value = strip_byte_counts
    entries = [(256, 3, 1, struct.pack("<H", 4)), (257, 3, 1, struct.pack("<H", 4)),
               (258, 3, 1, struct.pack("<H", 8)), (259, 3, 1, struct.pack("<H", 1)),
               (262, 3, 1, struct.pack("<H", 1)), (273, 4, 1, struct.pack("<I", 200)),
               (277, 3, 1, struct.pack("<H", 1)), (278, 3, 1, struct.pack("<H", 4))]
    entries = [e for e in entries if e[0] != tag] + [(tag, field_type, 1 if field_type != 2 else len(value),
                                                       value)]
    entries.sort()
    data_at = 8 + 2 + 12 * len(entries) + 4
    body, extra = b"", b""
    for t, ft, count, raw in entries:
        if len(raw) <= 4:
            body += struct.pack("<HHI", t, ft, count) + raw.ljust(4, b"\0")
        else:
            body += struct.pack("<HHII", t, ft, count, data_at + len(extra))
            extra += raw
    head = b"II*\0" + struct.pack("<I", 8) + struct.pack("<H", len(entries)) + body + b"\0\0\0\0" + extra
    return head.ljust(200, b"\0") + b"\x80" * 16


def test_tiffs_with_hostile_field_types_are_rejected_and_the_build_goes_on(tmp_path):
    """The issue's examples: StripByteCounts as DOUBLE NaN/Inf or RATIONAL, StripOffsets as ASCII."""
    src = noisy_png_classes(tmp_path / "src")
    cases = {"nan.tif": (279, 12, struct.pack("<d", math.nan)), "inf.tif": (279, 12, struct.pack("<d", math.inf)),
             "rational.tif": (279, 5, struct.pack("<II", 16, 3)), "ascii.tif": (273, 2, b"200\0")}
    for name, field in cases.items():
        (src / "class0" / name).write_bytes(_tiff(field))
    result = build(src, tmp_path / "out", BuildSettings(), RunOptions(workers=1))
    reasons = {r.key: r.reason for r in result.rejected}
    assert reasons == {f"class0/{name}": "decode-failed" for name in cases}
    assert result.sample_count == 6
    # --resume over the same folder meets them again and still finishes
    result = build(src, tmp_path / "out", BuildSettings(), RunOptions(workers=1, overwrite=True, resume=True))
    assert result.sample_count == 6
    count_trial("class1-build-hostile-tiffs", len(cases))


# --- class 2: bounded, checked reads at pack time -------------------------------------------------


VICTIM = "class0/img1.png"


def _plan_then_swap(tmp_path: Path, swap: Any, **options: Any) -> Any:
    """Plan (list) the source, swap one file, then pack from the saved plan (--resume).

    60 files, so the resumed build's spot check of 16 listed sizes (spread over the listing)
    does not look at the victim, listing index 1: a swap it would see is refused earlier.
    """
    src = noisy_png_classes(tmp_path / "src", classes=3, per_class=20)
    out = tmp_path / "out"
    settings = BuildSettings(checks=CheckSettings(**options))
    assert build(src, out, settings, RunOptions(workers=1, plan_only=True)) is None
    swap(src / VICTIM)
    return build(src, out, settings, RunOptions(workers=1, resume=True))


@pytest.mark.timeout(60)
def test_fifo_swapped_in_after_listing_does_not_hang(tmp_path):
    def to_fifo(path: Path) -> None:
        path.unlink()
        os.mkfifo(path)
    result = _plan_then_swap(tmp_path, to_fifo)
    rejected = {r.key: r for r in result.rejected}
    assert rejected[VICTIM].reason == "changed-during-build"
    assert "FIFO" in rejected[VICTIM].message
    assert result.sample_count == 59
    count_trial("class2-fifo-after-listing")


@pytest.mark.timeout(60)
def test_link_to_dev_zero_swapped_in_after_listing_is_not_read(tmp_path):
    def to_zero(path: Path) -> None:
        path.unlink()
        path.symlink_to("/dev/zero")
    tracemalloc.start()
    try:
        result = _plan_then_swap(tmp_path, to_zero)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    rejected = {r.key: r for r in result.rejected}
    assert rejected[VICTIM].reason == "changed-during-build"
    assert "character device" in rejected[VICTIM].message
    assert peak < 64 << 20
    count_trial("class2-dev-zero-after-listing")


@pytest.mark.timeout(60)
def test_file_that_grows_or_shrinks_after_listing(tmp_path):
    def grow(path: Path) -> None:
        with open(path, "ab") as handle:
            handle.write(b"\0" * 10_000)
    result = _plan_then_swap(tmp_path / "grow", grow)
    assert {r.key: r.reason for r in result.rejected} == {VICTIM: "changed-during-build"}

    def shrink(path: Path) -> None:
        path.write_bytes(path.read_bytes()[:50])
    result = _plan_then_swap(tmp_path / "shrink", shrink)
    assert {r.key: r.reason for r in result.rejected} == {VICTIM: "changed-during-build"}
    count_trial("class2-size-changed-after-listing", 2)


@pytest.mark.timeout(120)
def test_sparse_multi_gigabyte_file_is_rejected_without_reading_it(tmp_path):
    src = noisy_png_classes(tmp_path / "src")
    sparse = src / "class0" / "huge.jpg"
    with open(sparse, "wb") as handle:
        handle.write(b"\xff\xd8\xff\xe0\x00\x10JFIF\x00")
        handle.truncate(3 << 30)  # 3 GiB, almost no blocks on disk
    tracemalloc.start()
    try:
        result = build(src, tmp_path / "out", BuildSettings(), RunOptions(workers=1))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    rejected = {r.key: r for r in result.rejected}
    assert rejected["class0/huge.jpg"].reason == "file-too-large"
    assert str(CheckSettings().max_file_size) in rejected["class0/huge.jpg"].message
    assert peak < 64 << 20
    count_trial("class2-sparse-3GiB")


def test_max_file_size_is_an_option_recorded_in_the_manifest(tmp_path):
    src = noisy_png_classes(tmp_path / "src")
    big = noisy_png(src / "class0" / "big.png", size=(64, 64))
    limit = big.stat().st_size - 1
    code, output = run_cli(["build", str(src), str(tmp_path / "out"), "-q", "--workers", "1",
                            "--max-file-size", str(limit)])
    assert code == 0, output
    with open_index(tmp_path / "out") as index:
        assert index.manifest.build["settings"]["checks"]["max_file_size"] == limit
        keys = set(index.keys())
    assert "class0/big.png" not in keys and len(keys) == 6
    report = (tmp_path / "out" / fmt.REPORT_NAME).read_text()
    assert '"file-too-large"' in report
    for bad in ("0", "-5", "abc", "1e99G", "nan"):
        code, output = run_cli(["build", str(src), str(tmp_path / "bad"), "--max-file-size", bad])
        assert code == 2 and "--max-file-size" in output and "Traceback" not in output, (bad, output)
    with pytest.raises(OptionError, match="max-file-size"):
        CheckSettings(max_file_size=0).check()
    count_trial("class2-max-file-size-cli", 6)


# --- class 3: recursion on attacker-controlled depth ----------------------------------------------


@pytest.mark.timeout(120)
def test_class_folder_1200_levels_deep_builds(tmp_path):
    src = noisy_png_classes(tmp_path / "src")
    deep = src / "class1"
    parts = ["d"] * 1200
    fd = os.open(deep, os.O_RDONLY)
    for _ in parts:  # os.makedirs itself recurses per level
        os.mkdir("d", dir_fd=fd)
        child = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = child
    buffer = io.BytesIO()
    Image.new("RGB", (5, 4), (1, 2, 3)).save(buffer, "PNG")
    image = os.open("deep.png", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
    os.write(image, buffer.getvalue())
    os.close(image)
    os.close(fd)
    try:
        result = build(src, tmp_path / "out", BuildSettings(), RunOptions(workers=1))
        with open_index(tmp_path / "out") as index:
            keys = list(index.keys())
        assert "class1/" + "/".join(parts) + "/deep.png" in keys
        assert result.sample_count == 7
    finally:  # pytest's own cleanup (shutil.rmtree) recurses per level too; rm does not
        subprocess.run(["rm", "-rf", str(deep / "d")], check=True)
    count_trial("class3-deep-folder-1200")


# --- class 11: the C extension --------------------------------------------------------------------


def test_jpegs_with_data_after_the_image_are_kept_whole_with_a_note():
    from packer.codecs import get_codec
    from packer._internal.imageinfo import probe_image

    codec = get_codec("tiled")
    mpo = io.BytesIO()
    first = Image.fromarray(np.zeros((32, 32, 3), dtype=np.uint8))
    first.save(mpo, "MPO", save_all=True, append_images=[Image.fromarray(np.full((32, 32, 3), 200, np.uint8))])
    cases = {"mpo": mpo.getvalue(), "appended": noisy_jpeg() + b"appended video bytes" * 10, "padding": noisy_jpeg() + b"\0" * 3}
    for label, data in cases.items():
        info = probe_image(data)
        payload, _ = codec.encode(data, info)
        assert payload is data, label  # nothing dropped
        assert codec.note(data, payload, info) == "kept: data after the image", label
    plain = noisy_jpeg()
    payload, info = codec.encode(plain, probe_image(plain))
    assert payload is not plain and codec.note(plain, payload, info) == "tiled"
    count_trial("class11-data-after-the-image", 4)


def test_same_size_rewrite_after_listing_is_detected(tmp_path):
    def rewrite(path: Path) -> None:
        data = bytearray(path.read_bytes())
        data[-20] ^= 0xFF  # same size, other content
        path.write_bytes(bytes(data))
        stat = path.stat()
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    result = _plan_then_swap(tmp_path, rewrite)
    assert {r.key: r.reason for r in result.rejected} == {VICTIM: "changed-during-build"}
    assert "modification time" in {r.key: r.message for r in result.rejected}[VICTIM]
    count_trial("class2-same-size-rewrite")
