"""Issue 13: admission control that serves the watermark, against the real broker and Spark.

Ground truth comes from the records the test produced and the rows each batch delivered;
which partitions a batch read or held comes from Spark's own offset log."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import threading

from kwatermark.offsets import BatchOffset
from tests.support.kafka import Record
from tests.support.streams import Batches, ev_ms, kwatermark_stream, run_available_now, wm_ms

HOUR = 3_600_000
DRIFT = 60_000


def offset_log(checkpoint: str) -> dict[int, dict]:
    """Each batch's end offset as Spark wrote it (``<checkpoint>/offsets/<id>``)."""
    folder = os.path.join(checkpoint, "offsets")
    logged = {}
    for name in os.listdir(folder):
        if name.isdigit():
            with open(os.path.join(folder, name)) as f:
                logged[int(name)] = json.loads(f.read().splitlines()[2])
    return logged


def plans(checkpoint: str) -> list[dict[int, tuple[int, int, bool]]]:
    """Per batch: partition -> (from, to, held)."""
    return [{p: (r.start, r.end, r.state.held)
             for (_, p), r in BatchOffset.from_json(offset).partitions.items()}
            for _, offset in sorted(offset_log(checkpoint).items())]


def test_backlog_far_ahead_does_not_starve_the_partition_holding_the_watermark(
        spark, broker, topic_factory, checkpoint, ledger_dir):
    """The issue's case: p0 has a large backlog far ahead in event time, p1 five unread
    records behind it. p1 used to get zero records for many triggers."""
    writer = topic_factory(2)
    writer.send([Record(0, HOUR + i) for i in range(5_000)]
                + [Record(1, 1_000 * (i + 1)) for i in range(5)])
    frame = kwatermark_stream(spark, broker, writer.topic, maxOffsetsPerTrigger=1000,
                              lateRecords="flag",
                              **{"idle.policy": "caught-up", "idle.timeout": "1 second",
                                 "watermark.stateLocation": ledger_dir})
    seen, _ = run_available_now(frame, checkpoint)
    first = [r for r in seen.batches()[0] if r["partition"] == 1]
    assert first, "partition 1 was not read in the first trigger"
    p1 = [r for r in seen.rows if r["partition"] == 1]
    assert [ev_ms(r) for r in p1] == [1_000, 2_000, 3_000, 4_000, 5_000]
    assert not any(r["is_late"] for r in p1)
    assert len(seen.rows) == 5_005
    # p1, the watermark holder, is served first: whatever of it is left after the first
    # trigger is read in the second.
    assert len([r for r in seen.batches()[1] if r["partition"] == 1]) == 5 - len(first)
    # never more than the limit plus one record per partition with unread records
    assert all(len(rows) <= 1000 + 2 for rows in seen.batches())


def test_partitions_written_at_an_even_pace_are_read_together_and_the_watermark_rises(
        spark, broker, topic_factory, checkpoint, ledger_dir):
    """Four partitions written at one even pace (record i in partition i % 4 at i seconds),
    a limit of a fifth of the backlog. Served strictly lowest watermark first, the partition
    a few ms behind took the whole limit each trigger: one partition (one task) per batch,
    and the combined watermark stood still in three triggers of four."""
    writer = topic_factory(4)
    writer.send([Record(i % 4, 1_000 * (i + 1)) for i in range(4_000)])
    frame = kwatermark_stream(spark, broker, writer.topic, maxOffsetsPerTrigger=800,
                              **{"watermark.stateLocation": ledger_dir})
    seen, _ = run_available_now(frame, checkpoint)
    batches = [rows for rows in seen.batches() if rows]
    assert sorted(ev_ms(r) for r in seen.rows) == [1_000 * (i + 1) for i in range(4_000)]
    # The first batch finds every watermark undefined and shares by lag; from the second on,
    # every partition with a backlog reads its share.
    read = dict.fromkeys(range(4), 0)
    for number, rows in enumerate(batches):
        per = {p: sum(r["partition"] == p for r in rows) for p in range(4)}
        if number >= 1:
            behind = [p for p in range(4) if 1_000 - read[p] >= 200]
            assert behind and all(per[p] >= 100 for p in behind), (number, per, read)
        for p in range(4):
            read[p] += per[p]
    # ... so the combined watermark the rows carry rises by hundreds of records' worth of
    # event time per batch (4 s a record in each partition), not by one record's.
    marks = [min(wm_ms(r) for r in rows) for rows in batches[1:5]]
    rises = [later - earlier for earlier, later in itertools.pairwise(marks)]
    assert len(rises) == 3 and min(rises) >= 400_000, (marks, rises)


def aligned_catch_up(writer) -> None:
    """p0: a backlog an hour ahead (one record every 3 s for 50 min); p1: a backlog from the
    start, one record every 8 s, reaching past p0's end. (Timestamp 0 would mean "now" to the
    producer.)"""
    writer.send([Record(0, HOUR + 3_000 * i) for i in range(1_000)]
                + [Record(1, 8_000 * (i + 1)) for i in range(1_000)])


def aligned_frame(spark, broker, topic: str, ledger: str, **extra):
    return kwatermark_stream(spark, broker, topic, maxOffsetsPerTrigger=200,
                             lateRecords="flag",
                             **{"watermark.alignment.maxDrift": "1 minute",
                                "watermark.stateLocation": ledger, **extra})


def test_alignment_keeps_the_partition_ahead_within_max_drift(
        spark, broker, topic_factory, checkpoint, ledger_dir):
    writer = topic_factory(2)
    aligned_catch_up(writer)
    seen, _ = run_available_now(aligned_frame(spark, broker, writer.topic, ledger_dir),
                                checkpoint)
    batches = seen.batches()
    assert len(seen.rows) == 2_000 and not any(r["is_late"] for r in seen.rows)
    assert len(batches) == len(plans(checkpoint))
    read_max: dict[int, int] = {}
    checked = 0
    for rows in batches:
        if len(read_max) == 2:   # the combined watermark is defined at this batch's start
            combined = min(read_max.values()) - 1
            p0 = [ev_ms(r) for r in rows if r["partition"] == 0]
            if p0:
                span = max(p0) - min(p0)
                # one record's gap (3 s) between p0's watermark and its next record
                assert max(p0) - combined <= DRIFT + span + 3_000 + 1, (combined, p0)
                checked += 1
        for r in rows:
            read_max[r["partition"]] = max(read_max.get(r["partition"], 0), ev_ms(r))
    assert checked >= 3
    held = [plan[0] for plan in plans(checkpoint) if plan[0][2]]
    assert len(held) >= 3 and all(start == end for start, end, _ in held)


def test_a_silent_partition_does_not_stop_an_aligned_stream(
        spark, broker, topic_factory, checkpoint, ledger_dir):
    writer = topic_factory(3)
    writer.send([Record(0, 1_000), Record(1, 1_000), Record(2, 500)])
    frame = aligned_frame(spark, broker, writer.topic, ledger_dir)   # idle.policy none
    run_available_now(frame, checkpoint)
    # p2 is silent from now on and pins the combined watermark at 499 under policy none.
    writer.send([Record(0, HOUR + 1_000 * i) for i in range(600)]
                + [Record(1, HOUR + 1_000 * i) for i in range(600)])
    seen, _ = run_available_now(frame, checkpoint)
    assert len(seen.rows) == 1_200
    assert not any(held for plan in plans(checkpoint) for _, _, held in plan.values())


def comparable(checkpoint: str) -> list[dict]:
    """Each batch's offset minus the wall-clock bookkeeping: lastRead, and the observation
    fields (plannedAt, lag) that no row depends on."""
    out = []
    for _, logged in sorted(offset_log(checkpoint).items()):
        offset = BatchOffset.from_json(logged)
        out.append(dataclasses.replace(offset, planned_ms=None, partitions={
            tp: dataclasses.replace(r, lag=None, state=dataclasses.replace(r.state,
                                                                         last_read_ms=0))
            for tp, r in offset.partitions.items()}))
    return out


def test_a_restart_mid_aligned_catch_up_continues_identically(
        spark, broker, topic_factory, tmp_path):
    writer = topic_factory(2)
    aligned_catch_up(writer)

    undisturbed = str(tmp_path / "undisturbed")
    frame = aligned_frame(spark, broker, writer.topic, str(tmp_path / "ledger-a"))
    whole, _ = run_available_now(frame, undisturbed)

    disturbed = str(tmp_path / "disturbed")
    frame = aligned_frame(spark, broker, writer.topic, str(tmp_path / "ledger-b"))
    before, reached = Batches(), threading.Event()

    def collect(df, batch_id):
        before.collect(df, batch_id)
        if batch_id >= 3:
            reached.set()

    query = (frame.writeStream.foreachBatch(collect)
             .option("checkpointLocation", disturbed)
             .trigger(availableNow=True).start())
    assert reached.wait(120)
    query.stop()                       # mid catch-up: the query may be inside a batch
    held_before = [plan[0][2] for plan in plans(disturbed)]
    assert any(held_before) and len(held_before) < len(plans(undisturbed))
    after, _ = run_available_now(frame, disturbed, before)

    assert comparable(disturbed) == comparable(undisturbed)
    assert [[(r["partition"], r["offset"], r["watermark"], r["is_late"]) for r in rows]
            for rows in after.batches()] == [
        [(r["partition"], r["offset"], r["watermark"], r["is_late"]) for r in rows]
        for rows in whole.batches()]
