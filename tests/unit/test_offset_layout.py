"""The offset's JSON (DESIGN §4, §21: kwatermark.offset_layout and offset_columns): Spark's
Kafka offsets plus the state in columns, its sizes, and what it reads back."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kwatermark.offsets import (
    BatchOffset,
    OffsetFormatError,
    PartitionLag,
    PartitionRange,
    PartitionState,
    parse_tp_key,
    tp_key,
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


@settings(max_examples=300, deadline=None)
@given(values=st.lists(st.one_of(st.none(), st.integers(-2 ** 62 + 1, 2 ** 62 - 1),
                                 st.integers(-1_000, 1_000), st.sampled_from([0, 9, 10, -10])),
                       min_size=64, max_size=200))
def test_a_columns_json_length_is_known_without_writing_it(values):
    """A long column of ints and nulls is not written to JSON to learn how long each of its
    forms is (a list, differences, one value but for some partitions): the lengths numpy counts are exactly JSON's, so the
    shortest form chosen is the one writing every candidate would choose."""
    from kwatermark.offset_columns import (
        Column,
        _deltas,
        _deltas_length,
        _list_length,
        _most_common,
        _sparse,
        _sparse_length,
    )

    column = Column(values)
    if column.masked is None:   # no int at all: written and measured, as before
        assert all(v is None for v in values)
        return
    assert _list_length(column) == len(json.dumps(values, separators=(",", ":")))
    assert _deltas_length(column) == len(json.dumps({"d": _deltas(column)},
                                                    separators=(",", ":")))
    partitions = [p * 7 for p in range(len(values))]   # not their places: keys of any width
    for common in (_most_common(column)[0], None, 0, values[0]):
        assert _sparse_length(column, partitions, common) == len(json.dumps(
            _sparse(column, partitions, common), separators=(",", ":"))), common
