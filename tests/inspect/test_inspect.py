"""inspect's library side: the index-only summary, its text form, and the contact sheet."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from packer.writer import build
from packer.dataset import open_dataset, open_index
from packer.errors import OptionError
from packer.inspect.grid import CAPTION_HEIGHT, contact_sheet, pick_samples
from packer.writer.plan import BuildOptions
from packer.inspect.summary import format_summary, summarize


def make_images(root: Path) -> Path:
    """Two classes of small images (3 cat, 5 dog) in JPEG and PNG, plus two files the build rejects."""
    rng = np.random.default_rng(1)
    for name, count in (("cat", 3), ("dog", 5)):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            size = (20 + 10 * i, 30 + 4 * i)
            mode = "L" if (name, i) == ("dog", 4) else "RGB"
            pixels = rng.integers(0, 256, size + ((3,) if mode == "RGB" else ()), dtype=np.uint8)
            Image.fromarray(pixels, mode).save(root / name / f"{i}.{'png' if i % 2 else 'jpg'}")
    (root / "cat" / "empty.jpg").write_bytes(b"")
    (root / "dog" / "notes.jpg").write_bytes(b"this is not an image at all")
    return root


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("inspect")
    out = tmp / "ds"
    build(make_images(tmp / "src"), out, BuildOptions(shard_size=12 << 10, seed=3, alignment=4096), workers=1, progress=False)
    return out


def test_summary_counts_and_bytes(folder: Path) -> None:
    s = summarize(folder)
    json.dumps(s)  # JSON-ready
    with open_index(folder) as index:
        sizes = index.index.size
        shard_sizes = [e.size for e in index.manifest.shards]
        assert s["samples"] == len(index) == 8
        assert s["shards"]["count"] == len(shard_sizes)
        assert s["shards"]["bytes"]["max"] == max(shard_sizes)
        payload = int(sizes.sum())
        index_size = index.manifest.index.size
    assert s["classes"] == [{"label": 0, "name": "cat", "count": 3}, {"label": 1, "name": "dog", "count": 5}]
    assert s["unlabeled"] == 0
    b = s["bytes"]
    assert b["payload"] == payload
    assert b["shards"] == sum(shard_sizes)
    assert b["index"] == index_size
    assert b["header"] == 4096 * len(shard_sizes)
    assert b["padding"] == sum(shard_sizes) - payload - b["header"]
    assert b["total"] == sum(shard_sizes) + index_size + (folder / "manifest.json").stat().st_size
    assert b["padding_overhead_percent"] == pytest.approx(100 * (sum(shard_sizes) - payload) / payload, abs=1e-3)
    assert s["sample_bytes"]["min"] == int(sizes.min()) and s["sample_bytes"]["max"] == int(sizes.max())
    assert s["alignment"] == 4096
    assert s["codec"]["name"] == "passthrough"
    assert s["build"]["settings"]["layout"]["seed"] == 3
    assert s["dataset_format_version"] == 1


def test_summary_image_statistics(folder: Path) -> None:
    images = summarize(folder)["images"]
    assert images["width"]["min"] == 30 and images["width"]["max"] == 46
    assert images["height"]["min"] == 20 and images["height"]["max"] == 60
    assert images["height"]["median"] in {20, 30, 40, 50, 60}  # a real value, not an interpolation
    assert images["formats"] == {"jpeg": 5, "png": 3}
    assert images["channels"] == {"1": 1, "3": 7}
    assert images["unknown_size"] == 0


def test_summary_lists_rejected_files(folder: Path) -> None:
    rejected = summarize(folder)["rejected"]
    assert rejected["available"] and rejected["count"] == 2
    assert rejected["by_reason"] == {"empty-file": 1, "not-an-image": 1}
    assert {e["key"] for e in rejected["first"]} == {"cat/empty.jpg", "dog/notes.jpg"}
    assert len(summarize(folder, rejected_shown=1)["rejected"]["first"]) == 1


def test_summary_never_reads_shards(folder: Path, tmp_path: Path) -> None:
    copy = Path(shutil.copytree(folder, tmp_path / "ds"))
    shutil.rmtree(copy / "shards")
    (copy / "build-report.jsonl").unlink()
    s = summarize(copy)
    assert s["samples"] == 8
    assert s["rejected"] == {"available": False, "count": None, "by_reason": {}, "first": []}
    assert "rejected   unknown" in format_summary(s)


def test_format_summary_is_readable(folder: Path) -> None:
    text = format_summary(summarize(folder))
    for fragment in ("samples    8 in", "classes    2", "cat", "dog", "alignment  4096", "codec      passthrough",
                     "overhead", "rejected   2 file(s)", "empty-file", "cat/empty.jpg", "formats    jpeg 5, png 3",
                     "seed=3"):
        assert fragment in text, fragment
    lines = dict(line.split(None, 1) for line in text.splitlines() if line.strip().startswith(("cat", "dog")))
    assert lines["cat"].strip() == "3" and lines["dog"].strip() == "5"


def test_summary_of_an_empty_dataset() -> None:
    empty = Path(__file__).resolve().parents[2] / "formats" / "vectors" / "valid" / "empty"
    if not empty.exists():
        pytest.skip("no golden vectors")
    s = summarize(empty)
    assert s["samples"] == 0 and s["shards"]["count"] == 0 and s["sample_bytes"] is None
    assert "samples    0 in 0 shard(s)" in format_summary(s)


def test_summary_is_fast_on_a_million_samples(tmp_path: Path) -> None:
    """Vectorised: a synthetic 1M-sample index (shards never exist) summarises in well under a second."""
    import time

    from packer import format as fmt
    from packer.writer.commit import commit_dataset

    n, shards, alignment = 1_000_000, 10, 4096
    per = n // shards
    size = np.full(n, 5000, dtype=np.uint64)
    offset = np.tile(np.arange(per, dtype=np.uint64) * 8192 + 4096, shards)
    entries = [fmt.ShardEntry(path=f"shards/shard-{s:05d}-{0:016x}.pks", size=4096 + per * 8192, checksum=0,
                              sample_count=per) for s in range(shards)]
    key_offsets = np.arange(n + 1, dtype=np.uint64)
    columns = {"shard": np.repeat(np.arange(shards, dtype=np.uint32), per), "offset": offset, "size": size,
               "checksum": np.zeros(n, np.uint64), "label": np.arange(n, dtype=np.int64) % 1000,
               "width": np.arange(n, dtype=np.uint32) % 640 + 1, "height": np.full(n, 480, np.uint32),
               "channels": np.full(n, 3, np.uint8), "image_format": np.ones(n, np.uint8),
               "key_offsets": key_offsets, "keys": np.full(n, ord("k"), np.uint8),
               "meta_offsets": np.zeros(n + 1, np.uint64), "meta": np.zeros(0, np.uint8)}
    out = tmp_path / "big"
    (out / ".packer-build").mkdir(parents=True)
    commit_dataset(out, columns, entries, classes=[f"c{i}" for i in range(1000)], codec={"name": "passthrough"},
                   alignment=alignment, build_info={}, rejected=[], history=[], cleanup=False)
    started = time.perf_counter()
    s = summarize(out)
    elapsed = time.perf_counter() - started
    assert s["samples"] == n and s["classes"][999]["count"] == 1000
    assert s["images"]["width"]["max"] == 640
    assert elapsed < 2.0, elapsed  # ~0.1 s on the development machine; generous for loaded CI


# --- contact sheet ----------------------------------------------------------------------------

def test_contact_sheet_size_and_content(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "grid.png"
    with open_dataset(folder) as ds:
        result = contact_sheet(ds, out, count=5, columns=3, thumb=40)
    assert (result["columns"], result["rows"]) == (3, 2)
    assert result["failed"] == [] and len(result["samples"]) == 5
    with Image.open(out) as image:
        assert image.format == "PNG"
        assert image.size == (3 * 40, 2 * (40 + CAPTION_HEIGHT)) == (result["width"], result["height"])
        # the last cell of the second row is empty: background colour
        assert image.convert("RGB").getpixel((2 * 40 + 20, 40 + CAPTION_HEIGHT + 20)) == (24, 24, 24)
    with open_dataset(folder) as ds:
        for columns, thumb in ((0, 40), (3, 0)):
            with pytest.raises(OptionError) as caught:
                contact_sheet(ds, tmp_path / "bad.png", columns=columns, thumb=thumb)
            assert caught.value.message == f"columns and thumb must be at least 1, got {columns} and {thumb}"
    assert not (tmp_path / "bad.png").exists()


def test_contact_sheet_marks_damaged_samples(folder: Path, tmp_path: Path) -> None:
    copy = Path(shutil.copytree(folder, tmp_path / "ds"))
    with open_index(copy) as index:
        path = copy / index.manifest.shards[index.shard_of(2)].path
        offset = int(index.index.offset[2]) + 20
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(b"\x00\x01\x02")
    with open_dataset(copy) as ds:
        result = contact_sheet(ds, tmp_path / "g.png", indices=[0, 2], columns=2, thumb=32)
    assert result["failed"] == [2] and result["samples"] == [0, 2]
    with Image.open(tmp_path / "g.png") as image:
        assert image.convert("RGB").getpixel((32 + 4, 4)) == (128, 128, 128)  # the grey "!" tile


def test_pick_samples_is_deterministic() -> None:
    assert pick_samples(100, 10, seed=5) == pick_samples(100, 10, seed=5)
    assert pick_samples(100, 10, seed=5) != pick_samples(100, 10, seed=6)
    assert pick_samples(4, 10) == [0, 1, 2, 3]
    assert pick_samples(0, 10) == []
    picked = pick_samples(1000, 64)
    assert picked == sorted(set(picked)) and len(picked) == 64
