"""What both GPU batch loaders share: the settings (``GpuLoaderOptions``), the device rule, and
``GpuBatchReader``, the reader that plans a batch's runs from the epoch's order, reads them (kvikio
into device memory, or host ``pread`` into pinned memory) and hands batches over from a
read-ahead thread on its own CUDA stream. ``packer.gpu.raw`` and ``packer.gpu.jpeg`` say what a
batch is made of; the package's ``__init__`` says which to use.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import Any, Callable, Iterator

import numpy as np

from ..backends.buffers import PAGE
from ..backends.kvikio import GPU_EXTRA, import_kvikio, kvikio_get, set_kvikio_threads
from ..backends.readahead import ReadAhead
from ..backends.runs import RunPlan, plan_runs
from ..errors import DatasetChangedError, MissingDependencyError, OptionError
from ..order import CursorReader, EpochCursor, IndexSpace, RankPlan, ReadOrder, read_order_from

#: Largest single host ``pread`` the loaders issue; longer runs are split and read in parallel.
DEFAULT_READ_BLOCK = 8 << 20
#: Device staging buffers start page-aligned: what cuFile needs to DMA without a bounce buffer.
_DEVICE_ALIGNMENT = PAGE
#: What ``GpuJpegBatches`` does with a JPEG the GPU decoder refused.
CPU_FALLBACKS = ("warn", "error", "silent")
#: The order settings ``GpuLoaderOptions`` held before ``order=`` was a ``packer.ReadOrder``.
_ORDER_SETTINGS = {name: name for name in ("seed", "rank", "world_size", "drop_last", "block_bytes", "window")}


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

@dataclasses.dataclass(frozen=True, init=False)
class GpuLoaderOptions:
    """The settings both GPU loaders share (pass them as keyword arguments, or as ``options=``).

    Attributes:
        order: a ``packer.ReadOrder`` (or a kind string for one): kind, seed, ``drop_last`` (full
            batches only instead of a short last batch), rank and world size (default from
            ``torch.distributed``, else 0 of 1), block settings; its ``batch_size`` None or the
            loader's. None: the loader's default (``ReadOrder("block")`` for raw batches,
            ``ReadOrder("random")`` for JPEG batches).
        device: ``"cuda"`` (the current device when the loader is created), ``"cuda:N"`` or ``"cpu"``.
        io: ``"kvikio"`` (reads into GPU memory), ``"host"`` (pinned memory + copy) or ``"auto"``
            (kvikio when importable). JPEG batches always read to the host.
        double_buffer: prepare the next batch on a background thread while the caller computes.
        read_block: largest single host read; longer runs are split and read in parallel.
        io_threads: parallel reads (host reads, and at least this many kvikio threads).
        backend: backend for host reads (``"pread"``, ``"mmap"``, ``"direct"``).

    The order settings of earlier releases (``seed=``, ``rank=``, ``world_size=``, ``drop_last=``,
    ``block_bytes=``, ``window=``) are still accepted for one release, with a ``DeprecationWarning``.
    """

    order: ReadOrder | None = None
    device: str = "cuda"
    io: str = "auto"
    double_buffer: bool = True
    read_block: int = DEFAULT_READ_BLOCK
    io_threads: int = 8
    backend: str = "pread"

    def __init__(self, order: ReadOrder | str | None = None, *, device: str = "cuda", io: str = "auto",
                 double_buffer: bool = True, read_block: int = DEFAULT_READ_BLOCK, io_threads: int = 8,
                 backend: str = "pread", **deprecated: Any) -> None:
        if order is not None or deprecated:
            order = read_order_from(order, deprecated, reader="GpuLoaderOptions", default=ReadOrder("block"),
                                    keywords=_ORDER_SETTINGS)
        for name, value in (("order", order), ("device", device), ("io", io), ("double_buffer", double_buffer),
                            ("read_block", read_block), ("io_threads", io_threads), ("backend", backend)):
            object.__setattr__(self, name, value)
        if self.io not in ("auto", "kvikio", "host"):
            raise OptionError(f"io must be 'auto', 'kvikio' or 'host', got {self.io!r}")
        for name in ("read_block", "io_threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise OptionError(f"{name} must be a positive integer, got {value!r}")

    @classmethod
    def merge(cls, options: "GpuLoaderOptions | None", settings: dict[str, Any],
              base: "GpuLoaderOptions | None" = None) -> "GpuLoaderOptions":
        """``options`` (else ``base``, else the defaults) with the keyword ``settings`` applied
        (an old order setting applies to the order of ``options``).

        Raises:
            OptionError: a setting that is not a field of ``GpuLoaderOptions``.
        """
        fields = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(settings) - fields - set(_ORDER_SETTINGS))
        if unknown:
            raise OptionError(f"unknown GPU loader setting(s) {', '.join(unknown)}; the settings are "
                              f"{', '.join(sorted(fields))}")
        start = options if options is not None else (base if base is not None else cls())
        if not isinstance(start, cls):
            raise OptionError(f"options must be a GpuLoaderOptions, got {type(start).__name__}")
        changes = {name: value for name, value in settings.items() if name not in _ORDER_SETTINGS}
        old = {name: value for name, value in settings.items() if name in _ORDER_SETTINGS}
        if old:
            changes["order"] = read_order_from(changes.get("order"), old, reader="the GPU loader",
                                               default=start.order or ReadOrder("block"), keywords=_ORDER_SETTINGS)
        return dataclasses.replace(start, **changes) if changes else start


# --- the shared loader -------------------------------------------------------------------------

class GpuBatchReader(CursorReader):
    """Order, rank share, resumable position, device and the read path shared by the two loaders."""

    #: The order when the options have none.
    DEFAULT_ORDER = ReadOrder("block")

    def __init__(self, source: Any, batch_size: int, options: GpuLoaderOptions) -> None:
        from ..dataset import Dataset, open_dataset

        torch = _import_torch()
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
        if callable(getattr(self.dataset, "own_space", None)):  # a packer.Mixture: has no location of its own;
            self._reader = copy.deepcopy(self.dataset)         # its copy reopens each stream's dataset
        else:
            self._reader = Dataset(self.dataset.location, backend="kvikio" if io == "kvikio" else options.backend,
                                   remote=self.dataset.place.options)
        if self._reader.manifest.index.checksum != self.dataset.manifest.index.checksum:
            self._reader.close()
            raise DatasetChangedError("the dataset was replaced since it was opened", path=self.dataset.path)
        self.alignment = self.dataset.alignment
        read_order = (options.order or self.DEFAULT_ORDER).resolved(batch_size=batch_size, reader=type(self).__name__)
        self.cursor = EpochCursor(read_order, IndexSpace(self.dataset))
        self.double_buffer = bool(options.double_buffer)
        self.read_block = max(options.read_block, PAGE)  # whole pages (plan_runs(pages=))
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
        reads = plan.reads(self.read_block, PAGE)
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

    def _plan(self, indices: np.ndarray) -> RunPlan:
        """One batch's reads: whole 4 KiB pages at page offsets (formats/SPEC.md §3.4), so GPUDirect
        Storage and O_DIRECT read straight into the aligned staging buffers, whatever the alignment."""
        return plan_runs(self.dataset.index, indices, pages=self.dataset.shard_sizes)

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

    def __enter__(self) -> "GpuBatchReader":
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
