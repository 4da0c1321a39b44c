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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap-servers", help="use an existing Kafka (default: Tansu)")
    parser.add_argument("--partitions", default="4,64,256,512",
                        help="Kafka partition counts to sweep")
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
    return parser.parse_args(argv)


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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
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
