"""Interval join and deduplication: ``kwatermark.joins.interval_join`` and
``kwatermark.dedup.drop_duplicates`` against Spark's own stream-stream join and
``dropDuplicatesWithinWatermark`` over the same streams, in the same run.

Data: two topics of ``--records`` records each over ``--partitions`` partitions, key
``k{i % keys}`` (default 1,000 keys). Left record i has event time ``T0 + i`` ms, right record
i ``T0 + i + 500`` ms: with the interval ``[0 s, 1 s]`` and 1,000 keys, left i matches right i
and nothing else, so the true join is ``--records`` matches. The dedup topic holds every key
``d{i // 2}`` twice, 200 ms apart (``--records`` records, ``--records / 2`` keys).

Spark's side reads with kwatermark's source (``format("kwatermark")`` without heartbeats)
and applies ``withWatermark("event_time", "1 second")``: Spark's Kafka connector
(``format("kafka")``) is not in this checkout's set-up yet (DESIGN §17 wants it as the
anchor). Both read with the same ``maxOffsetsPerTrigger`` (``--batches``), Trigger.AvailableNow,
into a parquet sink (append) on fresh checkpoints; one round per ``--repeat``, the order of
the configurations rotated between rounds.

Throughput: records read / the sum of ``durationMs.triggerExecution`` of every batch after
the first (bench_windows.py's rule). State: the largest ``numRowsTotal`` and
``memoryUsedBytes`` any state operator reported. kwatermark's output is checked against the
ground truth (every match once; every key once).

Run: ``python bench/bench_joins.py --records 20000 --repeat 1`` (a few minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime, timezone

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH_DIR)

import common
from run import Workspace, git_revision, log, median, start_spark

DELAY = "1 second"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--bootstrap-servers", help="existing Kafka; default: start one here")
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--configs", default="kw-join,spark-join,kw-dedup,spark-dedup")
    parser.add_argument("--results", default=os.path.join(BENCH_DIR, "results"))
    args = parser.parse_args(argv)
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    return args


def produce(broker: common.Broker, topic: str, records: int, partitions: int, key, shift: int
            ) -> None:
    """Record i: partition i % partitions, key ``key(i)``, timestamp ``T0 + i + shift(i)``;
    each partition's last record flushed alone (Tansu's end offset, DESIGN §8)."""
    producer = common.fast_producer(broker.bootstrap_servers)

    def send(i: int) -> None:
        while True:
            try:
                producer.produce(topic, key=key(i), value=b"x" * 100, partition=i % partitions,
                                 timestamp=common.BASE_TS_MS + i + shift(i))
                return
            except BufferError:
                producer.poll(0.05)

    for i in range(records - partitions):
        send(i)
    if producer.flush(300):
        raise RuntimeError(f"topic {topic}: records left unsent")
    for i in range(records - partitions, records):   # each partition's last record alone
        send(i)
        producer.flush(60)
    ends = broker.end_offsets(topic, partitions)
    if sum(ends.values()) != records:
        raise RuntimeError(f"topic {topic}: end offsets {ends}, expected {records} in all")


def stream(spark, bootstrap: str, topic: str, ws: Workspace, per_trigger: int, heartbeat: bool):
    reader = (spark.readStream.format("kwatermark")
              .option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
              .option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", str(per_trigger))
              .option("watermark.stateLocation", ws.fresh("ledger")))
    if heartbeat:
        reader = reader.option("watermark.heartbeat", "true")
    return reader.load()


def build(spark, config: str, bootstrap: str, topics: dict, ws: Workspace, per_trigger: int):
    from pyspark.sql import functions as F

    from kwatermark.dedup import drop_duplicates
    from kwatermark.joins import interval_join

    kw = config.startswith("kw")

    def read(name):
        return stream(spark, bootstrap, topics[name], ws, per_trigger, heartbeat=kw)

    if config == "kw-join":
        joined = interval_join(read("left"), read("right"), on=["key"], lower="0 seconds",
                               upper="1 second")
        return joined.select(F.col("key").cast("string").alias("key"), "left_offset",
                             "left_partition", "right_offset", "right_partition", "kind")
    if config == "spark-join":
        left = read("left").withWatermark("event_time", DELAY).alias("l")
        right = read("right").withWatermark("event_time", DELAY).alias("r")
        joined = left.join(right, F.expr(
            "l.key = r.key AND r.event_time BETWEEN l.event_time AND "
            "l.event_time + interval 1 second"))
        return joined.select(F.col("l.key").cast("string").alias("key"),
                             F.col("l.offset").alias("left_offset"),
                             F.col("l.partition").alias("left_partition"),
                             F.col("r.offset").alias("right_offset"),
                             F.col("r.partition").alias("right_partition"),
                             F.lit("match").alias("kind"))
    if config == "kw-dedup":
        unique = drop_duplicates(read("dedup"), ["key"], within="1 second")
        return unique.select(F.col("key").cast("string").alias("key"), "kind")
    unique = (read("dedup").withWatermark("event_time", DELAY)
              .dropDuplicatesWithinWatermark(["key"]))
    return unique.select(F.col("key").cast("string").alias("key"), F.lit("first").alias("kind"))


def run_one(spark, config: str, bootstrap: str, topics: dict, ws: Workspace, per_trigger: int
            ) -> dict:
    frame = build(spark, config, bootstrap, topics, ws, per_trigger)
    out = ws.fresh(f"out-{config}")
    started = time.perf_counter()
    query = (frame.writeStream.outputMode("append").format("parquet").option("path", out)
             .option("checkpointLocation", ws.fresh("checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination(1800)
    wall = time.perf_counter() - started
    if query.isActive:
        query.stop()
        raise RuntimeError(f"{config}: the AvailableNow run did not finish in 1800 s")
    if query.exception() is not None:
        raise RuntimeError(f"{config} failed: {query.exception()}")
    progress = list(query.recentProgress)
    read = sum(p.numInputRows for p in progress)
    data = [p for p in progress if p.numInputRows > 0]
    later = progress[progress.index(data[0]) + 1:]
    trigger_s = sum(p.durationMs.get("triggerExecution", 0) for p in later) / 1000.0
    state = [op for p in progress for op in (p.stateOperators or [])]
    rows = spark.read.parquet(out)
    return {
        "read": read, "batches": len(progress), "warm_s": trigger_s,
        "warm_records_per_s": sum(p.numInputRows for p in later) / trigger_s,
        "wall_s": wall,
        "state_rows_max": max((op.numRowsTotal for op in state), default=0),
        "state_bytes_max": max((op.memoryUsedBytes for op in state), default=0),
        "dropped_by_watermark": sum(op.numRowsDroppedByWatermark for op in state),
        "output_rows": rows.count(),
        "distinct_output": rows.select("key", *[c for c in rows.columns
                                                if c.endswith(("offset", "partition"))])
                           .distinct().count(),
        "kinds": {r["kind"]: r["count"] for r in rows.groupBy("kind").count().collect()},
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    broker = common.Broker.open(args.bootstrap_servers)
    log(f"broker: {broker.kind} at {broker.bootstrap_servers}")
    ws = Workspace()
    spark = None
    n, keys = args.records, args.keys
    results: dict = {
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": common.machine_info(), "git": git_revision(), "broker": broker.kind,
        "sizes": {"records": n, "partitions": args.partitions, "keys": keys,
                  "batches": args.batches, "repeat": args.repeat, "spark_delay": DELAY,
                  "spark_reads_with": "format('kwatermark') (format('kafka') not set up)"},
    }
    runs: dict[str, list] = {}
    try:
        topics = {name: broker.create_topic(args.partitions, f"bench-{name}")
                  for name in ("left", "right", "dedup")}
        produce(broker, topics["left"], n, args.partitions,
                lambda i: b"k%d" % (i % keys), lambda i: 0)
        produce(broker, topics["right"], n, args.partitions,
                lambda i: b"k%d" % (i % keys), lambda i: 500)
        produce(broker, topics["dedup"], n, args.partitions,
                lambda i: b"d%d" % (i // 2), lambda i: (i % 2) * 200)
        log(f"produced {n:,} records to each of {', '.join(topics.values())}")
        spark, _ = start_spark("kwatermark-bench-joins")
        per_trigger = -(-n // args.batches)
        for round_no in range(1, args.repeat + 1):
            turn = (round_no - 1) % len(args.configs)
            for config in args.configs[turn:] + args.configs[:turn]:
                run = run_one(spark, config, broker.bootstrap_servers, topics, ws, per_trigger)
                runs.setdefault(config, []).append(run)
                log(f"round {round_no}: {config:<11} {run['warm_records_per_s']:>9,.0f} "
                    f"records/s warm, {run['output_rows']:,} rows out {run['kinds']}, state "
                    f"max {run['state_rows_max']:,} rows / {run['state_bytes_max']:,} bytes, "
                    f"wall {run['wall_s']:.1f} s")
    finally:
        if spark is not None:
            spark.stop()
        broker.stop()
        ws.remove()
    expected = {"kw-join": n, "spark-join": n, "kw-dedup": n // 2, "spark-dedup": n // 2}
    summary = {}
    for config, measured in runs.items():
        summary[config] = {
            "warm_records_per_s": median([r["warm_records_per_s"] for r in measured]),
            "expected_rows": expected[config],
            "output_rows": [r["output_rows"] for r in measured],
            "runs": measured}
        if config.startswith("kw") and any(r["output_rows"] != expected[config]
                                           or r["distinct_output"] != expected[config]
                                           for r in measured):
            raise RuntimeError(f"{config}: output differs from the ground truth: {measured}")
    results["configs"] = summary
    for op in ("join", "dedup"):
        if f"kw-{op}" in summary and f"spark-{op}" in summary:
            results[f"{op}_ratio"] = summary[f"kw-{op}"]["warm_records_per_s"] / \
                summary[f"spark-{op}"]["warm_records_per_s"]
    os.makedirs(args.results, exist_ok=True)
    path = os.path.join(args.results, "joins.json")
    with open(path, "w") as out:
        json.dump(results, out, indent=2)
        out.write("\n")
    print()
    for config, s in summary.items():
        print(f"{config:<11} warm {s['warm_records_per_s']:>9,.0f} records/s   rows out "
              f"{s['output_rows']} of {s['expected_rows']:,} true")
    for op in ("join", "dedup"):
        if f"{op}_ratio" in results:
            print(f"kwatermark / spark {op}: {results[f'{op}_ratio']:.2f}x")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
