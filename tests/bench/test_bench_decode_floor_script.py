"""benchmarks/bench_decode_floor.py runs end to end on a tiny set, and its floor is the transform's own work."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_decode_floor  # noqa: E402


def test_the_floor_makes_the_transforms_pixels_and_the_run_reports_ratios(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    result = tmp_path / "result.json"
    threads = torch.get_num_threads()
    try:
        assert bench_decode_floor.main(["--images", "12", "--workers", "1", "--batch-size", "4", "--rounds", "1",
                                        "--codecs", "tiled", "--out", str(tmp_path / "bench"),
                                        "--json", str(result)]) == 0
    finally:
        torch.set_num_threads(threads)
    printed = capsys.readouterr().out
    assert "its pixels equal RandomResizedCrop's: yes" in printed and "over floor" in printed
    assert "ThreadedLoader / DataLoader processes" in printed and "largest overhead of a wiring" in printed
    document = json.loads(result.read_text())
    (tiled,) = document["codecs"]
    names = [row["name"] for row in tiled["rows"]]
    assert names[0].startswith("floor") and tiled["floor_pixels_identical"] is True
    assert any(name.startswith("PackedDataLoader, 1 threads") for name in names)  # worker_mode="threads"
    assert all(row["items"] == 12 for row in tiled["rows"])


def test_the_floor_follows_the_transform_on_every_codec(tmp_path: Path) -> None:
    from packer.dataset import open_dataset
    from packer.transforms import RandomResizedCrop

    src = tmp_path / "src"
    bench_decode_floor.ensure_jpegs(src, 10)
    for codec in bench_decode_floor.CODECS:
        path = bench_decode_floor.ensure_packed(src, tmp_path / codec, 10, codec, 1)
        with open_dataset(path) as dataset:
            for epoch in (0, 2):
                transform = RandomResizedCrop(bench_decode_floor.CROP, seed=1)
                transform.set_epoch(epoch)
                floor = bench_decode_floor.Floor(dataset, transform, np.arange(10)[::-1], 8)
                assert floor.check(), (codec, epoch)
                assert floor.run() == 10
