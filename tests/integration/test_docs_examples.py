"""The code of docs/windows.md and docs/watermarks.md, run as a reader pastes it.

The docs show docs/examples/*.py verbatim (tests/unit/test_docs_examples.py checks that);
here they run in one namespace, in the docs' order, against the broker docs/examples/setup.py
starts, and their output is compared with ground truth computed from the records read back
from the topic.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import io
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.support.streams import epoch_ms

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"


def run_example(name: str, namespace: dict) -> str:
    path = EXAMPLES / f"{name}.py"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(path.read_text(), str(path), "exec"), namespace)  # noqa: S102
    return out.getvalue()


@pytest.fixture(scope="module")
def docs(spark):
    namespace: dict = {}
    run_example("setup", namespace)
    yield namespace
    for client in ("producer", "admin"):    # no reconnect attempts to a stopped broker
        namespace.pop(client, None)
    gc.collect()
    namespace["broker"].stop()


def produced(namespace: dict) -> list[tuple[int, int, str, int]]:
    """(partition, event time ms, key, amount) of every record in the docs' topic."""
    consumer = Consumer({"bootstrap.servers": namespace["bootstrap"], "group.id": "docs-check",
                         "enable.auto.commit": False})
    records = []
    try:
        for p in (0, 1):
            _, high = consumer.get_watermark_offsets(TopicPartition(namespace["topic"], p), 30)
            consumer.assign([TopicPartition(namespace["topic"], p, 0)])
            got = 0
            while got < high:
                message = consumer.poll(10)
                assert message is not None and message.error() is None, message
                records.append((p, message.timestamp()[1], message.key().decode(),
                                int(message.value())))
                got += 1
    finally:
        consumer.close()
    return records


def final_watermark(records) -> int:
    highest = collections.defaultdict(lambda: -(2 ** 63))
    for p, t, _, _ in records:
        highest[p] = max(highest[p], t)
    return min(highest.values()) - 1


def table(spark, name: str, *columns: str) -> dict:
    return {(r["key"], epoch_ms(r["window_start"]), epoch_ms(r["window_end"])):
            tuple(r[c] for c in columns) for r in spark.table(name).collect()}


def fixed_windows(records, size: int, slide: int):
    """(key, start, end) -> the records' (time, amount) in time order."""
    windows = collections.defaultdict(list)
    for _, t, key, amount in sorted(records, key=lambda r: r[1]):
        last = t - t % slide
        for start in range(last, t - size, -slide):
            windows[(key, start, start + size)].append((t, amount))
    return windows


def completed(windows: dict, watermark: int) -> dict:
    return {w: v for w, v in windows.items() if w[2] - 1 <= watermark}


def test_window_kinds_as_the_docs_show_them(spark, docs):
    run_example("tumbling", docs)
    records = produced(docs)
    mark = final_watermark(records)
    expected = {w: (len(v), sum(a for _, a in v))
                for w, v in completed(fixed_windows(records, 10_000, 10_000), mark).items()}
    assert len(expected) == 5
    assert table(spark, "tumbling", "n", "amount", "kind") == \
        {w: (*v, "final") for w, v in expected.items()}

    run_example("sliding", docs)
    expected = {w: (len(v), max(a for _, a in v), "final")
                for w, v in completed(fixed_windows(records, 20_000, 10_000), mark).items()}
    assert table(spark, "sliding", "n", "biggest", "kind") == expected

    run_example("session", docs)
    sessions = {}
    for key in {r[2] for r in records}:   # offline: a gap of more than 5 s splits
        times = sorted((t, a) for _, t, k, a in records if k == key)
        current = [times[0]]
        for t, a in times[1:]:
            if t > current[-1][0] + 5_000:
                sessions[(key, current[0][0], current[-1][0] + 5_000)] = current
                current = []
            current.append((t, a))
        sessions[(key, current[0][0], current[-1][0] + 5_000)] = current
    expected = {w: (len(v), v[0][1], v[-1][1], "final")
                for w, v in completed(sessions, mark).items()}
    assert table(spark, "session", "n", "first", "last", "kind") == expected


def test_lateness_sink_applies_update_and_late_rows(spark, docs):
    first = run_example("sink", docs)
    assert " update " not in first and " late " not in first
    printed = run_example("late", docs)
    kinds = collections.Counter(line.split()[1] for line in printed.splitlines()
                                if line[:1].isdigit())
    assert kinds["update"] == 1 and kinds["late"] == 1      # 27 s within, 8 s past lateness
    records = produced(docs)
    expected = {(w[0], w[1]): len(v) for w, v in
                completed(fixed_windows(records, 10_000, 10_000),
                          final_watermark(records)).items()}
    rows = docs["db"].execute("SELECT key, window_start, base + late FROM counts").fetchall()
    assert {(k, epoch_ms(_parse(s))): n for k, s, n in rows} == expected


def _parse(text: str):
    import datetime as dt

    return dt.datetime.fromisoformat(text)


def test_custom_event_time_timer_processor_from_watermarks_md(spark, docs):
    """docs/watermarks.md "Using the column downstream": the hand-written processor."""
    run_example("custom_timers", docs)
    records = [r for r in produced(docs)]
    got = {(r["key"], epoch_ms(r["window_start"])): (r["n"], r["kind"])
           for r in spark.table("custom").collect()}
    # It reads whatever the topic holds when it runs: the set-up's records, and the later
    # ones if the lateness example ran first; either way every completed window, final.
    expected = {(w[0], w[1]): (len(v), "final") for w, v in
                completed(fixed_windows(records, 10_000, 10_000),
                          final_watermark(records)).items()}
    assert got == expected


def test_custom_processor_surfaces_a_record_after_its_window_as_late(spark, docs, tmp_path):
    """The example's ``late`` branch: a record whose window its row watermark had already
    completed comes out as a ``late`` row, beside the window's ``final``."""
    from confluent_kafka.admin import NewTopic
    from pyspark.sql import functions as F

    topic, t0 = "late-clicks", docs["T0"]
    docs["admin"].create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    rows: list = []

    def run(frame, name):   # the example's runner, on one checkpoint for both runs
        query = (frame.writeStream.outputMode("append")
                 .foreachBatch(lambda df, _: rows.extend(r.asDict() for r in df.collect()))
                 .option("checkpointLocation", str(tmp_path / "checkpoint"))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        assert query.exception() is None, query.exception()
        return spark.createDataFrame([tuple(r.values()) for r in rows], namespace["OUTPUT"])

    stream = (spark.readStream.format("kwatermark")
              .option("kafka.bootstrap.servers", docs["bootstrap"])
              .option("subscribe", topic).option("startingOffsets", "earliest")
              .option("watermark.heartbeat", "true").load()
              .withColumn("key", F.col("key").cast("string")))
    namespace = {**docs, "events": stream, "run": run}
    for second in ([1, 25], [5]):       # then 5 s: its window [0, 10 s) completed at 24.999 s
        for s in second:
            docs["producer"].produce(topic, partition=0, key=b"a", value=b"1",
                                     timestamp=t0 + s * 1000)
            docs["producer"].flush()
        run_example("custom_timers", namespace)
    got = sorted((r["key"], epoch_ms(r["window_start"]) - t0, r["n"], r["kind"]) for r in rows)
    assert got == [("a", 0, 1, "final"), ("a", 0, 1, "late")]


def test_interval_join_example_from_joins_md(spark, docs):
    """docs/joins.md: views left-joined with the clicks that follow within 5 s."""
    out = run_example("joins", docs)
    assert "match" in out
    clicks = produced(docs)
    views = [(0, "a"), (8, "b"), (11, "a"), (30, "a"), (45, "b")]
    view_times = [docs["T0"] + s * 1000 for s, _ in views]
    watermark = min(final_watermark(clicks), max(view_times) - 1)
    expected = collections.Counter()
    for (second, key), v in zip(views, view_times):
        partners = [(t, a) for _, t, k, a in clicks if k == key and v <= t <= v + 5_000]
        for t, a in partners:
            expected[(key, v, t, a, "match")] += 1
        if not partners and v + 5_000 <= watermark:
            expected[(key, v, None, None, "left_only")] += 1
    got = collections.Counter(
        (r["key"], epoch_ms(r["left_event_time"]), epoch_ms(r["right_event_time"]),
         r["right_amount"], r["kind"]) for r in spark.table("joined").collect())
    assert got == expected and sum(expected.values()) >= 4


def test_dedup_example_from_dedup_md(spark, docs):
    """docs/dedup.md: the re-sent click is dropped, every other record comes out first."""
    run_example("dedup", docs)
    records = sorted(produced(docs), key=lambda r: r[1])
    kept, expected = [], collections.Counter()
    for _, t, key, amount in records:      # one AvailableNow batch: nothing is late
        if not any(k == (key, amount) and abs(t - s) <= 1_000 for k, s in kept):
            kept.append(((key, amount), t))
            expected[(key, amount, t)] += 1
    got = collections.Counter((r["key"], int(r["amount"]), epoch_ms(r["event_time"]))
                              for r in spark.table("unique").collect()
                              if r["kind"] == "first")
    assert got == expected and len(records) - sum(expected.values()) >= 1
    assert {r["kind"] for r in spark.table("unique").collect()} == {"first"}
