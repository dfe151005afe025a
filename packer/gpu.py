"""GPU batch loaders: raw-pixel shards and encoded JPEG shards landed in GPU memory, plus the kvikio status helpers.

Nothing here imports torch, kvikio, torchvision or CuPy at module import: ``import packer.gpu``
is cheap and works on a machine without a GPU. Each class imports what it needs when it is
created and says which extra to install when something is missing (``pip install 'packer-shards[gpu]'``).
The kvikio backend itself (``open_dataset(path, backend="kvikio")``, ``KvikioShard``) lives in
``packer.backends.kvikio``; ``gds_status``, ``cuda_driver_status`` and ``set_kvikio_threads``
are re-exported here because GPU users look for them here.

``GpuRawBatches``
    Batches of a ``raw``-codec dataset (decoded ``uint8`` HWC pixels at a fixed size) as
    ``(B, H, W, C)`` uint8 tensors on the GPU. Per batch: the batch's samples are grouped into
    runs of consecutive samples of one shard; each run is one aligned block of the shard file
    (formats/SPEC.md §3.3), read with one call straight into a device staging buffer (kvikio) or
    into pinned host memory and copied (``io="host"``). Because every raw sample occupies
    exactly ``stride = align_up(H*W*C, A)`` bytes, the concatenated blocks hold the batch's
    distinct samples at multiples of ``stride``: one strided view plus one gather kernel puts
    them in batch order. The order is ``packer.order``'s (``"block"`` by default: shuffled blocks
    of about ``block_bytes``, samples shuffled within windows of blocks, each global step sorted
    so a rank reads long runs, then each batch shuffled by the gather), dealt to ranks with
    equal batch counts, resumable at ``(seed, epoch, consumed)``, like ``packer.torch``'s readers.
    With ``decode=RandomResizedCrop(...)`` (or ``CenterCrop``) each batch is then cropped,
    resized and flipped on the device in one batched pass (``packer.rawcrop.crop_resize_batch``,
    torch's kernel): the same boxes and flips as the CPU readers, a function of ``(seed, epoch,
    index)`` with a seeded transform.

    Declared fields (formats/SPEC.md §14), where they apply: ``fields=("image", "label",
    "depth")`` yields a dict per batch, one ``(B, *shape)`` tensor per name on the device. A
    fixed-width ``array`` field (``float32[4]``, a scalar) is a flat index column, so a batch's
    values are one gather from the mapped column plus one copy: no shard byte is read for them.
    What does not apply, refused with ``OptionError``: variable fields (``float32[N,4]`` boxes,
    ``classes``, ``text``: no fixed ``(B, ...)`` shape to put on the device), ``image`` fields
    (encoded PNG masks in their own shards, not raw pixels), and ``key`` / ``metadata``
    (strings). Read those with ``PackedDataset(fields=...)`` or the DALI sources.

``GpuJpegBatches``
    Batches of an encoded dataset: coalesced block reads into pinned host memory, then a GPU
    JPEG decoder (default ``TorchvisionJpegDecoder``: ``torchvision.io.decode_jpeg(list,
    device=...)``, nvJPEG, batched). Non-JPEG samples are decoded on the CPU (``packer.decode``)
    by design; JPEGs the GPU decoder refuses go to the CPU according to ``cpu_fallback``
    (``"warn"``: a one-time warning, the default; ``"error"``; ``"silent"``), and
    ``decode_counts`` says how many images each path decoded. Yields a list of ``(3, H, W)``
    uint8 tensors (sizes differ) and the labels; pass ``transform`` to resize/stack on the GPU.

Both loaders take ``device="cpu"`` to run the same planning, reading, view and read-ahead code
on the host (CPU tensors out): that is how CI tests them, and a usable fallback.

Devices: ``device="cuda"`` means the caller's current CUDA device *when the loader is created*
(``torch.cuda.set_device(local_rank)`` first, as DDP scripts do), resolved once to
``cuda:N``. The read-ahead thread sets that device on itself before it creates its stream or
allocates anything (a new thread starts on device 0 whatever the main thread chose), so streams,
staging buffers, pinned memory's context, batches and nvJPEG decodes all use rank ``N``'s GPU.

Overlap: with ``double_buffer=True`` a background thread (``packer.backends.readahead``)
prepares batch ``k+1`` (reads, copy, gather, on its own CUDA stream, synchronised before
hand-off) while the caller computes on batch ``k``. The tensors handed out are fresh
allocations, never the staging buffers, and are marked with ``record_stream`` for the
consumer's stream, so the caching allocator cannot recycle them while the caller's kernels
still read them. When a read fails, every read already in flight is waited for before the error
reaches the caller, so no kvikio thread writes into a freed staging buffer or a closed file.

Settings: both loaders take the settings of ``GpuLoaderOptions`` (a frozen dataclass) as keyword
arguments, or an ``options=GpuLoaderOptions(...)`` object plus keyword overrides.

Example::

    from packer.gpu import GpuRawBatches
    torch.cuda.set_device(local_rank)
    loader = GpuRawBatches("/data/imagenet-raw224", batch_size=256, order="block", seed=0)
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for images, labels in loader:          # (256, 224, 224, 3) uint8 on cuda:local_rank, (256,) int64
            x = images.permute(0, 3, 1, 2).float().div_(255)
            ...

What replaces torchvision's CUDA ``decode_jpeg``: torchvision has deprecated its image decoders
in favour of TorchCodec. The GPU decoder is a plug-in (``gpu_decoder=``: any callable with the
``GpuJpegDecoder`` signature); when torchvision removes CUDA ``decode_jpeg``, packer's default
becomes TorchCodec's nvJPEG decoder (``torchcodec.decoders``, 0.16 and later), and nvImageCodec
(``nvidia.nvimgcodec``) where TorchCodec is missing; until then torchvision's is the default and
``cpu_fallback`` makes sure a missing nvJPEG never goes unnoticed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import Any, Callable, Iterator, Protocol, Sequence

import numpy as np

from . import format as fmt
from .backends.buffers import PAGE
from .backends.kvikio import (GPU_EXTRA, cuda_driver_status, gds_status, import_kvikio, kvikio_get,
                              set_kvikio_threads)
from .backends.readahead import ReadAhead
from .backends.runs import RunPlan, plan_runs
from .errors import (DatasetChangedError, GpuPathError, IndexMismatchError, MissingDependencyError, OptionError,
                     PackerError)
from .order import DEFAULT_BLOCK_BYTES, DEFAULT_WINDOW, CursorReader, EpochCursor, RankPlan, ReadOrder, index_blocks

# gds_status, cuda_driver_status and set_kvikio_threads live with the kvikio backend; they are
# part of this module's public surface because GPU users look for them here.
__all__ = ["DEFAULT_READ_BLOCK", "CPU_FALLBACKS", "GpuLoaderOptions", "GpuJpegDecoder", "TorchvisionJpegDecoder",
           "TorchCodecJpegDecoder", "NvImageCodecJpegDecoder", "GPU_JPEG_DECODERS", "gpu_jpeg_decoder",
           "GpuFallbackWarning", "gds_status", "cuda_driver_status", "set_kvikio_threads", "resolve_device",
           "GpuRawBatches", "GpuJpegBatches", "RAW_BATCH_OUTPUTS"]

#: Largest single host ``pread`` the loaders issue; longer runs are split and read in parallel.
DEFAULT_READ_BLOCK = 8 << 20
#: Device staging buffers start page-aligned: what cuFile needs to DMA without a bounce buffer.
_DEVICE_ALIGNMENT = PAGE
#: What ``GpuJpegBatches`` does with a JPEG the GPU decoder refused.
CPU_FALLBACKS = ("warn", "error", "silent")


def _import_torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise MissingDependencyError(f"GPU batches need PyTorch, which is not installed ({exc}); install it "
                                     f"with pip install 'packer-shards[torch]' (and {GPU_EXTRA} for kvikio)") from None
    return torch


def resolve_device(device: Any) -> Any:
    """``device`` as a ``torch.device`` with an explicit index: ``"cuda"`` is the calling thread's current device.

    Resolve once, on the thread that chose the device (``torch.cuda.set_device(local_rank)``):
    other threads start on device 0 and would resolve ``"cuda"`` to it.

    Raises:
        OptionError: not a CUDA device or ``"cpu"``, or an index past the visible GPUs.
        MissingDependencyError: torch is missing, or a CUDA device without a usable GPU.
    """
    torch = _import_torch()
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise OptionError(f"device must be 'cuda', 'cuda:N' or 'cpu', got {device!r} ({exc})") from None
    if resolved.type not in ("cuda", "cpu"):
        raise OptionError(f"device must be a CUDA device or 'cpu', got {device!r}")
    if resolved.type == "cpu":
        return resolved
    if not torch.cuda.is_available():
        raise MissingDependencyError(
            f"device={device!r} but PyTorch sees no CUDA GPU (torch {torch.__version__}, CUDA "
            f"{torch.version.cuda}); use device='cpu', or install a CUDA build of torch")
    index = resolved.index if resolved.index is not None else int(torch.cuda.current_device())
    count = int(torch.cuda.device_count())
    if not 0 <= index < count:
        raise OptionError(f"device={device!r}: this process sees {count} GPU(s) (cuda:0..cuda:{count - 1}); "
                          f"check CUDA_VISIBLE_DEVICES and the local rank")
    return torch.device("cuda", index)


# --- settings ----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class GpuLoaderOptions:
    """The settings both GPU loaders share (pass them as keyword arguments, or as ``options=``).

    Attributes:
        order: ``"block"``, ``"random"`` or ``"sequential"`` (``packer.order``).
        seed: the run's seed; orders are functions of (seed, epoch).
        rank, world_size: this rank's share; default from ``torch.distributed``, else (0, 1).
        drop_last: full batches only (``packer.order``'s drop rule) instead of a short last batch.
        device: ``"cuda"`` (the current device when the loader is created), ``"cuda:N"`` or ``"cpu"``.
        io: ``"kvikio"`` (reads into GPU memory), ``"host"`` (pinned memory + copy) or ``"auto"``
            (kvikio when importable). JPEG batches always read to the host.
        double_buffer: prepare the next batch on a background thread while the caller computes.
        block_bytes, window: the block shuffle's block span and window (``packer.order``).
        read_block: largest single host read; longer runs are split and read in parallel.
        io_threads: parallel reads (host reads, and at least this many kvikio threads).
        backend: backend for host reads (``"pread"``, ``"mmap"``, ``"direct"``).
    """

    order: str = "block"
    seed: int = 0
    rank: int | None = None
    world_size: int | None = None
    drop_last: bool = False
    device: str = "cuda"
    io: str = "auto"
    double_buffer: bool = True
    block_bytes: int = DEFAULT_BLOCK_BYTES
    window: int = DEFAULT_WINDOW
    read_block: int = DEFAULT_READ_BLOCK
    io_threads: int = 8
    backend: str = "pread"

    def __post_init__(self) -> None:
        if self.io not in ("auto", "kvikio", "host"):
            raise OptionError(f"io must be 'auto', 'kvikio' or 'host', got {self.io!r}")
        for name in ("read_block", "io_threads", "block_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise OptionError(f"{name} must be a positive integer, got {value!r}")

    @classmethod
    def merge(cls, options: "GpuLoaderOptions | None", settings: dict[str, Any],
              base: "GpuLoaderOptions | None" = None) -> "GpuLoaderOptions":
        """``options`` (else ``base``, else the defaults) with the keyword ``settings`` applied.

        Raises:
            OptionError: a setting that is not a field of ``GpuLoaderOptions``.
        """
        fields = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(settings) - fields)
        if unknown:
            raise OptionError(f"unknown GPU loader setting(s) {', '.join(unknown)}; the settings are "
                              f"{', '.join(sorted(fields))}")
        start = options if options is not None else (base if base is not None else cls())
        if not isinstance(start, cls):
            raise OptionError(f"options must be a GpuLoaderOptions, got {type(start).__name__}")
        return dataclasses.replace(start, **settings) if settings else start


# --- the shared loader -------------------------------------------------------------------------

class _GpuBatches(CursorReader):
    """Order, rank share, resumable position, device and the read path shared by the two loaders."""

    def __init__(self, source: Any, batch_size: int, options: GpuLoaderOptions) -> None:
        from .dataset import Dataset, open_dataset

        torch = _import_torch()
        from .torch import resolve_rank  # torch is importable here: the line above checked

        self._torch = torch
        self.options = options
        # Resolved here, on the caller's thread: the read-ahead thread starts on device 0.
        self.device = resolve_device(options.device)
        io = options.io
        if self.device.type == "cpu":
            if io == "kvikio":
                raise OptionError("io='kvikio' reads into GPU memory; it needs a CUDA device")
            io = "host"
        elif io == "auto":
            try:
                import_kvikio()
                io = "kvikio"
            except MissingDependencyError:
                io = "host"
        if io == "kvikio":
            # kvikio's pool defaults to one thread: one task in flight is far below NVMe/GDS bandwidth.
            current = kvikio_get(import_kvikio(), "num_threads")
            if not isinstance(current, int) or current < options.io_threads:
                set_kvikio_threads(options.io_threads)
        self.io = io
        self.dataset: Dataset = source if isinstance(source, Dataset) else open_dataset(source, backend=options.backend)
        self._owns_dataset = not isinstance(source, Dataset)
        # A private reader for the loader's thread (LRU of open shards is not thread-safe), pinned
        # to the same index version as the caller's dataset.
        # (a dataset URL is reopened by its URL and options: its folder in the node cache holds no shards)
        remote = getattr(self.dataset, "_remote", None)
        self._reader = Dataset(self.dataset.location, backend="kvikio" if io == "kvikio" else options.backend,
                               remote=None if remote is None else remote.options)
        if self._reader.manifest.index.checksum != self.dataset.manifest.index.checksum:
            self._reader.close()
            raise DatasetChangedError("the dataset was replaced since it was opened", path=self.dataset.path)
        self.alignment = self.dataset.alignment
        ix = self.dataset.index
        blocks = (index_blocks(ix.offset, ix.size, ix.shard, options.block_bytes)
                  if options.order == "block" else None)
        read_order = ReadOrder(kind=options.order, seed=options.seed, block_bytes=options.block_bytes,
                               window=options.window, batch_size=batch_size, drop_last=options.drop_last)
        rank, world_size = resolve_rank(options.rank, options.world_size)
        self.cursor = EpochCursor(read_order, len(self.dataset), rank=rank, world_size=world_size, blocks=blocks)
        self.double_buffer = bool(options.double_buffer)
        self.read_block = max(options.read_block, self.alignment)
        self.io_threads = options.io_threads
        self._pool: ThreadPoolExecutor | None = None
        self._ahead: ReadAhead | None = None
        self._host_staging: Any = None
        self._device_staging: Any = None

    # --- order and position: packer.order.CursorReader over self.cursor ---
    def __len__(self) -> int:
        return self.share().num_batches

    # --- device placement ---
    def _device_context(self) -> contextlib.AbstractContextManager[Any]:
        """Make this loader's device the current one of the calling thread (nothing for ``cpu``)."""
        if self.device.type != "cuda":
            return contextlib.nullcontext()
        return self._torch.cuda.device(self.device)

    def _thread_context(self) -> contextlib.AbstractContextManager[Any]:
        """Entered on the read-ahead thread: the loader's device first, then a stream on that device."""
        stack = contextlib.ExitStack()
        if self.device.type == "cuda":
            torch = self._torch
            stack.enter_context(torch.cuda.device(self.device))
            stack.enter_context(torch.cuda.stream(torch.cuda.Stream(device=self.device)))
        return stack

    # --- reading ---
    def _host_buffer(self, nbytes: int) -> Any:
        """A reusable host staging buffer (pinned when the batches go to a GPU): (tensor, numpy view)."""
        torch = self._torch
        if self._host_staging is None or self._host_staging[0].numel() < nbytes:
            capacity = max(nbytes, 1)
            self._host_staging = None
            pinned = self.device.type == "cuda"
            tensor = torch.empty(capacity + _DEVICE_ALIGNMENT, dtype=torch.uint8, pin_memory=pinned)
            pad = (-tensor.data_ptr()) % _DEVICE_ALIGNMENT  # aligned for O_DIRECT backends, too
            tensor = tensor[pad:pad + capacity]
            self._host_staging = (tensor, tensor.numpy())
        return self._host_staging

    def _device_buffer(self, nbytes: int) -> Any:
        torch = self._torch
        if self._device_staging is None or self._device_staging.numel() < nbytes:
            capacity = max(nbytes, 1)
            self._device_staging = None
            tensor = torch.empty(capacity + _DEVICE_ALIGNMENT, dtype=torch.uint8, device=self.device)
            pad = (-tensor.data_ptr()) % _DEVICE_ALIGNMENT
            self._device_staging = tensor[pad:pad + capacity]
        return self._device_staging

    def _read_host(self, plan: RunPlan, out: np.ndarray) -> None:
        """Fill ``out`` with the plan's blocks: large preads, in parallel when there are several."""
        reads = plan.reads(self.read_block, self.alignment)
        numbers = set(plan.run_shard.tolist())
        # Parallel reads need every shard open at once: not when the batch spans more than the LRU.
        if len(reads) == 1 or self.io_threads == 1 or len(numbers) > self._reader.max_open_shards:
            for shard, offset, pos, nbytes in reads:
                self._reader.shard(shard).read_into(offset, out[pos:pos + nbytes])
            return
        shards = {shard: self._reader.shard(shard) for shard in numbers}
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.io_threads, thread_name_prefix="packer-gpu-io")
        futures = [self._pool.submit(shards[shard].read_into, offset, out[pos:pos + nbytes])
                   for shard, offset, pos, nbytes in reads]
        # Every read finishes before the first error is raised: none may write into `out` later.
        wait_futures(futures)
        for future in futures:
            future.result()

    def _read_device(self, plan: RunPlan) -> Any:
        """The plan's blocks in device memory: kvikio straight in, or host pinned + copy."""
        if self.io == "kvikio":
            buffer = self._device_buffer(plan.nbytes)
            # All runs in flight at once, unless the batch spans more shards than the LRU keeps open
            # (opening one more would close a file with a read still in flight).
            overlap = len(set(plan.run_shard.tolist())) <= self._reader.max_open_shards
            pending: list[Callable[[], None]] = []
            try:
                for shard, offset, pos, nbytes in zip(plan.run_shard.tolist(), plan.run_offset.tolist(),
                                                      plan.run_pos[:-1].tolist(), plan.run_bytes.tolist()):
                    pending.append(self._reader.shard(shard).start_read(offset, buffer[pos:pos + nbytes]))
                    if not overlap:
                        pending.pop()()
                while pending:
                    pending.pop(0)()
            finally:
                # A failure left reads in flight: kvikio's futures do not wait when dropped, and
                # its threads would write into the staging buffer (or a closed file) after the
                # error reached the caller, who may free both. Wait for every one of them.
                _wait_quietly(pending)
            return buffer[:plan.nbytes]
        tensor, array = self._host_buffer(plan.nbytes)
        self._read_host(plan, array)
        if self.device.type == "cpu":
            return tensor[:plan.nbytes]
        return tensor[:plan.nbytes].to(self.device, non_blocking=True)

    def _labels(self, plan: RunPlan) -> Any:
        labels = self._torch.from_numpy(np.ascontiguousarray(self.dataset.index.label[plan.indices]))
        return labels if self.device.type == "cpu" else labels.to(self.device, non_blocking=True)

    def batch_indices(self, plan: RankPlan, k: int, epoch: int | None = None) -> np.ndarray:
        """The sample indices of batch ``k`` of ``plan``, in the order the loader yields them.

        With the ``"block"`` order, ``packer.order`` sorts each global step (so a rank reads long
        runs); the loader then shuffles the batch itself, seeded by (seed, epoch, rank, k): the
        runs are still read whole, and the gather that lays out the batch applies the shuffle
        for free. Other orders are yielded as planned.
        """
        indices = plan.batch(k)
        if self.read_order.kind != "block" or len(indices) < 2:
            return indices
        epoch = self.cursor.epoch if epoch is None else epoch
        rng = np.random.Generator(np.random.PCG64([self.read_order.seed, epoch, self.rank, k]))
        return indices[rng.permutation(len(indices))]

    def _produce(self, indices: np.ndarray) -> Any:
        raise NotImplementedError

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            self._torch.cuda.current_stream(self.device).synchronize()

    def _hand_out(self, item: Any) -> Any:
        if self.device.type == "cuda":
            stream = self._torch.cuda.current_stream(self.device)
            for tensor in _tensors(item):
                if tensor.is_cuda:
                    tensor.record_stream(stream)  # allocated on the read-ahead stream
        return item

    def __iter__(self) -> Iterator[Any]:
        plan = self.cursor.begin()
        epoch = self.cursor.epoch
        count = plan.num_batches

        def produce(k: int) -> Any:
            item = self._produce(self.batch_indices(plan, k, epoch))
            self._synchronize()
            return item

        if self.double_buffer:
            if self._ahead is not None:  # a previous iteration still running: only one reads the staging buffers
                self._ahead.close()
            ahead = self._ahead = ReadAhead(produce, count, depth=1, setup=self._thread_context)
            try:
                for item in ahead:
                    item = self._hand_out(item)
                    self.cursor.handed_out += 1  # counted when handed out: state_dict() in the loop body is exact
                    yield item
            finally:
                ahead.close()
                if self._ahead is ahead:
                    self._ahead = None
        else:
            for k in range(count):
                with self._device_context():
                    item = produce(k)
                self.cursor.handed_out += 1
                yield item

    def close(self) -> None:
        """Stop the read-ahead thread (waiting for its reads), then release buffers and files."""
        if self._ahead is not None:
            self._ahead.close()
            self._ahead = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._host_staging = self._device_staging = None
        self._reader.close()
        if self._owns_dataset:
            self.dataset.close()

    def __enter__(self) -> "_GpuBatches":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _wait_quietly(waits: list[Callable[[], None]]) -> None:
    """Wait for every started read, ignoring their errors (the first error is already on its way)."""
    while waits:
        try:
            waits.pop(0)()
        except Exception:  # noqa: BLE001 - only the wait matters here; the caller re-raises the first error
            pass


def _tensors(item: Any) -> Iterator[Any]:
    if isinstance(item, dict):
        item = list(item.values())
    if isinstance(item, (tuple, list)):
        for part in item:
            yield from _tensors(part)
    elif hasattr(item, "record_stream"):
        yield item


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


class GpuRawBatches(_GpuBatches):
    """``(images, labels)`` batches of a ``raw``-codec dataset: ``(B, H, W, C)`` uint8 and ``(B,)`` int64 on ``device``.

    Args:
        source: a dataset folder or an open ``Dataset`` (its codec must be ``raw``).
        batch_size: samples per batch per rank.
        options: a ``GpuLoaderOptions`` (default: its defaults, ``order="block"``).
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
        **settings: any ``GpuLoaderOptions`` field (``order``, ``seed``, ``rank``, ``world_size``,
            ``drop_last``, ``device``, ``io``, ``double_buffer``, ``block_bytes``, ``window``,
            ``read_block``, ``io_threads``, ``backend``), overriding ``options``.

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
        from .codecs import raw_sample_shape, raw_sample_stride
        from .transforms import DecodeTransform

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
            self.shape = raw_sample_shape(self.dataset.manifest.codec, path=self.dataset.path)
            self.stride = raw_sample_stride(self.shape, self.alignment)
            ix = self.dataset.index
            sample_bytes = self.shape[0] * self.shape[1] * self.shape[2]
            bad = np.flatnonzero((ix.size != sample_bytes) | (ix.image_format != fmt.ImageFormat.RAW))
            if len(bad):
                i = int(bad[0])
                raise IndexMismatchError(
                    f"is {int(ix.size[i])} bytes of image_format {int(ix.image_format[i])}, but the raw codec "
                    f"says every sample is {sample_bytes} bytes ({'x'.join(map(str, self.shape))}) of "
                    f"format {fmt.ImageFormat.RAW}", path=self.dataset.path, sample=i)
        except PackerError:
            self.close()
            raise

    def _produce(self, indices: np.ndarray) -> Any:
        torch = self._torch
        batch = plan_runs(self.dataset.index, indices, round_to=self.alignment)
        block = self._read_device(batch)
        height, width, channels = self.shape
        # Runs are whole multiples of the stride, so distinct sample u sits at u * stride: a view of
        # (samples, sample bytes) rows skips the padding, and one row gather puts them in batch order.
        rows = torch.as_strided(block, (len(batch.unique), height * width * channels), (self.stride, 1))
        where = torch.from_numpy(batch.where)
        if self.device.type == "cuda":
            where = where.to(self.device, non_blocking=True)
        images = rows.index_select(0, where).view(len(batch.indices), height, width, channels)
        if self.decode is not None:  # the CPU readers' crops, on the device (torch's kernel)
            images = self.decode.batch(images, batch.indices, kernel="torch")
        if self.fields:
            return self._with_fields(images, batch)
        return images, self._labels(batch)

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


# --- JPEG on the GPU ---------------------------------------------------------------------------

class GpuJpegDecoder(Protocol):
    """A GPU JPEG decoder ``GpuJpegBatches`` can use (``gpu_decoder=``).

    Called on the read-ahead thread, with the loader's device current, with a list of 1-D uint8
    CPU tensors (views of pinned memory: copy what you keep) and the target ``torch.device``.
    Returns one entry per input: a ``(3, H, W)`` uint8 RGB tensor on ``device``, or the
    exception that made the decoder refuse that input (it then goes to ``cpu_fallback``).
    """

    name: str

    def __call__(self, inputs: Sequence[Any], device: Any) -> list[Any]: ...


class TorchvisionJpegDecoder:
    """nvJPEG through ``torchvision.io.decode_jpeg(list, mode=RGB, device=...)``: one batched call.

    When the batched call fails (one bad file fails the batch) each input is decoded alone, so
    only the inputs nvJPEG really refuses (CMYK, progressive corner cases, a torchvision built
    without nvJPEG) are reported as refused.

    Raises:
        MissingDependencyError: torchvision cannot be imported.
    """

    name = "torchvision.io.decode_jpeg (nvJPEG)"

    def __init__(self) -> None:
        try:
            from torchvision.io import ImageReadMode, decode_jpeg
        except ImportError as exc:
            raise MissingDependencyError(
                f"GPU JPEG decoding needs torchvision (nvJPEG), which cannot be imported ({exc}); install "
                f"torchvision, or decode on the GPU with DALI (packer.dali, pip install 'packer-shards[dali]')"
            ) from None
        self._decode_jpeg = decode_jpeg
        self._rgb = ImageReadMode.RGB

    def __call__(self, inputs: Sequence[Any], device: Any) -> list[Any]:
        try:
            return list(self._decode_jpeg(list(inputs), mode=self._rgb, device=device))
        except (RuntimeError, TypeError, ValueError):
            pass
        decoded: list[Any] = []
        for data in inputs:
            try:
                decoded.append(self._decode_jpeg(data, mode=self._rgb, device=device))
            except (RuntimeError, TypeError, ValueError) as exc:
                decoded.append(exc)
        return decoded


class TorchCodecJpegDecoder:
    """nvJPEG through TorchCodec (``torchcodec.decoders.decode_jpeg(..., device=...)``, TorchCodec
    >= 0.16), which replaces torchvision's deprecated CUDA ``decode_jpeg``: one batched call of
    the list when TorchCodec takes a list, else one call per image; an image it refuses is
    reported as refused (``cpu_fallback``).

    Raises:
        MissingDependencyError: TorchCodec (or its image decoders) cannot be imported.
    """

    name = "torchcodec.decoders.decode_jpeg (nvJPEG)"

    def __init__(self) -> None:
        try:
            from torchcodec.decoders import decode_jpeg
        except ImportError as exc:
            raise MissingDependencyError(
                f"TorchCodec's image decoders cannot be imported ({exc}); pip install 'torchcodec>=0.16'") from None
        self._decode_jpeg = decode_jpeg

    def _one(self, data: Any, device: Any) -> Any:
        try:
            return self._decode_jpeg(data, mode="RGB", device=device)
        except TypeError:  # a version without mode=: RGB is its default for colour JPEGs
            return self._decode_jpeg(data, device=device)

    def __call__(self, inputs: Sequence[Any], device: Any) -> list[Any]:
        try:
            decoded = self._one(list(inputs), device)
            if isinstance(decoded, (list, tuple)) and len(decoded) == len(inputs):
                return list(decoded)
        except (RuntimeError, TypeError, ValueError):
            pass
        results: list[Any] = []
        for data in inputs:
            try:
                results.append(self._one(data, device))
            except (RuntimeError, TypeError, ValueError) as exc:
                results.append(exc)
        return results


class NvImageCodecJpegDecoder:
    """nvJPEG through NVIDIA nvImageCodec (``nvidia.nvimgcodec.Decoder().decode(list)``): one batched
    call; its images (HWC, on the GPU, ``__cuda_array_interface__``) become ``(3, H, W)`` views with
    ``torch.as_tensor``. An input it could not decode (``None`` in its result) is reported as refused.

    Raises:
        MissingDependencyError: nvImageCodec cannot be imported (pip install nvidia-nvimgcodec-cu13).
    """

    name = "nvidia.nvimgcodec.Decoder (nvJPEG)"

    def __init__(self, device_id: int | None = None) -> None:
        import importlib

        try:
            nvimgcodec = importlib.import_module("nvidia.nvimgcodec")
        except ImportError as exc:
            raise MissingDependencyError(
                f"nvImageCodec cannot be imported ({exc}); pip install 'nvidia-nvimgcodec-cu13[nvjpeg]'") from None
        self._nvimgcodec = nvimgcodec
        self._decoders: dict[int, Any] = {}
        self._device_id = device_id

    def _decoder(self, device: Any) -> Any:
        index = self._device_id if self._device_id is not None else (getattr(device, "index", None) or 0)
        decoder = self._decoders.get(index)
        if decoder is None:
            decoder = self._decoders[index] = self._nvimgcodec.Decoder(device_id=index)
        return decoder

    def __call__(self, inputs: Sequence[Any], device: Any) -> list[Any]:
        import torch

        encoded = [data.numpy() if hasattr(data, "numpy") else data for data in inputs]
        try:
            images = list(self._decoder(device).decode(encoded))
        except (RuntimeError, TypeError, ValueError) as exc:
            return [exc] * len(inputs)
        results: list[Any] = []
        for image in images:
            if image is None:
                results.append(RuntimeError("nvImageCodec could not decode this JPEG"))
                continue
            pixels = torch.as_tensor(image, device=device)
            if pixels.dim() == 2:  # one channel: repeat it, as mode=RGB decoders do
                pixels = pixels.unsqueeze(2).expand(-1, -1, 3)
            results.append(pixels.permute(2, 0, 1))
        if len(results) != len(inputs):
            return [RuntimeError(f"nvImageCodec returned {len(results)} images for {len(inputs)} inputs")] * len(inputs)
        return results


#: The GPU JPEG decoders ``gpu_jpeg_decoder`` knows, in the order ``"auto"`` tries them: TorchCodec
#: (the maintained successor), nvImageCodec, then torchvision's deprecated CUDA ``decode_jpeg``.
GPU_JPEG_DECODERS: dict[str, Callable[[], GpuJpegDecoder]] = {
    "torchcodec": TorchCodecJpegDecoder,
    "nvimagecodec": NvImageCodecJpegDecoder,
    "torchvision": TorchvisionJpegDecoder,
}


def gpu_jpeg_decoder(name: str = "auto") -> GpuJpegDecoder:
    """The GPU JPEG decoder called ``name`` (``GPU_JPEG_DECODERS``), or with ``"auto"`` the first of
    them that imports here.

    Raises:
        OptionError: an unknown name.
        MissingDependencyError: that decoder (with ``"auto"``: every one) cannot be imported; the
            message names what to install.
    """
    if name != "auto" and name not in GPU_JPEG_DECODERS:
        raise OptionError(f"gpu_decoder must be 'auto', one of {', '.join(GPU_JPEG_DECODERS)}, or a GpuJpegDecoder; "
                          f"got {name!r}")
    if name != "auto":
        return GPU_JPEG_DECODERS[name]()
    reasons = []
    for make in GPU_JPEG_DECODERS.values():
        try:
            return make()
        except MissingDependencyError as exc:
            reasons.append(str(exc))
    raise MissingDependencyError("GPU JPEG decoding needs one of TorchCodec (pip install 'torchcodec>=0.16'), "
                                 "nvImageCodec (pip install 'nvidia-nvimgcodec-cu13[nvjpeg]') or torchvision; none "
                                 "imports here (" + "; ".join(reasons) + "); or decode on the GPU with DALI "
                                 "(packer.dali, pip install 'packer-shards[dali]')")


class GpuFallbackWarning(RuntimeWarning):
    """The GPU decoder refused images and ``GpuJpegBatches`` decoded them on the CPU instead."""


class GpuJpegBatches(_GpuBatches):
    """``(images, labels)`` batches of an encoded dataset, JPEGs decoded on the GPU (nvJPEG by default).

    ``images`` is a list of ``(3, H, W)`` uint8 tensors on ``device`` (RGB; sizes differ), or
    whatever ``transform(list)`` returns (it runs on the read-ahead thread and stream, e.g. a
    resize and ``torch.stack``); ``labels`` is ``(B,)`` int64 on ``device``. JPEG payloads are
    decoded in one call of the GPU decoder per batch; other formats are decoded on the CPU by
    ``packer.decode`` by design. With ``device="cpu"`` and no ``gpu_decoder`` everything is
    decoded by ``packer.decode`` (simplejpeg).

    Args:
        source, batch_size, options, **settings: as for ``GpuRawBatches`` (``order`` defaults to
            ``"random"``; reads always go to pinned host memory: compressed bytes are decoded
            from there, so ``io`` must be ``"auto"`` or ``"host"``).
        transform: applied to each batch's image list on the read-ahead thread.
        cpu_fallback: what to do with a JPEG the GPU decoder refuses (a torchvision without
            nvJPEG refuses all of them): ``"warn"`` (default: decode it on the CPU and warn once
            per loader with the decoder's reason), ``"silent"`` (decode it on the CPU), or
            ``"error"`` (raise ``GpuPathError``). Counted in ``decode_counts`` either way.
        gpu_decoder: a ``GpuJpegDecoder``, or a name for ``gpu_jpeg_decoder`` (``"torchcodec"``,
            ``"nvimagecodec"``, ``"torchvision"``, ``"auto"``). Default: ``"auto"`` on CUDA devices
            (TorchCodec, else nvImageCodec, else torchvision's nvJPEG), none on ``cpu``.

    Properties:
        decode_counts: images decoded since the loader was created, by path: ``"gpu"`` (the GPU
            decoder), ``"cpu_fallback"`` (JPEGs it refused), ``"cpu"`` (non-JPEG formats, or no
            GPU decoder). ``decode_counts["cpu_fallback"] > 0`` means nvJPEG did not do all the work.

    Raises:
        OptionError: a bad setting, ``io="kvikio"``, or an unknown ``cpu_fallback``.
        MissingDependencyError: ``device="cuda"`` without any GPU JPEG decoder (or without the one
            named; use ``packer.dali``).
        GpuPathError: while iterating, a JPEG the GPU decoder refused with ``cpu_fallback="error"``.
    """

    def __init__(self, source: Any, batch_size: int, options: GpuLoaderOptions | None = None, *,
                 transform: Callable[[list[Any]], Any] | None = None, cpu_fallback: str = "warn",
                 gpu_decoder: GpuJpegDecoder | str | None = None, **settings: Any) -> None:
        if cpu_fallback not in CPU_FALLBACKS:
            raise OptionError(f"cpu_fallback must be one of {', '.join(CPU_FALLBACKS)}, got {cpu_fallback!r}")
        merged = GpuLoaderOptions.merge(options, settings, base=GpuLoaderOptions(order="random"))
        if merged.io == "kvikio":
            raise OptionError("GpuJpegBatches decodes from pinned host memory: io must be 'auto' or 'host', "
                              "not 'kvikio'")
        super().__init__(source, batch_size, dataclasses.replace(merged, io="host"))
        self.transform = transform
        self.cpu_fallback = cpu_fallback
        self._decode_counts = {"gpu": 0, "cpu_fallback": 0, "cpu": 0}
        self._counts_lock = threading.Lock()
        self._warned = False
        self.gpu_decoder: GpuJpegDecoder | None = None if isinstance(gpu_decoder, str) else gpu_decoder
        if isinstance(gpu_decoder, str) or (gpu_decoder is None and self.device.type == "cuda"):
            try:
                self.gpu_decoder = gpu_jpeg_decoder(gpu_decoder or "auto")
            except (MissingDependencyError, OptionError):
                self.close()
                raise

    @property
    def decode_counts(self) -> dict[str, int]:
        """Images decoded since the loader was created, by path (a copy; see the class docstring)."""
        with self._counts_lock:
            return dict(self._decode_counts)

    def _count(self, path: str, n: int) -> None:
        if n:
            with self._counts_lock:
                self._decode_counts[path] += n

    def _cpu_decode(self, data: Any, image_format: int, i: int) -> Any:
        from .decode import decode_image

        pixels = decode_image(data, image_format, name=self.dataset.key(i))
        image = self._torch.from_numpy(pixels).permute(2, 0, 1).contiguous()
        return image if self.device.type == "cpu" else image.to(self.device, non_blocking=True)

    def _refused(self, sample: int, reason: BaseException, refused: int) -> None:
        """Apply ``cpu_fallback`` to the GPU decoder's refusals (``refused`` of them in this batch)."""
        name = getattr(self.gpu_decoder, "name", type(self.gpu_decoder).__name__)
        if self.cpu_fallback == "error":
            raise GpuPathError(f"the GPU JPEG decoder ({name}) refused this JPEG ({reason}); "
                               f"cpu_fallback='error' (pass cpu_fallback='warn' to decode refused JPEGs "
                               f"on the CPU)", path=self.dataset.path, sample=sample)
        if self.cpu_fallback == "warn" and not self._warned:
            self._warned = True
            warnings.warn(f"{self.dataset.path}: the GPU JPEG decoder ({name}) refused {refused} of this "
                          f"batch's JPEGs (first: sample {sample}: {reason}); they are decoded on the CPU, "
                          f"which is much slower. decode_counts counts them; this warning is shown once "
                          f"per loader (cpu_fallback='silent' hides it, 'error' raises)",
                          GpuFallbackWarning, stacklevel=2)

    def _produce(self, indices: np.ndarray) -> Any:
        batch = plan_runs(self.dataset.index, indices, round_to=self.alignment)
        tensor, array = self._host_buffer(batch.nbytes)
        self._read_host(batch, array)
        formats = self.dataset.index.image_format
        unique = batch.unique.tolist()
        images: list[Any] = [None] * len(unique)
        starts, sizes = batch.sample_pos.tolist(), batch.sizes.tolist()
        gpu = [u for u, i in enumerate(unique)
               if self.gpu_decoder is not None and int(formats[i]) == fmt.ImageFormat.JPEG]
        if gpu:
            decoded = self.gpu_decoder([tensor[starts[u]:starts[u] + sizes[u]] for u in gpu], self.device)
            if len(decoded) != len(gpu):
                raise GpuPathError(f"the GPU JPEG decoder returned {len(decoded)} images for {len(gpu)} inputs",
                                   path=self.dataset.path)
            refusals = [(u, image) for u, image in zip(gpu, decoded) if isinstance(image, BaseException)]
            if refusals:
                self._refused(unique[refusals[0][0]], refusals[0][1], len(refusals))
            for u, image in zip(gpu, decoded):
                if not isinstance(image, BaseException):
                    images[u] = image
            self._count("gpu", len(gpu) - len(refusals))
            self._count("cpu_fallback", len(refusals))
        self._count("cpu", len(unique) - len(gpu))
        for u, i in enumerate(unique):
            if images[u] is None:
                images[u] = self._cpu_decode(array[starts[u]:starts[u] + sizes[u]], int(formats[i]), i)
        ordered = [images[u] for u in batch.where.tolist()]
        result = self.transform(ordered) if self.transform is not None else ordered
        return result, self._labels(batch)
