"""uint8 batches to normalised float on the GPU.

Normalisation is left to the GPU: ship uint8 (4x fewer bytes than float32 over PCIe and through
worker shared memory) and convert on the device, as ``normalize_on_gpu`` does::

    from packer import ReadOrder
    from packer.torch import PackedDataLoader, PackedDataset
    from packer.transforms import RandomResizedCrop, normalize_on_gpu

    dataset = PackedDataset(path, decode=RandomResizedCrop(224), layout="HWC")
    loader = PackedDataLoader(dataset, batch_size=256, order=ReadOrder("random", seed=0), num_workers=8,
                              pin_memory=True, persistent_workers=True)
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for images, labels in loader:    # images: (256, 224, 224, 3) uint8, pinned
            x = normalize_on_gpu(images, device="cuda")  # (256, 3, 224, 224) float32,
            loss = criterion(model(x), labels.cuda(non_blocking=True))  # channels-last
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

if TYPE_CHECKING:  # torch is optional: imported lazily by normalize_on_gpu only
    import torch

#: ImageNet channel statistics in 0..255 units (torchvision's values times 255).
IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)


def normalize_on_gpu(images: Any, mean: Sequence[float] = IMAGENET_MEAN,
                     std: Sequence[float] = IMAGENET_STD, *, device: Any = "cuda",
                     dtype: Any = None, channels_last: bool = True, layout: str | None = None) -> "torch.Tensor":
    """Turn a uint8 batch (NHWC or NCHW) into a normalised float NCHW tensor on ``device``.

    The copy to the device moves uint8 (a quarter of float32's bytes); the conversion, the
    subtraction and the division then run on the device. The result is NCHW in channels-last
    memory format (a free permute of NHWC), which cuDNN convolutions prefer under AMP.

    Args:
        images: ``(N, H, W, 3)`` or ``(N, 3, H, W)`` uint8 torch tensor or numpy array (pin it
            for async copies): ``PackedDataset``'s default ``layout="CHW"`` batches and the
            ``HWC`` batches of the fused decode transforms both work.
        mean: per-channel mean in 0..255 units (default: ImageNet's).
        std: per-channel standard deviation in 0..255 units (default: ImageNet's).
        device: where to compute, e.g. ``"cuda"`` or ``"cpu"``.
        dtype: result dtype (default ``torch.float32``; ``torch.float16``/``bfloat16`` work).
        channels_last: keep channels-last memory format; False returns a contiguous NCHW tensor.
        layout: ``"NHWC"`` or ``"NCHW"``; by default the axis of size 3 says which (a batch with
            3 at both places, e.g. 3-pixel-wide images, must say).

    Returns:
        ``(N, 3, H, W)`` tensor of ``(x - mean) / std``.

    Raises:
        MissingDependencyError: torch is not installed.
        OptionError: not a 4-D batch with 3 channels, or an ambiguous / unknown ``layout``.

    Example:
        >>> for images, labels in loader:
        ...     x = normalize_on_gpu(images, device="cuda", dtype=torch.bfloat16)
    """
    from ..errors import OptionError

    try:
        import torch
    except ImportError as exc:
        from ..errors import MissingDependencyError
        raise MissingDependencyError("normalize_on_gpu needs torch: pip install 'packer-shards[torch]'") \
            from exc
    if isinstance(images, np.ndarray):
        images = torch.from_numpy(images)
    shape = tuple(images.shape)
    if layout is None:
        if len(shape) == 4 and shape[-1] == 3 and shape[1] != 3:
            layout = "NHWC"
        elif len(shape) == 4 and shape[1] == 3 and shape[-1] != 3:
            layout = "NCHW"
        elif len(shape) == 4 and shape[1] == 3 == shape[-1]:
            raise OptionError(f"batch of shape {shape} could be NHWC or NCHW: pass layout='NHWC' or 'NCHW'")
        else:
            raise OptionError(f"expected an (N, H, W, 3) or (N, 3, H, W) batch, got shape {shape}")
    if layout not in ("NHWC", "NCHW"):
        raise OptionError(f"layout must be 'NHWC' or 'NCHW', got {layout!r}")
    channel_axis = 3 if layout == "NHWC" else 1
    if len(shape) != 4 or shape[channel_axis] != 3:
        raise OptionError(f"expected an {'(N, H, W, 3)' if layout == 'NHWC' else '(N, 3, H, W)'} batch "
                          f"for layout {layout!r}, got shape {shape}")
    if layout == "NCHW":  # the same NHWC memory path below: a free view for channels-last inputs
        images = images.permute(0, 2, 3, 1)
    on_device = images.to(device, non_blocking=True)
    x = on_device.permute(0, 3, 1, 2).float()
    mean_t = torch.tensor(mean, device=x.device, dtype=torch.float32).view(1, 3, 1, 1)
    std_t = torch.tensor(std, device=x.device, dtype=torch.float32).view(1, 3, 1, 1)
    x = ((x - mean_t) / std_t).to(dtype or torch.float32)
    if channels_last:
        return x.contiguous(memory_format=torch.channels_last)
    return x.contiguous()
