"""watermark.strategy=timelag and the lag observations of every planned offset (DESIGN §13),
through the real planner and reader with a controlled clock; and old offsets."""

from __future__ import annotations

import json

import pytest

from kwatermark import planner as planner_module
from kwatermark.arrow import OutputLayout
from kwatermark.errors import OptionError
from kwatermark.offsets import BatchOffset, PartitionLag
from kwatermark.options import parse_options
from kwatermark.planner import BatchPlanner, ReadLimits
from kwatermark.reader import Decoders
from kwatermark.watermarks import TimeLag, make_generator
from tests.unit.test_progress_model import TOPIC, FakeBroker, read_task

pytestmark = pytest.mark.usefixtures("brokers_answer")

BASE = {"kafka.bootstrap.servers": "fake:9092", "subscribe": "events"}
T0 = 1_800_000_000_000


class Clock:
    def __init__(self, now: int):
        self.now = now

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    fixed = Clock(T0)
    monkeypatch.setattr(planner_module, "now_ms", fixed)
    return fixed


def make_planner(tmp_path, n: int, **extra: str) -> tuple[BatchPlanner, FakeBroker]:
    options = parse_options({"kafka.bootstrap.servers": "fake:9092",
                             "assign": json.dumps({TOPIC: list(range(n))}),
                             "startingOffsets": "earliest",
                             "watermark.stateLocation": str(tmp_path / "ledger"), **extra})
    planner = BatchPlanner(options, OutputLayout(), Decoders())
    broker = FakeBroker([(TOPIC, p) for p in range(n)])
    planner.metadata = broker
    return planner, broker


def run_batch(planner: BatchPlanner, offset: BatchOffset, records: list[list[int]]
              ) -> list:
    rows = []
    for task in planner.tasks(offset):
        task_rows, progress = read_task(planner, task, records[task.partition], 4)
        planner.ledger.publish(task, planner.fingerprint, progress)
        rows += task_rows
    return sorted(rows, key=lambda r: (r.tp, r.offset))


# -- options -----------------------------------------------------------------------------


def test_timelag_needs_max_time_lag_and_max_time_lag_needs_timelag():
    with pytest.raises(OptionError, match="watermark.maxTimeLag is required"):
        parse_options({**BASE, "watermark.strategy": "timelag"})
    with pytest.raises(OptionError, match="watermark.maxTimeLag applies to"):
        parse_options({**BASE, "watermark.maxTimeLag": "5 seconds"})
    with pytest.raises(OptionError, match="watermark.maxTimeLag: cannot parse"):
        parse_options({**BASE, "watermark.strategy": "timelag",
                       "watermark.maxTimeLag": "soon"})
    options = parse_options({**BASE, "watermark.strategy": "TimeLag",
                             "watermark.maxtimelag": "1 minute"})
    assert options.watermark.strategy == "timelag"
    assert options.watermark.max_time_lag_ms == 60_000
    assert isinstance(make_generator(options.watermark), TimeLag)


def test_timelag_generator():
    generator = TimeLag(5_000)
    assert generator.current() is None
    generator.on_event(T0 + 99_999, {})          # event times do not move it
    assert generator.current() is None
    generator.on_plan(T0)
    assert generator.current() == T0 - 5_000
    generator.on_plan(T0 - 1)                     # a clock going back does not lower it
    assert generator.snapshot() == {"planned": T0}
    other = TimeLag(5_000)
    other.restore({"planned": T0 - 10})
    other.merge({"planned": T0})
    assert other.current() == T0 - 5_000


# -- timelag through the planner ---------------------------------------------------------


def test_timelag_rows_carry_planning_time_minus_lag_and_replay_identically(tmp_path, clock):
    planner, broker = make_planner(tmp_path, 2, **{"watermark.strategy": "timelag",
                                                   "watermark.maxTimeLag": "30 seconds"})
    records = [[T0 - 90_000, T0 - 1_000, T0 + 5_000], [T0 - 40_000]]
    offset = planner.initial_offset()
    broker.ends.update({(TOPIC, 0): 2, (TOPIC, 1): 1})
    end = planner.latest_offset(offset, ReadLimits())
    logged = end.dumps()                         # what Spark writes to the offset log
    state = BatchOffset.from_json(json.loads(logged)).partitions[(TOPIC, 0)].state
    assert state.generator == {"planned": T0}
    assert end.watermark == T0 - 30_000
    rows = run_batch(planner, end, records)
    assert [r.watermark for r in rows] == [T0 - 30_000] * 3
    # A replay an hour later, from the logged offset: the same rows.
    clock.now = T0 + 3_600_000
    replayed = run_batch(planner, BatchOffset.from_json(logged), records)
    assert replayed == rows
    # The next batch is planned at the later time; rows move with the clock.
    broker.ends[(TOPIC, 0)] = 3
    following = planner.latest_offset(end, ReadLimits())
    assert following.watermark == T0 + 3_600_000 - 30_000
    assert [r.watermark for r in run_batch(planner, following, records)] == [
        T0 + 3_570_000]


def test_timelag_clock_alone_plans_no_batch(tmp_path, clock):
    planner, broker = make_planner(tmp_path, 1, **{"watermark.strategy": "timelag",
                                                   "watermark.maxTimeLag": "1 second",
                                                   "watermark.heartbeat": "true"})
    broker.ends[(TOPIC, 0)] = 1
    end = planner.latest_offset(planner.initial_offset(), ReadLimits())
    run_batch(planner, end, [[T0]])
    clock.now += 60_000
    # Heartbeat batches carry what records or idle decisions reached, not the clock alone.
    assert planner.latest_offset(end, ReadLimits()) is None


# -- lags, processing-time watermark and holder -----------------------------------------


def test_lags_processing_watermark_and_holder_at_every_planning(tmp_path, clock):
    planner, broker = make_planner(tmp_path, 2)
    records = [[T0 - 10_000 + i for i in range(20)], [T0 - 60_000, T0 - 59_000, T0 - 58_000]]
    offset = planner.initial_offset()
    broker.ends.update({(TOPIC, 0): 20, (TOPIC, 1): 1})
    # batch 0 at T0: p0 gets 10 of its 20 records (read limit), p1 everything it has.
    first = planner.latest_offset(offset, ReadLimits(max_rows=11))
    assert {tp[1]: (r.start, r.end) for tp, r in first.partitions.items()} == {
        0: (0, 10), 1: (0, 1)}
    assert first.planned_ms == T0
    assert first.partitions[(TOPIC, 0)].lag == PartitionLag(None, None, None, None, 20)
    assert first.partitions[(TOPIC, 1)].lag == PartitionLag(None, None, None, None, 1)
    run_batch(planner, first, records)

    clock.now = T0 + 4_000        # batch 1: p0 still has 10 unread, p1 none new
    second = planner.latest_offset(first, ReadLimits())
    p0, p1 = second.partitions[(TOPIC, 0)].lag, second.partitions[(TOPIC, 1)].lag
    # p0 was not read to its end in batch 0: no processing-time watermark yet.
    assert p0 == PartitionLag(T0 - 10_000 + 9 - 1, None, 4_000 + 10_000 - 8, None, 10)
    # p1 is caught up: its processing-time watermark is now, its lag 0; its data is old.
    assert p1 == PartitionLag(T0 - 60_001, T0 + 4_000, 64_001, 0, 0)
    assert second.holder == (TOPIC, 1)          # p1 holds the minimum
    run_batch(planner, second, records)

    clock.now = T0 + 9_000        # batch 2: p1 gets two more, p0 nothing new
    broker.ends[(TOPIC, 1)] = 3
    third = planner.latest_offset(second, ReadLimits())
    p0, p1 = third.partitions[(TOPIC, 0)].lag, third.partitions[(TOPIC, 1)].lag
    assert p0.processing_wm_ms == T0 + 9_000 and p0.processing_lag_ms == 0
    # p1 has unread records now; everything appended before batch 1's planning was read.
    assert p1.processing_wm_ms == T0 + 4_000 and p1.processing_lag_ms == 5_000
    assert p1.unread == 2

    loaded = BatchOffset.from_json(third.dumps())
    assert loaded == third
    data = json.loads(third.dumps())["@kwatermark"]
    assert data["plannedAt"] == T0 + 9_000 and data["holder"] == f"{TOPIC}:1"
    assert loaded.partitions[(TOPIC, 1)].lag == PartitionLag(
        watermark_ms=T0 - 60_001, processing_wm_ms=T0 + 4_000, event_lag_ms=69_001,
        processing_lag_ms=5_000, unread=2)


OLD_OFFSET = {   # written by kwatermark 0.1: no plannedAt, holder or lag
    "v": 1, "watermark": 999,
    "partitions": {
        f"{TOPIC}:0": {"from": 1, "to": 1, "state": {
            "gen": {"max_ts": 1000}, "maxEvent": 1000, "advanced": None,
            "lastRead": T0 - 5_000, "idle": "count"}},
        f"{TOPIC}:1": {"from": 1, "to": 3, "state": {
            "gen": {"max_ts": 1000}, "maxEvent": 1000, "advanced": None,
            "lastRead": T0 - 5_000, "idle": "count"}}}}


def test_an_offset_written_before_lags_existed_still_parses_and_plans(tmp_path, clock):
    old = BatchOffset.from_json(json.dumps(OLD_OFFSET))
    assert old.planned_ms is None and old.holder is None
    assert all(r.lag is None for r in old.partitions.values())
    assert BatchOffset.from_json(old.dumps()) == old     # written back (layout 2) unchanged
    planner, broker = make_planner(tmp_path, 2)
    records = [[1000, 2000, 3000], [1000, 4000, 5000, 6000]]
    run_batch(planner, old, records)              # the restarted query replays it...
    broker.ends.update({(TOPIC, 0): 2, (TOPIC, 1): 4})
    following = planner.latest_offset(old, ReadLimits())   # ...and plans on from it
    assert following.watermark == 999
    # Unread records and no record of earlier plannings: no processing-time watermark yet.
    assert following.partitions[(TOPIC, 1)].lag == PartitionLag(4_999, None, T0 - 4_999, None, 1)
    assert following.holder == (TOPIC, 0)


@pytest.mark.parametrize("lag", [[1], {"wm": "1"}, {"unread": True}])
def test_malformed_lag_fields_name_the_partition(lag):
    data = json.loads(json.dumps(OLD_OFFSET))
    data["partitions"][f"{TOPIC}:0"]["lag"] = lag
    with pytest.raises(Exception, match=f"{TOPIC}:0"):
        BatchOffset.from_json(data)
