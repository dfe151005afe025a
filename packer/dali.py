"""The NVIDIA DALI adapter: picklable external sources that feed packed samples to DALI pipelines.

DALI decodes and augments on the GPU (``fn.decoders.image(device="mixed")`` is nvJPEG with a
hardware decoder where there is one); packer supplies the bytes. Two sources, both yielding
``(data, label)`` per sample, ``data`` a ``numpy.uint8`` array (the stored payload: 1-D encoded
bytes, or ``(H, W, C)`` pixels for a ``raw``-codec dataset) and ``label`` a 0-d ``int64`` array
(``-1`` when unlabeled); with ``return_index=True`` a third output carries the sample index.

``PackedSampleSource`` -- for ``fn.external_source(source=..., batch=False, parallel=True)``
    A stateless callable of DALI's ``SampleInfo``: sample ``info.idx_in_epoch`` of epoch
    ``first_epoch + info.epoch_idx`` is a pure function of (seed, epoch, shard), so DALI's worker
    processes can compute any sample in any order. Past the end of an epoch it keeps raising
    ``StopIteration`` (DALI prefetches beyond the end). Sample mode cannot emit a short batch, so
    every shard's epoch is a whole number of full batches: with ``drop_last=True`` the order's
    tail is dropped (full batches only, no sample twice); with ``drop_last=False`` (default) the
    shard's ``shard_size()`` samples are completed to a full last batch with the shard's first
    samples of the epoch (wrapping around).

``PackedBatchSource`` / ``PackedBatchIterator`` -- for ``fn.external_source(source=..., batch=True)``
    Whole batches, each read with one coalesced ``read_batch`` (runs of adjacent samples are one
    read). ``PackedBatchSource`` is a stateless callable of DALI's ``BatchInfo``
    (``parallel=True, batch_info=True``); ``PackedBatchIterator`` is iterated by DALI
    (``parallel=False, cycle="raise"``: each ``iter()`` starts the next epoch). The last batch
    of an epoch may be short (the same size on every shard) unless ``drop_last=True``.

Order and sharding are ``packer.order``'s (the same as ``packer.torch``): ``order`` is a
``packer.ReadOrder`` (or a kind string: ``"random"``, the default, ``"block"`` or
``"sequential"``); orders are functions of ``(seed, epoch)``; the pipeline of rank ``rank`` of
``world_size`` (DALI's ``shard_id`` of ``num_shards``; default from ``torch.distributed`` when
initialised, else 0 of 1) gets its rank's share of each global step and every shard gets the
same number of batches. To resume, pass ``first_epoch`` and ``consumed`` (the global position
within ``first_epoch``, from ``packer.order``'s state), or ``load_state_dict`` a saved state.

Declared fields (formats/SPEC.md §14): ``fields=("image", "boxes", "mask")`` makes the sources
emit one output per name, in that order, instead of ``(data, label)``. Names are ``"image"``
(the stored payload, as above), ``"label"``, ``"index"`` (0-d int64), ``"key"`` (its UTF-8
bytes) and the dataset's declared fields:

* an ``array`` field: a numpy array of its dtype per sample, the declared shape (a scalar is 0-d;
  a variable one ``(n, *rest)``, e.g. ``(n, 4)`` float32 boxes, ``n`` may be 0: DALI batches
  samples of different shapes);
* a ``classes`` field: the sample's class ids, 1-D int64, sorted (``fn.one_hot`` does not make a
  multi-hot vector of several: do it after the pipeline, or with ``packer.fields.multi_hot``);
* a ``text`` field: its UTF-8 bytes, 1-D uint8;
* an ``image`` field: with ``field_images="encoded"`` (default) the stored bytes, 1-D uint8,
  for a DALI decoder; with ``field_images="decoded"`` the pixels decoded on the CPU in the
  source's worker, values kept (``packer.decode.decode_as_stored``), always ``(H, W, C)``
  (``C = 1`` for a mask), uint8 or uint16 as stored. Prefer ``"decoded"`` for palette PNG
  masks: DALI's image decoders turn a palette into its RGB colours, not the class ids.

``source.output_names`` are the outputs' names (for ``DALIGenericIterator``'s output map) and
``fn.external_source(source=source, batch=..., **source.external_source_options())`` passes
``num_outputs``, ``dtype`` and ``ndim`` for them. In batch mode image fields are read per sample
(a zero-copy view with the default mmap backend; a ``pread`` each with the others), the main
images with one coalesced ``read_batch``.

Files are opened lazily inside the process that reads (each DALI worker, after fork or spawn),
never shared across a fork; pickling a source costs a few hundred bytes (path and settings). The
index version is pinned: a worker that finds the dataset replaced raises ``DatasetChangedError``.

The framework iterators and the last batch. DALI's ``DALIGenericIterator`` (and
``DALIClassificationIterator``, the JAX and PaddlePaddle ones) only honour ``last_batch_policy``
when they know the shard's size: with neither ``size`` nor ``reader_name`` (an external source
has no reader) they force ``LastBatchPolicy.FILL`` and run until the source raises
``StopIteration``, so ``DROP`` and ``PARTIAL`` are silently ignored. Pass
``**source.iterator_options()``: ``size`` is ``shard_size()``, DALI's "number of samples in the
shard" (this shard's samples of the epoch, the batch completion excluded), and
``last_batch_padded=True`` (the completion belongs to the epoch: the next epoch starts afresh).
What each policy then yields per shard and epoch, with ``S = shard_size()`` and batch size ``B``:

* ``DROP``: ``S // B`` full batches. With ``drop_last=True`` on the source ``S`` is already a
  multiple of ``B``: no sample is seen twice and nothing but the order's tail is skipped (the
  recommended form, below);
* ``FILL``: ``ceil(S / B)`` full batches, the last completed with the shard's first samples of
  the epoch (the source's padding);
* ``PARTIAL``: ``ceil(S / B)`` batches, the last one holding only the shard's remaining samples.

Every shard gets the same ``S`` (``packer.order``'s pad/drop rule), hence the same number of
batches under every policy. With ``drop_last=False`` the order itself repeats at most
``num_shards - 1`` samples per epoch to share it equally (the epoch's first ones). ``size`` is per
epoch: after a mid-epoch resume (``consumed > 0``) the first epoch is shorter, so run that epoch
with its own pipeline and iterator and start the next ones with ``first_epoch + 1``. DALI warns
that ``size`` is set by hand ("Please set reader_name..."): expected with an external source.
The batch sources can emit a short last batch, which DALI's iterators accept only with
``size=-1``: use them with the default iterator settings, and ``drop_last=True`` to drop it.

Example: a GPU training pipeline (PyTorch)::

    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy
    from packer import ReadOrder
    from packer.dali import PackedSampleSource

    BATCH = 256
    source = PackedSampleSource("/data/imagenet-packed", batch_size=BATCH,
                                order=ReadOrder("random", seed=0, drop_last=True, rank=rank, world_size=world_size))

    @pipeline_def(batch_size=BATCH, num_threads=8, device_id=local_rank,
                  py_num_workers=8, py_start_method="spawn")
    def train_pipeline():
        jpegs, labels = fn.external_source(source=source, num_outputs=2, batch=False,
                                           parallel=True, dtype=[types.UINT8, types.INT64])
        images = fn.decoders.image_random_crop(jpegs, device="mixed", output_type=types.RGB)
        images = fn.resize(images, resize_x=224, resize_y=224)
        images = fn.crop_mirror_normalize(
            images, dtype=types.FLOAT, output_layout="CHW", mirror=fn.random.coin_flip(),
            mean=[0.485 * 255, 0.456 * 255, 0.406 * 255], std=[0.229 * 255, 0.224 * 255, 0.225 * 255])
        return images, labels.gpu()

    pipe = train_pipeline()
    pipe.build()
    loader = DALIGenericIterator(pipe, ["images", "labels"], auto_reset=True,
                                 last_batch_policy=LastBatchPolicy.DROP, **source.iterator_options())
    for epoch in range(epochs):          # the source's epochs advance with the pipeline's
        for batch in loader:             # len(loader) full batches, the same on every rank
            images, labels = batch[0]["images"], batch[0]["labels"]   # on the GPU

(``py_start_method="spawn"`` is the safe choice once CUDA is initialised in the parent; the
source is picklable. On a machine without a GPU the same pipeline runs with ``device_id=None``
and ``fn.decoders.image(device="cpu")``.)
"""

from __future__ import annotations

import os
from typing import Any, Iterator

import numpy as np

from .errors import DatasetChangedError, DecodeError, OptionError
from .fields import READ_FIELDS
from .order import ORDER_KEYWORDS, EpochCursor, IndexSpace, RankPlan, ReadOrder, check_epoch, read_order_from

__all__ = ["PackedSampleSource", "PackedBatchSource", "PackedBatchIterator", "BUILTIN_OUTPUTS", "FIELD_IMAGES"]

#: Output names every dataset has (``fields=``), beside its declared fields: every reader's built-in
#: names (``packer.fields.READ_FIELDS``) but ``metadata``, a JSON object DALI has no type for.
BUILTIN_OUTPUTS = tuple(name for name in READ_FIELDS if name != "metadata")
#: How image fields are emitted: their stored bytes, or decoded on the CPU keeping their values.
FIELD_IMAGES = ("encoded", "decoded")
#: The sources' order when none is given.
DEFAULT_ORDER = ReadOrder("random")
#: The sources' old order keywords (DALI's names for the rank and world size among them), and
#: the share a call with old keywords read when it left those two out.
_SOURCE_KEYWORDS = {**ORDER_KEYWORDS, "shard_id": "rank", "num_shards": "world_size"}
_SOURCE_OLD_SHARE = {"shard_id": 0, "num_shards": 1}


def _check_outputs(fields: Any, specs: Any, return_index: bool, field_images: str, *, path: Any) -> tuple[str, ...]:
    """The ``fields=`` names, checked against the dataset's declared fields."""
    if field_images not in FIELD_IMAGES:
        raise OptionError(f"field_images must be one of {', '.join(FIELD_IMAGES)}, got {field_images!r}")
    if fields is None:
        return ()
    chosen = (fields,) if isinstance(fields, str) else tuple(fields)
    declared = {spec.name for spec in specs}
    if not chosen or len(set(chosen)) != len(chosen) or not all(isinstance(name, str) for name in chosen):
        raise OptionError(f"fields must be distinct names, got {list(chosen)}")
    if "metadata" in chosen:
        raise OptionError("metadata is a JSON object per sample, which DALI has no type for: ask for 'index' "
                          "and read Dataset.metadata(i) outside the pipeline")
    unknown = [name for name in chosen if name not in declared and name not in BUILTIN_OUTPUTS]
    if unknown:
        raise OptionError(f"fields {unknown} are not outputs of {path}: it has {list(BUILTIN_OUTPUTS)} and the "
                          f"declared fields {sorted(declared) or 'none'}")
    if return_index:
        raise OptionError("return_index=True adds an output to (data, label); with fields=, name 'index' "
                          "among them instead")
    return chosen


def _dataset_path_and_version(source: Any, *, check_formats: bool = True, fields: Any = None,
                              return_index: bool = False, field_images: str = "encoded"
                              ) -> tuple[str, int, int, tuple[str, ...], tuple[Any, ...]]:
    """(folder, index checksum, sample count, output names, their field specs) of a path or an
    open dataset, touching no shard.

    With ``check_formats`` a codec this reader does not know (SPEC §6), or stored formats DALI's
    image decoders cannot decode (``pillowformats.decodable_by("dali")``: e.g. QOI, TGA, PSD),
    are refused here, with their names, rather than deep inside a running pipeline; so are an
    encoded image field's formats.
    """
    from .codecs import codec_for
    from .dataset import DatasetIndex, open_index
    from ._internal.pillowformats import check_reader_formats

    def checked(index: Any) -> tuple[str, int, int, tuple[str, ...], tuple[Any, ...]]:
        outputs = _check_outputs(fields, index.fields, return_index, field_images, path=index.path)
        specs = tuple(index.field_spec(name) if name not in BUILTIN_OUTPUTS else None for name in outputs)
        if check_formats:
            if not outputs or "image" in outputs:
                codec = codec_for(index)
                codec.check_decodable()
                if codec.encoded:  # stored pixels (raw) are no decoder's business
                    check_reader_formats(index.index.image_format, "dali", path=index.path)
            for spec in specs:
                if spec is not None and spec.kind == "image" and field_images == "encoded":
                    try:
                        check_reader_formats(index.index.field_columns[spec.image_column("format")], "dali",
                                             path=index.path)
                    except DecodeError as exc:
                        raise DecodeError(f"field {spec.name!r}: {exc.message}; or pass field_images='decoded' "
                                          f"to decode image fields on the CPU", path=index.path) from None
        # a dataset URL stays a URL (a worker reopens it through its node cache), a folder its path
        return index.location, index.manifest.index.checksum, len(index), outputs, specs

    if isinstance(source, DatasetIndex):
        return checked(source)
    with open_index(source) as index:
        return checked(index)


class _PackedSource:
    """Settings, the per-process dataset and the per-epoch plan shared by both sources."""

    def __init__(self, dataset: Any, batch_size: int, *, order: ReadOrder | str | None = None, first_epoch: int = 0,
                 consumed: int = 0, backend: str = "mmap", verify_checksums: bool = False, return_index: bool = False,
                 check_formats: bool = True, fields: Any = None, field_images: str = "encoded",
                 **deprecated: Any) -> None:
        reader = type(self).__name__
        read_order = read_order_from(order, deprecated, reader=reader, default=DEFAULT_ORDER,
                                     keywords=_SOURCE_KEYWORDS,
                                     old_defaults=_SOURCE_OLD_SHARE)
        for name, value in (("first_epoch", first_epoch), ("consumed", consumed)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise OptionError(f"{name} must be a non-negative integer, got {value!r}")
        read_order = read_order.resolved(batch_size=batch_size, reader=reader)
        self.path, self._index_checksum, num_samples, self.fields, self._specs = _dataset_path_and_version(
            dataset, check_formats=check_formats, fields=fields, return_index=return_index, field_images=field_images)
        #: a packer.Mixture has no location to reopen: it travels itself (a mixture pickles as its
        #: streams' locations and settings, and opens them again in a DALI worker)
        self._mixture = dataset if callable(getattr(dataset, "own_space", None)) else None
        #: a dataset URL's RemoteOptions (endpoint, cache) for the workers that reopen it
        self.remote = getattr(getattr(dataset, "place", None), "options", None)
        self.field_images = field_images
        # The cursor's position is (first_epoch, consumed): DALI's epoch 0 is first_epoch, resumed
        # at consumed; later epochs start at their beginning. Blocks are computed per process
        # (the space opens this process's dataset when it first needs them).
        space = (IndexSpace(self._mixture) if self._mixture is not None  # the mixture's epochs: its streams' shares
                 else IndexSpace(self._open, num_samples=num_samples))
        if consumed > space.num_samples:
            raise OptionError(f"consumed={consumed} exceeds the {space.num_samples} samples of an epoch")
        self.cursor = EpochCursor(read_order, space)
        self.cursor.position.load(first_epoch, consumed)
        self.batch_size = batch_size
        self.backend = backend
        self.verify_checksums = verify_checksums
        self.return_index = return_index
        self._reset_process_state()

    @property
    def read_order(self) -> ReadOrder:
        return self.cursor.read_order

    @property
    def num_samples(self) -> int:
        return self.cursor.num_samples

    @property
    def shard_id(self) -> int:
        """This pipeline's shard (DALI's name for the order's rank)."""
        return self.cursor.rank

    @property
    def num_shards(self) -> int:
        """How many shards share each epoch (DALI's name for the order's world size)."""
        return self.cursor.world_size

    @property
    def first_epoch(self) -> int:
        return self.cursor.epoch

    @property
    def consumed(self) -> int:
        return self.cursor.start

    def _reset_process_state(self) -> None:
        self._pid = os.getpid()
        self._dataset: Any = None
        self._raw_shape: tuple[int, int, int] | None = None
        self._plans: dict[int, RankPlan] = {}

    # Pickles carry the settings only: each DALI worker opens its own files (and the cursor's
    # IndexSpace measures its blocks there again).
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for key in ("_pid", "_dataset", "_raw_shape", "_plans"):
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset_process_state()

    def _open(self) -> Any:
        """This process's dataset, opened on first use (again after a fork)."""
        if self._dataset is None or self._pid != os.getpid():
            from .codecs import codec_for
            from .dataset import open_dataset

            self._reset_process_state()
            if self._mixture is not None:  # its streams' datasets reopen their shards after a fork themselves
                dataset = self._mixture
            else:
                dataset = open_dataset(self.path, backend=self.backend, verify_checksums=self.verify_checksums,
                                       remote=self.remote)
            if dataset.manifest.index.checksum != self._index_checksum:
                dataset.close()
                raise DatasetChangedError("the dataset was replaced after the DALI source was created",
                                          path=self.path)
            self._raw_shape = codec_for(dataset, path=self.path).sample_shape  # stored pixels: reshaped
            self._dataset = dataset
        return self._dataset

    def epoch_start(self, epoch: int) -> int:
        """The global position the shard's share of ``epoch`` starts from (``consumed`` for the first)."""
        return self.consumed if epoch == self.first_epoch else 0

    def plan(self, epoch: int) -> RankPlan:
        """This shard's batches of ``epoch`` (cached: DALI asks for the same epoch many times)."""
        plan = self._plans.get(epoch)
        if plan is None:
            self._open()
            plan = self.cursor.plan(epoch)
            self._plans = {epoch: plan}  # one epoch at a time per worker: bounded memory
        return plan

    def state_dict(self, epoch_idx: int, batches_consumed: int) -> dict[str, Any]:
        """The resumable position after ``batches_consumed`` batches of DALI's epoch ``epoch_idx``.

        ``epoch_idx`` counts from the pipeline's first epoch (0), as DALI does; every shard
        consumes in lock step, so any shard can save it. Resume by passing the state to
        ``load_state_dict`` of a new source (before the pipeline is built) or to the same
        source's constructor arguments ``first_epoch``/``consumed``.
        """
        epoch = self.first_epoch + check_epoch(epoch_idx)
        share = self.read_order.share(self.num_samples, consumed=self.epoch_start(epoch), world_size=self.num_shards)
        return self.read_order.state_dict(self.cursor.space, epoch=epoch,
                                          consumed=share.consumed_after(batches_consumed))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Start at a saved position: DALI's epoch 0 becomes the saved epoch, from the saved sample on.

        Raises:
            OptionError: the state was saved with another order, seed or dataset size.
        """
        self.cursor.load_state_dict(state)
        self._plans = {}

    def num_batches(self, epoch: int | None = None) -> int:
        """Batches per shard in ``epoch`` (default ``first_epoch``): the same on every shard."""
        epoch = self.first_epoch if epoch is None else epoch
        return self.read_order.share(self.num_samples, consumed=self.epoch_start(epoch),
                                     world_size=self.num_shards).num_batches

    def _payload(self, data: Any) -> np.ndarray:
        array = np.frombuffer(data, dtype=np.uint8)
        if self._raw_shape is not None:
            return array.reshape(self._raw_shape)
        return array

    def _outputs(self, data: np.ndarray, i: int) -> tuple[np.ndarray, ...]:
        if self.fields:
            return tuple(self._output(name, spec, i, data) for name, spec in zip(self.fields, self._specs))
        label = np.array(int(self._dataset.index.label[i]), dtype=np.int64)
        if self.return_index:
            return data, label, np.array(i, dtype=np.int64)
        return data, label

    # --- declared fields ---
    @property
    def output_names(self) -> tuple[str, ...]:
        """The names of the outputs, in order: ``fields``, or ``("image", "label"[, "index"])``."""
        if self.fields:
            return self.fields
        return ("image", "label", "index") if self.return_index else ("image", "label")

    def _output(self, name: str, spec: Any, i: int, data: np.ndarray | None = None) -> np.ndarray:
        """Sample ``i``'s output ``name`` (``data``: its main payload, when already read)."""
        dataset = self._dataset
        if spec is None:
            if name == "image":
                return data if data is not None else self._payload(dataset.get(i))
            if name == "label":
                return np.array(int(dataset.index.label[i]), dtype=np.int64)
            if name == "index":
                return np.array(i, dtype=np.int64)
            return np.frombuffer(dataset.key(i).encode("utf-8"), dtype=np.uint8)
        if spec.kind == "image":
            if self.field_images == "encoded":
                return np.frombuffer(dataset.field_bytes(name, i), dtype=np.uint8)
            pixels = dataset.field_image(name, i)
            return pixels[:, :, None] if pixels.ndim == 2 else pixels  # (H, W, 1): what DALI's HWC ops take
        value = dataset.field_value(name, i)
        if spec.kind == "text":
            return np.frombuffer(value.encode("utf-8"), dtype=np.uint8)
        # native byte order (the index is little-endian): DALI reads the buffer as it is. Not
        # ascontiguousarray: it makes a scalar (0-d) 1-d; decode_value's arrays are contiguous.
        return value.astype(value.dtype.newbyteorder("="), copy=False)

    def external_source_options(self) -> dict[str, Any]:
        """``num_outputs``, ``dtype`` and ``ndim`` for ``fn.external_source`` (needs DALI).

        The main image is 1-D uint8 (3-D for ``raw``), labels and indices 0-d int64; fields as in
        the module doc. A decoded image field's dtype is the one its first sample decodes to.
        """
        try:
            from nvidia.dali import types
        except ImportError as exc:  # pragma: no cover - exercised only without DALI
            from .errors import MissingDependencyError

            raise MissingDependencyError(f"DALI is not installed ({exc}); pip install 'packer-shards[dali]'") from None
        dataset = self._open()
        raw = self._raw_shape is not None
        dtypes, ndims = [], []
        for name, spec in zip(self.output_names, self._specs or (None,) * len(self.output_names)):
            if spec is None:
                dtype = np.uint8 if name in ("image", "key") else np.int64
                ndim = (3 if raw else 1) if name == "image" else (1 if name == "key" else 0)
            elif spec.kind == "image":
                if self.field_images == "encoded":
                    dtype, ndim = np.uint8, 1
                else:
                    dtype, ndim = (dataset.field_image(name, 0).dtype if len(dataset) else np.uint8), 3
            elif spec.kind == "text":
                dtype, ndim = np.uint8, 1
            elif spec.kind == "classes":
                dtype, ndim = np.int64, 1
            else:
                dtype, ndim = spec.numpy_dtype, len(spec.shape)
            dtypes.append(types.to_dali_type(np.dtype(dtype).newbyteorder("=")))
            ndims.append(ndim)
        return {"num_outputs": len(dtypes), "dtype": dtypes, "ndim": ndims}


class PackedSampleSource(_PackedSource):
    """``fn.external_source(source=PackedSampleSource(...), batch=False, parallel=True, num_outputs=2)``.

    Args:
        dataset: a dataset folder (or an open dataset, of which only the path and version are kept).
        batch_size: the pipeline's batch size (the order deals global steps of
            ``world_size * batch_size`` samples).
        order: a ``packer.ReadOrder`` or a kind string (default ``ReadOrder("random")``): kind,
            seed, ``drop_last`` (drop the order's tail, full batches only, instead of completing
            the last batch with the shard's first samples: see the module doc; pair it with
            ``LastBatchPolicy.DROP`` and ``iterator_options()``), this pipeline's ``rank`` of
            ``world_size`` (DALI's ``shard_id`` of ``num_shards``; default from
            ``torch.distributed`` when initialised, else 0 of 1), block settings; its
            ``batch_size`` None or ``batch_size``.
        first_epoch: the epoch DALI's epoch 0 is (to resume, or to continue a schedule).
        consumed: global position within ``first_epoch`` to start from (resuming mid-epoch).
        backend: the reader backend used inside workers (``"mmap"``, ``"pread"``, ``"direct"``).
        verify_checksums: check each sample's xxh3 as it is read.
        return_index: add a third output, the sample index.
        check_formats: refuse, at construction, stored formats DALI cannot decode (False when
            your pipeline decodes them some other way).
        fields: one output per name instead of ``(data, label)``: ``"image"``, ``"label"``,
            ``"index"``, ``"key"`` and declared fields (see the module doc for what each gives).
        field_images: image fields as their stored bytes (``"encoded"``, default) or decoded on
            the CPU keeping their values (``"decoded"``: ``(H, W, C)``, a mask's class ids).
        **deprecated: the order keywords of earlier releases (``shard_id=``, ``num_shards=``,
            ``seed=``, ``drop_last=``, ``block_bytes=``, ``window=``, ...): still accepted for one
            release, with a ``DeprecationWarning`` (a call using them reads shard 0 of 1 unless it
            says otherwise, as it did).

    Raises:
        OptionError: a bad setting, or a name in ``fields`` the dataset does not have.
        DecodeError: with ``check_formats``, stored formats DALI's decoders cannot decode.
    """

    def epoch_length(self, epoch: int | None = None) -> int:
        """Samples this shard emits in ``epoch``: ``num_batches * batch_size``, full batches only."""
        return self.num_batches(epoch) * self.batch_size

    def shard_size(self, epoch: int | None = None) -> int:
        """This shard's samples of ``epoch`` (default ``first_epoch``) before the last batch is completed.

        DALI's ``size`` ("number of samples in the shard") for this shard's iterator: the same on
        every shard, ``epoch_length()`` minus the completion of the last batch.
        """
        epoch = self.first_epoch if epoch is None else epoch
        return self.read_order.share(self.num_samples, consumed=self.epoch_start(epoch),
                                     world_size=self.num_shards).per_rank

    def iterator_options(self, epoch: int | None = None) -> dict[str, Any]:
        """Keyword arguments that make DALI's framework iterators honour ``last_batch_policy``.

        ``DALIGenericIterator(pipe, names, last_batch_policy=..., **source.iterator_options())``:
        ``size`` is ``shard_size(epoch)`` and ``last_batch_padded`` is True (the source completes
        the last batch inside the epoch). See the module docstring for what each policy yields.

        Raises:
            OptionError: the shard has no sample in ``epoch`` (DALI refuses ``size=0``).
        """
        size = self.shard_size(epoch)
        if size < 1:
            raise OptionError(f"shard {self.shard_id} of {self.num_shards} has no sample in this epoch "
                              f"(batch_size={self.batch_size}, drop_last={self.read_order.drop_last}); DALI's "
                              f"iterators refuse size=0")
        return {"size": size, "last_batch_padded": True}

    def sample_index(self, epoch: int, idx_in_epoch: int) -> int:
        """The dataset sample at position ``idx_in_epoch`` of this shard's ``epoch``.

        Raises:
            StopIteration: past the end of the epoch (for every later position too).
        """
        plan = self.plan(epoch)
        mine = plan.indices
        if idx_in_epoch < 0 or len(mine) == 0 or idx_in_epoch >= plan.num_batches * self.batch_size:
            raise StopIteration
        # Padding the short last batch: wrap to the shard's first samples of the epoch.
        return int(mine[idx_in_epoch % len(mine)])

    def __call__(self, sample_info: Any) -> tuple[np.ndarray, ...]:
        epoch = self.first_epoch + int(sample_info.epoch_idx)
        i = self.sample_index(epoch, int(sample_info.idx_in_epoch))
        dataset = self._open()
        if self.fields and "image" not in self.fields:
            return self._outputs(None, i)  # type: ignore[arg-type]  # the main payload is not read
        return self._outputs(self._payload(dataset.get(i)), i)


class _BatchReader(_PackedSource):
    def read(self, epoch: int, iteration: int) -> tuple[list[np.ndarray], ...]:
        """Batch ``iteration`` of this shard's ``epoch``: lists of payload arrays and labels.

        Raises:
            StopIteration: past the last batch of the epoch.
        """
        plan = self.plan(epoch)
        if not 0 <= iteration < plan.num_batches:
            raise StopIteration
        indices = plan.batch(iteration)
        dataset = self._open()
        if self.fields and "image" not in self.fields:
            # no main payload wanted: do not read the images' block at all
            return tuple([self._output(name, spec, i) for i in indices.tolist()]
                         for name, spec in zip(self.fields, self._specs))
        batch = dataset.read_batch(indices)
        data = [self._payload(batch.data[start:start + size])
                for start, size in zip(batch.starts.tolist(), batch.sizes.tolist())]
        if self.fields:
            return tuple(data if name == "image" else [self._output(name, spec, i) for i in indices.tolist()]
                         for name, spec in zip(self.fields, self._specs))
        labels = [np.array(label, dtype=np.int64) for label in dataset.index.label[indices].tolist()]
        if self.return_index:
            return data, labels, [np.array(i, dtype=np.int64) for i in indices.tolist()]
        return data, labels


class PackedBatchSource(_BatchReader):
    """``fn.external_source(source=PackedBatchSource(...), batch=True, parallel=True, batch_info=True)``.

    A stateless callable of DALI's ``BatchInfo`` (or of the iteration number, with
    ``batch_info=False``: then every epoch is ``first_epoch``, from its beginning; a source that
    resumes mid-epoch refuses it, since it could not tell the resumed pass from later ones). Arguments as for
    ``PackedSampleSource``. Not iterable on purpose: DALI treats an iterable source as an
    iterator, whatever else it is (use ``PackedBatchIterator`` for that).
    """

    def __call__(self, batch_info: Any) -> tuple[list[np.ndarray], ...]:
        if isinstance(batch_info, (int, np.integer)):
            if self.consumed:
                # Without DALI's epoch index every pass would be first_epoch from `consumed`: the
                # resumed tail read again in every later epoch (the loaded position is for one pass).
                raise OptionError(f"this source resumes mid-epoch (consumed={self.consumed}); pass batch_info=True to "
                                  f"fn.external_source so that DALI tells it which epoch each batch belongs to "
                                  f"(the rest of epoch {self.first_epoch} first, then whole epochs)")
            return self.read(self.first_epoch, int(batch_info))
        return self.read(self.first_epoch + int(batch_info.epoch_idx), int(batch_info.iteration))


class PackedBatchIterator(_BatchReader):
    """``fn.external_source(source=PackedBatchIterator(...), batch=True, cycle="raise")``: serial batch mode.

    Each ``iter()`` starts the next epoch (the first is ``first_epoch``); DALI calls ``iter()``
    again when an epoch ends (``cycle="raise"``). Arguments as for ``PackedSampleSource``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._iterations = 0

    def __iter__(self) -> Iterator[tuple[list[np.ndarray], ...]]:
        epoch = self.first_epoch + self._iterations
        self._iterations += 1
        return self._epoch_batches(epoch)

    def _epoch_batches(self, epoch: int) -> Iterator[tuple[list[np.ndarray], ...]]:
        for iteration in range(self.plan(epoch).num_batches):
            yield self.read(epoch, iteration)
