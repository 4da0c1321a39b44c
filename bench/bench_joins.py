"""Interval join and deduplication against Spark's own operators on ``format("kafka")``:
``kwatermark.joins.interval_join`` and ``kwatermark.dedup.drop_duplicates`` (reading
``format("kwatermark")``) against Spark's stream-stream join and
``dropDuplicatesWithinWatermark`` (reading ``format("kafka")``, Spark's own Kafka source),
same topics, same run, same SparkSession.

Spark's Kafka connector must have Spark's version (4.2.0 on Maven Central), so the measuring
runs in a child process on PySpark 4.2.0 (``bench/joins_child.py``,
``tests/support/sparkkafka.py``); kwatermark runs there too. The configurations are
interleaved, each round starting at another one; per operator the report gives the medians
and the median of the per-round ratios (same round, same machine load).

Data: two topics of ``--records`` records each over ``--partitions`` partitions, key
``k{i % keys}`` (default 1,000 keys), every value starting with the record's id (10 digits).
Left record i has event time ``T0 + i`` ms, right record i ``T0 + i + 500`` ms; the interval
is ``[0 s, 1 s]`` (Spark: ``r.timestamp BETWEEN l.timestamp AND l.timestamp + 1 second``,
``withWatermark(timestamp, 1 second)`` on both sides). The dedup topic holds every key
``d{i // 2}`` twice, 200 ms apart (``within`` 1 s; Spark's delay 1 s). ``--lag`` puts the
last partition of the right and the dedup topics that many seconds behind in event time.

Ground truth is computed here from what was produced (every pair of one key whose event
times fall in the interval; per dedup key, the rows that are no duplicate of an earlier
first), and both sides' parquet output is checked against it: missing, extra and duplicated
rows. Throughput: records of the batches after the first with data over the sum of their
``triggerExecution`` (bench/run.py's rule); state: the largest ``numRowsTotal`` and
``memoryUsedBytes`` any state operator reported. ``kw-read`` / ``spark-read`` read the dedup
topic alone into the same sink (the sources' share of a run). An unmeasured warm-up round
runs every configuration first (``--no-warmup``: none). Writes ``bench/results/joins.json``.

Run: ``python bench/bench_joins.py`` (20,000 records, a warm-up and 3 rounds: about 5 minutes
on 2 cores at load ~10);
``--records 4000 --repeat 1 --results /tmp/jb`` for a trial.
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

INTERVAL_MS = (0, 1_000)     # right.t in [left.t + 0, left.t + 1 s]
WITHIN_MS = 1_000
RIGHT_SHIFT_MS = 500
DUP_GAP_MS = 200
CONFIGS = ("kw-join", "spark-join", "kw-dedup", "spark-dedup", "kw-read", "spark-read")
TARGET_RATIO = 0.5


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--bootstrap-servers", help="existing Kafka; default: start one here")
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--lag", type=float, default=0.0,
                        help="seconds the last partition of right and dedup lags (default 0)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-warmup", dest="warmup", action="store_false",
                        help="skip the unmeasured warm-up round")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds after which no further round starts")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--results", default=os.path.join(BENCH_DIR, "results"))
    args = parser.parse_args(argv)
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    # kw-dedup-cN: kwatermark's dedup with N chunks per bucket (not summarised; see the runs).
    unknown = sorted(c for c in set(args.configs) - set(CONFIGS)
                     if not c.startswith("kw-dedup-c"))
    if unknown:
        parser.error(f"unknown configurations {unknown}; known: {', '.join(CONFIGS)}")
    if args.batches < 2:
        parser.error("--batches must be >= 2: the first batch is excluded as warm-up")
    return args


# -- data and ground truth ------------------------------------------------------------------


def produce(broker: common.Broker, topic: str, records: int, partitions: int, key, ts
            ) -> list[tuple[str, int, int]]:
    """Record i: partition i % partitions, key ``key(i)``, timestamp ``ts(i)``, value the
    id (10 digits) and padding to 100 bytes. Returns (key, id, timestamp) per record."""
    producer = common.fast_producer(broker.bootstrap_servers)
    produced = []
    for i in range(records):
        k, t = key(i), ts(i)
        value = b"%010d" % i + b"x" * (common.VALUE_SIZE - 10)
        while True:
            try:
                producer.produce(topic, key=k.encode(), value=value,
                                 partition=i % partitions, timestamp=t)
                break
            except BufferError:
                producer.poll(0.05)
        produced.append((k, i, t))
    if producer.flush(300):
        raise RuntimeError(f"topic {topic}: records left unsent")
    ends = broker.end_offsets(topic, partitions)
    if sum(ends.values()) != records:
        raise RuntimeError(f"topic {topic}: end offsets {ends}, expected {records} in all")
    return produced


def join_truth(lefts: list, rights: list) -> set[tuple[str, int, int]]:
    """Every (key, left id, right id) with right.t in [left.t + lower, left.t + upper]."""
    by_key = collections.defaultdict(list)
    for k, i, t in rights:
        by_key[k].append((i, t))
    lower, upper = INTERVAL_MS
    return {(k, li, ri) for k, li, lt in lefts for ri, rt in by_key.get(k, ())
            if lt + lower <= rt <= lt + upper}


def dedup_truth(rows: list) -> dict[str, int]:
    """Per key, how many rows are firsts: in event-time order, a row within ``within`` of an
    earlier first is a duplicate."""
    by_key = collections.defaultdict(list)
    for k, _, t in rows:
        by_key[k].append(t)
    firsts = {}
    for k, times in by_key.items():
        kept: list[int] = []
        for t in sorted(times):
            if not any(abs(t - f) <= WITHIN_MS for f in kept):
                kept.append(t)
        firsts[k] = len(kept)
    return firsts


def read_out(path: str) -> list[dict]:
    import pyarrow.parquet as pq

    rows: list[dict] = []
    for part in glob.glob(os.path.join(path, "*.parquet")):
        table = pq.read_table(part).to_pydict()
        names = list(table)
        rows.extend(dict(zip(names, values)) for values in zip(*table.values()))
    return rows


def check_join(rows: list[dict], truth: set) -> dict:
    kinds = collections.Counter(r["kind"] for r in rows)
    got = collections.Counter((r["key"], int(r["left_id"]), int(r["right_id"]))
                              for r in rows if r["kind"] == "match")
    missing = len(truth - set(got))
    extra = len(set(got) - truth)
    duplicated = sum(n - 1 for n in got.values() if n > 1)
    return {"rows": len(rows), "kinds": dict(kinds), "true": len(truth), "missing": missing,
            "extra": extra, "duplicated": duplicated,
            "exact": missing == 0 and extra == 0 and duplicated == 0
            and set(kinds) <= {"match"}}


def check_dedup(rows: list[dict], truth: dict[str, int]) -> dict:
    kinds = collections.Counter(r["kind"] for r in rows)
    per_key = collections.Counter(r["key"] for r in rows if r["kind"] == "first")
    missing = sum(max(n - per_key.get(k, 0), 0) for k, n in truth.items())
    extra = sum(max(n - truth.get(k, 0), 0) for k, n in per_key.items())
    return {"rows": len(rows), "kinds": dict(kinds), "true": sum(truth.values()),
            "missing": missing, "extra": extra,
            "exact": missing == 0 and extra == 0 and set(kinds) <= {"first"}}


def check_read(rows: list[dict], records: int) -> dict:
    ids = collections.Counter(int(r["id"]) for r in rows)
    missing = sum(1 for i in range(records) if i not in ids)
    extra = sum(n - 1 for n in ids.values() if n > 1) + sum(1 for i in ids if i >= records)
    return {"rows": len(rows), "true": records, "missing": missing, "extra": extra,
            "exact": missing == 0 and extra == 0}


# -- summary --------------------------------------------------------------------------------


def summarise(runs: list[dict]) -> dict:
    summary: dict = {}
    for op in ("join", "dedup", "read"):
        rounds: dict = collections.defaultdict(dict)
        entry: dict = {}
        for side in ("kw", "spark"):
            measured = [r for r in runs if r["config"] == f"{side}-{op}"]
            if not measured:
                continue
            for r in measured:
                rounds[r["round"]][side] = r["warm_records_per_s"]
            entry[side] = {
                "warm_records_per_s": median([r["warm_records_per_s"] for r in measured]),
                "per_round": [r["warm_records_per_s"] for r in measured],
                "state_rows_max": max(r["state_rows_max"] for r in measured),
                "state_bytes_max": max(r["state_bytes_max"] for r in measured),
                "wall_s": median([r["wall_s"] for r in measured]),
                "missing": [r["check"]["missing"] for r in measured],
                "extra": [r["check"]["extra"] for r in measured],
                "exact": all(r["check"]["exact"] for r in measured),
                "true": measured[0]["check"]["true"],
                "dropped_by_watermark": [r["dropped_by_watermark"] for r in measured],
            }
        per_round = [r["kw"] / r["spark"] for r in rounds.values()
                     if r.get("kw") and r.get("spark")]
        if per_round:
            entry["ratio_per_round"] = per_round
            entry["ratio"] = median(per_round)
            entry["ratio_of_medians"] = (entry["kw"]["warm_records_per_s"]
                                         / entry["spark"]["warm_records_per_s"])
            entry["target"] = TARGET_RATIO
            entry["pass"] = entry["ratio"] >= TARGET_RATIO and entry["kw"]["exact"]
        if entry:
            summary[op] = entry
    return summary


def report(summary: dict, results: dict) -> None:
    print()
    print(f"Spark {results.get('spark_version')} with {results['connector']}; load average "
          f"{results.get('load_avg_before')} before, {results.get('load_avg_after')} after")
    for op, entry in summary.items():
        for side in ("kw", "spark"):
            if side in entry:
                s = entry[side]
                print(f"{side + '-' + op:<12} warm {s['warm_records_per_s']:>9,.0f} records/s "
                      f"(rounds {', '.join(f'{x:,.0f}' for x in s['per_round'])}); missing "
                      f"{s['missing']} extra {s['extra']} of {s['true']:,} true; state max "
                      f"{s['state_rows_max']:,} rows / {s['state_bytes_max'] / 1e6:.1f} MB")
        if "ratio" in entry:
            print(f"kwatermark / Spark {op}: {entry['ratio']:.2f}x (median of per-round "
                  f"{', '.join(f'{r:.2f}' for r in entry['ratio_per_round'])}; ratio of "
                  f"medians {entry['ratio_of_medians']:.2f})")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    broker = common.Broker.open(args.bootstrap_servers, kind="kafka")
    log(f"broker: {broker.kind} at {broker.bootstrap_servers}")
    workspace = tempfile.mkdtemp(prefix="kwatermark-bench-joins-")
    n, keys, parts = args.records, args.keys, args.partitions
    lag_ms = round(args.lag * 1000)
    base = common.BASE_TS_MS

    def lagged(i: int) -> int:
        return lag_ms if i % parts == parts - 1 else 0

    results: dict = {
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": common.machine_info(), "git": git_revision(), "broker": broker.kind,
        "baseline_pyspark": BASELINE_PYSPARK, "connector": kafka_package(),
        "sizes": {"records": n, "partitions": parts, "keys": keys, "batches": args.batches,
                  "repeat": args.repeat, "lag_s": args.lag, "interval_ms": INTERVAL_MS,
                  "within_ms": WITHIN_MS, "spark_delay": "1 second",
                  "spark_reads_with": "format('kafka')"},
    }
    try:
        topics = {name: broker.create_topic(parts, f"bench-joins-{name}")
                  for name in ("left", "right", "dedup")}
        lefts = produce(broker, topics["left"], n, parts, lambda i: f"k{i % keys}",
                        lambda i: base + i)
        rights = produce(broker, topics["right"], n, parts, lambda i: f"k{i % keys}",
                         lambda i: base + i + RIGHT_SHIFT_MS - lagged(i))
        dups = produce(broker, topics["dedup"], n, parts, lambda i: f"d{i // 2}",
                       lambda i: base + i + (i % 2) * DUP_GAP_MS - lagged(i))
        truth_join, truth_dedup = join_truth(lefts, rights), dedup_truth(dups)
        log(f"produced {n:,} records to each of {', '.join(topics.values())}: "
            f"{len(truth_join):,} true matches, {sum(truth_dedup.values()):,} true firsts")
        request = {"bootstrap": broker.bootstrap_servers, "workspace": workspace,
                   "repeat": args.repeat, "configs": args.configs, "topics": topics,
                   "records": n, "batches": args.batches, "budget_s": args.budget,
                   "warmup": args.warmup}
        log(f"measuring in the baseline interpreter (PySpark {BASELINE_PYSPARK}, "
            f"{kafka_package()}); its log: {workspace}/child.log")
        reply = run_baseline(os.path.join(BENCH_DIR, "joins_child.py"), request,
                             timeout=7200, log_path=os.path.join(workspace, "child.log"))
        for run in reply["runs"]:
            rows = read_out(run.pop("out"))
            run["check"] = (check_join(rows, truth_join) if run["config"].endswith("join")
                            else check_read(rows, n) if run["config"].endswith("read")
                            else check_dedup(rows, truth_dedup))
            log(f"round {run['round']}: {run['config']:<11} "
                f"{run['warm_records_per_s'] or 0:>9,.0f} records/s warm; {run['check']}")
        results.update({k: reply[k] for k in ("spark_version", "session_s", "load_avg_before",
                                              "load_avg_after", "error")})
        if reply["error"]:
            log(f"the measuring stopped early: {reply['error'][:500]}")
        results["runs"] = reply["runs"]
        results["summary"] = summarise(reply["runs"])
    finally:
        broker.stop()
    report(results["summary"], results)
    os.makedirs(args.results, exist_ok=True)
    path = os.path.join(args.results, "joins.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=1, default=str)
    log(f"wrote {path}")
    wrong = [op for op, e in results["summary"].items() if not e.get("kw", {}).get("exact")]
    if wrong:
        log(f"kwatermark's output differs from the ground truth: {', '.join(wrong)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
