"""``GpuRawBatches``: batches of a ``raw``-codec dataset as ``(B, H, W, C)`` uint8 tensors on the
GPU, one aligned block read per run of consecutive samples and one gather into batch order, with
optional device-side crops and fixed-width declared fields.
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import numpy as np

from ..backends.runs import RunPlan
from ..errors import OptionError, PackerError
from .loader import GpuBatchReader, GpuLoaderOptions

# --- raw pixels --------------------------------------------------------------------------------

#: What ``GpuRawBatches(fields=...)`` can carry besides the declared fixed-width arrays.
RAW_BATCH_OUTPUTS = ("image", "label", "index")


def _check_batch_fields(fields: Any, dataset: Any) -> tuple[str, ...]:
    """``GpuRawBatches``' ``fields``: built-in names and fixed-width ``array`` fields only.

    Raises:
        OptionError: a name the dataset does not have, or one whose values have no fixed width.
    """
    chosen = (fields,) if isinstance(fields, str) else tuple(fields)
    if not chosen or len(set(chosen)) != len(chosen):
        raise OptionError(f"fields must be distinct names, got {list(chosen)}")
    for name in chosen:
        if name in RAW_BATCH_OUTPUTS:
            continue
        if name in ("key", "metadata"):
            raise OptionError(f"fields: {name!r} is a string per sample, which has no tensor on the device; ask "
                              f"for 'index' and look it up in the dataset")
        spec = dataset.field_spec(name)  # OptionError naming the fields there are
        if spec.kind == "image":
            raise OptionError(f"fields: {name!r} is an image field (encoded payloads in their own shards): "
                              f"GpuRawBatches carries fixed-width array fields only; read it with "
                              f"PackedDataset(fields=...) or packer.dali")
        if spec.kind != "array" or spec.variable:
            raise OptionError(f"fields: {spec.describe()} has a per-sample length, so no (batch, ...) tensor "
                              f"shape: GpuRawBatches carries fixed-width array fields only; read it with "
                              f"PackedDataset(fields=...) (a list per batch) or packer.dali")
    return chosen


class GpuRawBatches(GpuBatchReader):
    """``(images, labels)`` batches of a ``raw``-codec dataset: ``(B, H, W, C)`` uint8 and ``(B,)`` int64 on ``device``.

    Args:
        source: a dataset folder or an open ``Dataset`` (its codec must be ``raw``).
        batch_size: samples per batch per rank.
        options: a ``GpuLoaderOptions`` (default: its defaults; the order ``ReadOrder("block")``).
        fields: instead of ``(images, labels)``, a dict per batch with these names, in this order:
            ``"image"``, ``"label"`` (``(B,)`` int64), ``"index"`` (``(B,)`` int64 sample numbers)
            and fixed-width ``array`` fields (``(B, *shape)`` of their dtype), all on ``device``
            (see the module doc for what does not apply).
        decode: ``None`` (the stored pixels) or a ``packer.transforms.RandomResizedCrop`` /
            ``CenterCrop``: each batch is then cropped, resized and flipped on ``device`` by
            ``transform.batch`` with torch's kernel (``packer.rawcrop.crop_resize_batch``), and
            ``images`` is ``(B, size_h, size_w, C)``. The boxes and flips are those of the CPU
            readers (``PackedDataset``, ``ThreadedLoader``): with ``seed=`` a function of
            ``(seed, epoch, index)``, the epoch being this loader's (it calls ``set_epoch`` on the
            transform); the pixels agree with the CPU path within ``rawcrop.AGREEMENT_MAX_ABS``.
        **settings: any ``GpuLoaderOptions`` field (``order``, a ``packer.ReadOrder``; ``device``,
            ``io``, ``double_buffer``, ``read_block``, ``io_threads``, ``backend``), overriding
            ``options`` (the old order settings ``seed=``, ``rank=``, ... for one more release,
            with a ``DeprecationWarning``).

    Raises:
        OptionError: a bad setting (unknown name, io, device index), a field in ``fields`` the
            dataset lacks or that has no fixed width, a ``decode`` that is not one of packer's crop
            transforms, or ``decode`` with array fields (a crop moves the pixels, not the values).
        ManifestError: the dataset is not ``raw``.
        IndexMismatchError: a sample's size or format disagrees with the manifest's raw shape.
        MissingDependencyError: torch missing, or ``device="cuda"`` without a GPU.
    """

    def __init__(self, source: Any, batch_size: int, options: GpuLoaderOptions | None = None, *,
                 fields: Sequence[str] | None = None, decode: Any = None, **settings: Any) -> None:
        from ..codecs import codec_for
        from ..transforms import DecodeTransform

        if decode is not None and not isinstance(decode, DecodeTransform):  # before any file is opened
            raise OptionError(f"decode must be None or a packer.transforms crop (RandomResizedCrop, "
                              f"CenterCrop), got {type(decode).__name__}")
        self.decode = decode
        super().__init__(source, batch_size, GpuLoaderOptions.merge(options, settings))
        try:
            self.fields: tuple[str, ...] = () if fields is None else _check_batch_fields(fields, self.dataset)
            if decode is not None and set(self.fields) - {"image", "label", "index"}:
                raise OptionError(f"decode= crops the pixels but not the array fields "
                                  f"{sorted(set(self.fields) - {'image', 'label', 'index'})}: read them "
                                  f"without decode=, or crop with PackedDataset(fields=...), which moves them")
            codec = codec_for(self.dataset)
            self.shape = codec.pixel_shape()  # ManifestError for payloads that are not stored pixels
            #: each shard's distance between two samples (a mixture's streams may differ in alignment)
            self.strides = np.array([codec.stride(self.dataset.shard_alignment(shard))
                                     for shard in range(len(self.dataset.manifest.shards))], dtype=np.int64)
            codec.check_index(self.dataset.index)  # every row one sample of that shape, checked once
        except PackerError:
            self.close()
            raise

    def _produce(self, indices: np.ndarray) -> Any:
        torch = self._torch
        batch = self._plan(indices)
        block = self._read_device(batch)
        height, width, channels = self.shape
        rows = self._rows(block, batch.sample_pos, self.strides[self.dataset.index.shard[batch.unique]],
                          height * width * channels)
        where = torch.from_numpy(batch.where)
        if self.device.type == "cuda":
            where = where.to(self.device, non_blocking=True)
        images = rows.index_select(0, where).view(len(batch.indices), height, width, channels)
        if self.decode is not None:  # the CPU readers' crops, on the device (torch's kernel)
            images = self.decode.batch(images, batch.indices, kernel="torch")
        if self.fields:
            return self._with_fields(images, batch)
        return images, self._labels(batch)

    def _rows(self, block: Any, positions: np.ndarray, strides: np.ndarray, sample: int) -> Any:
        """``(distinct samples, sample bytes)`` rows of the read blocks, without their padding.

        Within a shard raw samples sit one stride apart (``strides``: each sample's shard's), so
        each stretch of distinct samples whose buffer positions step by their stride is one
        strided view; one stretch (the usual case: a run, or a batch from one block) is a view,
        several are joined by one copy.
        """
        torch = self._torch
        breaks = np.flatnonzero((np.diff(positions) != strides[1:]) | (strides[1:] != strides[:-1])) + 1
        bounds = [0, *breaks.tolist(), len(positions)]
        base = block.storage_offset()  # as_strided's offset counts from the storage, not the view
        pieces = [torch.as_strided(block, (end - start, sample), (int(strides[start]), 1), base + int(positions[start]))
                  for start, end in zip(bounds[:-1], bounds[1:])]
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)

    def _with_fields(self, images: Any, batch: RunPlan) -> dict[str, Any]:
        """The ``fields=`` dict of one batch: each array field one gather from its index column."""
        torch = self._torch
        out: dict[str, Any] = {}
        for name in self.fields:
            if name == "image":
                out[name] = images
            elif name == "label":
                out[name] = self._labels(batch)
            else:
                if name == "index":
                    values = np.ascontiguousarray(batch.indices, dtype=np.int64)
                else:
                    column = self.dataset.field_array(name)
                    # the gather copies (B rows of the mapped column); native order for torch
                    values = column[batch.indices].astype(column.dtype.newbyteorder("="), copy=False)
                tensor = torch.from_numpy(values)
                out[name] = tensor if self.device.type == "cpu" else tensor.to(self.device, non_blocking=True)
        return out

    def __iter__(self) -> Iterator[Any]:
        if self.decode is not None and self.decode.seed is not None:
            self.decode.set_epoch(self.epoch)  # seeded crops follow the loader's epoch
        return super().__iter__()
