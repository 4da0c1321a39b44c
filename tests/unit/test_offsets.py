"""The checkpointed offset (DESIGN §4) and the pure arithmetic of planning a batch."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kwatermark.offsets import (
    BatchOffset,
    OffsetFormatError,
    PartitionRange,
    PartitionState,
    parse_tp_key,
    plan_splits,
    rate_limit,
    split_range,
    tp_key,
    with_state,
)

# -- the offset's JSON -------------------------------------------------------------------


def test_offset_json_shape_is_the_documented_one():
    offset = BatchOffset(999, {
        ("events", 1): PartitionRange(5, 9, PartitionState(
            generator={"max_ts": 1000}, max_event_ms=1000, advanced_ms=None,
            last_read_ms=123, idle="count")),
        ("events", 0): PartitionRange(0, 0),
    })
    assert offset.to_json() == {
        "v": 1,
        "watermark": 999,
        "partitions": {
            "events:0": {"from": 0, "to": 0, "state": {
                "gen": None, "maxEvent": None, "advanced": None, "lastRead": 0,
                "idle": "count"}},
            "events:1": {"from": 5, "to": 9, "state": {
                "gen": {"max_ts": 1000}, "maxEvent": 1000, "advanced": None, "lastRead": 123,
                "idle": "count"}},
        },
    }
    assert json.loads(offset.dumps()) == offset.to_json()


json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**15, 10**15),
                         st.floats(allow_nan=False), st.text(max_size=8))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=12)

topics = st.text(alphabet="abc-._:/", min_size=1, max_size=8)
states = st.builds(
    PartitionState,
    generator=st.one_of(st.none(), st.fixed_dictionaries({"max_ts": st.one_of(
        st.none(), st.integers(-10**13, 10**13))}), json_values),
    max_event_ms=st.one_of(st.none(), st.integers(-10**13, 10**13)),
    advanced_ms=st.one_of(st.none(), st.integers(-10**13, 10**13)),
    last_read_ms=st.integers(0, 10**13),
    idle=st.sampled_from(["count", "exclude", "advance"]),
)


@st.composite
def ranges(draw):
    start = draw(st.integers(0, 10**12))
    return PartitionRange(start, start + draw(st.integers(0, 10**6)), draw(states))


offsets = st.builds(
    BatchOffset,
    watermark=st.one_of(st.none(), st.integers(-10**13, 10**13)),
    partitions=st.dictionaries(st.tuples(topics, st.integers(0, 1000)), ranges(), max_size=5),
)


@settings(deadline=None, max_examples=200)
@given(offset=offsets)
def test_offset_round_trips_through_json(offset):
    assert BatchOffset.from_json(offset.to_json()) == offset
    assert BatchOffset.from_json(offset.dumps()) == offset
    assert BatchOffset.from_json(json.loads(offset.dumps())).dumps() == offset.dumps()


def test_topic_names_with_colons_keep_their_partition():
    assert parse_tp_key(tp_key(("ns:events", 3))) == ("ns:events", 3)


@pytest.mark.parametrize("key", ["events", ":3", "events:", "events:x", "events:--1",
                                 "events:-1", "events:²", "events:1.0", "events: 1"])
def test_bad_partition_keys_are_named(key):
    with pytest.raises(OffsetFormatError) as info:
        BatchOffset.from_json({"partitions": {key: {"from": 0, "to": 1}}})
    assert repr(key) in str(info.value)


@pytest.mark.parametrize("entry", [
    {"from": 5, "to": 2},
    {"from": -1, "to": 2},
    {"from": "0", "to": 2},
    {"from": 0, "to": 2.0},
    {"from": True, "to": 2},
    {"to": 2},
    {"from": 0},
    "0-2",
    [0, 2],
    None,
    {"from": 0, "to": 1, "state": "fresh"},
    {"from": 0, "to": 1, "state": None},
    {"from": 0, "to": 1, "state": {"idle": "sleepy"}},
    {"from": 0, "to": 1, "state": {"maxEvent": "1000"}},
    {"from": 0, "to": 1, "state": {"advanced": 1.5}},
    {"from": 0, "to": 1, "state": {"lastRead": False}},
])
def test_bad_partition_entries_name_the_partition(entry):
    with pytest.raises(OffsetFormatError) as info:
        BatchOffset.from_json({"watermark": None, "partitions": {"events:7": entry}})
    assert "events:7" in str(info.value)


@pytest.mark.parametrize("data", [
    "{not json", "[]", "null", "42", {}, {"partitions": []}, {"partitions": None},
    {"partitions": {}, "v": 2}, {"partitions": {}, "watermark": "soon"},
    {"partitions": {}, "watermark": 1.5},
    {"topic": {"0": 5}},  # Spark's own Kafka offset: another source's checkpoint
])
def test_malformed_offsets_raise_offset_format_error(data):
    with pytest.raises(OffsetFormatError, match="offset"):
        BatchOffset.from_json(data)


def test_missing_state_is_a_fresh_partition():
    offset = BatchOffset.from_json({"partitions": {"events:0": {"from": 3, "to": 3}}})
    assert offset == BatchOffset(None, {("events", 0): PartitionRange(3, 3, PartitionState())})


partition_keys = st.one_of(st.text(alphabet="ab:-019²٣ .", max_size=6), st.text(max_size=6))
entries = st.one_of(
    json_values,
    st.fixed_dictionaries({"from": json_values, "to": json_values}),
    st.fixed_dictionaries({"from": st.integers(-2, 5), "to": st.integers(-2, 5)},
                          optional={"state": st.one_of(json_values, st.fixed_dictionaries(
                              {}, optional={"gen": json_values, "maxEvent": json_values,
                                            "advanced": json_values, "lastRead": json_values,
                                            "idle": st.one_of(st.sampled_from(
                                                ["count", "exclude", "advance"]),
                                                json_values)}))}),
)
near_offsets = st.one_of(
    json_values,
    st.fixed_dictionaries({"partitions": st.dictionaries(partition_keys, entries, max_size=3)},
                          optional={"v": json_values, "watermark": json_values}),
)


@settings(deadline=None, max_examples=400)
@given(data=st.one_of(near_offsets, near_offsets.map(json.dumps), st.text(max_size=40)))
def test_from_json_raises_only_offset_format_error(data):
    try:
        offset = BatchOffset.from_json(data)
    except OffsetFormatError as exc:
        assert str(exc).startswith("offset")
    else:
        assert isinstance(offset, BatchOffset)
        assert BatchOffset.from_json(offset.to_json()) == offset


def test_with_state_changes_one_partition():
    offset = BatchOffset(5, {("t", 0): PartitionRange(0, 4), ("t", 1): PartitionRange(2, 3)})
    changed = with_state(offset, ("t", 1), idle="exclude", last_read_ms=77)
    assert changed.partitions[("t", 1)] == PartitionRange(
        2, 3, PartitionState(idle="exclude", last_read_ms=77))
    assert changed.partitions[("t", 0)] == offset.partitions[("t", 0)]
    assert offset.partitions[("t", 1)].state == PartitionState()   # the original is unchanged


# -- rate limit --------------------------------------------------------------------------


def test_rate_limit_splits_in_proportion_to_lag():
    begins = {("t", 0): 0, ("t", 1): 10}
    ends = {("t", 0): 300, ("t", 1): 110}
    assert rate_limit(begins, ends, 100) == {("t", 0): 75, ("t", 1): 35}


def test_rate_limit_gives_leftover_rows_to_largest_remainders_then_order():
    begins = {("t", 0): 0, ("t", 1): 0, ("t", 2): 0}
    ends = {("t", 0): 1, ("t", 1): 1, ("t", 2): 1}
    # shares 2/3 each: floors 0, two rows left, ties broken by topic/partition order
    assert rate_limit(begins, ends, 2) == {("t", 0): 1, ("t", 1): 1, ("t", 2): 0}
    # shares 7*[5,3,2]/10 = 3.5, 2.1, 1.4: floors 3, 2, 1, one row left -> largest remainder
    ends = {("t", 0): 5, ("t", 1): 3, ("t", 2): 2}
    assert rate_limit(begins, ends, 7) == {("t", 0): 4, ("t", 1): 2, ("t", 2): 1}


def test_rate_limit_small_shares_do_not_overshoot():
    # Spark rounds each tiny share up to 1 and reads 3 rows; the limit here is exact.
    begins = {("t", 0): 0, ("t", 1): 0, ("t", 2): 0}
    ends = {("t", 0): 1000, ("t", 1): 1, ("t", 2): 1}
    assert rate_limit(begins, ends, 1) == {("t", 0): 1, ("t", 1): 0, ("t", 2): 0}


def test_rate_limit_under_the_limit_reads_everything():
    begins = {("t", 0): 0, ("t", 1): 5}
    ends = {("t", 0): 3, ("t", 1): 5}
    assert rate_limit(begins, ends, 10) == ends


@settings(deadline=None, max_examples=300)
@given(lags=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 2000)), min_size=1,
                     max_size=6),
       max_rows=st.integers(1, 5000))
def test_rate_limit_properties(lags, max_rows):
    begins = {("t", i): b for i, (b, _) in enumerate(lags)}
    ends = {("t", i): b + lag for i, (b, lag) in enumerate(lags)}
    limited = rate_limit(begins, ends, max_rows)
    assert set(limited) == set(ends)
    taken = {tp: limited[tp] - begins[tp] for tp in ends}
    assert all(begins[tp] <= limited[tp] <= ends[tp] for tp in ends)
    total_lag = sum(lag for _, lag in lags)
    assert sum(taken.values()) == min(max_rows, total_lag)
    if total_lag > max_rows:
        for tp, end in ends.items():
            share = max_rows * (end - begins[tp]) / total_lag
            assert abs(taken[tp] - share) < 1


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
