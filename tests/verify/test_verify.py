"""verify: intact datasets pass; every kind of damage is named (shard, sample, key) and never crashes."""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

import packer
import packer.verify as verify_module
from packer.writer import build
from packer.dataset import open_index
from packer.writer.plan import BuildOptions
from packer.verify import PROBLEM_KINDS, Problem, VerifyReport, verify

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
