"""The measuring half of ``bench/bench_joins.py``: runs under the baseline interpreter
(PySpark 4.2.0 with Spark's own Kafka source, ``tests/support/sparkkafka.py``), in one
SparkSession. Spark's stream-stream join and ``dropDuplicatesWithinWatermark`` read with
``format("kafka")``; ``kwatermark.joins.interval_join`` and ``kwatermark.dedup.drop_duplicates``
with ``format("kwatermark")``; the configurations interleaved, each round starting at a
different one.

Request (from bench_joins.py): bootstrap, workspace, repeat, configs, topics
(``{"left", "right", "dedup"}``), records per topic, batches, budget_s. Reply: every run's
figures and parquet output path (the parent checks the output against what it produced),
the Spark version and the load average before and after.
"""

from __future__ import annotations

import os
import time

from child_run import (
    ROCKSDB,
    WORKER_DID_NOT_CONNECT,
    available_now,
    fresh,
    log,
    measure_and_reply,
)

from tests.support.sparkkafka import baseline_session, child_io

DELAY = "1 second"          # Spark's withWatermark delay; kwatermark's interval / within: 1 s
ID_CHARS = 10               # every value starts with the record's id, 10 digits


def read(spark, fmt: str, request: dict, topic: str):
    per_trigger = -(-request["records"] // request["batches"])
    reader = (spark.readStream.format(fmt)
              .option("kafka.bootstrap.servers", request["bootstrap"])
              .option("subscribe", topic).option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", str(per_trigger)))
    if fmt == "kwatermark":
        reader = (reader.option("watermark.stateLocation", fresh(request["workspace"], "ledger"))
                  .option("watermark.heartbeat", "true"))
    return reader.load()


def build(spark, config: str, request: dict):
    """The query of one configuration, projected to ids (the first 10 bytes of a value) the
    parent can check: join ``key, left_id, right_id, kind``; dedup ``key, id, kind``."""
    from pyspark.sql import functions as F

    from kwatermark.dedup import drop_duplicates
    from kwatermark.joins import interval_join

    topics = request["topics"]

    def ident(column: str):
        return F.substring(F.col(column), 1, ID_CHARS).cast("string")

    if config == "kw-join":
        joined = interval_join(read(spark, "kwatermark", request, topics["left"]),
                               read(spark, "kwatermark", request, topics["right"]),
                               on=["key"], lower="0 seconds", upper="1 second")
        return joined.select(F.col("key").cast("string").alias("key"),
                             ident("left_value").alias("left_id"),
                             ident("right_value").alias("right_id"), "kind")
    if config == "spark-join":
        # Spark's own route, as its users write it (RocksDB, as kwatermark's needs it).
        left = read(spark, "kafka", request, topics["left"]) \
            .withWatermark("timestamp", DELAY).alias("l")
        right = read(spark, "kafka", request, topics["right"]) \
            .withWatermark("timestamp", DELAY).alias("r")
        joined = left.join(right, F.expr(
            "l.key = r.key AND r.timestamp BETWEEN l.timestamp AND "
            "l.timestamp + interval 1 second"))
        return joined.select(F.col("l.key").cast("string").alias("key"),
                             F.substring(F.col("l.value"), 1, ID_CHARS).cast("string")
                             .alias("left_id"),
                             F.substring(F.col("r.value"), 1, ID_CHARS).cast("string")
                             .alias("right_id"),
                             F.lit("match").alias("kind"))
    if config.startswith("kw-dedup"):
        from kwatermark import dedup

        # kw-dedup-cN: N chunks per bucket instead of dedup.CHUNKS (the chunk column is
        # computed when the query is built; an A/B of the state's round trips in one session).
        default = dedup.CHUNKS
        if config.startswith("kw-dedup-c"):
            dedup.CHUNKS = int(config[len("kw-dedup-c"):])
        try:
            unique = drop_duplicates(read(spark, "kwatermark", request, topics["dedup"]),
                                     ["key"], within="1 second")
        finally:
            dedup.CHUNKS = default
        return unique.select(F.col("key").cast("string").alias("key"),
                             ident("value").alias("id"), "kind")
    if config in ("kw-read", "spark-read"):
        # The read alone (the dedup topic into the same sink): the source's share of a run.
        fmt = "kwatermark" if config == "kw-read" else "kafka"
        frame = read(spark, fmt, request, topics["dedup"])
        if fmt == "kwatermark":
            frame = frame.where(~F.col("is_heartbeat"))
        return frame.select(F.col("key").cast("string").alias("key"), ident("value").alias("id"),
                            F.lit("read").alias("kind"))
    if config == "spark-dedup":
        unique = (read(spark, "kafka", request, topics["dedup"])
                  .withWatermark("timestamp", DELAY).dropDuplicatesWithinWatermark(["key"]))
        return unique.select(F.col("key").cast("string").alias("key"), ident("value").alias("id"),
                             F.lit("first").alias("kind"))
    raise ValueError(f"unknown configuration {config!r}")


def run_one(spark, config: str, request: dict) -> dict:
    """One AvailableNow run into parquet on a fresh checkpoint. Warm throughput: records of
    the batches after the first with data over the sum of their triggerExecution (as
    bench/run.py); state: the largest figures any state operator reported."""
    out = fresh(request["workspace"], f"out-{config}")
    frame = build(spark, config, request)
    run = available_now(frame.writeStream.outputMode("append").format("parquet")
                        .option("path", out)
                        .option("checkpointLocation", fresh(request["workspace"], "checkpoint")),
                        config)
    progress = run.progress
    state = [op for p in progress for op in (p.stateOperators or [])]
    return {"read": run.read, "batches": len(progress), "wall_s": run.wall_s,
            "wall_records_per_s": run.read / run.wall_s,
            "warm_s": run.warm_s, "warm_records_per_s": run.warm_records_per_s,
            "batch_ms": [p.durationMs.get("triggerExecution", 0) for p in progress],
            "state_rows_max": max((op.numRowsTotal for op in state), default=0),
            "state_bytes_max": max((op.memoryUsedBytes for op in state), default=0),
            "dropped_by_watermark": sum(op.numRowsDroppedByWatermark for op in state),
            "out": out}


def main() -> None:
    request, reply = child_io()
    load_before = os.getloadavg()
    started = time.perf_counter()
    spark = baseline_session("kwatermark-bench-joins",
                             conf={"spark.sql.streaming.stateStore.providerClass": ROCKSDB})
    session_s = time.perf_counter() - started
    log(f"session: Spark {spark.version} in {session_s:.1f} s")
    measure_and_reply(spark, reply, session_s, load_before,
                      lambda runs: measure(spark, request, runs, reply, started))


def measure(spark, request: dict, runs: list, reply, started: float) -> None:
    configs = request["configs"]
    budget = request.get("budget_s")
    if request.get("warmup"):
        # Not measured: Python workers, JIT and both sources' classes, so that round 1 does
        # not charge the configuration it starts with for the session's warm-up.
        for config in configs:
            run_one(spark, config, request)
        log("warm-up round done")
    for round_no in range(request["repeat"]):
        if runs and budget and time.perf_counter() - started > budget:
            log(f"time budget of {budget:.0f} s spent: {round_no} rounds done")
            break
        turn = round_no % len(configs)  # each round starts at another configuration
        for config in configs[turn:] + configs[:turn]:
            for attempt in (1, 2):
                try:
                    got = run_one(spark, config, request)
                    break
                except Exception as exc:
                    # Spark gives a starting Python worker 10 s (fixed) to connect back; a
                    # loaded 2-core machine can miss it. Only that failure is retried.
                    if attempt == 2 or WORKER_DID_NOT_CONNECT not in str(exc):
                        raise
                    log(f"{config}: {WORKER_DID_NOT_CONNECT}; once more")
            got.update({"round": round_no + 1, "config": config,
                        "load_avg": os.getloadavg()[0]})
            runs.append(got)
            reply({"partial": True, "runs": runs})  # a later failure keeps what was measured
            log(f"round {round_no + 1}: {config:<11} {got['warm_records_per_s'] or 0:>9,.0f} "
                f"records/s warm, wall {got['wall_s']:.1f} s, state max "
                f"{got['state_rows_max']:,} rows / {got['state_bytes_max']:,} bytes")


if __name__ == "__main__":
    main()
