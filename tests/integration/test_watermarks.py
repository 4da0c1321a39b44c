"""Issue 3: per-partition watermarks on every row, surviving replays and restarts."""

from __future__ import annotations

import os
import shutil

from pyspark.sql import functions as F

from kwatermark.offsets import BatchOffset
from tests.support.kafka import Record
from tests.support.secrets import spark_output
from tests.support.streams import (
    Batches,
    ev_ms,
    kwatermark_stream,
    progress_offset,
    run_available_now,
    wm_ms,
)


def by_batch(batches: Batches) -> list[list[tuple[int, int, int | None]]]:
    return [[(r["partition"], ev_ms(r), wm_ms(r)) for r in rows] for rows in batches.batches()]


def test_worked_example_of_design_section_2(spark, broker, topic_factory, checkpoint,
                                            ledger_dir):
    writer = topic_factory(2)
    frame = kwatermark_stream(spark, broker, writer.topic,
                              **{"watermark.strategy": "monotonous",
                                 "watermark.stateLocation": ledger_dir})
    seen = Batches()
    steps = [
        [Record(0, 1000), Record(1, 1000)],
        [Record(1, 4000), Record(1, 5000)],
        [Record(0, 6000)],
        [Record(1, 7000)],
    ]
    for step in steps:  # one AvailableNow run per step: each is also a restart
        writer.send(step)
        run_available_now(frame, checkpoint, seen)
    assert by_batch(seen) == [
        [(0, 1000, None), (1, 1000, None)],
        [(1, 4000, 999), (1, 5000, 999)],
        [(0, 6000, 999)],
        [(1, 7000, 4999)],
    ]


def skewed_rounds(rounds: int) -> list[list[Record]]:
    """Partition 0 on time; partition 1 five seconds behind in event time."""
    out = []
    for n in range(rounds):
        base = 10_000 + n * 5_000
        out.append([Record(p, base + i * 1_000 - (5_000 if p == 1 else 0))
                    for i in range(5) for p in range(2)])
    return out


def test_lagging_partition_is_not_late_while_sparks_global_watermark_drops_it(
        spark, broker, topic_factory, tmp_path):
    writer = topic_factory(2)
    kw = kwatermark_stream(spark, broker, writer.topic, lateRecords="flag")
    spark_windows = (kwatermark_stream(spark, broker, writer.topic)
                     .withWatermark("event_time", "0 seconds")
                     .groupBy(F.window("event_time", "1 second")).count())
    ours, counted = Batches(), []

    def count_rows(frame, batch_id):
        counted.append(frame.agg({"count": "sum"}).collect()[0][0] or 0)

    produced = 0
    for step in skewed_rounds(3):
        writer.send(step)
        produced += len(step)
        run_available_now(kw, str(tmp_path / "kw"), ours)
        query = (spark_windows.writeStream.outputMode("update").foreachBatch(count_rows)
                 .option("checkpointLocation", str(tmp_path / "spark"))
                 .trigger(availableNow=True).start())
        query.awaitTermination(120)
    lagging = [r for r in ours.rows if r["partition"] == 1]
    assert lagging and not any(r["is_late"] for r in lagging)
    # The fast partition's rows carry the lagging partition's batch-start watermark; the
    # lagging partition's own rows advance record by record (DESIGN §2).
    assert [wm_ms(r) for r in ours.batches()[1]] == [8_999] * 5 + [
        8_999, 9_999, 10_999, 11_999, 12_999]
    assert [wm_ms(r) for r in ours.batches()[2]] == [13_999] * 5 + [
        13_999, 14_999, 15_999, 16_999, 17_999]
    # Spark's global watermark (max event time) runs ahead and drops partition 1's rows.
    # (Spark closes a 1 s window once its end is <= its watermark, so the rows of partition 1
    # that fall in already-closed windows are silently lost.)
    assert sum(counted) < produced


def test_replaying_a_batch_from_the_offset_log_gives_identical_rows(
        spark, broker, topic_factory, checkpoint, ledger_dir):
    writer = topic_factory(3)
    writer.send([Record(p, 1_000 * i + p) for i in range(1, 30) for p in range(3)])
    frame = kwatermark_stream(spark, broker, writer.topic, maxOffsetsPerTrigger=25,
                              **{"watermark.strategy": "bounded",
                                 "watermark.maxOutOfOrderness": "2 seconds",
                                 "watermark.stateLocation": ledger_dir})
    first, _ = run_available_now(frame, checkpoint)
    last_id = max(first.by_id)
    # Forget that the last batch was committed: Spark replays it from the offset log.
    for name in (str(last_id), f".{last_id}.crc"):
        os.remove(os.path.join(checkpoint, "commits", name))
    shutil.rmtree(ledger_dir, ignore_errors=True)
    replay, _ = run_available_now(frame, checkpoint)
    assert list(replay.by_id) == [last_id]
    assert replay.by_id[last_id] == first.by_id[last_id]
    assert any(wm_ms(r) is not None for r in replay.by_id[last_id])


def test_restart_keeps_every_partitions_state(spark, broker, topic_factory, checkpoint,
                                              ledger_dir):
    writer = topic_factory(2)
    frame = kwatermark_stream(spark, broker, writer.topic,
                              **{"watermark.stateLocation": ledger_dir})
    writer.send([Record(0, 5_000), Record(1, 3_000)])
    run_available_now(frame, checkpoint)
    writer.send([Record(0, 6_000)])
    after, query = run_available_now(frame, checkpoint)
    # Not reset to null: partition 1 still holds the minimum at 3000 - 1.
    assert [wm_ms(r) for r in after.rows] == [2_999]
    end = BatchOffset.from_json(progress_offset(query.lastProgress["sources"][0]["endOffset"]))
    assert end.watermark == 2_999


def test_lost_progress_record_is_recomputed_with_the_same_result(
        spark, broker, topic_factory, tmp_path, request):
    steps = [[Record(p, 1_000 * i + 7 * p) for i in range(1, 6) for p in range(2)],
             [Record(p, 9_000 + 500 * i) for i in range(4) for p in range(2)]]
    results = []
    for lose_records in (False, True):
        writer = topic_factory(2)
        ledger = str(tmp_path / f"ledger-{lose_records}")
        frame = kwatermark_stream(spark, broker, writer.topic,
                                  **{"watermark.strategy": "bounded",
                                     "watermark.maxOutOfOrderness": "1 second",
                                     "watermark.stateLocation": ledger})
        seen = Batches()
        checkpoint = str(tmp_path / f"ckpt-{lose_records}")
        for step in steps:
            writer.send(step)
            if lose_records:
                shutil.rmtree(ledger, ignore_errors=True)
            run_available_now(frame, checkpoint, seen)
        results.append(by_batch(seen))
    assert results[0] == results[1]
    # The driver (Spark's Python source process) says per batch how many ranges it re-read.
    output = spark_output(request)
    if output is not None:   # pytest -s hands Spark's output to the terminal instead
        assert "recomputed 2 of 2 ranges of the last batch on the driver" in output
    assert results[0][1][0][2] == 3_999  # min(p0 5000, p1 5007) - 1000 - 1


def test_late_records_flag_and_drop_with_allowed_lateness(spark, broker, topic_factory,
                                                          tmp_path):
    writer = topic_factory(1)
    flag = kwatermark_stream(spark, broker, writer.topic, lateRecords="flag",
                             allowedLateness="500 milliseconds")
    flagged = Batches()
    writer.send([Record(0, 10_000)])
    run_available_now(flag, str(tmp_path / "flag"), flagged)
    writer.send([Record(0, 9_000), Record(0, 9_999), Record(0, 9_500), Record(0, 20_000)])
    run_available_now(flag, str(tmp_path / "flag"), flagged)
    # Batch 2 rows see W = 9999: late when event_time + 500 <= 9999.
    assert [(ev_ms(r), r["is_late"]) for r in flagged.batches()[1]] == [
        (9_000, True), (9_999, False), (9_500, False), (20_000, False)]
    dropped, _ = run_available_now(
        kwatermark_stream(spark, broker, writer.topic, lateRecords="drop"),
        str(tmp_path / "drop"))
    assert [ev_ms(r) for r in dropped.rows] == [10_000, 20_000]


def test_sparks_event_time_machinery_follows_the_watermark_column(
        spark, broker, topic_factory, checkpoint):
    """docs/watermarks.md: withWatermark("watermark", "0 seconds") shows kwatermark's
    combined watermark as Spark's, one batch later (not a base for stateful operators: rows
    at Spark's previous watermark would be dropped; the docs' processor uses +1 ms)."""
    writer = topic_factory(2)
    frame = (kwatermark_stream(spark, broker, writer.topic)
             .withWatermark("watermark", "0 seconds"))
    seen = Batches()
    marks = []
    for step in ([Record(0, 10_000), Record(1, 3_000)], [Record(0, 20_000)],
                 [Record(1, 30_000)]):
        writer.send(step)
        _, query = run_available_now(frame, checkpoint, seen)
        marks.append(query.lastProgress["eventTime"].get("watermark"))
    # Spark's watermark in force during batch N is the highest kwatermark watermark of
    # batch N-1 (Spark applies a watermark from the next batch on): none (epoch 0) for
    # batches 0 and 1, then partition 1's 2999 from batch 1's rows.
    assert [wm_ms(r) for r in seen.rows] == [None, None, 2_999, 2_999]
    assert marks == ["1970-01-01T00:00:00.000Z", "1970-01-01T00:00:00.000Z",
                     "1970-01-01T00:00:02.999Z"]
