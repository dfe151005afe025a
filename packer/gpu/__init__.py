"""GPU batch loaders: raw-pixel shards and encoded JPEG shards landed in GPU memory, plus the kvikio status helpers.

The modules: ``loader`` (settings and the shared reader), ``raw`` (``GpuRawBatches``), ``decoders``
(the pluggable GPU JPEG decoders) and ``jpeg`` (``GpuJpegBatches``).

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
arguments, or an ``options=GpuLoaderOptions(...)`` object plus keyword overrides. Which samples
come in which order for whom is one of them: ``order=packer.ReadOrder(...)``, as for every reader.

Example::

    from packer import ReadOrder
    from packer.gpu import GpuRawBatches
    torch.cuda.set_device(local_rank)
    loader = GpuRawBatches("/data/imagenet-raw224", batch_size=256, order=ReadOrder("block", seed=0))
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

# gds_status, cuda_driver_status and set_kvikio_threads live with the kvikio backend; they are
# part of this package's public surface because GPU users look for them here.
from ..backends.kvikio import cuda_driver_status, gds_status, set_kvikio_threads
from .decoders import (GPU_JPEG_DECODERS, GpuJpegDecoder, NvImageCodecJpegDecoder, TorchCodecJpegDecoder,
                       TorchvisionJpegDecoder, gpu_jpeg_decoder)
from .jpeg import GpuFallbackWarning, GpuJpegBatches
from .loader import CPU_FALLBACKS, DEFAULT_READ_BLOCK, GpuLoaderOptions, resolve_device
from .raw import RAW_BATCH_OUTPUTS, GpuRawBatches

__all__ = ["DEFAULT_READ_BLOCK", "CPU_FALLBACKS", "GpuLoaderOptions", "GpuJpegDecoder", "TorchvisionJpegDecoder",
           "TorchCodecJpegDecoder", "NvImageCodecJpegDecoder", "GPU_JPEG_DECODERS", "gpu_jpeg_decoder",
           "GpuFallbackWarning", "gds_status", "cuda_driver_status", "set_kvikio_threads", "resolve_device",
           "GpuRawBatches", "GpuJpegBatches", "RAW_BATCH_OUTPUTS"]
