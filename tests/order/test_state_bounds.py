"""A saved reader state whose epoch is past what a reader keeps (an int64 position) is an
OptionError naming it, not an OverflowError out of numpy (issue 38); so is ``set_epoch`` of one."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import write_images

import packer
from packer.errors import OptionError
from packer.order import MAX_EPOCH, ReadOrder, check_epoch


@pytest.mark.parametrize("epoch", [MAX_EPOCH + 1, 2**64 + 5, 10**30])
def test_check_epoch_names_an_epoch_past_int64(epoch: int) -> None:
    with pytest.raises(OptionError) as caught:
        check_epoch(epoch)
    assert caught.value.message == f"epoch must be at most 2**63 - 1 (a reader's position is an int64), got {epoch!r}"
    assert check_epoch(MAX_EPOCH) == MAX_EPOCH


def test_a_read_order_state_keeps_the_largest_epoch_and_names_the_next() -> None:
    order = ReadOrder("random", seed=4)
    state = order.state_dict(10, epoch=0, consumed=3)
    assert order.check_state({**state, "epoch": MAX_EPOCH}, 10) == (MAX_EPOCH, 3)
    with pytest.raises(OptionError) as caught:
        order.check_state({**state, "epoch": MAX_EPOCH + 1}, 10)
    assert caught.value.message == ("the saved state's epoch must be at most 2**63 - 1 (a reader's position is an "
                                    f"int64), got {MAX_EPOCH + 1}")


def test_a_sampler_state_with_a_huge_epoch_is_refused_by_name(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from packer.torch import PackedDataset, PackedSampler

    write_images(tmp_path / "src", {"a": 4})
    packer.build_dataset(tmp_path / "src", tmp_path / "ds", run=packer.RunOptions(workers=1))
    sampler = PackedSampler(PackedDataset(str(tmp_path / "ds")), order="random", seed=0)
    state = {**sampler.state_dict(), "epoch": 2**64}
    with pytest.raises(OptionError) as caught:
        sampler.load_state_dict(state)
    assert caught.value.message == ("the saved state's epoch must be at most 2**63 - 1 (a reader's position is an "
                                    "int64), got 18446744073709551616")
    with pytest.raises(OptionError, match=r"epoch must be at most 2\*\*63 - 1"):
        sampler.set_epoch(2**70)
    sampler.load_state_dict({**state, "epoch": MAX_EPOCH})  # the largest is kept
    assert sorted(iter(sampler)) == [0, 1, 2, 3]
