"""The GPU JPEG decoders ``GpuJpegBatches`` can use (``gpu_decoder=``): torchvision's nvJPEG
``decode_jpeg`` (the default while it exists), TorchCodec's and nvImageCodec's. Each is a callable
with the ``GpuJpegDecoder`` signature, imported when it is created; ``gpu_jpeg_decoder("auto")``
picks the first one installed.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence

from ..errors import MissingDependencyError, OptionError

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
