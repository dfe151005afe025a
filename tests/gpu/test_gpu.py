"""packer.gpu: the kvikio backend's errors and protocol (with a fake kvikio), batch planning, and the
GPU batch loaders' host path (``device="cpu"``); tests marked ``gpu`` run the real CUDA paths."""

from __future__ import annotations

import contextlib
import os
import threading
import types
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from packer import gpu
from packer.backends import kvikio as kvikio_backend
from packer.backends.runs import RunPlan, plan_runs
from packer.writer import build
from packer.dataset import open_dataset
from packer.errors import (GpuPathError, IndexMismatchError, ManifestError, MissingDependencyError,
                           OffsetOutOfBoundsError, OptionError, TruncatedFileError)
from packer.order import ReadOrder
from packer.writer.plan import BuildOptions

torch = pytest.importorskip("torch")


def _has_gpu() -> bool:
    return bool(torch.cuda.is_available())


needs_gpu = pytest.mark.skipif(not _has_gpu(), reason="needs an NVIDIA GPU with CUDA")

RAW_SHAPE = (12, 10, 3)


class _FakeCuda:
    """``torch.cuda`` as seen host-side, with CUDA's per-thread current device (a new thread starts on 0).

    ``calls`` records (what, thread name, device asked for, the thread's current device).
    """

    def __init__(self, count: int = 2) -> None:
        self.count = count
        self.local = threading.local()
        self.calls: list[tuple[str, str, int | None, int]] = []

    def current_device(self) -> int:
        return getattr(self.local, "index", 0)

    def _index(self, device: object) -> int:
        return device.index if isinstance(device, torch.device) else int(device)

    def set_device(self, device: object) -> None:
        self.calls.append(("set_device", threading.current_thread().name, self._index(device), self.current_device()))
        self.local.index = self._index(device)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> "_FakeCuda":
        fake = self

        class Device:  # torch.cuda.device: a context that makes a device the thread's current one
            def __init__(self, device: object) -> None:
                self.index = fake._index(device)

            def __enter__(self) -> None:
                self.previous = fake.current_device()
                fake.calls.append(("device", threading.current_thread().name, self.index, self.previous))
                fake.local.index = self.index

            def __exit__(self, *exc: object) -> None:
                fake.local.index = self.previous

        class Stream:
            def __init__(self, device: object = None) -> None:
                fake.calls.append(("stream", threading.current_thread().name,
                                   None if device is None else fake._index(device), fake.current_device()))

            def synchronize(self) -> None:
                fake.calls.append(("synchronize", threading.current_thread().name, None, fake.current_device()))

        cuda = torch.cuda
        monkeypatch.setattr(cuda, "is_available", lambda: True)
        monkeypatch.setattr(cuda, "device_count", lambda: self.count)
        monkeypatch.setattr(cuda, "current_device", self.current_device)
        monkeypatch.setattr(cuda, "set_device", self.set_device)
        monkeypatch.setattr(cuda, "device", Device)
        monkeypatch.setattr(cuda, "Stream", Stream)
        monkeypatch.setattr(cuda, "stream", lambda stream: contextlib.nullcontext(stream))
        monkeypatch.setattr(cuda, "current_stream", lambda device=None: Stream.__new__(Stream))
        return self


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import make_sample

    base = tmp_path_factory.mktemp("gpu-src")
    make_sample.make_image_folder(base / "jpeg", classes=3, per_class=8, seed=11, formats=("jpeg",))
    make_sample.make_image_folder(base / "mixed", classes=2, per_class=4, seed=12,
                                  formats=("jpeg", "png", "jpeg-gray", "webp"))
    return base


@pytest.fixture(scope="module")
def raw_dataset(sources: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gpu-raw") / "ds"
    # 24 samples of 360 bytes -> stride 4096; ~5 samples per shard: several shards and runs.
    build(sources / "jpeg", out, BuildOptions(shard_size=20 << 10, alignment=4096, codec="raw:size=12x10"), workers=1,
          progress=False)
    return out


@pytest.fixture(scope="module")
def raw_dataset_unaligned(sources: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gpu-raw1") / "ds"
    build(sources / "jpeg", out, BuildOptions(shard_size=3000, alignment=8, codec="raw:size=12x10"), workers=1,
          progress=False)
    return out


@pytest.fixture(scope="module")
def jpeg_only_dataset(sources: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gpu-jpeg-only") / "ds"
    build(sources / "jpeg", out, BuildOptions(shard_size=24 << 10, alignment=4096), workers=1, progress=False)
    return out


@pytest.fixture(scope="module")
def jpeg_dataset(sources: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gpu-jpeg") / "ds"
    build(sources / "mixed", out, BuildOptions(shard_size=24 << 10, alignment=4096), workers=1, progress=False)
    return out


def _collect(loader: gpu.loader.GpuBatchReader) -> tuple[list[int], list]:
    """Iterate one epoch: (sample indices in order, the batches), checking the plan's batch sizes."""
    plan = loader.plan()
    assert len(loader) == plan.num_batches
    indices: list[int] = []
    batches = list(loader)
    assert len(batches) == plan.num_batches
    for k in range(plan.num_batches):
        indices += loader.batch_indices(plan, k).tolist()
        assert sorted(loader.batch_indices(plan, k).tolist()) == sorted(plan.batch(k).tolist())
    return indices, batches


# --- batch planning --------------------------------------------------------------------------

def test_plan_batch_coalesces_runs_and_keeps_the_order(raw_dataset: Path) -> None:
    with open_dataset(raw_dataset) as ds:
        ix = ds.index
        shard0 = ds.shard_range(0)
        wanted = [shard0[0] + 2, shard0[0], shard0[0] + 1, shard0[0] + 1, shard0[1]]  # a repeat, a new shard
        plan = plan_runs(ix, wanted, round_to=ds.alignment)
        assert plan.unique.tolist() == sorted(set(wanted))
        assert len(plan.run_offset) == 2  # three consecutive samples of shard 0, then shard 1
        assert plan.run_bytes.tolist() == [3 * 4096, 4096] and plan.nbytes == 4 * 4096
        buffer = np.zeros(plan.nbytes, dtype=np.uint8)
        for shard, offset, pos, nbytes in plan.reads(4096, ds.alignment):
            assert nbytes <= 4096 and offset % 4096 == 0 and pos % 4096 == 0
            ds.shard(shard).read_into(offset, buffer[pos:pos + nbytes])
        for j, i in enumerate(wanted):
            start = int(plan.starts[j])
            assert buffer[start:start + int(ix.size[i])].tobytes() == ds.read(i)


# --- GpuRawBatches, host path ---------------------------------------------------------------

@pytest.mark.parametrize("order", ["block", "random", "sequential"])
@pytest.mark.parametrize("double_buffer", [True, False])
def test_raw_batches_match_the_stored_pixels(raw_dataset: Path, order: str, double_buffer: bool) -> None:
    loader = gpu.GpuRawBatches(raw_dataset, 5, order=order, seed=3, device="cpu", double_buffer=double_buffer,
                               read_block=4096, block_bytes=8192)
    with loader, open_dataset(raw_dataset) as ds:
        indices, batches = _collect(loader)
        assert sorted(indices) == list(range(24)) and len(batches) == 5
        position = 0
        for images, labels in batches:
            assert images.dtype == torch.uint8 and images.shape[1:] == RAW_SHAPE and images.is_contiguous()
            assert labels.dtype == torch.int64 and labels.shape == (images.shape[0],)
            for j in range(images.shape[0]):
                i = indices[position + j]
                assert images[j].numpy().tobytes() == ds.read(i)
                assert int(labels[j]) == int(ds.labels[i])
            position += images.shape[0]
        if order == "sequential":
            assert indices == list(range(24))


def test_raw_batches_with_an_alignment_below_the_sample(raw_dataset_unaligned: Path) -> None:
    with gpu.GpuRawBatches(raw_dataset_unaligned, 7, device="cpu", order="random") as loader, \
            open_dataset(raw_dataset_unaligned) as ds:
        assert loader.strides.tolist() == [360] * len(ds.manifest.shards) and len(ds.manifest.shards) > 1
        indices, batches = _collect(loader)
        images = torch.cat([b[0] for b in batches])
        for j, i in enumerate(indices):
            assert images[j].numpy().tobytes() == ds.read(i)


def test_exact_epochs_and_rank_partitions(raw_dataset: Path) -> None:
    for drop_last in (False, True):
        per_rank = []
        for rank in range(3):
            with gpu.GpuRawBatches(raw_dataset, 4, seed=5, rank=rank, world_size=3, drop_last=drop_last,
                                   device="cpu") as loader:
                indices, batches = _collect(loader)
                per_rank.append(indices)
                labels = torch.cat([b[1] for b in batches]).tolist()
                assert labels == [int(x) for x in open_dataset(raw_dataset).labels[indices]]
        assert len({len(r) for r in per_rank}) == 1  # equal shares, equal batch counts
        everything = sum(per_rank, [])
        if drop_last:
            assert len(everything) == 24 and len(set(everything)) == 24  # 24 = 2 steps of 3 x 4
        else:
            assert set(everything) == set(range(24)) and len(everything) == 24
        # The batches packer.order deals (each shuffled inside: the block order sorts its steps).
        expected = ReadOrder(kind="block", seed=5, batch_size=4, drop_last=drop_last)
        with open_dataset(raw_dataset) as ds:
            from packer.order import index_blocks

            blocks = index_blocks(ds.index.offset, ds.index.size, ds.index.shard)
            for rank in range(3):
                plan = expected.plan(24, epoch=0, rank=rank, world_size=3, blocks=blocks)
                got = per_rank[rank]
                assert [sorted(got[k * 4:(k + 1) * 4]) for k in range(plan.num_batches)] == \
                    [plan.batch(k).tolist() for k in range(plan.num_batches)]
                assert got != plan.indices.tolist()


def test_epochs_differ_and_resume_mid_epoch(raw_dataset: Path) -> None:
    with gpu.GpuRawBatches(raw_dataset, 4, order="random", seed=1, device="cpu") as loader:
        first, _ = _collect(loader)
        loader.set_epoch(1)
        second, _ = _collect(loader)
        assert first != second and sorted(first) == sorted(second)
        iterator = iter(loader)
        for _ in range(2):
            next(iterator)
        state = loader.state_dict()
        assert state["epoch"] == 1 and state["consumed"] == 8
        iterator.close()
    with gpu.GpuRawBatches(raw_dataset, 8, order="random", seed=1, device="cpu") as resumed:
        resumed.load_state_dict(state)
        rest, _ = _collect(resumed)
        assert rest == second[8:]
        assert resumed.state_dict()["consumed"] == 24  # the epoch is complete (as in packer.torch)
        resumed.set_epoch(2)
        assert len(resumed) == 3 and resumed.state_dict()["consumed"] == 0


def test_read_ahead_stops_when_the_loop_breaks(raw_dataset: Path) -> None:
    before = threading.active_count()
    with gpu.GpuRawBatches(raw_dataset, 2, device="cpu") as loader:
        for k, _ in enumerate(loader):
            if k == 1:
                break
    assert threading.active_count() <= before


def test_read_errors_reach_the_consumer(raw_dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loader = gpu.GpuRawBatches(raw_dataset, 4, device="cpu", order="sequential")
    calls = {"n": 0}
    real = loader._read_host

    def failing(plan: RunPlan, out: np.ndarray) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise TruncatedFileError("simulated short read", path="shard", offset=4096)
        real(plan, out)

    monkeypatch.setattr(loader, "_read_host", failing)
    got = []
    with pytest.raises(TruncatedFileError, match="simulated"):
        for images, _ in loader:
            got.append(images)
    assert len(got) == 2
    loader.close()


def test_raw_batches_refuse_encoded_datasets(jpeg_dataset: Path) -> None:
    with pytest.raises(ManifestError, match="not 'raw'"):
        gpu.GpuRawBatches(jpeg_dataset, 4, device="cpu")


def test_jpeg_batches_refuse_stored_pixels_and_unknown_codecs_when_they_open(raw_dataset: Path, jpeg_dataset: Path,
                                                                             tmp_path: Path) -> None:
    import shutil

    from helpers import edit_manifest
    from packer.errors import DecodeError

    with pytest.raises(OptionError) as caught:
        gpu.GpuJpegBatches(raw_dataset, 4, device="cpu")
    assert caught.value.message == (f"GpuJpegBatches decodes encoded images, but the payloads of {raw_dataset} are "
                                    f"'raw' pixels: read them with packer.gpu.GpuRawBatches")
    unknown = Path(shutil.copytree(jpeg_dataset, tmp_path / "unknown"))
    edit_manifest(unknown, lambda document: document.update(codec={"name": "zstd-future"}))
    with pytest.raises(DecodeError) as error:
        gpu.GpuJpegBatches(unknown, 4, device="cpu")
    assert "codec 'zstd-future' is not one this packer can decode (it knows jpeg, passthrough" in error.value.message


def test_raw_batches_check_sizes_and_formats_against_the_codec(raw_dataset: Path, tmp_path: Path) -> None:
    """Every row must be one sample of the codec's shape and format 7 (the codec's check_index)."""
    import shutil

    from helpers import edit_manifest, rewrite_index

    smaller = Path(shutil.copytree(raw_dataset, tmp_path / "smaller"))
    edit_manifest(smaller, lambda document: document["codec"].update(height=6))  # 180-byte samples
    with pytest.raises(IndexMismatchError) as caught:
        gpu.GpuRawBatches(smaller, 4, device="cpu")
    assert caught.value.sample == 0 and caught.value.message == (
        "is 360 bytes of image_format 7, but the raw codec says every sample is 180 bytes (6x10x3) of format 7")
    jpeg_row = Path(shutil.copytree(raw_dataset, tmp_path / "jpeg-row"))
    rewrite_index(jpeg_row, lambda columns: columns["image_format"].__setitem__(3, 1))
    with pytest.raises(IndexMismatchError) as caught:
        gpu.GpuRawBatches(jpeg_row, 4, device="cpu")
    assert caught.value.sample == 3 and caught.value.message.startswith("is 360 bytes of image_format 1, but")


def test_cuda_device_without_a_gpu_is_a_clear_error(raw_dataset: Path) -> None:
    if _has_gpu():
        pytest.skip("this machine has a GPU")
    with pytest.raises(MissingDependencyError, match="sees no CUDA GPU.*device='cpu'"):
        gpu.GpuRawBatches(raw_dataset, 4, device="cuda")
    with pytest.raises(ValueError, match="io='kvikio'"):
        gpu.GpuRawBatches(raw_dataset, 4, device="cpu", io="kvikio")


# --- GpuJpegBatches, host path ---------------------------------------------------------------

def test_jpeg_batches_decode_like_packer_decode(jpeg_dataset: Path) -> None:
    from packer.decode import decode_image

    with gpu.GpuJpegBatches(jpeg_dataset, 3, device="cpu", seed=2, read_block=8192) as loader, \
            open_dataset(jpeg_dataset) as ds:
        indices, batches = _collect(loader)
        assert sorted(indices) == list(range(len(ds)))
        images = [image for batch in batches for image in batch[0]]
        labels = torch.cat([batch[1] for batch in batches]).tolist()
        for image, label, i in zip(images, labels, indices):
            expected = decode_image(ds.read(i), int(ds.index.image_format[i]))
            assert image.dtype == torch.uint8 and tuple(image.shape) == (3, *expected.shape[:2])
            assert np.array_equal(image.permute(1, 2, 0).numpy(), expected)
            assert label == int(ds.labels[i])


def test_jpeg_batches_transform(jpeg_dataset: Path) -> None:
    def stack_resized(images: list) -> object:
        return torch.stack([torch.nn.functional.interpolate(im[None].float(), size=(8, 8))[0] for im in images])

    with gpu.GpuJpegBatches(jpeg_dataset, 4, device="cpu", transform=stack_resized, drop_last=True) as loader:
        for images, labels in loader:
            assert images.shape == (4, 3, 8, 8) and labels.shape == (4,)


def test_jpeg_batches_on_cuda_need_a_gpu_jpeg_decoder(jpeg_dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    if not _has_gpu():
        _FakeCuda(1).install(monkeypatch)
    for name in ("torchvision.io", "torchcodec", "torchcodec.decoders", "nvidia.nvimgcodec"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails as if not installed
    with pytest.raises(MissingDependencyError, match="TorchCodec.*nvImageCodec.*torchvision.*DALI"):
        gpu.GpuJpegBatches(jpeg_dataset, 4, device="cuda")
    with pytest.raises(MissingDependencyError, match="torchvision"):
        gpu.GpuJpegBatches(jpeg_dataset, 4, device="cuda", gpu_decoder="torchvision")


# --- the kvikio backend ----------------------------------------------------------------------

def test_kvikio_backend_without_kvikio_or_gpu_is_a_clear_error(raw_dataset: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    def no_kvikio() -> None:
        raise MissingDependencyError("the kvikio backend needs kvikio ...; install it with pip install 'packer-shards[gpu]'")

    monkeypatch.setattr(kvikio_backend, "import_kvikio", no_kvikio)
    with open_dataset(raw_dataset, backend="kvikio") as ds:
        with pytest.raises(MissingDependencyError, match=r"packer-shards\[gpu\]"):
            ds.read(0)
    monkeypatch.setattr(kvikio_backend, "import_kvikio", lambda: types.SimpleNamespace())
    monkeypatch.setattr(kvikio_backend, "cuda_driver_status", lambda: (False, "no NVIDIA driver: libcuda.so.1 is missing"))
    with open_dataset(raw_dataset, backend="kvikio") as ds:
        with pytest.raises(MissingDependencyError, match="needs an NVIDIA GPU.*libcuda.*backend='pread'") as info:
            ds.read(0)
        assert info.value.path is not None and info.value.path.endswith(".pks")


def test_kvikio_backend_here_fails_cleanly(raw_dataset: Path) -> None:
    """Whatever is installed here (nothing, kvikio without a driver, or a GPU): a typed error or bytes."""
    with open_dataset(raw_dataset, backend="kvikio") as ds, open_dataset(raw_dataset) as reference:
        try:
            data = ds.read(3)
        except MissingDependencyError as exc:
            assert "packer-shards[gpu]" in str(exc) or "NVIDIA GPU" in str(exc)
        else:
            assert data == reference.read(3)


def test_gds_status_never_raises() -> None:
    status = gpu.gds_status()
    assert {"kvikio", "cuda_driver", "compat_mode", "gds_available", "gds_possible", "gds_verified", "requested_mode", "error"} <= set(status)
    if not status["kvikio"]:
        assert "packer-shards[gpu]" in status["error"] and status["gds_possible"] is False and status["gds_verified"] is False


class _FakeCudaBuffer:
    """Host memory that presents itself as a CUDA array (the fake kvikio below writes into it)."""

    def __init__(self, nbytes: int) -> None:
        self.host = np.zeros(nbytes, dtype=np.uint8)
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (0, False), "version": 3,
                                         "strides": None}


class _FakeFuture:
    def __init__(self, value: int) -> None:
        self.value = value

    def get(self) -> int:
        return self.value


def _fake_kvikio(calls: list) -> types.SimpleNamespace:
    class CuFile:
        def __init__(self, path: str, flags: str) -> None:
            self.fd = os.open(path, os.O_RDONLY)

        def fileno(self) -> int:
            return self.fd

        def pread(self, buf: _FakeCudaBuffer, size: int, file_offset: int, task_size: int | None = None):
            calls.append((size, file_offset, task_size))
            data = os.pread(self.fd, size, file_offset)
            buf.host[:len(data)] = np.frombuffer(data, np.uint8)
            return _FakeFuture(len(data))

        def close(self) -> None:
            os.close(self.fd)

    return types.SimpleNamespace(CuFile=CuFile)


def test_kvikio_shard_protocol_with_a_fake_kvikio(raw_dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list = []
    monkeypatch.setattr(kvikio_backend, "import_kvikio", lambda: _fake_kvikio(calls))
    monkeypatch.setattr(kvikio_backend, "cuda_driver_status", lambda: (True, "fake GPU"))
    with open_dataset(raw_dataset, backend="kvikio") as ds, open_dataset(raw_dataset) as reference:
        shard = ds.shard(0)
        assert isinstance(shard, kvikio_backend.KvikioShard)
        first, end = ds.shard_range(0)
        offset = int(ds.index.offset[first])
        block = _FakeCudaBuffer((end - first) * 4096)
        shard.read_into(offset, block)  # one aligned block, straight "into device memory"
        assert calls == [(block.host.size, offset, kvikio_backend.DEFAULT_TASK_SIZE)]
        for i in range(first, end):
            start = int(ds.index.offset[i]) - offset
            assert block.host[start:start + 360].tobytes() == reference.read(i)
        assert ds.read(1) == reference.read(1)  # host reads: pread, not kvikio
        assert ds.read_batch([0, 1, 2]).data.size > 0 and len(calls) == 1
        with pytest.raises(OffsetOutOfBoundsError):
            shard.read_into(shard.size - 4096, _FakeCudaBuffer(8192))
        short = _FakeCudaBuffer(4096)
        monkeypatch.setattr(shard, "size", shard.size + 4096)  # as if the file shrank under us
        with pytest.raises(TruncatedFileError, match="kvikio read 0 of 4096"):
            shard.read_into(shard.size - 4096, short)


def test_cuda_nbytes_refuses_strided_buffers() -> None:
    fake = _FakeCudaBuffer(16)
    fake.__cuda_array_interface__ = {"shape": (4, 2), "typestr": "<u2", "data": (0, False), "version": 3,
                                     "strides": (8, 2)}
    with pytest.raises(ValueError, match="C-contiguous"):
        kvikio_backend.cuda_nbytes(fake)
    fake.__cuda_array_interface__["strides"] = (4, 2)
    assert kvikio_backend.cuda_nbytes(fake) == 16


# --- real GPU paths (skipped without one) ----------------------------------------------------

@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("io", ["host", "kvikio"])
def test_gpu_raw_batches_equal_the_host_path(raw_dataset: Path, io: str) -> None:
    if io == "kvikio":
        try:
            kvikio_backend.import_kvikio()
        except MissingDependencyError as exc:
            pytest.skip(str(exc))
    with gpu.GpuRawBatches(raw_dataset, 5, seed=4, device="cuda", io=io) as loader, \
            gpu.GpuRawBatches(raw_dataset, 5, seed=4, device="cpu") as host:
        assert loader.io == io and loader.device == torch.device("cuda", torch.cuda.current_device())
        for (images, labels), (cpu_images, cpu_labels) in zip(loader, host):
            assert images.device == labels.device == loader.device
            assert torch.equal(images.cpu(), cpu_images) and torch.equal(labels.cpu(), cpu_labels)


@pytest.mark.gpu
@needs_gpu
def test_gpu_kvikio_backend_reads_into_device_memory(raw_dataset: Path) -> None:
    try:
        kvikio_backend.import_kvikio()
    except MissingDependencyError as exc:
        pytest.skip(str(exc))
    with open_dataset(raw_dataset, backend="kvikio") as ds, open_dataset(raw_dataset) as reference:
        first, end = ds.shard_range(0)
        offset = int(ds.index.offset[first])
        out = torch.empty((end - first) * 4096, dtype=torch.uint8, device="cuda")
        ds.shard(0).read_into(offset, out)
        host = out.cpu().numpy()
        for i in range(first, end):
            start = int(ds.index.offset[i]) - offset
            assert host[start:start + 360].tobytes() == reference.read(i)
        assert ds.read(first) == reference.read(first)
    status = gpu.gds_status()
    assert status["kvikio"] and status["cuda_driver"]


@pytest.mark.gpu
@needs_gpu
def test_gpu_jpeg_batches_decode_on_the_gpu(jpeg_dataset: Path) -> None:
    pytest.importorskip("torchvision")
    with gpu.GpuJpegBatches(jpeg_dataset, 4, seed=1, device="cuda", cpu_fallback="error") as loader, \
            gpu.GpuJpegBatches(jpeg_dataset, 4, seed=1, device="cpu") as host:
        assert loader.device == torch.device("cuda", torch.cuda.current_device())
        for (images, labels), (cpu_images, cpu_labels) in zip(loader, host):
            assert torch.equal(labels.cpu(), cpu_labels) and labels.device == loader.device
            for image, reference in zip(images, cpu_images):
                assert image.device == loader.device and image.shape == reference.shape
                # nvJPEG and libjpeg-turbo differ by rounding (IDCT, chroma upsampling): a few levels.
                assert (image.cpu().int() - reference.int()).abs().float().mean() < 3.0
        jpegs = int((loader.dataset.index.image_format == 1).sum())
        assert loader.decode_counts == {"gpu": jpegs, "cpu_fallback": 0, "cpu": len(loader.dataset) - jpegs}


def test_raw_batches_kvikio_read_path_with_a_fake_kvikio(raw_dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The io='kvikio' branch (one read per run into the staging buffer), with CPU tensors standing in."""
    calls: list = []
    fake = _fake_kvikio(calls)

    def pread(self, buf, size, file_offset, task_size=None):  # noqa: ANN001 - the fake's signature
        calls.append((size, file_offset, task_size))
        data = os.pread(self.fd, size, file_offset)
        buf.numpy()[:len(data)] = np.frombuffer(data, np.uint8)
        return _FakeFuture(len(data))

    fake.CuFile.pread = pread
    monkeypatch.setattr(kvikio_backend, "import_kvikio", lambda: fake)
    monkeypatch.setattr(kvikio_backend, "cuda_driver_status", lambda: (True, "fake GPU"))
    monkeypatch.setattr(kvikio_backend, "is_cuda_buffer", lambda out: isinstance(out, torch.Tensor))
    monkeypatch.setattr(kvikio_backend, "cuda_nbytes", lambda out: out.numel())
    from packer.dataset import Dataset

    with gpu.GpuRawBatches(raw_dataset, 6, seed=8, device="cpu") as loader, \
            gpu.GpuRawBatches(raw_dataset, 6, seed=8, device="cpu") as reference:
        loader._reader.close()
        loader._reader = Dataset(raw_dataset, backend="kvikio")
        loader.io = "kvikio"
        for (images, labels), (expected, expected_labels) in zip(loader, reference):
            assert torch.equal(images, expected) and torch.equal(labels, expected_labels)
        assert calls and all(size % 4096 == 0 and offset % 4096 == 0 for size, offset, _ in calls)
        # A torch CPU tensor given to a kvikio shard goes through pread (no buffer protocol needed).
        shard = loader._reader.shard(0)
        monkeypatch.setattr(kvikio_backend, "is_cuda_buffer", lambda out: False)
        out = torch.empty(360, dtype=torch.uint8)
        shard.read_into(int(loader.dataset.index.offset[0]), out)
        assert out.numpy().tobytes() == loader.dataset.read(0)


# --- device placement (host-side, with a fake torch.cuda) -----------------------------------

def _recording_produce(loader: gpu.loader.GpuBatchReader, seen: list) -> object:
    def produce(indices: np.ndarray) -> tuple:
        seen.append((threading.current_thread().name, torch.cuda.current_device()))
        return torch.zeros(len(indices)), torch.zeros(len(indices), dtype=torch.int64)
    return produce


@pytest.mark.parametrize("double_buffer", [True, False], ids=["read-ahead-thread", "caller-thread"])
def test_cuda_batches_land_on_the_device_of_the_creating_thread(raw_dataset: Path, monkeypatch: pytest.MonkeyPatch,
                                                               double_buffer: bool) -> None:
    """Rank 1 calls torch.cuda.set_device(1): its stream, reads and batches must use cuda:1, not cuda:0."""
    fake = _FakeCuda(2).install(monkeypatch)
    torch.cuda.set_device(1)  # what a DDP script does for local rank 1
    with gpu.GpuRawBatches(raw_dataset, 4, device="cuda", io="host", double_buffer=double_buffer) as loader:
        assert loader.device == torch.device("cuda", 1)
        seen: list = []
        monkeypatch.setattr(loader, "_produce", _recording_produce(loader, seen))
        batches = list(loader)
    assert len(batches) == 6 and len(seen) == 6
    assert {device for _, device in seen} == {1}, seen
    threads = {name for name, _ in seen}
    assert threads == ({"packer-read-ahead"} if double_buffer else {threading.current_thread().name})
    streams = [call for call in fake.calls if call[0] == "stream"]
    if double_buffer:
        # One stream per epoch, created on the read-ahead thread after it switched to device 1.
        assert streams == [("stream", "packer-read-ahead", 1, 1)]
    syncs = [call for call in fake.calls if call[0] == "synchronize"]
    assert len(syncs) == 6 and {call[3] for call in syncs} == {1}
    assert torch.cuda.current_device() == 1  # the caller's device is left as it was


def test_explicit_cuda_index_and_bad_indices(raw_dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _FakeCuda(2).install(monkeypatch)
    torch.cuda.set_device(1)
    with gpu.GpuRawBatches(raw_dataset, 4, device="cuda:0", io="host") as loader:
        seen: list = []
        monkeypatch.setattr(loader, "_produce", _recording_produce(loader, seen))
        list(loader)
        assert loader.device == torch.device("cuda", 0) and {d for _, d in seen} == {0}
    with pytest.raises(OptionError, match="sees 2 GPU.*CUDA_VISIBLE_DEVICES"):
        gpu.GpuRawBatches(raw_dataset, 4, device="cuda:2", io="host")
    with pytest.raises(OptionError, match="device must be"):
        gpu.GpuRawBatches(raw_dataset, 4, device="tpu")


def test_jpeg_decoder_runs_on_the_loader_device(jpeg_only_dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """nvJPEG decodes on the read-ahead thread with the rank's device current and targeted."""
    _FakeCuda(2).install(monkeypatch)
    torch.cuda.set_device(1)
    calls: list = []

    class Decoder:
        name = "fake nvJPEG"

        def __call__(self, inputs: list, device: object) -> list:
            calls.append((torch.cuda.current_device(), device, len(inputs)))
            return [torch.zeros(3, 2, 2, dtype=torch.uint8) for _ in inputs]

    with gpu.GpuJpegBatches(jpeg_only_dataset, 5, device="cuda", gpu_decoder=Decoder()) as loader:
        def host_buffer(nbytes: int) -> tuple:  # unpinned: this torch has no CUDA
            tensor = torch.empty(max(nbytes, 1), dtype=torch.uint8)
            return tensor, tensor.numpy()

        monkeypatch.setattr(loader, "_host_buffer", host_buffer)
        monkeypatch.setattr(loader, "_labels", lambda plan: torch.from_numpy(loader.dataset.index.label[plan.indices]))
        batches = list(loader)
    assert len(batches) == 5 and calls
    assert {(current, device) for current, device, _ in calls} == {(1, torch.device("cuda", 1))}
    assert loader.decode_counts == {"gpu": 24, "cpu_fallback": 0, "cpu": 0}


# --- in-flight kvikio reads after a failure --------------------------------------------------

def _recording_kvikio(events: list, *, fail_start: int | None = None, fail_wait: int | None = None):
    """A fake kvikio whose futures record being waited on; read ``fail_start`` refuses to start,
    the future of read ``fail_wait`` fails when waited on."""
    fake = _fake_kvikio([])
    counter = {"n": 0}

    class Future:
        def __init__(self, number: int, size: int) -> None:
            self.number, self.size = number, size

        def get(self) -> int:
            events.append(("wait", self.number))
            if self.number == fail_wait:
                raise RuntimeError("simulated cuFile error")
            return self.size

    def pread(self, buf, size, file_offset, task_size=None):  # noqa: ANN001 - the fake's signature
        counter["n"] += 1
        number = counter["n"]
        if number == fail_start:
            raise RuntimeError("simulated submission failure")
        data = os.pread(self.fd, size, file_offset)
        buf.numpy()[:len(data)] = np.frombuffer(data, np.uint8)
        events.append(("start", number))
        return Future(number, len(data))

    real_close = fake.CuFile.close

    def close(self) -> None:
        events.append(("close", None))
        real_close(self)

    fake.CuFile.pread = pread
    fake.CuFile.close = close
    return fake


@pytest.mark.parametrize("failure", ["start", "wait"])
@pytest.mark.parametrize("double_buffer", [True, False])
def test_kvikio_reads_in_flight_are_waited_for_after_a_failure(raw_dataset: Path, monkeypatch: pytest.MonkeyPatch,
                                                               failure: str, double_buffer: bool) -> None:
    events: list = []
    fake = _recording_kvikio(events, fail_start=3 if failure == "start" else None,
                             fail_wait=1 if failure == "wait" else None)
    monkeypatch.setattr(kvikio_backend, "import_kvikio", lambda: fake)
    monkeypatch.setattr(kvikio_backend, "cuda_driver_status", lambda: (True, "fake GPU"))
    monkeypatch.setattr(kvikio_backend, "is_cuda_buffer", lambda out: isinstance(out, torch.Tensor))
    monkeypatch.setattr(kvikio_backend, "cuda_nbytes", lambda out: out.numel())
    from packer.dataset import Dataset

    loader = gpu.GpuRawBatches(raw_dataset, 12, order="random", seed=8, device="cpu", double_buffer=double_buffer)
    loader._reader.close()
    loader._reader = Dataset(raw_dataset, backend="kvikio")
    loader.io = "kvikio"
    first = plan_runs(loader.dataset.index, loader.batch_indices(loader.plan(), 0), round_to=loader.alignment)
    assert len(first.run_offset) >= 4  # several reads in flight at once
    with pytest.raises(GpuPathError, match="simulated"):
        list(loader)
    # By the time the error reached the caller, every read that had started was waited for.
    started = [n for kind, n in events if kind == "start"]
    waited = [n for kind, n in events if kind == "wait"]
    assert started and set(started) <= set(waited), events
    if failure == "start":
        assert started == [1, 2] and 3 not in waited
    else:
        assert len(started) == len(first.run_offset)  # the failed first wait did not stop the others
    loader.close()
    closes = [i for i, (kind, _) in enumerate(events) if kind == "close"]
    assert closes and min(closes) > max(i for i, (kind, _) in enumerate(events) if kind == "wait")


# --- nvJPEG fallback ---------------------------------------------------------------------------

class _RefusingDecoder:
    """A GPU decoder that refuses every input, as torchvision built without nvJPEG does."""

    name = "fake decoder without nvJPEG"

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, inputs: list, device: object) -> list:
        self.calls += 1
        return [RuntimeError("torchvision not compiled with nvJPEG support") for _ in inputs]


class _WorkingDecoder:
    name = "fake decoder"

    def __call__(self, inputs: list, device: object) -> list:
        from packer.decode import decode_image

        return [torch.from_numpy(decode_image(bytes(t.numpy()))).permute(2, 0, 1).contiguous() for t in inputs]


def _fallback_warnings(caught: list) -> list:
    return [w for w in caught if issubclass(w.category, gpu.GpuFallbackWarning)]


@pytest.mark.parametrize("double_buffer", [True, False])
def test_nvjpeg_fallback_warns_once_and_counts(jpeg_dataset: Path, double_buffer: bool) -> None:
    from packer.decode import decode_image

    decoder = _RefusingDecoder()
    with open_dataset(jpeg_dataset) as ds:
        jpegs = int((ds.index.image_format == 1).sum())
        assert 0 < jpegs < len(ds)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with gpu.GpuJpegBatches(jpeg_dataset, 3, device="cpu", gpu_decoder=decoder,
                                    double_buffer=double_buffer) as loader:
                indices, batches = _collect(loader)
                assert loader.decode_counts == {"gpu": 0, "cpu_fallback": jpegs, "cpu": len(ds) - jpegs}
        found = _fallback_warnings(caught)
        assert len(found) == 1 and decoder.calls > 1
        assert "refused" in str(found[0].message) and "nvJPEG support" in str(found[0].message)
        images = [image for batch in batches for image in batch[0]]
        for image, i in zip(images, indices):
            assert np.array_equal(image.permute(1, 2, 0).numpy(), decode_image(ds.read(i), int(ds.index.image_format[i])))


def test_nvjpeg_fallback_silent_error_and_working(jpeg_dataset: Path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with gpu.GpuJpegBatches(jpeg_dataset, 3, device="cpu", gpu_decoder=_RefusingDecoder(),
                                cpu_fallback="silent") as loader:
            list(loader)
            assert loader.decode_counts["cpu_fallback"] > 0
    assert not _fallback_warnings(caught)
    with gpu.GpuJpegBatches(jpeg_dataset, 3, device="cpu", gpu_decoder=_RefusingDecoder(),
                            cpu_fallback="error") as loader:
        with pytest.raises(GpuPathError, match="refused.*nvJPEG support.*cpu_fallback='error'") as info:
            list(loader)
        assert info.value.sample is not None
    with gpu.GpuJpegBatches(jpeg_dataset, 3, device="cpu", gpu_decoder=_WorkingDecoder()) as loader, \
            gpu.GpuJpegBatches(jpeg_dataset, 3, device="cpu") as reference:
        for (images, _), (expected, _) in zip(loader, reference):
            assert all(torch.equal(a, b) for a, b in zip(images, expected))
        counts = loader.decode_counts
        assert counts["gpu"] > 0 and counts["cpu_fallback"] == 0 and counts["cpu"] > 0
        assert reference.decode_counts["gpu"] == 0 and reference.decode_counts["cpu_fallback"] == 0
    with pytest.raises(OptionError, match="cpu_fallback"):
        gpu.GpuJpegBatches(jpeg_dataset, 3, device="cpu", cpu_fallback="maybe")


# --- settings ------------------------------------------------------------------------------------

def test_loader_options_dataclass_and_keywords_agree(raw_dataset: Path) -> None:
    options = gpu.GpuLoaderOptions(order=ReadOrder("random", seed=3), device="cpu")
    with gpu.GpuRawBatches(raw_dataset, 5, options) as a, \
            gpu.GpuRawBatches(raw_dataset, 5, order=ReadOrder("random", seed=3), device="cpu") as b, \
            gpu.GpuRawBatches(raw_dataset, 5, options, order=ReadOrder("random", seed=4)) as c:
        assert _collect(a)[0] == _collect(b)[0] != _collect(c)[0]
        assert c.options.order == ReadOrder("random", seed=4) and c.read_order.seed == 4
    with pytest.raises(OptionError, match="unknown GPU loader setting.*sed"):
        gpu.GpuRawBatches(raw_dataset, 5, sed=3, device="cpu")
    with pytest.raises(OptionError, match="io must be"):
        gpu.GpuLoaderOptions(io="gds")
    with pytest.raises(OptionError, match="io must be 'auto' or 'host'"):
        gpu.GpuJpegBatches(raw_dataset, 5, device="cpu", io="kvikio")
    assert gpu.GpuJpegBatches.__init__.__kwdefaults__["cpu_fallback"] == "warn"


def test_the_old_order_settings_work_for_a_release_and_read_the_same(raw_dataset: Path, jpeg_dataset: Path) -> None:
    """``GpuLoaderOptions(seed=...)`` and ``GpuRawBatches(..., seed=...)`` still work, with a warning
    naming ``order=packer.ReadOrder(...)``, and read what the new spelling reads."""
    order = ReadOrder("random", seed=3, drop_last=True, rank=1, world_size=2)
    with pytest.warns(DeprecationWarning) as caught:
        options = gpu.GpuLoaderOptions(order="random", seed=3, drop_last=True, rank=1, world_size=2, device="cpu")
    assert str(caught[0].message) == ("GpuLoaderOptions(seed=, drop_last=, rank=, world_size=) is deprecated and goes "
                                      "in the next release: pass order=packer.ReadOrder('random', seed=3, "
                                      "drop_last=True, rank=1, world_size=2)")
    assert options == gpu.GpuLoaderOptions(order=order, device="cpu")
    with pytest.warns(DeprecationWarning, match=r"^the GPU loader\(seed=\) is deprecated"):
        old = gpu.GpuRawBatches(raw_dataset, 3, gpu.GpuLoaderOptions(order=order, device="cpu"), seed=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        new = gpu.GpuRawBatches(raw_dataset, 3, order=replace(order, seed=4), device="cpu")
    with old, new:
        assert old.read_order == new.read_order == replace(order, seed=4, batch_size=3)
        assert _collect(old)[0] == _collect(new)[0]
        assert old.state_dict(batches_consumed=1) == new.state_dict(batches_consumed=1)
    with pytest.warns(DeprecationWarning):  # the JPEG loader's own default kind stays under old settings
        jpeg = gpu.GpuJpegBatches(jpeg_dataset, 3, seed=2, device="cpu")
    with jpeg, gpu.GpuJpegBatches(jpeg_dataset, 3, device="cpu") as default:
        assert jpeg.read_order.kind == default.read_order.kind == "random" and jpeg.read_order.seed == 2
    with gpu.GpuRawBatches(raw_dataset, 3, device="cpu") as raw:
        assert raw.read_order == ReadOrder("block", batch_size=3, rank=0, world_size=1)
    with pytest.raises(OptionError) as refused:
        gpu.GpuRawBatches(raw_dataset, 3, order=ReadOrder(batch_size=4), device="cpu")
    assert refused.value.message == ("GpuRawBatches has batch_size=3 but its order has batch_size=4; give the same, "
                                     "or leave the order's out (None: the reader's)")
    with pytest.raises(TypeError, match="unexpected keyword argument 'block_samples'"):
        gpu.GpuLoaderOptions(block_samples=4)  # never a GPU loader setting: it is the order's now


# --- gds_status honesty ----------------------------------------------------------------------

@pytest.mark.parametrize("mode,preferred,available,possible", [
    ("AUTO", False, True, True), ("OFF", False, True, True), ("ON", True, True, False),
    ("AUTO", True, True, False), ("AUTO", False, False, False)])
def test_gds_status_reports_what_is_known_and_never_claims_gds(monkeypatch: pytest.MonkeyPatch, mode: str,
                                                               preferred: bool, available: bool,
                                                               possible: bool) -> None:
    import sys

    settings = {"compat_mode": types.SimpleNamespace(name=mode), "num_threads": 8, "task_size": 4 << 20}
    defaults = types.SimpleNamespace(get=settings.__getitem__, is_compat_mode_preferred=lambda: preferred)
    driver = types.SimpleNamespace(get=lambda name: {"is_gds_available": available}[name])
    fake = types.SimpleNamespace(__version__="26.10.0", defaults=defaults, cufile_driver=driver)
    monkeypatch.setitem(sys.modules, "kvikio", fake)
    monkeypatch.setitem(sys.modules, "kvikio.defaults", defaults)
    monkeypatch.setitem(sys.modules, "kvikio.cufile_driver", driver)
    monkeypatch.setattr(kvikio_backend, "cuda_driver_status", lambda: (True, "1 GPU(s) visible"))
    status = gpu.gds_status()
    assert status["requested_mode"] == mode and status["compat_mode_preferred"] is preferred
    assert status["gds_available"] is available and status["gds_possible"] is possible
    assert status["gds_verified"] is False and "gds_active" not in status
    assert status["num_threads"] == 8 and status["error"] is None


def test_close_waits_for_the_read_ahead_thread(raw_dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """close() while an iterator is still open: the thread's read finishes before files and buffers go."""
    import time

    loader = gpu.GpuRawBatches(raw_dataset, 4, device="cpu", order="sequential")
    real = loader._read_host
    events: list[str] = []

    def slow(plan: RunPlan, out: np.ndarray) -> None:
        events.append("read")
        time.sleep(0.05)
        real(plan, out)
        events.append("done")

    monkeypatch.setattr(loader, "_read_host", slow)
    real_close = loader._reader.close
    monkeypatch.setattr(loader._reader, "close", lambda: (events.append("close"), real_close()))
    iterator = iter(loader)
    next(iterator)
    loader.close()  # the iterator is not closed: the read-ahead thread is preparing batch 1
    assert events[-1] == "close" and events.count("read") == events.count("done")
    assert not [t for t in threading.enumerate() if t.name == "packer-read-ahead" and t.is_alive()]
