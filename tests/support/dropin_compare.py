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

A stream case may instead give ``"steps"``, run in order for each format on one checkpoint:
``{"run": true}`` (an AvailableNow run), ``{"delete": topic}``, ``{"create": topic,
"partitions": n}`` (retried while the broker still deletes a topic of that name),
``{"produce": topic, "records": [[partition, timestamp ms, key, value], ...]}``. ``{fmt}``
in the options' values and the steps' topics stands for the format, so each format gets
topics of its own. Its reply has ``"runs"``: each run's rows and batches, or its error.
"""

from __future__ import annotations

import os
import time
import traceback

from pyspark.sql import functions as F

from tests.support.jvm import TEST_SPARK_CONF
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


def for_format(value, fmt: str):
    return value.replace("{fmt}", fmt) if isinstance(value, str) else value


def admin_step(bootstrap: str, step: dict, fmt: str) -> None:
    """Delete, create or produce to a topic between two runs of a stream case."""
    from confluent_kafka import KafkaException, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    if "delete" in step:
        for future in admin.delete_topics([for_format(step["delete"], fmt)]).values():
            future.result(30)
    elif "create" in step:
        topic = NewTopic(for_format(step["create"], fmt), step["partitions"], 1)
        deadline = time.monotonic() + 60
        while True:  # a deleted topic's name is free only once the broker has removed it
            try:
                for future in admin.create_topics([topic]).values():
                    future.result(30)
                break
            except KafkaException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
    else:
        producer = Producer({"bootstrap.servers": bootstrap})
        for partition, timestamp, key, value in step["records"]:
            producer.produce(for_format(step["produce"], fmt), partition=partition,
                             timestamp=timestamp, key=key.encode(), value=value.encode())
        assert producer.flush(30) == 0, "records not delivered"


def run_steps(spark, request: dict, case: dict, fmt: str, options: dict) -> dict:
    runs = []
    checkpoint = os.path.join(request["checkpoints"], f"{case['name']}-{fmt}")
    for step in case["steps"]:
        if not step.get("run"):
            admin_step(request["bootstrap"], step, fmt)
            continue
        for _attempt in (1, 2):  # a second attempt resumes from the checkpoint
            try:
                got = read_stream(spark, fmt, options, checkpoint)
                break
            except Exception as exc:  # noqa: BLE001 - reported to the test, which asserts
                got = {"error": f"{type(exc).__name__}: {exc}"[:6000]}
                if WORKER_DID_NOT_CONNECT not in str(exc):  # see main()
                    break
        runs.append(got)
    return {"runs": runs}


def main() -> None:
    request, reply = child_io()
    spark = baseline_session("kwatermark-dropin", conf=TEST_SPARK_CONF)
    results: dict[str, dict] = {}
    for case in request["cases"]:
        results[case["name"]] = {}
        for fmt in case.get("formats", ["kafka", "kwatermark"]):
            options = {"kafka.bootstrap.servers": request["bootstrap"],
                       **{k: for_format(v, fmt) for k, v in case["options"].items()}}
            started = time.perf_counter()
            if "steps" in case:
                got = run_steps(spark, request, case, fmt, options)
                got["seconds"] = round(time.perf_counter() - started, 1)
                results[case["name"]][fmt] = got
                continue
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
