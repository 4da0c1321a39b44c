"""A worker's tasks of thousands of partitions, one after the other, as a stream's
micro-batches give them: what a parked partition keeps past its range serves the next ranges
(issue 36).

A task of more than 1,024 partitions (or of more than 64 over short ranges:
``compiled.parks``) parks them at its end, keeping the records it polled past its ranges,
at most twice its range a partition (at least 64: ``KW_CARRY_MIN`` in
``csrc/fastread.c``). A partition whose kept records hold its next range reads them and
stays paused through that task; one whose log runs further past its range than it may keep
(a stream catching up) keeps the first records, not none. Two regimes: ``steady``, each
log ``--steady`` records long (within what a partition keeps), and ``catching up``, each
log ``--backlog`` records long. For each, one topic of ``--partitions`` partitions and one
of 4, read by tasks of ``--range`` records a partition, each task's ranges going on where
the last task's ended, through the compiled engine's ``PackReader`` as a Spark task reads
(one consumer kept between tasks). Prints each case's median task wall ms (every task after
the first ``SKIPPED``), how many partitions the last task resumed and kept paused, and the
ratio of ``--partitions`` to 4 in each regime, measured in the same run.

Run: ``python bench/bench_carry.py`` (about 4 minutes; needs the compiled engine).
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench_new_consumer import fill

from kwatermark import compiled
from kwatermark.arrow import OutputLayout
from kwatermark.localbroker import LocalBroker
from kwatermark.offsets import PartitionState, RangeTask
from kwatermark.options import parse_options
from kwatermark.pack import PackReader
from kwatermark.reader import Decoders
from kwatermark.watermarks import NO_PARTITIONS

SKIPPED = 3   # a case's first tasks start its partitions, then the kept records build up


def tasks(bootstrap: str, topic: str, partitions: int, records: int, count: int
          ) -> list[tuple[float, int, int]]:
    """``count`` tasks reading ``records`` records of each partition, each where the last
    ended: each one's wall ms, and the partitions it resumed and kept paused."""
    options = parse_options({"kafka.bootstrap.servers": bootstrap, "subscribe": topic,
                             "readEngine": "compiled"})
    found = []
    for k in range(count):
        ranges = [RangeTask(topic, p, k * records, (k + 1) * records, PartitionState(), True,
                            None, NO_PARTITIONS) for p in range(partitions)]
        started = time.perf_counter()
        rows = sum(batch.num_rows for batch in PackReader(options, OutputLayout(), Decoders(),
                                                          ranges))
        wall = (time.perf_counter() - started) * 1000
        if rows != records * partitions:
            raise RuntimeError(f"{topic}: {rows} rows, {records * partitions} planned")
        client = next((c for c, _ in compiled._clients.kept.values()), None)
        resumed = compiled.lib.kw_resumed(client.handle) if client else 0
        # (kept paused: counted since 2026-12-02; an older build, run for a before, has none)
        count_slept = getattr(compiled.lib, "kw_slept", None)
        slept = count_slept(client.handle) if client and count_slept else 0
        found.append((wall, resumed, slept))
    compiled._clients.close_all()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=4096)
    parser.add_argument("--range", type=int, default=2, help="records a partition a task")
    parser.add_argument("--steady", type=int, default=40, help="records a log, steady")
    parser.add_argument("--backlog", type=int, default=200, help="records a log, catching up")
    args = parser.parse_args()
    if compiled.unavailable() is not None:
        raise SystemExit(f"the compiled engine is needed: {compiled.unavailable()}")
    compiled.MANY_PARTITIONS = 2   # the 4-partition case parks too, as the large one does
    broker = LocalBroker.start(kind="kafka")
    results = {}
    try:
        for regime, length in (("steady", args.steady), ("catching up", args.backlog)):
            for partitions in (4, args.partitions):
                topic = f"carry-{regime.replace(' ', '-')}-{partitions}"
                fill(broker.bootstrap_servers, topic, partitions, length)
                count = min(length // args.range, 20)
                found = tasks(broker.bootstrap_servers, topic, partitions, args.range, count)
                results[regime, partitions] = found
                print(f"{regime}, {partitions} partitions: "
                      f"{[round(w) for w, _, _ in found]} ms", flush=True)
    finally:
        broker.stop()
    print(f"\n{'regime':<13}{'partitions':>11}{'task ms':>9}{'resumed':>9}{'paused':>8}"
          f"{'x 4':>7}")
    for regime in ("steady", "catching up"):
        base = statistics.median(w for w, _, _ in results[regime, 4][SKIPPED:])
        for partitions in (4, args.partitions):
            found = results[regime, partitions]
            wall = statistics.median(w for w, _, _ in found[SKIPPED:])
            _, resumed, slept = found[-1]
            print(f"{regime:<13}{partitions:>11}{wall:>9.0f}{resumed:>9}{slept:>8}"
                  f"{wall / base:>7.2f}")


if __name__ == "__main__":
    main()
