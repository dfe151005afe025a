"""Shard handles under threads: evicting a shard from the open-shard cache never closes it under a
reader (issue 25, item 5). ``ThreadedLoader`` with 8 threads over 200 shards and
``max_open_shards=2`` used to return other samples' bytes, EBADF and TypeError."""

from __future__ import annotations

import gc
import os
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from packer.dataset import open_dataset
from packer.writer import build
from packer.writer.plan import BuildOptions


@pytest.fixture(scope="module")
def many_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """200 distinct tiny PNGs, one per 8 KiB shard (a 4 KiB header, a 4 KiB slot): 200 shards."""
    base = tmp_path_factory.mktemp("shards")
    rng = np.random.default_rng(7)
    for c in range(2):
        (base / "src" / f"c{c}").mkdir(parents=True)
        for i in range(100):
            Image.fromarray(rng.integers(0, 255, (6 + i % 3, 6, 3), dtype=np.uint8)).save(base / "src" / f"c{c}" / f"{i}.png")
    build(base / "src", base / "ds", BuildOptions(shard_size=8 << 10, alignment=4096), workers=1, progress=False)
    with open_dataset(base / "ds") as ds:
        assert len(ds.manifest.shards) == 200
    return base / "ds"


@pytest.mark.parametrize("backend", ["mmap", "pread", "direct"])
def test_threaded_loader_over_200_shards_with_2_open_gives_every_sample_its_own_bytes(many_shards: Path,
                                                                                     backend: str) -> None:
    pytest.importorskip("torch")
    from packer.threaded import ThreadedLoader

    with open_dataset(many_shards) as reference:
        expected = [reference.read(i) for i in range(len(reference))]
    for seed in range(3):
        try:
            dataset = open_dataset(many_shards, backend=backend, max_open_shards=2)
        except Exception as exc:  # a file system that refuses O_DIRECT
            if backend == "direct":
                pytest.skip(f"O_DIRECT unavailable here: {exc}")
            raise
        loader = ThreadedLoader(dataset, batch_size=4, decode=False, threads=8, prefetch=16, order="random",
                                seed=seed)
        plan = loader.plan()
        seen = 0
        for k, (images, _) in enumerate(loader):
            for j, i in enumerate(plan.batch(k).tolist()):
                assert bytes(images[j].numpy()) == expected[i], f"sample {i} came back with other bytes"
                seen += 1
        assert seen == len(expected)
        dataset.close()


@pytest.mark.parametrize("backend", ["mmap", "pread"])
def test_raw_threads_hammering_get_and_read_batch_with_one_open_shard(many_shards: Path, backend: str) -> None:
    """Direct ``get``/``read_batch``/``iter_samples`` calls from 8 threads, max_open_shards=1."""
    with open_dataset(many_shards) as reference:
        expected = [reference.read(i) for i in range(len(reference))]
    dataset = open_dataset(many_shards, backend=backend, max_open_shards=1)
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(150):
                i = int(rng.integers(len(expected)))
                assert dataset.read(i) == expected[i]
                batch_indices = rng.integers(len(expected), size=5)
                batch = dataset.read_batch(batch_indices)
                for j, k in enumerate(batch_indices.tolist()):
                    assert bytes(batch[j]) == expected[k]
            for data, _ in dataset.iter_samples(rng.permutation(len(expected))[:50], chunk=7):
                assert bytes(data) in expected
        except BaseException as exc:  # collected: an assertion, EBADF, TypeError
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    dataset.close()
    assert not errors, errors[:3]


def test_an_evicted_shard_stays_open_while_held_and_closes_with_its_last_reference(many_shards: Path) -> None:
    dataset = open_dataset(many_shards, backend="pread", max_open_shards=2)
    held = dataset.shard(0)
    fd = held._fd
    for number in range(1, 10):  # evicts shard 0 from the cache
        dataset.shard(number)
    assert 0 not in dataset._open and len(dataset._open) == 2
    with open_dataset(many_shards) as reference:
        first, _ = reference.shard_range(0)
        out = bytearray(int(reference.index.size[first]))
        held.read_into(int(reference.index.offset[first]), out)
        assert bytes(out) == reference.read(first)
    assert os.fstat(fd) is not None  # still open: the reader holds it
    del held
    gc.collect()
    with pytest.raises(OSError):
        os.fstat(fd)  # closed with its last reference (the number may be reused only now)
    dataset.close()
