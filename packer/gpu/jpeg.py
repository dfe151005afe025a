"""``GpuJpegBatches``: batches of an encoded dataset, coalesced block reads into pinned host
memory, JPEGs decoded on the GPU by a pluggable decoder (``packer.gpu.decoders``), every other
format (and any JPEG the GPU decoder refuses) on the CPU according to ``cpu_fallback``.
"""

from __future__ import annotations

import dataclasses
import threading
import warnings
from typing import Any, Callable

import numpy as np

from .. import format as fmt
from ..codecs import codec_for
from ..errors import GpuPathError, MissingDependencyError, OptionError, PackerError
from ..order import ReadOrder
from .decoders import GpuJpegDecoder, gpu_jpeg_decoder
from .loader import CPU_FALLBACKS, GpuBatchReader, GpuLoaderOptions


class GpuFallbackWarning(RuntimeWarning):
    """The GPU decoder refused images and ``GpuJpegBatches`` decoded them on the CPU instead."""


def _check_encoded(dataset: Any) -> None:
    """Refuse, when the loader opens, a dataset whose payloads are not images to decode.

    Raises:
        DecodeError: a codec this packer does not know (SPEC §6).
        OptionError: stored pixels (codec ``raw``), which ``GpuRawBatches`` reads.
    """
    codec = codec_for(dataset)
    codec.check_decodable()
    if not codec.encoded:
        raise OptionError(f"GpuJpegBatches decodes encoded images, but the payloads of {dataset.path} are "
                          f"{codec.name!r} pixels: read them with packer.gpu.GpuRawBatches")


class GpuJpegBatches(GpuBatchReader):
    """``(images, labels)`` batches of an encoded dataset, JPEGs decoded on the GPU (nvJPEG by default).

    ``images`` is a list of ``(3, H, W)`` uint8 tensors on ``device`` (RGB; sizes differ), or
    whatever ``transform(list)`` returns (it runs on the read-ahead thread and stream, e.g. a
    resize and ``torch.stack``); ``labels`` is ``(B,)`` int64 on ``device``. JPEG payloads are
    decoded in one call of the GPU decoder per batch; other formats are decoded on the CPU by
    ``packer.decode`` by design. With ``device="cpu"`` and no ``gpu_decoder`` everything is
    decoded by ``packer.decode`` (simplejpeg).

    Args:
        source, batch_size, options, **settings: as for ``GpuRawBatches`` (``order`` defaults to
            ``ReadOrder("random")``; reads always go to pinned host memory: compressed bytes are
            decoded from there, so ``io`` must be ``"auto"`` or ``"host"``).
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
        OptionError: a bad setting, ``io="kvikio"``, an unknown ``cpu_fallback``, or a dataset of
            stored pixels (codec ``raw``: ``GpuRawBatches`` reads those).
        DecodeError: the dataset's codec is not one this packer decodes (SPEC §6).
        MissingDependencyError: ``device="cuda"`` without any GPU JPEG decoder (or without the one
            named; use ``packer.dali``).
        GpuPathError: while iterating, a JPEG the GPU decoder refused with ``cpu_fallback="error"``.
    """

    #: The order when the options have none.
    DEFAULT_ORDER = ReadOrder("random")

    def __init__(self, source: Any, batch_size: int, options: GpuLoaderOptions | None = None, *,
                 transform: Callable[[list[Any]], Any] | None = None, cpu_fallback: str = "warn",
                 gpu_decoder: GpuJpegDecoder | str | None = None, **settings: Any) -> None:
        if cpu_fallback not in CPU_FALLBACKS:
            raise OptionError(f"cpu_fallback must be one of {', '.join(CPU_FALLBACKS)}, got {cpu_fallback!r}")
        merged = GpuLoaderOptions.merge(options, settings, base=GpuLoaderOptions(self.DEFAULT_ORDER))
        if merged.io == "kvikio":
            raise OptionError("GpuJpegBatches decodes from pinned host memory: io must be 'auto' or 'host', "
                              "not 'kvikio'")
        super().__init__(source, batch_size, dataclasses.replace(merged, io="host"))
        self.transform = transform
        self.cpu_fallback = cpu_fallback
        self._decode_counts = {"gpu": 0, "cpu_fallback": 0, "cpu": 0}
        self._counts_lock = threading.Lock()
        self._warned = False
        try:
            _check_encoded(self.dataset)
        except PackerError:
            self.close()
            raise
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
        from ..decode import decode_image

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
        batch = self._plan(indices)
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
