"""What a task pays per partition it reads, and per partition its consumer knows (issue 36).

librdkafka's broker thread looks at every partition the consumer knows after each wake-up,
and each partition started (or sought, or stopped) wakes it once, so starting ``n``
partitions of a topic of ``T`` costs about ``n x T`` such looks on top of the work per
partition. A task of more than 1,024 partitions (``kwatermark.compiled``) therefore parks its
partitions at its end (paused where they stand) and the worker's next task resumes them. This
bench reads ``n`` partitions, two records each, from a topic of ``T`` partitions, for (n, T) =
(1,024, 1,024), (1,024, 4,096) and (4,096, 4,096), through the compiled engine's
``PackReader`` as a Spark task would, each task's ranges going on where the last task's of
its case ended. Blocks of ``--tasks`` tasks per case, the cases in rotated order ``--rounds``
times; the first task of a block is not counted (its partitions were parked behind, by the
case before, and are sought). Prints each case's median wall and process CPU ms, its ratio
to the first case, and ``aside``: the ms from a task's end until what it left to a thread of
its own is done (the Python engine's close aside, ``consumer.close_aside``; nothing for the
compiled engine since parking).

Run: ``python bench/bench_partition_starts.py`` (about 3 minutes; needs the compiled engine).
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench_new_consumer import fill

from kwatermark import compiled
from kwatermark.arrow import OutputLayout
from kwatermark.consumer import closed_aside
from kwatermark.localbroker import LocalBroker
from kwatermark.offsets import PartitionState, RangeTask
from kwatermark.options import parse_options
from kwatermark.pack import PackReader
from kwatermark.reader import Decoders
from kwatermark.watermarks import NO_PARTITIONS

CASES = ((1024, 1024), (1024, 4096), (4096, 4096))   # (partitions read, topic's partitions)


def task(bootstrap: str, topic: str, partitions: int, offset: int
         ) -> tuple[float, float, float]:
    """Wall and process CPU ms of one task reading records ``offset`` and ``offset + 1`` of
    partitions 0 to ``partitions - 1``, and the ms from its end until the work it left
    aside is done (its consumer destroyed, the next one made and its topic learned)."""
    options = parse_options({"kafka.bootstrap.servers": bootstrap, "subscribe": topic,
                             "readEngine": "compiled"})
    tasks = [RangeTask(topic, p, offset, offset + 2, PartitionState(), True, None,
                       NO_PARTITIONS) for p in range(partitions)]
    started, cpu = time.perf_counter(), time.process_time()
    rows = sum(batch.num_rows for batch in PackReader(options, OutputLayout(), Decoders(),
                                                      tasks))
    ended = time.perf_counter()
    wall, cpu = (ended - started) * 1000, (time.process_time() - cpu) * 1000
    if rows != 2 * partitions:
        raise RuntimeError(f"{topic}: {rows} rows, {2 * partitions} planned")
    if not closed_aside(60):
        raise RuntimeError("a task's consumer was never destroyed")
    aside = (time.perf_counter() - ended) * 1000
    time.sleep(0.3)
    return wall, cpu, aside


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=5, help="tasks per block")
    parser.add_argument("--rounds", type=int, default=2, help="blocks per case")
    args = parser.parse_args()
    if compiled.unavailable() is not None:
        raise SystemExit(f"the compiled engine is needed: {compiled.unavailable()}")
    # Every task here parks its partitions, as a task of thousands of partitions does.
    compiled.MANY_PARTITIONS = 64
    per_partition = 2 * args.tasks * args.rounds * len(CASES) + 2
    broker = LocalBroker.start(kind="kafka")
    try:
        topics = {}
        for total in sorted({t for _, t in CASES}):
            topics[total] = f"starts-{total}"
            fill(broker.bootstrap_servers, topics[total], total, per_partition)
        found: dict[tuple[int, int], list[tuple[float, float, float]]] = {
            case: [] for case in CASES}
        offset = 0
        for round_ in range(args.rounds):
            for k in range(len(CASES)):
                case = CASES[(round_ + k) % len(CASES)]
                read, total = case
                for i in range(args.tasks):
                    measured = task(broker.bootstrap_servers, topics[total], read, offset)
                    offset += 2
                    if i:
                        found[case].append(measured)
                print(f"round {round_ + 1}: {read} of {total} done", flush=True)
    finally:
        broker.stop()
    first = statistics.median(t[0] for t in found[CASES[0]])
    print(f"\n{'read of known':<16}{'wall ms':>9}{'cpu ms':>9}{'x first':>9}{'aside ms':>10}")
    for (read, total), times in found.items():
        wall, cpu, aside = (statistics.median(t[i] for t in times) for i in range(3))
        print(f"{f'{read} of {total}':<16}{wall:>9.0f}{cpu:>9.0f}{wall / first:>9.2f}"
              f"{aside:>10.0f}")


if __name__ == "__main__":
    main()
