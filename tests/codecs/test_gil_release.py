"""The JPEG loader's compiled steps run without the GIL, so threads of one process decode in parallel
(issue 40: ``ThreadedLoader`` and ``PackedDataLoader``'s threads are worth what worker processes are
only if they do): the tile window (``_jpegtiles.window``), simplejpeg's decode, torch's antialiased
resize, and the raw path's batched crop-resize (``_rawresample.crop_resize``).

How it is told, without timing anything against a clock: a thread makes long calls to the step
while this thread spins in Python; while a call holds the GIL this thread cannot run at all, while
it releases it this thread runs as much as the other does (both are runnable; a loaded machine
slows both alike). So the CPU time this thread gets during the calls, over the calls' own, is near
0 for a step that holds the GIL (the control, ``sum`` over a range, shows it) and near 1 for one
that releases it.
"""

from __future__ import annotations

import io
import threading
import time
from typing import Any, Callable

import numpy as np
import pytest

simplejpeg = pytest.importorskip("simplejpeg")

#: Share of the calls' CPU time this thread must get for "releases the GIL" (about 1 when it does,
#: a few % when it does not; the control checks the low side).
RELEASED = 0.3


def _spin_share(call: Callable[[], Any], repeats: int) -> float:
    """CPU seconds this thread spun in Python while another thread made ``repeats`` calls, over
    the CPU seconds of those calls."""
    done = threading.Event()
    started = threading.Event()
    worker_cpu = [0.0]

    def work() -> None:
        started.set()
        begin = time.thread_time()
        for _ in range(repeats):
            call()
        worker_cpu[0] = time.thread_time() - begin
        done.set()

    thread = threading.Thread(target=work)
    thread.start()
    started.wait()
    begin = time.thread_time()
    spins = 0
    while not done.is_set():
        spins += 1
    mine = time.thread_time() - begin
    thread.join()
    return mine / max(worker_cpu[0], 1e-9)


def _noise_jpeg(width: int, height: int) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(0)
    small = rng.integers(0, 256, (height // 8, width // 8, 3), dtype=np.uint8)
    image = Image.fromarray(small).resize((width, height), Image.Resampling.BILINEAR)
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=92)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def big_jpeg() -> bytes:
    return _noise_jpeg(4000, 3000)


def test_the_method_sees_a_call_that_holds_the_gil() -> None:
    share = _spin_share(lambda: sum(range(10_000_000)), 3)
    assert share < 0.15, share


def test_simplejpeg_decodes_without_the_gil(big_jpeg: bytes) -> None:
    share = _spin_share(lambda: simplejpeg.decode_jpeg(big_jpeg, colorspace="RGB", fastdct=True), 4)
    assert share > RELEASED, share


def test_the_tile_window_is_cut_without_the_gil(big_jpeg: bytes) -> None:
    from packer.codecs import tiles

    if tiles._window is None or not tiles.transcoder_available():
        pytest.skip("packer.codecs._jpegtiles is not built")
    tiled = tiles.transcode(big_jpeg, max_pixels=1 << 26)
    assert tiles.cut_window(tiled, (8.0, 8.0, 3900.0, 2900.0), 2) is not None
    share = _spin_share(lambda: tiles._window(tiled, 8.0, 8.0, 3900.0, 2900.0, 2), 30)
    assert share > RELEASED, share


def test_torch_resizes_without_the_gil() -> None:
    torch = pytest.importorskip("torch")
    source = torch.zeros((1, 3, 3000, 4000), dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
    share = _spin_share(lambda: torch.nn.functional.interpolate(source, size=(224, 224), mode="bilinear",
                                                                antialias=True), 6)
    assert share > RELEASED, share


def test_the_raw_crop_resize_runs_without_the_gil() -> None:
    try:
        from packer import _rawresample
    except ImportError:
        pytest.skip("packer._rawresample is not built")
    count, height, width = 8, 1000, 1000
    pixels = np.random.default_rng(1).integers(0, 256, (count, height, width, 3), dtype=np.uint8)
    out = np.empty((count, 224, 224, 3), np.uint8)
    boxes = np.tile([0.0, 0.0, float(width), float(height)], (count, 1))
    flags = np.zeros(count, np.uint8)
    share = _spin_share(lambda: _rawresample.crop_resize(pixels, out, boxes, flags, True, count, height, width, 3,
                                                         224, 224), 6)
    assert share > RELEASED, share
