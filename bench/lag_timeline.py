"""A real run for docs/observability.md: a lagging partition, then a stalled one.

    .venv/bin/python bench/lag_timeline.py [--plot docs/observability-lag.png]
                                           [--bootstrap-servers HOST:PORT]

Three partitions, live producers (event time = wall clock), one micro-batch per second,
maxOffsetsPerTrigger=300, idle.policy=caught-up with idle.timeout=2 seconds:

* 8 s: every partition produces 5 records per second; partitions 0 and 2 on time,
  partition 1's producer sends records stamped 20 s in the past (data lag);
* 4 s: all on time (partition 1 catches up);
* once the query has read everything: partition 2 receives a burst of 3,000 records that
  maxOffsetsPerTrigger lets the query read only 300 at a time (the query falls behind on
  it: processing lag); partitions 0 and 1 fall silent, and caught-up excludes them after
  2 s. The plot starts after Spark's slow first batches.

Prints the table of ``python -m kwatermark.inspect`` for the run's checkpoint and, with
--plot, draws its lag plot.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from idle_timeline import session_and_broker  # bench/ is on the path of its scripts

from tests.support.kafka import Record, TopicWriter
from tests.support.streams import kwatermark_stream


def now_ms() -> int:
    return int(time.time() * 1000)


def phase_a(step: int) -> list[Record]:
    """Partitions 0 and 2 on time; partition 1's producer sends records 20 s old."""
    now = now_ms()
    return [Record(p, now - (20_000 if p == 1 else 0) - 1_000 + i * 200)
            for p in range(3) for i in range(5)]


def phase_b(step: int) -> list[Record]:
    """Everyone on time."""
    now = now_ms()
    return [Record(p, now - 1_000 + i * 200) for p in range(3) for i in range(5)]


def burst() -> list[Record]:
    """Partition 2 only: 3,000 records of the last 3 s; partitions 0 and 1 fall silent."""
    now = now_ms()
    return [Record(2, now - 3_000 + i) for i in range(3_000)]


def paced(writer, steps: int, make) -> None:
    for step in range(steps):
        started = time.time()
        records = make(step)
        if records:
            writer.send(records)
        time.sleep(max(0.0, 1.0 - (time.time() - started)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers")
    parser.add_argument("--plot")
    parser.add_argument("--checkpoint")
    parser.add_argument("--stall-seconds", type=int, default=10)
    args = parser.parse_args()
    os.environ["TZ"] = "UTC"
    from kwatermark.inspect import checkpoint_table, format_table, plot

    spark, broker, local = session_and_broker(args.bootstrap_servers)
    checkpoint = args.checkpoint or tempfile.mkdtemp(prefix="kw-lag-")
    writer = TopicWriter(broker, broker.create_topic(3, name="orders" if local else None))
    frame = kwatermark_stream(spark, broker, writer.topic, maxOffsetsPerTrigger=300, **{
        "idle.policy": "caught-up", "idle.timeout": "2 seconds"})
    query = (frame.writeStream.format("noop").option("checkpointLocation", checkpoint)
             .trigger(processingTime="1 second").start())
    try:
        # Spark's first batch takes seconds to start: the timeline begins once it has run.
        writer.send([Record(p, now_ms() - 1_000) for p in range(3)])
        deadline = time.time() + 180
        while not [p for p in query.recentProgress if p["numInputRows"]]:
            if time.time() > deadline or query.exception() is not None:
                raise RuntimeError(f"the query did not start: {query.exception()}")
            time.sleep(0.2)
        warmed_up = max(p["batchId"] for p in query.recentProgress)
        paced(writer, 8, phase_a)
        paced(writer, 4, phase_b)
        query.processAllAvailable()
        writer.send(burst())
        paced(writer, args.stall_seconds, lambda step: [])
        query.processAllAvailable()
    finally:
        query.stop()
        spark.stop()
        if local:
            local.stop()
    table = checkpoint_table(checkpoint)
    # Spark's first batches take seconds: their lags say so, and squash the rest of the plot.
    table = table[table["batch"] > warmed_up + 1]
    print(f"checkpoint: {checkpoint}\n")
    print(format_table(table))
    if args.plot:
        plot(table, args.plot, title="orders: partition 1 lags (data), then partition 2 "
                                     "stalls (processing)")
        print(f"\nplot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
