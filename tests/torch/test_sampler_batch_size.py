"""``PackedDataLoader`` tells its sampler the batch size: the README's wiring
``PackedSampler(train, order="block", seed=0)`` without ``batch_size`` deals each global step as the
next ``world_size x batch_size`` samples of the epoch order, and keeps the block order's locality."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from packer.errors import OptionError  # noqa: E402
from packer.order import ReadOrder, index_blocks  # noqa: E402
from packer.torch import PackedDataLoader, PackedDataset, PackedIterableDataset, PackedSampler, collate  # noqa: E402
from packer.writer import build  # noqa: E402
from packer.writer.plan import BuildOptions  # noqa: E402

N, B, W = 40, 4, 2


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import make_sample

    root = tmp_path_factory.mktemp("batchsize") / "src"
    make_sample.make_image_folder(root, classes=4, per_class=N // 4, seed=5, min_size=8, max_size=8,
                                  formats=("png",))
    out = root.parent / "raw"
    build(root, out, BuildOptions(shard_size=8 << 10, alignment=512, codec="raw:size=8x8"), workers=1,
          progress=False)
    return out


def _rank_batches(packed: Path, rank: int) -> list[list[int]]:
    train = PackedDataset(packed, decode=False, fields=("index",))
    sampler = PackedSampler(train, order="block", seed=0, block_bytes=1024, rank=rank, world_size=W)
    loader = PackedDataLoader(train, batch_size=B, sampler=sampler, collate_fn=collate)
    # the loader reads the sampler through a batch sampler of its order with the loader's batch
    # size, sharing its position; the sampler itself is not changed
    assert sampler.batch_size is None and loader.batch_sampler.batch_size == B
    assert loader.sampler is sampler and loader.batch_size == B
    return [batch["index"].tolist() for batch in loader]


def test_the_readme_wiring_deals_global_steps_of_world_size_times_batch_size(packed: Path) -> None:
    ix = PackedDataset(packed, decode=False).dataset.index
    blocks = index_blocks(ix.offset, ix.size, ix.shard, 1024)
    settings = ReadOrder(kind="block", seed=0, block_bytes=1024, batch_size=B)
    order = settings.epoch_order(N, 0, blocks).tolist()
    ranks = [_rank_batches(packed, rank) for rank in range(W)]
    for rank in range(W):
        expected = settings.plan(N, epoch=0, rank=rank, world_size=W, blocks=blocks)
        assert ranks[rank] == [expected.batch(k).tolist() for k in range(expected.num_batches)]
    for step in range(N // (W * B)):  # each step takes the next W x B samples of the epoch order
        taken = ranks[0][step] + ranks[1][step]
        assert sorted(taken) == sorted(order[step * W * B:(step + 1) * W * B])
        # block locality: a rank's batch is a sorted run of the step (not every other sample)
        assert ranks[0][step] == sorted(taken)[:B]


def test_a_sampler_told_another_batch_size_is_refused(packed: Path) -> None:
    train = PackedDataset(packed, decode=False)
    with pytest.raises(OptionError, match="batch_size=8 but the DataLoader's batch_size is 4"):
        PackedDataLoader(train, batch_size=B, sampler=PackedSampler(train, batch_size=8), collate_fn=collate)


def test_the_batch_size_is_told_without_moving_a_loaded_position(packed: Path) -> None:
    train = PackedDataset(packed, decode=False, fields=("index",))
    saved = PackedSampler(train, seed=2, batch_size=B).state_dict(samples_consumed=3 * B)
    sampler = PackedSampler(train, seed=2)
    sampler.load_state_dict(saved)
    loader = PackedDataLoader(train, batch_size=B, sampler=sampler, collate_fn=collate)
    seen = [i for batch in loader for i in batch["index"].tolist()]
    whole = ReadOrder(kind="random", seed=2, batch_size=B).epoch_order(N, 0).tolist()
    assert seen == whole[3 * B:]


@pytest.mark.parametrize("batched, loader_batch, message", [
    (True, 1, "yields batches, but the DataLoader's batch_size is 1: pass batch_size=None"),
    (True, 4, "yields batches, but the DataLoader's batch_size is 4: pass batch_size=None"),
    (False, 8, "yields samples in batches of 4, but the DataLoader's batch_size is 8: pass batch_size=4"),
])
def test_an_iterable_whose_batches_are_not_the_loaders_is_refused(packed: Path, batched: bool, loader_batch: int,
                                                                  message: str) -> None:
    dataset = PackedIterableDataset(packed, batch_size=B, decode=False, batched=batched)
    with pytest.raises(OptionError, match=message):
        PackedDataLoader(dataset, batch_size=loader_batch, collate_fn=collate)
    agreeing = dict(batch_size=None) if batched else dict(batch_size=B, collate_fn=collate)
    assert len(list(PackedDataLoader(dataset, **agreeing))) == N // B
