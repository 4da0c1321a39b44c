"""The checkpointed offset (DESIGN §4) and the pure arithmetic of planning a batch."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kwatermark.offsets import (
    BatchOffset,
    OffsetFormatError,
    PartitionLag,
    PartitionRange,
    PartitionState,
    fill_densities,
    fill_levels,
    held_by_alignment,
    parse_tp_key,
    plan_splits,
    rate_limit,
    read_densities,
    split_range,
    tp_key,
    with_state,
)

# -- the offset's JSON -------------------------------------------------------------------


def test_offset_json_is_sparks_kafka_offsets_plus_the_state_in_columns():
    offset = BatchOffset(999, {
        ("events", 1): PartitionRange(5, 9, PartitionState(
            generator={"max_ts": 1000}, max_event_ms=1000, advanced_ms=None,
            last_read_ms=123, idle="count")),
        ("events", 0): PartitionRange(0, 0),
        ("events", 10): PartitionRange(3, 4, PartitionState(
            generator={"max_ts": 1500}, max_event_ms=1500, last_read_ms=123, idle="exclude")),
    }, planned_ms=2000, holder=("events", 1))
    assert offset.to_json() == {
        # Spark's Kafka source's offsets: each partition's next offset to read
        "events": {"0": 0, "1": 9, "10": 4},
        "@kwatermark": {
            "v": 2, "watermark": 999, "plannedAt": 2000, "holder": "events:1",
            "topics": {"events": {
                "read": [0, 4, 1],                              # from = to - read
                "genKeys": ["max_ts"], "gen": [None, 1, 1],     # 1: a {"max_ts": ...}
                "gen.max_ts": [None, 1000, 1500],
                "maxEvent": [None, 1000, 1500],
                "lastRead": [0, 123, 123],
                "idle": ["count", "count", "exclude"],
                # advanced null, held false, no lag: the defaults, not written
            }},
        },
    }
    assert json.loads(offset.dumps()) == offset.to_json()
    assert BatchOffset.from_json(offset.dumps()) == offset


def test_columns_take_their_shortest_form():
    n = 300
    partitions = {("t", p): PartitionRange(
        100 + p, 110 + p, PartitionState(generator={"max_ts": 1_700_000_000_000 + p},
                                         max_event_ms=1_700_000_000_000 + p,
                                         last_read_ms=77),
        # planned at 1,000: eventLag = 1,000 - wm, procLag = 1,000 - procWm
        PartitionLag(1_699_999_994_999 + p, 50, 1_000 - (1_699_999_994_999 + p), 950,
                     10 if p != 7 else 12))
        for p in range(n)}
    offset = BatchOffset(5, partitions, planned_ms=1_000)
    columns = offset.to_json()["@kwatermark"]["topics"]["t"]
    assert columns["read"] == 10 and columns["gen"] == 1 and columns["lastRead"] == 77
    assert columns["gen.max_ts"] == {"d": [1_700_000_000_000] + [1] * (n - 1)}
    assert columns["maxEvent"] == {"of": "gen.max_ts", "plus": 0}
    assert columns["wm"] == {"of": "maxEvent", "plus": -5_001}
    assert columns["unread"] == {"else": 10, "at": {"7": 12}}
    assert columns["procWm"] == 50
    assert "eventLag" not in columns and "procLag" not in columns   # plannedAt - wm, - procWm
    assert BatchOffset.from_json(offset.dumps()) == offset


def spark_kafka_offsets(offset: BatchOffset) -> str:
    """What Spark's Kafka source writes for the same partitions (JsonUtils.partitionOffsets)."""
    by_topic: dict = {}
    for (topic, partition), r in sorted(offset.partitions.items()):
        by_topic.setdefault(topic, {})[str(partition)] = r.end
    return json.dumps(by_topic, separators=(",", ":"))


@pytest.mark.parametrize("partitions,topics", [(4096, 1), (4096, 16), (512, 1), (64, 16)])
def test_a_planned_offset_is_within_3x_of_sparks_kafka_offsets(partitions, topics):
    """DESIGN §21: ten records per partition and batch, event times 1 ms apart across the
    topic (bench/bench_partitions.py's data), as the planner writes it."""
    per_topic = partitions // topics
    base, planned = 1_700_000_000_000, 1_700_000_100_000
    ranges = {}
    for t in range(topics):
        for p in range(per_topic):
            high = base + 9 * per_topic + p
            ranges[(f"sweep-{t:02d}-5c1d8e", p)] = PartitionRange(
                1_000, 1_010, PartitionState(generator={"max_ts": high}, max_event_ms=high,
                                             last_read_ms=planned - 1_000),
                PartitionLag(high - 5_001, planned - 1_000, planned - high + 5_001, 1_000, 10))
    offset = BatchOffset(base - 5_001, ranges, planned_ms=planned,
                         holder=("sweep-00-5c1d8e", 0))
    ours = len(json.dumps(offset.to_json()))     # as pyspark sends it (default separators)
    assert ours <= 3 * len(spark_kafka_offsets(offset))
    assert BatchOffset.from_json(json.dumps(offset.to_json())) == offset


def test_columns_alike_in_every_topic_are_written_once():
    """Four partitions in each of three topics, with the state a bounded generator leaves:
    what says every topic's column (a value, another column plus a constant) is written
    once under "every"; the event times, which differ, stay with their topic."""
    def partition(t: int, p: int) -> PartitionRange:
        high = 1_000_000 + 100 * t + p
        return PartitionRange(50, 60, PartitionState(generator={"max_ts": high},
                                                     max_event_ms=high, last_read_ms=900),
                              PartitionLag(high - 5_001, 999, 1_000 - high + 5_001, 1, 10))
    offset = BatchOffset(994_999, {(f"t{t}", p): partition(t, p) for t in range(3)
                                   for p in range(4)}, planned_ms=1_000)
    own = offset.to_json()["@kwatermark"]
    assert own["every"] == {"read": 10, "genKeys": ["max_ts"], "gen": 1,
                            "maxEvent": {"of": "gen.max_ts", "plus": 0}, "lastRead": 900,
                            "lag": True, "wm": {"of": "maxEvent", "plus": -5_001},
                            "procWm": 999, "unread": 10}
    assert own["topics"] == {f"t{t}": {"gen.max_ts": {"d": [1_000_000 + 100 * t, 1, 1, 1]}}
                             for t in range(3)}
    assert BatchOffset.from_json(offset.dumps()) == offset


def test_a_layout_2_offset_with_each_topic_s_columns_in_full_still_reads():
    """What kwatermark wrote before "every" (each topic all its columns) restores the same
    state as what it writes now, and a topic's own column wins over "every"'s."""
    before = {"a": {"0": 9, "1": 9}, "b": {"0": 7}, "@kwatermark": {
        "v": 2, "watermark": 3, "plannedAt": 100, "topics": {
            "a": {"read": 2, "genKeys": ["max_ts"], "gen": 1, "gen.max_ts": [5, 6],
                  "maxEvent": {"of": "gen.max_ts", "plus": 0}, "lastRead": 90},
            "b": {"read": 2, "genKeys": ["max_ts"], "gen": 1, "gen.max_ts": 4,
                  "maxEvent": {"of": "gen.max_ts", "plus": 0}, "lastRead": 80}}}}
    parsed = BatchOffset.from_json(before)
    expected = {("a", 0): (7, 9, 5, 90), ("a", 1): (7, 9, 6, 90), ("b", 0): (5, 7, 4, 80)}
    assert parsed == BatchOffset(3, {tp: PartitionRange(start, end, PartitionState(
        generator={"max_ts": high}, max_event_ms=high, last_read_ms=read))
        for tp, (start, end, high, read) in expected.items()}, planned_ms=100)
    now = json.loads(parsed.dumps())["@kwatermark"]
    assert now["every"] == {"read": 2, "genKeys": ["max_ts"], "gen": 1,
                            "maxEvent": {"of": "gen.max_ts", "plus": 0}}
    assert now["topics"] == {"a": {"gen.max_ts": [5, 6], "lastRead": 90},
                             "b": {"gen.max_ts": 4, "lastRead": 80}}
    overridden = json.loads(parsed.dumps())
    overridden["@kwatermark"]["topics"]["b"]["read"] = 1
    assert BatchOffset.from_json(overridden).partitions[("b", 0)].start == 6


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
    held=st.booleans(),
)


optional_ms = st.one_of(st.none(), st.integers(-10**13, 10**13))
lags = st.one_of(st.none(), st.builds(PartitionLag, optional_ms, optional_ms, optional_ms,
                                      optional_ms, st.one_of(st.none(), st.integers(0, 10**6))))


@st.composite
def ranges(draw):
    start = draw(st.integers(0, 10**12))
    return PartitionRange(start, start + draw(st.integers(0, 10**6)), draw(states), draw(lags))


offsets = st.builds(
    BatchOffset,
    watermark=optional_ms,
    partitions=st.dictionaries(st.tuples(topics, st.integers(0, 1000)), ranges(), max_size=8),
    heartbeat=st.booleans(),
    planned_ms=optional_ms,
    holder=st.one_of(st.none(), st.tuples(topics, st.integers(0, 1000))),
)


@settings(deadline=None, max_examples=200)
@given(offset=offsets)
def test_offset_round_trips_through_json(offset):
    assert BatchOffset.from_json(offset.to_json()) == offset
    assert BatchOffset.from_json(offset.dumps()) == offset
    assert BatchOffset.from_json(json.loads(offset.dumps())).dumps() == offset.dumps()


# Columns of 64 partitions and more are compared as int64 arrays where they can be
# (offset_columns.Column): values beside int64's range, nulls, equal runs and mixed types
# must come back exactly.
wide_ints = st.one_of(st.integers(-10**13, 10**13), st.integers(2**62 - 2, 2**62 + 2),
                      st.integers(-2**63 - 2, -2**63 + 2), st.integers(2**64, 2**64 + 2))


@st.composite
def wide_offsets(draw):
    n = draw(st.sampled_from([64, 65, 200]))
    pattern = draw(st.sampled_from(["equal", "step", "mostly", "any"]))
    base = draw(wide_ints)
    step = draw(st.integers(-3, 3))

    def ms(p: int) -> int | None:
        if pattern == "equal":
            return base
        if pattern == "step":
            return base + step * p
        if pattern == "mostly":
            return base if draw(st.integers(0, 9)) else draw(st.one_of(st.none(), wide_ints))
        return draw(st.one_of(st.none(), wide_ints))

    partitions = {}
    for p in range(n):
        high = ms(p)
        partitions[("t", p)] = PartitionRange(
            5 + p, 5 + p + draw(st.sampled_from([0, 2, 3])),
            PartitionState(generator=None if high is None else {"max_ts": high},
                           max_event_ms=high, advanced_ms=ms(p),
                           last_read_ms=draw(st.sampled_from([0, 77]))),
            PartitionLag(None if high is None else high - 5_001, ms(p), ms(p), None,
                         draw(st.sampled_from([0, 10]))))
    return BatchOffset(draw(optional_ms), partitions, planned_ms=draw(optional_ms))


@settings(deadline=None, max_examples=150)
@given(offset=wide_offsets())
def test_wide_columns_round_trip_through_json(offset):
    assert BatchOffset.from_json(json.loads(offset.dumps())) == offset


@st.composite
def alike_topics(draw):
    """Several topics whose partitions' states follow one pattern, each topic shifted by its
    own constant or not at all (the columns "every" may hold), some partitions fresh."""
    pattern = draw(st.lists(st.tuples(st.integers(0, 3), st.integers(-5, 5), st.booleans()),
                            min_size=1, max_size=4))
    partitions = {}
    for t in range(draw(st.integers(2, 4))):
        shift = draw(st.sampled_from([0, 0, 7, -10**12]))
        width = draw(st.integers(1, len(pattern)))
        for p, (read, step, fresh) in enumerate(pattern[:width]):
            high = None if fresh and draw(st.booleans()) else 10**12 + shift + step
            partitions[(f"topic-{t}", p)] = PartitionRange(
                100, 100 + read + draw(st.sampled_from([0, 0, 1])), PartitionState(
                    generator=None if high is None else {"max_ts": high}, max_event_ms=high,
                    last_read_ms=draw(st.sampled_from([0, 50])) + (shift % 3),
                    idle=draw(st.sampled_from(["count", "count", "exclude"]))),
                None if high is None else PartitionLag(high - 1, 40, draw(optional_ms), None,
                                                       read))
    return BatchOffset(draw(optional_ms), partitions, planned_ms=draw(optional_ms))


@settings(deadline=None, max_examples=300)
@given(offset=alike_topics())
def test_topics_alike_round_trip_through_json(offset):
    data = json.loads(offset.dumps())
    assert BatchOffset.from_json(data) == offset
    for name in data["@kwatermark"].get("every", {}):
        assert all(name not in columns for columns in data["@kwatermark"].get(
            "topics", {}).values())


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
    {"from": 0, "to": 1, "state": {"held": "yes"}},
    {"from": 0, "to": 1, "state": {"held": 1}},
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


def test_held_is_written_only_when_true_and_old_offsets_without_it_parse():
    held = BatchOffset(5, {("events", 0): PartitionRange(7, 7, PartitionState(held=True))})
    assert held.to_json()["@kwatermark"]["topics"]["events"]["held"] is True
    assert BatchOffset.from_json(held.dumps()) == held
    old = {"v": 1, "watermark": 5, "partitions": {"events:0": {"from": 7, "to": 9, "state": {
        "gen": {"max_ts": 6}, "maxEvent": 6, "advanced": None, "lastRead": 1, "idle": "count"}}}}
    parsed = BatchOffset.from_json(old)
    assert parsed == BatchOffset(5, {("events", 0): PartitionRange(7, 9, PartitionState(
        generator={"max_ts": 6}, max_event_ms=6, last_read_ms=1))})
    assert BatchOffset.from_json(parsed.dumps()) == parsed


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
    assert fill_densities(known, [("t", 0), ("t", 2)]) == {("t", 0): 2.0, ("t", 2): 2.0}
    assert fill_densities(known, [("t", 0), ("t", 1), ("t", 3)]) == {
        ("t", 0): 2.0, ("t", 1): 0.25, ("t", 3): 1.125}
    assert fill_densities(known, [("t", 2), ("t", 3)]) == {}


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


column_names = st.sampled_from(["read", "gen", "genKeys", "gen.max_ts", "maxEvent", "advanced",
                                "lastRead", "idle", "held", "lag", "wm", "procWm", "unread",
                                "eventLag", "procLag", "other"])
column_values = st.one_of(json_values, st.fixed_dictionaries({"d": json_values}),
                          st.fixed_dictionaries({"of": column_names, "plus": json_values}),
                          st.fixed_dictionaries({"else": json_values, "at": json_values}))


@settings(deadline=None, max_examples=400)
@given(offset=offsets, name=column_names, value=column_values, ends=json_values)
def test_a_damaged_layout_2_offset_raises_only_offset_format_error(offset, name, value, ends):
    data = json.loads(offset.dumps())
    for columns in [*data["@kwatermark"].get("topics", {}).values(),
                    data["@kwatermark"].setdefault("every", {})]:
        columns[name] = value
    topic = next((t for t in data if t != "@kwatermark"), None)
    if topic is not None and isinstance(ends, dict):
        data[topic] = ends
    try:
        parsed = BatchOffset.from_json(data)
    except OffsetFormatError as exc:
        assert str(exc).startswith("offset")
    else:
        assert BatchOffset.from_json(parsed.dumps()) == parsed


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
