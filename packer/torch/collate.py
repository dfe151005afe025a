"""Collate functions: ``collate`` (stack fixed shapes, list variable ones) and ``PaddedCollate``."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
import torch.utils.data as torch_data

from ..errors import OptionError
from .fieldplan import _FieldSamples
from .pipeline import _BatchSamples, _Sample
from .runtime import _empty, _SharedList, _SharedPair


def collate(samples: Sequence[Any]) -> Any:
    """Collate ``(image, label)`` samples into ``(images, labels)``, and dict samples into a dict.

    Same-shape, same-dtype image tensors are copied once into one ``(B, ...)`` tensor (in shared
    memory inside a worker, so it reaches the main process without another copy); images of
    different sizes come back as a list of tensors. Samples that ``__getitems__`` decoded straight
    into one batch tensor (fused transforms from ``packer.transforms``, the ``raw`` codec) come back
    as that tensor, uncopied: channels-last memory, in ``CHW`` an ``(N, C, H, W)`` view of it.
    Labels become an int64 tensor.

    Dict samples (``PackedDataset(fields=...)``) give a dict batch with the same keys:
    ``image`` as above; ``label`` and ``index`` int64 tensors; ``key``, ``metadata`` and
    ``text`` fields lists; fixed-shape fields (fixed arrays, multi-hot class vectors) one
    ``(B, *shape)`` tensor (gathered straight into shared memory by ``__getitems__``: no second
    copy); variable-length fields (variable arrays, class-id sets) a list of tensors
    (``PaddedCollate`` pads them instead); image fields stacked like ``image`` (one tensor when
    every one has the same shape, e.g. after a fused crop, else a list). Which fields are
    variable travels with packer's samples; for a sample rebuilt as a plain dict, tensors are
    stacked when they all have the same shape and listed otherwise.

    Args:
        samples: what ``PackedDataset.__getitems__`` returns.

    Returns:
        ``(images, labels)``, or a dict for dict samples.
    """
    if samples and isinstance(samples[0], dict):
        return _collate_fields(samples)
    if isinstance(samples, _BatchSamples):  # decoded in place: nothing to stack, no per-sample object
        labels = samples.label_tensor()
        return _SharedPair((samples.batch, labels if labels is not None else _label_tensor(samples.labels)))
    return _stack([sample[0] for sample in samples]), _label_tensor([sample[1] for sample in samples])


def _label_tensor(labels: Sequence[Any]) -> Any:
    try:
        return torch.as_tensor(labels, dtype=torch.int64)
    except (TypeError, ValueError, RuntimeError):  # a target_transform made something else
        return torch_data.default_collate(labels)


def collate_batch_samples(batch: Sequence[Any], *, collate_fn_map: dict[Any, Any] | None = None) -> list[Any]:
    """torch's ``default_collate`` for packer's ``(image, label)`` samples: ``[images, labels]``.

    Registered in ``torch.utils.data._utils.collate.default_collate_fn_map`` for packer's own
    sample type, so ``DataLoader(PackedDataset(...), batch_size=...)`` without a ``collate_fn``
    takes the batched path too: a batch ``__getitems__`` decoded in place comes back as its one
    tensor (no per-sample object, no stack); anything else is collated as ``default_collate``
    collates tuples (each position collated, a list returned).
    """
    if isinstance(batch, _BatchSamples):
        return _SharedList(collate(batch))
    return [torch_data.default_collate(list(samples)) if collate_fn_map is None else
            _torch_collate(list(samples), collate_fn_map=collate_fn_map) for samples in zip(*batch)]


try:  # torch >= 2.0: default_collate dispatches on the type of a batch's first sample
    from torch.utils.data._utils.collate import collate as _torch_collate
    from torch.utils.data._utils.collate import default_collate_fn_map as _default_collate_fn_map
except ImportError:  # pragma: no cover - older torch: default_collate stacks the samples' views
    pass
else:
    _default_collate_fn_map.setdefault(_Sample, collate_batch_samples)


def _collate_fields(samples: Sequence[dict[str, Any]], pad: "PaddedCollate | None" = None) -> dict[str, Any]:
    """Dict samples into one dict batch (see ``collate``); ``pad`` pads the variable fields."""
    first = samples[0]
    # Columns gathered by __getitems__ are valid while the list is the one it returned, whole.
    columns = samples.columns if isinstance(samples, _FieldSamples) and len(samples) == samples.count else {}
    values = {name: [sample[name] for sample in samples] for name in first if name not in columns}
    return _collate_columns(tuple(first), values, columns, getattr(first, "variable", None),
                            getattr(samples, "batch", None), len(samples), pad)


def _collate_columns(names: Sequence[str], by_name: dict[str, list[Any]], columns: dict[str, torch.Tensor],
                     variable: frozenset[str] | None, batch: torch.Tensor | None, count: int,
                     pad: "PaddedCollate | None") -> dict[str, Any]:
    """The dict batch of ``collate``/``PaddedCollate`` from each field's values (``by_name``) or
    ready batch tensor (``columns``); ``variable`` None: decide by the values' shapes."""
    out: dict[str, Any] = {}
    for name in names:
        if name in columns:
            out[name] = columns[name]
            continue
        values = by_name[name]
        if name == "image":
            out[name] = batch if batch is not None and len(batch) == count else _stack(values)
        elif name in ("label", "index"):
            try:
                out[name] = torch.as_tensor(values, dtype=torch.int64)
            except (TypeError, ValueError, RuntimeError):  # a target_transform made something else
                out[name] = torch_data.default_collate(values)
        elif name in ("key", "metadata") or not all(isinstance(value, torch.Tensor) for value in values):
            out[name] = values  # strings and dicts stay lists (no per-key tensors of ragged metadata)
        elif variable is not None and name not in variable:
            out[name] = _stack(values)  # fixed shapes and image fields: one tensor when they agree
        elif variable is None and all(value.shape == values[0].shape for value in values):
            out[name] = _stack(values)
        elif pad is not None:
            padded = pad.pad(name, values)
            if padded is None:
                out[name] = values
            else:
                lengths = f"{name}_lengths"
                if lengths in names:
                    raise OptionError(f"PaddedCollate would add {lengths!r} for field {name!r}, but the samples "
                                      f"already have a field of that name")
                out[name], out[lengths] = padded
        else:
            out[name] = values
    return out


class PaddedCollate:
    """``collate``, with variable-length fields padded into one tensor plus their lengths.

    Each variable field ``F`` (a variable array such as boxes ``(n, 4)``, or a class-id set
    ``(n,)``) becomes ``F``: a ``(B, max n, *rest)`` tensor of its dtype, row ``j`` holding
    sample ``j``'s ``n_j`` rows and then ``pad_value``, and ``F_lengths``: the ``(B,)`` int64
    ``n_j``. Everything else is collated as ``collate`` does (fixed shapes stacked, strings and
    metadata lists). Use it as ``DataLoader(collate_fn=PaddedCollate(...))``, or as
    ``collate_fn=`` of ``PackedIterableDataset`` and ``ThreadedLoader``; it pickles to workers.

    Args:
        pad_value: the padding value, or a mapping of field name to value (fields not named
            pad with 0). Pick one that cannot be a real value when the lengths are not used:
            ``-1`` for class ids (0 is a class) in a signed dtype.

    Raises:
        OptionError: on call, a pad value the field's dtype cannot hold (``-1`` in a ``uint8``
            field), or a ``F_lengths`` name already taken by a field.
    """

    def __init__(self, pad_value: float | Mapping[str, float] = 0) -> None:
        values = pad_value.values() if isinstance(pad_value, Mapping) else (pad_value,)
        if not all(isinstance(v, (int, float)) for v in values):
            raise OptionError(f"pad_value must be a number or a mapping of field names to numbers, got {pad_value!r}")
        self.pad_value = dict(pad_value) if isinstance(pad_value, Mapping) else pad_value

    def value_for(self, name: str) -> float:
        """The padding value of field ``name``."""
        if isinstance(self.pad_value, dict):
            return self.pad_value.get(name, 0)
        return self.pad_value

    def pad(self, name: str, values: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(padded, lengths)`` of one field's values, or None when their trailing shapes or dtypes differ."""
        first = values[0]
        if first.dim() < 1 or not all(v.dim() == first.dim() and v.shape[1:] == first.shape[1:]
                                      and v.dtype == first.dtype for v in values):
            return None
        lengths = torch.tensor([int(v.shape[0]) for v in values], dtype=torch.int64)
        longest = int(lengths.max()) if len(values) else 0
        out = _empty((len(values), longest, *first.shape[1:]), first.dtype)
        value = self.value_for(name)
        try:
            out.fill_(value)
        except RuntimeError as exc:
            raise OptionError(f"PaddedCollate: pad value {value!r} does not fit field {name!r}'s {first.dtype} "
                              f"({exc}); give that field another pad_value") from None
        for j, v in enumerate(values):
            out[j, :v.shape[0]] = v
        return out, lengths

    def __call__(self, samples: Sequence[Any]) -> Any:
        if samples and isinstance(samples[0], dict):
            return _collate_fields(samples, pad=self)
        return collate(samples)

    def __repr__(self) -> str:
        return f"PaddedCollate(pad_value={self.pad_value!r})"


def _stack(images: Sequence[Any]) -> torch.Tensor | list[torch.Tensor]:
    if not images:
        return torch.empty((0,), dtype=torch.uint8)
    first = images[0]
    if (not isinstance(first, torch.Tensor)
            or not all(isinstance(t, torch.Tensor) and t.shape == first.shape and t.dtype == first.dtype
                       for t in images)):
        return list(images)
    out = _empty((len(images), *first.shape), first.dtype)
    return torch.stack(list(images), 0, out=out)
