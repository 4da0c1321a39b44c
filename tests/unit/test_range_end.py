"""The end-of-range rule and the no-progress clock (DESIGN §14), as plain values."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kwatermark.range_end import (
    CONSUME_SLICE_S,
    OFFSET_INVALID,
    Stall,
    advance,
    done,
    short,
)


def test_a_range_is_done_when_its_position_reaches_its_end_not_at_a_record():
    # [0, 51): 50 records and a commit marker at 50. The last record leaves position 50;
    # the consumer's position, moved past the marker, says 51.
    assert not done(50, 51)
    assert done(advance(50, 51, 51), 51)


def test_a_range_of_only_markers_or_aborted_records_is_done_by_the_position_alone():
    assert done(advance(5, 10, 10), 10)       # nothing delivered, the position went past
    assert advance(5, OFFSET_INVALID, 10) == 5  # nothing consumed yet: no news


def test_the_position_never_goes_back_nor_past_the_end():
    assert advance(7, 3, 10) == 7
    assert advance(7, 25, 10) == 10


def test_only_a_call_that_came_back_short_asks_for_the_position():
    assert short(100, 99)
    assert not short(100, 100)


@given(st.integers(0, 10**6), st.integers(-2000, 10**6), st.integers(0, 10**6))
def test_advance_is_monotone_and_bounded(position, reported, end):
    position = min(position, end)
    moved = advance(position, reported, end)
    assert position <= moved <= end
    if reported >= end:
        assert done(moved, end)


def test_no_progress_clock_bounds_time_without_progress_not_time_per_range():
    clock = Stall(limit_s=120.0, last=0.0)
    assert clock.wait_s(0.0) == CONSUME_SLICE_S
    assert not clock.expired(119.0)
    clock.progressed(119.0)          # a record, or the position moving, resets it
    assert not clock.expired(238.0)
    assert clock.expired(239.0)
    # Never waits past the limit: the last slice is cut short, then nothing.
    assert 0.0 <= clock.wait_s(239.0 - 0.004) <= 0.004
    assert clock.wait_s(500.0) == 0.0
