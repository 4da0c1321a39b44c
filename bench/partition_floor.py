"""What any librdkafka client pays to read one micro-batch's records spread over many
partitions (issue 36): the floor under ``bench_steady_scale.py``'s figures, with no Spark and
no kwatermark.

A plain confluent-kafka consumer reads ``--per-batch`` records spread evenly over P
partitions, as a packed micro-batch does: it is assigned every partition at the batch's
start offsets, consumes until it has every record, and lets the partitions go. Before each
turn, ``--batches`` batches are appended to the count's topic and the turn reads them batch
after batch, as a ``bench_steady_scale.py`` run reads its topic: what lies past a batch's
ranges is fetched with them (Kafka answers a fetch with up to 1 MB a partition), as in a
stream with a backlog. Two ways, as the compiled engine does by partition count: ``kept``,
one consumer that assigns and unassigns for every batch (a task of up to 1,024 partitions
keeps its consumer), and ``fresh``, a new consumer per batch, closed after it (a task of
more). Counts and ways alternate in rotated order; printed: each turn's wall and process CPU
(the Python thread and librdkafka's) per batch, the medians of batches 4 and later, and each
count's median against the first count's.

Run: ``python bench/partition_floor.py`` (4 and 4,096 partitions, 10 batches of 8,192
records a turn, as ``bench_steady_scale.py``; about 10 minutes with its own Apache Kafka);
``--bootstrap-servers`` for another broker. Writes ``bench/results/partition-floor.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time
import uuid

from bench_steady_scale import append, produce
from confluent_kafka import Consumer, TopicPartition

from kwatermark.localbroker import LocalBroker

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                       "partition-floor.json")
WAYS = ("kept", "fresh")
SKIPPED = 3   # the first batches of a turn, as bench_steady_scale.py skips them


def process_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def consumer_conf(bootstrap: str) -> dict:
    # the compiled engine's fetch settings that matter here (docs/operations.md)
    return {"bootstrap.servers": bootstrap, "group.id": f"floor-{uuid.uuid4().hex}",
            "enable.auto.commit": False, "fetch.wait.max.ms": 5,
            "queued.min.messages": 8192}


def read_batch(consumer: Consumer, topic: str, partitions: int, start: int,
               per_partition: int) -> None:
    """Every partition from ``start``, until ``per_partition`` records of each are read."""
    consumer.assign([TopicPartition(topic, p, start) for p in range(partitions)])
    left = per_partition * partitions
    deadline = time.monotonic() + 60
    while left:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{topic}: {left} records not read in 60 s")
        end = start + per_partition   # a partition's records past its range are not counted
        left -= sum(1 for m in consumer.consume(min(left, 10_000), 0.05)
                    if m.error() is None and m.offset() < end)
    consumer.unassign()


def turn(bootstrap: str, topic: str, partitions: int, first: int, per_partition: int,
         batches: int, way: str, kept: Consumer) -> list[dict]:
    """``batches`` consecutive batches from offset ``first``: each one's wall and CPU."""
    figures = []
    for batch in range(batches):
        wall, cpu = time.perf_counter(), process_cpu_s()
        consumer = kept if way == "kept" else Consumer(consumer_conf(bootstrap))
        read_batch(consumer, topic, partitions, first + batch * per_partition,
                   per_partition)
        if way == "fresh":
            consumer.close()
        figures.append({"wall_ms": (time.perf_counter() - wall) * 1e3,
                        "cpu_ms": (process_cpu_s() - cpu) * 1e3})
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers", help="default: start an Apache Kafka")
    parser.add_argument("--partitions", default="4,4096")
    parser.add_argument("--per-batch", type=int, default=8192)
    parser.add_argument("--batches", type=int, default=10, help="consecutive batches a turn")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--results", default=RESULTS)
    args = parser.parse_args()
    counts = [int(p) for p in args.partitions.split(",")]
    broker = None if args.bootstrap_servers else LocalBroker.start(kind="kafka")
    bootstrap = args.bootstrap_servers or broker.bootstrap_servers
    try:
        plan = [(c, w) for c in counts for w in WAYS]
        topics = {count: f"floor-{count}-{uuid.uuid4().hex[:8]}" for count in counts}
        for count, topic in topics.items():
            produce(bootstrap, topic, count, 0)
        consumers = {count: Consumer(consumer_conf(bootstrap)) for count in counts}
        measured: dict = {(c, w): [] for c, w in plan}
        first = dict.fromkeys(counts, 0)   # where each topic's next turn begins
        for round_no in range(args.rounds):
            shift = round_no % len(plan)
            for count, way in plan[shift:] + plan[:shift]:
                per_partition = args.per_batch // count
                append(bootstrap, topics[count], count, args.per_batch * args.batches)
                got = turn(bootstrap, topics[count], count, first[count], per_partition,
                           args.batches, way, consumers[count])
                first[count] += per_partition * args.batches
                measured[(count, way)] += got[SKIPPED:]
                print(f"{count:>5} partitions, {way:<5}: wall "
                      f"{[round(g['wall_ms']) for g in got]} ms, cpu "
                      f"{[round(g['cpu_ms']) for g in got]} ms", flush=True)
        for consumer in consumers.values():
            consumer.close()
    finally:
        if broker is not None:
            broker.stop()
    summary = {f"{c} {w}": {kind: statistics.median(g[kind] for g in measured[(c, w)])
                            for kind in ("wall_ms", "cpu_ms")}
               for c, w in measured}
    base = counts[0]
    print(f"medians of {args.rounds} rounds x batches {SKIPPED + 1}-{args.batches}, "
          f"{args.per_batch} records a batch:")
    for count, way in measured:
        s, b = summary[f"{count} {way}"], summary[f"{base} {way}"]
        print(f"  {count:>5} partitions, {way:<5}: wall {s['wall_ms']:.0f} ms "
              f"({s['wall_ms'] / b['wall_ms']:.1f}x {base}), cpu {s['cpu_ms']:.0f} ms "
              f"({s['cpu_ms'] / b['cpu_ms']:.1f}x)")
    os.makedirs(os.path.dirname(args.results), exist_ok=True)
    with open(args.results, "w") as out:
        json.dump({"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   "per_batch": args.per_batch, "batches": args.batches,
                   "rounds": args.rounds, "summary": summary,
                   "batches_measured": {f"{c} {w}": g for (c, w), g in measured.items()},
                   "load_avg": os.getloadavg()}, out, indent=1)


if __name__ == "__main__":
    main()
