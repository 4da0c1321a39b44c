"""The measuring half of ``bench/bench_dropin.py``: runs under the baseline interpreter
(PySpark 4.2.0 with Spark's own Kafka source, ``tests/support/sparkkafka.py``), in one
SparkSession, every configuration interleaved, each round starting at a different one.

Request (from bench_dropin.py): bootstrap, workspace, repeat, the read topics
(``[{"topic", "partitions", "records"}]``), batches, the window topic and its sizes. Reply:
every run's figures, the Spark version and the load average before and after.
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

WINDOW = "10 seconds"
SPARK_DELAY = "10 seconds"


def read_options(bootstrap: str, topic: str, fmt: str, workspace: str) -> dict[str, str]:
    options = {"kafka.bootstrap.servers": bootstrap, "subscribe": topic,
               "startingOffsets": "earliest"}
    if fmt == "kwatermark":
        options["watermark.stateLocation"] = fresh(workspace, "ledger")
    return options


def batch_read(spark, fmt: str, options: dict, records: int) -> dict:
    """``spark.read`` of the whole topic into the noop sink (one Spark job, warm session)."""
    started = time.perf_counter()
    spark.read.format(fmt).options(**options).load().write.format("noop") \
        .mode("overwrite").save()
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "records_per_s": records / seconds}


def stream_read(spark, fmt: str, options: dict, records: int, batches: int,
                workspace: str) -> dict:
    """AvailableNow into noop, ``maxOffsetsPerTrigger = records / batches``; warm figure:
    records of batches 2.. over the sum of their triggerExecution (as bench/run.py)."""
    options = {**options, "maxOffsetsPerTrigger": str(-(-records // batches))}
    writer = (spark.readStream.format(fmt).options(**options).load().writeStream
              .format("noop").option("checkpointLocation", fresh(workspace, "checkpoint")))
    run = available_now(writer, fmt, timeout_s=900)
    if run.read != records:
        raise RuntimeError(f"{fmt}: read {run.read} records, expected {records}")
    return {"batches": len(run.data), "wall_s": run.wall_s,
            "wall_records_per_s": records / run.wall_s,
            "warm_records_per_s": run.warm_records_per_s,
            "batch_ms": [p.durationMs.get("triggerExecution", 0) for p in run.data]}


def windowed(spark, config: str, request: dict) -> dict:
    """The windowed count on the lagging stream, into a parquet sink; the parent checks the
    output against what it produced."""
    from pyspark.sql import functions as F

    from kwatermark.windows import aggregate, tumbling

    w = request["window"]
    workspace = request["workspace"]
    options = {"kafka.bootstrap.servers": request["bootstrap"], "subscribe": w["topic"],
               "startingOffsets": "earliest",
               "maxOffsetsPerTrigger": str(-(-w["records"] // w["batches"]))}
    if config == "kwatermark":
        frame = (spark.readStream.format("kwatermark").options(**options)
                 .option("watermark.stateLocation", fresh(workspace, "ledger"))
                 .option("watermark.heartbeat", "true").load())
        counts = aggregate(frame, tumbling(WINDOW), by=["key"], aggs={"n": ("count", None)})
        out_frame = counts.select(F.col("key").cast("string").alias("key"),
                                  F.unix_millis("window_start").alias("start"), "n")
    else:
        # Spark's own route, as its users write it; RocksDB as kwatermark's needs it.
        spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
        frame = spark.readStream.format("kafka").options(**options).load()
        counts = (frame.withWatermark("timestamp", SPARK_DELAY)
                  .groupBy(F.window("timestamp", WINDOW), "key").count())
        out_frame = counts.select(F.col("key").cast("string").alias("key"),
                                  F.unix_millis("window.start").alias("start"),
                                  F.col("count").alias("n"))
    out = fresh(workspace, f"out-{config}")
    run = available_now(out_frame.writeStream.outputMode("append").format("parquet")
                        .option("path", out)
                        .option("checkpointLocation", fresh(workspace, "checkpoint")),
                        f"windows {config}")
    dropped = sum(op.numRowsDroppedByWatermark for p in run.progress
                  for op in (p.stateOperators or []))
    return {"read": run.read, "wall_s": run.wall_s, "wall_records_per_s": run.read / run.wall_s,
            "warm_records_per_s": run.warm_records_per_s,
            "batches": len(run.progress), "dropped_by_watermark": dropped, "out": out}


def one_run(spark, request: dict, topics: dict, kind: str, partitions: int, fmt: str) -> dict:
    if kind == "window":
        return windowed(spark, fmt, request)
    t = topics[partitions]
    options = read_options(request["bootstrap"], t["topic"], fmt, request["workspace"])
    if kind == "batch":
        return batch_read(spark, fmt, options, t["records"])
    return stream_read(spark, fmt, options, t["records"], request["batches"],
                       request["workspace"])


def main() -> None:
    request, reply = child_io()
    load_before = os.getloadavg()
    started = time.perf_counter()
    spark = baseline_session("kwatermark-bench-dropin")
    session_s = time.perf_counter() - started
    log(f"session: Spark {spark.version} in {session_s:.1f} s")
    bootstrap, workspace = request["bootstrap"], request["workspace"]

    # Warm-up (not measured): Python workers, the JVM's paths, both sources' classes.
    warm = request["warm_topic"]
    for fmt in ("kafka", "kwatermark"):
        for attempt in (1, 2):
            try:
                options = read_options(bootstrap, warm["topic"], fmt, workspace)
                batch_read(spark, fmt, options, warm["records"])
                stream_read(spark, fmt, options, warm["records"], 2, workspace)
                break
            except Exception as exc:
                if attempt == 2 or WORKER_DID_NOT_CONNECT not in str(exc):
                    raise
    log("warm-up done")

    configs = [(kind, t["partitions"], fmt) for t in request["read_topics"]
               for kind in request["read_kinds"] for fmt in ("kafka", "kwatermark")]
    if request.get("window"):
        configs += [("window", request["window"]["partitions"], fmt)
                    for fmt in ("spark", "kwatermark")]
    topics = {t["partitions"]: t for t in request["read_topics"]}
    measure_and_reply(spark, reply, session_s, load_before,
                      lambda runs: measure(spark, request, configs, topics, runs, reply, started))


def measure(spark, request: dict, configs: list, topics: dict, runs: list, reply,
            started: float) -> None:
    budget = request.get("budget_s")
    for round_no in range(request["repeat"]):
        if runs and budget and time.perf_counter() - started > budget:
            log(f"time budget of {budget:.0f} s spent: {round_no} rounds done")
            break
        turn = (round_no * 3) % len(configs)  # each round starts elsewhere
        for kind, partitions, fmt in configs[turn:] + configs[:turn]:
            for attempt in (1, 2):
                try:
                    got = one_run(spark, request, topics, kind, partitions, fmt)
                    break
                except Exception as exc:
                    # Spark gives a starting Python worker 10 s (fixed) to connect back; a
                    # loaded 2-core machine can miss it. Only that failure is retried.
                    if attempt == 2 or WORKER_DID_NOT_CONNECT not in str(exc):
                        raise
                    log(f"{kind} {partitions} {fmt}: {WORKER_DID_NOT_CONNECT}; once more")
            got.update({"round": round_no + 1, "kind": kind, "partitions": partitions,
                        "format": fmt, "load_avg": os.getloadavg()[0]})
            runs.append(got)
            reply({"partial": True, "runs": runs})  # a later failure keeps what was measured
            rate = got.get("warm_records_per_s") or got.get("records_per_s")
            log(f"round {round_no + 1}: {kind:<6} {partitions:>3} partitions {fmt:<10} "
                f"{rate or 0:>12,.0f} records/s" + (f" (wall {got['wall_s']:.1f} s)"
                                                    if "wall_s" in got else ""))


if __name__ == "__main__":
    main()
