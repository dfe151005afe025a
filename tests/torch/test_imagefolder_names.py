"""torchvision ``ImageFolder`` names ``PackedDataset`` deliberately lacks give a typed error that says
what to use, and stay absent for ``hasattr``/``getattr(..., default)``."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from helpers import write_images  # noqa: E402
from packer.errors import OptionError, UnsupportedAttributeError  # noqa: E402
from packer.torch import PackedDataset  # noqa: E402
from packer.writer import BuildOptions, build  # noqa: E402


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> PackedDataset:
    root = tmp_path_factory.mktemp("imagefolder")
    write_images(root / "src", {"cat": 2, "dog": 2})
    build(root / "src", root / "ds", BuildOptions(), workers=1, progress=False)
    return PackedDataset(root / "ds")


@pytest.mark.parametrize("name, advice", [
    ("samples", "use dataset.targets (a zero-copy int64 array of labels), dataset.dataset.key(i)"),
    ("imgs", "use dataset.targets and dataset.dataset.key(i)"),
    ("find_classes", "use dataset.classes and dataset.class_to_idx"),
    ("loader", "packer decodes in decode="),
    ("extensions", "`packer inspect` lists them"),
])
def test_missing_imagefolder_names_say_what_to_use(dataset: PackedDataset, name: str, advice: str) -> None:
    with pytest.raises(UnsupportedAttributeError) as caught:
        getattr(dataset, name)
    assert isinstance(caught.value, OptionError) and isinstance(caught.value, AttributeError)
    assert caught.value.message.startswith(f"PackedDataset has no {name!r} (torchvision's ImageFolder does): ")
    assert advice in caught.value.message
    assert not hasattr(dataset, name) and getattr(dataset, name, None) is None


def test_the_names_packer_has_still_work(dataset: PackedDataset) -> None:
    assert dataset.classes == ("cat", "dog") and dataset.class_to_idx == {"cat": 0, "dog": 1}
    assert sorted(dataset.targets.tolist()) == [0, 0, 1, 1]
