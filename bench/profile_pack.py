"""Where a micro-batch's time goes without Spark (DESIGN §12): the stream reader's calls for
one batch, made in this process as Spark's driver and one Python worker would make them.

For each partition count, the same records per batch (``maxOffsetsPerTrigger``), in the
order Spark calls them:

* ``latestOffset``: fold the previous batch's progress records, ask the brokers, plan;
* ``partitions``: pack the ranges into Spark tasks;
* ``read``: every task of the batch, one after another (the ranges, then the progress
  records offered to the ledger), split into reading and offering;
* ``commit``: the ledger clean-up;
* ``task CPU``: this process's CPU (Python and librdkafka's threads) while the tasks ran;
* ``broker CPU``: what the broker (Tansu, when started here) spent while the tasks ran.

Prints the median of each phase over the warm batches (the first is not counted) and, with
``--cprofile N``, the top of a cProfile of the tasks of one warm batch at N partitions, and
of ``latestOffset`` of another.

With ``--lost-ledger`` the progress records are deleted before each ``latestOffset``, which
then re-reads every range of the batch before on the driver.

Run: ``python bench/profile_pack.py --partitions 4,512`` (``--read-engine python``: the
Python engine's tasks).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pickle
import pstats
import shutil
import statistics
import sys
import tempfile
import time

import common

from kwatermark import source as kw_source
from kwatermark.offsets import BatchOffset


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap-servers", help="use an existing Kafka (default: Tansu)")
    parser.add_argument("--partitions", default="4,512")
    parser.add_argument("--per-batch", type=int, default=20_000)
    parser.add_argument("--batches", type=int, default=5,
                        help="micro-batches per partition count; the first is not counted")
    parser.add_argument("--cprofile", type=int, default=None,
                        help="partition count whose tasks are profiled (one warm batch)")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--read-engine", choices=("compiled", "python"), default=None,
                        help="the readEngine option (default: the source's own choice)")
    parser.add_argument("--lost-ledger", action="store_true",
                        help="delete the progress records before each latestOffset: the "
                             "driver recomputes every range (a location it does not share)")
    return parser.parse_args(argv)


class _Split:
    """The task's time, split into reading (iterating the batches) and what follows."""

    def __init__(self):
        self.read = 0.0
        self.rest = 0.0


def run_task(reader, partition, split: _Split) -> int:
    rows = 0
    started = time.perf_counter()
    batches = reader.read(partition)
    while True:
        t0 = time.perf_counter()
        try:
            batch = next(batches)
        except StopIteration:
            # The generator's tail (the ledger offers) ran inside this last next().
            split.rest += time.perf_counter() - t0
            break
        rows += batch.num_rows
    split.read += time.perf_counter() - started - split.rest
    return rows


def one_count(broker: common.Broker, n: int, args: argparse.Namespace) -> dict:
    topic = broker.create_topic(n, f"pack{n}")
    per_partition = -(-args.per_batch * args.batches // n)
    common.produce_sequence(broker, topic, n, per_partition, tail_flush_each=False)
    options = {"kafka.bootstrap.servers": broker.bootstrap_servers, "subscribe": topic,
               "startingOffsets": "earliest", "maxOffsetsPerTrigger": str(args.per_batch),
               "watermark.strategy": "bounded", "watermark.maxOutOfOrderness": "5 seconds",
               "watermark.stateLocation": tempfile.mkdtemp(prefix="kwatermark-pack-")}
    if args.read_engine:
        options["readEngine"] = args.read_engine
    ds = kw_source.KWatermarkDataSource(options)
    from pyspark.sql.pandas.types import from_arrow_schema

    from kwatermark.arrow import OutputLayout

    reader = ds.streamReader(from_arrow_schema(OutputLayout().schema()))
    # The task side gets its own copy, as a Spark worker would (pickled reader).
    worker = pickle.loads(pickle.dumps(reader))
    start = reader.initialOffset()
    phases: dict[str, list[float]] = {k: [] for k in
                                      ("latestOffset", "partitions", "read", "offer", "commit",
                                       "total", "task CPU", "broker CPU")}
    profile_text = driver_text = None
    for batch in range(args.batches):
        driver = None
        if args.cprofile == n and batch == 2:
            driver = cProfile.Profile()
            driver.enable()
        if args.lost_ledger:
            shutil.rmtree(options["watermark.stateLocation"], ignore_errors=True)
        t0 = time.perf_counter()
        end = reader.latestOffset(start, _max_rows(args.per_batch))
        t1 = time.perf_counter()
        if driver is not None:
            driver.disable()
            out = io.StringIO()
            pstats.Stats(driver, stream=out).sort_stats(os.environ.get("PROFILE_SORT", "cumulative")).print_stats(args.top)
            driver_text = out.getvalue()
        parts = reader.partitions(start, end)
        t2 = time.perf_counter()
        split = _Split()
        profiler = None
        if args.cprofile == n and batch == 1:
            profiler = cProfile.Profile()
            profiler.enable()
        broker_before, own_before = common.process_cpu_s(broker.pid), time.process_time()
        rows = sum(run_task(worker, p, split) for p in parts)
        broker_s = common.process_cpu_s(broker.pid) - broker_before
        own_s = time.process_time() - own_before
        if profiler is not None:
            profiler.disable()
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats(os.environ.get("PROFILE_SORT",
                                                                         "cumulative")).print_stats(args.top)
            profile_text = out.getvalue()
        t3 = time.perf_counter()
        reader.commit(end)
        t4 = time.perf_counter()
        if batch:
            for key, value in (("latestOffset", t1 - t0), ("partitions", t2 - t1),
                               ("read", split.read), ("offer", split.rest),
                               ("commit", t4 - t3), ("total", t4 - t0),
                               ("task CPU", own_s), ("broker CPU", broker_s)):
                phases[key].append(value)
        common_rows = sum(r.end - r.start for r in BatchOffset.from_json(end).partitions.values())
        if rows != common_rows:
            raise RuntimeError(f"{n} partitions, batch {batch}: {rows} rows, "
                               f"{common_rows} planned")
        start = end
    shutil.rmtree(options["watermark.stateLocation"], ignore_errors=True)
    broker.delete_topic(topic)
    return {"tasks": len(parts), "phases": {k: statistics.median(v) for k, v in phases.items()},
            "profile": profile_text, "driver_profile": driver_text}


def _max_rows(n: int):
    from pyspark.sql.streaming.datasource import ReadMaxRows

    return ReadMaxRows(n)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    counts = [int(n) for n in args.partitions.split(",")]
    broker = common.Broker.open(args.bootstrap_servers)
    try:
        results = {n: one_count(broker, n, args) for n in counts}
    finally:
        broker.stop()
    names = list(next(iter(results.values()))["phases"])
    print(f"\nmedian seconds per warm batch of {args.per_batch:,} records, no Spark "
          f"({args.batches - 1} batches)")
    print(f"{'phase':<14}" + "".join(f"{n:>10}" for n in counts))
    for name in names:
        print(f"{name:<14}" + "".join(f"{results[n]['phases'][name]:>10.3f}" for n in counts))
    print(f"{'tasks':<14}" + "".join(f"{results[n]['tasks']:>10}" for n in counts))
    if len(counts) > 1:
        first, last = results[counts[0]], results[counts[-1]]
        print(f"total {counts[-1]} / {counts[0]}: "
              f"{last['phases']['total'] / first['phases']['total']:.2f}x")
    for n in counts:
        if results[n]["profile"]:
            print(f"\ncProfile of the tasks of one warm batch, {n} partitions:")
            print(results[n]["profile"])
            print(f"\ncProfile of latestOffset of one warm batch, {n} partitions:")
            print(results[n]["driver_profile"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
