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


# --- the defaults, the cells and the loaded start of 1 (scripts/mutate.py order) --------------------


def test_a_position_tells_apart_one_reader_by_default_and_names_its_slots() -> None:
    assert Position().slots == 1
    for bad in (0, -1, True):
        with pytest.raises(OptionError) as caught:
            Position(slots=bad)
        assert caught.value.message == f"slots must be a positive integer, got {bad!r}"
    position = Position()
    position.load(0, 4)
    assert position.peek() == 4  # reader 0 of 1 by default
    with pytest.raises(OptionError, match="at most 1 readers"):
        position.peek(1)  # reader 1 of the default 1 reader: no such reader


def test_a_default_claim_is_a_pass_of_one_reader() -> None:
    position = Position(slots=2)
    position.load(0, 4)
    assert position.claim() == 4  # reader 0 of 1
    assert position.peek(1, 2) == 0 and position.claim(1, 2) == 0  # two readers: a later pass
    assert Position(slots=2).peek(1) == 0  # nothing loaded: 0, for any reader
    position.load(0, 4)
    with pytest.raises(OptionError, match="at most 2 readers"):
        position.peek(1)  # reader 1 of the default 1 reader


def test_a_new_load_forgets_the_reader_count_of_the_pass_before() -> None:
    position = Position(slots=2)
    position.load(0, 4)
    assert position.claim(0, 1) == 4
    position.load(0, 6)
    assert position.claim(0, 2) == 6 and position.claim(1, 2) == 6  # a pass of two readers uses this load


def test_a_loaded_start_of_one_and_huge_positions_are_kept_exactly() -> None:
    position = Position()
    position.load(0, 1)
    assert position.peek() == 1 and position.claim() == 1
    huge = 2**53 + 1  # past what a float64 cell would hold exactly
    position.set(huge, huge)
    assert position.get() == (huge, huge)


def test_begin_at_plans_the_given_epoch() -> None:
    cursor = EpochCursor(ReadOrder(kind="random", seed=1, batch_size=2), 10)
    assert cursor.begin_at(3, 4).indices.tolist() == cursor.plan(3, 0).indices.tolist()[4:]
    assert cursor.epoch == 0 and cursor.pass_position == (3, 4)  # the shared position is not moved
