"""A kwatermark query in a process of its own, for tests that kill the query process.

``python -m tests.support.killable_query SPEC.json`` starts a SparkSession, runs the stream
the spec describes and writes every micro-batch to ``<out>/batch-<id>.json`` (replacing the
file atomically, so a replayed batch overwrites its earlier attempt: batch-id keyed output).

``windows`` = "10 seconds" runs ``kwatermark.windows.aggregate`` (tumbling counts per key)
over the stream and writes its window rows instead.

``join`` = {"right_options": {...}, "lower", "upper", "how"} runs
``kwatermark.joins.interval_join`` on the key (the spec's ``options`` read the left topic)
and writes ``[kind, key, left_partition, left_offset, right_partition, right_offset]``;
``dedup`` = {"within": "..."} runs ``kwatermark.dedup.drop_duplicates`` on the key and
writes ``[kind, key, partition, offset]``.

``kill_in_batch`` = K makes the first attempt of batch K write its rows to
``<out>/attempt-<K>.json`` and then SIGKILL its whole process group (this interpreter and
Spark's JVM with its Python workers) before the batch is committed. Tests kill "between
batches" from outside, see ``tests/integration/test_restart.py``.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from tests.support.jvm import TEST_JVM_OPTIONS
from tests.support.streams import epoch_ms


def _window_rows(frame) -> list[list]:
    return sorted([r["key"].decode(), epoch_ms(r["window_start"]), epoch_ms(r["window_end"]),
                   r["count"], r["kind"]] for r in frame.collect())


def _text(key) -> str | None:
    return None if key is None else bytes(key).decode()


def _join_rows(frame) -> list[list]:
    rows = frame.select("kind", "key", "left_partition", "left_offset", "right_partition",
                        "right_offset").collect()
    return sorted(([r[0], _text(r[1]), *r[2:]] for r in rows), key=json.dumps)


def _dedup_rows(frame) -> list[list]:
    rows = frame.select("kind", "key", "partition", "offset").collect()
    return sorted(([r[0], _text(r[1]), *r[2:]] for r in rows), key=json.dumps)


def _rows(frame) -> list[list]:
    rows = frame.select("partition", "offset", "value", "timestamp", "watermark").collect()
    return sorted([r["partition"], r["offset"], r["value"].decode(),
                   epoch_ms(r["timestamp"]), epoch_ms(r["watermark"])] for r in rows)


def _write(path: str, payload) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(payload, f)
    os.replace(path + ".tmp", path)


def main(spec_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    out = spec["out"]
    kill_in_batch = spec.get("kill_in_batch")

    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("kwatermark-killable")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.sql.shuffle.partitions", "2")   # state stores of the windows
             .config("spark.driver.extraJavaOptions", TEST_JVM_OPTIONS)
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")

    windows, join, dedup = spec.get("windows"), spec.get("join"), spec.get("dedup")
    collect = (_window_rows if windows else _join_rows if join else _dedup_rows if dedup
               else _rows)

    def sink(frame, batch_id: int) -> None:
        rows = collect(frame)
        attempt = os.path.join(out, f"attempt-{batch_id}.json")
        if batch_id == kill_in_batch and not os.path.exists(attempt):
            _write(attempt, rows)
            os.killpg(os.getpgid(0), signal.SIGKILL)
        _write(os.path.join(out, f"batch-{batch_id}.json"), rows)

    def read(options: dict):
        reader = spark.readStream.format("kwatermark")
        for key, value in options.items():
            reader = reader.option(key, value)
        return reader.load()

    stream = read(spec["options"])
    if windows:  # kwatermark.windows over the stream: tumbling counts per key
        from kwatermark.windows import aggregate, tumbling

        stream = aggregate(stream, tumbling(windows), by=["key"])
    elif join:
        from kwatermark.joins import interval_join

        stream = interval_join(stream, read(join["right_options"]), on=["key"],
                               lower=join["lower"], upper=join["upper"], how=join["how"])
    elif dedup:
        from kwatermark.dedup import drop_duplicates

        stream = drop_duplicates(stream, ["key"], within=dedup["within"])
    writer = (stream.writeStream.foreachBatch(sink)
              .option("checkpointLocation", spec["checkpoint"]))
    if spec["trigger"] == "availableNow":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=spec["trigger"])
    query = writer.start()
    query.awaitTermination()
    if query.exception() is not None:
        raise SystemExit(f"query failed: {query.exception()}")


if __name__ == "__main__":
    main(sys.argv[1])
