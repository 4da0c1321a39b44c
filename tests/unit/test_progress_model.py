"""The progress model (DESIGN §4) end to end without a broker: the real planner plans each
micro-batch, the real reader computes every row's watermark, progress flows back through a
real ledger, and an independent plain loop says what the watermark should have been.

Only the broker's answers are faked (which partitions exist, where they end): that is the
input of planning, not part of it.
"""

from __future__ import annotations

import itertools
import json
import tempfile
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kwatermark.arrow import OutputLayout
from kwatermark.broker import Ahead
from kwatermark.offsets import BatchOffset, TopicPartition
from kwatermark.options import parse_options
from kwatermark.planner import BatchPlanner, ReadLimits
from kwatermark.reader import Decoders, RangeReader
from kwatermark.records import RecordBlock

pytestmark = pytest.mark.usefixtures("brokers_answer")

TOPIC = "events"
NO_TIMESTAMP = -1   # a Kafka record without a timestamp: it carries no event time


class FakeBroker:
    """Stands in for KafkaMetadata: the partitions exist from offset 0, and end where the
    test's current batch plan says.

    ``answers_late`` (the ``brokers_answer`` fixture sets it): the end offsets asked ahead
    are still on their way when the planner has folded the last batch, as at thousands of
    partitions, so the planner readies what needs no end offset meanwhile
    (``BatchPlanner._while_asked``); else nothing is asked ahead (fewer partitions)."""

    answers_late = False

    def __init__(self, tps: list[TopicPartition]):
        self.tps = tps
        self.ends = {tp: 0 for tp in tps}
        self.ids = {t: f"id-of-{t}" for t, _ in tps}   # a recreated topic gets a new one

    def assigned_partitions(self, subscription) -> list[TopicPartition]:
        return list(self.tps)

    def coverage(self, subscription, ahead=None) -> tuple[list[TopicPartition], list[str]]:
        return self.assigned_partitions(subscription), []

    def ask_ahead(self, tps, ends=True) -> Ahead | None:
        if not self.answers_late:
            return None   # nothing asked ahead: latest_offsets answers
        return Ahead(Future(), Future())   # never answered: latest_offsets answers

    def latest_offsets(self, tps, ahead=None) -> dict[TopicPartition, int]:
        return {tp: self.ends[tp] for tp in tps}

    def earliest_offsets(self, tps) -> dict[TopicPartition, int]:
        return {tp: 0 for tp in tps}

    def topic_ids(self, topics) -> dict[str, str]:
        return {t: self.ids[t] for t in topics if t in self.ids}


# -- the independent reference ----------------------------------------------------------


def true_partition_wm(timestamps: list[int], bound: int) -> int | None:
    """``max_ts - B - 1`` over the records with an event time; None before the first."""
    seen = [t for t in timestamps if t != NO_TIMESTAMP]
    return max(seen) - bound - 1 if seen else None


def true_minimum(partition_wms: list[int | None]) -> int | None:
    """The combined watermark: null while any partition is undefined."""
    if any(w is None for w in partition_wms):
        return None
    return min(partition_wms)


def le(a: int | None, b: int | None) -> bool:
    """``a <= b`` where None (null, undefined) is below every value."""
    return a is None or (b is not None and a <= b)


# -- scenarios ---------------------------------------------------------------------------


@dataclass
class Scenario:
    strategy: str
    bound: int
    records: list[list[int]]       # per partition: event timestamps in offset order
    batches: list[list[int]]       # per batch: how many next records of each partition
    block_size: int                # records per RecordBlock handed to the reader
    min_partitions: int | None


@st.composite
def scenarios(draw, split: bool) -> Scenario:
    n = draw(st.integers(2, 4))
    strategy = draw(st.sampled_from(["monotonous", "bounded"]))
    bound = draw(st.integers(0, 60)) if strategy == "bounded" else 0
    timestamp = st.integers(-20, 300).map(lambda t: NO_TIMESTAMP if t < 0 else t)
    records = [draw(st.lists(timestamp, min_size=1, max_size=12)) for _ in range(n)]
    n_batches = draw(st.integers(1, 6))
    # Often every partition is read in the first batch, so that most rows carry a value.
    all_start = draw(st.booleans())
    per_partition = []
    for timestamps in records:
        cuts = sorted(draw(st.lists(st.integers(0, len(timestamps)),
                                    min_size=n_batches - 1, max_size=n_batches - 1)))
        if all_start and cuts:
            cuts = sorted([max(cuts[0], 1)] + cuts[1:])
        bounds = [0] + cuts + [len(timestamps)]
        per_partition.append([b - a for a, b in itertools.pairwise(bounds)])
    batches = [[per_partition[p][b] for p in range(n)] for b in range(n_batches)]
    return Scenario(strategy, bound, records, batches, draw(st.integers(1, 5)),
                    draw(st.integers(2, 6)) if split else None)


@dataclass
class Row:
    tp: TopicPartition
    offset: int
    event_time: int | None
    watermark: int | None
    task_start: int


def read_task(planner: BatchPlanner, task, timestamps: list[int], block_size: int
              ) -> tuple[list[Row], object]:
    """What ``source._read`` does for one task, with the records handed over in blocks
    instead of consumed from Kafka."""
    reader = RangeReader(planner.options, planner.layout, planner.decoders, task)
    rows = []
    for first in range(task.start, task.end, block_size):
        last = min(first + block_size, task.end)
        n = last - first
        block = RecordBlock(
            task.topic, task.partition, [None] * n,
            [f"{task.partition}-{o}".encode() for o in range(first, last)],
            np.arange(first, last, dtype=np.int64),
            np.asarray(timestamps[first:last], dtype=np.int64), np.zeros(n, dtype=np.int32))
        batch = reader._process(block)
        offsets = batch.column("offset").to_pylist()
        events = batch.column("event_time").cast(pa.int64()).to_pylist()
        marks = batch.column("watermark").cast(pa.int64()).to_pylist()
        assert offsets == list(range(first, last))
        for offset, event, mark in zip(offsets, events, marks):
            rows.append(Row(task.tp, offset, None if event is None else event // 1000,
                            None if mark is None else mark // 1000, task.start))
    reader.progress = reader._progress()   # as the end of RangeReader.__iter__ does
    return rows, reader.progress


def run(scenario: Scenario, ledger_dir: str) -> None:
    n = len(scenario.records)
    tps = [(TOPIC, p) for p in range(n)]
    raw = {
        "kafka.bootstrap.servers": "fake:9092",
        "assign": json.dumps({TOPIC: list(range(n))}),
        "startingOffsets": "earliest",
        "watermark.strategy": scenario.strategy,
        "watermark.maxOutOfOrderness": f"{scenario.bound} milliseconds",
        "watermark.stateLocation": ledger_dir,
    }
    if scenario.min_partitions:
        raw["minPartitions"] = str(scenario.min_partitions)
    options = parse_options(raw)
    planner = BatchPlanner(options, OutputLayout(), Decoders())
    broker = FakeBroker(tps)
    planner.metadata = broker
    bound = scenario.bound
    records = {(TOPIC, p): scenario.records[p] for p in range(n)}

    offset = planner.initial_offset()
    assert offset.watermark is None
    read = {tp: 0 for tp in tps}               # records of each partition read so far
    previous_rows: list[Row] = []
    for counts in scenario.batches:
        for tp, count in zip(tps, counts):
            broker.ends[tp] = read[tp] + count
        end = planner.latest_offset(BatchOffset.from_json(offset.to_json()), ReadLimits())
        if not any(counts):
            assert end is None                 # no empty batches (DESIGN §4)
            continue
        assert end is not None
        end = BatchOffset.from_json(json.loads(json.dumps(end.to_json())))  # via the log
        assert {tp: (r.start, r.end) for tp, r in end.partitions.items()} == {
            tp: (read[tp], read[tp] + c) for tp, c in zip(tps, counts)}

        # (3) the batch-start watermark is the true minimum over everything read before.
        at_start = {tp: true_partition_wm(records[tp][:read[tp]], bound) for tp in tps}
        boundary = true_minimum(list(at_start.values()))
        assert end.watermark == boundary, (end.watermark, boundary)

        rows: list[Row] = []
        for task in planner.tasks(end):
            task_rows, progress = read_task(planner, task, records[task.tp], scenario.block_size)
            planner.ledger.publish(task, planner.fingerprint, progress)
            replayed, _ = read_task(planner, task, records[task.tp], scenario.block_size)
            assert replayed == task_rows          # a replayed task gives identical rows
            rows += task_rows
        assert sorted((r.tp, r.offset) for r in rows) == sorted(
            (tp, o) for tp, c in zip(tps, counts) for o in range(read[tp], read[tp] + c))

        for row in rows:
            timestamp = records[row.tp][row.offset]
            assert row.event_time == (None if timestamp == NO_TIMESTAMP else timestamp)
            # (2) never above the true minimum: the other partitions as far as earlier
            # batches read them, the row's own partition up to the record before it.
            true_now = true_minimum([
                true_partition_wm(records[q][:row.offset if q == row.tp else read[q]], bound)
                for q in tps])
            assert le(row.watermark, true_now), (row, true_now)
            # DESIGN §2: exactly the combined watermark with the own partition advanced by
            # the records before this row in its task (a split sub-range starts from the
            # batch-start state, DESIGN §4) and the others at the batch start.
            own = true_partition_wm(records[row.tp][:read[row.tp]]
                                    + records[row.tp][row.task_start:row.offset], bound)
            others = [at_start[q] for q in tps if q != row.tp]
            expected = true_minimum([own] + others)
            if boundary is not None:
                expected = boundary if expected is None else max(expected, boundary)
            assert row.watermark == expected, (row, expected)

        # (1) never decreasing: within a task's rows in offset order, and across batches.
        by_task: dict[tuple, list[Row]] = {}
        for row in rows:
            by_task.setdefault((row.tp, row.task_start), []).append(row)
        for task_rows in by_task.values():
            task_rows.sort(key=lambda r: r.offset)
            for before, after in itertools.pairwise(task_rows):
                assert le(before.watermark, after.watermark), (before, after)
        if scenario.min_partitions is None:
            assert len(by_task) == len([c for c in counts if c])
        if previous_rows:
            highest_before = max((r.watermark for r in previous_rows),
                                 key=lambda w: float("-inf") if w is None else w)
            lowest_now = min((r.watermark for r in rows),
                             key=lambda w: float("-inf") if w is None else w)
            assert le(highest_before, lowest_now), (highest_before, lowest_now)

        for tp, c in zip(tps, counts):
            read[tp] += c
        previous_rows = rows
        offset = end

    # After the last batch the folded state is every partition's true state.
    states, _ = planner.fold(BatchOffset.from_json(offset.to_json()))
    for tp in tps:
        seen = [t for t in records[tp][:read[tp]] if t != NO_TIMESTAMP]
        assert (states[tp].generator or {}).get("max_ts") == (max(seen) if seen else None)
        assert states[tp].max_event_ms == (max(seen) if seen else None)
    assert planner.latest_offset(offset, ReadLimits()) is None   # nothing new: no batch


@settings(deadline=None, max_examples=50)
@given(scenario=scenarios(split=False))
def test_progress_model_one_task_per_partition(scenario):
    with tempfile.TemporaryDirectory(prefix="kwatermark-ledger-") as ledger_dir:
        run(scenario, ledger_dir)


@settings(deadline=None, max_examples=30)
@given(scenario=scenarios(split=True))
def test_progress_model_with_split_ranges(scenario):
    """minPartitions splits a partition's range; each sub-range starts from the batch-start
    state (lower, still correct watermarks) and the ledger records are merged (DESIGN §4)."""
    with tempfile.TemporaryDirectory(prefix="kwatermark-ledger-") as ledger_dir:
        run(scenario, ledger_dir)


def drive(records: list[list[int]], batches: list[list[int]], ledger_dir: str,
          **extra: str) -> tuple[list[int | None], list[list[int | None]]]:
    """Each batch's offset watermark and its rows' watermarks, through the real planner."""
    n = len(records)
    tps = [(TOPIC, p) for p in range(n)]
    options = parse_options({"kafka.bootstrap.servers": "fake:9092",
                             "assign": json.dumps({TOPIC: list(range(n))}),
                             "startingOffsets": "earliest",
                             "watermark.stateLocation": ledger_dir, **extra})
    planner = BatchPlanner(options, OutputLayout(), Decoders())
    broker = FakeBroker(tps)
    planner.metadata = broker
    offset = planner.initial_offset()
    starts, marks = [], []
    for counts in batches:
        for tp, count in zip(tps, counts):
            broker.ends[tp] += count
        offset = planner.latest_offset(offset, ReadLimits())
        rows = []
        for task in planner.tasks(offset):
            task_rows, progress = read_task(planner, task, records[task.partition], 10)
            planner.ledger.publish(task, planner.fingerprint, progress)
            rows += task_rows
        starts.append(offset.watermark)
        marks.append([r.watermark for r in sorted(rows, key=lambda r: (r.tp, r.offset))])
    return starts, marks


def test_design_worked_example_through_planner_and_reader(tmp_path):
    """DESIGN §2's example (monotonous, two partitions), values written by hand."""
    records = [[1000, 6000, 6500], [1000, 4000, 5000, 5500]]
    batches = [[1, 1], [0, 2], [1, 0], [1, 1]]
    starts, marks = drive(records, batches, str(tmp_path))
    assert starts == [None, 999, 999, 4999]
    assert marks == [[None, None], [999, 999], [999], [4999, 4999]]
    run(Scenario("monotonous", 0, records, batches, 1, None), str(tmp_path / "property"))


def test_a_partition_that_never_produced_holds_the_watermark_at_null(tmp_path):
    """DESIGN §1: a partition without any record still counts in the minimum."""
    starts, marks = drive([[1000, 2000, 3000], []], [[1, 0], [1, 0], [1, 0]], str(tmp_path))
    assert starts == [None, None, None]
    assert marks == [[None], [None], [None]]


def test_rows_stay_monotonic_when_an_excluded_partition_returns(tmp_path):
    """With caught-up idleness, p0 runs ahead while p1 is excluded; when p1 counts again its
    lower watermark must not pull rows below those of the previous batch: the batch-start
    watermark is floored at the highest row watermark emitted before (DESIGN §2, §4)."""
    records = [[1000, 5000, 6000, 7000], [1000, 2000]]
    batches = [[1, 1], [2, 0], [0, 1], [1, 0]]
    starts, marks = drive(records, batches, str(tmp_path),
                          **{"idle.policy": "caught-up", "idle.timeout": "0"})
    # batch 2: p1 caught up -> excluded; p0's rows see only p0: 999, then 5000 - 1
    # batch 3: p0 caught up -> excluded; p1 alone is at 999, floored at 4999
    # batch 4: p1 excluded again; p0 at 6000 - 1
    assert starts == [None, 999, 4999, 5999]
    assert marks == [[None, None], [999, 4999], [4999], [5999]]


def _stale_leader_planner(tmp_path, poll_timeout_ms: str = "120000"):
    options = parse_options({"kafka.bootstrap.servers": "fake:9092",
                             "assign": json.dumps({TOPIC: [0, 1]}),
                             "startingOffsets": "earliest",
                             "kafkaConsumer.pollTimeoutMs": poll_timeout_ms,
                             "watermark.stateLocation": str(tmp_path)})
    planner = BatchPlanner(options, OutputLayout(), Decoders())
    broker = FakeBroker([(TOPIC, 0), (TOPIC, 1)])
    planner.metadata = broker
    broker.ends = {(TOPIC, 0): 10, (TOPIC, 1): 10}
    return planner, broker, _planned(planner, planner.initial_offset())


def _planned(planner: BatchPlanner, start: BatchOffset) -> BatchOffset:
    """The next batch, its tasks' progress records published as if they had read it."""
    end = planner.latest_offset(start, ReadLimits())
    for task in planner.tasks(end):
        _, progress = read_task(planner, task, list(range(1_000, 1_020)), 5)
        planner.ledger.publish(task, planner.fingerprint, progress)
    return end


def test_an_end_offset_going_back_without_the_topic_recreated_is_a_wait(tmp_path):
    """DESIGN §20: a leader that has not caught up answers below what was read; the plan
    keeps the end it already read for that partition and goes on with the others."""
    planner, broker, first = _stale_leader_planner(tmp_path)
    broker.ends = {(TOPIC, 0): 7, (TOPIC, 1): 12}          # p0 behind: a stale answer
    second = _planned(planner, first)
    assert {tp: (r.start, r.end) for tp, r in second.partitions.items()} == {
        (TOPIC, 0): (10, 10), (TOPIC, 1): (10, 12)}
    broker.ends = {(TOPIC, 0): 15, (TOPIC, 1): 12}         # caught up: read on
    third = planner.latest_offset(second, ReadLimits())
    assert third.partitions[(TOPIC, 0)].start == 10 and third.partitions[(TOPIC, 0)].end == 15


def test_an_end_offset_going_back_in_a_recreated_topic_is_data_loss_at_once(tmp_path):
    import pytest

    from kwatermark.errors import DataLossError

    planner, broker, first = _stale_leader_planner(tmp_path)
    broker.ends = {(TOPIC, 0): 3, (TOPIC, 1): 3}
    broker.ids = {TOPIC: "a-new-id"}                       # deleted and created again
    with pytest.raises(DataLossError, match="went back from 10 to 3"):
        planner.latest_offset(first, ReadLimits())


def test_an_end_offset_that_stays_behind_for_poll_timeout_is_data_loss(tmp_path):
    import time

    import pytest

    from kwatermark.errors import DataLossError

    planner, broker, first = _stale_leader_planner(tmp_path, poll_timeout_ms="1000")
    broker.ends = {(TOPIC, 0): 3, (TOPIC, 1): 10}
    planner.latest_offset(first, ReadLimits())             # a wait, at first
    time.sleep(1.1)
    with pytest.raises(DataLossError, match="went back from 10 to 3"):
        planner.latest_offset(first, ReadLimits())
