"""A live stream of thousands of partitions whose tasks change workers (issue 36).

Spark hands a micro-batch's tasks to whichever of its Python workers is free, and each worker
keeps its own consumer (``compiled._Clients``), whose partitions a task of more than 1,024
partitions parks at its end. When a pack's next task runs on the other worker, that worker's
consumer finds the pack's partitions parked where its own last task of them left them: a
batch or more behind the new ranges. Sought, each wakes its leader's broker thread for a
pass over every partition the consumer knows; resumed (``catches_up`` in
``csrc/fastread.c``), it fetches the records between and drops them.

This reads ``--tasks`` tasks of ``--range`` records a partition from one topic of
``--partitions`` partitions, each task's ranges going on where the last ended, with
``--range`` records appended to every partition before each task (a stream read as it is
written, so a task polls little past its ranges; with ``--backlog``, every task's records
written before the first, as an AvailableNow query catching up finds them, so a task's
partitions are fetched far past its ranges), through the compiled engine's
``PackReader`` as a Spark task reads. Two consumer pools stand for two workers; which one
reads each task is drawn at random (``--seed``, the same draw for every build). Prints each
task's wall ms and how many partitions its start resumed, then the median of the tasks that
ran on the worker that read the task before ("same worker") and of those that did not
("other worker"), the first ``SKIPPED`` of each worker not counted (they start the
partitions).

Run: ``python bench/bench_worker_swap.py`` (about 3 minutes; needs the compiled engine). For
a before, the same script with an older checkout's ``connector`` first on ``PYTHONPATH`` (as
a ``kwatermark`` directory), its extension built in place.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import common
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from kwatermark import compiled
from kwatermark.arrow import OutputLayout
from kwatermark.localbroker import LocalBroker
from kwatermark.offsets import PartitionState, RangeTask
from kwatermark.options import parse_options
from kwatermark.pack import PackReader
from kwatermark.reader import Decoders
from kwatermark.watermarks import NO_PARTITIONS

SKIPPED = 2   # each worker's first tasks start the partitions it has not read before


def append(producer: Producer, topic: str, partitions: int, records: int) -> None:
    """``records`` more records of 100 B in every partition, a partition's in one batch."""
    for p in range(partitions):
        for _ in range(records):
            common._produce(producer, topic, p, b"x" * 100, 0)   # 0: the producer's clock
    if producer.flush(120) != 0:
        raise RuntimeError(f"topic {topic}: records left unsent after flush")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers", help="an Apache Kafka of yours (default: "
                        "the project's, started here)")
    parser.add_argument("--partitions", type=int, default=4096)
    parser.add_argument("--range", type=int, default=10, help="records a partition a task")
    parser.add_argument("--tasks", type=int, default=24)
    parser.add_argument("--seed", type=int, default=36)
    parser.add_argument("--backlog", action="store_true",
                        help="write every task's records before the first (catching up)")
    args = parser.parse_args()
    if compiled.unavailable() is not None:
        raise SystemExit(f"the compiled engine is needed: {compiled.unavailable()}")
    broker = None if args.bootstrap_servers else LocalBroker.start(kind="kafka")
    bootstrap = args.bootstrap_servers or broker.bootstrap_servers
    topic = f"worker-swap-{args.partitions}-{int(time.time())}"
    draw = random.Random(args.seed)
    workers = [draw.randrange(2) for _ in range(args.tasks)]
    pools = [compiled._Clients(), compiled._Clients()]
    found = []   # (worker, changed worker, wall ms, resumed)
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(topic, args.partitions, 1)])[topic].result()
        time.sleep(2)   # the new partitions' leaders
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                             "log_level": 0})
        options = parse_options({"kafka.bootstrap.servers": bootstrap, "subscribe": topic,
                                 "readEngine": "compiled"})
        tasks_of = [0, 0]
        if args.backlog:
            append(producer, topic, args.partitions, args.range * args.tasks)
        for k, worker in enumerate(workers):
            if not args.backlog:
                append(producer, topic, args.partitions, args.range)
            ranges = [RangeTask(topic, p, k * args.range, (k + 1) * args.range,
                                PartitionState(), True, None, NO_PARTITIONS)
                      for p in range(args.partitions)]
            compiled._clients = pools[worker]
            started = time.perf_counter()
            rows = sum(batch.num_rows for batch in PackReader(options, OutputLayout(),
                                                              Decoders(), ranges))
            wall = (time.perf_counter() - started) * 1000
            if rows != args.range * args.partitions:
                raise RuntimeError(f"task {k}: {rows} rows, "
                                   f"{args.range * args.partitions} planned")
            client = next(c for c, _ in pools[worker].kept.values())
            resumed = compiled.lib.kw_resumed(client.handle)
            changed = k > 0 and workers[k - 1] != worker
            tasks_of[worker] += 1
            if tasks_of[worker] > SKIPPED:
                found.append((worker, changed, wall, resumed))
            print(f"task {k:>2}: worker {worker}{' (changed)' if changed else '':<10} "
                  f"{wall:7.0f} ms, {resumed:>5} of {args.partitions} partitions resumed",
                  flush=True)
    finally:
        for pool in pools:
            pool.close_all()
        if broker is not None:
            broker.stop()
    print(f"\n{args.partitions} partitions, {args.range} records a partition a task"
          f"{' (a backlog)' if args.backlog else ''}, "
          f"tasks after each worker's first {SKIPPED}:")
    for label, changed in (("same worker", False), ("other worker", True)):
        walls = [wall for _, c, wall, _ in found if c == changed]
        resumed = [r for _, c, _, r in found if c == changed]
        if walls:
            print(f"  {label:<13} {len(walls):>3} tasks, median {statistics.median(walls):7.0f}"
                  f" ms, partitions resumed median {statistics.median(resumed):.0f}")


if __name__ == "__main__":
    main()
