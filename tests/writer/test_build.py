"""packer build: determinism, layout, inputs (folder, CSV, JSONL), options and clear errors."""

from __future__ import annotations

import filecmp
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from packer import format as fmt
from packer.writer import build
from packer.dataset import open_dataset
from packer.errors import EmptySourceError, OutputExistsError, SourceError
from packer.writer.plan import plan_shards
from packer import BuildSettings, LayoutSettings, RunOptions, SourceSettings
from helpers import dataset_files, write_images






@pytest.fixture
def source(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    write_images(root, {"cat": 7, "dog": 5, "emu": 6})
    return root


def test_round_trip_every_byte_and_label(source: Path, tmp_path: Path) -> None:
    result = build(source, tmp_path / "ds", BuildSettings(layout=LayoutSettings(alignment=4096, shard_size=16 << 10)), RunOptions(workers=1))
    assert result.sample_count == 18 and result.shard_count > 1 and not result.rejected
    with open_dataset(tmp_path / "ds", verify_checksums=True) as ds:
        assert ds.classes == ("cat", "dog", "emu")
        seen = set()
        for i in range(len(ds)):
            key = ds.key(i)
            seen.add(key)
            assert ds.read(i) == (source / key).read_bytes()
            assert ds.classes[int(ds.labels[i])] == key.split("/")[0]
            with Image.open(source / key) as image:
                assert (int(ds.index.width[i]), int(ds.index.height[i])) == image.size
        assert len(seen) == 18


def test_identical_bytes_whatever_the_worker_count(source: Path, tmp_path: Path) -> None:
    options = BuildSettings(layout=LayoutSettings(alignment=4096, shard_size=12 << 10, seed=7))
    build(source, tmp_path / "w1", options, RunOptions(workers=1))
    build(source, tmp_path / "w2", options, RunOptions(workers=2))
    build(source, tmp_path / "w3", options, RunOptions(workers=3))
    one = dataset_files(tmp_path / "w1")
    assert one == dataset_files(tmp_path / "w2") == dataset_files(tmp_path / "w3")
    assert any(name.startswith("shards/") for name in one)


def test_seed_changes_order_and_no_shuffle_keeps_sorted(source: Path, tmp_path: Path) -> None:
    build(source, tmp_path / "a", BuildSettings(layout=LayoutSettings(seed=1)), RunOptions(workers=1))
    build(source, tmp_path / "b", BuildSettings(layout=LayoutSettings(seed=2)), RunOptions(workers=1))
    build(source, tmp_path / "s", BuildSettings(layout=LayoutSettings(shuffle=False)), RunOptions(workers=1))
    keys = {name: list(open_dataset(tmp_path / name).keys()) for name in "abs"}
    assert keys["a"] != keys["b"] and sorted(keys["a"]) == sorted(keys["b"])
    assert keys["s"] == sorted(keys["s"], key=str.encode)
    assert keys["a"] != keys["s"]  # shuffled by default: streaming is not class-sorted


def test_layout_is_aligned_and_padding_is_zero(source: Path, tmp_path: Path) -> None:
    build(source, tmp_path / "ds", BuildSettings(layout=LayoutSettings(alignment=4096, shard_size=16 << 10)), RunOptions(workers=1))
    ds = open_dataset(tmp_path / "ds")
    for number, entry in enumerate(ds.manifest.shards):
        data = (tmp_path / "ds" / entry.path).read_bytes()
        assert len(data) % 4096 == 0 and data[:8] == fmt.SHARD_MAGIC
        first, end = ds.shard_range(number)
        cursor = fmt.shard_data_offset(4096)
        assert not any(data[fmt.SHARD_HEADER_SIZE:cursor])
        for i in range(first, end):
            offset, size = int(ds.index.offset[i]), int(ds.index.size[i])
            assert offset == cursor and offset % 4096 == 0
            cursor = fmt.align_up(offset + size, 4096)
            assert not any(data[offset + size:cursor])
        assert cursor == len(data)


def test_alignment_one_packs_tightly(source: Path, tmp_path: Path) -> None:
    build(source, tmp_path / "ds", BuildSettings(layout=LayoutSettings(alignment=1)), RunOptions(workers=1))
    ds = open_dataset(tmp_path / "ds")
    assert ds.manifest.alignment == 1
    total = sum(p.stat().st_size for p in source.rglob("*.jpg"))
    assert sum(s.size for s in ds.manifest.shards) == total + fmt.SHARD_HEADER_SIZE * len(ds.manifest.shards)


def test_oversize_sample_gets_a_shard_of_its_own() -> None:
    sizes = np.array([100, 5000, 100, 100, 9000, 100], dtype=np.uint64)
    starts = plan_shards(sizes, alignment=1, shard_size=1000 + fmt.SHARD_HEADER_SIZE)
    assert starts.tolist() == [0, 1, 2, 4, 5, 6]


def test_manifest_inputs_csv_and_jsonl(source: Path, tmp_path: Path) -> None:
    files = sorted(source.rglob("*.jpg"))
    csv_path = tmp_path / "list.csv"
    csv_path.write_text("path,label,caption\n" + "".join(
        f"{p.relative_to(source).as_posix()},{p.parent.name},\"a {p.stem}, photo\"\n" for p in files))
    build(csv_path, tmp_path / "csv", BuildSettings(source=SourceSettings(root=source)), RunOptions(workers=1))
    ds = open_dataset(tmp_path / "csv")
    assert ds.classes == ("cat", "dog", "emu") and len(ds) == len(files)
    i = ds.find("dog/002.jpg")
    assert ds.metadata(i) == {"caption": "a 002, photo"} and ds.classes[int(ds.labels[i])] == "dog"

    jsonl = tmp_path / "list.jsonl"
    jsonl.write_text("".join(json.dumps({"path": p.relative_to(source).as_posix(), "label": n,
                                         "metadata": {"n": n}}) + "\n" for n, p in enumerate(files)))
    build(jsonl, tmp_path / "jsonl", BuildSettings(source=SourceSettings(root=source)), RunOptions(workers=1))
    ds = open_dataset(tmp_path / "jsonl")
    assert ds.classes == () and sorted(ds.labels.tolist()) == list(range(len(files)))
    for i in range(len(ds)):
        assert ds.metadata(i) == {"n": int(ds.labels[i])}


def test_manifest_rows_outside_root_missing_and_duplicate_are_rejected(source: Path, tmp_path: Path) -> None:
    csv_path = tmp_path / "list.csv"
    csv_path.write_text("path,label\ncat/000.jpg,cat\n../escape.jpg,cat\ncat/000.jpg,cat\nnope.jpg,dog\n"
                        "/etc/passwd,dog\n,dog\n")
    result = build(csv_path, tmp_path / "ds", BuildSettings(source=SourceSettings(root=source)), RunOptions(workers=1))
    reasons = sorted(r.reason for r in result.rejected)
    assert result.sample_count == 1
    assert reasons == ["bad-manifest-row", "duplicate-entry", "missing", "outside-root", "outside-root"]
    report = (tmp_path / "ds" / "build-report.jsonl").read_text().splitlines()
    summary = json.loads(report[0])
    assert summary["type"] == "summary" and summary["packed"] + summary["rejected"] == 6
    assert len(report) == 1 + 5


def test_refuses_existing_dataset_without_overwrite(source: Path, tmp_path: Path) -> None:
    build(source, tmp_path / "ds", BuildSettings(), RunOptions(workers=1))
    with pytest.raises(OutputExistsError, match="--overwrite"):
        build(source, tmp_path / "ds", BuildSettings(), RunOptions(workers=1))
    before = dataset_files(tmp_path / "ds")
    build(source, tmp_path / "ds", BuildSettings(layout=LayoutSettings(seed=3)), RunOptions(workers=1, overwrite=True))
    after = dataset_files(tmp_path / "ds")
    assert before != after
    # old shard and index files are gone: only what the new manifest references is left
    manifest = fmt.parse_manifest(after["manifest.json"])
    referenced = {s.path for s in manifest.shards} | {manifest.index.path}
    assert {n for n in after if n.startswith(("shards/", "index-"))} == referenced
    assert not (tmp_path / "ds" / ".packer-build").exists()


def test_clear_errors_for_missing_and_empty_sources(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="does not exist"):
        build(tmp_path / "nope", tmp_path / "out")
    (tmp_path / "empty" / "cls").mkdir(parents=True)
    with pytest.raises(EmptySourceError, match="no files"):
        build(tmp_path / "empty", tmp_path / "out")
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_rebuild_into_same_folder_gives_same_bytes(source: Path, tmp_path: Path) -> None:
    build(source, tmp_path / "a", BuildSettings(), RunOptions(workers=2))
    build(source, tmp_path / "b", BuildSettings(), RunOptions(workers=1))
    comparison = filecmp.dircmp(tmp_path / "a", tmp_path / "b")
    assert not comparison.diff_files and not comparison.left_only and not comparison.right_only


def test_manifest_duplicates_are_found_by_hash_then_key(source: Path, tmp_path: Path) -> None:
    csv_path = tmp_path / "list.csv"
    rows = ["cat/000.jpg,cat", "dog/001.jpg,dog", "cat/000.jpg,cat", "emu/002.jpg,emu", "cat/000.jpg,emu",
            "dog/001.jpg,dog"]
    csv_path.write_text("path,label\n" + "\n".join(rows) + "\n")
    result = build(csv_path, tmp_path / "ds", BuildSettings(source=SourceSettings(root=source), layout=LayoutSettings(shuffle=False)), RunOptions(workers=1))
    assert sorted((r.key, r.reason) for r in result.rejected) == [
        ("cat/000.jpg", "duplicate-entry"), ("cat/000.jpg", "duplicate-entry"), ("dog/001.jpg", "duplicate-entry")]
    ds = open_dataset(tmp_path / "ds")
    assert list(ds.keys()) == ["cat/000.jpg", "dog/001.jpg", "emu/002.jpg"]  # first occurrences, in order
    assert [ds.classes[int(label)] for label in ds.labels] == ["cat", "dog", "emu"]


def test_symlinked_folders_are_listed_once_not_exponentially(tmp_path: Path) -> None:
    from packer.sources.folder import list_image_folder

    root = tmp_path / "src"
    write_images(root, {"a": 1})
    previous = root / "a"
    for level in range(16):  # each level links twice to the one below: 2^16 paths without the rule
        folder = root / "a" / f"level{level:02d}"
        folder.mkdir()
        for name in ("x", "y"):
            (folder / name).symlink_to(previous, target_is_directory=True)
        previous = folder
    listing = list_image_folder(root)
    assert len(listing) == 1
    reasons = {r.reason for r in listing.rejected}
    assert reasons <= {"duplicate-entry", "symlink-loop"} and len(listing.rejected) < 64


def test_a_shard_split_into_segments_gives_the_same_bytes(source: Path, tmp_path: Path, monkeypatch) -> None:
    """Fewer shards than workers: shards are packed as parallel segments, joined in order."""
    import packer.writer.pack as build_module

    (source / "dog" / "broken.jpg").write_bytes(b"\xff\xd8\xff not really")  # a rejection inside a segment
    options = BuildSettings(layout=LayoutSettings(alignment=4096, shard_size=1 << 30))  # one shard
    build(source, tmp_path / "one", options, RunOptions(workers=1))
    calls = []
    real = build_module.segment_count

    def tiny_segments(plan, shard, wanted, min_bytes=1):
        calls.append(wanted)
        return real(plan, shard, wanted, min_bytes=1)

    monkeypatch.setattr(build_module, "segment_count", tiny_segments)
    build(source, tmp_path / "seg", options, RunOptions(workers=3))
    assert calls == [6]  # one shard, 3 workers: 6 segments
    assert dataset_files(tmp_path / "seg") == dataset_files(tmp_path / "one")
    assert not list((tmp_path / "seg").rglob("*.partial"))


def test_gather_blob_in_chunks_matches_python() -> None:
    from packer.sources.blobs import gather_blob

    rng = np.random.default_rng(0)
    pieces = [bytes(rng.integers(0, 256, int(n), dtype=np.uint8)) for n in rng.integers(0, 9, 50)]
    blob = np.frombuffer(b"".join(pieces), dtype=np.uint8)
    offsets = np.zeros(51, dtype=np.uint64)
    np.cumsum([len(p) for p in pieces], out=offsets[1:])
    rows = rng.integers(0, 50, 80)
    for chunk_rows in (1, 3, 7, 1 << 20):
        out, new_offsets = gather_blob(blob, offsets, rows, chunk_rows=chunk_rows)
        assert out.tobytes() == b"".join(pieces[r] for r in rows)
        assert [out[int(a):int(b)].tobytes() for a, b in zip(new_offsets[:-1], new_offsets[1:])] == [pieces[r] for r in rows]


def test_a_failing_segmented_build_leaves_no_segment_files(source: Path, tmp_path: Path, monkeypatch) -> None:
    import packer.writer.pack as build_module
    from packer.errors import BuildError

    (source / "dog" / "broken.jpg").write_bytes(b"not an image")
    real = build_module.segment_count
    monkeypatch.setattr(build_module, "segment_count", lambda plan, shard, wanted, min_bytes=1:
                        real(plan, shard, wanted, min_bytes=1))
    with pytest.raises(BuildError, match="--on-error fail"):
        build(source, tmp_path / "out", BuildSettings(layout=LayoutSettings(alignment=4096, shard_size=1 << 30)), RunOptions(workers=4, on_error="fail"))
    assert not list((tmp_path / "out").rglob("*.partial"))
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_hostile_manifest_rows_are_rejected_not_crashing(source: Path, tmp_path: Path) -> None:
    rows = [{"path": "cat/000.jpg", "label": 1},
            {"path": "cat/\u0000.jpg", "label": 1},
            {"path": "cat/\ud800.jpg", "label": 1},
            {"path": "cat/001.jpg", "label": 2 ** 70},
            {"path": "cat/002.jpg", "label": True}]
    jsonl = tmp_path / "list.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = build(jsonl, tmp_path / "ds", BuildSettings(source=SourceSettings(root=source)), RunOptions(workers=1))
    assert result.sample_count == 1
    assert sorted(r.reason for r in result.rejected) == ["bad-manifest-row"] * 4
    assert any("unpaired surrogate" in r.message for r in result.rejected)  # "\ud800" is no text


def test_listing_reports_progress_every_ten_thousand_entries(tmp_path: Path) -> None:
    from packer.sources import SourceOptions, list_source

    root = tmp_path / "src" / "only"
    root.mkdir(parents=True)
    for i in range(20_005):
        (root / f"{i:05d}.jpg").write_bytes(b"x")
    seen: list[int] = []
    listing = list_source(tmp_path / "src", SourceOptions(progress=seen.append))
    assert len(listing) == 20_005 and seen == [10_000, 20_000]


def test_spec_lists_every_rejection_reason() -> None:
    """SPEC §10.3 names every reason the builder can write, and no other."""
    import re

    from packer.sources import REJECTION_REASONS

    spec = (Path(__file__).resolve().parents[2] / "formats" / "SPEC.md").read_text("utf-8")
    section = spec[spec.index("### 10.3"):spec.index("### 10.4")]
    listed = section[section.index("(`packer.sources.REJECTION_REASONS`:"):section.index("`message` is for people")]
    assert set(re.findall(r"`([a-z-]+)`", listed)) == set(REJECTION_REASONS)
