"""Catch-up with a lagging partition: downstream state and throughput, alignment on vs off.

The stream reads two topics of one partition each (DESIGN §11, issue 13):

* ``backlog``: ``--records`` records (1,000,000 by default) whose event times cover one
  hour, all there before the query starts: the partition being caught up;
* ``lagging``: ``--lagging-records`` records covering the same hour, produced *while the
  query runs*, over ``--lag-seconds`` of wall time: a partition whose producer is itself
  behind (a backfill, a slow upstream). It holds the combined watermark.

Downstream is Spark's native ``groupBy(window(event_time, "1 minute"), key).count()`` in
append mode, with Spark's watermark tied to kwatermark's ``watermark`` column (below), so
Spark keeps a window's rows in its state store until kwatermark's combined watermark passes
the window. ``numRowsTotal`` of the aggregation's state store, read from each batch's query
progress, is the state the downstream holds.

The stream is caught up when both topics are read to the end. Its watermark cannot get there
before the lagging partition does, whatever is read ahead of it; reading the backlog ahead
only fills the downstream state. With ``watermark.alignment.maxDrift`` the backlog is read
at most ``maxDrift`` (plus one batch's span) ahead of the lagging partition.

Each round runs both configurations, in turn, starting with a different one each round; the
report gives medians. Figures go to ``bench/results/admission.json``.

    .venv/bin/python bench/bench_admission.py                      # the full run
    .venv/bin/python bench/bench_admission.py --records 100000 --lagging-records 3600 \\
        --lag-seconds 60 --limit 10000 --rounds 1 --results /tmp/bench   # a quick trial
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import threading
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH_DIR)

import common
from run import log, start_spark

from kwatermark.offsets import BatchOffset

HOUR_MS = 3_600_000
WINDOW = "1 minute"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap-servers", help="an existing Kafka (default: start Tansu)")
    parser.add_argument("--records", type=int, default=1_000_000,
                        help="backlog records, there before the query starts")
    parser.add_argument("--lagging-records", type=int, default=36_000,
                        help="records of the lagging partition, produced during the run")
    parser.add_argument("--lag-seconds", type=float, default=150.0,
                        help="wall time over which the lagging partition is produced")
    parser.add_argument("--limit", type=int, default=100_000, help="maxOffsetsPerTrigger")
    parser.add_argument("--max-drift", default="1 minute",
                        help="watermark.alignment.maxDrift of the aligned configuration")
    parser.add_argument("--keys", type=int, default=100, help="aggregation keys per window")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--results", default=os.path.join(BENCH_DIR, "results"))
    return parser.parse_args(argv)


def produce_backlog(broker: common.Broker, topic: str, records: int, start_ms: int) -> None:
    """``records`` evenly over one hour of event time; the last one in a batch of its own
    (Tansu reports the end offset as the last batch's base offset + 1, DESIGN §8)."""
    producer = common.fast_producer(broker.bootstrap_servers)
    step = HOUR_MS / records
    for i in range(records):
        common._produce(producer, topic, 0, b"b%d" % i, start_ms + int(i * step))
        if i == records - 2 and producer.flush(300) != 0:
            raise RuntimeError(f"topic {topic}: records left unsent")
        if i % 10_000 == 0:
            producer.poll(0)
    producer.flush(300)


class LaggingProducer(threading.Thread):
    """Produces the lagging partition at a steady pace while the query runs."""

    def __init__(self, broker: common.Broker, topic: str, records: int, seconds: float,
                 start_ms: int):
        super().__init__(daemon=True)
        self.broker, self.topic, self.records = broker, topic, records
        self.seconds, self.start_ms = seconds, start_ms
        self.failed: BaseException | None = None

    def run(self) -> None:
        try:
            producer = common.fast_producer(self.broker.bootstrap_servers)
            step = HOUR_MS / self.records
            chunks = max(1, int(self.seconds * 20))          # a flush every 50 ms
            per_chunk = max(1, self.records // chunks)
            began = time.perf_counter()
            i = 0
            while i < self.records - 1:
                for _ in range(min(per_chunk, self.records - 1 - i)):
                    common._produce(producer, self.topic, 0, b"l%d" % i,
                                    self.start_ms + int(i * step))
                    i += 1
                producer.flush(60)
                due = began + self.seconds * i / self.records
                time.sleep(max(0.0, due - time.perf_counter()))
            common._produce(producer, self.topic, 0, b"last",
                            self.start_ms + int((self.records - 1) * step))
            producer.flush(60)
        except BaseException as exc:  # noqa: BLE001 - reported by the run
            self.failed = exc


def windowed_counts(stream, keys: int):
    """Spark's own windowed count, evicting by kwatermark's combined watermark.

    Spark's watermark is the maximum of its watermark column over the previous batch; on the
    ``watermark`` column that is the combined watermark kwatermark reached. Spark evicts the
    state of a grouping key that carries the watermark marker, so the event-time column is
    given that marker by hand: the windows are then closed by kwatermark's watermark, not by
    Spark's global maximum event time.
    """
    from pyspark.sql import functions as F

    clocked = (stream.select("event_time", "offset", F.col("watermark").alias("clock"))
               .withWatermark("clock", "0 seconds"))
    # After withWatermark: it strips the marker from every column but its own.
    marked = clocked.select(
        F.col("event_time").alias("t", metadata={"spark.watermarkDelayMs": 0}),
        (F.col("offset") % keys).alias("k"))
    return (marked
            .groupBy(F.window("t", WINDOW), "k").count())


def one_run(spark, broker: common.Broker, backlog_topic: str, args, aligned: bool,
            start_ms: int) -> dict:
    lagging_topic = broker.create_topic(1, "adm-lagging")
    work = tempfile.mkdtemp(prefix="kwatermark-bench-adm-")
    reader = (spark.readStream.format("kwatermark")
              .option("kafka.bootstrap.servers", broker.bootstrap_servers)
              .option("subscribe", f"{backlog_topic},{lagging_topic}")
              .option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", str(args.limit))
              .option("watermark.stateLocation", os.path.join(work, "ledger")))
    if aligned:
        reader = reader.option("watermark.alignment.maxDrift", args.max_drift)
    counts = windowed_counts(reader.load(), args.keys)
    producer = LaggingProducer(broker, lagging_topic, args.lagging_records,
                               args.lag_seconds, start_ms)
    query = (counts.writeStream.format("noop").outputMode("append")
             .option("checkpointLocation", os.path.join(work, "checkpoint")).start())
    started = time.time()
    producer.start()
    ends = {f"{backlog_topic}:0": args.records, f"{lagging_topic}:0": args.lagging_records}
    done_batch = None
    try:
        while done_batch is None:
            if query.exception() is not None:
                raise RuntimeError(f"query failed: {query.exception()}")
            if producer.failed is not None:
                raise RuntimeError(f"lagging producer failed: {producer.failed}")
            if time.time() - started > 30 * 60:
                raise RuntimeError("no catch-up within 30 minutes")
            for progress in query.recentProgress:
                reached = _ends(progress)
                if all(reached.get(k) == n for k, n in ends.items()):
                    done_batch = progress["batchId"]
                    break
            time.sleep(0.2)
    finally:
        query.stop()
        producer.join(60)
    progresses = [p for p in query.recentProgress if p["batchId"] <= done_batch]
    first, last = progresses[0], progresses[-1]
    began = _epoch_s(first["timestamp"])
    ended = _epoch_s(last["timestamp"]) + last["durationMs"]["triggerExecution"] / 1000
    backlog_done = min(_epoch_s(p["timestamp"]) + p["durationMs"]["triggerExecution"] / 1000
                       for p in progresses
                       if _reached(p, f"{backlog_topic}:0") == args.records)
    state = [p["stateOperators"][0]["numRowsTotal"] for p in progresses if p["stateOperators"]]
    dropped = sum(p["stateOperators"][0].get("numRowsDroppedByWatermark", 0)
                  for p in progresses if p["stateOperators"])
    held = sum(1 for p in progresses
               if any(r.state.held for r in BatchOffset.from_json(
                   p["sources"][0]["endOffset"]).partitions.values()))
    total = args.records + args.lagging_records
    trace = []
    for p in progresses:
        offset = BatchOffset.from_json(p["sources"][0]["endOffset"])
        trace.append({
            "batch": p["batchId"], "rows": p["numInputRows"],
            "watermark": offset.watermark,
            "read": {f"{t}:{n}".split("-")[1]: [r.start, r.end] + (["held"] if r.state.held
                                                                   else [])
                     for (t, n), r in sorted(offset.partitions.items())},
            "state_rows": p["stateOperators"][0]["numRowsTotal"] if p["stateOperators"] else 0,
            "ms": p["durationMs"]["triggerExecution"]})
    return {
        "aligned": aligned,
        "catch_up_s": round(ended - began, 3),
        "records_per_s": round(total / (ended - began), 1),
        "backlog_read_s": round(backlog_done - began, 3),
        "peak_state_rows": max(state) if state else 0,
        "final_state_rows": state[-1] if state else 0,
        "rows_dropped_by_spark_watermark": dropped,
        "batches": len(progresses),
        "batches_with_a_held_partition": held,
        "trace": trace,
    }


def _ends(progress: dict) -> dict[str, int]:
    """Each partition's ``to`` ("topic:p"): the endOffset's Spark's-Kafka-shaped part."""
    offset = json.loads(progress["sources"][0]["endOffset"] or "{}")
    return {f"{topic}:{p}": to for topic, parts in offset.items() if topic != "@kwatermark"
            for p, to in parts.items()}


def _reached(progress: dict, key: str) -> int | None:
    return _ends(progress).get(key)


def _epoch_s(timestamp: str) -> float:
    return dt.datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def summarise(runs: list[dict]) -> dict:
    by = {name: [r for r in runs if r["aligned"] == (name == "aligned")]
          for name in ("unaligned", "aligned")}
    medians = {name: {key: statistics.median(r[key] for r in rs)
                      for key in ("catch_up_s", "records_per_s", "backlog_read_s",
                                  "peak_state_rows", "batches")}
               for name, rs in by.items()}
    throughput = medians["aligned"]["records_per_s"] / medians["unaligned"]["records_per_s"]
    state = medians["aligned"]["peak_state_rows"] / max(1, medians["unaligned"]
                                                         ["peak_state_rows"])
    return {"medians": medians, "aligned_throughput_x": round(throughput, 3),
            "aligned_peak_state_x": round(state, 3),
            "target_throughput_ge_0_9": throughput >= 0.9}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    broker = common.Broker.open(args.bootstrap_servers)
    log(f"broker: {broker.kind} at {broker.bootstrap_servers}")
    try:
        spark, _ = start_spark("kwatermark-bench-admission", conf={
            "spark.sql.streaming.numRecentProgressUpdates": "10000"})
        start_ms = 1_700_000_000_000
        backlog = broker.create_topic(1, "adm-backlog")
        began = time.perf_counter()
        produce_backlog(broker, backlog, args.records, start_ms)
        log(f"backlog: {args.records:,} records in {time.perf_counter() - began:.1f} s")
        warm = broker.create_topic(1, "adm-warm")
        produce_backlog(broker, warm, 2_000, start_ms)
        warm_args = argparse.Namespace(**{**vars(args), "records": 2_000,
                                          "lagging_records": 100, "lag_seconds": 1.0})
        log(f"warm-up (discarded): {one_run(spark, broker, warm, warm_args, True, start_ms)}"
            [:200])
        runs = []
        for round_ in range(args.rounds):
            order = [False, True] if round_ % 2 == 0 else [True, False]
            for aligned in order:
                run = one_run(spark, broker, backlog, args, aligned, start_ms)
                run["round"] = round_
                runs.append(run)
                log(json.dumps({k: v for k, v in run.items() if k != "trace"}))
        summary = summarise(runs)
        results = {
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "args": {k: v for k, v in vars(args).items() if k != "results"},
            "window": WINDOW, "runs": runs, **summary,
            "machine": common.machine_info(),
        }
        os.makedirs(args.results, exist_ok=True)
        path = os.path.join(args.results, "admission.json")
        with open(path, "w") as f:
            json.dump(results, f, indent=2)
        for name, m in summary["medians"].items():
            log(f"{name:>9}: catch-up {m['catch_up_s']:.1f} s, {m['records_per_s']:,.0f} "
                f"records/s, backlog read in {m['backlog_read_s']:.1f} s, peak state "
                f"{m['peak_state_rows']:,.0f} rows, {m['batches']:.0f} batches")
        log(f"aligned/unaligned: throughput {summary['aligned_throughput_x']}x, peak state "
            f"{summary['aligned_peak_state_x']}x -> {path}")
        spark.stop()
        return 0
    finally:
        broker.stop()


if __name__ == "__main__":
    sys.exit(main())
