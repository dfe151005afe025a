"""The GPU JPEG decoder is pluggable: TorchCodec, nvImageCodec, torchvision's nvJPEG, chosen by name
or the first that imports ("auto"), each host-tested here with a fake of its library."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np
import pytest

from packer import gpu
from packer.decode import decode_image
from packer.errors import MissingDependencyError, OptionError
from packer.writer import build
from packer.writer.plan import BuildOptions

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import make_sample

    root = tmp_path_factory.mktemp("gpu-decoders") / "src"
    make_sample.make_image_folder(root, classes=2, per_class=6, seed=2, min_size=20, max_size=40, formats=("jpeg",))
    out = root.parent / "ds"
    build(root, out, BuildOptions(shard_size=16 << 10), workers=1, progress=False)
    return out


def _chw(data: object) -> "torch.Tensor":
    raw = bytes(data.numpy()) if hasattr(data, "numpy") else bytes(data)  # type: ignore[union-attr]
    if not raw.startswith(b"\xff\xd8"):
        raise RuntimeError("not a JPEG")
    return torch.from_numpy(decode_image(raw)).permute(2, 0, 1).contiguous()


def fake_torchcodec(monkeypatch: pytest.MonkeyPatch, calls: list, *, batched: bool = True,
                    takes_mode: bool = True) -> None:
    """``torchcodec.decoders.decode_jpeg`` decoding on the CPU; optionally without lists or ``mode=``."""
    def decode_jpeg(source, *, device="cpu", **options):  # noqa: ANN001, ANN202
        if options and not takes_mode:
            raise TypeError("decode_jpeg() got an unexpected keyword argument 'mode'")
        assert options in ({}, {"mode": "RGB"})
        if isinstance(source, list):
            if not batched:
                raise TypeError("source must be a path, bytes or a tensor")
            calls.append(("batch", len(source), device))
            return [_chw(item).to(device) for item in source]
        calls.append(("one", 1, device))
        return _chw(source).to(device)

    package = types.ModuleType("torchcodec")
    decoders = types.ModuleType("torchcodec.decoders")
    decoders.decode_jpeg = decode_jpeg  # type: ignore[attr-defined]
    package.decoders = decoders  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torchcodec", package)
    monkeypatch.setitem(sys.modules, "torchcodec.decoders", decoders)


def fake_nvimgcodec(monkeypatch: pytest.MonkeyPatch, calls: list) -> None:
    """``nvidia.nvimgcodec.Decoder(device_id).decode(list)``: HWC arrays, None for what it cannot decode."""
    class Decoder:
        def __init__(self, device_id: int = 0) -> None:
            self.device_id = device_id

        def decode(self, encoded: list) -> list:
            calls.append((self.device_id, len(encoded)))
            out = []
            for data in encoded:
                try:
                    out.append(_chw(np.asarray(data)).permute(1, 2, 0).numpy())
                except RuntimeError:
                    out.append(None)
            return out

    module = types.ModuleType("nvidia.nvimgcodec")
    module.Decoder = Decoder  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", module)
    if "nvidia" not in sys.modules:
        monkeypatch.setitem(sys.modules, "nvidia", types.ModuleType("nvidia"))
    monkeypatch.setattr(sys.modules["nvidia"], "nvimgcodec", module, raising=False)


def block(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    for name in names:
        monkeypatch.setitem(sys.modules, name, None)  # import fails with ImportError
    if "nvidia.nvimgcodec" in names and "nvidia" in sys.modules:
        monkeypatch.delattr(sys.modules["nvidia"], "nvimgcodec", raising=False)


def inputs(*payloads: bytes) -> list:
    return [torch.frombuffer(bytearray(p), dtype=torch.uint8) for p in payloads]


def test_torchcodec_decodes_a_batch_in_one_call_or_image_by_image(jpegs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from packer.dataset import open_dataset

    with open_dataset(jpegs) as ds:
        payloads = [ds.read(i) for i in range(3)]
    calls: list = []
    fake_torchcodec(monkeypatch, calls)
    decoded = gpu.TorchCodecJpegDecoder()(inputs(*payloads), torch.device("cpu"))
    assert calls == [("batch", 3, torch.device("cpu"))]
    assert all(torch.equal(image, _chw(p)) for image, p in zip(decoded, payloads))
    calls.clear()
    fake_torchcodec(monkeypatch, calls, batched=False, takes_mode=False)  # an older or stricter TorchCodec
    decoded = gpu.TorchCodecJpegDecoder()(inputs(payloads[0], b"not a jpeg"), torch.device("cpu"))
    assert [kind for kind, _, _ in calls] == ["one", "one"]
    assert torch.equal(decoded[0], _chw(payloads[0])) and isinstance(decoded[1], RuntimeError)


def test_nvimagecodec_images_become_chw_tensors_and_failures_refusals(jpegs: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from packer.dataset import open_dataset

    with open_dataset(jpegs) as ds:
        payloads = [ds.read(i) for i in range(2)]
    calls: list = []
    fake_nvimgcodec(monkeypatch, calls)
    decoder = gpu.NvImageCodecJpegDecoder()
    decoded = decoder(inputs(payloads[0], b"broken", payloads[1]), torch.device("cpu"))
    assert calls == [(0, 3)]
    assert torch.equal(decoded[0], _chw(payloads[0])) and torch.equal(decoded[2], _chw(payloads[1]))
    assert isinstance(decoded[1], RuntimeError) and "could not decode" in str(decoded[1])
    assert decoder._decoder(torch.device("cuda", 1)).device_id == 1  # a decoder per device, made once
    assert set(decoder._decoders) == {0, 1} and decoder._decoder(torch.device("cpu")) is decoder._decoders[0]


def test_auto_takes_torchcodec_then_nvimagecodec_then_torchvision(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list = []
    fake_torchcodec(monkeypatch, calls)
    fake_nvimgcodec(monkeypatch, calls)
    assert isinstance(gpu.gpu_jpeg_decoder(), gpu.TorchCodecJpegDecoder)
    assert isinstance(gpu.gpu_jpeg_decoder("nvimagecodec"), gpu.NvImageCodecJpegDecoder)
    block(monkeypatch, "torchcodec", "torchcodec.decoders")
    assert isinstance(gpu.gpu_jpeg_decoder("auto"), gpu.NvImageCodecJpegDecoder)
    block(monkeypatch, "nvidia.nvimgcodec", "torchvision", "torchvision.io")
    with pytest.raises(MissingDependencyError, match=r"torchcodec>=0.16.*nvimgcodec.*torchvision"):
        gpu.gpu_jpeg_decoder()
    with pytest.raises(MissingDependencyError, match="torchcodec>=0.16"):
        gpu.gpu_jpeg_decoder("torchcodec")
    with pytest.raises(OptionError, match="gpu_decoder must be 'auto'"):
        gpu.gpu_jpeg_decoder("nvjpeg")


@pytest.mark.parametrize("name", ["torchcodec", "nvimagecodec"])
def test_jpeg_batches_decode_through_the_named_decoder(name: str, jpegs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list = []
    (fake_torchcodec if name == "torchcodec" else fake_nvimgcodec)(monkeypatch, calls)
    with gpu.GpuJpegBatches(jpegs, 5, device="cpu", gpu_decoder=name, order="sequential") as loader:
        batches = list(loader)
        assert loader.decode_counts == {"gpu": 12, "cpu_fallback": 0, "cpu": 0} and calls
    with gpu.GpuJpegBatches(jpegs, 5, device="cpu", order="sequential") as reference:  # simplejpeg on the CPU
        expected = list(reference)
    for (images, labels), (want, want_labels) in zip(batches, expected):
        assert torch.equal(labels, want_labels)
        assert all(torch.equal(a.contiguous(), b) for a, b in zip(images, want))
    with pytest.raises(OptionError, match="gpu_decoder must be"):
        gpu.GpuJpegBatches(jpegs, 5, device="cpu", gpu_decoder="nvjpeg")
