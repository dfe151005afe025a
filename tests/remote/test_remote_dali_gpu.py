"""The DALI sources and GpuRawBatches (its host path) given a dataset URL: the same samples as
from the folder, read through the node cache. DALI runs CPU-only pipelines here (device_id=None)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from helpers import write_images

import packer
from packer.remote.upload import upload_dataset
from packer.remote.url import parse_url

from conftest import options_for

BATCH = 4


@pytest.fixture(scope="module")
def raw_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from packer.writer import BuildOptions, build

    root = tmp_path_factory.mktemp("remote-raw")
    write_images(root / "src", {"a": 9, "b": 9}, size=16)
    build(root / "src", root / "ds", BuildOptions(shard_size=24 << 10, codec="raw:size=12x10"), workers=1)
    return root / "ds"


@pytest.fixture
def url_env(s3, raw_dataset, tmp_path, monkeypatch):
    """The raw dataset uploaded; the sources open the URL with the standard endpoint variable and
    a node cache of this test (they take a path or URL, as a DALI worker reopens it)."""
    url = f"s3://{s3.bucket}/raw"
    upload_dataset(raw_dataset, parse_url(url), options_for(s3, tmp_path / "up"))
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.proxy)
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "node-cache"))
    return url


def _info(epoch: int, idx: int) -> SimpleNamespace:
    return SimpleNamespace(epoch_idx=epoch, idx_in_epoch=idx, idx_in_batch=idx % BATCH, iteration=idx // BATCH)


def test_dali_sources_read_a_url_as_the_folder(url_env, raw_dataset):
    from packer.dali import PackedBatchSource, PackedSampleSource

    remote = PackedSampleSource(url_env, BATCH, order="random", seed=2)
    local = PackedSampleSource(raw_dataset, BATCH, order="random", seed=2)
    for idx in range(18):
        got, want = remote(_info(0, idx)), local(_info(0, idx))
        assert got[0].shape == (12, 10, 3) and all(np.array_equal(g, w) for g, w in zip(got, want))
    batches = PackedBatchSource(url_env, BATCH, order="block", seed=1), PackedBatchSource(raw_dataset, BATCH, order="block", seed=1)
    for k in range(3):
        got, want = batches[0].read(1, k), batches[1].read(1, k)
        assert all(np.array_equal(g, w) for part_g, part_w in zip(got, want) for g, w in zip(part_g, part_w))


@pytest.mark.parametrize("parallel", [False, True], ids=["serial", "parallel-fork"])
def test_a_cpu_dali_pipeline_reads_a_url(url_env, raw_dataset, parallel):
    dali = pytest.importorskip("nvidia.dali")
    from nvidia.dali import fn, types

    from packer.dali import PackedSampleSource

    def run(path):
        source = PackedSampleSource(path, BATCH, order="random", seed=5, return_index=True)
        kwargs = {"py_num_workers": 2, "py_start_method": "fork"} if parallel else {}

        @dali.pipeline_def(batch_size=BATCH, num_threads=1, device_id=None, seed=0, **kwargs)
        def pipeline():
            data, label, index = fn.external_source(source=source, num_outputs=3, batch=False, parallel=parallel,
                                                    dtype=[types.UINT8, types.INT64, types.INT64])
            return data, label, index

        pipe = pipeline()
        pipe.build()
        out = []
        try:
            while True:
                outputs = pipe.run()
                out.append([[np.array(o.at(j)) for j in range(len(o))] for o in outputs])
        except StopIteration:
            pass
        return out

    remote, local = run(url_env), run(raw_dataset)
    assert len(remote) == len(local) == 5
    for got, want in zip(remote, local):
        assert all(np.array_equal(g, w) for part_g, part_w in zip(got, want) for g, w in zip(part_g, part_w))


def test_gpu_raw_batches_host_path_reads_a_url(url_env, raw_dataset, s3, tmp_path):
    torch = pytest.importorskip("torch")
    from packer import gpu

    with packer.open_dataset(raw_dataset) as local:
        expect = {i: local.read(i) for i in range(len(local))}
    for source in (url_env, packer.open_dataset(url_env, remote=options_for(s3, tmp_path / "c2"))):
        with gpu.GpuRawBatches(source, 5, order="random", seed=3, device="cpu") as loader:
            plan = loader.plan()
            seen = []
            for k, (images, labels) in enumerate(loader):
                assert images.dtype == torch.uint8 and images.shape[1:] == (12, 10, 3)
                for j, i in enumerate(loader.batch_indices(plan, k).tolist()):
                    assert images[j].numpy().tobytes() == expect[i]
                    seen.append(i)
        assert sorted(seen) == list(range(18))
