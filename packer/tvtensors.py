"""torchvision ``transforms.v2`` samples: ``(tv_tensors.Image, target)`` over a packed dataset, so a
v2 pipeline moves the image, its boxes and its masks together (``pip install
'packer-shards[torchvision]'``).

packer decodes (simplejpeg, batched, from the mapped shards); the user's v2 pipeline does the
rest. A sample is torchvision's detection/segmentation convention::

    (tv_tensors.Image uint8 (3, H, W),
     {"boxes": tv_tensors.BoundingBoxes (N, 4) with format and canvas_size (H, W),
      "labels": int64 (N,), "mask": tv_tensors.Mask (H, W), ...every other field asked for})

Which fields become what: box fields (default: a declared ``"boxes"`` array of shape ``[N, 4]``)
become ``BoundingBoxes`` in ``box_format`` (``"XYXY"``: what the COCO door stores, absolute
pixels), their canvas the decoded image's ``(H, W)``; declared ``image`` fields (segmentation
masks, depth maps) become ``Mask`` with their stored values (a palette PNG gives its class ids);
everything else is what ``packer.torch.PackedDataset`` gives (tensors, ``str``, ``int``). The
key names follow torchvision's (``"boxes"``, ``"labels"``), so ``v2.SanitizeBoundingBoxes()``
finds the labels to drop with the boxes.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from .errors import MissingDependencyError, OptionError

try:
    import torch
    import torch.utils.data as torch_data
    from torchvision import tv_tensors
except (ImportError, RuntimeError) as _exc:  # RuntimeError: a torchvision built for another torch
    raise MissingDependencyError(
        f"packer.tvtensors needs torchvision with its matching torch ({_exc}); install them with "
        f"pip install 'packer-shards[torchvision]'") from None

from .torch import PackedDataset
from .torch.runtime import PathOrDataset, _open

__all__ = ["TvTensorDataset", "BOX_FORMATS", "collate_pairs"]

#: Box formats a field may be stored in (torchvision's ``BoundingBoxFormat`` names).
BOX_FORMATS = ("XYXY", "XYWH", "CXCYWH")


def collate_pairs(batch: Sequence[tuple[Any, Any]]) -> tuple[list[Any], list[Any]]:
    """``(images, targets)`` as two lists: detection samples do not stack (``N`` varies).

    The DataLoader ``collate_fn`` torchvision's detection references use (``tuple(zip(*batch))``),
    as a named function so that it pickles for spawned workers.
    """
    images, targets = [], []
    for image, target in batch:
        images.append(image)
        targets.append(target)
    return images, targets


def _default_fields(dataset: Any) -> tuple[str, ...]:
    return ("image", *(spec.name for spec in dataset.fields))


class TvTensorDataset(torch_data.Dataset):
    """A map-style dataset of ``(tv_tensors.Image, target dict)`` for ``torchvision.transforms.v2``.

    Example::

        from torchvision.transforms import v2
        pipeline = v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip(),
                               v2.ToDtype(torch.float32, scale=True), v2.SanitizeBoundingBoxes()])
        data = TvTensorDataset("packed/coco", transforms=pipeline)
        loader = DataLoader(data, batch_size=32, num_workers=8, collate_fn=collate_pairs)

    Args:
        source: the dataset folder, or an open ``packer.dataset.Dataset``.
        fields: what a sample holds: ``"image"`` (required, first) and any of the target's
            fields (declared fields, ``"label"``, ``"index"``, ``"key"``, ``"metadata"``).
            Default: the image and every declared field.
        boxes: the fields that are bounding boxes (default: ``"boxes"`` when it is among the
            fields and declared ``[N, 4]``).
        box_format: the stored boxes' format, one of ``BOX_FORMATS`` (absolute pixels).
        masks: the image fields that become ``Mask`` (default: every image field among the fields).
        transforms: a callable applied to ``(image, target)``, e.g. a ``v2.Compose``.
        decode: ``True`` (decode every image whole, the default) or a fused decode transform such
            as ``packer.transforms.CenterCrop``: the canvas is then the decoded output and image
            fields follow its crop (box fields too, when named in ``geometry``).
        **options: other ``packer.torch.PackedDataset`` arguments (``backend``,
            ``verify_checksums``, ``classes``, ``geometry``, ``multi_hot``).

    Raises:
        OptionError: ``"image"`` not first among the fields, ``decode=False``, a box field that is
            not declared ``[N, 4]``, a mask that is not an image field, an unknown box format.
    """

    def __init__(self, source: PathOrDataset, *, fields: Sequence[str] | None = None,
                 boxes: Sequence[str] | None = None, box_format: str = "XYXY",
                 masks: Sequence[str] | None = None, transforms: Callable[[Any, Any], Any] | None = None,
                 decode: Any = True, **options: Any) -> None:
        if decode is False:
            raise OptionError("TvTensorDataset gives decoded images (tv_tensors.Image): decode=False is the "
                              "stored bytes, use packer.torch.PackedDataset(decode=False) for those")
        if box_format not in BOX_FORMATS:
            raise OptionError(f"box_format must be one of {', '.join(BOX_FORMATS)}, got {box_format!r}")
        opened = _open(source, options.pop("backend", "mmap"), options.pop("verify_checksums", False))
        if fields is None:
            fields = _default_fields(opened)
        fields = tuple(fields)
        if not fields or fields[0] != "image":
            raise OptionError(f"TvTensorDataset samples are (image, target): fields must start with 'image', "
                              f"got {fields!r}")
        self._data = PackedDataset(opened, fields=fields, decode=decode, layout="CHW", **options)
        declared = {spec.name: spec for spec in self._data.dataset.fields}
        if boxes is None:
            spec = declared.get("boxes")
            boxes = ("boxes",) if "boxes" in fields and spec is not None and _is_boxes(spec) else ()
        for name in boxes:
            if name not in fields or name not in declared or not _is_boxes(declared[name]):
                raise OptionError(f"box field {name!r} must be among the fields and declared as an array of "
                                  f"shape [N, 4]; declared: {sorted(declared)}")
        if masks is None:
            masks = tuple(name for name in fields[1:] if name in declared and declared[name].kind == "image")
        for name in masks:
            if name not in fields or name not in declared or declared[name].kind != "image":
                raise OptionError(f"mask field {name!r} must be among the fields and declared as an image field")
        self.fields = fields
        self.boxes = tuple(boxes)
        self.masks = tuple(masks)
        self.box_format = box_format
        self.transforms = transforms

    def __len__(self) -> int:
        return len(self._data)

    @property
    def dataset(self) -> Any:
        """The open packer dataset."""
        return self._data.dataset

    @property
    def classes(self) -> tuple[str, ...]:
        return self._data.classes

    def _wrap(self, sample: Mapping[str, Any]) -> tuple[Any, Any]:
        image = tv_tensors.Image(sample["image"])
        canvas = (int(image.shape[-2]), int(image.shape[-1]))
        target: dict[str, Any] = {}
        for name in self.fields[1:]:
            value = sample[name]
            if name in self.boxes:
                value = tv_tensors.BoundingBoxes(torch.as_tensor(value, dtype=torch.float32).reshape(-1, 4),
                                                 format=self.box_format, canvas_size=canvas)
            elif name in self.masks:
                value = tv_tensors.Mask(value)
            target[name] = value
        if self.transforms is not None:
            return self.transforms(image, target)
        return image, target

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        return self._wrap(self._data[i])

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[Any, Any]]:
        """A batch decoded together (``PackedDataset.__getitems__``), each sample wrapped."""
        return [self._wrap(sample) for sample in self._data.__getitems__(indices)]


def _is_boxes(spec: Any) -> bool:
    return spec.kind == "array" and tuple(spec.shape) == (-1, 4)
