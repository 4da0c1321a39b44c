"""kwatermark against Spark's own Kafka source (``format("kafka")``), same topics, same run.

The anchor of the read path (DESIGN §17). Spark's connector must have Spark's version and
Maven Central serves it up to 4.2.0, so the measuring runs in a child process on PySpark
4.2.0 with ``spark-sql-kafka-0-10_2.13:4.2.0`` added through ``spark.jars``
(``tests/support/sparkkafka.py``); both sources run in that one SparkSession, interleaved,
each round starting at a different configuration.

* **read**: ``--records`` records of 100 bytes (default 1,000,000) at each of
  ``--partitions`` (default 4 and 64), ``startingOffsets=earliest``: a batch read
  (``spark.read`` into noop, whole job) and an AvailableNow stream into noop with
  ``maxOffsetsPerTrigger = records / --batches`` (warm: batches 2.. over their
  triggerExecution, as bench/run.py). kwatermark / ``format("kafka")`` is the ratio.
* **window**: a 10-second tumbling count per key on a stream whose last partition lags
  ``--lag`` seconds in event time (``--window-records``, 4 partitions, 1,000 keys, one record
  per ms of event time, then one record per partition 20 s past the data so every data
  window can close). Spark's route: ``format("kafka")`` + ``withWatermark("timestamp",
  "10 seconds")`` + ``groupBy(window, key).count()``; kwatermark's:
  ``kwatermark.windows.aggregate`` over ``format("kwatermark")``. Both AvailableNow with the
  same ``maxOffsetsPerTrigger``, into parquet; the counts are checked here against what was
  produced (records counted of produced), with throughput.

Starts a local Apache Kafka (``kwatermark-broker --kind kafka``'s broker) unless
``--bootstrap-servers`` is given. Writes ``bench/results/dropin.json``.
``--profile`` instead prints a cProfile of one kwatermark task reading a 4-partition topic's
share (``RangeReader`` in this process, no Spark).

Run: ``python bench/bench_dropin.py`` (about 15 minutes on 2 cores);
``--records 200000 --window-records 50000 --repeat 1 --results /tmp/db`` for a trial.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import sys
import tempfile
from datetime import datetime, timezone

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(BENCH_DIR)
sys.path.insert(0, BENCH_DIR)
sys.path.insert(1, REPO_ROOT)  # tests.support.sparkkafka

import common
from run import git_revision, log, median

from tests.support.sparkkafka import BASELINE_PYSPARK, kafka_package, run_baseline

WINDOW_MS = 10_000
MARKER_GAP_MS = 20_000
WINDOW_PARTITIONS = 4
WINDOW_KEYS = 1_000
TARGET_READ_RATIO = 0.5  # kwatermark >= 0.5 x format("kafka") at 4 partitions


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap-servers", help="existing Kafka; default: start one")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", default="4,64")
    parser.add_argument("--read-kinds", default="batch,stream",
                        help="batch, stream or both (default)")
    parser.add_argument("--batches", type=int, default=5,
                        help="micro-batches of the stream read (default 5)")
    parser.add_argument("--window-records", type=int, default=200_000,
                        help="records of the windowed stream (0: skip it)")
    # Spark 4 drops a row as late against the previous micro-batch's watermark, so a lag
    # under one micro-batch's span of event time (40 s at the defaults) plus the 10 s delay
    # loses nothing: at 60 s Spark counted every record.
    parser.add_argument("--lag", type=float, default=150.0,
                        help="seconds the window stream's last partition lags (default 150)")
    parser.add_argument("--window-batches", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds after which no further round starts (a loaded "
                             "machine); the rounds done are reported")
    parser.add_argument("--profile", action="store_true",
                        help="cProfile one kwatermark task's read instead of the comparison")
    parser.add_argument("--results", default=os.path.join(BENCH_DIR, "results"))
    args = parser.parse_args(argv)
    args.partitions = [int(p) for p in args.partitions.split(",") if p.strip()]
    args.read_kinds = [k.strip() for k in args.read_kinds.split(",") if k.strip()]
    return args


# -- broker and data -----------------------------------------------------------------------


def produce_windows(broker: common.Broker, topic: str, records: int, lag_ms: int
                    ) -> tuple[collections.Counter, int]:
    """Record i: partition i % 4, key k{i % 1000}, event time T0 + i ms, the last partition
    ``lag_ms`` behind; then one marker per partition (key "end") 20 s past the data.
    Returns the true count per (key, window start) and the markers' time."""
    producer = common.fast_producer(broker.bootstrap_servers)
    value = b"x" * common.VALUE_SIZE
    truth: collections.Counter = collections.Counter()
    last = WINDOW_PARTITIONS - 1
    for i in range(records):
        p = i % WINDOW_PARTITIONS
        ts = common.BASE_TS_MS + i - (lag_ms if p == last else 0)
        key = f"k{i % WINDOW_KEYS}"
        truth[(key, ts - ts % WINDOW_MS)] += 1
        while True:
            try:
                producer.produce(topic, partition=p, key=key.encode(), value=value,
                                 timestamp=ts)
                break
            except BufferError:
                producer.poll(0.05)
    marker = common.BASE_TS_MS + records + MARKER_GAP_MS
    for p in range(WINDOW_PARTITIONS):
        producer.produce(topic, partition=p, key=b"end", value=value, timestamp=marker)
    if producer.flush(300):
        raise RuntimeError(f"topic {topic}: records left unsent")
    return truth, marker


def check_windows(out: str, truth: collections.Counter) -> dict:
    """What the parquet sink holds against what was produced (the markers' window, never
    complete, is left out)."""
    import pyarrow.parquet as pq

    files = glob.glob(os.path.join(out, "*.parquet"))
    got: dict = {}
    duplicates = 0
    for path in files:
        table = pq.read_table(path).to_pydict()
        for key, start, n in zip(table["key"], table["start"], table["n"]):
            if key == "end":
                continue
            duplicates += (key, start) in got
            got[(key, start)] = got.get((key, start), 0) + n
    counted = sum(got.values())
    wrong = sum(1 for w, n in got.items() if truth.get(w) != n)
    return {"counted": counted, "produced": sum(truth.values()), "windows": len(got),
            "true_windows": len(truth), "wrong_windows": wrong, "duplicates": duplicates,
            "every_record_counted": counted == sum(truth.values()) and not wrong
            and not duplicates and len(got) == len(truth)}


# -- profile --------------------------------------------------------------------------------


def profile(broker: common.Broker, records: int) -> int:
    """cProfile of what a Spark task of a 4-partition batch read does: ``RangeReader`` over
    one partition's quarter, in this process."""
    import cProfile
    import pstats

    topic = broker.create_topic(4, "bench-dropin-profile")
    common.produce_sequence(broker, topic, 4, records // 4, tail_flush_each=False)
    reader = common.range_reader(broker.bootstrap_servers, topic, 0, 0, records // 4, {})
    profiler = cProfile.Profile()
    profiler.enable()
    rows, seconds = common.drain(reader)
    profiler.disable()
    print(f"one task: {rows:,} records in {seconds:.2f} s ({rows / seconds:,.0f} records/s, "
          f"under cProfile)")
    stats = pstats.Stats(profiler)
    stats.sort_stats("tottime").print_stats(20)
    stats.sort_stats("cumulative").print_stats(20)
    return 0


# -- summary --------------------------------------------------------------------------------


def summarise(runs: list[dict], windows_truth: dict | None) -> dict:
    by: dict = collections.defaultdict(list)
    for run in runs:
        by[(run["kind"], run["partitions"], run["format"])].append(run)
    summary: dict = {"read": {}, "window": {}}
    for (kind, partitions, fmt), measured in sorted(by.items(), key=str):
        if kind == "window":
            continue
        key = "records_per_s" if kind == "batch" else "warm_records_per_s"
        entry = summary["read"].setdefault(f"{kind} {partitions}p", {})
        entry[fmt] = median([r[key] for r in measured])
    for label, entry in list(summary["read"].items()):
        if "kafka" not in entry or "kwatermark" not in entry:
            del summary["read"][label]  # a run that stopped half-way through a round
            continue
        kind, partitions = label.split()
        # Ratio of the medians, and the median of the per-round ratios (same round, same
        # machine load) — the second is what the anchor quotes.
        rounds = {}
        for run in runs:
            if run["kind"] == kind and f"{run['partitions']}p" == partitions:
                key = "records_per_s" if kind == "batch" else "warm_records_per_s"
                rounds.setdefault(run["round"], {})[run["format"]] = run[key]
        per_round = [r["kwatermark"] / r["kafka"] for r in rounds.values()
                     if "kwatermark" in r and "kafka" in r]
        entry["ratio_of_medians"] = entry["kwatermark"] / entry["kafka"]
        entry["ratio_per_round"] = per_round
        entry["ratio"] = median(per_round)
    for fmt in ("spark", "kwatermark"):
        measured = by.get(("window", WINDOW_PARTITIONS, fmt), [])
        if measured:
            summary["window"][fmt] = {
                "warm_records_per_s": median([r["warm_records_per_s"] for r in measured]),
                "wall_records_per_s": median([r["wall_records_per_s"] for r in measured]),
                "counted": [r["check"]["counted"] for r in measured],
                "produced": windows_truth["produced"] if windows_truth else None,
                "every_record_counted": [r["check"]["every_record_counted"]
                                         for r in measured],
                "dropped_by_watermark": [r["dropped_by_watermark"] for r in measured],
            }
    return summary


def report(summary: dict, results: dict) -> None:
    print()
    print(f"Spark {results['spark_version']} with {results['connector']}; load average "
          f"{results['load_avg_before']} before, {results['load_avg_after']} after")
    print(f"{'read':<14}{'format(kafka)':>16}{'kwatermark':>14}{'ratio':>8}  per round")
    for label, entry in summary["read"].items():
        print(f"{label:<14}{entry['kafka']:>16,.0f}{entry['kwatermark']:>14,.0f}"
              f"{entry['ratio']:>8.2f}  {', '.join(f'{r:.2f}' for r in entry['ratio_per_round'])}")
    for fmt, entry in summary["window"].items():
        print(f"window {fmt:<11} warm {entry['warm_records_per_s']:>10,.0f} records/s, "
              f"wall {entry['wall_records_per_s']:>9,.0f}; counted {entry['counted']} of "
              f"{entry['produced']:,}")


# -- main -----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    broker = common.Broker.open(args.bootstrap_servers, kind="kafka")
    log(f"broker: {broker.kind} at {broker.bootstrap_servers}")
    if args.profile:
        try:
            return profile(broker, args.records)
        finally:
            broker.stop()
    workspace = tempfile.mkdtemp(prefix="kwatermark-bench-dropin-")
    results: dict = {
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": common.machine_info(), "git": git_revision(), "broker": broker.kind,
        "baseline_pyspark": BASELINE_PYSPARK, "connector": kafka_package(),
        "sizes": {"records": args.records, "partitions": args.partitions,
                  "value_bytes": common.VALUE_SIZE, "batches": args.batches,
                  "repeat": args.repeat, "window_records": args.window_records,
                  "window_partitions": WINDOW_PARTITIONS, "window_keys": WINDOW_KEYS,
                  "lag_s": args.lag, "window_batches": args.window_batches,
                  "spark_watermark_delay": "10 seconds"},
    }
    try:
        read_topics = []
        for partitions in args.partitions:
            topic = broker.create_topic(partitions, f"bench-dropin-{partitions}p")
            seconds = common.produce_sequence(broker, topic, partitions,
                                              args.records // partitions,
                                              tail_flush_each=False)
            records = args.records // partitions * partitions
            log(f"produced {records:,} records into {topic} in {seconds:.1f} s")
            read_topics.append({"topic": topic, "partitions": partitions, "records": records})
        warm = broker.create_topic(4, "bench-dropin-warm")
        common.produce_sequence(broker, warm, 4, 5_000, tail_flush_each=False)
        request = {"bootstrap": broker.bootstrap_servers, "workspace": workspace,
                   "repeat": args.repeat, "batches": args.batches, "budget_s": args.budget,
                   "read_topics": read_topics, "read_kinds": args.read_kinds,
                   "warm_topic": {"topic": warm, "records": 20_000}}
        truth = None
        if args.window_records:
            topic = broker.create_topic(WINDOW_PARTITIONS, "bench-dropin-window")
            truth, _ = produce_windows(broker, topic, args.window_records,
                                       round(args.lag * 1000))
            log(f"produced {args.window_records:,} records into {topic}, partition "
                f"{WINDOW_PARTITIONS - 1} {args.lag:g} s behind")
            request["window"] = {"topic": topic, "records": args.window_records
                                 + WINDOW_PARTITIONS, "partitions": WINDOW_PARTITIONS,
                                 "batches": args.window_batches}
        log("measuring in the baseline interpreter (PySpark "
            f"{BASELINE_PYSPARK}, {kafka_package()}); its log: {workspace}/child.log")
        reply = run_baseline(os.path.join(BENCH_DIR, "dropin_child.py"), request,
                             timeout=5400, log_path=os.path.join(workspace, "child.log"))
        windows_truth = None
        for run in reply["runs"]:
            if run["kind"] == "window":
                run["check"] = check_windows(run.pop("out"), truth)
                windows_truth = run["check"]
        results.update({k: reply[k] for k in ("spark_version", "session_s", "load_avg_before",
                                              "load_avg_after", "error")})
        if reply["error"]:
            log(f"the measuring stopped early: {reply['error'][:500]}")
        results["runs"] = reply["runs"]
        results["sizes"]["rounds_done"] = max((run["round"] for run in reply["runs"]),
                                              default=0)
        results["summary"] = summarise(reply["runs"], windows_truth)
        ratio_4 = results["summary"]["read"].get("batch 4p", {}).get("ratio")
        results["target"] = {"read_ratio_4_partitions": ratio_4,
                             "target": TARGET_READ_RATIO,
                             "pass": ratio_4 is not None and ratio_4 >= TARGET_READ_RATIO}
    finally:
        broker.stop()
    report(results["summary"], results)
    os.makedirs(args.results, exist_ok=True)
    path = os.path.join(args.results, "dropin.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=1, default=str)
    log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
