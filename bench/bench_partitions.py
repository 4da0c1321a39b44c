"""The partition sweep (DESIGN §12): the same records per micro-batch spread over 4 to 512
Kafka partitions, warm, ``local[2]``.

For every partition count, in one run and one SparkSession, in rotated order per round:

* ``kwatermark``: as shipped (small ranges packed into few Spark tasks,
  ``minRecordsPerPartition``), with ``minRecordsPerPartition`` swept when ``--min-records``
  lists several values;
* ``kwatermark, packing off``: ``minRecordsPerPartition=1``, one Spark task per Kafka
  partition (kwatermark 0.1);
* ``no-op ceiling``: ``format("kwatermark-bench-ceiling")`` with one task per Kafka
  partition and ready-made rows: what Spark's Python data source path costs for that many
  tasks with no source work at all.

The figure is the median ``durationMs.triggerExecution`` of the warm micro-batches (the
first batch of each run is left out). Results go to ``bench/results/partitions.json``.

Run: ``python bench/bench_partitions.py`` (about 10 minutes on 2 cores);
``--partitions 4,64 --rounds 1`` for a quick trial.

``--scale`` (DESIGN §21, issue 36): thousands of partitions against Spark's own
``format("kafka")``, in one SparkSession of the baseline interpreter (PySpark 4.2.0 with
``spark-sql-kafka``, ``tests/support/sparkkafka.py``, as ``bench_dropin.py``): 4, 64, 512 and
4,096 partitions, one topic and 16 topics through ``subscribePattern``, AvailableNow and a
1 s trigger, the same records per micro-batch at every count. Per configuration: the
micro-batch time (``triggerExecution``) of the warm batches, driver planning
(``latestOffset``), ``addBatch``, the bytes of each offsets-log entry and progress event, and
the peak RSS of the driver JVM (local mode: it runs the executors too), the planning Python
process and the largest Python worker. Results: ``bench/results/partitions-scale.json``.
Each run reads ``--scale-batches`` micro-batches (8) and its first ``SCALE_WARMUP`` (3) are
not counted: steady state, as ``bench_steady_scale.py`` (Spark's JIT and the Python workers
still warm over a run's first batches; three batches a run, as before 2026-12-04, counted the
second and third). ``--scale --partitions 4,512 --kafka-max-partitions 512 --scale-records
24576 --scale-batches 4`` is a quick trial.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from datetime import datetime, timezone

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH_DIR)

import common
from run import RESULTS_DIR, Workspace, available_now_progress, git_revision, log, start_spark

from kwatermark.options import DEFAULT_MIN_RECORDS_PER_PARTITION

TARGET_RATIO = 2.0   # the 512-partition batch within 2x the 4-partition batch (issue 12)
SCALE_WARMUP = 3     # --scale: a run's first micro-batches, not counted (steady state)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap-servers", help="use an existing Kafka (default: Tansu)")
    parser.add_argument("--partitions", default=None,
                        help="Kafka partition counts to sweep (default 4,64,256,512; with "
                             "--scale 4,64,512,4096)")
    parser.add_argument("--per-batch", type=int, default=20_000,
                        help="records per micro-batch (maxOffsetsPerTrigger)")
    parser.add_argument("--batches", type=int, default=4,
                        help="micro-batches per run; the first is not counted")
    parser.add_argument("--rounds", type=int, default=2,
                        help="rounds; every configuration runs once per round")
    parser.add_argument("--min-records", default=str(DEFAULT_MIN_RECORDS_PER_PARTITION),
                        help="minRecordsPerPartition values to measure with packing on")
    parser.add_argument("--skip", default="", help="any of: off,ceiling")
    parser.add_argument("--results", default=RESULTS_DIR, help="output directory")
    parser.add_argument("--scale", action="store_true",
                        help="the thousands-of-partitions comparison with format('kafka')")
    parser.add_argument("--scale-records", type=int, default=327_680,
                        help="--scale: records per run, in --scale-batches micro-batches")
    parser.add_argument("--scale-batches", type=int, default=8,
                        help=f"--scale: micro-batches per run; the first {SCALE_WARMUP} are not "
                             f"counted when there are more")
    parser.add_argument("--kafka-max-partitions", type=int, default=512,
                        help="--scale: format('kafka') only up to this many partitions (one "
                             "task per partition: minutes at 4,096)")
    parser.add_argument("--triggers", default="availableNow,1 second",
                        help="--scale: the triggers to run")
    parser.add_argument("--pattern-partitions", default="64,512,4096",
                        help="--scale: the partition counts also read as 16 topics through "
                             "subscribePattern ('' for none)")
    args = parser.parse_args(argv)
    if args.partitions is None:
        args.partitions = "4,64,512,4096" if args.scale else "4,64,256,512"
    return args


def warm_batches(spark, fmt: str, options: dict[str, str], records: int, ws: Workspace,
                 label: str) -> dict:
    """One AvailableNow run into the noop sink; triggerExecution of every batch after the
    first, and how many Spark tasks each batch ran."""
    progress = available_now_progress(spark, fmt, options, records, label, ws, 1800)
    full = max(p.numInputRows for p in progress)
    warm = [p for p in progress[1:] if p.numInputRows == full]
    return {"trigger_s": [p.durationMs.get("triggerExecution", 0) / 1000.0 for p in warm],
            "rows": [p.numInputRows for p in warm]}


def planned_tasks(spark, fmt: str, options: dict[str, str], per_batch: int) -> int:
    """Spark tasks of a first micro-batch, from a stream reader built directly."""
    if fmt == common.CEILING_FORMAT:
        return int(options["parts"])
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from kwatermark.source import KWatermarkDataSource

    source = KWatermarkDataSource(options)
    reader = source.streamReader(spark.createDataFrame([], source.schema()).schema)
    start = reader.initialOffset()
    return len(reader.partitions(start, reader.latestOffset(start, ReadMaxRows(per_batch))))


BOUNDS = """What bounds each figure (--scale):
* micro-batch (triggerExecution): addBatch (the Spark tasks: kwatermark packs ranges into few
  tasks, format("kafka") runs one per partition) + latestOffset + the offsets-log write
  (walCommit) + Spark's own per-batch work (progress event, commit log);
* driver planning (latestOffset): the topics' metadata and the end offsets of every
  partition (librdkafka: ListOffsets 256 partitions a call, ~15 ms at 4,096), asked on
  threads while kwatermark folds the last batch's progress records (one ledger file per
  Spark task), then the per-partition state of the next offset (Python, per partition);
* offsets-log entry: Spark's Kafka offsets (each partition's end) plus kwatermark's state
  columns (DESIGN §21); the progress event carries startOffset + endOffset + latestOffset;
* RSS: the driver JVM's peak (local[2]: executors are its threads) and the largest Python
  process's (a worker reading a pack: its consumer and Arrow batches; on pyspark 4.2 the
  planning process forks from pyspark.daemon and is counted there)."""


def scale_main(args: argparse.Namespace) -> int:
    """DESIGN §21: kwatermark against format("kafka") from 4 to 4,096 partitions."""
    sys.path.insert(1, os.path.dirname(BENCH_DIR))  # tests.support.sparkkafka
    import tempfile

    from tests.support.sparkkafka import BASELINE_PYSPARK, kafka_package, run_baseline

    counts = [int(n) for n in args.partitions.split(",")]
    broker = common.Broker.open(args.bootstrap_servers, kind="kafka")
    workspace = tempfile.mkdtemp(prefix="kwatermark-bench-scale-")
    per_batch = -(-args.scale_records // args.scale_batches)
    cases = []
    try:
        log(f"broker {broker.kind} at {broker.bootstrap_servers}")
        for n in counts:
            patterned = {int(c) for c in args.pattern_partitions.split(",") if c}
            shapes = [(1, "subscribe")] + ([(16, "subscribePattern")] if n in patterned
                                           else [])
            for topics, kind in shapes:
                per_topic = n // topics
                per_partition = -(-args.scale_records // n)
                prefix = f"scale{n}x{topics}-{os.urandom(3).hex()}"
                names = []
                for t in range(topics):
                    name = broker.create_topic(per_topic, prefix) if topics == 1 else \
                        _named_topic(broker, f"{prefix}-{t:02d}", per_topic)
                    common.produce_sequence(broker, name, per_topic, per_partition,
                                            tail_flush_each=False)
                    names.append(name)
                formats = ["kwatermark"] + (["kafka"] if n <= args.kafka_max_partitions else [])
                cases.append({
                    "label": f"{n} partitions, {topics} topic{'s' if topics > 1 else ''}",
                    "partitions": n, "kind": kind, "bootstrap": broker.bootstrap_servers,
                    "topics": names[0] if topics == 1 else f"{prefix}-.*",
                    "records": per_partition * n,
                    "per_batch": -(-per_partition * n // args.scale_batches),
                    "formats": formats})
                log(f"{cases[-1]['label']}: {per_partition * n:,} records produced")
        request = {"workspace": workspace, "cases": cases, "rounds": args.rounds,
                   "triggers": args.triggers.split(",")}
        log(f"measuring in the baseline interpreter (PySpark {BASELINE_PYSPARK}, "
            f"{kafka_package()}); its log: {workspace}/child.log")
        reply = run_baseline(os.path.join(BENCH_DIR, "partitions_child.py"), request,
                             timeout=7200, log_path=os.path.join(workspace, "child.log"))
    finally:
        broker.stop()
    report = {"when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": common.machine_info(), "git": git_revision(),
              "records_per_batch": per_batch, "batches_per_run": args.scale_batches,
              "warm_from": warm_from(args.scale_batches), **reply}
    os.makedirs(args.results, exist_ok=True)
    path = os.path.join(args.results, "partitions-scale.json")
    with open(path, "w") as out:
        json.dump(report, out, indent=2, default=str)
    print_scale(reply, counts, warm_from(args.scale_batches))
    print(BOUNDS)
    if reply.get("error"):
        print(f"\nthe measuring stopped early: {reply['error'][:800]}")
    print(f"results: {path}")
    return 0


def warm_from(batches: int) -> int:
    """The index of a --scale run's first counted micro-batch: after SCALE_WARMUP, or after
    the first alone in a run too short for that."""
    return SCALE_WARMUP if batches > SCALE_WARMUP else 1


def _named_topic(broker, name: str, partitions: int) -> str:
    from confluent_kafka.admin import NewTopic

    admin = broker.admin()
    for future in admin.create_topics([NewTopic(name, partitions, 1)],
                                      operation_timeout=60).values():
        future.result(120)
    return name


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def print_scale(reply: dict, counts: list[int], first: int) -> None:
    """One line per configuration: medians over the warm batches (every data batch of a run
    from its ``first``) of all rounds."""
    rows: dict[tuple, dict[str, list]] = {}
    memory: dict[tuple, dict[str, float]] = {}
    for run in reply.get("runs", []):
        key = (run["label"], run["trigger"], run["format"])
        warm = run["batches"][first:] or run["batches"]
        got = rows.setdefault(key, {})
        for batch in warm:
            for name, value in batch.items():
                got.setdefault(name, []).append(value)
        memory[key] = {k: run[k] for k in ("driver_jvm_mib", "planner_python_mib",
                                            "worker_python_mib")}
        memory[key]["load"] = run["load_avg"][0]
    header = (f"{'configuration':<46}{'batch ms':>9}{'plan ms':>8}{'addBatch':>9}"
              f"{'offsets B':>10}{'progress B':>11}{'JVM MiB':>8}{'plan MiB':>9}"
              f"{'worker':>7}{'load':>6}")
    print(f"\nmedians over the warm micro-batches (every data batch of a run after its "
          f"first {first})")
    print(header)
    medians = {}
    for key in sorted(rows, key=lambda k: (k[1], int(k[0].split()[0]), k[0], k[2])):
        got = rows[key]
        m = {name: _median(got.get(name, [])) for name in
             ("trigger_ms", "latest_offset_ms", "add_batch_ms", "offsets_entry_bytes",
              "progress_bytes")}
        medians[key] = m
        mem = memory[key]
        print(f"{' / '.join(key):<46}{m['trigger_ms'] or 0:>9.0f}"
              f"{m['latest_offset_ms'] or 0:>8.0f}{m['add_batch_ms'] or 0:>9.0f}"
              f"{m['offsets_entry_bytes'] or 0:>10.0f}{m['progress_bytes'] or 0:>11.0f}"
              f"{mem['driver_jvm_mib']:>8.0f}{mem['planner_python_mib']:>9.0f}"
              f"{mem['worker_python_mib']:>7.0f}{mem['load']:>6.1f}")
    print("\nratios (targets: kwatermark at 4,096 within 1.5x of 4, at 512 within 1.3x; sizes "
          "within 3x of format('kafka'))")
    for (label, trigger, fmt), m in sorted(medians.items()):
        if fmt != "kwatermark":
            continue
        base = medians.get(("4 partitions, 1 topic", trigger, "kwatermark"))
        spark = medians.get((label, trigger, "kafka"))
        parts = [f"{label} / {trigger}:"]
        if base and base["trigger_ms"]:
            parts.append(f"batch {m['trigger_ms'] / base['trigger_ms']:.2f}x of 4 partitions")
        if spark and spark["trigger_ms"]:
            parts.append(f"{spark['trigger_ms'] / m['trigger_ms']:.2f}x faster than kafka")
            for name in ("offsets_entry_bytes", "progress_bytes"):
                if spark[name]:
                    parts.append(f"{name.split('_')[0]} {m[name] / spark[name]:.2f}x kafka's")
        print("  " + ", ".join(parts))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.scale:
        return scale_main(args)
    counts = [int(n) for n in args.partitions.split(",")]
    minimums = [int(n) for n in args.min_records.split(",")]
    skip = set(filter(None, args.skip.split(",")))
    records = args.per_batch * args.batches
    broker = common.Broker.open(args.bootstrap_servers)
    ws = Workspace()
    try:
        log(f"broker {broker.kind} at {broker.bootstrap_servers}")
        topics, produce_s = {}, {}
        total = {n: -(-records // n) * n for n in counts}
        for n in counts:
            topics[n] = broker.create_topic(n, f"sweep{n}")
            # Every partition gets the same share, rounded up; a last short batch reads the
            # rest and is not counted.
            produce_s[n] = common.produce_sequence(broker, topics[n], n, -(-records // n),
                                                   tail_flush_each=False)
            log(f"topic {topics[n]}: {n} partitions x {-(-records // n)} records "
                f"({produce_s[n]:.1f} s)")
        spark, spark_s = start_spark()
        log(f"spark started in {spark_s:.1f} s")

        configs = [(f"kwatermark min={m}", "kwatermark", {"minRecordsPerPartition": str(m)})
                   for m in minimums]
        if "off" not in skip:
            configs.append(("kwatermark packing off", "kwatermark",
                            {"minRecordsPerPartition": "1"}))
        if "ceiling" not in skip:
            configs.append(("no-op ceiling", common.CEILING_FORMAT, {}))

        def options_for(fmt: str, extra: dict, n: int) -> dict[str, str]:
            if fmt == common.CEILING_FORMAT:
                return {"rows": str(total[n]), "parts": str(n),
                        "perTrigger": str(args.per_batch)}
            return {"kafka.bootstrap.servers": broker.bootstrap_servers,
                    "subscribe": topics[n], "startingOffsets": "earliest",
                    "maxOffsetsPerTrigger": str(args.per_batch),
                    "watermark.strategy": "bounded", "watermark.maxOutOfOrderness": "5 seconds",
                    "watermark.stateLocation": ws.fresh("ledger"), **extra}

        # Warm-up (not measured): Python workers, JIT, the ceiling's ready-made batch.
        for label, fmt, extra in configs:
            warm_batches(spark, fmt, options_for(fmt, extra, counts[0]), total[counts[0]], ws,
                         label)

        runs: dict[str, dict[int, list[float]]] = {label: {n: [] for n in counts}
                                                   for label, _, _ in configs}
        tasks: dict[str, dict[int, float]] = {label: {} for label, _, _ in configs}
        for round_ in range(args.rounds):
            order = configs[round_ % len(configs):] + configs[:round_ % len(configs)]
            for n in (counts if round_ % 2 == 0 else list(reversed(counts))):
                for label, fmt, extra in order:
                    options = options_for(fmt, extra, n)
                    tasks[label][n] = planned_tasks(spark, fmt, options, args.per_batch)
                    result = warm_batches(spark, fmt, options, total[n], ws,
                                          f"{label} / {n} partitions")
                    runs[label][n] += result["trigger_s"]
                    log(f"round {round_ + 1}: {n:>4} partitions  {label:<26} median "
                        f"{statistics.median(result['trigger_s']):6.2f} s/batch  "
                        f"{tasks[label][n]:6.1f} tasks/batch")
        medians = {label: {n: statistics.median(v) for n, v in by_n.items()}
                   for label, by_n in runs.items()}
        shipped = f"kwatermark min={DEFAULT_MIN_RECORDS_PER_PARTITION}"
        ratio = None
        if shipped in medians and 4 in medians[shipped] and 512 in medians[shipped]:
            ratio = medians[shipped][512] / medians[shipped][4]
        report = {
            "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": common.machine_info(),
            "git": git_revision(),
            "broker": broker.kind,
            "sizes": {"partitions": counts, "records_per_batch": args.per_batch,
                      "batches_per_run": args.batches, "warm_batches_counted":
                      args.batches - 1, "rounds": args.rounds,
                      "watermark": "bounded 5 s", "master": "local[2]"},
            "default_min_records_per_partition": DEFAULT_MIN_RECORDS_PER_PARTITION,
            "produce_s": produce_s,
            "median_trigger_s": medians,
            "spark_tasks_per_batch": tasks,
            "runs_trigger_s": runs,
            "target": {"ratio_512_over_4": ratio, "within": TARGET_RATIO,
                       "met": ratio is not None and ratio <= TARGET_RATIO},
        }
        os.makedirs(args.results, exist_ok=True)
        path = os.path.join(args.results, "partitions.json")
        with open(path, "w") as out:
            json.dump(report, out, indent=2, default=str)
        print()
        print(f"median triggerExecution per warm batch of {args.per_batch:,} records "
              f"(local[2], {args.rounds} round(s) x {args.batches - 1} batches)")
        print(f"{'Kafka partitions':<28}" + "".join(f"{n:>10}" for n in counts))
        for label in medians:
            print(f"{label:<28}" + "".join(f"{medians[label][n]:>9.2f}s" for n in counts))
            print(f"{'  Spark tasks per batch':<28}"
                  + "".join(f"{tasks[label][n]:>10.0f}" for n in counts))
        if ratio is not None:
            print(f"\n512 / 4 partitions, as shipped: {ratio:.2f}x (target <= {TARGET_RATIO}x): "
                  f"{'met' if ratio <= TARGET_RATIO else 'NOT met'}")
        print(f"results: {path}")
        spark.stop()
        return 0
    finally:
        ws.remove()
        broker.stop()


if __name__ == "__main__":
    sys.exit(main())
