"""What a query costs while nothing arrives, at many partitions (DESIGN §21, issue 36).

    .venv/bin/python bench/bench_idle.py [--partitions 512,4096] [--seconds 20] [--rounds 2]

Under the default trigger Spark asks the source for new offsets every few ms while a query
idles, and each ask covers every partition. For each partition count: an empty topic on the
project's Apache Kafka (started here unless ``--bootstrap-servers``), then kwatermark's and
``format("kafka")``'s query on it in turn (one SparkSession, rotated order each round, the
``noop`` sink, ``startingOffsets=latest``); after ``--settle`` seconds, the CPU each party
spent over ``--seconds``, in cores: the driver JVM (with the local executors), its Python
processes (kwatermark's planning process and workers) and the broker (only when started
here), and how long one ask for new offsets took (``latestOffset`` in the idle progress
events Spark makes every 10 s). Printed: the median of the rounds for each, and kwatermark's
total against Spark's. Spark asks again as soon as an ask ends (10 ms later): a cheaper ask
is asked more often, so the cores measure Spark's loop as much as the source.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from datetime import datetime, timezone

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH_DIR)
sys.path.insert(1, os.path.dirname(BENCH_DIR))   # tests.support.sparkkafka

import common
from run import RESULTS_DIR, git_revision, log

PARTIES = ("jvm", "python", "broker", "total")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers", help="an existing Kafka (its CPU is not counted)")
    parser.add_argument("--partitions", default="512,4096")
    parser.add_argument("--formats", default="kwatermark,kafka")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--settle", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--results", default=RESULTS_DIR)
    args = parser.parse_args(argv)

    from tests.support.sparkkafka import run_baseline

    counts = [int(n) for n in args.partitions.split(",")]
    broker = common.Broker.open(args.bootstrap_servers, kind="kafka")
    workspace = tempfile.mkdtemp(prefix="kwatermark-bench-idle-")
    topics = []
    try:
        log(f"broker {broker.kind} at {broker.bootstrap_servers}")
        cases = []
        for n in counts:
            topics.append(broker.create_topic(n, f"idle{n}"))
            cases.append({"partitions": n, "topic": topics[-1]})
        request = {"bootstrap": broker.bootstrap_servers, "workspace": workspace,
                   "broker_pid": broker.pid, "cases": cases,
                   "formats": args.formats.split(","), "seconds": args.seconds,
                   "settle": args.settle, "rounds": args.rounds}
        log(f"measuring in the baseline interpreter; its log: {workspace}/child.log")
        reply = run_baseline(os.path.join(BENCH_DIR, "idle_child.py"), request, timeout=3600,
                             log_path=os.path.join(workspace, "child.log"))
        for topic in topics:
            broker.delete_topic(topic)
    finally:
        broker.stop()
    report = {"when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": common.machine_info(), "git": git_revision(), **reply}
    os.makedirs(args.results, exist_ok=True)
    path = os.path.join(args.results, "idle.json")
    with open(path, "w") as out:
        json.dump(report, out, indent=2, default=str)
    print_idle(reply["runs"], counts, args.formats.split(","))
    if reply.get("error"):
        print(f"\nthe measuring stopped early: {reply['error'][:800]}")
    print(f"results: {path}")
    return 0


def print_idle(runs: list[dict], counts: list[int], formats: list[str]) -> None:
    print("CPU of an idle query, cores (median of the rounds)")
    print(f"{'partitions':>10} {'source':>11} " + " ".join(f"{p:>7}" for p in PARTIES)
          + f" {'x kafka':>8} {'ask ms':>7}")
    for n in counts:
        medians = {}
        for fmt in formats:
            got = [r for r in runs if r["partitions"] == n and r["format"] == fmt]
            if got:
                medians[fmt] = {p: statistics.median(r[p] for r in got) for p in PARTIES}
                polls = [r["poll_ms"] for r in got if r.get("poll_ms") is not None]
                medians[fmt]["poll_ms"] = statistics.median(polls) if polls else float("nan")
        for fmt, m in medians.items():
            base = medians.get("kafka", {}).get("total")
            ratio = f"{m['total'] / base:>8.2f}" if base else f"{'':>8}"
            print(f"{n:>10} {fmt:>11} " + " ".join(f"{m[p]:>7.3f}" for p in PARTIES) + ratio
                  + f" {m['poll_ms']:>7.0f}")


if __name__ == "__main__":
    sys.exit(main())
