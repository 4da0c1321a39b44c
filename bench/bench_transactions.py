"""Transactional topics read as fast as plain ones (issue 22, DESIGN §14).

Three topics of the same records (``--records`` over ``--partitions``, 100-byte values,
event times 1 ms apart, as bench/common.py writes them):

* ``plain``: a plain producer;
* ``txn-100``: a transactional producer committing every 100 records (a marker per
  partition per transaction: ~1 offset in 50 of a 2-partition topic is a marker);
* ``txn-10000``: the same, committing every 10,000 records.

Each round reads every topic, in an order rotated from round to round, three ways:

* ``bare_consumer``: a bare confluent-kafka consumer counting records (the floor: what the
  topic's layout costs any consumer);
* ``reader``: kwatermark's executor loop alone (``RangeReader``, no Spark) over partition 0,
  under ``read_committed``: records/s and, against ``plain``, the cost per record;
* ``batch``: ``spark.read.format("kwatermark")`` of the whole topic into the noop sink;
* ``available_now``: an AvailableNow query in ``--batches`` micro-batches into the noop sink
  (wall time from start to end, cold session excluded by a warm-up).

Then Spark's own ``format("kafka")`` (tests/support/sparkkafka.py: PySpark 4.2.0 in a venv of
its own, the connector through ``spark.jars``) reads the same topics the same two
Spark ways in a child process, rounds rotated the same way (``--no-spark-kafka`` skips it).
The report gives medians and the ratio transactional/plain of each (target >= 0.9).

    .venv/bin/python bench/bench_transactions.py                          # the full run
    .venv/bin/python bench/bench_transactions.py --records 100000 --rounds 1 \\
        --results /tmp/bench --no-spark-kafka                             # a quick trial
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(BENCH_DIR)
sys.path.insert(0, BENCH_DIR)

import common
from confluent_kafka import Producer

KINDS = {"plain": None, "txn-100": 100, "txn-10000": 10_000}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap-servers",
                        help="an existing Apache Kafka (default: start one, kind 'kafka')")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=4,
                        help="micro-batches of the AvailableNow runs")
    parser.add_argument("--no-spark-kafka", action="store_true",
                        help="skip Spark's own format('kafka')")
    parser.add_argument("--results", default=os.path.join(BENCH_DIR, "results"))
    return parser.parse_args(argv)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def produce(bootstrap: str, topic: str, partitions: int, per_partition: int,
            commit_every: int | None) -> float:
    """The records of ``common.produce_sequence``; with ``commit_every``, one transaction
    per ``commit_every`` records (spread over the partitions). Returns seconds spent."""
    started = time.perf_counter()
    conf = {"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.num.messages": 10_000,
            "compression.type": "none", "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576}
    if commit_every:
        conf["transactional.id"] = f"bench-{topic}"
    else:
        conf["enable.idempotence"] = False
    producer = Producer(conf)
    if commit_every:
        producer.init_transactions(60)
        producer.begin_transaction()
    payload = bytearray(os.urandom(common.VALUE_SIZE))
    ts = common.BASE_TS_MS
    written = 0
    for _ in range(per_partition):
        for p in range(partitions):
            payload[:8] = ts.to_bytes(8, "big")
            common._produce(producer, topic, p, bytes(payload), ts)
            ts += 1
            written += 1
            if commit_every and written % commit_every == 0:
                producer.commit_transaction(60)
                producer.begin_transaction()
        producer.poll(0)
    if commit_every:
        producer.commit_transaction(60)
    if producer.flush(300) != 0:
        raise RuntimeError(f"topic {topic}: records left unsent after flush")
    return time.perf_counter() - started


class CountingConsumer:
    """A task's consumer, counting its consume() calls, those that came back short and its
    position() calls: the read loop's cost that does not show per record."""

    def __init__(self, consumer, counts: dict[str, int]):
        self._consumer = consumer
        self._counts = counts

    def consume(self, num_messages: int, timeout: float) -> list:
        messages = self._consumer.consume(num_messages, timeout)
        self._counts["consume_calls"] += 1
        self._counts["short_calls"] += len(messages) < num_messages
        return messages

    def position(self, partitions: list) -> list:
        self._counts["position_calls"] += 1
        return self._consumer.position(partitions)

    def __getattr__(self, name: str):
        return getattr(self._consumer, name)


def counted_read(bootstrap: str, topic: str, end: int) -> tuple[int, float, dict[str, int]]:
    """RangeReader over partition 0, under read_committed, with its consumer counted."""
    import kwatermark.reader

    counts = {"consume_calls": 0, "short_calls": 0, "position_calls": 0}
    opener = kwatermark.reader.open_consumer
    kwatermark.reader.open_consumer = lambda *a, **k: CountingConsumer(opener(*a, **k), counts)
    try:
        reader = common.range_reader(bootstrap, topic, 0, 0, end,
                                     {"kafka.isolation.level": "read_committed"})
        rows, seconds = common.drain(reader)
    finally:
        kwatermark.reader.open_consumer = opener
    return rows, seconds, counts


def bare_read(bootstrap: str, topic: str, end: int) -> tuple[int, float]:
    """The floor: a bare confluent-kafka consumer over partition 0 under read_committed,
    counting records and nothing else, done when its position reaches ``end``. What the
    topic's layout costs any consumer (a transaction's records are many small batches in
    the log), against which kwatermark's own loop is measured."""
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as KafkaTP

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bare-{topic}",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "queued.min.messages": 100_000, "fetch.queue.backoff.ms": 1})
    started = time.perf_counter()
    try:
        consumer.assign([KafkaTP(topic, 0, 0)])
        rows, where = 0, [KafkaTP(topic, 0)]
        while True:
            batch = consumer.consume(10_000, 0.01)
            rows += sum(1 for m in batch if m.error() is None and m.offset() < end)
            if len(batch) < 10_000 and consumer.position(where)[0].offset >= end:
                break
    finally:
        consumer.close()
    return rows, time.perf_counter() - started


def rotated(names: list[str], round_no: int) -> list[str]:
    shift = round_no % len(names)
    return names[shift:] + names[:shift]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def kwatermark_runs(args, bootstrap: str, topics: dict[str, str], ends: dict[str, dict]
                    ) -> dict[str, dict[str, list[float]]]:
    from run import Workspace, available_now_progress, run_batch_read, start_spark

    spark, _ = start_spark("kwatermark-bench-transactions")
    ws = Workspace()
    records = args.records
    per_trigger = str(-(-records // args.batches))
    found: dict[str, dict[str, list[float]]] = {
        k: {"bare_consumer": [], "reader": [], "batch": [], "available_now": []}
        for k in topics}
    calls: dict[str, list[dict[str, int]]] = {}
    try:
        base = {"kafka.bootstrap.servers": bootstrap, "startingOffsets": "earliest",
                "kafka.isolation.level": "read_committed"}
        # Warm-up, not measured: Spark's Python workers, the JVM's paths.
        run_batch_read(spark, "kwatermark", {**base, "subscribe": topics["plain"]}, records)
        for r in range(args.rounds):
            for kind in rotated(list(topics), r):
                topic = topics[kind]
                rows, seconds = bare_read(bootstrap, topic, ends[kind][0])
                assert rows == records // args.partitions, (kind, rows)
                found[kind]["bare_consumer"].append(rows / seconds)
                rows, seconds, counts = counted_read(bootstrap, topic, ends[kind][0])
                assert rows == records // args.partitions, (kind, rows)
                found[kind]["reader"].append(rows / seconds)
                calls.setdefault(kind, []).append(counts)
                options = {**base, "subscribe": topic,
                           "watermark.stateLocation": ws.fresh("ledger")}
                found[kind]["batch"].append(
                    run_batch_read(spark, "kwatermark", options, records)["records_per_s"])
                started = time.perf_counter()
                available_now_progress(spark, "kwatermark",
                                       {**options, "maxOffsetsPerTrigger": per_trigger},
                                       records, f"{kind} round {r}", ws)
                found[kind]["available_now"].append(records / (time.perf_counter() - started))
                log(f"round {r} {kind:<10} bare {found[kind]['bare_consumer'][-1]:>10,.0f}/s  "
                    f"reader {found[kind]['reader'][-1]:>10,.0f}/s  "
                    f"batch {found[kind]['batch'][-1]:>10,.0f}/s  AvailableNow "
                    f"{found[kind]['available_now'][-1]:>10,.0f}/s  reader's consumer "
                    f"{counts}")
    finally:
        ws.remove()
        spark.stop()
    return found, calls


def spark_kafka_runs(args, bootstrap: str, topics: dict[str, str]) -> dict | str:
    sys.path.insert(0, REPO_ROOT)
    try:
        from tests.support.sparkkafka import run_baseline

        return run_baseline(os.path.join(BENCH_DIR, "transactions_spark_kafka.py"),
                            {"bootstrap": bootstrap, "topics": topics,
                             "records": args.records, "rounds": args.rounds,
                             "batches": args.batches}, timeout=3600)
    except Exception as exc:  # noqa: BLE001 - the report says why the baseline is missing
        return f"not measured: {exc}"


def summary(found: dict[str, dict[str, list[float]]]) -> dict:
    out: dict = {}
    for kind, ways in found.items():
        out[kind] = {way: {"median_records_per_s": median(v), "runs": v}
                     for way, v in ways.items()}
    for kind, ways in found.items():
        if kind == "plain":
            continue
        for way in ways:
            plain = out["plain"][way]["median_records_per_s"]
            txn = out[kind][way]["median_records_per_s"]
            out[kind][way]["ratio_to_plain"] = txn / plain
            if way in ("reader", "bare_consumer"):
                # The cost per record: time per record, transactional minus plain.
                out[kind][way]["extra_us_per_record"] = (1 / txn - 1 / plain) * 1e6
    for kind, ways in out.items():
        if "bare_consumer" in ways:
            # kwatermark's loop against the bare consumer on the same topic: the layout's
            # cost (small batches, markers) cancels out.
            ways["reader"]["ratio_to_bare_consumer"] = (
                ways["reader"]["median_records_per_s"]
                / ways["bare_consumer"]["median_records_per_s"])
    return out


def report(title: str, figures: dict) -> list[str]:
    lines = [title]
    for kind, ways in figures.items():
        for way, f in ways.items():
            line = f"  {kind:<10} {way:<14} {f['median_records_per_s']:>11,.0f} records/s"
            if "ratio_to_plain" in f:
                line += f"   transactional/plain {f['ratio_to_plain']:.2f}"
            if "ratio_to_bare_consumer" in f:
                line += f"   reader/bare {f['ratio_to_bare_consumer']:.2f}"
            if "extra_us_per_record" in f:
                line += f"   ({f['extra_us_per_record']:+.3f} us/record)"
            lines.append(line)
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    broker = None
    if args.bootstrap_servers:
        bootstrap = args.bootstrap_servers
    else:
        from kwatermark.localbroker import LocalBroker

        broker = LocalBroker.start(kind="kafka")
        bootstrap = broker.bootstrap_servers
    try:
        b = common.Broker(bootstrap, "kafka")
        per_partition = args.records // args.partitions
        topics, ends, produce_s = {}, {}, {}
        for kind, every in KINDS.items():
            topics[kind] = b.create_topic(args.partitions, f"bench-{kind}")
            produce_s[kind] = produce(bootstrap, topics[kind], args.partitions, per_partition,
                                      every)
            ends[kind] = b.end_offsets(topics[kind], args.partitions)
            log(f"{kind}: {args.records:,} records in {produce_s[kind]:.1f} s, end offsets "
                f"{ends[kind]}")
        results = {
            "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "machine": common.machine_info(), "broker": "Apache Kafka (local, KRaft)",
            "records": args.records, "partitions": args.partitions, "rounds": args.rounds,
            "available_now_batches": args.batches, "end_offsets": ends,
            "produce_s": produce_s, "isolation": "read_committed",
        }
        found, calls = kwatermark_runs(args, bootstrap, topics, ends)
        results["kwatermark"] = summary(found)
        results["reader_consumer_calls"] = calls
        lines = report("kwatermark (read_committed):", results["kwatermark"])
        lines += [f"  {kind:<10} reader's consumer per read of {args.records // args.partitions:,}"
                  f" records: {runs[-1]}" for kind, runs in calls.items()]
        if not args.no_spark_kafka:
            log("Spark's format('kafka') in the baseline venv ...")
            spark_kafka = spark_kafka_runs(args, bootstrap, topics)
            if isinstance(spark_kafka, dict):
                results["spark_kafka"] = summary(spark_kafka["found"])
                results["spark_kafka_version"] = spark_kafka.get("spark_version")
                lines += report(f"Spark's format('kafka') {spark_kafka.get('spark_version')} "
                                f"(read_committed):", results["spark_kafka"])
                for kind in topics:
                    for way in ("batch", "available_now"):
                        ours = results["kwatermark"][kind][way]["median_records_per_s"]
                        theirs = results["spark_kafka"][kind][way]["median_records_per_s"]
                        results["kwatermark"][kind][way]["ratio_to_spark_kafka"] = ours / theirs
                lines.append("kwatermark / Spark's format('kafka'): " + ", ".join(
                    f"{kind} {way} {results['kwatermark'][kind][way]['ratio_to_spark_kafka']:.2f}"
                    for kind in topics for way in ("batch", "available_now")))
            else:
                results["spark_kafka"] = spark_kafka
                lines.append(f"Spark's format('kafka'): {spark_kafka}")
        for line in lines:
            print(line)
        os.makedirs(args.results, exist_ok=True)
        path = os.path.join(args.results, "transactions.json")
        with open(path, "w") as f:
            json.dump(results, f, indent=2, default=str)
        log(f"saved {path}")
    finally:
        if broker is not None:
            broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
