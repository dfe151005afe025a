"""Shared pytest fixtures: sample image folders written by ``scripts/make_sample.py``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# make_sample lives in scripts/, which is not a package: tests import it by path.
_SCRIPTS = str(Path(__file__).resolve().parents[1] / "scripts")
if _SCRIPTS not in sys.path:
    sys.path.insert(0, _SCRIPTS)


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

