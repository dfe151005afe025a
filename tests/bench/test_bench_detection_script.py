"""benchmarks/bench_detection.py runs end to end on a tiny set, and its baseline moves boxes like packer does."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_detection  # noqa: E402


def test_bench_detection_runs_and_reports_ratios(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench"
    result = tmp_path / "result.json"
    assert bench_detection.run(argparse.Namespace(images=8, workers=0, batch_size=4, rounds=1, per_round=8,
                                                  out=out, json=result)) == 0
    printed = capsys.readouterr().out
    assert "CocoDetection-like" in printed and "packer fields" in printed and "read_batch + image_id" in printed
    document = json.loads(result.read_text())
    assert [r["items"] for r in document["training"]] == [8, 8]
    # the same objects reach both loaders: the packed boxes are the JSON's, in XYXY
    instances = json.loads((out / "src" / "instances.json").read_text())
    from packer.dataset import open_dataset

    with open_dataset(out / "packed") as ds:
        for i in range(len(ds)):
            image_id = int(ds.field_value("image_id", i))
            want = [a["bbox"] for a in instances["annotations"] if a["image_id"] == image_id]
            got = ds.field_value("boxes", i)
            np.testing.assert_allclose(got[:, 2:] - got[:, :2], np.float32(want).reshape(-1, 4)[:, 2:], rtol=1e-5)


def test_baseline_transform_keeps_boxes_inside_the_output() -> None:
    from PIL import Image

    transform = bench_detection.V2StyleTransform(64)
    image = Image.fromarray(np.zeros((48, 80, 3), np.uint8))
    anns = [{"bbox": [5, 5, 20, 10], "category_id": 10}, {"bbox": [60, 30, 19, 17], "category_id": 13}]
    torch.manual_seed(0)
    for _ in range(20):
        pixels, target = transform(image, anns, {10: 0, 13: 1})
        assert tuple(pixels.shape) == (64, 64, 3)
        boxes = target["boxes"]
        assert len(boxes) == len(target["labels"]) <= 2
        assert bool(((boxes >= 0) & (boxes <= 64)).all()) and bool((boxes[:, 2:] > boxes[:, :2]).all())
