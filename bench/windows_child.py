"""The measuring half of ``bench/bench_windows.py``: runs under the baseline interpreter
(PySpark 4.2.0 with Spark's own Kafka source, ``tests/support/sparkkafka.py``), in one
SparkSession: kwatermark's windowed count over ``format("kwatermark")`` and Spark's own
``groupBy(window(...) | session_window(...), key).count()`` over ``format("kafka")``, the
configurations interleaved, each round starting at a different one.

Request (from bench_windows.py): ``mode`` ("throughput" or "latency"), bootstrap, workspace,
topics, sizes and configurations. Reply: every run's figures (the parquet sink's path for the
parent to check), the Spark version, the load average per run. Throughput replies after every
run, so a failure keeps what was measured.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH_DIR)

from child_run import ROCKSDB, WORKER_DID_NOT_CONNECT, available_now, fresh, log

from tests.support.sparkkafka import baseline_session, child_io

PROVIDER = "spark.sql.streaming.stateStore.providerClass"
HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"


# -- CPU by party (JVM vs Python), from /proc --------------------------------------------------


def _tree_cpu() -> dict[str, float]:
    """CPU seconds of this process's descendants by kind: Spark's JVM and the Python processes
    (Python workers and planning runners, exited ones through their parents' counters)."""
    tick = os.sysconf("SC_CLK_TCK")
    procs = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        procs[int(pid)] = (name, int(fields[1]),
                           sum(int(v) for v in fields[11:15]) / tick,  # utime stime cutime cstime
                           sum(int(v) for v in fields[11:13]) / tick)
    children: dict[int, list[int]] = {}
    for pid, (_, ppid, _, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    spent = {"driver": procs.get(os.getpid(), ("", 0, 0.0, 0.0))[3], "jvm": 0.0, "python": 0.0}
    for jvm in children.get(os.getpid(), []):
        if procs[jvm][0] != "java":
            continue
        spent["jvm"] += procs[jvm][3]
        stack = list(children.get(jvm, []))
        # The JVM's reaped children (Python workers that exited) count in its cutime/cstime.
        spent["python"] += procs[jvm][2] - procs[jvm][3]
        for pid in stack:
            spent["python"] += procs[pid][2]
    return spent


def cpu_since(before: dict[str, float]) -> dict[str, float]:
    after = _tree_cpu()
    return {k: round(max(0.0, after[k] - before.get(k, 0.0)), 2) for k in after}


# -- the queries ------------------------------------------------------------------------------


def windowed(spark, config: str, request: dict, options: dict[str, str], delay: str,
             live: dict[str, str] | None = None):
    """The windowed count by kwatermark (``kwatermark[:buckets]``, over
    ``format("kwatermark")``) or by Spark (``spark``, ``spark-hdfs``, over
    ``format("kafka")``): key, start (ms), end (ms), n, kind. ``source`` and ``kafka-source``:
    the source alone."""
    from pyspark.sql import functions as F

    from kwatermark.windows import aggregate, session, tumbling

    kw = config.startswith("kwatermark") or config == "source"
    reader = spark.readStream.format("kwatermark" if kw else "kafka").options(**options)
    if kw:
        reader = reader.option("watermark.stateLocation", fresh(request["workspace"], "ledger"))
        for key, value in (live or {}).items():
            reader = reader.option(key, value)
    if config.startswith("kwatermark"):
        reader = reader.option("watermark.heartbeat", "true")
    frame = reader.load()
    if config in ("source", "kafka-source"):
        return frame
    if kw:
        extra = {"key_buckets": int(config.split(":")[1])} if ":" in config else {}
        windows = session(request["session"]) if request["session"] else \
            tumbling(request["window"])
        counts = aggregate(frame, windows, by=["key"], aggs={"n": ("count", None)}, **extra)
        return counts.select(F.col("key").cast("string").alias("key"),
                             F.unix_millis("window_start").alias("start"),
                             F.unix_millis("window_end").alias("end"), "n", "kind")
    # Spark's own route, as its users write it on its own Kafka source.
    spark.conf.set(PROVIDER, HDFS if config == "spark-hdfs" else ROCKSDB)
    column = F.session_window("timestamp", request["session"]) if request["session"] else \
        F.window("timestamp", request["window"])
    counts = frame.withWatermark("timestamp", delay).groupBy(column.alias("w"), "key").count()
    return counts.select(F.col("key").cast("string").alias("key"),
                         F.unix_millis("w.start").alias("start"),
                         F.unix_millis("w.end").alias("end"),
                         F.col("count").alias("n"), F.lit("final").alias("kind"))


def run_one(spark, config: str, request: dict, topic: str, per_trigger: int, records: int
            ) -> dict:
    """One AvailableNow run into parquet (noop for the sources alone) on a fresh checkpoint."""
    workspace = request["workspace"]
    options = {"kafka.bootstrap.servers": request["bootstrap"], "subscribe": topic,
               "startingOffsets": "earliest", "maxOffsetsPerTrigger": str(per_trigger)}
    frame = windowed(spark, config, request, options, request["spark_delay"])
    writer = frame.writeStream.option("checkpointLocation", fresh(workspace, "checkpoint"))
    out = None
    if config in ("source", "kafka-source"):
        writer = writer.format("noop")
    else:
        out = fresh(workspace, f"out-{config}")
        writer = writer.outputMode("append").format("parquet").option("path", out)
    cpu = _tree_cpu()
    run = available_now(writer, config)
    cpu = cpu_since(cpu)
    progress, read, wall = run.progress, run.read, run.wall_s
    if read < records:
        raise RuntimeError(f"{config}: read {read} records, expected at least {records}")
    data = run.data
    trigger_s, rows = run.warm_s, run.warm_records
    state = [op for p in progress for op in (p.stateOperators or [])]
    full_ms = [p.durationMs.get("triggerExecution", 0) for p in data
               if p.numInputRows >= per_trigger // 2]
    return {
        "data_batch_ms": [p.durationMs.get("triggerExecution", 0) for p in data],
        "full_batch_ms": full_ms,
        "last_over_second": full_ms[-1] / full_ms[1] if len(full_ms) > 2 else None,
        "batches": len(progress), "data_batches": len(data),
        "first_batch_s": data[0].durationMs.get("triggerExecution", 0) / 1000.0,
        "warm_records": rows, "warm_s": trigger_s,
        "warm_records_per_s": rows / trigger_s if trigger_s else None,
        "wall_s": wall, "wall_records_per_s": read / wall,
        "dropped_by_watermark": sum(op.numRowsDroppedByWatermark for op in state),
        "batch_ms": [p.durationMs.get("triggerExecution", 0) for p in progress],
        "cpu": cpu, "out": out,
    }


def _retrying(what: str, run):
    for attempt in (1, 2):
        try:
            return run()
        except Exception as exc:
            # Spark gives a starting Python worker 10 s (fixed) to connect back; a loaded
            # 2-core machine can miss it. Only that failure is retried.
            if attempt == 2 or WORKER_DID_NOT_CONNECT not in str(exc):
                raise
            log(f"{what}: {WORKER_DID_NOT_CONNECT}; once more")


def throughput(spark, request: dict, reply) -> dict:
    configs = request["configs"]
    warm = request["warm_topic"]
    for config in configs:  # Python workers, JIT, every query plan; not measured
        _retrying(f"warm-up {config}", lambda c=config: run_one(
            spark, c, request, warm["topic"], warm["per_trigger"], warm["records"]))
    log("warm-up done")
    runs: list[dict] = []
    error = None
    try:
        for round_no in range(1, request["repeat"] + 1):
            turn = (round_no - 1) % len(configs)
            for config in configs[turn:] + configs[:turn]:
                load = os.getloadavg()[0]
                run = _retrying(config, lambda c=config: run_one(
                    spark, c, request, request["topic"], request["per_trigger"],
                    request["records"]))
                run.update({"round": round_no, "config": config, "load_avg": load})
                runs.append(run)
                reply({"partial": True, "runs": runs})
                log(f"round {round_no}: {config:<13} {run['warm_records_per_s'] or 0:>10,.0f} "
                    f"records/s warm ({run['warm_s']:.1f} s; data batches (s) "
                    f"{' '.join(f'{ms / 1000:.1f}' for ms in run['data_batch_ms'])}; "
                    f"cpu {run['cpu']}; load {load:.2f})")
    except Exception as exc:  # noqa: BLE001 - what was measured is still reported
        error = f"{type(exc).__name__}: {str(exc)[:2000]}"
        log(f"stopped: {error}")
    return {"runs": runs, "error": error}


def latency(spark, request: dict) -> dict:
    """Both queries at once on one live stream (produced here, event time = wall clock minus
    up to the disorder); per final window, the time its rows reach the sink."""
    import common

    lat = request["latency"]
    topic, partitions, keys = request["topic"], request["partitions"], request["keys"]
    arrivals: dict[str, dict[tuple[str, int], float]] = {c: {} for c in request["configs"]}
    stop = threading.Event()
    produced = [0]

    def produce_live() -> None:
        producer = common.fast_producer(request["bootstrap"])
        value = b"x" * common.VALUE_SIZE
        tick = 0.01
        per_tick = max(1, round(lat["rate"] * tick))
        started = time.monotonic()
        i = 0
        while not stop.is_set():
            now = int(time.time() * 1000)
            for _ in range(per_tick):
                while True:
                    try:
                        producer.produce(topic, key=f"k{i % keys}".encode(), value=value,
                                         partition=i % partitions,
                                         timestamp=now - random.randint(0, lat["disorder_ms"]))
                        break
                    except BufferError:
                        producer.poll(0.05)
                i += 1
            producer.poll(0)
            ahead = started + i / lat["rate"] - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
        producer.flush(30)
        produced[0] = i

    def sink(config: str):
        def collect(frame, batch_id: int) -> None:
            rows = frame.where("kind = 'final'").select("key", "end").collect()
            at = time.time() * 1000
            for r in rows:
                arrivals[config].setdefault((r["key"], r["end"]), at)
        return collect

    options = {"kafka.bootstrap.servers": request["bootstrap"], "subscribe": topic,
               "startingOffsets": "earliest"}
    bounded = {"watermark.strategy": "bounded",
               "watermark.maxOutOfOrderness": lat["disorder"]}
    queries = {}
    for config in request["configs"]:
        frame = windowed(spark, config, request, options, lat["disorder"], live=bounded)
        queries[config] = (frame.writeStream.outputMode("append").foreachBatch(sink(config))
                           .option("checkpointLocation",
                                   fresh(request["workspace"], "checkpoint"))
                           .trigger(processingTime=lat["trigger"]).start())
    producer = threading.Thread(target=produce_live, daemon=True)
    began = time.time() * 1000
    load_before = os.getloadavg()
    producer.start()
    log(f"producing {lat['rate']:,} records/s for {lat['seconds']} s; "
        f"{', '.join(queries)} running")
    time.sleep(lat["seconds"])
    stop.set()
    producer.join()
    ended = time.time() * 1000
    time.sleep(2 * lat["reach_ms"] / 1000 + 10)
    batch_ms = {}
    errors = {}
    for config, query in queries.items():
        if query.exception() is not None:
            errors[config] = str(query.exception())[:2000]
        batch_ms[config] = [p["durationMs"].get("triggerExecution", 0)
                            for p in query.recentProgress]
        query.stop()
    return {"arrivals": {c: [[k, e, at] for (k, e), at in got.items()]
                         for c, got in arrivals.items()},
            "began_ms": began, "ended_ms": ended, "produced": produced[0],
            "batch_ms": batch_ms, "errors": errors, "load_avg_before": load_before,
            "load_avg_after": os.getloadavg()}


def main() -> None:
    request, reply = child_io()
    load_before = os.getloadavg()
    started = time.perf_counter()
    spark = baseline_session(
        "kwatermark-bench-windows",
        conf={"spark.sql.shuffle.partitions": str(request["shuffle_partitions"]),
              "spark.sql.streaming.stopTimeout": "30s"})
    session_s = time.perf_counter() - started
    try:
        if request["mode"] == "latency":
            result = latency(spark, request)
        else:
            result = throughput(spark, request, reply)
        result.update({"spark_version": spark.version, "session_s": session_s,
                       "load_avg_before": load_before, "load_avg_after": os.getloadavg()})
        reply(result)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
