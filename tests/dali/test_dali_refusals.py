"""The DALI sources check their resume arguments before reading anything (no DALI needed to construct
them): a negative or non-integer epoch or position, and a position past the epoch (issue 31)."""

from __future__ import annotations

import pytest

from packer.errors import OptionError

from helpers import VECTORS

DATASET = VECTORS / "valid" / "base-align512"


@pytest.mark.parametrize("name, value", [("first_epoch", -1), ("consumed", True), ("consumed", 1.0)])
def test_epoch_and_position_must_be_non_negative_integers(name: str, value: object) -> None:
    from packer.dali import PackedSampleSource

    with pytest.raises(OptionError) as caught:
        PackedSampleSource(DATASET, batch_size=1, **{name: value})
    assert caught.value.message == f"{name} must be a non-negative integer, got {value!r}"


def test_a_position_past_the_epoch_is_refused() -> None:
    from packer.dali import PackedSampleSource
    from packer.dataset import open_index

    with open_index(DATASET) as index:
        count = len(index)
    with pytest.raises(OptionError) as caught:
        PackedSampleSource(DATASET, batch_size=1, consumed=count + 1)
    assert caught.value.message == f"consumed={count + 1} exceeds the {count} samples of an epoch"
    PackedSampleSource(DATASET, batch_size=1, consumed=count)  # the end of an epoch is a position
