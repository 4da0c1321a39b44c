"""Planning ahead of a processing-time trigger (kwatermark.cadence): when Spark has planned at a
regular cadence, the next planning's end offsets are asked, and the batch that ran folded,
just before the tick; the planning then reads up to those ends, takes their asking as its
planning time, and leaves what came after them to the next batch, each record read once.
The brokers' answers, the clock and the timer are faked; the planner is the real one."""

from __future__ import annotations

import logging
from concurrent.futures import Future

import pytest

from kwatermark import cadence
from kwatermark import planner as planner_module
from kwatermark.arrow import OutputLayout
from kwatermark.broker import Ahead
from kwatermark.offsets import BatchOffset
from kwatermark.options import parse_options
from kwatermark.planner import BatchPlanner, ReadLimits
from kwatermark.reader import Decoders
from tests.unit.test_progress_model import TOPIC, FakeBroker, read_task

PARTITIONS = 3


# -- the cadence alone ---------------------------------------------------------------------


# A wall-clock time at a whole second: Spark's ticks are multiples of the interval.
T = 1_796_688_000_000


@pytest.mark.parametrize("calls, tick", [
    ([T, T + 1000, T + 2000, T + 3000], T + 4000),
    ([T + 31, T + 1002, T + 2048, T + 3003], T + 4000),      # each a little after its tick
    ([T + 40, T + 1510, T + 3010, T + 4502], T + 6000),      # a 1.5 s trigger
    ([T + 1, T + 450, T + 905, T + 1350], T + 1800),         # 450 ms
    ([T, T + 60_000, T + 120_020, T + 180_001], T + 240_000),
])
def test_the_next_planning_is_prepared_just_before_the_next_tick(calls, tick):
    at = cadence.prepare_at(calls)
    # LEAD_MS before the tick, give or take the calls' own lateness (at most 60 ms here)
    assert tick - cadence.LEAD_MS - 60 <= at <= tick - cadence.LEAD_MS + 5


@pytest.mark.parametrize("calls", [
    [T, T + 1000, T + 2000],                   # no cadence yet
    [T, T + 1000, T + 2000, T + 2700],         # a batch longer than the interval
    [T, T + 1000, T + 2000, T + 3400],         # a tick's planning very late
    [T, T + 300, T + 600, T + 900],            # shorter than MIN_INTERVAL_MS
    [T, T + 10, T + 20, T + 30],               # the default trigger idling
    [T + 517, T + 1301, T + 1903, T + 2390],   # batches back to back
])
def test_no_cadence_no_preparation(calls):
    assert cadence.prepare_at(calls) is None


def test_a_prepared_answer_plans_only_a_call_soon_after_it():
    assert cadence.fresh(1000, 1000 + cadence.LEAD_MS)
    assert cadence.fresh(1000, 1000 + cadence.FRESH_MS)
    assert not cadence.fresh(1000, 1000 + cadence.FRESH_MS + 1)
    assert not cadence.fresh(1000, 999)


# -- the planner ---------------------------------------------------------------------------


class AnsweringBroker(FakeBroker):
    """Brokers that answer what is asked ahead at once, with the ends of that moment."""

    def __init__(self, tps):
        super().__init__(tps)
        self.asked_ahead = 0

    def ask_ahead(self, tps, ends=True):
        self.asked_ahead += 1
        topics, answer = Future(), Future()
        topics.set_result({TOPIC: len(self.tps)})
        answer.set_result({tp: self.ends[tp] for tp in tps} if ends else None)
        return Ahead(topics, answer)

    def latest_offsets(self, tps, ahead=None):
        answered = (ahead.taken(ahead.ends) if ahead is not None else None) or {}
        return {tp: answered.get(tp, self.ends[tp]) for tp in tps}


class Clock:
    def __init__(self):
        self.ms = T

    def __call__(self) -> int:
        return self.ms


class Timers:
    """threading.Timer as the planner uses it, fired by the test."""

    def __init__(self):
        self.pending: list[Timers.Timer] = []

    def __call__(self, delay, function, args=()):
        timer = Timers.Timer(delay, function, args)
        self.pending.append(timer)
        return timer

    class Timer:
        def __init__(self, delay, function, args):
            self.delay, self.function, self.args = delay, function, args
            self.cancelled = self.fired = False
            self.daemon, self.name = False, ""

        def start(self):
            pass

        def cancel(self):
            self.cancelled = True

        def join(self):
            pass

        def fire(self):
            assert not self.cancelled and not self.fired
            self.fired = True
            self.function(*self.args)


@pytest.fixture
def query(tmp_path, monkeypatch):
    """A planner under a 1 s trigger's cadence: its clock, its timers, its brokers and what
    each partition read, in offset order."""
    clock, timers = Clock(), Timers()
    monkeypatch.setattr(planner_module, "now_ms", clock)
    monkeypatch.setattr(planner_module.threading, "Timer", timers)
    options = parse_options({"kafka.bootstrap.servers": "fake:9092", "subscribe": TOPIC,
                             "startingOffsets": "earliest",
                             "watermark.stateLocation": str(tmp_path)})
    planner = BatchPlanner(options, OutputLayout(), Decoders())
    broker = AnsweringBroker([(TOPIC, p) for p in range(PARTITIONS)])
    planner.metadata = broker
    return planner, broker, clock, timers, {p: [] for p in range(PARTITIONS)}


def produce(broker: FakeBroker, count: int) -> None:
    for tp in broker.tps:
        broker.ends[tp] += count


def plan(planner: BatchPlanner, start: BatchOffset, read: dict[int, list[int]],
         publish: bool = True) -> BatchOffset:
    """One trigger: plan from ``start`` and, with ``publish``, run the batch (its ranges
    read, their progress published) as Spark would before the next trigger."""
    end = planner.latest_offset(start, ReadLimits())
    if end is None:
        return start
    if publish:
        run(planner, end, read)
    return end


def run(planner: BatchPlanner, end: BatchOffset, read: dict[int, list[int]]) -> None:
    for task in planner.tasks(end):
        rows, progress = read_task(planner, task, list(range(1_000, 1_500)), 5)
        planner.ledger.publish(task, planner.fingerprint, progress)
        read[task.partition].extend(row.offset for row in rows)
    planner.commit(end)


def cadenced(planner, broker, clock, read) -> BatchOffset:
    """Four plannings a second apart, records produced before each."""
    offset = planner.initial_offset()
    for tick in (-1000, 0, 1000, 2000):
        clock.ms = T + tick
        produce(broker, 4)
        offset = plan(planner, offset, read)
    return offset


def test_a_planning_prepared_before_the_tick_reads_up_to_what_was_asked_then(query):
    planner, broker, clock, timers, read = query
    offset = cadenced(planner, broker, clock, read)
    [timer] = timers.pending
    assert timer.delay == pytest.approx(0.9)
    produce(broker, 5)                     # before the brokers are asked ahead
    clock.ms = T + 2900
    asked = broker.asked_ahead
    timer.fire()
    assert broker.asked_ahead == asked + 1
    produce(broker, 7)                     # after: the next batch's
    clock.ms = T + 3000
    end = planner.latest_offset(offset, ReadLimits())
    assert end.planned_ms == T + 2900          # the planning time is when the ends were asked
    assert [end.partitions[tp].end for tp in broker.tps] == [21] * PARTITIONS
    assert broker.asked_ahead == asked + 1   # nothing asked again at the tick
    # the next is prepared as long before its tick as this one took (nothing, on this
    # clock), and MARGIN_MS
    assert timers.pending[-1].delay == pytest.approx(
        (1000 - cadence.MIN_LEAD_MS) / 1000)
    run(planner, end, read)
    clock.ms = T + 4000
    later = plan(planner, end, read)
    assert later.planned_ms == T + 4000
    assert [later.partitions[tp].end for tp in broker.tps] == [28] * PARTITIONS
    assert read == {p: list(range(28)) for p in range(PARTITIONS)}   # each record once


def test_a_prepared_answer_too_old_at_the_tick_is_asked_again(query):
    planner, broker, clock, timers, read = query
    offset = cadenced(planner, broker, clock, read)
    clock.ms = T + 2900
    timers.pending[-1].fire()
    produce(broker, 7)
    clock.ms = T + 2900 + cadence.FRESH_MS + 1   # Spark asks late (a pause, a slow sink)
    end = plan(planner, offset, read)
    assert end.planned_ms == clock.ms
    assert [end.partitions[tp].end for tp in broker.tps] == [23] * PARTITIONS
    assert read == {p: list(range(23)) for p in range(PARTITIONS)}


def test_a_tick_earlier_than_expected_calls_the_preparation_off(query):
    planner, broker, clock, timers, read = query
    offset = cadenced(planner, broker, clock, read)
    [timer] = timers.pending
    produce(broker, 3)
    clock.ms = T + 2500
    end = plan(planner, offset, read)
    assert timer.cancelled and not timer.fired
    assert end.planned_ms == T + 2500
    assert read == {p: list(range(19)) for p in range(PARTITIONS)}


def test_no_preparation_without_a_regular_cadence(query):
    planner, broker, clock, timers, read = query
    offset = planner.initial_offset()
    for tick in (0, 1000, 1180, 1190, 1200):   # a batch over its interval, then back to back
        clock.ms = T + tick
        produce(broker, 2)
        offset = plan(planner, offset, read)
    assert timers.pending == []


def test_a_batch_still_running_at_the_preparation_is_not_recomputed_on_the_driver(
        query, caplog):
    planner, broker, clock, timers, read = query
    offset = planner.initial_offset()
    for tick in (-1000, 0, 1000):
        clock.ms = T + tick
        produce(broker, 4)
        offset = plan(planner, offset, read)
    clock.ms = T + 2000
    produce(broker, 4)
    running = plan(planner, offset, read, publish=False)   # its tasks not done at 2900
    produce(broker, 1)
    clock.ms = T + 2900
    with caplog.at_level(logging.INFO, logger="kwatermark.planner"):
        timers.pending[-1].fire()
        assert "recomputed" not in caplog.text and "recomputing" not in caplog.text
        run(planner, running, read)
        clock.ms = T + 3000
        end = plan(planner, running, read)
        assert "recomputed" not in caplog.text and "recomputing" not in caplog.text
    assert end.planned_ms == T + 2900
    assert read == {p: list(range(17)) for p in range(PARTITIONS)}
    # the batch that ran is folded: its records' event times are in the watermark
    assert end.watermark is not None


def test_an_available_now_run_is_not_prepared_for(query):
    planner, broker, clock, timers, read = query
    produce(broker, 30)
    offset = planner.initial_offset()
    planner.prepare_available_now()
    for tick in (0, 1000, 2000, 3000):
        clock.ms = T + tick
        end = planner.latest_offset(offset, ReadLimits(max_rows=9, respect_minimum=True))
        run(planner, end, read)
        offset = end
    assert timers.pending == []
