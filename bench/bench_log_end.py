"""A worker's tasks one after another, each reading a partition up to the log's end: what
the broker's hold on the last task's Fetch costs the next one (the compiled engine keeps a
worker's consumer between tasks).

No Spark: the tasks are read in this process as a Python worker reads them (``PackReader``,
one range per task, one kept consumer), on the project's Apache Kafka. Each round appends
``--records`` records of 100 B to each of ``--partitions`` partitions, then reads each
partition's new records as one task, partition after partition, once with kwatermark's
default ``fetch.wait.max.ms`` and once with librdkafka's (500 ms, how kwatermark read
before), in alternating order. A round's first task finds no Fetch held (the records just
appended ended it), so the figure is the median of the other tasks; prints every round and
the ratio.

With ``--stream``, the same comparison in Spark: a stream of ``--rate`` records a second
over the partitions, read by a query with a 1 s trigger into the noop sink (``local[2]``:
each Python worker reads two partitions one after the other), ``--seconds`` per run, the
two settings alternating; prints the median ``addBatch`` of the batches that read records.

Run: ``python bench/bench_log_end.py`` (about 30 s); ``--stream`` about 4 minutes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from kwatermark.arrow import OutputLayout
from kwatermark.localbroker import LocalBroker
from kwatermark.offsets import PartitionState, RangeTask
from kwatermark.options import parse_options
from kwatermark.pack import PackReader
from kwatermark.reader import Decoders
from kwatermark.watermarks import NO_PARTITIONS

SETTINGS = {"kwatermark's default": {}, "librdkafka's 500 ms": {"kafka.fetch.wait.max.ms": "500"}}


def read_round(bootstrap: str, topic: str, partitions: int, start: int, records: int,
               extra: dict, engine: str) -> list[float]:
    """Each partition's ``[start, start + records)`` as one task after another: ms each."""
    options = parse_options({"kafka.bootstrap.servers": bootstrap, "subscribe": topic,
                             "readEngine": engine, **extra})
    times = []
    for p in range(partitions):
        task = RangeTask(topic, p, start, start + records, PartitionState(), True, None,
                         NO_PARTITIONS)
        began = time.perf_counter()
        rows = sum(b.num_rows for b in PackReader(options, OutputLayout(), Decoders(), [task]))
        times.append((time.perf_counter() - began) * 1000)
        assert rows == records, (p, rows)
    return times


def stream_runs(bootstrap: str, topic: str, partitions: int, rate: int, seconds: float,
                rounds: int) -> dict[str, list[int]]:
    """Queries with a 1 s trigger under a steady writer: each setting's ``addBatch`` ms."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)   # else python3 on PATH
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    stop = threading.Event()

    def write() -> None:
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
        i = 0
        while not stop.is_set():
            producer.produce(topic, value=b"x" * 100, partition=i % partitions)
            producer.poll(0)
            i += 1
            time.sleep(1 / rate)
        producer.flush()

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    added: dict[str, list[int]] = {name: [] for name in SETTINGS}
    try:
        with tempfile.TemporaryDirectory() as work:
            for k in range(rounds):
                for name in list(SETTINGS) if k % 2 == 0 else list(SETTINGS)[::-1]:
                    run = uuid.uuid4().hex
                    query = (spark.readStream.format("kwatermark")
                             .option("kafka.bootstrap.servers", bootstrap)
                             .option("subscribe", topic).options(**SETTINGS[name])
                             .option("watermark.stateLocation", f"{work}/s-{run}").load()
                             .writeStream.format("noop").trigger(processingTime="1 second")
                             .option("checkpointLocation", f"{work}/c-{run}").start())
                    time.sleep(seconds)
                    query.stop()
                    times = [p.durationMs["addBatch"] for p in query.recentProgress
                             if p.numInputRows > 0][2:]   # the first batches warm up
                    added[name] += times
                    print(f"run {k}, {name:>20}: addBatch median "
                          f"{statistics.median(times or [0]):.0f} ms, max "
                          f"{max(times or [0])} ms ({len(times)} batches)", flush=True)
    finally:
        stop.set()
        writer.join()
        spark.stop()
    return added


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--records", type=int, default=100, help="per partition per round")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--engine", default="compiled", choices=("compiled", "python"))
    parser.add_argument("--stream", action="store_true", help="in Spark, 1 s trigger")
    parser.add_argument("--rate", type=int, default=8, help="--stream: records a second")
    parser.add_argument("--seconds", type=float, default=45, help="--stream: per run")
    args = parser.parse_args()
    broker = LocalBroker.start(kind="kafka")
    bootstrap, topic = broker.bootstrap_servers, "log-end"
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(topic, args.partitions, 1)])[topic].result()
        time.sleep(2)   # the new partitions' leaders
        if args.stream:
            added = stream_runs(bootstrap, topic, args.partitions, args.rate, args.seconds,
                                max(2, args.rounds // 4))
            new, old = (statistics.median(added[name]) for name in SETTINGS)
            print(f"1 s trigger, {args.rate} records/s over {args.partitions} partitions, "
                  f"addBatch median: {new:.0f} ms (default) against {old:.0f} ms "
                  f"(fetch.wait.max.ms=500): ratio {old / new:.2f}")
            return
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        later: dict[str, list[float]] = {name: [] for name in SETTINGS}
        names = list(SETTINGS)
        for k in range(args.rounds):
            for p in range(args.partitions):
                for _ in range(args.records):
                    producer.produce(topic, value=b"x" * 100, partition=p)
            producer.flush()
            for name in names if k % 2 == 0 else names[::-1]:
                times = read_round(bootstrap, topic, args.partitions, k * args.records,
                                   args.records, SETTINGS[name], args.engine)
                if k > 0:   # the first round opens the consumers
                    later[name] += times[1:]
                print(f"round {k}, {name:>20}: " + ", ".join(f"{t:.0f}" for t in times)
                      + " ms", flush=True)
        medians = {name: statistics.median(t) for name, t in later.items()}
        new, old = (medians[name] for name in names)
        print(f"{args.engine} engine, a task after another at the log's end, median: "
              f"{new:.1f} ms (default) against {old:.1f} ms (fetch.wait.max.ms=500): "
              f"ratio {old / new:.2f}")
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
