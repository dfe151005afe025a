"""Page blocks (formats/SPEC.md §3.4): runs of small records are read as the 4 KiB-aligned blocks
that hold them, by every backend that reads blocks (pread, O_DIRECT, the GPU loaders' host path)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import packer
import packer.backends.direct as direct
from packer.backends.buffers import buffer_address
from packer.backends.runs import plan_runs
from packer.dataset import open_dataset
from packer.writer import build
from packer.writer.settings import BuildSettings, LayoutSettings, RunOptions

from helpers import png_bytes

REPO = Path(__file__).resolve().parents[2]
VECTOR = REPO / "formats" / "vectors" / "valid" / "small-records"
PAGE = 4096


def _direct_io_works(folder: Path) -> bool:
    import mmap

    probe = folder / ".odirect-probe"
    probe.write_bytes(bytes(PAGE))
    try:
        fd = os.open(probe, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return False
    try:
        os.preadv(fd, [mmap.mmap(-1, PAGE)], 0)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
        probe.unlink()


@pytest.fixture(scope="module")
def expected() -> dict:
    return json.loads((VECTOR / "expected.json").read_bytes())


@pytest.fixture(scope="module")
def small_records(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The vector, copied where O_DIRECT works (or skip)."""
    base = tmp_path_factory.mktemp("page-blocks")
    if not _direct_io_works(base):
        pytest.skip(f"the file system of {base} refuses O_DIRECT")
    return Path(shutil.copytree(VECTOR, base / "small-records"))


def test_the_vector_lists_the_page_blocks_plan_runs_reads(expected: dict) -> None:
    assert expected["alignment"] == 64 and expected["page_size"] == PAGE
    with packer.open_index(VECTOR) as index:
        sizes = np.array([entry.size for entry in index.manifest.shards], dtype=np.int64)
        assert any(size % PAGE for size in sizes), "a shard that ends in a partial page"
        for block in expected["page_blocks"]:
            wanted = np.arange(block["first"], block["last"] + 1)
            plan = plan_runs(index.index, wanted, pages=sizes)
            assert plan.run_shard.tolist() == [block["shard"]]
            assert plan.run_offset.tolist() == [block["start"]]
            assert (plan.run_offset + plan.run_bytes).tolist() == [block["end"]]
            offsets = index.index.offset[wanted].astype(np.int64)
            assert plan.sample_pos.tolist() == (offsets - block["start"]).tolist()


def test_runs_sharing_a_page_are_one_read_and_the_others_are_not(expected: dict) -> None:
    with packer.open_index(VECTOR) as index:
        ix = index.index
        sizes = np.array([entry.size for entry in index.manifest.shards], dtype=np.int64)
        shard0 = np.flatnonzero(ix.shard == 0)
        page_of_start = ix.offset[shard0].astype(np.int64) // PAGE
        page_of_end = (ix.offset[shard0].astype(np.int64) + ix.size[shard0].astype(np.int64) - 1) // PAGE
        first, other = int(shard0[0]), int(shard0[2])
        assert page_of_start[2] <= page_of_end[0] + 1  # sample 2 starts in or next to sample 0's last page
        plan = plan_runs(ix, [other, first], pages=sizes)
        touching = page_of_start[2] * PAGE <= -(-(int(ix.offset[first]) + int(ix.size[first])) // PAGE) * PAGE
        assert len(plan.run_offset) == (1 if touching else 2)
        # samples of two shards are never one read, and without block= consecutive samples only
        last_of_0, first_of_1 = int(shard0[-1]), int(np.flatnonzero(ix.shard == 1)[0])
        assert len(plan_runs(ix, [last_of_0, first_of_1], pages=sizes).run_offset) == 2
        assert len(plan_runs(ix, [first, other]).run_offset) == 2


def test_block_reads_start_on_pages_in_the_buffer_too(expected: dict) -> None:
    with packer.open_index(VECTOR) as index:
        sizes = np.array([entry.size for entry in index.manifest.shards], dtype=np.int64)
        rng = np.random.default_rng(0)
        for _ in range(50):
            wanted = rng.choice(len(index), size=rng.integers(1, len(index)), replace=True)
            plan = plan_runs(index.index, wanted, pages=sizes)
            assert np.all(plan.run_offset % PAGE == 0) and np.all(plan.run_pos % PAGE == 0)
            ends = plan.run_offset + plan.run_bytes
            assert np.all((ends % PAGE == 0) | (ends == sizes[plan.run_shard]))
            assert np.all(ends <= sizes[plan.run_shard])


@pytest.mark.parametrize("backend", ["pread", "direct"])
def test_every_backend_reads_small_records_through_page_blocks(small_records: Path, backend: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    preads: list[tuple[int, int, int]] = []
    bounced: list[int] = []
    real_preadv, real_window = os.preadv, direct.DirectShard._read_window
    monkeypatch.setattr(direct.os, "preadv", lambda fd, buffers, offset: preads.append(
        (offset, memoryview(buffers[0]).nbytes, buffer_address(buffers[0]))) or real_preadv(fd, buffers, offset))
    monkeypatch.setattr(direct.DirectShard, "_read_window",
                        lambda self, start, length: bounced.append(start) or real_window(self, start, length))
    rng = np.random.default_rng(1)
    with open_dataset(small_records) as mapped, open_dataset(small_records, backend=backend) as ds:
        shard_sizes = [entry.size for entry in ds.manifest.shards]
        for _ in range(30):
            wanted = rng.choice(len(ds), size=rng.integers(1, 8), replace=True)
            batch = ds.read_batch(wanted)
            for j, i in enumerate(wanted.tolist()):
                assert bytes(batch[j]) == mapped.read(i)
    if backend == "direct":
        assert preads and all(o % PAGE == 0 and n % PAGE == 0 and a % PAGE == 0 for o, n, a in preads)
        # The only bounce: a shard's last, partial page (and the open's probe of page 0).
        last_pages = {size - size % PAGE for size in shard_sizes if size % PAGE}
        assert set(bounced) <= last_pages | {0}


def test_gpu_raw_batches_read_small_records(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from packer import gpu

    source = tmp_path / "src"
    for k in range(30):
        (source / ("a" if k % 2 else "b")).mkdir(parents=True, exist_ok=True)
        (source / ("a" if k % 2 else "b") / f"{k:02d}.png").write_bytes(png_bytes(k, (12, 14)))
    out = tmp_path / "raw"
    build(source, out, BuildSettings(codec="raw:size=10x12", layout=LayoutSettings(shard_size=3 << 10)),
          RunOptions(workers=1))
    with open_dataset(out) as ds:
        assert ds.alignment == 8 and len(ds.manifest.shards) > 2  # 360-byte samples: 8 pads nothing
        stored = np.stack([np.frombuffer(ds.read(i), dtype=np.uint8).reshape(10, 12, 3) for i in range(len(ds))])
    for order in ("random", "sequential"):
        loader = gpu.GpuRawBatches(out, 7, order=order, seed=2, device="cpu", read_block=4096)
        with loader:
            seen = []
            for images, labels in loader:
                seen.append(images.shape[0])
            assert sum(seen) == 30
        loader = gpu.GpuRawBatches(out, 7, order=order, seed=2, device="cpu", read_block=4096,
                                   fields=("image", "index"))
        with loader:
            for batch in loader:
                assert np.array_equal(batch["image"].numpy(), stored[batch["index"].numpy()])


def test_page_blocks_that_touch_are_one_read_and_a_gap_of_a_page_is_two() -> None:
    from types import SimpleNamespace

    # shard 0: samples at 64, 1000, 4096 (a page start), 5000, 9000; shard 1: one sample
    index = SimpleNamespace(shard=np.array([0, 0, 0, 0, 0, 1]), offset=np.array([64, 1000, 4096, 5000, 9000, 64]),
                            size=np.array([900, 3000, 800, 3000, 100, 10]))
    pages = np.array([9100, 4096])
    touching = plan_runs(index, [2, 0], pages=pages)   # [0, 4096) and [4096, 8192): one read of two pages
    assert touching.run_offset.tolist() == [0] and touching.run_bytes.tolist() == [8192]
    assert touching.starts.tolist() == [4096, 64]
    apart = plan_runs(index, [0, 4], pages=pages)      # [0, 4096) and [8192, 9100): a page between them
    assert apart.run_offset.tolist() == [0, 8192] and apart.run_bytes.tolist() == [4096, 908]
    assert apart.run_pos.tolist() == [0, 4096, 8192]   # the short last block still gets a whole page slot
    across = plan_runs(index, [4, 5], pages=pages)     # two shards: never one read
    assert across.run_shard.tolist() == [0, 1] and across.run_bytes.tolist() == [908, 4096]
    assert across.starts.tolist() == [9000 - 8192, 4096 + 64]
