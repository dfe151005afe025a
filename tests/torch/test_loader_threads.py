"""PackedDataLoader makes the batches of a dataset that needs no decode on threads of its own
process (issue 40: each batch of small raw images crossing a process boundary cost more than making
it), and keeps worker processes wherever threads would not mean the same."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from packer import BuildSettings, LayoutSettings, RunOptions  # noqa: E402
from packer.errors import OptionError  # noqa: E402
from packer.order import ReadOrder  # noqa: E402
from packer.torch import PackedDataLoader, PackedDataset, collate  # noqa: E402
from packer.transforms import CenterCrop  # noqa: E402
from packer.writer import build  # noqa: E402

N = 40


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import make_sample

    root = tmp_path_factory.mktemp("loader-threads")
    make_sample.make_image_folder(root / "src", classes=4, per_class=N // 4, seed=5, min_size=20, max_size=40,
                                  formats=("png", "jpeg"))
    out = {"raw": root / "raw", "stored": root / "stored"}
    build(root / "src", out["raw"], BuildSettings(codec="raw:size=16x16", layout=LayoutSettings(shard_size=8 << 10)),
          RunOptions(workers=1, progress=False))
    build(root / "src", out["stored"], BuildSettings(), RunOptions(workers=1, progress=False))
    return out


def _batches(loader) -> list[tuple[np.ndarray, list[int]]]:
    return [(images.numpy().copy(), labels.tolist()) for images, labels in loader]


def test_a_raw_dataset_is_read_on_threads_with_the_batches_processes_give(folders: dict[str, Path]) -> None:
    dataset = PackedDataset(folders["raw"])
    order = ReadOrder("random", seed=3)
    threads = PackedDataLoader(dataset, batch_size=6, order=order, num_workers=2)
    processes = PackedDataLoader(dataset, batch_size=6, order=order, num_workers=2, worker_mode="processes")
    assert (threads.worker_mode, threads.threads, threads.num_workers) == ("threads", 2, 0)
    assert processes.worker_mode == "processes" and processes.num_workers == 2
    for epoch in (0, 1):
        threads.set_epoch(epoch)
        processes.set_epoch(epoch)
        got, want = _batches(threads), _batches(processes)
        assert len(got) == len(threads) == 7
        assert all(np.array_equal(a[0], b[0]) and a[1] == b[1] for a, b in zip(got, want, strict=True))


def test_the_thread_path_resumes_exactly_and_stops_cleanly(folders: dict[str, Path]) -> None:
    dataset = PackedDataset(folders["raw"])
    loader = PackedDataLoader(dataset, batch_size=4, order=ReadOrder("block", seed=1, block_samples=5),
                              num_workers=3)
    whole = [labels for _, labels in _batches(loader)]
    seen = []
    for step, (_, labels) in enumerate(loader, 1):  # stopping mid-epoch cancels what is in flight
        seen.append(labels.tolist())
        if step == 3:
            break
    state = loader.state_dict()
    assert state["consumed"] == 12
    again = PackedDataLoader(PackedDataset(folders["raw"]), batch_size=4, order=ReadOrder("block", seed=1,
                             block_samples=5), num_workers=1)
    again.load_state_dict(state)
    rest = [labels for _, labels in _batches(again)]
    assert seen + rest == whole


def test_auto_keeps_processes_where_threads_would_not_mean_the_same(folders: dict[str, Path]) -> None:
    order = ReadOrder("sequential")
    decoded = PackedDataset(folders["stored"], transform=None, decode=CenterCrop(16))
    assert PackedDataLoader(decoded, batch_size=4, order=order, num_workers=1).worker_mode == "processes"
    raw = PackedDataset(folders["raw"])
    kept = {"worker_init_fn": lambda worker: None, "multiprocessing_context": "spawn",
            "collate_fn": lambda batch: collate(batch)}
    for name, value in kept.items():
        loader = PackedDataLoader(raw, batch_size=4, order=order, num_workers=1, **{name: value})
        assert loader.worker_mode == "processes", name
    assert PackedDataLoader(raw, batch_size=4, order=order).worker_mode == "processes"  # num_workers=0
    in_python = PackedDataset(folders["stored"], decode=CenterCrop(16), transform=lambda image: image)
    with pytest.raises(OptionError, match=r"^PackedDataLoader\(worker_mode='threads'\): its batches are decoded "
                                          r"or transformed in Python \(threads would share one GIL\)"):
        PackedDataLoader(in_python, batch_size=4, order=order, num_workers=1, worker_mode="threads")
    own_decode = PackedDataset(folders["stored"], decode=lambda data, image_format: np.zeros((4, 4, 3), np.uint8))
    with pytest.raises(OptionError, match=r"its batches are decoded or transformed in Python"):
        PackedDataLoader(own_decode, batch_size=4, order=order, num_workers=1, worker_mode="threads")
    with pytest.raises(OptionError, match=r"worker_init_fn= is given \(it is for worker processes\)"):
        PackedDataLoader(raw, batch_size=4, order=order, num_workers=1, worker_mode="threads",
                         worker_init_fn=lambda worker: None)
    with pytest.raises(OptionError, match="^worker_mode must be one of auto, processes, threads, got 'fork'$"):
        PackedDataLoader(raw, batch_size=4, order=order, num_workers=1, worker_mode="fork")
    forced = PackedDataLoader(raw, batch_size=4, order=order, num_workers=2, worker_mode="threads",
                              persistent_workers=True, prefetch_factor=4, pin_memory=True)
    assert forced.worker_mode == "threads" and sum(len(labels) for _, labels in forced) == N


def test_a_fused_decode_runs_on_threads_when_asked_with_the_batches_processes_give(folders: dict[str, Path]) -> None:
    """Issue 40: JPEGs (and PNGs) under a fused transform decode without the GIL
    (``tests/codecs/test_gil_release.py``), so ``worker_mode="threads"`` reads them on threads of
    this process; ``"auto"`` keeps worker processes for them (docs/performance.md says why)."""
    from packer.transforms import RandomResizedCrop

    order = ReadOrder("random", seed=2)
    dataset = PackedDataset(folders["stored"], decode=RandomResizedCrop(12, seed=5))
    assert dataset.decodes_without_gil() and not dataset.copies_batches()
    assert not PackedDataset(folders["stored"], decode=RandomResizedCrop(12), backend="pread").decodes_without_gil()
    assert not PackedDataset(folders["stored"]).decodes_without_gil()  # decode=True: per-sample arrays
    auto = PackedDataLoader(dataset, batch_size=6, order=order, num_workers=2)
    assert auto.worker_mode == "processes"
    threads = PackedDataLoader(dataset, batch_size=6, order=order, num_workers=2, worker_mode="threads")
    assert (threads.worker_mode, threads.threads, threads.num_workers) == ("threads", 2, 0)
    for epoch in (0, 1):
        threads.set_epoch(epoch)
        auto.set_epoch(epoch)
        got, want = _batches(threads), _batches(auto)
        assert [labels for _, labels in got] == [labels for _, labels in want] and len(got) == 7
        assert all(np.array_equal(a[0], b[0]) for a, b in zip(got, want, strict=True))
        assert got[0][0].shape == (6, 3, 12, 12)
