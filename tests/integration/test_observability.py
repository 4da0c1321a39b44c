"""Issue 15 against the broker: timelag and percentile watermarks, and kwatermark.inspect on a
real query's checkpoint. Ground truth comes from the records each test produced."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
import time

from kwatermark.inspect import checkpoint_table, progress_table
from kwatermark.offsets import BatchOffset
from tests.integration.test_windows import (
    WindowRows,
    complete,
    counts,
    final_watermark,
    run,
    tumbling_truth,
)
from tests.support import layout_one_offsets as layout_one
from tests.support.kafka import Record
from tests.support.streams import (
    Batches,
    epoch_ms,
    ev_ms,
    kwatermark_stream,
    run_available_now,
    wm_ms,
)

T0 = 1_700_000_000_000
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def planned_at(checkpoint: str) -> dict[int, int]:
    """Batch id -> plannedAt, read from Spark's offset log directly."""
    out = {}
    for name in os.listdir(os.path.join(checkpoint, "offsets")):
        if name.isdigit():
            with open(os.path.join(checkpoint, "offsets", name)) as handle:
                out[int(name)] = BatchOffset.from_json(
                    json.loads(handle.read().splitlines()[2])).planned_ms
    return out


def test_timelag_watermark_is_planning_time_minus_the_lag_and_replays_identically(
        spark, broker, topic_factory, checkpoint, ledger_dir):
    writer = topic_factory(2)
    frame = kwatermark_stream(spark, broker, writer.topic, lateRecords="flag", **{
        "watermark.strategy": "timelag", "watermark.maxTimeLag": "10 minutes",
        "watermark.stateLocation": ledger_dir})
    seen = Batches()
    now = int(time.time() * 1000)
    # On time (1 min old), and two hours old: later than maxTimeLag allows.
    writer.send([Record(0, now - 60_000), Record(1, now - 7_200_000), Record(1, now - 1_000)])
    before = int(time.time() * 1000)
    run_available_now(frame, checkpoint, seen)
    after = int(time.time() * 1000)
    planned = planned_at(checkpoint)
    assert sorted(planned) == sorted(seen.by_id) == [0]
    assert before <= planned[0] <= after
    for batch_id, rows in seen.by_id.items():
        assert {wm_ms(r) for r in rows} == {planned[batch_id] - 600_000}
        for row in rows:
            assert row["is_late"] == (ev_ms(row) <= planned[batch_id] - 600_000)
    assert [r["is_late"] for r in seen.rows] == [False, True, False]

    # Replay the batch from the offset log later: identical rows, not today's clock.
    last = max(seen.by_id)
    for name in (str(last), f".{last}.crc"):
        os.remove(os.path.join(checkpoint, "commits", name))
    shutil.rmtree(ledger_dir, ignore_errors=True)
    time.sleep(1.1)
    replay, _ = run_available_now(frame, checkpoint)
    assert replay.by_id == {last: seen.by_id[last]}


# Three partitions, one step per micro-batch; partition 2's producer is 30 s behind.
SIZE = 10_000


def lagging_steps(steps: int = 2) -> list[list[Record]]:
    return [[Record(p, T0 + s * SIZE + i * 1_000 - (30_000 if p == 2 else 0),
                    key=f"k{i % 3}".encode())
             for i in range(10) for p in range(3)] for s in range(steps)]


def kth_largest(values: list[int | None], p: float) -> int | None:
    """The percentile watermark of DESIGN §13, by hand: undefined (None) is the lowest."""
    k = math.ceil(p * len(values) / 100)
    ranked = sorted(values, key=lambda v: -math.inf if v is None else v, reverse=True)
    return ranked[k - 1]


def expected_rows(steps: list[list[Record]], p: float) -> list[list[tuple]]:
    """Per batch, each row's (partition, event time, watermark, is_late) computed from the
    produced records: its own partition advanced to the record before it, the others at the
    batch start, combined by percentile, floored by everything emitted before."""
    highest: dict[int, int] = {}
    floor = None
    out = []
    for step in steps:
        at_start = {q: (highest[q] - 1 if q in highest else None) for q in range(3)}
        start = kth_largest(list(at_start.values()), p)
        if start is not None:
            floor = start if floor is None else max(floor, start)
        rows, emitted = [], []
        for q in range(3):
            own = at_start[q]
            for r in sorted((r for r in step if r.partition == q), key=lambda r: 0):
                values = [own] + [at_start[o] for o in range(3) if o != q]
                mark = kth_largest(values, p)
                if floor is not None:
                    mark = floor if mark is None else max(floor, mark)
                rows.append((q, r.timestamp, mark, mark is not None and r.timestamp <= mark))
                emitted.append(mark)
                own = max(own if own is not None else -math.inf, r.timestamp - 1)
        for r in step:
            highest[r.partition] = max(highest.get(r.partition, r.timestamp), r.timestamp)
        # the next batch starts no lower than any row emitted (docs/watermarks.md)
        marks = [m for m in emitted if m is not None]
        if marks:
            floor = max(marks) if floor is None else max(floor, max(marks))
        out.append(sorted(rows))
    return out


def test_percentile_watermark_releases_windows_earlier_and_makes_the_lagging_rows_late(
        spark, broker, topic_factory, tmp_path):
    steps = lagging_steps()
    produced = [r for step in steps for r in step]
    # Rows: with p = 50 the lagging partition no longer holds the watermark; its rows are
    # flagged late exactly as computed by hand from the produced records.
    writer = topic_factory(3)
    frame = kwatermark_stream(spark, broker, writer.topic, lateRecords="flag", **{
        "watermark.combine": "percentile", "watermark.percentile": "50"})
    seen = Batches()
    for step in steps:
        writer.send(step)
        run_available_now(frame, str(tmp_path / "rows"), seen)
    got = [sorted((r["partition"], ev_ms(r), wm_ms(r), r["is_late"]) for r in rows)
           for rows in seen.batches()]
    assert got == expected_rows(steps, 50)
    late = [(q, ts) for batch in got for q, ts, _, is_late in batch if is_late]
    assert late and {q for q, _ in late} == {2}
    # Under min (p = 100, the default) the same records are never late.
    assert not any(is_late for batch in expected_rows(steps, 100) for *_, is_late in batch)

    # Windows: under min no window from T0 on completes in this run (partition 2 is 30 s
    # behind); with p = 50 those of [T0, T0 + 10 s) come out final, and partition 2's records
    # of windows already final come out as `late` rows; nothing is lost.
    under_min = complete(tumbling_truth(produced), final_watermark(produced))
    assert under_min and all(start < T0 for _, start, _ in under_min)
    writer = topic_factory(3)
    windows = counts(kwatermark_stream(spark, broker, writer.topic, **{
        "watermark.heartbeat": "true", "watermark.combine": "percentile",
        "watermark.percentile": "50"}))
    rows = WindowRows()
    for step in steps:
        writer.send(step)
        run(windows, str(tmp_path / "windows"), rows=rows)
    truth = tumbling_truth(produced)
    finals = {(key, start) for _, (key, start, _, _, kind) in rows.rows if kind == "final"}
    assert {(key, start) for key, start, _ in truth if start == T0} <= finals
    late = {(key, start): n for _, (key, start, _, n, kind) in rows.rows if kind == "late"}
    assert late and all(start < T0 + SIZE for _, start in late)
    applied = rows.applied()
    assert {w: truth[w] for w in applied} == applied     # every window it gave is exact


def test_inspect_reads_a_real_checkpoint_and_matches_the_query_progress(
        spark, broker, topic_factory, checkpoint, tmp_path):
    writer = topic_factory(2)
    # Partition 1 is 20 s behind in event time: it holds the watermark.
    writer.send([Record(p, T0 + i * 1_000 - (20_000 if p else 0)) for i in range(15)
                 for p in range(2)])
    frame = kwatermark_stream(spark, broker, writer.topic, maxOffsetsPerTrigger=10)
    before = int(time.time() * 1000)
    _, query = run_available_now(frame, checkpoint)
    table = checkpoint_table(checkpoint)
    batches = sorted(table["batch"].unique())
    assert len(batches) >= 3
    assert table.equals(progress_table(query.recentProgress)
                        .loc[lambda t: t["batch"].isin(batches)].reset_index(drop=True))
    for batch in batches[1:]:
        rows = table[table["batch"] == batch].set_index("partition")
        p0, p1 = rows.loc[f"{writer.topic}:0"], rows.loc[f"{writer.topic}:1"]
        assert (p1["holder"], p0["holder"]) == (f"{writer.topic}:1",) * 2
        planned = epoch_ms(p0["planned_at"])
        assert planned >= before
        # Lags are planning time minus the partition watermarks the offset carries.
        for row in (p0, p1):
            assert row["event_lag_ms"] == planned - epoch_ms(row["partition_watermark"])
        # Monotonous: a partition's watermark is its last read record's time - 1 ms (the
        # record at offset k of partition p has time T0 + 1 s * k, 20 s earlier on p1).
        for p, row in ((0, p0), (1, p1)):
            if row["from"] > 0:
                last = T0 + (row["from"] - 1) * 1_000 - (20_000 if p else 0)
                assert epoch_ms(row["partition_watermark"]) == last - 1
        assert epoch_ms(p0["partition_watermark"]) > epoch_ms(p1["partition_watermark"])
        # Under the read limit both still had unread records when this batch was planned.
        assert p0["unread"] > 0 and p1["unread"] > 0
    out = subprocess.run(
        [sys.executable, "-m", "kwatermark.inspect", checkpoint, "--plot",
         str(tmp_path / "lag.png")], check=False, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": ROOT})
    assert out.returncode == 0, out.stderr
    assert f"{writer.topic}:1" in out.stdout and "event_lag" in out.stdout
    assert (tmp_path / "lag.png").read_bytes()[:4] == b"\x89PNG"
    failed = subprocess.run([sys.executable, "-m", "kwatermark.inspect", str(tmp_path)],
                            check=False, capture_output=True, text=True, timeout=120)
    assert failed.returncode == 2 and "no offsets/ directory" in failed.stderr


def strip_observations(checkpoint: str) -> None:
    """Rewrite the offset log as kwatermark 0.1 wrote it: no plannedAt, holder or lag."""
    log_dir = os.path.join(checkpoint, "offsets")
    for name in os.listdir(log_dir):
        path = os.path.join(log_dir, name)
        if not name.isdigit():
            os.remove(path)        # Spark's checksum files; it does not require them
            continue
        with open(path) as handle:
            lines = handle.read().splitlines()
        # As kwatermark 0.1 wrote it: offset layout 1, without plannedAt, holder or lags.
        offset = BatchOffset.from_json(lines[2])
        offset = dataclasses.replace(offset, planned_ms=None, holder=None, partitions={
            tp: dataclasses.replace(r, lag=None) for tp, r in offset.partitions.items()})
        with open(path, "w") as handle:
            handle.write("\n".join(lines[:2] + [json.dumps(layout_one.offset_json(offset))]))


def test_a_checkpoint_written_without_lag_fields_restarts_and_continues(
        spark, broker, topic_factory, checkpoint):
    writer = topic_factory(2)
    frame = kwatermark_stream(spark, broker, writer.topic)
    writer.send([Record(0, T0 + 5_000), Record(1, T0 + 3_000)])
    run_available_now(frame, checkpoint)
    strip_observations(checkpoint)
    writer.send([Record(0, T0 + 6_000)])
    after, _ = run_available_now(frame, checkpoint)
    # The state carried on (partition 1 holds the minimum at 3000 - 1), and the new batch has
    # its observations while the old one reads as empty.
    assert [wm_ms(r) for r in after.rows] == [T0 + 2_999]
    table = checkpoint_table(checkpoint)
    old, new = table[table["batch"] == 0], table[table["batch"] == 1]
    assert old["event_lag_ms"].isna().all() and old["holder"].isna().all()
    assert list(new["holder"]) == [f"{writer.topic}:1"] * 2
    assert new["event_lag_ms"].notna().all()


def test_progress_latest_offset_shows_each_partitions_end_offset_as_sparks_kafka_source(
        spark, broker, topic_factory, checkpoint):
    writer = topic_factory(2)
    writer.send([Record(0, T0 + i, value=b"a") for i in range(6)]
                + [Record(1, T0 + i, value=b"b") for i in range(3)])
    # Under a read limit the first batch reads part of what the broker has: its progress
    # shows the broker's end offsets as latestOffset, beyond the batch's own endOffset.
    frame = kwatermark_stream(spark, broker, writer.topic, maxOffsetsPerTrigger=4)
    _, query = run_available_now(frame, checkpoint)
    sources = [progress["sources"][0] for progress in query.recentProgress
               if progress["numInputRows"] > 0]
    assert len(sources) >= 2
    first = sources[0]
    assert json.loads(first["latestOffset"]) == {writer.topic: {"0": 6, "1": 3}}
    planned = BatchOffset.from_json(first["endOffset"]).partitions
    assert sum(p.end - p.start for p in planned.values()) <= 4 + 2
    assert json.loads(sources[-1]["latestOffset"]) == {writer.topic: {"0": 6, "1": 3}}
