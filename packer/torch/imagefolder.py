"""torchvision ``ImageFolder`` names that ``PackedDataset`` deliberately does not have: each one
raises an ``UnsupportedAttributeError`` that says what to use instead (``hasattr`` stays False)."""

from __future__ import annotations

from typing import Any, NoReturn

from ..errors import UnsupportedAttributeError

#: name -> what to use instead (the names packer does have: classes, class_to_idx, targets, root).
_INSTEAD = {
    "samples": "a Python list of (path, label) per sample is the memory blow-up packer avoids (DataLoader "
               "workers would each copy it); use dataset.targets (a zero-copy int64 array of labels), "
               "dataset.dataset.key(i) (sample i's source name) or fields=('image', 'label', 'key')",
    "imgs": "like ImageFolder.samples, a per-sample Python list packer avoids; use dataset.targets and "
            "dataset.dataset.key(i)",
    "loader": "packer decodes in decode= (True, False, a fused transform such as RandomResizedCrop, or a "
              "callable (dataset, i) -> image)",
    "extensions": "the formats of the stored images are in dataset.dataset.index.image_format; "
                  "`packer inspect` lists them",
    "find_classes": "the class list is fixed when the dataset is built: use dataset.classes and "
                    "dataset.class_to_idx",
}


def _refuse(name: str) -> NoReturn:
    raise UnsupportedAttributeError(f"PackedDataset has no {name!r} (torchvision's ImageFolder does): "
                                    f"{_INSTEAD[name]}")


class _ImageFolderRefusals:
    """Properties for ``ImageFolder`` names packer does not provide: a typed error with advice."""

    @property
    def samples(self) -> Any:
        _refuse("samples")

    @property
    def imgs(self) -> Any:
        _refuse("imgs")

    @property
    def loader(self) -> Any:
        _refuse("loader")

    @property
    def extensions(self) -> Any:
        _refuse("extensions")

    @property
    def find_classes(self) -> Any:
        _refuse("find_classes")
