"""benchmarks/bench_duplicates.py: its corpus, its ground truth and its scoring, on stand-in photographs
(the real ones come from two wheels downloaded at run time, which a test does not fetch)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from PIL import Image

from helpers import photo_like

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_duplicates  # noqa: E402


def test_the_corpus_plants_what_its_truth_says_and_the_scores_follow(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    photos = {f"p{seed}.png": Image.fromarray(photo_like(seed, (240, 320))) for seed in range(3)}
    truth = bench_duplicates.make_corpus(tmp_path, photos, per_kind=1, exact=2)
    assert truth["photos"] == 3 and len(truth["planted"]) == len(bench_duplicates.KINDS)
    assert [kind for *_, kind in truth["planted"]] == list(bench_duplicates.KINDS)
    for train_key, val_key, _ in truth["planted"]:
        assert (tmp_path / "train" / train_key).is_file() and (tmp_path / "val" / val_key).is_file()
    assert [split for *_, split in truth["exact"]] == ["val", "val", "train"]
    for source, copy, split in truth["exact"]:
        assert (tmp_path / split / copy).read_bytes() == (tmp_path / "train" / source).read_bytes()
    planted_sources = {a for a, _, _ in truth["planted"]}
    assert not planted_sources & {a for a, _, _ in truth["exact"]}  # copies of unplanted bases only

    found = {(a, b): 3 for a, b, kind in truth["planted"] if kind != "crop"}
    found[("some/train.jpg", "some/val.jpg")] = 5  # a false pair
    row, = bench_duplicates.curve(found, truth, bench_duplicates.KINDS, ("flip",), (10,))
    assert row["by_kind"]["crop"] == 0 and row["by_kind"]["quality"] == 1 and "flip" not in row["by_kind"]
    assert row["true_pairs"] == 4 and row["false_pairs"] == 1 and row["recall"] == 4 / 5
    assert row["precision"] == 4 / 5
    bench_duplicates.print_quality({"exact": {"planted": 3, "found": 3, "false": 0},
                                    "packer dct-sign-128": [row]}, 10)
    assert "exact duplicates: 3 of 3 found, 0 false" in capsys.readouterr().out
    json.dumps(truth)  # the truth file the benchmark writes


def test_the_search_child_finds_every_planted_copy() -> None:
    result = bench_duplicates.search(20_000, 20)
    assert len(result) == 3
    for run in result.values():
        assert run["planted_found"] == run["planted"] == 200 and run["pairs"] == 200
        assert 0 < run["peak_rss_mib"] < 1024
