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
