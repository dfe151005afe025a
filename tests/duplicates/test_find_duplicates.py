"""``find_duplicates``: exact groups confirmed by bytes, near-duplicates of photo-like images, leaks
across datasets, the samples a view drops, and the hashes file kept beside the index."""

from __future__ import annotations

import io
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers import encode, near_copy, photo_like, rewrite_index

from packer import format as fmt
from packer.dataset import open_dataset
from packer.duplicates import DEFAULT_THRESHOLD, find_duplicates
from packer.duplicates.sidecar import hashes_path, load_or_compute
from packer.errors import OptionError
from packer.writer import build
from packer.writer.plan import BuildOptions

KINDS = ("quality", "resize", "crop", "jitter", "png", "flip")


def _build(source: Path, out: Path, **options: object) -> Path:
    build(source, out, BuildOptions(shard_size=1 << 20, seed=1, **options), workers=1, progress=False)
    return out


@pytest.fixture(scope="module")
def splits(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """train: 16 photo-like images (one repeated byte for byte under another name); val: a near copy
    of train's photos 0-5 (one per kind, photo 5 mirrored), a byte copy of photo 6, 4 new photos."""
    root = tmp_path_factory.mktemp("dups")
    photos = [photo_like(seed) for seed in range(20)]
    for number in range(16):
        (root / "train" / f"c{number % 2}").mkdir(parents=True, exist_ok=True)
        (root / "train" / f"c{number % 2}" / f"p{number:02d}.jpg").write_bytes(encode(photos[number]))
    shutil.copy(root / "train" / "c1" / "p07.jpg", root / "train" / "c0" / "again-p07.jpg")
    (root / "val" / "c0").mkdir(parents=True)
    (root / "val" / "c1").mkdir(parents=True)
    for number, kind in enumerate(KINDS):
        suffix = "png" if kind == "png" else "jpg"
        (root / "val" / f"c{number % 2}" / f"{kind}-p{number:02d}.{suffix}").write_bytes(
            near_copy(photos[number], kind, number))
    shutil.copy(root / "train" / "c0" / "p06.jpg", root / "val" / "c0" / "copy-p06.jpg")
    for number in range(16, 20):
        (root / "val" / "c1" / f"new-p{number:02d}.jpg").write_bytes(encode(photos[number]))
    return {"train": _build(root / "train", root / "ds" / "train"), "val": _build(root / "val", root / "ds" / "val")}


def _keys(report, group) -> set[tuple[str, str]]:  # noqa: ANN001
    return {(d["dataset"], d["key"]) for d in map(report.describe, group.members)}


def test_every_planted_copy_is_found_and_nothing_else(splits: dict[str, Path]) -> None:
    report = find_duplicates(splits["train"], [splits["val"]], store_hashes=False)
    assert [e.name for e in report.datasets] == ["train", "val"] and report.threshold == DEFAULT_THRESHOLD
    groups = [_keys(report, g) for g in report.groups]
    expected_near = [{("train", f"c{n % 2}/p{n:02d}.jpg"),
                      ("val", f"c{n % 2}/{kind}-p{n:02d}.{'png' if kind == 'png' else 'jpg'}")}
                     for n, kind in enumerate(KINDS[:-1])]
    leak = {("train", "c0/p06.jpg"), ("val", "c0/copy-p06.jpg")}
    repeat = {("train", "c1/p07.jpg"), ("train", "c0/again-p07.jpg")}
    assert sorted(map(sorted, groups)) == sorted(map(sorted, expected_near + [leak, repeat]))
    assert [g.leak for g in report.groups] == [True] * 6 + [False]  # leaks first
    kinds = {frozenset(_keys(report, g)): g.kind for g in report.groups}
    assert kinds[frozenset(leak)] == kinds[frozenset(repeat)] == "exact"
    counts = report.counts()
    assert counts["exact"] == {"groups": 2, "pairs": 2, "samples": 4}
    assert counts["near"] == {"groups": 5, "pairs": 5, "samples": 10}
    assert counts["leaks"]["groups"] == 6 and counts["leaks"]["samples"] == {"train": 6, "val": 6}
    assert counts["by_split_pair"] == [{"a": "train", "b": "val", "exact_pairs": 1, "near_pairs": 5},
                                       {"a": "train", "b": "train", "exact_pairs": 1, "near_pairs": 0}]
    assert counts["by_class"]["c0"]["leaked"] + counts["by_class"]["c1"]["leaked"] == 12
    assert all(d <= DEFAULT_THRESHOLD and not m for g in report.groups for _, _, d, m in g.pairs)


def test_mirror_images_count_only_when_asked(splits: dict[str, Path]) -> None:
    report = find_duplicates(splits["train"], {"val": splits["val"]}, flips=True, store_hashes=False)
    mirrored = [g for g in report.groups if any(m for *_, m in g.pairs)]
    assert [_keys(report, g) for g in mirrored] == [{("train", "c1/p05.jpg"), ("val", "c1/flip-p05.jpg")}]
    assert report.to_json()["flips"] is True and len(report.groups) == 8


def test_drop_and_redundant_say_what_a_view_and_a_build_leave_out(splits: dict[str, Path]) -> None:
    report = find_duplicates(splits["train"], [splits["val"]], store_hashes=False)
    with open_dataset(splits["train"]) as train, open_dataset(splits["val"]) as val:
        dropped_train = sorted(train.key(int(i)) for i in report.drop("train"))
        dropped_val = sorted(val.key(int(i)) for i in report.drop(1, against=["train"]))
        assert dropped_train == sorted([f"c{n % 2}/p{n:02d}.jpg" for n in range(5)] + ["c0/p06.jpg"])
        assert len(dropped_val) == 6 and "c0/copy-p06.jpg" in dropped_val
        (repeat, kept), = report.redundant("train").items()  # the repeat, and the sample kept
        assert {train.key(kept), train.key(repeat)} == {"c1/p07.jpg", "c0/again-p07.jpg"}
        assert kept < repeat
    assert report.drop("val", against=[]).size == 0
    with pytest.raises(OptionError, match=r"no dataset 'test' in the report; its datasets are \['train', 'val'\]"):
        report.drop("test")


def test_exact_groups_need_equal_bytes_not_just_equal_checksums(tmp_path: Path) -> None:
    """An index whose xxh3 column says two different payloads are equal (a forged collision) gets no
    exact group for them; the truly identical pair still gets one."""
    source = tmp_path / "src" / "a"
    source.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in ("x", "y"):  # two different BMPs of the same size in bytes
        Image.fromarray(rng.integers(0, 256, (20, 20, 3), dtype=np.uint8)).save(source / f"{name}.bmp")
    shutil.copy(source / "x.bmp", source / "z.bmp")
    ds = _build(tmp_path / "src", tmp_path / "ds", shuffle=False)
    with open_dataset(ds) as dataset:
        assert [dataset.key(i) for i in range(3)] == ["a/x.bmp", "a/y.bmp", "a/z.bmp"]
        assert len(set(dataset.sizes.tolist())) == 1

    def forge(columns: dict[str, np.ndarray]) -> None:
        columns["checksum"][1] = columns["checksum"][0]

    rewrite_index(ds, forge)
    with open_dataset(ds) as dataset:
        assert len(set(dataset.index.checksum.tolist())) == 1  # all three claim the same bytes
    report = find_duplicates(ds, near=False)
    assert [[(m.dataset, m.sample) for m in g.members] for g in report.groups] == [[(0, 0), (0, 2)]]
    assert report.datasets[0].hashes_source == "not computed"


def test_the_hashes_file_is_reused_and_recomputed_when_stale_damaged_or_unwritable(splits: dict[str, Path],
                                                                                   tmp_path: Path) -> None:
    ds = shutil.copytree(splits["val"], tmp_path / "val")
    manifest = (ds / fmt.MANIFEST_NAME).read_bytes()
    with open_dataset(ds) as dataset:
        table, source = load_or_compute(dataset)
        path = hashes_path(dataset)
        assert source == f"computed; stored in {path}" and path.parent == ds
        assert load_or_compute(dataset)[1] == "stored"
        assert table.counts() == {"hashed": len(dataset), "flat": 0, "unreadable": 0}
    assert (ds / fmt.MANIFEST_NAME).read_bytes() == manifest  # the dataset's own files untouched

    rewrite_index(ds, lambda columns: columns["label"].__setitem__(0, 1 - columns["label"][0]))  # a new index
    with open_dataset(ds) as dataset:
        again, source = load_or_compute(dataset)
        assert source.startswith("computed (replaced: ") and "stale hashes: computed for index" in source
        assert np.array_equal(again.hashes, table.hashes)
        assert load_or_compute(dataset)[1] == "stored"
        path.write_bytes(path.read_bytes()[:-3])
        assert "(truncated)" in load_or_compute(dataset)[1]
        path.write_bytes(b"GIF89a" + bytes(100))
        assert "not a packer hashes file (starts with b'GIF89a" in load_or_compute(dataset)[1]
        if os.geteuid() != 0:  # root writes anywhere
            path.unlink()
            ds.chmod(0o555)
            try:
                assert load_or_compute(dataset)[1].startswith("computed; not stored (")
            finally:
                ds.chmod(0o755)


def test_damaged_flat_and_raw_samples(tmp_path: Path) -> None:
    source = tmp_path / "src" / "a"
    source.mkdir(parents=True)
    (source / "flat.png").write_bytes(encode(np.full((40, 50, 3), 90, np.uint8), "png"))
    for seed in range(3):
        (source / f"p{seed}.jpg").write_bytes(encode(photo_like(seed)))
    ds = _build(tmp_path / "src", tmp_path / "ds", shuffle=False)
    with open_dataset(ds) as dataset:
        shard = ds / dataset.manifest.shards[0].path
        offset = int(dataset.index.offset[1])
    data = bytearray(shard.read_bytes())
    data[offset + 200] ^= 0xFF  # sample 1 (p0.jpg) damaged: it fails its checksum
    shard.write_bytes(bytes(data))
    report = find_duplicates(ds, store_hashes=False)
    assert report.datasets[0].hashes == {"hashed": 2, "flat": 1, "unreadable": 1}

    raw = _build(tmp_path / "src", tmp_path / "raw", codec="raw:size=64x80")
    with open_dataset(raw) as dataset:
        table, _ = load_or_compute(dataset, store=False)
        assert table.counts() == {"hashed": 3, "flat": 1, "unreadable": 0}


def test_a_bad_threshold_is_refused_before_anything_is_opened(tmp_path: Path) -> None:
    with pytest.raises(OptionError, match="threshold must be a number of bits from 0 to 128, got 200"):
        find_duplicates(tmp_path / "nothing-here", threshold=200)


def test_datasets_with_the_same_folder_name_get_longer_names(splits: dict[str, Path], tmp_path: Path) -> None:
    other = shutil.copytree(splits["val"], tmp_path / "elsewhere" / "val")
    report = find_duplicates(splits["val"], [other], near=False)
    assert [e.name for e in report.datasets] == ["ds/val", "elsewhere/val"]
    assert report.counts()["exact"]["groups"] == len(report.groups) > 0
    with pytest.raises(OptionError, match="dataset names must be unique"):
        find_duplicates(splits["val"], {"ds/val": other}, near=False)
