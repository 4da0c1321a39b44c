"""Admission control through the real planner (DESIGN §11): the read limit serves the
watermark holders first without starving anyone, and watermark alignment pauses partitions
too far ahead. Only the broker's answers are faked (tests/unit/test_progress_model.py)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import ClassVar

import pytest

from kwatermark.arrow import OutputLayout
from kwatermark.offsets import BatchOffset
from kwatermark.options import parse_options
from kwatermark.planner import BatchPlanner, ReadLimits
from kwatermark.reader import Decoders
from tests.unit.test_progress_model import TOPIC, FakeBroker, read_task

pytestmark = pytest.mark.usefixtures("brokers_answer")

HOUR = 3_600_000


@dataclass
class Run:
    """Each planned batch: ``{partition: (from, to, held)}``, its offset JSON, and the rows
    read, as (partition, offset, event time, row watermark)."""

    plans: list[dict[int, tuple[int, int, bool]]] = field(default_factory=list)
    offsets: list[str] = field(default_factory=list)
    rows: list[list[tuple[int, int, int, int | None]]] = field(default_factory=list)


def planner_for(records: list[list[int]], ledger: str, **extra: str
                ) -> tuple[BatchPlanner, FakeBroker]:
    n = len(records)
    options = parse_options({"kafka.bootstrap.servers": "fake:9092",
                             "assign": json.dumps({TOPIC: list(range(n))}),
                             "startingOffsets": "earliest",
                             "watermark.stateLocation": ledger, **extra})
    planner = BatchPlanner(options, OutputLayout(), Decoders())
    broker = FakeBroker([(TOPIC, p) for p in range(n)])
    for p, timestamps in enumerate(records):
        broker.ends[(TOPIC, p)] = len(timestamps)
    planner.metadata = broker
    return planner, broker


def run(planner: BatchPlanner, records: list[list[int]], max_rows: int | None,
        offset: BatchOffset | None = None, batches: int = 1000, run: Run | None = None
        ) -> tuple[Run, BatchOffset]:
    """Plan and read batches until nothing is left (or ``batches`` of them)."""
    run = run or Run()
    offset = offset or planner.initial_offset()
    for _ in range(batches):
        end = planner.latest_offset(BatchOffset.from_json(offset.dumps()),
                                    ReadLimits(max_rows=max_rows))
        if end is None:
            break
        end = BatchOffset.from_json(end.dumps())   # through the offset log, as Spark does
        run.plans.append({tp[1]: (r.start, r.end, r.state.held)
                          for tp, r in end.partitions.items()})
        run.offsets.append(end.dumps())
        rows = []
        for task in planner.tasks(end):
            task_rows, progress = read_task(planner, task, records[task.partition], 50)
            planner.ledger.publish(task, planner.fingerprint, progress)
            rows += [(r.tp[1], r.offset, r.event_time, r.watermark) for r in task_rows]
        run.rows.append(sorted(rows))
        offset = end
    return run, offset


def test_the_issue_13_backlog_reads_the_small_partition_in_the_first_trigger(tmp_path):
    # p0: 20,000 records an hour ahead; p1: 5 records behind it; limit 1,000.
    records = [[HOUR + i for i in range(20_000)], [1_000 * (i + 1) for i in range(5)]]
    planner, _ = planner_for(records, str(tmp_path), **{"idle.policy": "caught-up"})
    result, _ = run(planner, records, 1000, batches=3)
    first = result.plans[0]
    assert first[1][1] > first[1][0]                        # p1 read in the first trigger
    assert sum(e - s for s, e, _ in first.values()) <= 1000 + 2
    # all of p1 by the second trigger, it being the watermark holder
    assert result.plans[1][1][1] == 5
    p1_rows = [row for rows in result.rows for row in rows if row[0] == 1]
    assert len(p1_rows) == 5
    assert all(wm is None or event > wm for _, _, event, wm in p1_rows)   # none late


def alignment_records() -> list[list[int]]:
    """p0 runs an hour ahead with a backlog; p1 has a long backlog behind it, one record a
    second; p2 spoke once and is silent."""
    return [[HOUR + 1_000 * i for i in range(3_000)],
            [1_000 * i for i in range(4_000)],
            [500]]


def true_watermarks_at_start(result: Run, records: list[list[int]], b: int) -> dict[int, int]:
    """Each partition's ``max event time - 1`` over what the batches before ``b`` read."""
    read: dict[int, int] = {}
    for plan in result.plans[:b]:
        for p, (_, end, _) in plan.items():
            read[p] = max(read.get(p, 0), end)
    return {p: max(records[p][:n]) - 1 for p, n in read.items() if n}


def test_alignment_keeps_every_read_within_max_drift_of_the_floor(tmp_path, caplog):
    records = alignment_records()
    drift = 60_000
    planner, _ = planner_for(records, str(tmp_path / "ledger"),
                             **{"watermark.alignment.maxDrift": "1 minute"})
    with caplog.at_level(logging.INFO, logger="kwatermark"):
        result, _ = run(planner, records, 500)
    # everything is read in the end: no stall, the silent p2 never held anyone back
    assert {p: plan[1] for p, plan in result.plans[-1].items()} == {
        p: len(ts) for p, ts in enumerate(records)}
    held_batches = 0
    for b, plan in enumerate(result.plans[1:], start=1):
        marks = true_watermarks_at_start(result, records, b)
        unread = {p: len(records[p]) - plan[p][0] for p in plan}
        active = [p for p in plan if unread[p]]
        floor = min(marks[p] for p in active)
        for p, (start, end, held) in plan.items():
            if end > start:      # read: at most maxDrift above the floor
                assert marks[p] - floor <= drift, (b, p, marks, floor)
            if held:
                held_batches += 1
                assert start == end and marks[p] - floor > drift
    assert held_batches > 5
    held_logs = [r for r in caplog.records if "holding topic" in r.getMessage()]
    assert held_logs and held_logs[0].levelno == logging.INFO
    assert held_logs[0].name.startswith("kwatermark.")
    assert f"topic {TOPIC} partition 0" in held_logs[0].getMessage()


def test_alignment_off_reads_the_partition_ahead_every_trigger(tmp_path):
    records = alignment_records()
    planner, _ = planner_for(records, str(tmp_path))
    result, _ = run(planner, records, 500, batches=10)
    # one record a trigger at least for p0, an hour ahead: what alignment stops
    assert all(plan[0][1] > plan[0][0] for plan in result.plans)
    assert not any(held for plan in result.plans for _, _, held in plan.values())


def test_a_restart_mid_aligned_catch_up_continues_identically(tmp_path):
    records = alignment_records()
    options = {"watermark.alignment.maxDrift": "1 minute", "idle.policy": "caught-up"}
    planner, _ = planner_for(records, str(tmp_path / "a"), **options)
    undisturbed, _ = run(planner, records, 500)

    planner, _ = planner_for(records, str(tmp_path / "b"), **options)
    before, offset = run(planner, records, 500, batches=7)
    assert any(held for plan in before.plans for _, _, held in plan.values())
    restarted, _ = planner_for(records, str(tmp_path / "b"), **options)   # fresh process
    resumed, _ = run(restarted, records, 500, offset=BatchOffset.from_json(offset.dumps()),
                     run=before)
    assert resumed.plans == undisturbed.plans
    assert resumed.rows == undisturbed.rows


def test_a_held_partition_is_never_taken_for_idle(tmp_path):
    """Under ``timeout`` a partition that is not read becomes idle; a held one is paused on
    purpose, counts as read, and so stays counted (and held)."""
    records = alignment_records()[:2]
    planner, _ = planner_for(records, str(tmp_path), **{
        "watermark.alignment.maxDrift": "1 minute", "idle.policy": "timeout",
        "idle.timeout": "1 ms"})
    result, _ = run(planner, records, 500, batches=8)
    states = [BatchOffset.from_json(o).partitions[(TOPIC, 0)].state
              for o in result.offsets[1:]]
    assert all(s.held for s in states)
    assert all(s.idle == "count" for s in states)


@pytest.mark.parametrize("policy", ["none", "caught-up", "timeout", "advance"])
def test_a_silent_partition_never_stalls_an_aligned_stream(tmp_path, policy):
    # p1 spoke once, long ago, and is silent: it pins the watermark under "none", but with
    # nothing unread it holds nobody back.
    records = [[HOUR + 1_000 * i for i in range(300)], [1_000]]
    planner, _ = planner_for(records, str(tmp_path), **{
        "watermark.alignment.maxDrift": "1 second", "idle.policy": policy})
    result, _ = run(planner, records, 50)
    assert result.plans[-1][0][1] == 300
    assert not any(held for plan in result.plans for _, _, held in plan.values())


def test_alignment_applies_without_a_read_limit(tmp_path):
    records = [[HOUR + 1_000 * i for i in range(100)], [1_000 * (i + 1) for i in range(50)]]
    planner, broker = planner_for(records, str(tmp_path),
                                  **{"watermark.alignment.maxDrift": "1 minute"})
    broker.ends = {(TOPIC, 0): 1, (TOPIC, 1): 1}       # one record each: both defined
    result, offset = run(planner, records, None, batches=1)
    broker.ends = {(TOPIC, 0): 100, (TOPIC, 1): 50}
    result, _ = run(planner, records, None, offset=offset, batches=2, run=result)
    assert result.plans[1] == {0: (1, 1, True), 1: (1, 50, False)}   # p0 an hour ahead: held
    assert result.plans[2] == {0: (1, 100, False), 1: (50, 50, False)}  # p1 drained: free


class RecordingPolicy:
    """A custom idle policy that remembers the ``held`` it was shown, per partition."""

    seen: ClassVar[list[tuple[int, bool]]] = []

    def __init__(self, options):
        pass

    def decide(self, partition, now_ms):
        RecordingPolicy.seen.append((partition.partition, partition.held))
        return "count"


def test_a_custom_policy_sees_whether_alignment_holds_the_partition(tmp_path):
    records = alignment_records()[:2]
    RecordingPolicy.seen = []
    planner, _ = planner_for(records, str(tmp_path), **{
        "watermark.alignment.maxDrift": "1 minute",
        "idle.policy": f"{__name__}:RecordingPolicy"})
    result, _ = run(planner, records, 500, batches=8)
    shown = [dict(RecordingPolicy.seen[i:i + 2]) for i in range(0, len(RecordingPolicy.seen), 2)]
    assert len(shown) == len(result.plans)
    for b, (plan, views) in enumerate(zip(result.plans, shown)):
        marks = true_watermarks_at_start(result, records, b)
        for p, (start, end, held) in plan.items():
            assert views[p] == held
            if held:   # independently: read nothing, had records, more than 1 min ahead
                others = [marks[q] for q in plan if q != p and q in marks]
                assert start == end < len(records[p]) and marks[p] - min(others) > 60_000
    assert any(v for views in shown for v in views.values())
    assert not all(v for views in shown for v in views.values())


def test_a_partition_that_joins_behind_the_watermark_is_announced_once_with_its_treatment(
        tmp_path, caplog):
    records = [[10_000 + 1_000 * i for i in range(5)], [1_000, 2_000, 30_000]]
    planner, broker = planner_for(records[:1], str(tmp_path), lateRecords="flag")
    result, offset = run(planner, records, None)
    # The highest watermark a row has carried: monotonous, on p0's last row, before that row
    # applied itself (p0's next-to-last event time - 1). With p1 undefined it stays in force.
    watermark = records[0][-2] - 1
    # The second partition appears (a new partition, or a new subscribePattern match), empty
    # at first: the driver asks again and again before a batch takes it in.
    broker.tps.append((TOPIC, 1))
    broker.ends[(TOPIC, 1)] = 0
    with caplog.at_level(logging.INFO, logger="kwatermark"):
        for _ in range(3):
            assert planner.latest_offset(offset, ReadLimits()) is None
        broker.ends[(TOPIC, 1)] = len(records[1])
        result, _ = run(planner, records, None, offset=offset, run=result)
    joined = [r for r in caplog.records if "joined" in r.getMessage()]
    assert len(joined) == 1 and joined[0].levelno == logging.WARNING
    message = joined[0].getMessage()
    assert f"topic {TOPIC} partition 1 from offset 0" in message
    assert f"combined watermark is {watermark} " in message
    assert "flagged is_late=true (lateRecords=flag)" in message
    # and so they are: the joining partition's first two records are at or below it
    late_rows = [(o, ev) for p, o, ev, wm in result.rows[-1] if p == 1 and ev <= wm]
    assert [o for o, _ in late_rows] == [0, 1]
