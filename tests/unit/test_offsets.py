"""The checkpointed offset's state (DESIGN §4) and the pure arithmetic of planning a batch; its
JSON is tests/unit/test_offset_layout.py's."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kwatermark.offsets import (
    BatchOffset,
    PartitionRange,
    PartitionState,
    fill_densities,
    fill_levels,
    held_by_alignment,
    plan_splits,
    rate_limit,
    split_range,
    with_state,
)
from kwatermark.partition_columns import read_densities


def test_with_state_changes_one_partition():
    offset = BatchOffset(5, {("t", 0): PartitionRange(0, 4), ("t", 1): PartitionRange(2, 3)})
    changed = with_state(offset, ("t", 1), idle="exclude", last_read_ms=77)
    assert changed.partitions[("t", 1)] == PartitionRange(
        2, 3, PartitionState(idle="exclude", last_read_ms=77))
    assert changed.partitions[("t", 0)] == offset.partitions[("t", 0)]
    assert offset.partitions[("t", 1)].state == PartitionState()   # the original is unchanged


# -- rate limit (DESIGN §11) ---------------------------------------------------------------

UNDEFINED = -(2**63)


def test_rate_limit_without_priority_splits_in_proportion_to_lag():
    begins = {("t", 0): 0, ("t", 1): 10}
    ends = {("t", 0): 300, ("t", 1): 110}
    # one record each first, then 98 split 299:99 -> 73.3, 24.3 -> 74 (remainder), 24
    assert rate_limit(begins, ends, 100) == {("t", 0): 75, ("t", 1): 35}


def test_rate_limit_gives_leftover_rows_to_largest_remainders_then_order():
    begins = {("t", 0): 0, ("t", 1): 0, ("t", 2): 0}
    ends = {("t", 0): 6, ("t", 1): 4, ("t", 2): 3}
    # one each, then 4 more over lags 5, 3, 2: shares 2.0, 1.2, 0.8 -> 2, 1, 0 + 1 remainder
    assert rate_limit(begins, ends, 7) == {("t", 0): 3, ("t", 1): 2, ("t", 2): 2}


def test_the_issue_13_case_reads_the_small_partition_in_the_first_trigger():
    # p0: 200,000 unread records far ahead; p1: 5 unread records behind it. Proportionally
    # p1's share is 0.025 of a record; it now gets at least one, and as the watermark holder
    # it is served first: all five.
    begins = {("t", 0): 0, ("t", 1): 0}
    ends = {("t", 0): 200_000, ("t", 1): 5}
    assert rate_limit(begins, ends, 1000) == {("t", 0): 999, ("t", 1): 1}
    assert rate_limit(begins, ends, 1000, {("t", 0): 3_600_000, ("t", 1): 1_000}) == {
        ("t", 0): 995, ("t", 1): 5}
    # both undefined (nothing read yet): a tie, shared by lag, p1 still gets its one record
    assert rate_limit(begins, ends, 1000, {("t", 0): UNDEFINED, ("t", 1): UNDEFINED}) == {
        ("t", 0): 999, ("t", 1): 1}


def test_rate_limit_serves_the_lowest_watermark_first_and_undefined_lowest():
    begins = {("t", 0): 0, ("t", 1): 0, ("t", 2): 0}
    ends = {("t", 0): 500, ("t", 1): 500, ("t", 2): 500}
    marks = {("t", 0): 9_000, ("t", 1): 5_000, ("t", 2): UNDEFINED}
    assert rate_limit(begins, ends, 300, marks) == {("t", 0): 1, ("t", 1): 1, ("t", 2): 298}
    marks[("t", 2)] = 7_000
    assert rate_limit(begins, ends, 300, marks) == {("t", 0): 1, ("t", 1): 298, ("t", 2): 1}
    # the holder cannot use it all: the next lowest gets the rest
    ends[("t", 1)] = 50
    assert rate_limit(begins, ends, 300, marks) == {("t", 0): 1, ("t", 1): 50, ("t", 2): 249}


def test_rate_limit_overshoots_only_to_give_every_partition_one_record():
    begins = {("t", i): 0 for i in range(5)}
    ends = {("t", i): 1000 for i in range(5)}
    assert rate_limit(begins, ends, 2) == dict.fromkeys(ends, 1)


def test_rate_limit_under_the_limit_reads_everything():
    begins = {("t", 0): 0, ("t", 1): 5}
    ends = {("t", 0): 3, ("t", 1): 5}
    assert rate_limit(begins, ends, 10) == ends
    assert rate_limit(begins, ends, 3, {("t", 0): 1, ("t", 1): 0}) == ends


@settings(deadline=None, max_examples=400)
@given(parts=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 2000),
                                st.one_of(st.just(UNDEFINED), st.integers(0, 20))),
                      min_size=1, max_size=7),
       max_rows=st.integers(1, 5000), prioritised=st.booleans())
def test_rate_limit_properties(parts, max_rows, prioritised):
    begins = {("t", i): b for i, (b, _, _) in enumerate(parts)}
    ends = {("t", i): b + lag for i, (b, lag, _) in enumerate(parts)}
    marks = {("t", i): m for i, (_, _, m) in enumerate(parts)} if prioritised else None
    limited = rate_limit(begins, ends, max_rows, marks)
    assert set(limited) == set(ends)
    taken = {tp: limited[tp] - begins[tp] for tp in ends}
    lags = {tp: ends[tp] - begins[tp] for tp in ends}
    lagging = [tp for tp in ends if lags[tp] > 0]
    assert all(0 <= taken[tp] <= lags[tp] for tp in ends)
    # never over the limit + the number of partitions with unread records ...
    assert sum(taken.values()) <= max_rows + len(lagging)
    # ... and over it only to give each of them its one record
    assert sum(taken.values()) <= max(max_rows, len(lagging))
    # the whole budget is used while there is something to read
    assert sum(taken.values()) >= min(max_rows, sum(lags.values()))
    # nobody with unread records is starved
    assert all(taken[tp] >= 1 for tp in lagging)
    if marks is None:
        return
    # watermark holders first: a partition gets more than its one record only when every
    # partition with a strictly lower watermark got everything it had
    for tp in lagging:
        if taken[tp] > 1:
            assert all(taken[q] == lags[q] for q in lagging if marks[q] < marks[tp]), (tp, taken)


def test_partitions_a_few_ms_apart_share_the_limit_once_their_pace_is_known():
    # Four partitions at one pace (a record every 4 ms each), watermarks 1 ms apart, p0 far
    # ahead. Strictly lowest first, p1 took everything and the combined watermark (p2's)
    # stood still; raised together, p1..p3 share the limit.
    begins = {("t", i): 0 for i in range(4)}
    ends = {("t", i): 250_000 for i in range(4)}
    marks = {("t", 0): 999_984, ("t", 1): 199_996, ("t", 2): 199_997, ("t", 3): 199_998}
    pace = {tp: 0.25 for tp in ends}
    assert rate_limit(begins, ends, 200_000, marks) == {
        ("t", 0): 1, ("t", 1): 199_997, ("t", 2): 1, ("t", 3): 1}
    assert rate_limit(begins, ends, 200_000, marks, pace) == {
        ("t", 0): 1, ("t", 1): 66_667, ("t", 2): 66_666, ("t", 3): 66_666}


def test_the_lowest_is_raised_to_the_next_before_they_share():
    begins = {("t", 0): 0, ("t", 1): 0, ("t", 2): 0}
    ends = {("t", 0): 10_000, ("t", 1): 10_000, ("t", 2): 10_000}
    # p1 is 100 ms behind p0 at 2 records per ms: its first 200 records only catch up
    marks = {("t", 0): 5_000, ("t", 1): 4_900, ("t", 2): UNDEFINED}
    pace = {("t", 0): 1.0, ("t", 1): 2.0}
    taken = rate_limit(begins, ends, 503, marks, pace)
    # undefined first: p2 takes it all, as before
    assert taken == {("t", 0): 1, ("t", 1): 1, ("t", 2): 501}
    marks[("t", 2)] = 9_000
    taken = rate_limit(begins, ends, 503, marks, pace)
    # 500 to spread: 200 raise p1 to 5,000, then 300 at 3 records per ms: 100 ms more
    assert taken == {("t", 0): 1 + 100, ("t", 1): 1 + 400, ("t", 2): 1}
    # a partition that cannot take its share leaves it to the others of its group; p2
    # (no pace given) still comes after them, by its watermark
    ends[("t", 1)] = 51
    taken = rate_limit(begins, ends, 503, marks, pace)
    assert taken == {("t", 0): 1 + 450, ("t", 1): 51, ("t", 2): 1}


def test_fill_levels_adds_up_exactly_and_respects_what_each_may_take():
    parts = {("t", 0): (0, 1.0, 100), ("t", 1): (10, 1.0, 100)}
    assert fill_levels(parts, 30) == {("t", 0): 20, ("t", 1): 10}
    assert fill_levels(parts, 31) == {("t", 0): 21, ("t", 1): 10} or \
        fill_levels(parts, 31) == {("t", 0): 20, ("t", 1): 11}
    assert fill_levels(parts, 500) == {("t", 0): 100, ("t", 1): 100}
    assert fill_levels(parts, 0) == {("t", 0): 0, ("t", 1): 0}


def test_densities_come_from_the_last_batch_and_the_median_stands_in():
    start = BatchOffset(None, {
        ("t", 0): PartitionRange(100, 300, PartitionState(max_event_ms=1_000)),
        ("t", 1): PartitionRange(50, 51, PartitionState(max_event_ms=1_000)),
        ("t", 2): PartitionRange(0, 40, PartitionState()),             # nothing read before
        ("t", 3): PartitionRange(7, 7, PartitionState(max_event_ms=1_000)),  # read nothing
    })
    states = {("t", 0): PartitionState(max_event_ms=1_100),
              ("t", 1): PartitionState(max_event_ms=1_004),
              ("t", 2): PartitionState(max_event_ms=900),
              ("t", 3): PartitionState(max_event_ms=1_000)}
    known = read_densities(start, states)
    assert known == {("t", 0): 2.0, ("t", 1): 0.25}
    # a partition read from no event time (the first batch): from the lowest it read
    assert read_densities(start, states, {("t", 2): 800})[("t", 2)] == 0.4
    # as the planner's rows: t0..t3, NaN where a partition's is not known
    rows = np.array([known.get(("t", p), np.nan) for p in range(4)])
    assert fill_densities(rows, np.array([True, False, True, False])).tolist() == [
        2.0, 0.0, 2.0, 0.0]
    assert fill_densities(rows, np.array([True, True, False, True])).tolist() == [
        2.0, 0.25, 0.0, 1.125]
    assert fill_densities(rows, np.array([False, False, True, True])) is None


@settings(deadline=None, max_examples=400)
@given(parts=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 2000),
                                st.integers(0, 20_000), st.floats(0.001, 50)),
                      min_size=1, max_size=7),
       max_rows=st.integers(1, 5000))
def test_rate_limit_by_level_properties(parts, max_rows):
    begins = {("t", i): b for i, (b, _, _, _) in enumerate(parts)}
    ends = {("t", i): b + lag for i, (b, lag, _, _) in enumerate(parts)}
    marks = {("t", i): m for i, (_, _, m, _) in enumerate(parts)}
    pace = {("t", i): d for i, (_, _, _, d) in enumerate(parts)}
    limited = rate_limit(begins, ends, max_rows, marks, pace)
    taken = {tp: limited[tp] - begins[tp] for tp in ends}
    lags = {tp: ends[tp] - begins[tp] for tp in ends}
    lagging = [tp for tp in ends if lags[tp] > 0]
    assert all(0 <= taken[tp] <= lags[tp] for tp in ends)
    assert sum(taken.values()) <= max(max_rows, len(lagging))
    assert sum(taken.values()) >= min(max_rows, sum(lags.values()))
    assert all(taken[tp] >= 1 for tp in lagging)
    # the levels reached: a partition given more than its one record ends at most one
    # record's worth above any partition that could have taken more
    level = {tp: marks[tp] + (taken[tp] - 1) / pace[tp] for tp in lagging}
    for tp in lagging:
        if taken[tp] > 1:
            for other in lagging:
                if taken[other] < lags[other]:
                    assert level[tp] <= level[other] + 1 / pace[tp] + 1 / pace[other] + 1e-6, \
                        (tp, other, taken)


# -- watermark alignment (DESIGN §11) -------------------------------------------------------


def test_alignment_holds_partitions_more_than_max_drift_above_the_floor():
    marks = {("t", 0): 3_600_000, ("t", 1): 1_000, ("t", 2): 61_000}
    unread = {("t", 0): 50, ("t", 1): 5, ("t", 2): 7}
    counted = dict.fromkeys(marks, True)
    assert held_by_alignment(marks, unread, counted, 60_000) == {("t", 0)}
    assert held_by_alignment(marks, unread, counted, 59_999) == {("t", 0), ("t", 2)}


def test_a_partition_with_nothing_unread_never_holds_others_back():
    marks = {("t", 0): 3_600_000, ("t", 1): 1_000}
    counted = dict.fromkeys(marks, True)
    assert held_by_alignment(marks, {("t", 0): 50, ("t", 1): 0}, counted, 60_000) == set()
    # nor does an excluded (idle) one
    assert held_by_alignment(marks, {("t", 0): 50, ("t", 1): 9},
                             {("t", 0): True, ("t", 1): False}, 60_000) == set()


def test_an_undefined_watermark_with_unread_records_is_the_lowest():
    marks = {("t", 0): 5_000, ("t", 1): UNDEFINED}
    unread = {("t", 0): 1, ("t", 1): 1}
    counted = dict.fromkeys(marks, True)
    assert held_by_alignment(marks, unread, counted, 10**12) == {("t", 0)}
    both_undefined = {("t", 0): UNDEFINED, ("t", 1): UNDEFINED}
    assert held_by_alignment(both_undefined, unread, counted, 0) == set()


@settings(deadline=None, max_examples=300)
@given(parts=st.lists(st.tuples(st.one_of(st.just(UNDEFINED), st.integers(0, 100)),
                                st.integers(0, 3), st.booleans()), min_size=1, max_size=6),
       drift=st.integers(0, 50))
def test_alignment_never_stalls_and_holds_only_those_too_far_ahead(parts, drift):
    marks = {("t", i): m for i, (m, _, _) in enumerate(parts)}
    unread = {("t", i): n for i, (_, n, _) in enumerate(parts)}
    counted = {("t", i): c for i, (_, _, c) in enumerate(parts)}
    held = held_by_alignment(marks, unread, counted, drift)
    active = [tp for tp in marks if unread[tp] and counted[tp]]
    if active:
        assert set(active) - held           # some partition with unread records reads
    for tp in held:
        assert counted[tp] and unread[tp]
        assert any(marks[q] < marks[tp] - drift for q in active)
    for tp in set(active) - held:
        assert all(marks[tp] - marks[q] <= drift for q in active)


# -- splitting ---------------------------------------------------------------------------


def test_split_range_examples():
    assert split_range(0, 10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert split_range(0, 2, 5) == [(0, 1), (1, 2)]
    assert split_range(5, 5, 3) == [(5, 5)]
    assert split_range(7, 9, 1) == [(7, 9)]
    assert split_range(0, 10, 0) == [(0, 10)]


@settings(deadline=None, max_examples=300)
@given(start=st.integers(0, 10**9), size=st.integers(0, 1000), parts=st.integers(-2, 50))
def test_split_range_covers_contiguously(start, size, parts):
    pieces = split_range(start, start + size, parts)
    assert pieces[0][0] == start and pieces[-1][1] == start + size
    assert all(a[1] == b[0] for a, b in itertools.pairwise(pieces))
    assert len(pieces) == max(1, min(parts, size))
    lengths = [e - s for s, e in pieces]
    assert max(lengths) - min(lengths) <= 1
    if size:
        assert min(lengths) >= 1


def test_plan_splits_without_limits_is_one_task_per_nonempty_partition():
    ranges_ = {("t", 0): (0, 10), ("t", 1): (4, 4), ("t", 2): (3, 5)}
    assert plan_splits(ranges_, None, None, True) == {("t", 0): [(0, 10)], ("t", 2): [(3, 5)]}


def test_plan_splits_min_partitions_is_proportional_to_size():
    assert plan_splits({("t", 0): (0, 100)}, 4, None, True) == {
        ("t", 0): [(0, 25), (25, 50), (50, 75), (75, 100)]}
    assert plan_splits({("t", 0): (0, 30), ("t", 1): (0, 10)}, 4, None, True) == {
        ("t", 0): [(0, 10), (10, 20), (20, 30)], ("t", 1): [(0, 10)]}
    # already enough partitions: nothing is split
    assert plan_splits({("t", 0): (0, 30), ("t", 1): (0, 10)}, 2, None, True) == {
        ("t", 0): [(0, 30)], ("t", 1): [(0, 10)]}


def test_plan_splits_max_records_per_partition():
    assert plan_splits({("t", 0): (0, 10), ("t", 1): (0, 4)}, None, 4, True) == {
        ("t", 0): [(0, 4), (4, 7), (7, 10)], ("t", 1): [(0, 4)]}


def test_plan_splits_never_splits_an_unsplittable_generator():
    assert plan_splits({("t", 0): (0, 100)}, 8, 10, False) == {("t", 0): [(0, 100)]}


@settings(deadline=None, max_examples=300)
@given(sizes=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 500)), min_size=1,
                      max_size=5),
       min_partitions=st.one_of(st.none(), st.integers(1, 20)),
       max_records=st.one_of(st.none(), st.integers(1, 200)),
       splittable=st.booleans())
def test_plan_splits_cover_each_range_without_overlap(sizes, min_partitions, max_records,
                                                       splittable):
    ranges_ = {("t", i): (s, s + n) for i, (s, n) in enumerate(sizes)}
    splits = plan_splits(ranges_, min_partitions, max_records, splittable)
    assert set(splits) == {tp for tp, (s, e) in ranges_.items() if e > s}
    for tp, pieces in splits.items():
        start, end = ranges_[tp]
        assert pieces[0][0] == start and pieces[-1][1] == end
        assert all(a[1] == b[0] for a, b in itertools.pairwise(pieces))
        assert all(e > s for s, e in pieces)
        if not splittable:
            assert pieces == [(start, end)]
        elif max_records:
            assert all(e - s <= max_records for s, e in pieces)
    total = sum(e - s for s, e in ranges_.values())
    if splittable and min_partitions and len(splits) == 1 and total >= min_partitions \
            and not max_records:
        assert sum(len(p) for p in splits.values()) == min_partitions


def test_updating_a_partition_state_is_dataclasses_replace():
    state = PartitionState(generator={"max_ts": 5}, max_event_ms=5, advanced_ms=1,
                           last_read_ms=9, idle="advance", held=True)
    for changes in ({}, {"generator": {"max_ts": 6}, "max_event_ms": 6},
                    {"last_read_ms": 10, "held": False}, {"idle": "count"}):
        updated = state.updated(**changes)
        assert updated == replace(state, **changes) and updated is not state
    assert state == PartitionState(generator={"max_ts": 5}, max_event_ms=5, advanced_ms=1,
                                   last_read_ms=9, idle="advance", held=True)
    with pytest.raises(TypeError, match="max_event"):
        state.updated(max_event=3)


def test_an_updated_state_changes_only_what_is_named():
    state = PartitionState(generator={"max_ts": 5}, last_read_ms=3)
    updated = state.updated(last_read_ms=9, held=True)
    assert updated == PartitionState(generator={"max_ts": 5}, last_read_ms=9, held=True)
    assert state == PartitionState(generator={"max_ts": 5}, last_read_ms=3)
    with pytest.raises(TypeError, match="no field 'lastRead'"):
        state.updated(lastRead=9)


def test_the_columns_quick_constructors_make_the_dataclasses_own_objects():
    """An offset's columns build a partition's range, state and lag without the frozen
    dataclasses' field-by-field ``__init__`` (``partition_columns.OffsetColumns``): what
    they make is equal to the object the dataclass makes, pickles as it does, and stays
    frozen."""
    import dataclasses
    import pickle

    from kwatermark.offsets import PartitionLag
    from kwatermark.partition_columns import OffsetColumns

    state = PartitionState(generator={"max_ts": 5}, max_event_ms=5, last_read_ms=9)
    own = PartitionRange(3, 7, state, PartitionLag(1, 2, 3, 4, 5))
    columns = OffsetColumns.of({("t", 0): own})
    quick = columns.range_at(0)
    for made, expected in ((quick, own), (quick.state, state), (quick.lag, own.lag),
                           (columns.state_at(0), state)):
        assert made == expected and repr(made) == repr(expected)
        assert pickle.loads(pickle.dumps(made)) == expected
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(made, dataclasses.fields(made)[0].name, 0)
