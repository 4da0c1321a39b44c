"""The micro-batch at 512 partitions against 4 at steady state (issue 36): long AvailableNow
runs, not the three batches per run of ``bench_partitions.py --scale``.

One SparkSession (``local[2]``), the project's Apache Kafka, one topic per partition count
holding ``--batches`` x ``--per-batch`` records of 100 B; each run reads its topic from the
earliest offset with ``maxOffsetsPerTrigger=--per-batch`` into the noop sink, runs
alternating between the counts (4, 512, 512, 4, ...). The figure is the median
``triggerExecution`` of every full batch after a run's first three (Spark's JIT is still
compiling for the first several batches of a run: 506 -> 232 ms over twelve at 512
partitions). Prints every run's batches and the ratio of the medians, the median driver
planning (``latestOffset``) of the same batches, and the median of each phase Spark times
(``durationMs``: ``addBatch`` the tasks, ``walCommit`` the offsets log, ...) at both counts;
results go to ``bench/results/steady-scale.json``.

``--trigger "1 second"`` runs each on that processing-time trigger instead of AvailableNow
(stopped after ``--batches`` full batches): the same backlog, read a batch a second.
``--brokers N`` starts N Apache Kafka nodes on loopback instead of one (the partitions'
leaders spread over them, as on a production cluster).

Run: ``python bench/bench_steady_scale.py`` (about 3 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import SparkSession

from kwatermark.localbroker import LocalBroker

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                       "steady-scale.json")
SKIPPED = 3   # the first batches of each run: warming up


def produce(bootstrap: str, topic: str, partitions: int, records: int) -> None:
    """A new topic holding ``records`` records of 100 B spread evenly over its partitions."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result()
    time.sleep(2)   # the new partitions' leaders
    append(bootstrap, topic, partitions, records)


def append(bootstrap: str, topic: str, partitions: int, records: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for i in range(records):
        producer.produce(topic, value=b"x" * 100, partition=i % partitions)
        if i % 20_000 == 0:
            producer.flush()
    producer.flush()


def run(spark: SparkSession, bootstrap: str, topic: str, per_batch: int, work: str,
        trigger: str = "availableNow", batches: int = 0) -> list[dict[str, int]]:
    """One run from the earliest offset, AvailableNow or on a processing-time ``trigger``
    (stopped once it has read ``batches`` full batches): each full batch's ``durationMs``
    (``triggerExecution``, ``latestOffset``: the driver's planning, ``addBatch``: the
    tasks, ``walCommit``, ``commitOffsets``...)."""
    name = uuid.uuid4().hex
    writer = (spark.readStream.format("kwatermark")
              .option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
              .option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", str(per_batch))
              .option("watermark.stateLocation", f"{work}/state-{name}").load()
              .writeStream.format("noop").option("checkpointLocation", f"{work}/cp-{name}"))
    if trigger == "availableNow":
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination()
    else:
        query = writer.trigger(processingTime=trigger).start()
        while query.isActive and sum(p.numInputRows == per_batch
                                     for p in query.recentProgress) < batches:
            time.sleep(0.2)
        query.stop()
    return [dict(p.durationMs) for p in query.recentProgress if p.numInputRows == per_batch]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", default="4,512", help="two partition counts")
    parser.add_argument("--per-batch", type=int, default=8192, help="maxOffsetsPerTrigger")
    parser.add_argument("--batches", type=int, default=12, help="micro-batches per run")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each count, x2")
    parser.add_argument("--brokers", type=int, default=1,
                        help="Apache Kafka nodes (the partitions' leaders spread over them)")
    parser.add_argument("--trigger", default="availableNow",
                        help="availableNow, or a processing-time interval ('1 second')")
    parser.add_argument("--results", default=RESULTS)
    args = parser.parse_args()
    low, high = (int(p) for p in args.partitions.split(","))
    broker = LocalBroker.start(kind="kafka", brokers=args.brokers)
    # Spark starts its Python workers with PYSPARK_PYTHON, else "python3" on PATH: run
    # as .venv/bin/python without the venv activated, that found no kwatermark
    # (DATA_SOURCE_NOT_FOUND).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        for count in (low, high):
            produce(broker.bootstrap_servers, f"steady-{count}", count,
                    args.per_batch * args.batches)
        warm: dict[int, list[dict[str, int]]] = {low: [], high: []}
        runs = []
        with tempfile.TemporaryDirectory() as work:
            for count in [low, high, high, low] * args.rounds:
                durations = run(spark, broker.bootstrap_servers, f"steady-{count}",
                                args.per_batch, work, args.trigger, args.batches)
                warm[count] += durations[SKIPPED:]
                batches = [d["triggerExecution"] for d in durations]
                plans = [d.get("latestOffset", 0) for d in durations]
                runs.append({"partitions": count, "trigger_ms": batches,
                             "latest_offset_ms": plans, "duration_ms": durations})
                print(f"{count:>5} partitions: {batches} ms; planning {plans} ms", flush=True)
        phases = sorted({phase for count in warm for d in warm[count] for phase in d})
        phase_medians = {count: {phase: statistics.median(d.get(phase, 0) for d in warm[count])
                                 for phase in phases} for count in warm}
        medians = {count: phase_medians[count]["triggerExecution"] for count in warm}
        plan_medians = {count: phase_medians[count]["latestOffset"] for count in warm}
        ratio = medians[high] / medians[low]
        print(f"median of batches {SKIPPED + 1}-{args.batches} of every run: {low} partitions "
              f"{medians[low]:.0f} ms, {high} partitions {medians[high]:.0f} ms, ratio "
              f"{ratio:.2f}x (n={len(warm[low])}, {len(warm[high])}); planning (latestOffset) "
              f"{plan_medians[low]:.0f} and {plan_medians[high]:.0f} ms")
        # What each phase of Spark's micro-batch adds (durationMs; triggerExecution holds
        # the others): where the batch at many partitions spends what the one at few does not
        print(f"{'phase (median ms)':<20}{low:>8}{high:>8}  difference")
        for phase in phases:
            a, b = phase_medians[low][phase], phase_medians[high][phase]
            print(f"{phase:<20}{a:>8.0f}{b:>8.0f}  {b - a:+.0f}")
        os.makedirs(os.path.dirname(args.results), exist_ok=True)
        with open(args.results, "w") as out:
            json.dump({"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       "brokers": args.brokers, "trigger": args.trigger,
                       "per_batch": args.per_batch, "batches": args.batches, "runs": runs,
                       "median_ms": {str(k): v for k, v in medians.items()},
                       "planning_median_ms": {str(k): v for k, v in plan_medians.items()},
                       "phase_median_ms": {str(k): v for k, v in phase_medians.items()},
                       "ratio": ratio, "load_avg": os.getloadavg()}, out, indent=1)
    finally:
        spark.stop()
        broker.stop()


if __name__ == "__main__":
    main()
