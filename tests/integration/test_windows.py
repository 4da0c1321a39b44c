"""Issue 11: event-time windows that follow the per-partition watermark, against the broker.

Ground truth is computed from the records each test produced; a window's value as a user's
sink would apply it is its last ``final``/``update`` plus the sum of its ``late`` rows.
"""

from __future__ import annotations

import collections
import signal
import threading
import time

import pytest
from pyspark.sql import functions as F

from kwatermark.errors import OptionError
from kwatermark.windows import WindowError, aggregate, session, sliding, tumbling
from tests.integration.test_restart import KillableQuery
from tests.support.kafka import Record
from tests.support.streams import epoch_ms, kwatermark_stream

T0 = 1_700_000_000_000   # a multiple of every window size used here
SIZE = 10_000


class WindowRows:
    """The rows of every micro-batch of a windowed query, with their batch ids."""

    def __init__(self):
        self.rows: list[tuple[int, tuple]] = []
        self.lock = threading.Lock()

    def collect(self, frame, batch_id: int) -> None:
        got = [(batch_id, (bytes(r["key"]) if r["key"] is not None else None,
                           epoch_ms(r["window_start"]), epoch_ms(r["window_end"]), r["n"],
                           r["kind"])) for r in frame.collect()]
        with self.lock:
            self.rows = [x for x in self.rows if x[0] != batch_id] + got

    def kinds(self) -> collections.Counter:
        return collections.Counter(row[-1] for _, row in self.rows)

    def applied(self) -> dict[tuple, int]:
        """(key, start, end) -> count, applying final/update then adding late rows."""
        last, late = {}, collections.Counter()
        for _, (key, start, end, n, kind) in sorted(self.rows, key=lambda x: x[0]):
            if kind == "late":
                late[(key, start, end)] += n
            else:
                last[(key, start, end)] = n
        return {w: last.get(w, 0) + late[w] for w in set(last) | set(late)}


def run(frame, checkpoint: str, trigger: dict | None = None,
        rows: WindowRows | None = None) -> tuple[WindowRows, object]:
    rows = rows or WindowRows()
    query = (frame.writeStream.outputMode("append").foreachBatch(rows.collect)
             .option("checkpointLocation", checkpoint)
             .trigger(**(trigger or {"availableNow": True})).start())
    if trigger is None:
        query.awaitTermination(240)
        assert not query.isActive, "the AvailableNow run did not finish"
        assert query.exception() is None, query.exception()
    return rows, query


def counts(frame, windows=None, **kwargs):
    return aggregate(frame, windows or tumbling("10 seconds"), by=["key"],
                     aggs={"n": ("count", None)}, **kwargs)


def stream(spark, broker, topic, **options):
    options.setdefault("watermark.heartbeat", "true")
    return kwatermark_stream(spark, broker, topic, **options)


def tumbling_truth(records: list[Record], size: int = SIZE) -> dict[tuple, int]:
    truth = collections.Counter()
    for r in records:
        start = r.timestamp - r.timestamp % size
        truth[(r.key, start, start + size)] += 1
    return dict(truth)


def complete(truth: dict[tuple, int], watermark: int) -> dict[tuple, int]:
    """The windows a watermark completes: no on-time record of them can still arrive."""
    return {w: n for w, n in truth.items() if w[2] - 1 <= watermark}


def skewed(per_partition: int, lag_ms: int, keys: int = 5, start: int = T0) -> list[Record]:
    """Three partitions, one record every 500 ms each; partition 2 ``lag_ms`` behind."""
    return [Record(p, start + i * 500 - (lag_ms if p == 2 else 0), key=f"k{i % keys}".encode())
            for i in range(per_partition) for p in range(3)]


def final_watermark(records: list[Record]) -> int:
    """Monotonous strategy: min over partitions of (max event time - 1)."""
    highest = collections.defaultdict(int)
    for r in records:
        highest[r.partition] = max(highest[r.partition], r.timestamp)
    return min(highest.values()) - 1


def test_skewed_stream_gives_every_window_exactly_where_sparks_own_watermark_drops(
        spark, broker, topic_factory, tmp_path):
    writer = topic_factory(3)
    records = skewed(240, lag_ms=40_000)
    writer.send(records)
    truth = tumbling_truth(records)

    frame = stream(spark, broker, writer.topic, maxOffsetsPerTrigger="100")
    got, _ = run(counts(frame), str(tmp_path / "kw"))
    expected = complete(truth, final_watermark(records))
    assert len(expected) == 55
    assert got.applied() == expected
    assert got.kinds() == {"final": 55}           # nothing late: the lag is not lateness

    # Spark's own route over the same records, as the issue measured it, drops rows. Read
    # as Spark's Kafka source reads (the limit split by lag: no watermarks to serve); with
    # them, kwatermark's admission control keeps the partitions level, and Spark's
    # watermark, the highest event time less 10 s, no longer passes partition 2.
    plain = kwatermark_stream(spark, broker, writer.topic, maxOffsetsPerTrigger="100",
                              **{"watermark.strategy": "none"})
    spark_counts = (plain.withWatermark("timestamp", "10 seconds")
                    .groupBy(F.window("timestamp", "10 seconds"), "key").count())
    query = (spark_counts.writeStream.outputMode("append").format("noop")
             .option("checkpointLocation", str(tmp_path / "spark"))
             .trigger(availableNow=True).start())
    query.awaitTermination(240)
    dropped = sum(p["stateOperators"][0].get("numRowsDroppedByWatermark", 0)
                  for p in query.recentProgress if p["stateOperators"])
    assert dropped > 0


def test_lagging_partition_that_pauses_for_several_batches_loses_nothing(
        spark, broker, topic_factory, tmp_path):
    writer = topic_factory(3)
    steps = [
        [r for r in skewed(60, lag_ms=20_000)],                               # 0-30 s
        [r for r in skewed(60, 20_000, start=T0 + 30_000) if r.partition != 2],  # 2 paused
        [r for r in skewed(60, 20_000, start=T0 + 60_000) if r.partition != 2],  # still
        [r for r in skewed(120, 20_000, start=T0 + 30_000) if r.partition == 2],  # back
    ]
    frame = counts(stream(spark, broker, writer.topic))
    got, produced = WindowRows(), []
    for step in steps:   # one AvailableNow run per step: each is also a restart
        writer.send(step)
        produced += step
        run(frame, str(tmp_path / "checkpoint"), rows=got)
    assert got.applied() == complete(tumbling_truth(produced), final_watermark(produced))
    assert got.kinds()["late"] == 0 and got.kinds()["update"] == 0


def wait_for(got: WindowRows, query, done, timeout_s: float = 150) -> None:
    deadline = time.monotonic() + timeout_s
    try:
        while not done() and time.monotonic() < deadline:
            assert query.exception() is None, query.exception()
            time.sleep(0.5)
    finally:
        query.stop()


def test_last_windows_come_out_without_a_further_record_on_a_processing_time_trigger(
        spark, broker, topic_factory, tmp_path):
    writer = topic_factory(2)
    records = [Record(p, T0 + i * 1_000 - (5_000 if p else 0), key=b"k")
               for i in range(25) for p in range(2)]
    writer.send(records)
    expected = complete(tumbling_truth(records), final_watermark(records))
    frame = counts(stream(spark, broker, writer.topic, maxOffsetsPerTrigger="20"))
    got, query = run(frame, str(tmp_path / "checkpoint"), {"processingTime": "500 milliseconds"})
    # The window [10 s, 20 s) is completed only by the watermark folded from the last batch:
    # no row carries it, and no record is produced after the first.
    wait_for(got, query, lambda: got.applied() == expected)
    assert got.applied() == expected
    assert got.kinds() == {"final": len(expected)}


def test_silent_partition_released_by_caught_up_lets_windows_complete(
        spark, broker, topic_factory, tmp_path):
    writer = topic_factory(2)
    writer.send([Record(1, T0 + 500, key=b"b")])    # partition 1 speaks once, then is silent
    produced = [Record(1, T0 + 500, key=b"b")]
    stop = threading.Event()

    def produce():   # partition 0 goes on, one record every 200 ms of event and wall time
        for i in range(400):
            if stop.is_set():
                return
            record = Record(0, T0 + i * 1_000, key=b"a")
            writer.send([record])
            produced.append(record)
            time.sleep(0.2)

    producer = threading.Thread(target=produce, daemon=True)
    frame = counts(stream(spark, broker, writer.topic, **{"idle.policy": "caught-up",
                                                          "idle.timeout": "2 seconds"}))
    got, query = run(frame, str(tmp_path / "checkpoint"), {"processingTime": "500 milliseconds"})
    producer.start()
    # Held by partition 1 the watermark would stay at its 499 ms and no window of key a
    # would ever complete; released, it follows partition 0.
    wait_for(got, query, lambda: sum(1 for w in got.applied() if w[0] == b"a") >= 2)
    stop.set()
    producer.join()
    truth = tumbling_truth(produced)
    assert sum(1 for w in got.applied() if w[0] == b"a") >= 2
    assert {w: truth[w] for w in got.applied()} == got.applied()
    assert got.kinds()["late"] == 0


def test_sliding_and_session_windows_match_ground_truth(spark, broker, topic_factory,
                                                       tmp_path):
    writer = topic_factory(2)
    records = []
    for i in range(80):   # key a: a burst every 10 s; key b: steady; partition 1 lags 7 s
        t = T0 + (i // 8) * 10_000 + (i % 8) * 300
        records.append(Record(i % 2, t - (7_000 if i % 2 else 0), key=b"a" if i % 3 else b"b"))
    writer.send(records)
    watermark = final_watermark(records)
    frame = stream(spark, broker, writer.topic, maxOffsetsPerTrigger="20")

    slid, _ = run(counts(frame, sliding("20 seconds", "10 seconds")), str(tmp_path / "s"))
    truth = collections.Counter()
    for r in records:
        last = r.timestamp - r.timestamp % 10_000
        for start in (last, last - 10_000):
            truth[(r.key, start, start + 20_000)] += 1
    assert slid.applied() == complete(truth, watermark)

    sessions, _ = run(counts(frame, session("2 seconds")), str(tmp_path / "g"))
    expected = {}
    for key in (b"a", b"b"):   # offline sessionization: gaps of 2 s or more split
        times = sorted(r.timestamp for r in records if r.key == key)
        start = prev = times[0]
        n = 0
        for t in times:
            if t > prev + 2_000:
                expected[(key, start, prev + 2_000)] = n
                start, n = t, 0
            prev, n = t, n + 1
        expected[(key, start, prev + 2_000)] = n
    assert sessions.applied() == complete(expected, watermark)
    assert sessions.kinds()["late"] == 0


def test_allowed_lateness_updates_then_late_rows_and_nothing_is_lost(
        spark, broker, topic_factory, tmp_path):
    writer = topic_factory(1)
    steps = [[T0 + 1_000, T0 + 2_000, T0 + 25_000],
             [T0 + 26_000],   # the watermark passes [0, 10 s): its final comes out
             [T0 + 5_000],    # late, within the 20 s lateness: an update
             [T0 + 40_000],   # the lateness of [0, 10 s) ends
             [T0 + 6_000]]    # beyond the lateness: a late row
    frame = counts(stream(spark, broker, writer.topic), allowed_lateness="20 seconds")
    got, produced = WindowRows(), []
    for step in steps:
        batch = [Record(0, t, key=b"k") for t in step]
        writer.send(batch)
        produced += batch
        run(frame, str(tmp_path / "checkpoint"), rows=got)
    first = [(kind, n) for _, (_, start, _, n, kind) in sorted(got.rows, key=lambda x: x[0])
             if start == T0]
    assert first == [("final", 2), ("update", 3), ("late", 1)]
    assert got.applied() == complete(tumbling_truth(produced), T0 + 40_000 - 1)


def test_aggregate_needs_the_heartbeat_option(spark, broker, topic_factory):
    writer = topic_factory(1)
    frame = kwatermark_stream(spark, broker, writer.topic)
    with pytest.raises(OptionError, match="watermark.heartbeat"):
        counts(frame)


def test_query_killed_mid_batch_and_restarted_emits_the_same_rows(broker, topic_factory,
                                                                    tmp_path):
    writer = topic_factory(3)
    records = skewed(60, lag_ms=15_000)
    writer.send(records)

    def start(directory, **kwargs):
        directory.mkdir()
        query = KillableQuery(directory, broker, writer.topic)
        query.options = {k: v for k, v in query.options.items() if not k.startswith("water")}
        query.options.update({"maxOffsetsPerTrigger": "40", "watermark.heartbeat": "true",
                              "watermark.stateLocation": str(directory / "ledger")})
        return query

    undisturbed = start(tmp_path / "calm")
    assert undisturbed.wait(undisturbed.start("availableNow", windows="10 seconds")) == 0, \
        undisturbed.log.read_text()[-3000:]
    killed = start(tmp_path / "killed")
    first = killed.start("1 second", kill_in_batch=2, windows="10 seconds")
    assert killed.wait(first) == -signal.SIGKILL, killed.log.read_text()[-3000:]
    again = killed.start("availableNow", windows="10 seconds")
    assert killed.wait(again) == 0, killed.log.read_text()[-3000:]

    def by_batch(query):
        ids = sorted(int(p.stem.split("-")[1]) for p in query.out.glob("batch-*.json"))
        return {i: query.batch(i) for i in ids}

    calm, restarted = by_batch(undisturbed), by_batch(killed)
    assert killed.batch(2, "attempt") == restarted[2]     # the replay is identical
    rows = sorted(row for batch in restarted.values() for row in batch)
    assert rows == sorted(row for batch in calm.values() for row in batch)
    truth = complete(tumbling_truth(records), final_watermark(records))
    assert {(k.encode(), s, e): n for k, s, e, n, _ in rows} == truth


def test_every_aggregation_with_nulls_and_a_null_key_matches_ground_truth(
        spark, broker, topic_factory, tmp_path):
    """Each task combines its rows per key and window before the shuffle: every function,
    over integers, doubles and strings with nulls, and a null key, still equals the records."""
    writer = topic_factory(2)
    records = []
    for i in range(90):   # partition 1 lags 3 s; values: a number, a word, or nothing
        value = None if i % 7 == 0 else (b"w%d" % (i % 5) if i % 4 == 0 else b"%d" % (i % 13))
        records.append(Record(i % 2, T0 + i * 700 - (3_000 if i % 2 else 0), value=value,
                              key=None if i % 11 == 0 else b"k%d" % (i % 3)))
    writer.send(records)
    frame = stream(spark, broker, writer.topic, maxOffsetsPerTrigger="25")
    label = F.col("value").cast("string")
    frame = frame.withColumn("label", label).withColumn(
        "amount", F.expr("try_cast(cast(value as string) as int)")).withColumn(
        "half", F.col("amount") / 2)
    windowed = aggregate(frame, tumbling("10 seconds"), by=["key"], aggs={
        "rows": ("count", None), "n": ("count", "amount"), "total": ("sum", "amount"),
        "halves": ("sum", "half"), "low": ("min", "label"), "high": ("max", "amount"),
        "mean": ("avg", "amount"), "first": ("first", "amount"), "last": ("last", "label")})
    got = []
    query = (windowed.writeStream.outputMode("append")
             .foreachBatch(lambda df, _: got.extend(r.asDict() for r in df.collect()))
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination(240)
    assert query.exception() is None, query.exception()

    members = collections.defaultdict(list)
    for r in records:
        text = None if r.value is None else r.value.decode()
        number = int(text) if text is not None and text.isdigit() else None
        members[(r.key, r.timestamp - r.timestamp % SIZE)].append((r.timestamp, number, text))
    watermark = final_watermark(records)
    expected = {}
    for (key, start), rows in members.items():
        if start + SIZE - 1 > watermark:
            continue
        rows.sort()
        numbers = [n for _, n, _ in rows if n is not None]
        texts = [s for _, _, s in rows if s is not None]
        expected[(key, start)] = {
            "rows": len(rows), "n": len(numbers), "total": sum(numbers) if numbers else None,
            "halves": sum(n / 2 for n in numbers) if numbers else None,
            "low": min(texts) if texts else None, "high": max(numbers) if numbers else None,
            "mean": sum(numbers) / len(numbers) if numbers else None,
            "first": numbers[0] if numbers else None, "last": texts[-1] if texts else None,
            "kind": "final"}
    assert any(key is None for key, _ in expected) and len(expected) >= 20
    actual = {(None if r["key"] is None else bytes(r["key"]), epoch_ms(r["window_start"])):
              {k: v for k, v in r.items() if k not in ("key", "window_start", "window_end")}
              for r in got}
    assert len(actual) == len(got)                 # one row per window
    assert actual.keys() == expected.keys()
    for window, values in expected.items():
        assert actual[window] == pytest.approx(values), window


def test_a_checkpoint_of_the_first_state_layout_goes_on_where_it_stopped(
        spark, broker, topic_factory, tmp_path, monkeypatch):
    """Issue 24: buckets written as one value each (layout 1, what every window kind used
    before the window-by-window state, and sessions still use) are moved on as they are next
    touched; emitted windows keep their lateness, open ones their records."""
    import kwatermark.windows as windows_module
    from tests.support.layout_one import OneValueProcessor

    writer = topic_factory(1)
    steps = [[T0 + 1_000, T0 + 2_000, T0 + 25_000],
             [T0 + 26_000],   # [0, 10 s) final (kept 20 s for lateness); [20 s, 30 s) open
             [T0 + 5_000],    # layout 2 from here: an update of the moved, emitted window
             [T0 + 40_000],   # the lateness of [0, 10 s) ends; [20 s, 30 s) final
             [T0 + 6_000]]    # beyond the lateness: a late row
    checkpoint = str(tmp_path / "checkpoint")
    got, produced = WindowRows(), []
    for i, step in enumerate(steps):
        if i < 2:
            monkeypatch.setattr(windows_module, "WindowProcessor", OneValueProcessor)
        else:
            monkeypatch.undo()
        batch = [Record(0, t, key=b"k") for t in step]
        writer.send(batch)
        produced += batch
        frame = counts(stream(spark, broker, writer.topic), allowed_lateness="20 seconds")
        run(frame, checkpoint, rows=got)
    first = [(kind, n) for _, (_, start, _, n, kind) in sorted(got.rows, key=lambda x: x[0])
             if start == T0]
    assert first == [("final", 2), ("update", 3), ("late", 1)]
    assert got.applied() == complete(tumbling_truth(produced), T0 + 40_000 - 1)


def test_sessions_of_the_first_state_layout_go_on_where_they_stopped(
        spark, broker, topic_factory, tmp_path, monkeypatch):
    import kwatermark.windows as windows_module
    from tests.support.layout_one import OneValueProcessor

    writer = topic_factory(1)
    steps = [[T0 + 1_000, T0 + 2_000],
             [T0 + 10_000],   # the session [1 s, 4 s) final; [10 s, 12 s) open
             [T0 + 10_500],   # the new layout from here: merges into the moved session
             [T0 + 20_000]]   # [10 s, 12.5 s) final
    checkpoint = str(tmp_path / "checkpoint")
    got = WindowRows()
    for i, step in enumerate(steps):
        if i < 2:
            monkeypatch.setattr(windows_module, "SessionProcessor", OneValueProcessor)
        else:
            monkeypatch.undo()
        writer.send([Record(0, t, key=b"k") for t in step])
        run(counts(stream(spark, broker, writer.topic), session("2 seconds")), checkpoint,
            rows=got)
    assert got.applied() == {(b"k", T0 + 1_000, T0 + 4_000): 2,
                             (b"k", T0 + 10_000, T0 + 12_500): 2}
    assert got.kinds() == {"final": 2}


def two_topics_one_behind(writer_a, writer_b, lag_ms: int = 60_000, rounds: int = 5,
                          per_round: int = 20):
    """Per round, ``per_round`` records on each topic, one a second; topic B ``lag_ms``
    behind topic A in event time. Yields each round's records (A's, then B's)."""
    for r in range(rounds):
        a = [Record(0, T0 + 1_000 * (r * per_round + i + 1), key=b"k") for i in range(per_round)]
        b = [Record(0, x.timestamp - lag_ms, key=b"k") for x in a]
        writer_a.send(a)
        writer_b.send(b)
        yield a + b


def test_two_topics_windowed_together_give_one_final_per_window(spark, broker, topic_factory,
                                                                 tmp_path):
    """Issue 25: topic B runs 60 s behind topic A. Each window comes out once, final, with
    both topics' records; the watermark driving the windows is the lower of the two."""
    writer_a, writer_b = topic_factory(1), topic_factory(1)
    frames = [stream(spark, broker, w.topic) for w in (writer_a, writer_b)]
    windowed = counts(frames)
    got, produced = WindowRows(), []
    for step in two_topics_one_behind(writer_a, writer_b):
        produced += step
        run(windowed, str(tmp_path / "checkpoint"), rows=got)
    truth = tumbling_truth(produced)
    shared = {w for w in truth
              if any(r.timestamp // SIZE * SIZE == w[1] for r in writer_a.produced)
              and any(r.timestamp // SIZE * SIZE == w[1] for r in writer_b.produced)}
    # B's last record is at 40 s: its watermark completes every window up to [30 s, 40 s).
    watermark = min(final_watermark(writer_a.produced), final_watermark(writer_b.produced))
    expected = complete(truth, watermark)
    assert len(shared & expected.keys()) == 4
    assert got.applied() == expected
    windows = collections.Counter(row[:3] for _, row in got.rows)
    assert set(windows.values()) == {1}                  # one row per window: its final
    assert got.kinds() == {"final": len(expected)}


def test_aggregate_refuses_a_plain_union_of_two_streams(spark, broker, topic_factory):
    a, b = (stream(spark, broker, topic_factory(1).topic) for _ in range(2))
    with pytest.raises(WindowError, match=r"aggregate\(\[a, b\]"):
        counts(a.unionByName(b))


def test_window_whose_end_is_one_ms_above_a_batch_watermark_still_comes_out(
        spark, broker, topic_factory, tmp_path):
    # The first batch's last data row leaves Spark's watermark at exactly window_end - 2
    # (record at window_end - 1, monotonous strategy: watermark = max event time - 1); the
    # marker's heartbeat then carries the watermark past the window. bench_dropin lost 12,250
    # of 20,000 windows this way: the bucket's timer fired at that watermark with nothing due,
    # its successor was the timer that had just fired, and Spark deleted it.
    writer = topic_factory(1)
    records = [Record(0, T0 + 5_000, key=b"a"), Record(0, T0 + SIZE - 1, key=b"a"),
               Record(0, T0 + 3 * SIZE, key=b"end")]
    writer.send(records)
    got, _ = run(counts(stream(spark, broker, writer.topic)), str(tmp_path / "kw"))
    assert got.applied() == complete(tumbling_truth(records), final_watermark(records))
    assert got.kinds() == {"final": 1}


def test_an_available_now_run_ends_with_the_batch_that_gives_its_last_windows(
        spark, broker, topic_factory, tmp_path):
    # The heartbeat batch fires the last windows by the watermark its row carries; no
    # micro-batch may follow it (Spark ran one with nothing to do whenever its watermark had
    # moved, about 0.4 s at the end of every run or lull).
    writer = topic_factory(2)
    records = [Record(p, T0 + i * 1_000 + p * 300, key=f"k{i % 3}".encode())
               for i in range(40) for p in range(2)]
    writer.send(records)
    got, query = run(counts(stream(spark, broker, writer.topic, maxOffsetsPerTrigger="30")),
                     str(tmp_path / "kw"))
    assert got.applied() == complete(tumbling_truth(records), final_watermark(records))
    assert got.kinds() == {"final": len(got.applied())}
    progress = query.recentProgress
    last = progress[-1]
    assert last["numInputRows"] > 0, [p["numInputRows"] for p in progress]
    newest = max(start for _, (_, start, _, _, _) in got.rows)
    assert {batch for batch, row in got.rows if row[1] == newest} == {last["batchId"]}


def test_window_comes_out_in_the_same_micro_batch_as_sparks_own_aggregation(
        spark, broker, topic_factory, tmp_path):
    """Latency (issue 24): the rows of micro-batch N+1 carry the watermark that batch N's
    records proved; the window fires by it in batch N+1, where Spark's own aggregation (its
    watermark from batch N's event times) emits, not one batch later when Spark's watermark
    has caught up with the rows."""
    writer = topic_factory(1)
    records = [Record(0, T0 + 1_000, key=b"a"), Record(0, T0 + 4_000, key=b"a"),
               Record(0, T0 + 15_000, key=b"a")]
    writer.send(records)
    trigger = {"processingTime": "1 second"}
    got, query = run(counts(stream(spark, broker, writer.topic)), str(tmp_path / "kw"), trigger)
    first = (b"a", T0, T0 + SIZE, 2, "final")
    wait_for(got, query, lambda: any(row == first for _, row in got.rows))
    ours = [batch for batch, row in got.rows if row == first]
    data = min(p["batchId"] for p in query.recentProgress if p["numInputRows"] > 1)

    native = (kwatermark_stream(spark, broker, writer.topic)
              .withWatermark("timestamp", "1 millisecond")
              .groupBy(F.window("timestamp", "10 seconds"), "key").count())
    theirs = WindowRows()

    def collect(frame, batch_id: int) -> None:
        for r in frame.collect():
            theirs.rows.append((batch_id, (bytes(r["key"]), epoch_ms(r["window"]["start"]),
                                           epoch_ms(r["window"]["end"]), r["count"], "final")))

    spark_query = (native.writeStream.outputMode("append").foreachBatch(collect)
                   .option("checkpointLocation", str(tmp_path / "spark")).trigger(**trigger)
                   .start())
    wait_for(theirs, spark_query, lambda: any(row == first for _, row in theirs.rows))
    spark_batch = [batch for batch, row in theirs.rows if row == first]
    assert spark_batch == [1]          # the batch after the one that read the records (0)
    assert ours == [data + 1], (ours, data, got.rows)
