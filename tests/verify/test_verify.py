"""verify: intact datasets pass; every kind of damage is named (shard, sample, key) and never crashes."""

from __future__ import annotations

import errno
import io
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

import packer
import packer.verify as verify_module
from packer import format as fmt
from packer.dataset import open_index
from packer.decode import decode_image
from packer.errors import PackerError
from packer.verify import PROBLEM_KINDS, Problem, VerifyReport, verify
from packer.writer import build
from packer.writer.plan import BuildOptions

from helpers import edit_manifest, make_png_classes, png_folder

VECTORS = Path(__file__).resolve().parents[2] / "formats" / "vectors"


def make_images(root: Path, *, per_class: int = 6, seed: int = 0) -> Path:
    """Small noisy JPEG and PNG files in two class folders (sizes vary so padding varies)."""
    rng = np.random.default_rng(seed)
    for name in ("cat", "dog"):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (24 + 3 * i, 30 + 2 * i, 3), dtype=np.uint8)
            suffix = "png" if i % 2 else "jpg"
            Image.fromarray(pixels).save(root / name / f"{i}.{suffix}")
    return root


def build_dataset(tmp: Path, *, alignment: int = 4096, shard_size: int = 16 << 10, **images: int) -> Path:
    out = tmp / "ds"
    build(make_images(tmp / "src", **images), out, BuildOptions(shard_size=shard_size, alignment=alignment),
          workers=1, progress=False)
    return out


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_dataset(tmp_path_factory.mktemp("verify-base"))


@pytest.fixture
def dataset(base: Path, tmp_path: Path) -> Path:
    """A private copy of the base dataset, to damage."""
    return Path(shutil.copytree(base, tmp_path / "ds"))


def shard_file(folder: Path, shard: int) -> Path:
    with open_index(folder) as index:
        return folder / index.manifest.shards[shard].path


def flip(folder: Path, sample: int, delta: int = 0) -> tuple[Path, int]:
    """Invert one byte at ``delta`` from the start of ``sample``'s payload; returns (file, offset)."""
    with open_index(folder) as index:
        path = folder / index.manifest.shards[index.shard_of(sample)].path
        offset = int(index.index.offset[sample]) + delta
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0xFF]))
    return path, offset


def kinds(report: VerifyReport) -> list[str]:
    return [p.kind for p in report.problems]


# --- intact ---------------------------------------------------------------------------------

@pytest.mark.parametrize("alignment", [1, 512, 4096])
def test_intact_dataset_passes_with_counts(tmp_path: Path, alignment: int) -> None:
    folder = build_dataset(tmp_path, alignment=alignment)
    report = verify(folder, progress=False, workers=1)
    with open_index(folder) as index:
        shard_bytes = sum(s.size for s in index.manifest.shards)
        assert report.samples == report.samples_checked == len(index) == 12
        assert report.shards == report.shards_checked == len(index.manifest.shards)
    assert report.ok and report.problems == []
    assert report.bytes_read == shard_bytes
    assert report.damaged_samples == [] and report.damaged_sample_count == 0
    assert report.to_json()["ok"] is True
    json.dumps(report.to_json())


def test_public_alias() -> None:
    assert packer.verify_dataset is verify


@pytest.mark.parametrize("chunk", [1000, 4096, 5000, 12289])
def test_small_chunks_hash_samples_across_boundaries(base: Path, monkeypatch: pytest.MonkeyPatch,
                                                    chunk: int) -> None:
    """Payloads cut by chunk boundaries are hashed with a streaming state: same verdict."""
    monkeypatch.setattr(verify_module, "CHUNK_SIZE", chunk)
    report = verify(base, progress=False, workers=1)
    assert report.ok, report.problems
    assert report.samples_checked == 12


def test_workers_give_the_same_report(dataset: Path) -> None:
    flip(dataset, 2)
    flip(dataset, 7, 5)
    one = verify(dataset, progress=False, workers=1)
    two = verify(dataset, progress=False, workers=2)
    assert [p.to_json() for p in one.problems] == [p.to_json() for p in two.problems]
    assert (one.samples_checked, one.bytes_read) == (two.samples_checked, two.bytes_read)


_REAL_SCAN = verify_module._scan_shard


def _die_on_shard_1(task: Any, on_progress: Any = None, buffer: Any = None) -> Any:
    """Stands in for ``_scan_shard`` in the worker processes."""
    if task.shard == 1:
        os._exit(3)  # what an out-of-memory kill or a decoder crash looks like to the pool
    return _REAL_SCAN(task, on_progress, buffer)


def test_a_dying_worker_is_a_problem_not_a_crash(base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verify_module, "_scan_shard", _die_on_shard_1)
    report = verify(base, progress=False, workers=2)
    assert not report.ok
    assert any(p.kind == "io" and p.shard == 1 and "died" in p.message for p in report.problems)


# --- payload damage -------------------------------------------------------------------------

def test_one_flipped_payload_byte_names_the_sample(dataset: Path) -> None:
    path, _ = flip(dataset, 3, 10)
    report = verify(dataset, progress=False, workers=1)
    assert not report.ok
    with open_index(dataset) as index:
        key, shard = index.key(3), index.shard_of(3)
    [problem] = [p for p in report.problems if p.kind == "checksum"]
    assert (problem.sample, problem.key, problem.shard) == (3, key, shard)
    assert problem.path == str(path.relative_to(dataset))
    assert "checksum mismatch" in problem.message
    assert kinds(report) == ["checksum", "shard-checksum"]
    assert report.damaged_samples == [3]
    assert f"sample 3 ({key})" in str(problem)


def test_two_damaged_samples_are_both_named(dataset: Path) -> None:
    flip(dataset, 1)
    flip(dataset, 10, -1 + int(open_index(dataset).index.size[10]))  # the last payload byte
    report = verify(dataset, progress=False, workers=1)
    assert report.damaged_samples == [1, 10]
    assert sorted(p.sample for p in report.problems if p.kind == "checksum") == [1, 10]


def test_every_payload_byte_position_is_covered(dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Damage at the first and last byte of every sample, with chunks that cut payloads."""
    monkeypatch.setattr(verify_module, "CHUNK_SIZE", 3000)
    with open_index(dataset) as index:
        sizes = index.index.size.tolist()
    for sample, size in enumerate(sizes):
        for delta in (0, size - 1):
            flip(dataset, sample, delta)
            report = verify(dataset, progress=False, workers=1)
            flip(dataset, sample, delta)  # restore
            assert report.damaged_samples == [sample], (sample, delta, report.problems)


# --- padding, headers, files ------------------------------------------------------------------

def test_nonzero_padding_is_damage(dataset: Path) -> None:
    with open_index(dataset) as index:
        size = int(index.index.size[5])
        offset = int(index.index.offset[5])
    assert (offset + size) % 4096, "sample 5 needs padding after it"
    flip(dataset, 5, size + 3)
    report = verify(dataset, progress=False, workers=1)
    assert kinds(report) == ["padding", "shard-checksum"]
    assert report.problems[0].sample == 5 and "padding" in report.problems[0].message


@pytest.mark.parametrize("position, message", [(50, "reserved header bytes"), (1000, "header padding"),
                                               (24, "sample_count")])
def test_header_damage(dataset: Path, position: int, message: str) -> None:
    path = shard_file(dataset, 1)
    with open(path, "r+b") as handle:
        handle.seek(position)
        handle.write(b"\x07")
    report = verify(dataset, progress=False, workers=1)
    assert not report.ok
    assert kinds(report) == ["header", "shard-checksum"]
    assert report.problems[0].shard == 1 and message in report.problems[0].message
    assert report.samples_checked == 12  # the payloads are still checked


def test_bad_magic_is_a_header_problem(dataset: Path) -> None:
    path = shard_file(dataset, 0)
    with open(path, "r+b") as handle:
        handle.write(b"\x1f\x8b\x08\x00")
    report = verify(dataset, progress=False, workers=1)
    assert kinds(report)[0] == "header" and "not a packer shard" in report.problems[0].message


def test_truncated_shard_is_reported_not_raised(dataset: Path) -> None:
    path = shard_file(dataset, 1)
    with open_index(dataset) as index:
        first, end = index.shard_range(1)
        keep = int(index.index.offset[first]) + 10  # cut inside the shard's first sample
    os.truncate(path, keep)
    report = verify(dataset, progress=False, workers=1)
    assert kinds(report) == ["size", "truncated"]
    assert "truncated" in report.problems[0].message
    assert report.problems[1].sample_range == (first, end)
    assert report.damaged_samples == list(range(first, end))
    assert report.samples_checked == 12 - (end - first)


def test_shard_shorter_than_its_header(dataset: Path) -> None:
    os.truncate(shard_file(dataset, 0), 10)
    report = verify(dataset, progress=False, workers=1)
    assert kinds(report) == ["size", "header", "truncated"]


def test_read_errors_are_problems_naming_the_unchecked_samples(base: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    real_preadv = os.preadv

    def failing_preadv(fd: int, buffers: list, position: int) -> int:
        if position >= 4096:
            raise OSError(errno.EIO, "Input/output error")
        return real_preadv(fd, buffers, position)

    monkeypatch.setattr(verify_module, "CHUNK_SIZE", 4096)
    monkeypatch.setattr(verify_module.os, "preadv", failing_preadv)
    report = verify(base, progress=False, workers=1)
    monkeypatch.undo()
    assert not report.ok and set(kinds(report)) == {"io"}
    with open_index(base) as index:
        assert [p.sample_range for p in report.problems] == [index.shard_range(s) for s in range(report.shards)]
    assert "Input/output error" in report.problems[0].message


def test_extended_shard(dataset: Path) -> None:
    with open(shard_file(dataset, 2), "ab") as handle:
        handle.write(b"\0" * 100)
    report = verify(dataset, progress=False, workers=1)
    assert kinds(report) == ["size"] and "extended" in report.problems[0].message
    assert report.samples_checked == 12


def test_deleted_shard_names_its_samples(dataset: Path) -> None:
    path = shard_file(dataset, 2)
    path.unlink()
    report = verify(dataset, progress=False, workers=1)
    with open_index(dataset) as index:
        first, end = index.shard_range(2)
    [problem] = report.problems
    assert problem.kind == "missing" and problem.shard == 2 and problem.sample_range == (first, end)
    assert f"its {end - first} samples" in problem.message
    assert report.shards_checked == report.shards - 1
    assert report.damaged_sample_count == end - first


def test_symlink_out_of_the_folder_is_not_followed(dataset: Path, tmp_path: Path) -> None:
    path = shard_file(dataset, 0)
    outside = tmp_path / "outside.pks"
    shutil.move(path, outside)
    path.symlink_to(outside)
    report = verify(dataset, progress=False, workers=1)
    assert kinds(report) == ["missing"] and "outside the dataset folder" in report.problems[0].message


def test_damaged_index_is_one_structure_problem(dataset: Path) -> None:
    with open_index(dataset) as index:
        path = dataset / index.manifest.index.path
    with open(path, "r+b") as handle:
        handle.seek(200)
        handle.write(b"\xff")
    report = verify(dataset, progress=False, workers=1)
    [problem] = report.problems
    assert problem.kind == "structure" and "index checksum mismatch" in problem.message
    assert not report.ok and report.samples_checked == 0


def test_not_a_dataset(tmp_path: Path) -> None:
    report = verify(tmp_path, progress=False)
    assert kinds(report) == ["structure"] and "no manifest.json" in report.problems[0].message


# --- decoding --------------------------------------------------------------------------------

def _png_with_broken_pixels() -> bytes:
    """A PNG whose header and IEND are intact (it passes the build's header check) but whose
    compressed pixel data is garbage, so a full decode fails."""
    buffer = io.BytesIO()
    Image.fromarray(np.full((20, 20, 3), 90, dtype=np.uint8)).save(buffer, "PNG")
    data = bytearray(buffer.getvalue())
    start = data.find(b"IDAT") + 4
    for i in range(start + 2, min(start + 40, len(data) - 20)):
        data[i] ^= 0x5A
    return bytes(data)


def test_decode_finds_images_that_hash_right_but_do_not_decode(tmp_path: Path) -> None:
    source = make_images(tmp_path / "src", per_class=2)
    (source / "dog" / "broken.png").write_bytes(_png_with_broken_pixels())
    build(source, tmp_path / "ds", BuildOptions(validate="header"), workers=1, progress=False)
    assert verify(tmp_path / "ds", progress=False).ok  # the bytes are what was packed
    report = verify(tmp_path / "ds", decode=True, progress=False, workers=1)
    assert report.decoded and not report.ok
    [problem] = report.problems
    assert problem.kind == "decode" and problem.key == "dog/broken.png"
    with open_index(tmp_path / "ds") as index:
        assert problem.sample == index.find("dog/broken.png")


def test_decode_intact(base: Path) -> None:
    report = verify(base, decode=True, progress=False, workers=2)
    assert report.ok, report.problems


# --- golden vectors and mutations ---------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(p.name for p in (VECTORS / "valid").iterdir()) if VECTORS.exists() else [])
def test_valid_vectors_pass(name: str) -> None:
    report = verify(VECTORS / "valid" / name, progress=False, workers=1)
    assert report.ok, report.problems


@pytest.mark.parametrize("name", sorted(p.name for p in (VECTORS / "invalid").iterdir()) if VECTORS.exists() else [])
def test_invalid_vectors_are_reported(name: str) -> None:
    report = verify(VECTORS / "invalid" / name, progress=False, workers=1)
    assert not report.ok
    assert all(p.kind in PROBLEM_KINDS for p in report.problems)
    json.dumps(report.to_json())


@pytest.fixture(scope="module")
def mutable(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_dataset(tmp_path_factory.mktemp("verify-mutate"), alignment=512, shard_size=8 << 10)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(position=st.floats(min_value=0, max_value=1, exclude_max=True), mask=st.integers(1, 255))
def test_any_flipped_shard_byte_is_found(mutable: Path, position: float, mask: int) -> None:
    """Every byte of every shard is covered: a flip anywhere makes verify fail, and a flip inside
    a payload names exactly that sample."""
    with open_index(mutable) as index:
        sizes = [s.size for s in index.manifest.shards]
        target = int(position * sum(sizes))
        shard = int(np.searchsorted(np.cumsum(sizes), target, side="right"))
        offset = target - sum(sizes[:shard])
        path = mutable / index.manifest.shards[shard].path
        first, end = index.shard_range(shard)
        starts = index.index.offset[first:end].astype(np.int64)
        stops = starts + index.index.size[first:end].astype(np.int64)
        inside = np.flatnonzero((starts <= offset) & (offset < stops))
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)[0]
        handle.seek(offset)
        handle.write(bytes([byte ^ mask]))
    try:
        report = verify(mutable, progress=False, workers=1)
    finally:
        with open(path, "r+b") as handle:
            handle.seek(offset)
            handle.write(bytes([byte]))
    assert not report.ok
    assert any(p.kind == "shard-checksum" for p in report.problems)
    if len(inside):
        assert report.damaged_samples == [first + int(inside[0])]


def test_problem_str_and_json() -> None:
    problem = Problem(kind="missing", message="gone", shard=3, path="shards/x.pks", sample_range=(10, 20))
    assert str(problem) == "[missing] shard 3, samples 10..19: gone"
    assert problem.to_json()["sample_range"] == [10, 20]


# --- verify: the report, every problem's exact wording and location, workers and I/O hints --------


@pytest.fixture(scope="module")
def verify_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """9 PNGs in 3 shards (3584, 4096, 3584 bytes) of 3 samples, alignment 512."""
    tmp = tmp_path_factory.mktemp("verify-kills")
    out = tmp / "ds"
    build(png_folder(tmp / "src", 9), out, BuildOptions(shard_size=4096, alignment=512), workers=1, progress=False)
    return out


@pytest.fixture
def vds(verify_base: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(verify_base, tmp_path / "ds"))


def _layout(folder: Path) -> dict[str, Any]:
    with open_index(folder) as index:
        return {"paths": [s.path for s in index.manifest.shards], "sizes": [s.size for s in index.manifest.shards],
                "checksums": [s.checksum for s in index.manifest.shards],
                "ranges": [index.shard_range(s) for s in range(len(index.manifest.shards))],
                "offset": index.index.offset.astype(int).tolist(), "size": index.index.size.astype(int).tolist(),
                "checksum": index.index.checksum.tolist(), "keys": [index.key(i) for i in range(len(index))]}


def _problem(kind: str, message: str, **where: Any) -> dict[str, Any]:
    found = {"kind": kind, "message": message, "sample": None, "shard": None, "key": None, "path": None,
             "field": None, "sample_range": None}
    found.update(where)
    return found


def _poke(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(data)


def _file_hash(path: Path) -> str:
    return fmt.checksum_hex(xxhash.xxh3_64_intdigest(path.read_bytes()))


def _shard_checksum_problem(folder: Path, shard: int) -> dict[str, Any]:
    lay = _layout(folder)
    path = lay["paths"][shard]
    return _problem("shard-checksum", f"shard checksum mismatch: the manifest says {fmt.checksum_hex(lay['checksums'][shard])}, "
                    f"the file hashes to {_file_hash(folder / path)}", shard=shard, path=path)


def _verify_json(folder: Path, **options: Any) -> dict[str, Any]:
    options.setdefault("workers", 1)
    return verify(folder, **options).to_json()


def test_verify_report_of_an_intact_dataset_is_exact(verify_base: Path) -> None:
    import time as _time

    before = _time.monotonic()
    report = verify(verify_base, workers=1)
    elapsed = _time.monotonic() - before
    assert 0 < report.seconds <= elapsed
    assert report.to_json() == {"ok": True, "path": str(verify_base), "samples": 9, "shards": 3,
                                "samples_checked": 9, "shards_checked": 3, "bytes_read": 3584 + 4096 + 3584,
                                "seconds": round(report.seconds, 6), "decoded": False,
                                "damaged_sample_count": 0, "fields": {}, "unlisted": 0, "problems": []}
    assert VerifyReport(path="x", ok=True, seconds=1.23456789).to_json()["seconds"] == 1.234568


def test_verify_problem_text_and_json_without_a_key_or_a_place() -> None:
    assert str(Problem(kind="checksum", message="m", sample=4, shard=1)) == "[checksum] shard 1, sample 4: m"
    assert str(Problem(kind="structure", message="bad index")) == "[structure] bad index"
    assert Problem(kind="padding", message="m", sample=2, shard=0, key="a/b.png", path="shards/x.pks").to_json() == {
        "kind": "padding", "message": "m", "sample": 2, "shard": 0, "key": "a/b.png", "path": "shards/x.pks",
        "field": None, "sample_range": None}


@pytest.mark.parametrize("chunk", [None, 700, 2400])
def test_verify_payload_and_padding_damage_is_exact(vds: Path, monkeypatch: pytest.MonkeyPatch,
                                                    chunk: int | None) -> None:
    """A flipped payload byte and nonzero padding (twice around a chunk boundary: one problem)."""
    if chunk is not None:
        monkeypatch.setattr(verify_module, "CHUNK_SIZE", chunk)
    lay = _layout(vds)
    p1, p2 = (vds / lay["paths"][1]), (vds / lay["paths"][2])
    _poke(p1, lay["offset"][4] + 10, b"\xee")
    pad_start, pad_end = lay["offset"][7] + lay["size"][7], lay["offset"][8]  # 2241..2559 in shard 2
    _poke(p2, 2300, b"\x01")
    _poke(p2, 2500, b"\x02")
    payload = p1.read_bytes()[lay["offset"][4]:lay["offset"][4] + lay["size"][4]]
    report = _verify_json(vds)
    assert report["problems"] == [
        _problem("checksum", f"payload checksum mismatch: the index says {fmt.checksum_hex(lay['checksum'][4])}, the "
                 f"{lay['size'][4]} bytes at offset {lay['offset'][4]} hash to "
                 f"{fmt.checksum_hex(xxhash.xxh3_64_intdigest(payload))}",
                 sample=4, shard=1, key=lay["keys"][4], path=lay["paths"][1]),
        _shard_checksum_problem(vds, 1),
        _problem("padding", f"nonzero bytes in the padding after the payload (bytes {pad_start}..{pad_end - 1}, which "
                 f"must be zero)", sample=7, shard=2, key=lay["keys"][7], path=lay["paths"][2]),
        _shard_checksum_problem(vds, 2)]
    assert (report["ok"], report["samples_checked"], report["damaged_sample_count"]) == (False, 9, 2)


HEADER_CHANGES = [
    ({"alignment": 1024}, "header alignment 1024 disagrees with the manifest's 512"),
    ({"sample_count": 4}, "header sample_count 4 disagrees with the manifest's 3"),
    ({"file_size": 4608}, "header file_size 4608 disagrees with the manifest's size 4096"),
    ({"shard_number": 5}, "header shard_number 5 disagrees with the file name's 1"),
]


@pytest.mark.parametrize("change, message", HEADER_CHANGES)
def test_verify_header_disagreements_are_exact(vds: Path, change: dict[str, int], message: str) -> None:
    lay = _layout(vds)
    fields = dict(alignment=512, sample_count=3, file_size=4096, shard_number=1)
    fields.update(change)
    _poke(vds / lay["paths"][1], 0, fmt.ShardHeader(**fields).encode()[:fmt.SHARD_HEADER_SIZE])
    assert _verify_json(vds)["problems"] == [_problem("header", message, shard=1, path=lay["paths"][1]),
                                             _shard_checksum_problem(vds, 1)]


@pytest.mark.parametrize("position, message", [(50, "reserved header bytes 44..63 are not zero"),
                                               (100, "nonzero bytes in the header padding (64..511)"),
                                               (511, "nonzero bytes in the header padding (64..511)")])
@pytest.mark.parametrize("chunk", [None, 100])
def test_verify_header_bytes_that_must_be_zero(vds: Path, monkeypatch: pytest.MonkeyPatch, position: int,
                                               message: str, chunk: int | None) -> None:
    if chunk is not None:
        monkeypatch.setattr(verify_module, "CHUNK_SIZE", chunk)
    lay = _layout(vds)
    _poke(vds / lay["paths"][1], position, b"\x07")
    assert _verify_json(vds)["problems"] == [_problem("header", message, shard=1, path=lay["paths"][1]),
                                             _shard_checksum_problem(vds, 1)]


@pytest.mark.parametrize("where", ["in-payload", "at-payload-end", "in-padding"])
def test_verify_truncated_shard_names_exactly_the_lost_samples(vds: Path, where: str) -> None:
    lay = _layout(vds)
    end4 = lay["offset"][4] + lay["size"][4]
    keep = {"in-payload": lay["offset"][4] + 10, "at-payload-end": end4, "in-padding": end4 + 5}[where]
    first = 4 if where == "in-payload" else 5  # a sample whose whole payload is there was checked
    os.truncate(vds / lay["paths"][1], keep)
    report = _verify_json(vds)
    assert report["problems"] == [
        _problem("size", f"shard file is {keep} bytes on disk but the manifest says 4096 (truncated)", shard=1,
                 path=lay["paths"][1]),
        _problem("truncated", f"{6 - first} sample(s) lie past the end of the file ({keep} bytes) and are lost",
                 shard=1, path=lay["paths"][1], sample_range=[first, 6])]
    assert report["samples_checked"] == 9 - (6 - first) and report["bytes_read"] == 3584 + keep + 3584


@pytest.mark.parametrize("chunk", [None, 1000])
def test_verify_extended_shard_reads_only_the_listed_bytes(vds: Path, monkeypatch: pytest.MonkeyPatch,
                                                           chunk: int | None) -> None:
    if chunk is not None:
        monkeypatch.setattr(verify_module, "CHUNK_SIZE", chunk)
    lay = _layout(vds)
    with open(vds / lay["paths"][2], "ab") as handle:
        handle.write(b"\x05" * 100)
    report = _verify_json(vds)
    assert report["problems"] == [_problem("size", "shard file is 3684 bytes on disk but the manifest says 3584 "
                                                   "(extended)", shard=2, path=lay["paths"][2])]
    assert (report["samples_checked"], report["bytes_read"]) == (9, 3584 + 4096 + 3584)


def test_verify_unopenable_shards_are_missing_with_the_reason(vds: Path, tmp_path: Path) -> None:
    lay = _layout(vds)
    paths = [vds / p for p in lay["paths"]]
    paths[0].unlink()
    paths[1].unlink()
    paths[1].mkdir()
    paths[2].unlink()
    paths[2].symlink_to(paths[2])  # a link to itself: opening it fails with ELOOP
    outside = tmp_path / "elsewhere.pks"
    outside.write_bytes(b"")
    report = _verify_json(vds)

    def missing(shard: int, why: str) -> dict[str, Any]:
        first, end = lay["ranges"][shard]
        return _problem("missing", f"{why}: its 3 samples cannot be read", shard=shard, path=lay["paths"][shard],
                        sample_range=[first, end])

    assert report["problems"] == [
        missing(0, "shard file is missing"), missing(1, "is not a regular file"),
        missing(2, f"cannot open the shard file (cannot open {lay['paths'][2]}: Too many levels of symbolic links)")]
    assert (report["shards_checked"], report["samples_checked"], report["damaged_sample_count"]) == (0, 0, 9)
    paths[0].symlink_to(outside)
    assert _verify_json(vds)["problems"][0] == missing(0, "resolves outside the dataset folder; not read")


@pytest.mark.parametrize("error, text", [(OSError(errno.EIO, "Input/output error"), "Input/output error"),
                                         (OSError("the disk went away"), "the disk went away")])
def test_verify_an_error_reading_the_header_is_an_io_problem(vds: Path, monkeypatch: pytest.MonkeyPatch,
                                                             error: OSError, text: str) -> None:
    lay = _layout(vds)
    real_pread = os.pread

    def pread(fd: int, count: int, offset: int) -> bytes:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(lay["paths"][1]):
            raise error
        return real_pread(fd, count, offset)

    monkeypatch.setattr(verify_module.os, "pread", pread)
    report = _verify_json(vds)
    monkeypatch.undo()
    assert report["problems"] == [_problem("io", f"reading the shard failed: {text}", shard=1, path=lay["paths"][1])]
    assert (report["shards_checked"], report["samples_checked"]) == (2, 6)


@pytest.mark.parametrize("fail_at, lost", [(1000, [3, 6]), (2000, [4, 6]), (3700, None)])
def test_verify_a_read_error_names_the_unchecked_samples(vds: Path, monkeypatch: pytest.MonkeyPatch,
                                                         fail_at: int, lost: list[int] | None) -> None:
    """A read error after the last payload (only padding unread) loses no sample."""
    lay = _layout(vds)
    real_preadv = os.preadv
    monkeypatch.setattr(verify_module, "CHUNK_SIZE", fail_at)

    def preadv(fd: int, buffers: list, position: int) -> int:
        if position >= fail_at and os.readlink(f"/proc/self/fd/{fd}").endswith(lay["paths"][1]):
            raise OSError(errno.EIO, "Input/output error")
        return real_preadv(fd, buffers, position)

    monkeypatch.setattr(verify_module.os, "preadv", preadv)
    report = _verify_json(vds)
    monkeypatch.undo()
    assert report["problems"] == [_problem(
        "io", f"reading the shard failed at byte {fail_at}: Input/output error; the samples from there on were not "
              f"checked", shard=1, path=lay["paths"][1], sample_range=lost)]


@pytest.mark.parametrize("shrink_to", [1000, 1001])
def test_verify_a_shard_that_shrinks_while_read(vds: Path, monkeypatch: pytest.MonkeyPatch, shrink_to: int) -> None:
    """The file is cut after verify measured it: what it could not read is reported lost."""
    lay = _layout(vds)
    path = vds / lay["paths"][1]
    real_preadv = os.preadv
    monkeypatch.setattr(verify_module, "CHUNK_SIZE", 1000)

    def preadv(fd: int, buffers: list, position: int) -> int:
        if position == 1000 and os.readlink(f"/proc/self/fd/{fd}") == str(path.resolve()):
            os.truncate(path, shrink_to)
        return real_preadv(fd, buffers, position)

    monkeypatch.setattr(verify_module.os, "preadv", preadv)
    report = _verify_json(vds)
    monkeypatch.undo()
    assert report["problems"] == [_problem(
        "truncated", f"3 sample(s) lie past the end of the file ({shrink_to} bytes) and are lost", shard=1,
        path=lay["paths"][1], sample_range=[3, 6])]
    assert report["bytes_read"] == 3584 + shrink_to + 3584


def test_verify_asks_the_kernel_to_read_the_next_chunk_ahead(verify_base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int, int]] = []
    real = os.posix_fadvise
    monkeypatch.setattr(verify_module, "CHUNK_SIZE", 1000)
    monkeypatch.setattr(verify_module.os, "posix_fadvise",
                        lambda fd, offset, length, advice: (calls.append((offset, length, advice)),
                                                            real(fd, offset, length, advice))[1])
    assert verify(verify_base, workers=1).ok
    monkeypatch.undo()
    seq, need = os.POSIX_FADV_SEQUENTIAL, os.POSIX_FADV_WILLNEED
    short = [(0, 0, seq), (1000, 1000, need), (2000, 1000, need), (3000, 584, need)]
    assert calls == short + [(0, 0, seq), (1000, 1000, need), (2000, 1000, need), (3000, 1000, need),
                             (4000, 96, need)] + short


_SCANNED_HERE: list[int] = []


_REAL_SCAN_SHARD = verify_module._scan_shard


def _recording_scan(task: Any, on_progress: Any = None, buffer: Any = None) -> Any:
    """``_scan_shard`` that notes, in the process that runs it, which shard it scanned."""
    _SCANNED_HERE.append(task.shard)
    return _REAL_SCAN_SHARD(task, on_progress, buffer)


def test_verify_checks_in_this_process_or_in_workers(verify_base: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``workers=1`` (or a single shard) scans here; more workers on several shards fork a pool."""
    monkeypatch.setattr(verify_module, "_scan_shard", _recording_scan)
    one_shard = tmp_path / "one"
    build(png_folder(tmp_path / "src", 2), one_shard, BuildOptions(), workers=1, progress=False)
    two_shards = VECTORS / "valid" / "base-align512"
    for folder, workers, here in [(verify_base, 1, [0, 1, 2]), (verify_base, 0, [0, 1, 2]), (verify_base, 2, []),
                                  (verify_base, 7, []), (two_shards, 2, []), (one_shard, 2, [0])]:
        _SCANNED_HERE.clear()
        report = verify(folder, workers=workers)
        assert report.ok and _SCANNED_HERE == here, (folder, workers, _SCANNED_HERE)


def test_verify_default_workers_follow_cores_shards_and_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verify_module, "available_cpus", lambda: 4)
    unit = verify_module.BYTES_PER_WORKER
    cases = {(10, 0): 1, (10, unit - 1): 1, (10, 3 * unit + 5): 3, (2, 100 * unit): 2, (10, 100 * unit): 4,
             (0, 100 * unit): 1}
    for (shards, total), expected in cases.items():
        got = verify_module._default_workers(shards, total)
        assert type(got) is int and got == expected, (shards, total, got)


@pytest.mark.parametrize("workers", [1, 2])
def test_verify_progress_bar_only_when_asked(verify_base: Path, capsys: pytest.CaptureFixture[str],
                                             workers: int) -> None:
    verify(verify_base, workers=workers)
    assert capsys.readouterr().err == ""
    verify(verify_base, workers=workers, progress=True)
    err = capsys.readouterr().err
    assert re.search(r"(^|\r)verifying: .* 9/9 ", err), err


def test_verify_structure_problems_are_exact() -> None:
    vector = VECTORS / "invalid" / "index-overlap"
    with pytest.raises(PackerError) as caught:
        open_index(vector)
    assert caught.value.sample is not None and caught.value.path is not None
    import time as _time

    before = _time.monotonic()
    report = verify(vector, decode=True, workers=1)
    assert 0 < report.seconds <= _time.monotonic() - before
    assert report.to_json() == {"ok": False, "path": str(vector), "samples": 0, "shards": 0, "samples_checked": 0,
                                "shards_checked": 0, "bytes_read": 0, "seconds": round(report.seconds, 6),
                                "decoded": True, "damaged_sample_count": 1, "fields": {}, "unlisted": 0,
                                "problems": [_problem("structure", str(caught.value), sample=caught.value.sample,
                                                      path=caught.value.path)]}


def test_verify_decode_refuses_an_unknown_codec_as_structure(vds: Path) -> None:
    import time as _time

    edit_manifest(vds, lambda m: m.update(codec={"name": "zstd-future"}))
    assert verify(vds, workers=1).ok  # the bytes are still checked without decoding
    before = _time.monotonic()
    report = verify(vds, decode=True, workers=1)
    assert 0 < report.seconds <= _time.monotonic() - before
    from packer.codecs import check_decodable

    with pytest.raises(PackerError) as caught:
        check_decodable({"name": "zstd-future"}, path=vds)
    assert report.to_json() == {"ok": False, "path": str(vds), "samples": 0, "shards": 0, "samples_checked": 0,
                                "shards_checked": 0, "bytes_read": 0, "seconds": round(report.seconds, 6),
                                "decoded": True, "damaged_sample_count": 0, "fields": {}, "unlisted": 0,
                                "problems": [_problem("structure", caught.value.message, path=str(vds))]}


def _decode_problem(folder: Path, sample: int, message: str) -> dict[str, Any]:
    lay = _layout(folder)
    shard = next(s for s, (a, b) in enumerate(lay["ranges"]) if a <= sample < b)
    return _problem("decode", message, sample=sample, shard=shard, key=lay["keys"][sample], path=lay["paths"][shard])


def _limit_message(folder: Path, sample: int, limit: int) -> str:
    with open_index(folder) as index:
        shard = index.shard_of(sample)
        data = (folder / index.manifest.shards[shard].path).read_bytes()[
            int(index.index.offset[sample]):int(index.index.offset[sample]) + int(index.index.size[sample])]
        image_format = int(index.index.image_format[sample])
    with pytest.raises(PackerError) as caught:
        decode_image(data, image_format, max_pixels=limit)
    return caught.value.message


@pytest.mark.parametrize("chunk", [None, 700])
def test_verify_decodes_with_the_callers_or_the_recorded_pixel_limit(vds: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     chunk: int | None) -> None:
    """Images are 16 wide and 12..20 high: a 250-pixel limit refuses those 16 or more rows high."""
    if chunk is not None:
        monkeypatch.setattr(verify_module, "CHUNK_SIZE", chunk)
    assert verify(vds, decode=True, workers=1).ok
    with open_index(vds) as index:
        big = [i for i in range(len(index)) if int(index.index.height[i]) * 16 > 250]
    assert 0 < len(big) < 9
    expected = [_decode_problem(vds, i, _limit_message(vds, i, 250)) for i in big]
    assert _verify_json(vds, decode=True, max_pixels=250)["problems"] == expected
    edit_manifest(vds, lambda m: m.update(limits={"max_pixels": 250}))
    assert _verify_json(vds, decode=True)["problems"] == expected
    assert verify(vds, decode=True, max_pixels=10_000, workers=1).ok


def _rewrite_index_column(folder: Path, name: str, change: Callable[[np.ndarray], None]) -> None:
    """Rewrite one index column and make the manifest's index entry (name, size, checksum) match."""
    manifest = json.loads((folder / fmt.MANIFEST_NAME).read_text())
    rows, columns = fmt.parse_column_file((folder / manifest["index"]["path"]).read_bytes(), fmt.INDEX_MAGIC)
    columns = {key: np.array(value) for key, value in columns.items()}
    change(columns[name])
    data = b"".join(bytes(p) for p in fmt.encode_column_file(fmt.INDEX_MAGIC, rows, columns))
    (folder / manifest["index"]["path"]).unlink()
    digest = fmt.checksum(data)
    manifest["index"] = {"path": fmt.index_file_name(digest), "size": len(data), "checksum": fmt.checksum_hex(digest)}
    (folder / manifest["index"]["path"]).write_bytes(data)
    (folder / fmt.MANIFEST_NAME).write_text(json.dumps(manifest))


def test_verify_decode_checks_the_recorded_shape_and_format(vds: Path) -> None:
    with open_index(vds) as index:
        height = int(index.index.height[2])
    _rewrite_index_column(vds, "width", lambda c: c.__setitem__(2, 99))
    _rewrite_index_column(vds, "image_format", lambda c: c.__setitem__(5, int(fmt.ImageFormat.BMP)))
    assert verify(vds, workers=1).ok  # the bytes hash right
    report = _verify_json(vds, decode=True)
    with open_index(vds) as index:
        data = (vds / index.manifest.shards[1].path).read_bytes()
        offset, size = int(index.index.offset[5]), int(index.index.size[5])
    with pytest.raises(PackerError) as caught:
        decode_image(data[offset:offset + size], int(fmt.ImageFormat.BMP))
    assert report["problems"] == [
        _decode_problem(vds, 2, f"decodes to {height}x16 (HxW) pixels but the index says {height}x99"),
        _decode_problem(vds, 5, caught.value.message)]


def test_verify_decode_checks_raw_payload_sizes(tmp_path: Path) -> None:
    out = tmp_path / "raw"
    build(png_folder(tmp_path / "src", 4), out, BuildOptions(codec="raw:size=12x16", alignment=512), workers=1, progress=False)
    assert verify(out, decode=True, workers=1).ok
    with open_index(out) as index:
        size = int(index.index.size[1])
    _rewrite_index_column(out, "width", lambda c: c.__setitem__(0, 0))  # unknown shape: nothing to compare
    _rewrite_index_column(out, "channels", lambda c: c.__setitem__(1, 4))
    assert _verify_json(out, decode=True)["problems"] == [
        _decode_problem(out, 1, f"raw payload is {size} bytes, not 12x16x4")]


@pytest.mark.parametrize("chunk", [1168, 2290])
def test_verify_payloads_ending_on_a_chunk_boundary(verify_base: Path, monkeypatch: pytest.MonkeyPatch,
                                                    chunk: int) -> None:
    """Shard 0's first (1168) and second (2290) payloads end exactly where a chunk ends."""
    monkeypatch.setattr(verify_module, "CHUNK_SIZE", chunk)
    for decode in (False, True):
        report = verify(verify_base, workers=1, decode=decode)
        assert report.ok and report.samples_checked == 9, report.problems


def _exit_on_shard_1(task: Any, on_progress: Any = None, buffer: Any = None) -> Any:
    if task.shard == 1:
        os._exit(3)  # what an out-of-memory kill looks like to the pool
    return _REAL_SCAN_SHARD(task, on_progress, buffer)


def test_verify_a_dying_worker_is_an_exact_io_problem(verify_base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verify_module, "_scan_shard", _exit_on_shard_1)
    report = verify(verify_base, workers=2)
    path = _layout(verify_base)["paths"][1]
    dead = [p.to_json() for p in report.problems if p.shard == 1]
    assert len(dead) == 1 and dead[0] == _problem("io", dead[0]["message"], shard=1, path=path)
    assert re.fullmatch(r"the process checking this shard died \(.+\); run verify with --workers 1 to see where",
                        dead[0]["message"]), dead[0]["message"]


def _scan_slowly_noting_the_pid(task: Any, on_progress: Any = None, buffer: Any = None) -> Any:
    import time as _time

    _time.sleep(0.3)  # long enough that every shard is handed out before one finishes
    result = _REAL_SCAN_SHARD(task, on_progress, buffer)
    result.problems.append(Problem(kind="io", message=str(os.getpid())))
    return result


def test_verify_runs_at_most_the_workers_asked_for(verify_base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 8)  # what an unbounded pool would size itself to
    monkeypatch.setattr(verify_module, "_scan_shard", _scan_slowly_noting_the_pid)
    report = verify(verify_base, workers=2)
    pids = {p.message for p in report.problems}
    assert len(report.problems) == 3 and len(pids) == 2 and str(os.getpid()) not in pids


# --- verify: the padding after a shard's LAST sample is checked -----------------------------------


@pytest.fixture(scope="module")
def padding_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("survivor-verify")
    out = tmp / "ds"
    build(make_png_classes(tmp / "src", count=8), out, BuildOptions(shard_size=16 << 10), workers=1, progress=False)
    return out


@pytest.mark.parametrize("chunk_size", [None, 4096])
def test_damaged_padding_after_the_last_sample_of_a_shard_is_found(
        padding_base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk_size: int | None) -> None:
    """Mutant: the last sample's padding ends at its payload (``nexts[-1] = ends[-1]``)."""
    if chunk_size is not None:  # the chunk-boundary path (_partial) must check it too
        import packer.verify as verify_module

        monkeypatch.setattr(verify_module, "CHUNK_SIZE", chunk_size)
    dataset = Path(shutil.copytree(padding_base, tmp_path / "ds"))
    with open_index(dataset) as index:
        shard_column = index.index.shard
        last = int(np.flatnonzero(shard_column == 0)[-1])
        end = int(index.index.offset[last]) + int(index.index.size[last])
        path = dataset / index.manifest.shards[0].path
    size = path.stat().st_size
    assert end < size, "the last sample of shard 0 needs padding after it"
    with open(path, "r+b") as handle:
        handle.seek(size - 1)  # the very last byte of the file
        handle.write(b"\x01")
    report = verify(dataset, progress=False, workers=1)
    assert [p.kind for p in report.problems] == ["padding", "shard-checksum"]
    assert report.problems[0].sample == last


@pytest.mark.parametrize("chunk", [None, 2048])
def test_verify_decode_names_a_damaged_payload_once(vds: Path, monkeypatch: pytest.MonkeyPatch,
                                                    chunk: int | None) -> None:
    """With --decode, a payload whose checksum fails is a checksum problem only: decoding damaged
    bytes would name the sample a second time (and count it twice)."""
    if chunk is not None:
        monkeypatch.setattr(verify_module, "CHUNK_SIZE", chunk)
    lay = _layout(vds)
    start = lay["offset"][4]
    _poke(vds / lay["paths"][1], start, b"\x00" * 16)  # the PNG signature: it cannot decode either
    report = verify(vds, workers=1, decode=True)
    assert [(p.kind, p.sample) for p in report.problems] == [("checksum", 4), ("shard-checksum", None)]
    assert report.damaged_samples == [4] and report.damaged_sample_count == 1


@pytest.mark.parametrize("chunk", [None, 64])
def test_verify_finds_damage_in_a_padding_of_one_byte(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      chunk: int | None) -> None:
    """1x5 RGB raw payloads are 15 bytes: at alignment 16 each is followed by one byte of padding."""
    if chunk is not None:
        monkeypatch.setattr(verify_module, "CHUNK_SIZE", chunk)
    build(png_folder(tmp_path / "src", 6), tmp_path / "ds", BuildOptions(codec="raw:size=1x5", alignment=16),
          workers=1, progress=False)
    lay = _layout(tmp_path / "ds")
    assert set(lay["size"]) == {15}
    _poke(tmp_path / "ds" / lay["paths"][0], lay["offset"][2] + 15, b"\x01")
    report = verify(tmp_path / "ds", workers=1)
    assert [(p.kind, p.sample) for p in report.problems if p.kind != "shard-checksum"] == [("padding", 2)]


@pytest.mark.parametrize("position", [44, 63])
def test_verify_checks_the_first_and_last_reserved_header_byte(vds: Path, position: int) -> None:
    lay = _layout(vds)
    _poke(vds / lay["paths"][1], position, b"\x01")
    assert _verify_json(vds)["problems"] == [
        _problem("header", "reserved header bytes 44..63 are not zero", shard=1, path=lay["paths"][1]),
        _shard_checksum_problem(vds, 1)]
