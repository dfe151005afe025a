"""Shared pytest fixtures: sample image folders written by ``scripts/make_sample.py``; ``scripts/`` and
``benchmarks/`` on ``sys.path``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# make_sample lives in scripts/ and the benchmarks (bench_memory, bench_plan, ...) in benchmarks/,
# neither a package: tests import them by path.
for _folder in ("scripts", "benchmarks"):
    _path = str(Path(__file__).resolve().parents[1] / _folder)
    if _path not in sys.path:
        sys.path.insert(0, _path)


@pytest.fixture
def sample_folder(tmp_path: Path) -> Path:
    """A small ImageFolder tree (3 classes x 6 images) cycling through many formats and modes."""
    import make_sample

    root = tmp_path / "sample"
    make_sample.make_image_folder(
        root, classes=3, per_class=6, seed=0,
        formats=("jpeg", "png", "png-rgba", "webp", "gif", "jpeg-gray", "png-palette", "bmp",
                 "tiff", "png16", "png-gray", "jpeg-cmyk"))
    return root


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A built dataset of six noisy PNGs in two classes (one per test module)."""
    from helpers import noisy_png_classes
    from packer.writer import build

    work = tmp_path_factory.mktemp("hostile-input")
    src = noisy_png_classes(work / "src")
    build(src, work / "ds", workers=1, progress=False)
    return work / "ds"

