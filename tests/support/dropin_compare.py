"""Child script: read the same cases through ``format("kafka")`` and ``format("kwatermark")``.

Runs under the baseline interpreter (``tests.support.sparkkafka.run_baseline``), in one
SparkSession for every case. The request::

    {"bootstrap": "127.0.0.1:9092", "checkpoints": "/tmp/dir",
     "cases": [{"name": "...", "mode": "batch" | "stream", "options": {...},
                "formats": ["kafka", "kwatermark"]}]}

The reply, per case and format: the rows in Spark's Kafka columns (binary as hex, timestamp
as epoch microseconds, headers as ``[[key, hex-or-null], ...]`` or null), sorted; the
schema of those columns (``StructType.jsonValue()``); for streams the row count of every
micro-batch; or the error, so one failing case does not hide the others.
"""

from __future__ import annotations

import os
import time
import traceback

from pyspark.sql import functions as F

from tests.support.sparkkafka import baseline_session, child_io

WORKER_DID_NOT_CONNECT = "Python worker failed to connect back"
KAFKA_COLUMNS = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]


def columns(options: dict) -> list[str]:
    headers = str(options.get("includeHeaders", "false")).lower() == "true"
    return KAFKA_COLUMNS + (["headers"] if headers else [])


def encode(df, names: list[str]) -> list[list]:
    # Spark turns the timestamp into epoch microseconds so no time zone is involved.
    rows = df.select(*[F.unix_micros("timestamp").alias("timestamp") if n == "timestamp"
                       else F.col(n) for n in names]).collect()
    out = []
    for row in rows:
        values = []
        for name, value in zip(names, row):
            if name in ("key", "value"):
                value = None if value is None else bytes(value).hex()
            elif name == "headers":
                value = None if value is None else [
                    [h["key"], None if h["value"] is None else bytes(h["value"]).hex()]
                    for h in value]
            values.append(value)
        out.append(values)
    return out


def sort_key(row: list) -> tuple:
    return (row[2], row[3], row[4])  # topic, partition, offset


def read_batch(spark, fmt: str, options: dict) -> dict:
    df = spark.read.format(fmt).options(**options).load()
    names = columns(options)
    return {"schema": df.select(*names).schema.jsonValue(),
            "rows": sorted(encode(df, names), key=sort_key)}


def read_stream(spark, fmt: str, options: dict, checkpoint: str) -> dict:
    df = spark.readStream.format(fmt).options(**options).load()
    names = columns(options)
    batches: list[list[list]] = []

    def collect(batch_df, batch_id):  # runs on the driver, once per micro-batch
        batches.append(encode(batch_df, names))

    query = (df.writeStream.foreachBatch(collect).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    return {"schema": df.select(*names).schema.jsonValue(),
            "rows": sorted((r for b in batches for r in b), key=sort_key),
            "batches": [len(b) for b in batches]}


def main() -> None:
    request, reply = child_io()
    spark = baseline_session("kwatermark-dropin")
    results: dict[str, dict] = {}
    for case in request["cases"]:
        options = {"kafka.bootstrap.servers": request["bootstrap"], **case["options"]}
        results[case["name"]] = {}
        for fmt in case.get("formats", ["kafka", "kwatermark"]):
            started = time.perf_counter()
            for attempt in (1, 2):
                try:
                    if case["mode"] == "batch":
                        got = read_batch(spark, fmt, options)
                    else:
                        checkpoint = os.path.join(request["checkpoints"],
                                                  f"{case['name']}-{fmt}-{attempt}")
                        got = read_stream(spark, fmt, options, checkpoint)
                    break
                except Exception as exc:  # noqa: BLE001 - reported to the test, which fails
                    got = {"error": f"{type(exc).__name__}: {exc}\n"
                                    f"{traceback.format_exc()[-3000:]}"}
                    # Spark gives a starting Python worker 10 s (fixed, PythonWorkerFactory)
                    # to connect back to the JVM, which a 2-core machine under heavy load can
                    # miss: that, and only that, is Spark's machinery failing rather than a
                    # source: retried once.
                    if WORKER_DID_NOT_CONNECT not in str(exc):
                        break
                    got["retried"] = True
            got["seconds"] = round(time.perf_counter() - started, 1)
            results[case["name"]][fmt] = got
    reply({"spark_version": spark.version, "cases": results})
    spark.stop()


if __name__ == "__main__":
    main()
