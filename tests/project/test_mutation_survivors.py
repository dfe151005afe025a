"""Tests that kill the mutants a hand-made mutation pass found the suite let through (issue #16).

Each test names the bug it stands for: a plausible one-line change to a module that decides what
bytes a user gets, which every other test in the suite passed. ``scripts/mutate.py`` finds more
of these with mutmut; the ones it found are in ``tests/project/test_mutation_kills.py``.
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from packer import format as fmt
from packer.writer import build
from packer.writer.pack import pack_planned_shard
from packer.writer.plan import BuildOptions, load_plan, plan_shards
from packer.writer.records import read_record, record_path
from packer.writer.staging import PLAN_NAME, STAGING_DIR
from packer.dataset import open_index
from packer.errors import RejectedImageError
from packer.imageinfo import ImageFormat, probe_image
from packer.order import block_order, epoch_order, epoch_rng, index_blocks, random_order
from packer.verify import verify


def make_images(root: Path, count: int = 10, seed: int = 0) -> Path:
    """Noisy PNGs of different sizes in two class folders (so payloads need padding)."""
    rng = np.random.default_rng(seed)
    for i in range(count):
        folder = root / ("a" if i % 2 else "b")
        folder.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, (20 + i, 24 + 2 * i, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{i}.png")
    return root


# --- build resume: a finished shard whose file was truncated is packed again ----------------------

def test_resume_repacks_a_finished_shard_whose_file_was_truncated(tmp_path: Path) -> None:
    """Mutant: ``read_record`` no longer compares the shard file's size with its record."""
    src, out = make_images(tmp_path / "src"), tmp_path / "ds"
    options = BuildOptions(shard_size=16 << 10)
    build(src, out, options, workers=1, part=(0, 1), progress=False)  # every shard packed, no manifest
    plan = load_plan(out / STAGING_DIR / PLAN_NAME, src)
    assert plan.shard_count >= 2
    header, _ = read_record(record_path(out, 1), plan.fingerprint, out)
    shard = out / header["path"]
    full_size = shard.stat().st_size
    assert full_size == header["size"]
    with open(shard, "r+b") as handle:  # a crash or a full disk cut it short after its record landed
        handle.truncate(full_size - 4096)
    assert read_record(record_path(out, 1), plan.fingerprint, out) is None

    result = build(src, out, options, workers=1, resume=True, progress=False)
    assert result.sample_count == 10
    report = verify(out, progress=False, workers=1)
    assert report.ok, report.problems
    assert shard.stat().st_size == full_size  # packed again: same plan, same bytes, same name


def test_a_record_of_a_truncated_shard_is_redone_by_pack(tmp_path: Path) -> None:
    src, out = make_images(tmp_path / "src"), tmp_path / "ds"
    build(src, out, BuildOptions(shard_size=16 << 10), workers=1, part=(0, 1), progress=False)
    plan = load_plan(out / STAGING_DIR / PLAN_NAME, src)
    header, _ = read_record(record_path(out, 0), plan.fingerprint, out)
    shard = out / header["path"]
    shard.write_bytes(shard.read_bytes()[:-1])  # one byte short is as bad as half
    again = pack_planned_shard(plan, out, 0)
    assert again["size"] == header["size"] == shard.stat().st_size
    # and a shard file one byte too long is not trusted either
    with open(shard, "ab") as handle:
        handle.write(b"\0")
    assert read_record(record_path(out, 0), plan.fingerprint, out) is None


# --- plan: shard capacity leaves room for the header's data offset -------------------------------

@pytest.mark.parametrize("alignment", [1, 512, 4096])
def test_planned_shards_never_exceed_the_shard_size(alignment: int) -> None:
    """Mutant: capacity = shard_size (the header's data offset forgotten): 20 KiB shards for 16 KiB."""
    shard_size = 16 << 10
    sizes = np.full(40, 4096, dtype=np.uint64)
    starts = plan_shards(sizes, alignment, shard_size)
    data_offset = fmt.shard_data_offset(alignment)
    for a, b in zip(starts[:-1], starts[1:]):
        padded = sum(fmt.align_up(int(s), alignment) for s in sizes[a:b])
        assert data_offset + padded <= shard_size, (alignment, a, b)
    # and greedily full: one more sample would not have fitted
    per_shard = (shard_size - data_offset) // fmt.align_up(4096, alignment)
    assert np.all(np.diff(starts)[:-1] == per_shard)


def test_built_shards_are_at_most_the_shard_size(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "x").mkdir(parents=True)
    for i in range(8):  # stored images of exactly 4 KiB: four of them fill 16 KiB of payload
        (src / "x" / f"{i}.png").write_bytes(_png_of_size(4096, seed=i))
    out = tmp_path / "ds"
    build(src, out, BuildOptions(shard_size=16 << 10), workers=1, progress=False)
    with open_index(out) as index:
        sizes = [s.size for s in index.manifest.shards]
    assert sizes and max(sizes) <= 16 << 10, sizes
    assert len(sizes) == 3  # 3 + 3 + 2 samples after the 4 KiB header region


def _png_of_size(size: int, seed: int) -> bytes:
    """A valid PNG padded to exactly ``size`` bytes with an ancillary chunk before IEND."""
    buffer = io.BytesIO()
    Image.fromarray(np.full((4, 4, 3), seed, dtype=np.uint8)).save(buffer, "PNG")
    data = buffer.getvalue()
    body, iend = data[:-12], data[-12:]
    import zlib

    filler = size - len(data) - 12
    assert filler >= 0
    chunk = b"zzZz" + bytes(filler)
    crc = zlib.crc32(chunk).to_bytes(4, "big")
    result = body + filler.to_bytes(4, "big") + chunk + crc + iend
    assert len(result) == size
    return result


# --- verify: the padding after a shard's LAST sample is checked ---------------------------------

@pytest.fixture(scope="module")
def verify_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("survivor-verify")
    out = tmp / "ds"
    build(make_images(tmp / "src", count=8), out, BuildOptions(shard_size=16 << 10), workers=1, progress=False)
    return out


@pytest.mark.parametrize("chunk_size", [None, 4096])
def test_damaged_padding_after_the_last_sample_of_a_shard_is_found(
        verify_base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk_size: int | None) -> None:
    """Mutant: the last sample's padding ends at its payload (``nexts[-1] = ends[-1]``)."""
    if chunk_size is not None:  # the chunk-boundary path (_partial) must check it too
        import packer.verify as verify_module

        monkeypatch.setattr(verify_module, "CHUNK_SIZE", chunk_size)
    dataset = Path(shutil.copytree(verify_base, tmp_path / "ds"))
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


# --- order: blocks are cut at shard boundaries; epochs seeded by (seed, epoch) -----------------------

def test_index_blocks_cut_at_shard_boundaries_even_inside_one_window() -> None:
    """Mutant: no cut where ``shard`` changes (tests only had shards bigger than a block)."""
    offset = np.array([4096, 8192, 12288, 4096, 8192, 4096], dtype=np.uint64)
    size = np.full(6, 100, dtype=np.uint64)
    shard = np.array([0, 0, 0, 1, 1, 2], dtype=np.uint32)
    blocks = index_blocks(offset, size, shard, block_bytes=1 << 20)
    assert blocks.tolist() == [0, 3, 5, 6]
    # a shard change where the offset falls in a different window is one cut, not two
    offset2 = np.array([4096, 8 << 20, 4096], dtype=np.uint64)
    assert index_blocks(offset2, size[:3], np.array([0, 0, 1]), block_bytes=1 << 20).tolist() == [0, 1, 2, 3]


def test_epoch_orders_are_seeded_by_the_pair_not_the_sum() -> None:
    """Mutant: ``PCG64(seed + epoch)``: seed 7 epoch 4 would equal seed 8 epoch 3."""
    n = 1000
    assert not np.array_equal(random_order(n, seed=7, epoch=4), random_order(n, seed=8, epoch=3))
    assert not np.array_equal(random_order(n, seed=0, epoch=1), random_order(n, seed=1, epoch=0))
    # the documented generator, exactly: PCG64([seed, epoch])
    expected = np.random.Generator(np.random.PCG64([7, 4])).permutation(n)
    assert np.array_equal(random_order(n, seed=7, epoch=4), expected)
    assert epoch_rng(7, 4).integers(1 << 62) == np.random.Generator(np.random.PCG64([7, 4])).integers(1 << 62)
    blocks = np.arange(0, n + 1, 10, dtype=np.int64)
    assert not np.array_equal(block_order(blocks, seed=7, epoch=4), block_order(blocks, seed=8, epoch=3))
    assert not np.array_equal(epoch_order("random", n, seed=7, epoch=4), epoch_order("random", n, seed=8, epoch=3))


# --- imageinfo: the WEBP truncation check counts the 8-byte RIFF header --------------------------

def _webp() -> bytes:
    buffer = io.BytesIO()
    rng = np.random.default_rng(3)
    Image.fromarray(rng.integers(0, 256, (32, 40, 3), dtype=np.uint8)).save(buffer, "WEBP", quality=80)
    return buffer.getvalue()


@pytest.mark.parametrize("cut", [1, 4, 7, 8])
def test_webp_cut_by_a_few_bytes_is_truncated(cut: int) -> None:
    """Mutant: RIFF end = size field (the 8 bytes of 'RIFF' + size forgotten): cuts < 8 bytes pass."""
    data = _webp()
    assert int.from_bytes(data[4:8], "little") + 8 == len(data)
    assert probe_image(data, name="ok.webp").image_format == ImageFormat.WEBP
    with pytest.raises(RejectedImageError) as caught:
        probe_image(data[:-cut], name="cut.webp")
    assert caught.value.reason == "truncated"
    assert f"says the file is {len(data)} bytes, found {len(data) - cut}" in caught.value.message
