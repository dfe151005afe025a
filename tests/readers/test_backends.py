"""Backends: mmap, pread and direct (O_DIRECT) return identical bytes; direct reads stay aligned."""

from __future__ import annotations

import errno
import io
import os
import struct
import threading
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import packer.backends.direct as direct
from packer.writer import build
from packer.dataset import open_dataset
from packer.backends.buffers import aligned_empty, buffer_address
from packer.backends.direct import DIRECT_BLOCK, DirectShard
from packer.errors import DirectIOUnsupportedError, OptionError
from packer.errors import MisalignedRecordError, OffsetOutOfBoundsError, TruncatedFileError
from packer.writer.plan import BuildOptions

BACKENDS = ("mmap", "pread", "direct")
CODECS = ("passthrough", "jpeg:max_size=24", "raw:size=20x18")


def _direct_io_works(folder: Path) -> bool:
    probe = folder / ".odirect-probe"
    probe.write_bytes(bytes(DIRECT_BLOCK))
    try:
        fd = os.open(probe, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return False
    try:
        import mmap

        os.preadv(fd, [mmap.mmap(-1, DIRECT_BLOCK)], 0)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
        probe.unlink()


def _png_of_exact_size(pixels: np.ndarray, size: int) -> bytes:
    """A valid PNG padded to exactly ``size`` bytes with a tEXt chunk before IEND."""
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    png = buffer.getvalue()
    iend = png.rindex(b"IEND") - 4
    filler = size - len(png) - 12
    assert filler >= 5, "image too large for the requested size"
    body = b"tEXt" + b"pad\x00" + b"x" * (filler - 4)
    chunk = struct.pack(">I", filler) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)
    result = png[:iend] + chunk + png[iend:]
    assert len(result) == size
    return result


def _make_source(root: Path) -> Path:
    """Odd-sized images, several formats, and PNGs of exactly 4095, 4096, 4097 and 8192 bytes."""
    import make_sample

    make_sample.make_image_folder(root, classes=2, per_class=7, seed=5, min_size=9, max_size=70,
                                  formats=("jpeg", "png", "png-rgba", "jpeg-gray", "gif", "png16", "bmp"))
    rng = np.random.default_rng(7)
    for size in (4095, 4096, 4097, 8192):
        pixels = rng.integers(0, 256, (6, 7, 3), dtype=np.uint8)
        (root / "class_000" / f"exact_{size}.png").write_bytes(_png_of_exact_size(pixels, size))
    return root


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int], Path]:
    base = tmp_path_factory.mktemp("backends")
    if not _direct_io_works(base):
        pytest.skip(f"the file system of {base} refuses O_DIRECT (tmpfs before Linux 6.6?)")
    source = _make_source(base / "src")
    built = {}
    for codec in CODECS:
        for alignment in (1, 4096):
            out = base / f"ds-{codec.split(':')[0]}-{alignment}"
            build(source, out, BuildOptions(codec=codec, alignment=alignment, shard_size=(24 << 10) if alignment > 1 else (8 << 10), shuffle=False),
                  workers=1, progress=False)
            built[codec, alignment] = out
    return built


@pytest.mark.parametrize("alignment", [1, 4096])
@pytest.mark.parametrize("codec", CODECS)
def test_every_backend_returns_identical_bytes(datasets: dict, codec: str, alignment: int) -> None:
    path = datasets[codec, alignment]
    readers = {name: open_dataset(path, backend=name, verify_checksums=True) for name in BACKENDS}
    try:
        count = len(readers["mmap"])
        assert readers["mmap"].manifest.shards[1:], "want several shards"
        if codec == "passthrough":
            assert 4096 in set(readers["mmap"].index.size.tolist())
        for i in range(count):
            expected = readers["mmap"].read(i)
            for name in ("pread", "direct"):
                assert readers[name].read(i) == expected, (name, i)
                assert bytes(readers[name].get(i)) == expected
        rng = np.random.default_rng(alignment)
        batches = [np.arange(count), np.arange(count)[::-1], rng.integers(0, count, 40), [0, count - 1, 0],
                   np.arange(2, min(count, 9))]
        for indices in batches:
            reference = readers["mmap"].read_batch(indices)
            for name in ("pread", "direct"):
                batch = readers[name].read_batch(indices)
                assert len(batch) == len(reference)
                for j in range(len(batch)):
                    assert bytes(batch[j]) == bytes(reference[j])
    finally:
        for reader in readers.values():
            reader.close()


@pytest.mark.parametrize("alignment", [1, 4096])
def test_raw_shard_reads_agree_at_every_offset(datasets: dict, alignment: int) -> None:
    """Whole shards, first/last bytes, and ranges at and around block boundaries."""
    path = datasets["passthrough", alignment]
    readers = {name: open_dataset(path, backend=name) for name in BACKENDS}
    try:
        for number in range(len(readers["mmap"].manifest.shards)):
            shards = {name: reader.shard(number) for name, reader in readers.items()}
            size = shards["mmap"].size
            ranges = [(0, size), (0, 1), (size - 1, 1), (size - 4097, 4097) if size > 4097 else (0, size)]
            ranges += [(offset, length) for offset in (1, 4095, 4096, 4097) for length in (1, 4095, 4096, 4097, 8193)
                       if offset + length <= size]
            for offset, length in ranges:
                expected = bytearray(length)
                shards["mmap"].read_into(offset, expected)
                for name in ("pread", "direct"):
                    got = bytearray(length)
                    shards[name].read_into(offset, got)
                    assert got == expected, (name, number, offset, length)
                    aligned = aligned_empty(length)
                    shards[name].read_into(offset, aligned)
                    assert aligned.tobytes() == bytes(expected)
                    assert bytes(shards[name].view(offset, length)) == bytes(expected)
    finally:
        for reader in readers.values():
            reader.close()


def test_direct_reads_are_always_aligned(datasets: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int, int]] = []
    real_preadv = os.preadv

    def recording_preadv(fd: int, buffers: list, offset: int) -> int:
        for buffer in buffers:
            calls.append((offset, memoryview(buffer).nbytes, buffer_address(buffer)))
        return real_preadv(fd, buffers, offset)

    monkeypatch.setattr(direct.os, "preadv", recording_preadv)
    for (codec, alignment), path in datasets.items():
        with open_dataset(path, backend="direct") as ds:
            for i in range(len(ds)):
                ds.read(i)
            ds.read_batch(np.arange(len(ds)))
            ds.read_batch(np.arange(len(ds))[::3])
            shard = ds.shard(0)
            shard.read_into(1, bytearray(shard.size - 1))
            shard.read_into(0, aligned_empty(shard.size))
            shard.read_into(0, aligned_empty(shard.size + 1)[1:])
    assert len(calls) > 100
    bad = [call for call in calls if call[0] % 4096 or call[1] % 4096 or call[2] % 4096]
    assert not bad, bad[:5]


def test_aligned_reads_skip_the_bounce_buffer(datasets: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    path = datasets["raw:size=20x18", 4096]
    with open_dataset(path, backend="direct") as ds:
        shard = ds.shard(0)
        out = aligned_empty(shard.size)
        targets: list[int] = []
        real_preadv = os.preadv
        monkeypatch.setattr(direct.os, "preadv",
                            lambda fd, buffers, offset: targets.append(buffer_address(buffers[0]))
                            or real_preadv(fd, buffers, offset))
        shard.read_into(0, out)
        assert targets == [buffer_address(out)]
        with open(ds.path / ds.manifest.shards[0].path, "rb") as handle:
            assert out.tobytes() == handle.read()


def test_small_bounce_buffer_reads_in_pieces(datasets: dict) -> None:
    path = datasets["passthrough", 4096]
    with open_dataset(path, backend="mmap") as ds:
        entry = ds.manifest.shards[0]
        real = str(ds.path / entry.path)
        fd = os.open(real, os.O_RDONLY)
        try:
            shard = DirectShard(fd, real, entry.size, bounce_bytes=DIRECT_BLOCK)
        finally:
            os.close(fd)
        with shard:
            for offset, length in ((0, entry.size), (5, entry.size - 5), (4095, 8194)):
                got = bytearray(length)
                shard.read_into(offset, got)
                assert bytes(got) == bytes(ds.shard(0).view(offset, length))


def test_misaligned_read_is_refused_before_the_kernel(datasets: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    path = datasets["passthrough", 4096]
    with open_dataset(path, backend="direct") as ds:
        shard = ds.shard(0)
        monkeypatch.setattr(direct.os, "preadv", lambda *args: pytest.fail("misaligned read reached preadv"))
        buffer = aligned_empty(3 * DIRECT_BLOCK)
        for view, offset in ((memoryview(buffer)[1:DIRECT_BLOCK + 1], 0), (memoryview(buffer)[:DIRECT_BLOCK], 512),
                             (memoryview(buffer)[:100], 0)):
            with pytest.raises(MisalignedRecordError, match="refusing a misaligned O_DIRECT read"):
                shard._pread_blocks(view, offset)


def test_out_of_bounds_and_truncated(datasets: dict, tmp_path: Path) -> None:
    path = datasets["passthrough", 4096]
    with open_dataset(path, backend="direct") as ds:
        shard = ds.shard(0)
        with pytest.raises(OffsetOutOfBoundsError):
            shard.read_into(shard.size - 10, bytearray(11))
        with pytest.raises(OffsetOutOfBoundsError):
            shard.view(-1, 4)
        assert bytes(shard.view(shard.size, 0)) == b""
    short = tmp_path / "short.bin"
    short.write_bytes(b"\x01" * 5000)
    fd = os.open(short, os.O_RDONLY)
    try:
        shard = DirectShard(fd, str(short), 3 * DIRECT_BLOCK)  # claims more than the file holds
    finally:
        os.close(fd)
    with shard, pytest.raises(TruncatedFileError, match="shard ended at 5000"):
        shard.read_into(4096, bytearray(8192))


def test_file_system_without_o_direct(datasets: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    path = datasets["passthrough", 4096]
    real_open = os.open

    def refusing_open(target: object, flags: int, *args: object, **kwargs: object) -> int:
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(target, flags, *args, **kwargs)  # dir_fd=: files are opened below a folder handle

    monkeypatch.setattr(direct.os, "open", refusing_open)
    with open_dataset(path, backend="direct") as ds:
        with pytest.raises(DirectIOUnsupportedError, match="refuses O_DIRECT.*backend='pread'"):
            ds.read(0)
    monkeypatch.setattr(direct.os, "open", real_open)

    def refusing_read(*args: object) -> int:
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(direct.os, "preadv", refusing_read)
    with open_dataset(path, backend="direct") as ds:
        with pytest.raises(DirectIOUnsupportedError, match="refused an aligned O_DIRECT read"):
            ds.read(0)


def test_threads_share_a_direct_shard(datasets: dict) -> None:
    path = datasets["raw:size=20x18", 1]
    with open_dataset(path, backend="direct") as ds, open_dataset(path) as reference:
        expected = [reference.read(i) for i in range(len(ds))]
        for i in range(len(ds)):
            ds.shard(int(ds.index.shard[i]))  # open them all first: the open-shard cache is not thread-safe
        errors: list[str] = []

        def worker(seed: int) -> None:
            rng = np.random.default_rng(seed)
            for i in rng.integers(0, len(ds), 200).tolist():
                shard, offset, size = int(ds.index.shard[i]), int(ds.index.offset[i]), int(ds.index.size[i])
                out = bytearray(size)
                ds.shard(shard).read_into(offset, out)
                if bytes(out) != expected[i]:
                    errors.append(f"sample {i}")

        threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors


def test_aligned_empty() -> None:
    for size in (0, 1, 4095, 4096, 1 << 20):
        buffer = aligned_empty(size)
        assert buffer.nbytes == size and buffer.dtype == np.uint8
        if size:
            assert buffer.ctypes.data % DIRECT_BLOCK == 0
    with pytest.raises(OptionError, match=r"^need nbytes >= 0 and alignment >= 1, got -1, 4096$"):
        aligned_empty(-1)


def test_iter_samples_equals_get_for_every_backend(datasets: dict) -> None:
    path = datasets["passthrough", 4096]
    order = np.random.default_rng(3).permutation(len(open_dataset(path)))
    expected = None
    for backend in BACKENDS:
        ds = open_dataset(path, backend=backend)
        got = [(bytes(data), label) for data, label in ds.iter_samples(order, chunk=7)]
        want = [(ds.read(int(i)), int(ds.labels[i])) for i in order]
        assert got == want
        expected = expected or got
        assert got == expected
        assert [bytes(d) for d, _ in ds.iter_samples()] == [ds.read(i) for i in range(len(ds))]


@pytest.mark.parametrize("backend", ["mmap", "pread"])
def test_willneed_hints_are_page_aligned_and_clipped(tmp_path: Path, backend: str, monkeypatch) -> None:
    """Read-ahead hints accept any range: the kernel gets a page-aligned start and a range inside
    the file, and the bytes read afterwards are unchanged."""
    import mmap as mmap_module

    from packer.dataset import open_dataset

    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for k in range(6):  # ~9 KB each: several pages per sample, several samples per shard
        pixels = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
        (src / f"{k}.png").write_bytes(_png_of_exact_size(pixels, 9000 + 100 * k))
    build(tmp_path / "src", tmp_path / "ds", BuildOptions(alignment=512), workers=1, progress=False)
    dataset = open_dataset(tmp_path / "ds", backend=backend)
    before = [dataset.read(i) for i in range(len(dataset))]
    shard = dataset.shard(0)
    calls = []
    if backend == "mmap":
        monkeypatch.setattr(shard, "_map", _Recorder(shard._map, calls))
    else:
        monkeypatch.setattr(os, "posix_fadvise", lambda fd, offset, size, advice: calls.append((offset, size)))
    shard.advise_willneed(1000, 5000)
    shard.advise_willneed(0, shard.size)
    shard.advise_willneed(shard.size - 10, 100)  # past the end of the file
    shard.advise_willneed(10, 0)  # empty: no hint at all
    assert len(calls) == 3
    if backend == "mmap":
        assert all(advice == mmap_module.MADV_WILLNEED for advice, _, _ in calls)
        assert all(start % mmap_module.PAGESIZE == 0 and start + length <= shard.size for _, start, length in calls)
        assert calls[0][1] <= 1000 < calls[0][1] + calls[0][2] and calls[0][1] + calls[0][2] >= 6000
    else:
        assert calls[0] == (1000, 5000) and calls[1] == (0, shard.size)
    assert [dataset.read(i) for i in range(len(dataset))] == before
    dataset.close()


class _Recorder:
    """Stands in for an mmap object: records madvise calls, forwards everything else."""

    def __init__(self, target, calls: list) -> None:
        self._target, self._calls = target, calls

    def madvise(self, advice: int, start: int = 0, length: int = 0) -> None:
        self._calls.append((advice, start, length))

    def __getattr__(self, name: str):
        return getattr(self._target, name)
