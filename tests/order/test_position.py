"""``Position.claim``: a loaded start is used by the one pass that follows the load, by each of
that pass's readers (DataLoader workers) once, whatever order they begin in."""

from __future__ import annotations

import pytest

from packer.errors import OptionError
from packer.order import EpochCursor, Position, ReadOrder


def test_each_reader_of_the_first_pass_claims_the_loaded_start_once() -> None:
    position = Position(slots=4)
    position.load(3, 12)
    assert [position.claim(1, 2), position.claim(0, 2)] == [12, 12]  # the first pass: both readers
    assert position.get() == (3, 12)
    assert position.claim(0, 2) == 0  # the second pass: used
    assert position.get() == (3, 0)
    assert position.claim(1, 2) == 0


def test_a_late_reader_of_the_first_pass_still_gets_the_loaded_start() -> None:
    position = Position(slots=4)
    position.load(0, 8)
    assert position.claim(0, 2) == 8
    assert position.peek(1, 2) == 8 and position.claim(1, 2) == 8


def test_a_pass_with_another_reader_count_is_a_later_pass() -> None:
    position = Position(slots=4)
    position.load(0, 8)
    assert position.claim(0, 2) == 8
    assert position.peek(3, 4) == 0 and position.claim(3, 4) == 0


def test_a_new_load_is_claimed_again_and_set_epoch_keeps_the_rules() -> None:
    position = Position(slots=2)
    position.load(1, 8)
    assert position.claim() == 8 and position.claim() == 0
    position.load(1, 4)
    assert position.claim() == 4
    position.set(2, 0)
    assert position.claim() == 0


def test_too_many_readers_is_a_typed_error() -> None:
    position = Position(slots=2)
    position.load(0, 4)
    with pytest.raises(OptionError, match="at most 2 readers"):
        position.claim(2, 3)


def test_cursor_passes_after_a_load_without_set_epoch() -> None:
    cursor = EpochCursor(ReadOrder(kind="random", seed=1, batch_size=2), 10)
    whole = cursor.plan(0, 0).indices.tolist()
    cursor.load_state_dict(cursor.read_order.state_dict(10, epoch=0, consumed=4))
    assert cursor.begin().indices.tolist() == whole[4:]
    assert cursor.pass_position == (0, 4)
    assert cursor.begin().indices.tolist() == whole
    assert cursor.pass_position == (0, 0) and cursor.start == 0
