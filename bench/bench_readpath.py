"""The read path at steady state (issue 34, DESIGN §19): kwatermark's compiled and Python
engines against Spark's own ``format("kafka")``, in one SparkSession (PySpark 4.2.0, the
baseline venv of ``tests/support/sparkkafka.py``).

``--records`` records of 100 bytes over ``--partitions``, a batch read of ``key, value,
partition, offset, timestamp`` into the noop sink. Each source is first read until two
successive warm-up reads differ by under 10 % (at least ``--min-warm``, default 5; at most
``--max-warm``): ``format("kafka")``'s JIT needs several reads, and streaming jobs live at
steady state. Then ``--rounds`` interleaved rounds (each starting with another source).
Printed: per-round wall-time ratios (kwatermark's speed / format("kafka")'s, > 1: kwatermark
faster), their median, and the median CPU µs per record of the client's process tree (the
driver, its JVM, the Python workers) and of the broker (when started here); for a stream,
the same again from the end of its first micro-batch (the query's start is paid once in a
stream that runs for days).

Run: ``python bench/bench_readpath.py`` (1M records, 4 partitions, 5 rounds);
``--partitions 4,16,64``; ``--max-offsets-per-trigger 250000`` reads each source as an
AvailableNow stream instead of a batch; ``--busy`` keeps another process spinning on a core
throughout (a loaded executor);
``--records 200000 --rounds 2 --min-warm 2`` for a trial. Writes
``bench/results/readpath.json``. Needs the ``bench`` extra (psutil).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from datetime import datetime, timezone

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(BENCH_DIR)
sys.path.insert(0, BENCH_DIR)
sys.path.insert(1, REPO_ROOT)

import subprocess

import common
from run import git_revision, log, median

from tests.support.sparkkafka import (
    BASELINE_PYSPARK,
    baseline_python,
    kafka_package,
    run_baseline,
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap-servers", help="existing Kafka (its CPU is then not "
                        "measured); default: start one")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", default="4")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--min-warm", type=int, default=5)
    parser.add_argument("--max-warm", type=int, default=15)
    parser.add_argument("--max-offsets-per-trigger", type=int, default=None,
                        help="read as an AvailableNow stream with this maxOffsetsPerTrigger "
                             "(default: a batch read)")
    parser.add_argument("--batch-records", default="",
                        help="also read with the compiled engine at these "
                             "arrow.maxRecordsPerBatch values (comma-separated), as sources "
                             "compiled-N in the same rounds")
    parser.add_argument("--busy", action="store_true",
                        help="keep a CPU-bound process spinning for the whole measurement "
                             "(another job on the machine's other core)")
    parser.add_argument("--results", default=os.path.join(BENCH_DIR, "results"))
    args = parser.parse_args(argv)
    args.partitions = [int(p) for p in args.partitions.split(",") if p.strip()]
    args.batch_records = [int(n) for n in args.batch_records.split(",") if n.strip()]
    return args


def summarise(runs: list[dict]) -> dict:
    """Per partition count and source: the whole reads' medians and ratios, and for streams
    the same after each stream's first micro-batch (``after_first_batch``)."""
    summary: dict = {}
    for partitions in sorted({r["partitions"] for r in runs}):
        mine = [r for r in runs if r["partitions"] == partitions]
        entry = summarise_reads(mine)
        steady = [{**r["after_first_batch"], "source": r["source"], "round": r["round"]}
                  for r in mine if "after_first_batch" in r]
        if steady:
            entry["after_first_batch"] = summarise_reads(steady)
        summary[f"{partitions}p"] = entry
    return summary


def summarise_reads(mine: list[dict]) -> dict:
    rounds: dict = {}
    for r in mine:
        rounds.setdefault(r["round"], {})[r["source"]] = r
    entry: dict = {}
    for source in dict.fromkeys(r["source"] for r in mine):
        measured = [r for r in mine if r["source"] == source]
        brokers = [r["broker_cpu_us"] for r in measured if r["broker_cpu_us"] is not None]
        splits = [r["client_cpu_split_us"] for r in measured if "client_cpu_split_us" in r]
        entry[source] = {
            "records_per_s": median([r["records_per_s"] for r in measured]),
            "client_cpu_us": median([r["client_cpu_us"] for r in measured]),
            "client_cpu_split_us": {kind: median([s[kind] for s in splits])
                                    for kind in (splits[0] if splits else {})},
            "broker_cpu_us": median(brokers) if brokers else None,
        }
        if source != "kafka":
            per_round = [r[source]["records_per_s"] / r["kafka"]["records_per_s"]
                         for r in rounds.values() if "kafka" in r and source in r]
            cpu = [r[source]["client_cpu_us"] / r["kafka"]["client_cpu_us"]
                   for r in rounds.values() if "kafka" in r and source in r]
            entry[source].update({"wall_ratio_per_round": per_round,
                                  "wall_ratio": median(per_round),
                                  "cpu_ratio_per_round": cpu, "cpu_ratio": median(cpu)})
    return entry


def report(summary: dict, results: dict) -> None:
    print()
    print(f"{results['mode']}{', the other core busy' if results['busy_core'] else ''}")
    print(f"Spark {results.get('spark_version')} with {results['connector']}; load average "
          f"{results.get('load_avg_before')} before, {results.get('load_avg_after')} after "
          f"(a shared machine: figures move with the load)")
    for label, entry in summary.items():
        report_reads(label, {k: v for k, v in entry.items() if k != "after_first_batch"})
        if "after_first_batch" in entry:
            report_reads(f"{label}, after each stream's first micro-batch",
                         entry["after_first_batch"])


def report_reads(label: str, entry: dict) -> None:
    print(f"{label}:")
    print(f"     {'source':<15}{'records/s':>12}{'client us/rec':>15}"
          f"{'broker us/rec':>15}{'wall x kafka':>14}{'cpu x kafka':>13}  per-round wall")
    for source, e in entry.items():
        broker = "-" if e["broker_cpu_us"] is None else f"{e['broker_cpu_us']:.2f}"
        ratio = f"{e['wall_ratio']:.2f}" if "wall_ratio" in e else "1"
        cpu = f"{e['cpu_ratio']:.2f}" if "cpu_ratio" in e else "1"
        rounds = ", ".join(f"{x:.2f}" for x in e.get("wall_ratio_per_round", []))
        print(f"     {source:<15}{e['records_per_s']:>12,.0f}{e['client_cpu_us']:>15.2f}"
              f"{broker:>15}{ratio:>14}{cpu:>13}  {rounds}")
    for source, e in entry.items():   # where the client's CPU went (medians)
        split = ", ".join(f"{kind} {us:.2f}"
                          for kind, us in e.get("client_cpu_split_us", {}).items())
        print(f"     {source:<15}client us/rec by process: {split}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    broker = common.Broker.open(args.bootstrap_servers, kind="kafka")
    log(f"broker: {broker.kind} at {broker.bootstrap_servers}")
    workspace = tempfile.mkdtemp(prefix="kwatermark-bench-readpath-")
    results: dict = {
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": common.machine_info(), "git": git_revision(), "broker": broker.kind,
        "baseline_pyspark": BASELINE_PYSPARK, "connector": kafka_package(),
        "mode": ("batch read" if args.max_offsets_per_trigger is None else
                 f"AvailableNow, maxOffsetsPerTrigger={args.max_offsets_per_trigger}"),
        "busy_core": args.busy,
        "sizes": {"records": args.records, "partitions": args.partitions,
                  "value_bytes": common.VALUE_SIZE, "rounds": args.rounds,
                  "min_warm": args.min_warm, "max_warm": args.max_warm},
    }
    spinner = None
    try:
        topics = []
        for partitions in args.partitions:
            topic = broker.create_topic(partitions, f"bench-readpath-{partitions}p")
            seconds = common.produce_sequence(broker, topic, partitions,
                                              args.records // partitions,
                                              tail_flush_each=False)
            records = args.records // partitions * partitions
            log(f"produced {records:,} records into {topic} in {seconds:.1f} s")
            topics.append({"topic": topic, "partitions": partitions, "records": records})
        request = {"bootstrap": broker.bootstrap_servers, "workspace": workspace,
                   "topics": topics, "rounds": args.rounds, "min_warm": args.min_warm,
                   "max_warm": args.max_warm, "broker_pid": broker.pid,
                   "max_offsets_per_trigger": args.max_offsets_per_trigger,
                   "batch_records": args.batch_records}
        if args.busy:   # not in the measured process tree: a sibling of the child
            spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        python = baseline_python()   # the child measures with psutil (the bench extra)
        subprocess.run([python, "-m", "pip", "install", "-q", "psutil>=5.9"], check=True)
        log(f"measuring in the baseline interpreter; its log: {workspace}/child.log")
        reply = run_baseline(os.path.join(BENCH_DIR, "readpath_child.py"), request,
                             timeout=5400, log_path=os.path.join(workspace, "child.log"))
        results.update({k: reply.get(k) for k in ("spark_version", "load_avg_before",
                                                  "load_avg_after")})
        results["warmups"] = reply["warmups"]
        results["runs"] = reply["runs"]
        results["summary"] = summarise(reply["runs"])
    finally:
        if spinner is not None:
            spinner.kill()
        broker.stop()
    report(results["summary"], results)
    os.makedirs(args.results, exist_ok=True)
    name = "readpath" + ("-availablenow" if args.max_offsets_per_trigger else "") + (
        "-busy" if args.busy else "")
    path = os.path.join(args.results, f"{name}.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=1, default=str)
    log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
