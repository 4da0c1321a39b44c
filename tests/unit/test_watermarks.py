"""Generators, assigners and the per-row combined watermark (DESIGN §2), as plain Python."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kwatermark.errors import PluginError
from kwatermark.options import WatermarkConfig, parse_options
from kwatermark.records import RecordBlock
from kwatermark.watermarks import (
    NO_PARTITIONS,
    UNDEFINED,
    BoundedOutOfOrderness,
    FieldAssigner,
    FunctionAssigner,
    KafkaTimestampAssigner,
    NoWatermarks,
    Punctuated,
    can_split,
    combined_watermark,
    current_ms,
    emitted,
    from_optional,
    make_assigner,
    make_generator,
    needs_records,
    restore_generator,
    row_watermarks,
    snapshot_watermark,
    to_optional,
    watermarks_before,
)

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"


@pytest.fixture
def plugins(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))


def block_of(timestamps: list[int], keys: list | None = None, values: list | None = None,
             first_offset: int = 0) -> RecordBlock:
    n = len(timestamps)
    return RecordBlock(
        "events", 0, keys if keys is not None else [None] * n,
        values if values is not None else [b"v"] * n,
        np.arange(first_offset, first_offset + n, dtype=np.int64),
        np.asarray(timestamps, dtype=np.int64), np.zeros(n, dtype=np.int32))


def config(**raw: str) -> WatermarkConfig:
    return parse_options({"kafka.bootstrap.servers": "b:1", "subscribe": "t", **raw}).watermark


# -- built-in generators -------------------------------------------------------------------


def test_bounded_watermark_is_max_minus_bound_minus_one():
    generator = BoundedOutOfOrderness(5000)
    assert generator.current() is None
    generator.on_event(10_000)
    assert generator.current() == 4999
    generator.on_event(8000)          # out of order: no effect
    assert generator.current() == 4999
    generator.on_event(12_000)
    assert generator.current() == 6999


def test_monotonous_is_max_minus_one():
    generator = make_generator(config())
    assert generator.current() is None
    generator.on_event(1000, {})
    assert generator.current() == 999
    generator.on_event(500, {})
    assert generator.current() == 999


def test_bounded_strategy_from_options():
    generator = make_generator(config(**{"watermark.strategy": "bounded",
                                         "watermark.maxOutOfOrderness": "5 seconds"}))
    generator.on_event(10_000, {})
    assert generator.current() == 4999


@settings(deadline=None)
@given(bound=st.integers(0, 10_000), events=st.lists(st.integers(-10**12, 10**12), max_size=40))
def test_bounded_never_decreases_and_follows_the_running_max(bound, events):
    generator = BoundedOutOfOrderness(bound)
    highest = None
    last = None
    for ts in events:
        generator.on_event(ts)
        highest = ts if highest is None else max(highest, ts)
        assert generator.current() == highest - bound - 1
        if last is not None:
            assert generator.current() >= last
        last = generator.current()


@settings(deadline=None)
@given(bound=st.integers(0, 1000), first=st.lists(st.integers(0, 10**6), max_size=20),
       second=st.lists(st.integers(0, 10**6), max_size=20))
def test_bounded_snapshot_restore_and_merge(bound, first, second):
    whole = BoundedOutOfOrderness(bound)
    for ts in first + second:
        whole.on_event(ts)

    head = BoundedOutOfOrderness(bound)
    for ts in first:
        head.on_event(ts)
    restored = BoundedOutOfOrderness(bound)
    restored.restore(json.loads(json.dumps(head.snapshot())))
    assert restored.current() == head.current()
    for ts in second:
        restored.on_event(ts)
    assert restored.current() == whole.current()

    tail = BoundedOutOfOrderness(bound)      # a later sub-range read from a fresh state
    for ts in second:
        tail.on_event(ts)
    head.merge(json.loads(json.dumps(tail.snapshot())))
    assert head.current() == whole.current()


def test_merge_of_an_empty_later_state_changes_nothing():
    generator = BoundedOutOfOrderness(0)
    generator.on_event(100)
    generator.merge({"max_ts": None})
    generator.merge(None)
    assert generator.current() == 99


def test_restore_of_a_fresh_snapshot_is_undefined():
    generator = BoundedOutOfOrderness(0)
    generator.restore(None)
    assert generator.current() is None
    generator.restore({"max_ts": None})
    assert generator.current() is None


def test_none_strategy_never_advances():
    generator = make_generator(config(**{"watermark.strategy": "none"}))
    assert isinstance(generator, NoWatermarks)
    generator.on_event(10**12, {})
    assert generator.current() is None
    before = watermarks_before(generator, np.array([5, 6], dtype=np.int64), block_of([5, 6]))
    assert before.tolist() == [UNDEFINED, UNDEFINED]


def test_punctuated_watermark_is_the_last_marked_event_time():
    generator = Punctuated(lambda record: record["key"] == b"m")
    assert generator.current() is None
    generator.on_event(100, {"key": None})
    assert generator.current() is None
    generator.on_event(200, {"key": b"m"})
    assert generator.current() == 200
    generator.on_event(150, {"key": b"m"})   # an older marker does not move it back
    assert generator.current() == 200
    generator.on_event(300, {"key": b"x"})
    assert generator.current() == 200
    generator.on_event(400, {"key": b"m"})
    assert generator.current() == 400

    restored = Punctuated(generator.predicate)
    restored.restore(json.loads(json.dumps(generator.snapshot())))
    assert restored.current() == 400
    restored.merge({"marker": 350})
    assert restored.current() == 400
    restored.merge({"marker": 500})
    assert restored.current() == 500
    restored.merge({"marker": None})
    assert restored.current() == 500


def test_punctuated_rows_see_the_marker_before_them(plugins):
    generator = make_generator(config(**{"watermark.strategy": "punctuated",
                                         "watermark.punctuation": "kw_test_plugins:is_marker"}))
    keys = [None, b"marker", b"x", b"marker", None]
    block = block_of([100, 200, 300, 150, 500], keys=keys)
    before = watermarks_before(generator, block.timestamps_ms, block)
    assert before.tolist() == [UNDEFINED, UNDEFINED, 200, 200, 200]
    assert generator.current() == 200
    assert needs_records(generator, KafkaTimestampAssigner())


def test_punctuation_that_is_not_callable_fails(plugins):
    with pytest.raises(PluginError, match="watermark.punctuation"):
        make_generator(WatermarkConfig(strategy="punctuated",
                                       punctuation="kw_test_plugins:__doc__"))


# -- vectorised = per-record ------------------------------------------------------------

event_times = st.lists(st.one_of(st.integers(-10**6, 10**6), st.just(UNDEFINED)), max_size=30)


def loop_watermarks(bound: int, start_max: int | None, times: list[int]
                    ) -> tuple[list[int], int | None]:
    """Independent per-record reference: the watermark in force before each record."""
    highest = start_max
    out = []
    for ts in times:
        out.append(UNDEFINED if highest is None else highest - bound - 1)
        if ts != UNDEFINED:
            highest = ts if highest is None else max(highest, ts)
    return out, highest


@settings(deadline=None, max_examples=200)
@given(bound=st.integers(0, 5000), start=st.one_of(st.none(), st.integers(-10**6, 10**6)),
       blocks=st.lists(event_times, min_size=1, max_size=4))
def test_vectorised_watermarks_before_equals_a_per_record_loop(bound, start, blocks):
    generator = BoundedOutOfOrderness(bound)
    generator.restore({"max_ts": start})
    expected, final = loop_watermarks(bound, start, [t for b in blocks for t in b])
    got = []
    for times in blocks:
        array = np.asarray(times, dtype=np.int64)
        got += watermarks_before(generator, array, block_of([0] * len(times))).tolist()
    assert got == expected
    assert generator.snapshot() == {"max_ts": final}


@settings(deadline=None, max_examples=100)
@given(times=event_times)
def test_generic_path_feeds_a_custom_generator_record_by_record(times):
    generator = Recording()
    array = np.asarray(times, dtype=np.int64)
    before = watermarks_before(generator, array, block_of([7] * len(times)))
    expected, _ = loop_watermarks(0, None, times)
    assert before.tolist() == expected
    assert generator.fed == [(t, i) for i, t in enumerate(times) if t != UNDEFINED]


class Recording:
    """A custom generator (no vectorised path) that records what it was fed."""

    def __init__(self):
        self.fed: list[tuple[int, int]] = []
        self.max_ts: int | None = None

    def on_event(self, ts_ms: int, record: dict) -> None:
        self.fed.append((ts_ms, record["offset"]))
        self.max_ts = ts_ms if self.max_ts is None else max(self.max_ts, ts_ms)

    def current(self) -> int | None:
        return None if self.max_ts is None else self.max_ts - 1

    def snapshot(self) -> object:
        return self.max_ts

    def restore(self, snapshot: object) -> None:
        self.max_ts = snapshot


class AnswersText(Recording):
    def current(self) -> object:
        return "soon"


class AnswersBool(Recording):
    def current(self) -> object:
        return True


@pytest.mark.parametrize("cls", [AnswersText, AnswersBool])
def test_a_generator_current_that_is_not_an_int_fails_with_its_class(cls):
    with pytest.raises(PluginError, match=cls.__name__):
        watermarks_before(cls(), np.array([1], dtype=np.int64), block_of([1]))
    with pytest.raises(PluginError, match=cls.__name__):
        current_ms(cls())


# -- user generators ---------------------------------------------------------------------


def test_custom_generator_loaded_from_a_user_module(plugins):
    cfg = config(**{"watermark.strategy": "kw_test_plugins:LaggingGenerator",
                    "watermark.lagMs": "250"})
    generator = make_generator(cfg)
    assert type(generator).__name__ == "LaggingGenerator"
    assert len(generator.options) == 2
    assert generator.options["watermark.strategy"] == "kw_test_plugins:LaggingGenerator"
    assert generator.options["watermark.lagMs"] == "250"
    assert not can_split(generator)           # no merge: never split (DESIGN §4)
    block = block_of([1000, 3000, 2000])
    before = watermarks_before(generator, block.timestamps_ms, block)
    assert before.tolist() == [UNDEFINED, 750, 2750]
    assert generator.current() == 2750

    again = restore_generator(cfg, json.loads(json.dumps(generator.snapshot())))
    assert again.current() == 2750
    assert current_ms(restore_generator(cfg, None)) == UNDEFINED


@pytest.mark.parametrize("strategy, match", [
    ("kw_test_plugins:IncompleteGenerator", "snapshot, restore"),
    ("kw_test_plugins:NoSuchClass", "no attribute"),
    ("kw_no_such_module_anywhere:Gen", "cannot import"),
])
def test_bad_custom_generators_fail_naming_the_option(plugins, strategy, match):
    with pytest.raises(PluginError, match=match) as info:
        make_generator(WatermarkConfig(strategy=strategy))
    assert "watermark.strategy" in str(info.value)


def test_custom_generator_whose_constructor_fails(plugins):
    # LaggingGenerator parses watermark.lagMs as an int.
    cfg = WatermarkConfig(strategy="kw_test_plugins:LaggingGenerator",
                          plugin_options=(("watermark.lagMs", "soon"),))
    with pytest.raises(PluginError, match="failed to construct"):
        make_generator(cfg)


@pytest.mark.parametrize("config", [
    WatermarkConfig("monotonous"), WatermarkConfig("bounded", 5_000), WatermarkConfig("none"),
    WatermarkConfig("timelag", max_time_lag_ms=30_000),
], ids=["monotonous", "bounded", "none", "timelag"])
@given(value=st.one_of(st.none(), st.integers(-2**52, 2**52)))
def test_a_built_in_snapshot_watermark_is_the_restored_generator_one(config, value):
    """The driver reads built-in generators' watermarks straight from their snapshots."""
    of_snapshot = snapshot_watermark(config)
    fed = restore_generator(config, None)
    if value is not None:
        fed.on_event(value)
        if hasattr(fed, "on_plan"):
            fed.on_plan(value)
    for snapshot in (None, {}, fed.snapshot(), {"max_ts": value, "planned": value}):
        assert of_snapshot(snapshot) == current_ms(restore_generator(config, snapshot))


def test_plug_in_and_punctuated_snapshots_need_their_generator(plugins):
    assert snapshot_watermark(WatermarkConfig("kw_test_plugins:LaggingGenerator")) is None
    assert snapshot_watermark(WatermarkConfig(
        "punctuated", punctuation="kw_test_plugins:is_marker")) is None


def test_built_ins_can_split():
    assert can_split(make_generator(WatermarkConfig("monotonous")))
    assert can_split(make_generator(WatermarkConfig("bounded", 10)))
    assert can_split(make_generator(WatermarkConfig("none")))


# -- assigners ---------------------------------------------------------------------------


def test_kafka_timestamp_assigner_marks_missing_timestamps_undefined():
    times, errors = KafkaTimestampAssigner().assign(block_of([1000, -1, 0]))
    assert times.tolist() == [1000, UNDEFINED, 0]
    assert errors is None
    assert isinstance(make_assigner(WatermarkConfig()), KafkaTimestampAssigner)


def test_function_assigner_loaded_from_a_user_module(plugins):
    assigner = make_assigner(config(**{"eventTime.assigner": "kw_test_plugins:value_as_ms"}))
    assert isinstance(assigner, FunctionAssigner)
    times, _ = assigner.assign(block_of([1, 2, 3], values=[b"5000", b"", b"42"]))
    assert times.tolist() == [5000, UNDEFINED, 42]
    assert needs_records(BoundedOutOfOrderness(0), assigner)
    assert not needs_records(BoundedOutOfOrderness(0), KafkaTimestampAssigner())


def test_function_assigner_answering_a_bool_names_the_record(plugins):
    assigner = FunctionAssigner("kw_test_plugins:is_marker")   # answers a bool
    with pytest.raises(PluginError, match="offset 7"):
        assigner.assign(block_of([1], keys=[b"marker"], first_offset=7))


def test_field_assigner_reads_a_dotted_path():
    block = block_of([1, 2, 3, 4])
    block.value_decoded = pa.array([
        {"meta": {"ts": 1000}}, {"meta": {"ts": None}}, None, {"meta": {"ts": 4000}}])
    times, errors = FieldAssigner("meta.ts").assign(block)
    assert times.tolist() == [1000, UNDEFINED, UNDEFINED, 4000]
    assert errors[0] is None and errors[2] is None and errors[3] is None
    assert "meta.ts" in errors[1]


def test_field_assigner_parses_iso_strings_and_timestamps():
    block = block_of([1, 2, 3])
    block.value_decoded = pa.array([{"ts": "1970-01-01T00:00:01Z"},
                                    {"ts": "1970-01-01T00:00:02.5+00:00"},
                                    {"ts": "not a time"}])
    times, errors = FieldAssigner("ts").assign(block)
    assert times.tolist() == [1000, 2500, UNDEFINED]
    assert errors[2] is not None

    block = block_of([1])
    block.value_decoded = pa.array([{"ts": 3_000_000}],
                                   type=pa.struct([("ts", pa.timestamp("us", tz="UTC"))]))
    assert FieldAssigner("ts").assign(block)[0].tolist() == [3000]


def test_field_assigner_with_a_missing_path_reports_it_on_every_row():
    block = block_of([1, 2])
    block.value_decoded = pa.array([{"a": 1}, {"a": 2}])
    times, errors = FieldAssigner("b").assign(block)
    assert times.tolist() == [UNDEFINED, UNDEFINED]
    assert all("'b'" in e for e in errors)


# -- combining ---------------------------------------------------------------------------


def test_combined_watermark_and_emitted():
    assert combined_watermark([3000, 1000, 2000]) == 1000
    assert combined_watermark([3000, UNDEFINED]) == UNDEFINED
    assert combined_watermark([]) == NO_PARTITIONS
    assert emitted(UNDEFINED, 500) == 500
    assert emitted(800, 500) == 800          # never decreases
    assert emitted(800, NO_PARTITIONS) == 800
    assert emitted(UNDEFINED, NO_PARTITIONS) == UNDEFINED
    assert emitted(800, UNDEFINED) == 800


def test_optional_conversions():
    assert to_optional(UNDEFINED) is None
    assert to_optional(NO_PARTITIONS) is None
    assert to_optional(-5) == -5
    assert from_optional(None) == UNDEFINED
    assert from_optional(7) == 7


def rows(own: list[int], others: int, previous: int, counted: bool = True) -> list[int]:
    return row_watermarks(np.asarray(own, dtype=np.int64), others, previous, counted).tolist()


def test_row_watermarks_counted_partition():
    # own partition advances per row; the others are held at 700; floor at previous
    assert rows([UNDEFINED, 500, 900], 700, UNDEFINED) == [UNDEFINED, 500, 700]
    assert rows([UNDEFINED, 500, 900], 700, 600) == [600, 600, 700]
    assert rows([100, 200], UNDEFINED, UNDEFINED) == [UNDEFINED, UNDEFINED]
    assert rows([100, 200], UNDEFINED, 50) == [50, 50]


def test_row_watermarks_only_counted_partition():
    # no other partition counts: the own partition alone decides
    assert rows([UNDEFINED, 500, 900], NO_PARTITIONS, UNDEFINED) == [UNDEFINED, 500, 900]
    assert rows([UNDEFINED, 500], NO_PARTITIONS, 600) == [600, 600]


def test_row_watermarks_excluded_partition():
    # an excluded partition's own progress does not count
    assert rows([UNDEFINED, 500, 900], 700, UNDEFINED, counted=False) == [700, 700, 700]
    assert rows([UNDEFINED, 500], 700, 800, counted=False) == [800, 800]
    # every partition excluded: W holds its last value (null when it never had one)
    assert rows([100, 200], NO_PARTITIONS, 650, counted=False) == [650, 650]
    assert rows([100, 200], NO_PARTITIONS, UNDEFINED, counted=False) == [UNDEFINED, UNDEFINED]


def test_row_watermarks_of_an_empty_block():
    assert rows([], 700, 600) == []


def test_design_worked_example():
    """DESIGN §2: monotonous, two partitions, four micro-batches."""
    p0, p1 = BoundedOutOfOrderness(0), BoundedOutOfOrderness(0)
    emitted_w = UNDEFINED

    def batch(reads: dict) -> list[int | None]:
        nonlocal emitted_w
        start = {0: current_ms(p0), 1: current_ms(p1)}
        emitted_w = emitted(emitted_w, combined_watermark([start[0], start[1]]))
        out = []
        for partition, times in reads.items():
            generator = p0 if partition == 0 else p1
            own = watermarks_before(generator, np.asarray(times, dtype=np.int64),
                                    block_of(times))
            out += [to_optional(v) for v in
                    row_watermarks(own, start[1 - partition], emitted_w, True).tolist()]
        return out

    assert batch({0: [1000], 1: [1000]}) == [None, None]
    assert batch({1: [4000, 5000]}) == [999, 999]
    assert batch({0: [6000]}) == [999]
    assert batch({0: [6500], 1: [5500]}) == [4999, 4999]
