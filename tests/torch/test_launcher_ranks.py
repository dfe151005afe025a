"""A process that torchrun or Slurm started as one of several ranks, with no process group, is refused
by every reader that takes its ranks from ``torch.distributed`` (it would read every sample on every
rank), naming the fix; ranks passed explicitly, a process group, or a world of one are not refused."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import packer  # noqa: E402
from packer.errors import OptionError  # noqa: E402
from packer.threaded import ThreadedLoader  # noqa: E402
from packer.torch import (PackedBatchSampler, PackedDataLoader, PackedDataset, PackedIterableDataset,  # noqa: E402
                          PackedSampler)

from helpers import write_images  # noqa: E402

LAUNCHED = {"torchrun": {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"},
            "slurm": {"SLURM_NTASKS": "4", "SLURM_PROCID": "3"}}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ranks")
    write_images(root / "src", {"a": 5, "b": 5})
    packer.build_dataset(root / "src", root / "ds", packer.BuildSettings(), packer.RunOptions(workers=1))
    return root / "ds"


def _readers(path: Path) -> dict[str, object]:
    data = PackedDataset(path, decode=False)
    return {
        "PackedSampler": lambda **ranks: PackedSampler(data, seed=0, **ranks),
        "PackedBatchSampler": lambda **ranks: PackedBatchSampler(data, batch_size=2, seed=0, **ranks),
        "PackedIterableDataset": lambda **ranks: PackedIterableDataset(path, batch_size=2, decode=False, **ranks),
        "ThreadedLoader": lambda **ranks: ThreadedLoader(path, batch_size=2, decode=False, threads=1, **ranks),
        "PackedDataLoader": lambda **ranks: PackedDataLoader(data, batch_size=2, sampler=PackedSampler(data, **ranks)),
    }


@pytest.mark.parametrize("launcher", sorted(LAUNCHED))
@pytest.mark.parametrize("reader", ["PackedSampler", "PackedBatchSampler", "PackedIterableDataset", "ThreadedLoader",
                                    "PackedDataLoader"])
def test_several_ranks_without_a_process_group_are_refused(dataset: Path, monkeypatch: pytest.MonkeyPatch,
                                                           launcher: str, reader: str) -> None:
    for name, value in LAUNCHED[launcher].items():
        monkeypatch.setenv(name, value)
    make = _readers(dataset)[reader]
    with pytest.raises(OptionError) as refused:
        make()
    message = refused.value.message
    assert "torch.distributed is not initialised" in message and "every sample on every rank" in message
    assert "init_process_group()" in message and "pass rank= and world_size=" in message
    if launcher == "torchrun":
        assert "rank 1 of 2 (WORLD_SIZE=2, RANK=1: set by torchrun)" in message
    else:
        assert "rank 3 of 4 (SLURM_NTASKS=4, SLURM_PROCID=3: set by Slurm)" in message
    assert make(rank=1, world_size=2) is not None  # explicit ranks: the caller knows


def test_one_rank_or_no_launcher_reads_everything(dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("WORLD_SIZE", "RANK", "SLURM_NTASKS", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    assert len(list(PackedSampler(PackedDataset(dataset, decode=False), seed=0))) == 10
    monkeypatch.setenv("WORLD_SIZE", "1")  # torchrun --nproc-per-node 1
    monkeypatch.setenv("SLURM_NTASKS", "1")
    assert len(list(PackedSampler(PackedDataset(dataset, decode=False), seed=0))) == 10


def test_an_initialised_process_group_gives_the_ranks(dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    monkeypatch.setenv("WORLD_SIZE", "2")  # what the environment says no longer decides
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        sampler = PackedSampler(PackedDataset(dataset, decode=False), seed=0)
        assert len(list(sampler)) == 10
    finally:
        dist.destroy_process_group()
