"""Windowed count: ``kwatermark.windows.aggregate`` over ``format("kwatermark")`` against
Spark's own ``withWatermark(...).groupBy(window(...), key).count()`` over Spark's own Kafka
source ``format("kafka")``, on the same topic, in one SparkSession, interleaved.

Spark's Kafka connector exists only for PySpark 4.2.0 (DESIGN §17), so the queries run in a
child process on the baseline interpreter (``bench/windows_child.py``,
``tests/support/sparkkafka.py``); this process starts a local Apache Kafka (unless
``--bootstrap-servers``), produces the data, checks what the sinks got against the ground
truth and summarises. Every round runs each configuration once, each round starting at a
different one; the ratio is the median of the per-round ratios (same round, same load).

Data: ``--records`` records (default 1,000,000) over ``--partitions`` partitions, key
``k{i % keys}`` (``--keys``, default 1,000), event time (the Kafka timestamp) ``T0 + i`` ms for
the i-th record, so 10-second tumbling windows hold 10 records per key. Windows: ``--window``
tumbling (default "10 seconds"), or ``--session GAP`` session windows (Spark's side:
``session_window``). After the records, each partition gets one marker record (key ``end``)
a window (or gap) plus 20 s past the data: it moves every partition's watermark (and Spark's)
past the last data window, so both routes must emit every data window, and the markers' own
window is never complete.

Both queries read with the same ``maxOffsetsPerTrigger`` (``--batches`` micro-batches),
Trigger.AvailableNow, into a parquet sink (append mode) on a fresh checkpoint; kwatermark's
adds ``watermark.heartbeat=true`` (its last windows come out in a heartbeat micro-batch that
reads no records; Spark's come out in its no-data batch). ``--configs`` may add ``source``
(``format("kwatermark")`` alone into noop) and ``kafka-source`` (``format("kafka")`` alone):
what reading costs.

Throughput: records / the sum of ``durationMs.triggerExecution`` of every batch after the
first (the first includes starting Python workers); the trailing heartbeat / no-data batches
that emit the last windows are included. The whole run's wall time is reported too, and the
CPU seconds of Spark's JVM and of its Python processes per run (from /proc).

Every kwatermark run is checked against ground truth computed from what was produced: each
(key, window) exactly once, kind ``final``, its true count, and the counts sum to the records.

Batch times: every run records each micro-batch's ``triggerExecution``; ``last_over_second``
is the last full data batch's (one that read at least half of ``maxOffsetsPerTrigger``) over
the second's (the first starts Python workers): near 1 when the
state's cost follows what a batch touches, growing with the batches when it follows the state.

``--latency``: a live stream instead (``--rate`` records/s over the partitions for
``--seconds``, event time = wall clock minus up to ``--disorder``), both queries running at
once on a ``--trigger`` processing-time trigger into ``foreachBatch`` sinks (Spark's on
``format("kafka")``); per final window, the wall-clock time from the window's end to its rows
reaching the sink (median, p95).

Run (each shape one command; results in ``bench/results/windows-<shape>.json``):
``python bench/bench_windows.py --keys 10``, ``--keys 100000``,
``--keys 1000000 --window "1 hour" --batches 10``, ``--keys 1000 --session "5 seconds"``;
``--records 100000 --repeat 1 --results /tmp/wb`` for a quick trial; ``--latency`` for latency.
``--profile`` runs kwatermark alone with ``KWATERMARK_WINDOWS_PROFILE`` set: each Python
worker writes a cProfile of the window processor, printed at the end.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import sys
import tempfile
import time
from datetime import datetime, timezone

import numpy as np

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(BENCH_DIR)
sys.path.insert(0, BENCH_DIR)
sys.path.insert(1, REPO_ROOT)  # tests.support.sparkkafka

import common
from run import git_revision, log, median

from tests.support.sparkkafka import BASELINE_PYSPARK, kafka_package, run_baseline

MARKER_GAP_MS = 20_000
SPARK_DELAY = "1 second"
# kwatermark / Spark's own windowed count on format("kafka"), issue 24, by shape.
TARGETS = {"10 keys": 0.8, "100000 keys": 0.7, "1000000 keys 1 hour": 0.6}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--bootstrap-servers", help="existing Kafka; default: start one")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--window", default="10 seconds", help="tumbling window size")
    parser.add_argument("--session", metavar="GAP",
                        help="session windows with this gap instead of tumbling ones")
    parser.add_argument("--results-name", help="file name of the results under --results "
                                                "(default windows-<shape>.json)")
    parser.add_argument("--latency", action="store_true",
                        help="latency on a live stream instead of throughput (see above)")
    parser.add_argument("--rate", type=int, default=2_000, help="--latency: records/s")
    parser.add_argument("--seconds", type=int, default=260, help="--latency: produce for")
    parser.add_argument("--trigger", default="1 second", help="--latency: trigger interval")
    parser.add_argument("--disorder", default="2 seconds",
                        help="--latency: out-of-orderness (event time = now - up to this; "
                             "both routes' watermark delay)")
    parser.add_argument("--batches", type=int, default=5,
                        help="data micro-batches per run (maxOffsetsPerTrigger = records / "
                             "batches); default 5")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (medians reported)")
    parser.add_argument("--shuffle-partitions", type=int, default=2)
    parser.add_argument("--configs", default="kwatermark,spark",
                        help="any of kwatermark, spark (format(\"kafka\")), spark-hdfs, "
                             "source, kafka-source; kwatermark:N sets aggregate's key_buckets "
                             "to N")
    parser.add_argument("--profile", action="store_true",
                        help="cProfile the window processor in the Python workers and print "
                             "the top functions (slows it down; figures are not saved)")
    parser.add_argument("--results", default=os.path.join(BENCH_DIR, "results"))
    args = parser.parse_args(argv)
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    from kwatermark.options import parse_duration_ms

    args.size_ms = parse_duration_ms("--window", args.window)
    args.gap_ms = None if args.session is None else parse_duration_ms("--session", args.session)
    if args.gap_ms is not None and args.gap_ms == args.keys:
        parser.error("--session: a gap equal to --keys ms is ambiguous between the engines")
    if args.records % args.partitions:
        parser.error("--records must be a multiple of --partitions")
    args.shape = (f"{args.keys} keys" + (f" session {args.session}" if args.session else
                                         "" if args.window == "10 seconds" else
                                         f" {args.window}"))
    if args.results_name is None:
        kind = "latency-" if args.latency else ""
        args.results_name = f"windows-{kind}{args.shape.replace(' ', '-')}.json"
    return args


# -- data and ground truth --------------------------------------------------------------------


def produce(broker: common.Broker, topic: str, records: int, partitions: int, keys: int,
            reach_ms: int) -> float:
    """Record i: partition i % partitions, key k{i % keys}, timestamp T0 + i; then one marker
    per partition, each flushed in a batch of its own (Tansu's end offset, DESIGN §8)."""
    started = time.perf_counter()
    producer = common.fast_producer(broker.bootstrap_servers)
    value = b"x" * common.VALUE_SIZE
    names = [f"k{k}".encode() for k in range(keys)]
    for i in range(records):
        _produce(producer, topic, i % partitions, names[i % keys], value, common.BASE_TS_MS + i)
        if i % 10_000 == 9_999:
            producer.poll(0)
    if producer.flush(300):
        raise RuntimeError(f"topic {topic}: records left unsent")
    marker = common.BASE_TS_MS + records + reach_ms + MARKER_GAP_MS
    for p in range(partitions):
        _produce(producer, topic, p, b"end", value, marker)
        if producer.flush(60):
            raise RuntimeError(f"topic {topic}: marker left unsent")
    ends = broker.end_offsets(topic, partitions)
    expected = records // partitions + 1
    if any(e != expected for e in ends.values()):
        raise RuntimeError(f"topic {topic}: end offsets {ends}, expected {expected} each")
    return time.perf_counter() - started


def _produce(producer, topic, partition, key, value, ts) -> None:
    while True:
        try:
            producer.produce(topic, key=key, value=value, partition=partition, timestamp=ts)
            return
        except BufferError:
            producer.poll(0.05)


def truth(records: int, keys: int, size_ms: int, gap_ms: int | None
          ) -> dict[tuple[str, int], int]:
    """(key, window start ms) -> count, from the produced sequence. A key's records are
    ``keys`` ms apart: one session per key when that is within the gap, else one per record."""
    i = np.arange(records, dtype=np.int64)
    ts = common.BASE_TS_MS + i
    if gap_ms is not None:
        starts = common.BASE_TS_MS + i % keys if keys < gap_ms else ts
    else:
        starts = ts - ts % size_ms
    pairs, counts = np.unique(np.stack([i % keys, starts]), axis=1, return_counts=True)
    return {(f"k{k}", int(s)): int(n) for (k, s), n in zip(pairs.T.tolist(), counts.tolist())}


# -- what the sinks got -----------------------------------------------------------------------


def check(out: str, expected: dict[tuple[str, int], int], records: int, exact: bool) -> dict:
    """What the parquet sink got against the ground truth."""
    import pyarrow.parquet as pq

    rows = pq.read_table(out).to_pandas()  # Spark's _spark_metadata is left out
    rows = rows[rows["key"] != "end"]
    got = {(k, int(s)): int(n) for k, s, n in zip(rows["key"], rows["start"], rows["n"])}
    kinds = rows["kind"].value_counts().to_dict()
    wrong = sum(1 for w, n in expected.items() if got.get(w) != n)
    result = {"rows": len(rows), "windows": len(got), "counted": int(rows["n"].sum()),
              "records": records, "wrong_windows": wrong + len(set(got) - set(expected)),
              "duplicates": len(rows) - len(got), "kinds": {str(k): int(v)
                                                            for k, v in kinds.items()}}
    result["every_record_counted"] = (result["counted"] == records and wrong == 0
                                      and result["duplicates"] == 0)
    if exact and not result["every_record_counted"]:
        raise RuntimeError(f"kwatermark's windows differ from the ground truth: {result}")
    return result


# -- profile ----------------------------------------------------------------------------------


def print_profiles(directory: str, top: int = 30) -> None:
    import pstats

    files = glob.glob(os.path.join(directory, "*.prof"))
    if not files:
        print(f"no profiles in {directory}")
        return
    stats = pstats.Stats(*files)
    stats.sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top)


# -- latency ----------------------------------------------------------------------------------


def latency(args: argparse.Namespace) -> int:
    """Both queries at once on one live stream (in the child); per final window, sink arrival
    minus window end."""
    from kwatermark.options import parse_duration_ms

    disorder_ms = parse_duration_ms("--disorder", args.disorder)
    configs = [c for c in args.configs if c not in ("source", "kafka-source")] or \
        ["kwatermark", "spark"]
    broker = common.Broker.open(args.bootstrap_servers, kind="kafka")
    log(f"broker: {broker.kind} at {broker.bootstrap_servers}")
    workspace = tempfile.mkdtemp(prefix="kwatermark-bench-windows-")
    results: dict = {
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": common.machine_info(), "git": git_revision(), "broker": broker.kind,
        "baseline_pyspark": BASELINE_PYSPARK, "connector": kafka_package(),
        "sizes": {"rate": args.rate, "seconds": args.seconds, "partitions": args.partitions,
                  "keys": args.keys, "trigger": args.trigger, "disorder": args.disorder,
                  "window": f"session {args.session}" if args.session else
                  f"{args.window} tumbling"},
    }
    size = args.gap_ms or args.size_ms
    try:
        topic = broker.create_topic(args.partitions, "bench-windows-live")
        request = {"mode": "latency", "bootstrap": broker.bootstrap_servers,
                   "workspace": workspace, "topic": topic, "partitions": args.partitions,
                   "keys": args.keys, "configs": configs, "window": args.window,
                   "session": args.session, "spark_delay": args.disorder,
                   "shuffle_partitions": args.shuffle_partitions,
                   "latency": {"rate": args.rate, "seconds": args.seconds,
                               "trigger": args.trigger, "disorder": args.disorder,
                               "disorder_ms": disorder_ms, "reach_ms": size}}
        log(f"live stream in the baseline interpreter (PySpark {BASELINE_PYSPARK}); its "
            f"log: {workspace}/child.log")
        reply = run_baseline(os.path.join(BENCH_DIR, "windows_child.py"), request,
                             timeout=args.seconds + 1800,
                             log_path=os.path.join(workspace, "child.log"))
    finally:
        broker.stop()
        shutil.rmtree(workspace, ignore_errors=True)
    if reply["errors"]:
        raise RuntimeError(f"a query failed: {reply['errors']}")
    # Windows that began after the queries' first 30 s (Python workers start) and ended
    # while the producer still ran (so the next records could complete them).
    summary = {}
    for config, got in reply["arrivals"].items():
        by_window: dict[int, float] = {}
        for _, end, at in got:
            by_window[end] = max(by_window.get(end, 0.0), at)
        waits = sorted(at - end for end, at in by_window.items()
                       if end - size >= reply["began_ms"] + 30_000
                       and end + disorder_ms < reply["ended_ms"])
        batches = reply["batch_ms"].get(config, [])
        summary[config] = {
            "windows": len(waits), "median_ms": median(waits),
            "p95_ms": waits[min(len(waits) - 1, int(0.95 * len(waits)))] if waits else None,
            "latencies_ms": [round(w) for w in waits],
            "batch_ms_median": median(batches),
        }
        print(f"{config:<11} {len(waits)} windows: median {summary[config]['median_ms']:,.0f} "
              f"ms, p95 {summary[config]['p95_ms'] or float('nan'):,.0f} ms after the window's "
              f"end; batch median {summary[config]['batch_ms_median']:,.0f} ms")
    results.update({k: reply[k] for k in ("spark_version", "session_s", "produced",
                                          "load_avg_before", "load_avg_after")})
    results["configs"] = summary
    print(f"load average {reply['load_avg_before']} before, {reply['load_avg_after']} after")
    _write(args, results)
    return 0


def _write(args: argparse.Namespace, results: dict) -> None:
    os.makedirs(args.results, exist_ok=True)
    path = os.path.join(args.results, args.results_name)
    with open(path, "w") as out:
        json.dump(results, out, indent=2, default=str)
        out.write("\n")
    print(f"wrote {path}")


# -- throughput -------------------------------------------------------------------------------


def summarise(runs: list[dict], records: int) -> dict:
    summary: dict = {}
    for config in dict.fromkeys(r["config"] for r in runs):
        measured = [r for r in runs if r["config"] == config]
        summary[config] = {
            "warm_records_per_s": median([r["warm_records_per_s"] for r in measured]),
            "wall_records_per_s": median([r["wall_records_per_s"] for r in measured]),
            "first_batch_s": median([r["first_batch_s"] for r in measured]),
            "last_over_second": median([r["last_over_second"] for r in measured
                                        if r["last_over_second"] is not None]),
            # CPU per record: steadier than wall time on a machine shared with other work.
            "cpu_us_per_record": {party: median([r["cpu"][party] for r in measured])
                                  / records * 1e6 for party in measured[0]["cpu"]},
            "load_avg": [r["load_avg"] for r in measured],
            "runs": measured,
        }
    return summary


def ratios(runs: list[dict], config: str, baseline: str) -> list[float]:
    """kwatermark / baseline in each round that ran both (same round, same machine load)."""
    rounds: dict[int, dict[str, float]] = {}
    for r in runs:
        rounds.setdefault(r["round"], {})[r["config"]] = r["warm_records_per_s"]
    return [got[config] / got[baseline] for got in rounds.values()
            if got.get(config) and got.get(baseline)]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.latency:
        return latency(args)
    if args.profile:
        directory = os.environ.setdefault(
            "KWATERMARK_WINDOWS_PROFILE", tempfile.mkdtemp(prefix="kwatermark-profile-"))
        os.makedirs(directory, exist_ok=True)
        args.configs = [c for c in args.configs if c.startswith("kwatermark")] or \
            ["kwatermark"]
        args.repeat = 1
    broker = common.Broker.open(args.bootstrap_servers, kind="kafka")
    log(f"broker: {broker.kind} at {broker.bootstrap_servers}")
    workspace = tempfile.mkdtemp(prefix="kwatermark-bench-windows-")
    per_trigger = -(-args.records // args.batches)
    results: dict = {
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": common.machine_info(), "git": git_revision(), "broker": broker.kind,
        "baseline_pyspark": BASELINE_PYSPARK, "connector": kafka_package(),
        "sizes": {"records": args.records, "partitions": args.partitions, "keys": args.keys,
                  "window": f"session {args.session}" if args.session else
                  f"{args.window} tumbling", "batches": args.batches,
                  "max_offsets_per_trigger": per_trigger,
                  "shuffle_partitions": args.shuffle_partitions, "repeat": args.repeat,
                  "spark_watermark_delay": SPARK_DELAY, "configs": args.configs},
    }
    try:
        topic = broker.create_topic(args.partitions, "bench-windows")
        log(f"producing {args.records:,} records, {args.keys:,} keys, into {topic}")
        reach = args.gap_ms if args.gap_ms is not None else args.size_ms
        results["sizes"]["produce_s"] = produce(broker, topic, args.records, args.partitions,
                                                args.keys, reach)
        expected = truth(args.records, args.keys, args.size_ms, args.gap_ms)
        log(f"  produced in {results['sizes']['produce_s']:.1f} s; {len(expected):,} "
            f"(key, window) pairs")
        warm = broker.create_topic(args.partitions, "bench-windows-warm")
        produce(broker, warm, 20_000, args.partitions, args.keys, reach)
        request = {"mode": "throughput", "bootstrap": broker.bootstrap_servers,
                   "workspace": workspace, "topic": topic, "records": args.records,
                   "per_trigger": per_trigger, "configs": args.configs,
                   "repeat": args.repeat, "window": args.window, "session": args.session,
                   "spark_delay": SPARK_DELAY, "shuffle_partitions": args.shuffle_partitions,
                   "warm_topic": {"topic": warm, "records": 20_000, "per_trigger": 5_000}}
        log(f"measuring in the baseline interpreter (PySpark {BASELINE_PYSPARK}, "
            f"{kafka_package()}); its log: {workspace}/child.log")
        reply = run_baseline(os.path.join(BENCH_DIR, "windows_child.py"), request,
                             timeout=7200, log_path=os.path.join(workspace, "child.log"))
    finally:
        broker.stop()
    if args.profile:
        print_profiles(os.environ["KWATERMARK_WINDOWS_PROFILE"])
    runs = reply["runs"]
    for run in runs:
        out = run.pop("out")
        if out is not None:
            run["check"] = check(out, expected, args.records,
                                 exact=run["config"].startswith("kwatermark"))
        counted = run.get("check", {}).get("counted")
        log(f"round {run['round']}: {run['config']:<13} {run['warm_records_per_s']:>10,.0f} "
            f"records/s warm ({run['warm_s']:.1f} s, wall {run['wall_s']:.1f} s, load "
            f"{run['load_avg']:.2f}; data batches (s) "
            f"{' '.join(f'{ms / 1000:.1f}' for ms in run['data_batch_ms'])})"
            + (f"; counted {counted:,} of {args.records:,}" if counted is not None else ""))
    if reply.get("error"):
        log(f"the measuring stopped early: {reply['error'][:1000]}")
    shutil.rmtree(workspace, ignore_errors=True)  # checkpoints and sinks, checked above
    if args.profile:
        return 0
    summary = summarise(runs, args.records)
    results.update({k: reply.get(k) for k in ("spark_version", "session_s", "error",
                                              "load_avg_before", "load_avg_after")})
    results["configs"] = summary
    target = TARGETS.get(args.shape.replace(" 10 seconds", ""))
    if "kwatermark" in summary and "spark" in summary:
        per_round = ratios(runs, "kwatermark", "spark")
        ratio = median(per_round)
        every = all(r["check"]["every_record_counted"] for r in summary["kwatermark"]["runs"])
        results["ratio"] = {"kwatermark_vs_spark": ratio, "per_round": per_round,
                            "wall_kwatermark_vs_spark":
                                summary["kwatermark"]["wall_records_per_s"]
                                / summary["spark"]["wall_records_per_s"],
                            "target": target, "every_record_counted": every,
                            "pass": None if target is None else ratio >= target and every}
    _write(args, results)
    print()
    print(f"Spark {results['spark_version']} with {kafka_package()}; shape {args.shape}; load "
          f"average {results['load_avg_before']} before, {results['load_avg_after']} after")
    for config, s in summary.items():
        cpu = ", ".join(f"{k} {v:,.1f}" for k, v in s["cpu_us_per_record"].items())
        print(f"{config:<13} warm {s['warm_records_per_s']:>10,.0f} records/s   whole run "
              f"{s['wall_records_per_s']:>10,.0f} records/s   CPU us/record: {cpu}; "
              f"last/second batch {s['last_over_second']:.2f}x (median of {len(s['runs'])})")
    if "ratio" in results:
        r = results["ratio"]
        verdict = "" if r["target"] is None else \
            f"; target >= {r['target']}x: {'PASS' if r['pass'] else 'FAIL'}"
        print(f"kwatermark / spark on format(\"kafka\"): {r['kwatermark_vs_spark']:.2f}x warm "
              f"(per round {', '.join(f'{x:.2f}' for x in r['per_round'])}), "
              f"{r['wall_kwatermark_vs_spark']:.2f}x whole run; every record counted: "
              f"{r['every_record_counted']}{verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
