"""GPU byte movement: the kvikio (GPUDirect Storage) backend and batch loaders that land shards in GPU memory.

Nothing here imports torch, kvikio or CuPy at module import: ``import packer.gpu`` is cheap and
works on a machine without a GPU. Each class imports what it needs when it is created and says
which extra to install when something is missing (``pip install 'packer[gpu]'``).

``KvikioShard`` (``open_dataset(path, backend="kvikio")``)
    The backend protocol over ``kvikio.CuFile``: ``read_into(offset, out)`` reads straight into
    device memory when ``out`` is a CUDA array (anything with ``__cuda_array_interface__``: a
    CuPy array, a torch CUDA tensor), through GPUDirect Storage when the cuFile driver is active
    and through kvikio's POSIX compatibility mode (a pinned bounce buffer) otherwise. kvikio
    splits each read into tasks of ``task_size`` bytes (default 8 MiB) run by its thread pool.
    Host buffers and ``view`` use plain ``pread``. ``gds_status()`` reports which path is live.

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

``GpuJpegBatches``
    Batches of an encoded dataset: coalesced block reads into pinned host memory, then
    ``torchvision.io.decode_jpeg(list, device="cuda")`` (nvJPEG, batched). Non-JPEG samples are
    decoded on the CPU (``packer.decode``) and copied. Yields a list of ``(3, H, W)`` uint8 CUDA
    tensors (sizes differ) and the labels; pass ``transform`` to resize/stack on the GPU.

Both loaders take ``device="cpu"`` to run the same planning, reading, view and read-ahead code
on the host (CPU tensors out): that is how CI tests them, and a usable fallback.

Overlap: with ``double_buffer=True`` a background thread prepares batch ``k+1`` (reads, copy,
gather, on its own CUDA stream, synchronised before hand-off) while the caller computes on batch
``k``. The tensors handed out are fresh allocations, never the staging buffers, and are marked
with ``record_stream`` for the consumer's stream, so the caching allocator cannot recycle them
while the caller's kernels still read them.

Example::

    from packer.gpu import GpuRawBatches
    loader = GpuRawBatches("/data/imagenet-raw224", batch_size=256, order="block", seed=0)
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for images, labels in loader:          # (256, 224, 224, 3) uint8 on cuda:0, (256,) int64
            x = images.permute(0, 3, 1, 2).float().div_(255)
            ...
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator

import numpy as np

from . import format as fmt
from .backends.buffers import PAGE
from .backends.kvikio import (GPU_EXTRA, cuda_driver_status, gds_status, import_kvikio, kvikio_get,
                              set_kvikio_threads)
from .backends.runs import RunPlan, plan_runs
from .errors import DatasetChangedError, IndexMismatchError, MissingDependencyError, PackerError
from .order import DEFAULT_BLOCK_BYTES, DEFAULT_WINDOW, CursorReader, EpochCursor, RankPlan, ReadOrder, index_blocks

# gds_status, cuda_driver_status and set_kvikio_threads live with the kvikio backend; they are
# part of this module's public surface because GPU users look for them here.
__all__ = ["DEFAULT_READ_BLOCK", "gds_status", "cuda_driver_status", "set_kvikio_threads", "GpuRawBatches",
           "GpuJpegBatches"]

#: Largest single host ``pread`` the loaders issue; longer runs are split and read in parallel.
DEFAULT_READ_BLOCK = 8 << 20
#: Device staging buffers start page-aligned: what cuFile needs to DMA without a bounce buffer.
_DEVICE_ALIGNMENT = PAGE


def _import_torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise MissingDependencyError(f"GPU batches need PyTorch, which is not installed ({exc}); install it "
                                     f"with pip install 'packer[torch]' (and {GPU_EXTRA} for kvikio)") from None
    return torch


# --- read-ahead --------------------------------------------------------------------------------

class _ReadAhead:
    """Runs ``produce(k)`` for ``k`` in ``range(count)`` on a background thread, ``depth`` results ahead.

    Errors raised by ``produce`` are re-raised in the consumer, at the batch where they happened.
    ``setup`` returns a context manager entered on the thread (e.g. a CUDA stream).
    """

    def __init__(self, produce: Callable[[int], Any], count: int, depth: int,
                 setup: Callable[[], Any] | None = None) -> None:
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(produce, count, setup), daemon=True,
                                        name="packer-gpu-read-ahead")
        self._thread.start()

    def _put(self, item: tuple[str, Any]) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, produce: Callable[[int], Any], count: int, setup: Callable[[], Any] | None) -> None:
        try:
            context = setup() if setup is not None else None
            if context is not None:
                context.__enter__()
            try:
                for k in range(count):
                    if self._stop.is_set() or not self._put(("item", produce(k))):
                        return
            finally:
                if context is not None:
                    context.__exit__(None, None, None)
            self._put(("done", None))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which re-raises it
            self._put(("error", exc))

    def __iter__(self) -> Iterator[Any]:
        while True:
            kind, value = self._queue.get()
            if kind == "done":
                return
            if kind == "error":
                raise value
            yield value

    def close(self) -> None:
        self._stop.set()
        while self._thread.is_alive():
            try:
                while True:
                    self._queue.get_nowait()
            except queue.Empty:
                pass
            self._thread.join(timeout=0.05)


# --- the loaders -------------------------------------------------------------------------------

class _GpuBatches(CursorReader):
    """Order, rank share, resumable position and the read path shared by the two loaders."""

    def __init__(self, source: Any, batch_size: int, *, order: str, seed: int, rank: int | None,
                 world_size: int | None, drop_last: bool, device: str, io: str, double_buffer: bool,
                 block_bytes: int, window: int, read_block: int, io_threads: int, backend: str) -> None:
        from .dataset import Dataset, open_dataset

        torch = _import_torch()
        from .torch import resolve_rank  # torch is importable here: the line above checked

        self._torch = torch
        self.device = torch.device(device)
        if self.device.type not in ("cuda", "cpu"):
            raise ValueError(f"device must be a CUDA device or 'cpu', got {device!r}")
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise MissingDependencyError(
                f"device={device!r} but PyTorch sees no CUDA GPU (torch {torch.__version__}, CUDA "
                f"{torch.version.cuda}); use device='cpu', or install a CUDA build of torch")
        if io not in ("auto", "kvikio", "host"):
            raise ValueError(f"io must be 'auto', 'kvikio' or 'host', got {io!r}")
        if self.device.type == "cpu":
            if io == "kvikio":
                raise ValueError("io='kvikio' reads into GPU memory; it needs a CUDA device")
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
            if not isinstance(current, int) or current < io_threads:
                set_kvikio_threads(io_threads)
        self.io = io
        self.dataset: Dataset = source if isinstance(source, Dataset) else open_dataset(source, backend=backend)
        self._owns_dataset = not isinstance(source, Dataset)
        # A private reader for the loader's thread (LRU of open shards is not thread-safe), pinned
        # to the same index version as the caller's dataset.
        self._reader = Dataset(self.dataset.path, backend="kvikio" if io == "kvikio" else backend)
        if self._reader.manifest.index.checksum != self.dataset.manifest.index.checksum:
            self._reader.close()
            raise DatasetChangedError("the dataset was replaced since it was opened", path=self.dataset.path)
        self.alignment = self.dataset.alignment
        ix = self.dataset.index
        blocks = index_blocks(ix.offset, ix.size, ix.shard, block_bytes) if order == "block" else None
        read_order = ReadOrder(kind=order, seed=seed, block_bytes=block_bytes, window=window,
                               batch_size=batch_size, drop_last=drop_last)
        rank, world_size = resolve_rank(rank, world_size)
        self.cursor = EpochCursor(read_order, len(self.dataset), rank=rank, world_size=world_size, blocks=blocks)
        self.double_buffer = bool(double_buffer)
        self.read_block = max(int(read_block), self.alignment)
        self.io_threads = max(1, int(io_threads))
        self._pool: ThreadPoolExecutor | None = None
        self._host_staging: Any = None
        self._device_staging: Any = None

    # --- order and position: packer.order.CursorReader over self.cursor ---
    def __len__(self) -> int:
        return self.share().num_batches

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
        for future in futures:
            future.result()

    def _read_device(self, plan: RunPlan) -> Any:
        """The plan's blocks in device memory: kvikio straight in, or host pinned + copy."""
        if self.io == "kvikio":
            buffer = self._device_buffer(plan.nbytes)
            # All runs in flight at once, unless the batch spans more shards than the LRU keeps open
            # (opening one more would close a file with a read still in flight).
            overlap = len(set(plan.run_shard.tolist())) <= self._reader.max_open_shards
            waits = []
            for shard, offset, pos, nbytes in zip(plan.run_shard.tolist(), plan.run_offset.tolist(),
                                                  plan.run_pos[:-1].tolist(), plan.run_bytes.tolist()):
                wait = self._reader.shard(shard).start_read(offset, buffer[pos:pos + nbytes])
                if overlap:
                    waits.append(wait)
                else:
                    wait()
            for wait in waits:
                wait()
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

    def _stream_context(self) -> Any:
        if self.device.type != "cuda":
            return None
        torch = self._torch
        stream = torch.cuda.Stream(device=self.device)
        return torch.cuda.stream(stream)

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
            ahead = _ReadAhead(produce, count, depth=1, setup=self._stream_context)
            try:
                for item in ahead:
                    item = self._hand_out(item)
                    self.cursor.handed_out += 1  # counted when handed out: state_dict() in the loop body is exact
                    yield item
            finally:
                ahead.close()
        else:
            for k in range(count):
                item = produce(k)
                self.cursor.handed_out += 1
                yield item

    def close(self) -> None:
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


def _tensors(item: Any) -> Iterator[Any]:
    if isinstance(item, dict):
        item = list(item.values())
    if isinstance(item, (tuple, list)):
        for part in item:
            yield from _tensors(part)
    elif hasattr(item, "record_stream"):
        yield item


class GpuRawBatches(_GpuBatches):
    """``(images, labels)`` batches of a ``raw``-codec dataset: ``(B, H, W, C)`` uint8 and ``(B,)`` int64 on ``device``.

    Args:
        source: a dataset folder or an open ``Dataset`` (its codec must be ``raw``).
        batch_size: samples per batch per rank.
        order: ``"block"`` (default), ``"random"`` or ``"sequential"`` (``packer.order``).
        seed: the run's seed; orders are functions of (seed, epoch).
        rank, world_size: this rank's share; default from ``torch.distributed``, else (0, 1).
        drop_last: full batches only (``packer.order``'s drop rule) instead of padding.
        device: ``"cuda"``, ``"cuda:N"`` or ``"cpu"`` (the host path, for tests and fallbacks).
        io: ``"kvikio"`` (reads into GPU memory), ``"host"`` (pinned memory + copy) or ``"auto"``
            (kvikio when importable).
        double_buffer: prepare the next batch on a background thread while the caller computes.
        block_bytes, window: the block shuffle's block span and window (``packer.order``).
        read_block: largest single host read; longer runs are split and read in parallel.
        io_threads: parallel reads (host reads, and at least this many kvikio threads).
        backend: backend for host reads (``"pread"``, ``"mmap"``, ``"direct"``).

    Raises:
        ManifestError: the dataset is not ``raw``.
        IndexMismatchError: a sample's size or format disagrees with the manifest's raw shape.
        MissingDependencyError: torch missing, or ``device="cuda"`` without a GPU.
    """

    def __init__(self, source: Any, batch_size: int, *, order: str = "block", seed: int = 0,
                 rank: int | None = None, world_size: int | None = None, drop_last: bool = False,
                 device: str = "cuda", io: str = "auto", double_buffer: bool = True,
                 block_bytes: int = DEFAULT_BLOCK_BYTES, window: int = DEFAULT_WINDOW,
                 read_block: int = DEFAULT_READ_BLOCK, io_threads: int = 8, backend: str = "pread") -> None:
        from .codecs import raw_sample_shape, raw_sample_stride

        super().__init__(source, batch_size, order=order, seed=seed, rank=rank, world_size=world_size,
                         drop_last=drop_last, device=device, io=io, double_buffer=double_buffer,
                         block_bytes=block_bytes, window=window, read_block=read_block, io_threads=io_threads,
                         backend=backend)
        try:
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
        return images, self._labels(batch)


class GpuJpegBatches(_GpuBatches):
    """``(images, labels)`` batches of an encoded dataset, decoded on the GPU by nvJPEG (torchvision).

    ``images`` is a list of ``(3, H, W)`` uint8 tensors on ``device`` (RGB; sizes differ), or
    whatever ``transform(list)`` returns (it runs on the read-ahead thread and stream, e.g. a
    resize and ``torch.stack``); ``labels`` is ``(B,)`` int64 on ``device``. JPEG payloads are
    decoded in one batched ``torchvision.io.decode_jpeg(..., device=device)`` call; other formats
    (and JPEGs nvJPEG refuses, e.g. CMYK) are decoded on the CPU by ``packer.decode``. With
    ``device="cpu"`` everything is decoded by ``packer.decode`` (simplejpeg).

    Arguments are those of ``GpuRawBatches`` (``order`` defaults to ``"random"``; ``io`` is
    always host: compressed bytes are decoded from pinned host memory), plus ``transform``.

    Raises:
        MissingDependencyError: ``device="cuda"`` without torchvision (use ``packer.dali``).
    """

    def __init__(self, source: Any, batch_size: int, *, order: str = "random", seed: int = 0,
                 rank: int | None = None, world_size: int | None = None, drop_last: bool = False,
                 device: str = "cuda", double_buffer: bool = True, transform: Callable[[list[Any]], Any] | None = None,
                 block_bytes: int = DEFAULT_BLOCK_BYTES, window: int = DEFAULT_WINDOW,
                 read_block: int = DEFAULT_READ_BLOCK, io_threads: int = 8, backend: str = "pread") -> None:
        super().__init__(source, batch_size, order=order, seed=seed, rank=rank, world_size=world_size,
                         drop_last=drop_last, device=device, io="host", double_buffer=double_buffer,
                         block_bytes=block_bytes, window=window, read_block=read_block, io_threads=io_threads,
                         backend=backend)
        self.transform = transform
        self._decode_jpeg = None
        if self.device.type == "cuda":
            try:
                from torchvision.io import ImageReadMode, decode_jpeg
            except ImportError as exc:
                self.close()
                raise MissingDependencyError(
                    f"GPU JPEG decoding needs torchvision (nvJPEG), which cannot be imported ({exc}); install "
                    f"torchvision, or decode on the GPU with DALI (packer.dali, pip install 'packer[dali]')"
                ) from None
            self._decode_jpeg = decode_jpeg
            self._rgb = ImageReadMode.RGB

    def _cpu_decode(self, data: Any, image_format: int, i: int) -> Any:
        from .decode import decode_image

        pixels = decode_image(data, image_format, name=self.dataset.key(i))
        image = self._torch.from_numpy(pixels).permute(2, 0, 1).contiguous()
        return image if self.device.type == "cpu" else image.to(self.device, non_blocking=True)

    def _produce(self, indices: np.ndarray) -> Any:
        batch = plan_runs(self.dataset.index, indices, round_to=self.alignment)
        tensor, array = self._host_buffer(batch.nbytes)
        self._read_host(batch, array)
        formats = self.dataset.index.image_format
        images: list[Any] = [None] * len(batch.unique)
        starts, sizes = batch.sample_pos.tolist(), batch.sizes.tolist()
        gpu = [u for u, i in enumerate(batch.unique.tolist())
               if self._decode_jpeg is not None and int(formats[i]) == fmt.ImageFormat.JPEG]
        if gpu:
            inputs = [tensor[starts[u]:starts[u] + sizes[u]] for u in gpu]
            try:
                decoded = self._decode_jpeg(inputs, mode=self._rgb, device=self.device)
            except (RuntimeError, TypeError, ValueError):
                decoded = [None] * len(gpu)  # one bad file fails the batch call: retry one by one below
                for n, data in enumerate(inputs):
                    try:
                        decoded[n] = self._decode_jpeg(data, mode=self._rgb, device=self.device)
                    except (RuntimeError, TypeError, ValueError):
                        pass
            for u, image in zip(gpu, decoded):
                images[u] = image
        for u, i in enumerate(batch.unique.tolist()):
            if images[u] is None:
                images[u] = self._cpu_decode(array[starts[u]:starts[u] + sizes[u]], int(formats[i]), i)
        ordered = [images[u] for u in batch.where.tolist()]
        result = self.transform(ordered) if self.transform is not None else ordered
        return result, self._labels(batch)
