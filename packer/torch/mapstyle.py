"""``PackedDataset``: the map-style ``torch.utils.data.Dataset`` (``ds[i]`` and ``__getitems__``).

Memory
------
Nothing here holds per-sample Python objects. Datasets pickle as the manifest bytes plus
options (a few KB whatever the sample count), the index is a shared read-only mapping, shards
are opened lazily in each worker after fork, and samplers (main process) yield indices from
numpy arrays in small chunks. A ``PackedDataset`` worker's own memory does not depend on the
dataset size (``benchmarks/bench_memory.py``). A ``PackedIterableDataset`` worker computes the
epoch order itself, keeps only its own batches (4 bytes per sample of its share: 2 MB for a
million samples over two workers) and returns the order's temporaries to the OS.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
import torch.utils.data as torch_data

from ..classes import check_classes
from ..codecs import check_decodable, dataset_max_pixels
from ..dataset import as_sample_indices
from ..errors import DecodeError, SampleIndexError, SampleIndexTypeError
from .collate import PaddedCollate, _collate_columns, collate
from .fieldplan import DEFAULT_FIELDS, _check_fields, _FieldPlan
from .imagefolder import _ImageFolderRefusals
from .pipeline import (_BatchSamples, _label_column, _Pipeline, _raw_fast_batch, _raw_fast_shape,
                       _refuse_decode_transform)
from .runtime import BatchPool, DecodeFn, PathOrDataset, _empty_batch, _open


def _plain_calls(decode: Any) -> bool:
    """The fused transform decodes as ``DecodeTransform`` does (a subclass that overrides
    ``__call__`` or ``decode_with_geometry`` is called through them, sample by sample)."""
    from ..transforms import DecodeTransform

    kind = type(decode)
    return (kind.__call__ is DecodeTransform.__call__
            and kind.decode_with_geometry is DecodeTransform.decode_with_geometry)


class PackedDataset(_ImageFolderRefusals, torch_data.Dataset):
    """A map-style ``torch.utils.data.Dataset`` over a packed dataset: ``ds[i] -> (image, label)``.

    See the module docstring for what ``image`` is. ``__getitems__`` (used by the DataLoader
    when it has a batch sampler or ``batch_size``) decodes from zero-copy mmap views, or reads a
    whole batch with one coalesced ``read_batch`` first (other backends, checksums, raw bytes).

    torchvision's ``ImageFolder`` names that fit a flat index are here: ``classes``,
    ``class_to_idx``, ``targets`` (a read-only zero-copy int64 array, not a list) and ``root``.
    Deliberately missing: ``samples`` and ``imgs`` (a list of ``(path, label)`` tuples costs
    ~150 bytes of Python objects per sample, per worker: use ``dataset.key(i)``), ``loader``
    and ``extensions`` (packer decides by the bytes), and ``find_classes`` (the class list is
    fixed at build time: ``packer build --classes``).

    Args:
        source: the dataset folder, or an open ``packer.dataset.Dataset``.
        decode: ``True`` (decode to pixels), ``False`` (stored bytes) or a callable
            ``decode(data, image_format) -> HWC array`` such as ``packer.transforms.RandomResizedCrop``.
        layout: ``"CHW"`` (default) or ``"HWC"``. Batched paths (a fused transform, the raw
            codec) decode into one channels-last batch either way; ``"CHW"`` is an ``(N, C, H, W)``
            view of it (``torch.channels_last`` strides), so the layout costs nothing.
        transform: applied to the image tensor (torchvision tensor transforms work).
        target_transform: applied to the int label.
        backend: ``"mmap"``, ``"pread"`` or ``"direct"`` (see ``packer.open_dataset``).
        verify_checksums: check every sample's xxh3 on read.
        classes: the class list this dataset must have (e.g. ``train.classes`` when opening the
            validation set): a mismatch raises ``ClassListMismatchError`` at once.
        fields: what a sample holds: built-ins from ``FIELDS`` (``"image"``, ``"label"``,
            ``"index"``, ``"key"``, ``"metadata"``) and the dataset's declared fields
            (``dataset.fields``, formats/SPEC.md §14). The default ``("image", "label")`` gives
            ``(image, label)`` tuples; any other choice a dict per sample, in the order given
            (``collate`` makes a dict per batch). Values: ``array`` fields a tensor of their
            dtype and shape (variable ones ``(n, *rest)``); ``classes`` fields the sample's
            sorted int64 class ids, or a float32 multi-hot vector (``multi_hot``); ``text``
            fields a str; ``image`` fields a tensor of their values as stored
            (``Dataset.field_image``: a palette mask its indices, a 16-bit depth map uint16), ``(H,
            W)`` for one channel, ``(C, H, W)`` or ``(H, W, C)`` by ``layout`` for more (the stored
            bytes with ``decode=False``). With a fused transform as ``decode`` (``RandomResizedCrop``,
            ``CenterCrop``), image fields get the main image's crop, resize and flip, nearest
            neighbour (``CropGeometry.resample_nearest``: no new label or depth values); with
            ``decode=True`` or a callable of your own they come back as stored. ``transform``
            touches the main image only. Leaving ``"image"`` out skips decoding it.
        multi_hot: ``classes`` fields (among ``fields``) to return as ``(num_classes,)`` float32
            multi-hot vectors (the BCE target) instead of their ids.
        geometry: array fields (among ``fields``) that the fused transform's crop moves, as
            ``{name: kind}``: ``"xyxy"`` for boxes ``DTYPE[N,4]`` in the stored image's pixels
            (mapped to output pixels, clipped, and dropped when nothing of them is left, or less
            than the transform's ``min_box_visibility``: ``CropGeometry.map_boxes``),
            ``"points"`` for keypoints ``(..., 2|3)`` (x, y[, visibility]; points outside the
            output get visibility 0: ``CropGeometry.map_points``), ``"per-box"`` for rows that go
            with the boxes (labels, iscrowd: dropped in step with them), ``("points",
            "per-box")`` for keypoints that go with them. E.g. ``geometry={"boxes": "xyxy",
            "labels": "per-box"}``. Moved coordinates are float32 (float64 stays float64).
            Array fields not named here come back as stored. With ``decode=True``/``False``
            nothing moves (the image is as stored).

    Raises:
        ClassListMismatchError: ``classes`` given and different from the dataset's.
        OptionError: a decode transform passed as ``transform=``, an unknown field (the message
            lists the dataset's), or ``multi_hot``/``geometry`` entries that do not fit their
            field's declaration.
    """

    def __init__(self, source: PathOrDataset, *, decode: bool | DecodeFn = True, layout: str = "CHW",
                 transform: Callable[[Any], Any] | None = None,
                 target_transform: Callable[[Any], Any] | None = None, backend: str = "mmap",
                 verify_checksums: bool = False, classes: Sequence[str] | None = None,
                 fields: Sequence[str] = DEFAULT_FIELDS, multi_hot: Sequence[str] = (),
                 geometry: Mapping[str, str | Sequence[str]] | None = None) -> None:
        _refuse_decode_transform(transform)
        self._pipeline = _Pipeline(decode, layout, transform, target_transform)
        self._pool = BatchPool()  # shared-memory batches reused by forked workers (runtime.BatchPool)
        self.dataset = _open(source, backend, verify_checksums)
        self._fields = _check_fields(fields, self.dataset)
        self._plan: _FieldPlan | None = None
        if self._fields != DEFAULT_FIELDS or multi_hot or geometry:  # (these name fields: checked there)
            self._plan = _FieldPlan(self.dataset, self._fields, multi_hot, geometry, decode, layout)
        if decode is not False:
            # SPEC §6: a decoding reader refuses a codec it does not know, and decodes with the
            # pixel limit the build recorded (so every image the build accepted decodes).
            check_decodable(self.dataset.manifest.codec, path=self.dataset.path)
            self._pipeline.max_pixels = dataset_max_pixels(self.dataset.manifest)
        if classes is not None:
            check_classes(tuple(classes), self.dataset)

    def __len__(self) -> int:
        return len(self.dataset)

    @property
    def classes(self) -> tuple[str, ...]:
        return self.dataset.classes

    @property
    def class_to_idx(self) -> dict[str, int]:
        """``{class name: label}``, as torchvision's ``ImageFolder.class_to_idx``."""
        return {name: i for i, name in enumerate(self.dataset.classes)}

    @property
    def targets(self) -> np.ndarray:
        """Every sample's label: a read-only, zero-copy int64 view of the index (torchvision's
        ``ImageFolder.targets`` is a list; this indexes, slices and ``len``s the same way)."""
        labels = self.dataset.labels.view()
        labels.flags.writeable = False
        return labels

    @property
    def root(self) -> str:
        """The dataset folder."""
        return str(self.dataset.path)

    @property
    def fields(self) -> tuple[str, ...]:
        """What each sample holds (see the class docstring)."""
        return self._fields

    @property
    def labels(self) -> np.ndarray:
        """int64 labels of every sample (a zero-copy view of the index)."""
        return self.dataset.labels

    def _index(self, i: Any) -> int:
        try:
            i = operator.index(i)  # an int, numpy or 0-d torch integer; int() would take '3' and 2.7
        except TypeError:
            raise SampleIndexTypeError(f"sample indices must be integers, got {type(i).__name__}: {i!r:.40}") from None
        count = len(self.dataset)
        if not -count <= i < count:
            raise SampleIndexError(f"sample {i} out of range for a dataset of {count} samples")
        return i % count

    def __getitem__(self, i: int) -> Any:
        i = self._index(i)
        if self._plan is not None:
            return self.__getitems__([i])[0]
        data = np.frombuffer(self.dataset.get(i), dtype=np.uint8)  # zero-copy over the shard mapping
        pipeline = self._pipeline
        pixels = pipeline.pixels(self.dataset, i, data)
        image = pipeline.finish(pipeline.tensor(pixels, owned=pixels is not data))
        sample = (image, pipeline.label(self.dataset, i))
        return sample

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """Samples ``indices``: decoded from zero-copy views with the mmap backend, else read with
        one coalesced ``read_batch`` (a run per contiguous group). With ``fields=``, dict samples
        whose fixed-shape fields are gathered for the whole batch from the index's zero-copy
        columns (one ``take`` per field, straight into the batch tensor ``collate`` returns)."""
        plan = self._plan
        if plan is None or self._fields == DEFAULT_FIELDS:
            return self._pairs(indices)
        idx = as_sample_indices(indices).reshape(-1)
        n = len(self.dataset)
        if idx.size and (idx.min() < -n or idx.max() >= n):
            raise SampleIndexError(f"batch holds index {int(idx[(idx < -n) | (idx >= n)][0])}, outside "
                                   f"{-n}..{n - 1} (a dataset of {n} samples)")
        idx = idx % n if n else idx
        return plan.samples(*self._read_fields(idx))

    def _read_fields(self, idx: np.ndarray, *, columnar: bool = False
                     ) -> tuple[dict[str, list[Any]], dict[str, torch.Tensor], torch.Tensor | None]:
        """``_FieldPlan.read`` of a batch of in-range indices, and the images' batch tensor (or None).

        ``columnar`` (a collated batch, no per-sample dicts): a raw dataset's images stay one
        batch tensor and the labels one gather, as in ``load_batch``'s ``(images, labels)`` path.
        """
        plan: _FieldPlan = self._plan  # type: ignore[assignment]  # called with fields= only
        dataset, pipeline = self.dataset, self._pipeline
        geometries: list[Any] | None = [] if plan.wants_geometry else None
        batch = self._raw_batch(idx, geometries) if columnar and plan.decodes_image else None
        images: list[Any] | None = None
        labels: list[Any] | torch.Tensor
        if batch is None and plan.decodes_image:
            pairs = self._pairs(idx, geometries)
            batch = getattr(pairs, "batch", None)
            images, labels = [pair[0] for pair in pairs], [pair[1] for pair in pairs]
        elif columnar and pipeline.target_transform is None:  # no image asked for, or the raw batch
            labels = torch.from_numpy(dataset.labels[idx].astype(np.int64))
        else:
            labels = [pipeline.label(dataset, i) for i in idx.tolist()]
        min_visibility = getattr(pipeline.decode, "min_box_visibility", 0.0)
        values, columns = plan.read(dataset, idx, images, labels, geometries, min_visibility)
        return values, columns, batch

    def _pairs(self, indices: Sequence[int], geometries: list[Any] | None = None, *,
               out: torch.Tensor | None = None) -> list[tuple[Any, Any]]:
        """``(image, label)`` of each index; with ``geometries`` (a list), each sample's crop is
        appended to it, in order (fused transforms only). ``out``: a ``fast_batch_buffer`` for
        the batched paths (ignored when it does not fit)."""
        idx = as_sample_indices(indices).reshape(-1)
        pipeline = self._pipeline
        dataset = self.dataset
        n = len(dataset)
        if idx.size and (idx.min() < -n or idx.max() >= n):
            raise SampleIndexError(f"batch holds index {int(idx[(idx < -n) | (idx >= n)][0])}, outside "
                                   f"{-n}..{n - 1} (a dataset of {n} samples)")
        idx = idx % n if n else idx
        images = self._raw_batch(idx, geometries)
        if images is not None:
            return _BatchSamples(images, _label_column(dataset, pipeline, idx, images))
        if pipeline.decode is not False and dataset.backend_name == "mmap" and not dataset.verify_checksums:
            shape = pipeline.batch_shape(len(idx))
            if shape is not None:
                return self._decode_into_batch(idx, shape, geometries, out=out)
            # Decoding from zero-copy views of the mapping: no batch buffer, no memcpy of the
            # payloads (the decoder reads the page cache directly); the pixels are fresh arrays.
            samples = []
            for i in idx.tolist():
                data = np.frombuffer(dataset.get(i), dtype=np.uint8)
                pixels = pipeline.pixels(dataset, i, data, geometries)
                samples.append((pipeline.finish(pipeline.tensor(pixels, owned=pixels is not data)),
                                pipeline.label(dataset, i)))
            return samples
        batch = self.dataset.read_batch(idx)
        samples = []
        seen: set[int] = set()
        for j, i in enumerate(idx.tolist()):
            start = int(batch.starts[j])
            data = batch.data[start:start + int(batch.sizes[j])]  # a view of the fresh batch buffer
            pixels = pipeline.pixels(self.dataset, i, data, geometries)
            # A repeated index shares its bytes with its first occurrence: copy it, so an in-place
            # transform of one sample never changes another.
            samples.append((pipeline.finish(pipeline.tensor(pixels, owned=i not in seen)),
                            pipeline.label(self.dataset, i)))
            seen.add(i)
        return samples

    def _decode_into_batch(self, idx: np.ndarray, shape: tuple[int, ...],
                           geometries: list[Any] | None = None, *,
                           out: torch.Tensor | None = None) -> "_BatchSamples":
        """Decode each sample straight into its slot of one channels-last batch tensor (in shared
        memory inside a worker): no per-sample array and no copy when ``collate`` stacks them; a
        ``CHW`` batch is a view of it (``_Pipeline.batch_view``)."""
        dataset, pipeline = self.dataset, self._pipeline
        storage = pipeline.storage_of(out) if out is not None and out.dim() == 4 else None
        if (storage is not None and tuple(storage.shape) == shape and storage.dtype == torch.uint8
                and storage.is_contiguous()):
            batch = storage
        else:
            batch = _empty_batch(shape, self._pool)
        out = batch.numpy()
        decode, index = pipeline.decode, dataset.index
        # A seeded crop's boxes, drawn for the whole batch in one go (for the sizes the index
        # records; the transform draws again for a sample that decodes to another size).
        draws = decode._seeded_draws(index.width[idx], index.height[idx], idx) if _plain_calls(decode) else None
        formats = index.image_format[idx].tolist()
        for k, i in enumerate(idx.tolist()):
            data = np.frombuffer(dataset.get(i), dtype=np.uint8)
            try:
                if draws is not None:
                    geometry = decode._decode_drawn(data, formats[k], out[k], i, draws[k], geometries is not None)[1]
                    if geometries is not None:
                        geometries.append(geometry)
                elif geometries is None:
                    decode(data, formats[k], out=out[k], index=i)
                else:
                    geometries.append(decode.decode_with_geometry(data, formats[k], out=out[k], index=i)[1])
            except DecodeError as exc:
                raise DecodeError(f"{exc.message} (key {dataset.key(i)!r})", path=dataset.path,
                                  sample=i) from None
        images = pipeline.batch_view(batch)
        return _BatchSamples(images, _label_column(dataset, pipeline, idx, images))

    def load_batch(self, indices: Sequence[int], collate_fn: Callable[[Any], Any] | None = None, *,
                   out: torch.Tensor | None = None) -> Any:
        """``collate(self.__getitems__(indices))``, without per-sample objects where it can.

        For a ``raw`` dataset (``decode=True`` or a fused transform, no ``transform``) the batch
        tensor and the labels come straight from the batched path; otherwise it is exactly
        ``collate(self.__getitems__(indices))``. ``packer.threaded.ThreadedLoader`` calls it.

        Args:
            indices: the batch's sample indices.
            collate_fn: collates dict samples (``fields=``); default ``collate``
                (``PaddedCollate()`` pads variable fields).
            out: on the batched raw path, a tensor from ``fast_batch_buffer(len(indices))`` to
                write the images into (ignored elsewhere, or when its shape, dtype or memory
                format differ).

        Returns:
            ``(images, labels)`` as ``collate`` returns them, or a dict batch with ``fields=``.
        """
        idx = as_sample_indices(indices).reshape(-1)
        n = len(self.dataset)
        if idx.size and (idx.min() < -n or idx.max() >= n):
            raise SampleIndexError(f"batch holds index {int(idx[(idx < -n) | (idx >= n)][0])}, outside "
                                   f"{-n}..{n - 1} (a dataset of {n} samples)")
        idx = idx % n if n else idx
        if self._plan is not None and self._fields != DEFAULT_FIELDS:
            if collate_fn is not None and collate_fn is not collate and type(collate_fn) is not PaddedCollate:
                return collate_fn(self.__getitems__(idx))
            # packer's own collates: straight from the columns, no per-sample dicts
            values, columns, batch = self._read_fields(idx, columnar=True)
            return _collate_columns(self._fields, values, columns, self._plan.variable, batch, len(idx),
                                    collate_fn if type(collate_fn) is PaddedCollate else None)
        images = self._raw_batch(idx, out=out)
        if images is None:
            return collate(self._pairs(idx, out=out))  # the default fields here: what __getitems__ does
        return collate(_BatchSamples(images, _label_column(self.dataset, self._pipeline, idx, images)))

    def fast_batch_shape(self, count: int) -> tuple[int, ...] | None:
        """The shape of the uint8 images tensor ``load_batch`` makes in one piece for ``count``
        samples (a ``raw`` dataset with ``decode=True`` or a fused transform; or a fused transform
        decoding each sample into its slot, mmap backend; no ``transform``, the default fields), in
        the layout (``(N, C, H, W)`` for ``CHW``), or None when it takes another path."""
        buffer = self._fast_storage_shape(count)
        if buffer is None:
            return None
        return tuple(self._pipeline.batch_view(torch.empty(buffer, dtype=torch.uint8, device="meta")).shape)

    def copies_batches(self) -> bool:
        """True when ``load_batch`` only copies stored pixels into one tensor (a ``raw`` dataset
        read with ``decode=True`` or a fused transform, no ``transform``, the default fields): no
        decode, numpy's copies release the GIL, so threads of one process make such batches faster
        than worker processes hand them over (``PackedDataLoader`` reads them that way)."""
        if self._plan is not None and self._fields != DEFAULT_FIELDS:
            return False
        return _raw_fast_shape(self.dataset, self._pipeline, 1) is not None

    def decodes_without_gil(self) -> bool:
        """True when ``load_batch`` decodes each image straight into one batch tensor with a fused
        transform from ``packer.transforms`` (mmap backend, no ``transform``, the default fields):
        the decode (simplejpeg, the tile window, Pillow) and the resize (torch) run without the
        GIL, and the Python around them is a few % of a JPEG's decode, so threads of one process
        decode in parallel (``tests/codecs/test_gil_release.py``); ``PackedDataLoader`` reads such a
        dataset on threads when asked (``worker_mode="threads"``)."""
        if self._plan is not None and self._fields != DEFAULT_FIELDS:
            return False
        pipeline, dataset = self._pipeline, self.dataset
        return (pipeline.batch_shape(1) is not None and dataset.backend_name == "mmap"
                and not dataset.verify_checksums)

    def fast_batch_buffer(self, count: int) -> torch.Tensor | None:
        """An uninitialised images tensor for ``load_batch(..., out=)`` on the batched paths
        (``fast_batch_shape``), stored channels-last as they write it; None elsewhere.
        ``ThreadedLoader`` allocates it in the iterating thread (see ``_batch_buffer`` there)."""
        buffer = self._fast_storage_shape(count)
        return None if buffer is None else self._pipeline.batch_view(torch.empty(buffer, dtype=torch.uint8))

    def _fast_storage_shape(self, count: int) -> tuple[int, ...] | None:
        """The channels-last storage shape of a batch ``load_batch`` makes in one tensor: the raw
        fast paths, or a fused transform decoding each sample into its slot; else None."""
        if self._plan is not None and self._fields != DEFAULT_FIELDS:
            return None
        fast = _raw_fast_shape(self.dataset, self._pipeline, count)
        if fast is not None:
            return fast[0]
        pipeline, dataset = self._pipeline, self.dataset
        if pipeline.decode is False or dataset.backend_name != "mmap" or dataset.verify_checksums:
            return None
        return pipeline.batch_shape(count)

    def _raw_batch(self, idx: np.ndarray, geometries: list[Any] | None = None, *,
                   out: torch.Tensor | None = None) -> torch.Tensor | None:
        """The batch tensor of a raw dataset's fast paths (``_raw_fast_batch``), or None."""
        return _raw_fast_batch(self.dataset, self._pipeline, idx, geometries, out=out, pool=self._pool)

    def close(self) -> None:
        self.dataset.close()
