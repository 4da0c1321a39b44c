"""Child script: kwatermark's join and dedup beside Spark's own, both read from the broker
(tests/integration/test_joins_spark.py). It lives here, not in tests/support: a script's own
folder comes first on ``sys.path``, and tests/support/secrets.py would shadow the standard
library's ``secrets``, which numpy (pandas, so ``transformWithState``) imports.

Runs under the baseline interpreter (PySpark 4.2.0 with Spark's Kafka source,
``tests.support.sparkkafka.run_baseline``), in one SparkSession for every query. The test
writes the records, round by round, into the request; this child produces each round (one
idempotent producer, so a partition's offsets are the records' order) and then runs every
query of that round as one ``Trigger.AvailableNow`` run on the query's own checkpoint (a
restart between rounds, as a scheduled job does). Request::

    {"bootstrap": "...", "checkpoints": "/tmp/dir",
     "rounds": [[[topic, partition, timestamp_ms, key_hex_or_null], ...], ...],
     "queries": [{"name": "...", "kind": "kw_join" | "spark_join" | "kw_dedup" | "spark_dedup",
                  "rounds": [0, 1, ...], "left": topic, "right": topic, "topic": topic,
                  "lower_ms": 0, "upper_ms": 5000, "how": "left", "delay": "1 second",
                  "within": "5 seconds"}]}

Reply: ``produced`` (per round, each record's [topic, partition, offset] in request order),
and per query its ``rows`` (``[round, batch, kind, key, left_partition, left_offset,
right_partition, right_offset]`` for joins; ``[round, batch, kind, key, partition, offset]``
for dedup; keys as text) and ``dropped_by_watermark`` (Spark's own count), or its ``error``:
one failing query does not hide the others.
"""

from __future__ import annotations

import os
import time
import traceback

from confluent_kafka import Producer
from pyspark.sql import functions as F

from tests.support.jvm import TEST_SPARK_CONF
from tests.support.sparkkafka import baseline_session, child_io

WORKER_DID_NOT_CONNECT = "Python worker failed to connect back"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def produce(bootstrap: str, records: list[list]) -> list[list]:
    """Send the records in order; their (topic, partition, offset) from the delivery reports."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 5})
    placed: list = [None] * len(records)
    failures: list[str] = []

    def delivered(index: int):
        def report(err, msg):
            if err is not None:
                failures.append(str(err))
            else:
                placed[index] = [msg.topic(), msg.partition(), msg.offset()]
        return report

    for index, (topic, partition, timestamp, key) in enumerate(records):
        producer.produce(topic, partition=partition, timestamp=timestamp, value=b"",
                         key=None if key is None else bytes.fromhex(key),
                         on_delivery=delivered(index))
        producer.poll(0)
    left = producer.flush(60)
    if failures or left or any(p is None for p in placed):
        raise RuntimeError(f"producing failed: {left} unsent, errors {failures[:5]}")
    return placed


def kafka_stream(spark, bootstrap: str, topic: str, fmt: str):
    reader = (spark.readStream.format(fmt).option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", topic).option("startingOffsets", "earliest"))
    if fmt == "kwatermark":
        reader = reader.option("watermark.heartbeat", "true")
    return reader.load()


def build(spark, bootstrap: str, query: dict):
    """The query's output with columns kind, key, left_partition, left_offset,
    right_partition, right_offset (joins) or kind, key, partition, offset (dedup)."""
    kind = query["kind"]
    text_key = F.col("key").cast("string").alias("key")
    if kind == "kw_join":
        from kwatermark.joins import interval_join

        joined = interval_join(kafka_stream(spark, bootstrap, query["left"], "kwatermark"),
                               kafka_stream(spark, bootstrap, query["right"], "kwatermark"),
                               on=["key"], lower=f"{query['lower_ms']} milliseconds",
                               upper=f"{query['upper_ms']} milliseconds", how=query["how"])
        return joined.select("kind", text_key, "left_partition", "left_offset",
                             "right_partition", "right_offset")
    if kind == "spark_join":
        # Spark's own stream-stream join as its users write it over format("kafka").
        def side(topic: str, name: str):
            return (kafka_stream(spark, bootstrap, topic, "kafka")
                    .select(F.col("key").alias(f"{name}k"),
                            F.col("timestamp").alias(f"{name}t"),
                            F.col("partition").alias(f"{name}p"),
                            F.col("offset").alias(f"{name}o"))
                    .withWatermark(f"{name}t", query["delay"]))

        condition = F.expr(f"lk = rk AND rt BETWEEN lt + interval {query['lower_ms']} "
                           f"milliseconds AND lt + interval {query['upper_ms']} milliseconds")
        joined = side(query["left"], "l").join(side(query["right"], "r"), condition,
                                               "leftouter" if query["how"] == "left"
                                               else query["how"])
        return joined.select(
            F.when(F.col("ro").isNull(), F.lit("left_only")).otherwise(F.lit("match"))
            .alias("kind"), F.col("lk").cast("string").alias("key"),
            F.col("lp").alias("left_partition"), F.col("lo").alias("left_offset"),
            F.col("rp").alias("right_partition"), F.col("ro").alias("right_offset"))
    if kind == "kw_dedup":
        from kwatermark.dedup import drop_duplicates

        unique = drop_duplicates(kafka_stream(spark, bootstrap, query["topic"], "kwatermark"),
                                 ["key"], within=query["within"])
        return unique.select("kind", text_key, "partition", "offset")
    if kind == "spark_dedup":
        unique = (kafka_stream(spark, bootstrap, query["topic"], "kafka")
                  .withWatermark("timestamp", query["within"])
                  .dropDuplicatesWithinWatermark(["key"]))
        return unique.select(F.lit("first").alias("kind"), text_key, "partition", "offset")
    raise ValueError(f"unknown query kind {kind!r}")


def run_round(spark, bootstrap: str, query: dict, frame, checkpoint: str, round_no: int
              ) -> tuple[list[list], int]:
    """One AvailableNow run; every output row tagged with its round and batch id (a replayed
    batch replaces its earlier attempt)."""
    by_batch: dict[int, list[list]] = {}

    def collect(batch_df, batch_id: int) -> None:
        by_batch[batch_id] = [[round_no, batch_id, *row] for row in batch_df.collect()]

    stream = (frame.writeStream.outputMode("append").foreachBatch(collect)
              .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    stream.awaitTermination(600)
    if stream.isActive:
        stream.stop()
        raise RuntimeError(f"{query['name']}: round {round_no} did not finish in 600 s")
    if stream.exception() is not None:
        raise RuntimeError(f"{query['name']} failed in round {round_no}: {stream.exception()}")
    dropped = sum(op.numRowsDroppedByWatermark for p in stream.recentProgress
                  for op in (p.stateOperators or []))
    return [r for b in sorted(by_batch) for r in by_batch[b]], dropped


def main() -> None:
    request, reply = child_io()
    bootstrap = request["bootstrap"]
    spark = baseline_session("kwatermark-joins-compare", conf=TEST_SPARK_CONF)
    log(f"session: Spark {spark.version}")
    results = {q["name"]: {"rows": [], "dropped_by_watermark": 0, "seconds": 0.0}
               for q in request["queries"]}
    produced = []
    for round_no, records in enumerate(request["rounds"]):
        produced.append(produce(bootstrap, records))
        for query in request["queries"]:
            result = results[query["name"]]
            if round_no not in query["rounds"] or "error" in result:
                continue
            started = time.perf_counter()
            checkpoint = os.path.join(request["checkpoints"], query["name"])
            for attempt in (1, 2):
                try:
                    rows, dropped = run_round(spark, bootstrap, query,
                                              build(spark, bootstrap, query), checkpoint,
                                              round_no)
                    result["rows"] += rows
                    result["dropped_by_watermark"] += dropped
                    break
                except Exception as exc:  # noqa: BLE001 - reported to the test, which fails
                    # Spark gives a starting Python worker 10 s (fixed) to connect back; a
                    # loaded 2-core machine can miss it. Only that is retried, on the same
                    # checkpoint (the failed batch is replayed).
                    if attempt == 1 and WORKER_DID_NOT_CONNECT in str(exc):
                        continue
                    result["error"] = (f"round {round_no}: {type(exc).__name__}: {exc}\n"
                                       f"{traceback.format_exc()[-3000:]}")
            result["seconds"] += time.perf_counter() - started
            log(f"round {round_no} {query['name']}: {len(result['rows'])} rows so far"
                + (" (failed)" if "error" in result else ""))
    reply({"spark_version": spark.version, "produced": produced, "queries": results})
    spark.stop()


if __name__ == "__main__":
    main()
