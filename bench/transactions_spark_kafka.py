"""bench_transactions.py's child: Spark's own ``format("kafka")`` reading the same topics the
same two Spark ways, rounds in the same rotated order. Runs under the baseline interpreter
(tests/support/sparkkafka.py, PySpark 4.2.0 with spark-sql-kafka); replies JSON."""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid

from tests.support.sparkkafka import baseline_session, child_io


def rotated(names: list[str], round_no: int) -> list[str]:
    shift = round_no % len(names)
    return names[shift:] + names[:shift]


def main() -> None:
    request, reply = child_io()
    spark = baseline_session("kwatermark-bench-transactions-spark-kafka",
                             conf={"spark.ui.showConsoleProgress": "false"})
    topics: dict[str, str] = request["topics"]
    records = request["records"]
    per_trigger = str(-(-records // request["batches"]))
    base = {"kafka.bootstrap.servers": request["bootstrap"], "startingOffsets": "earliest",
            "kafka.isolation.level": "read_committed"}
    root = tempfile.mkdtemp(prefix="bench-spark-kafka-")
    found = {k: {"batch": [], "available_now": []} for k in topics}

    def batch(topic: str) -> float:
        reader = spark.read.format("kafka")
        for key, value in {**base, "subscribe": topic}.items():
            reader = reader.option(key, value)
        started = time.perf_counter()
        reader.load().write.format("noop").mode("overwrite").save()
        return records / (time.perf_counter() - started)

    def available_now(topic: str) -> float:
        reader = spark.readStream.format("kafka")
        for key, value in {**base, "subscribe": topic,
                           "maxOffsetsPerTrigger": per_trigger}.items():
            reader = reader.option(key, value)
        started = time.perf_counter()
        query = (reader.load().writeStream.format("noop")
                 .option("checkpointLocation", f"{root}/{uuid.uuid4().hex}")
                 .trigger(availableNow=True).start())
        query.awaitTermination(600)
        seconds = time.perf_counter() - started
        if query.isActive or query.exception() is not None:
            query.stop()
            raise RuntimeError(f"Spark's Kafka source on {topic}: {query.exception()}")
        total = sum(p.numInputRows for p in query.recentProgress)
        if total != records:
            raise RuntimeError(f"Spark's Kafka source read {total} of {records} on {topic}")
        return records / seconds

    try:
        batch(topics["plain"])   # warm-up, not measured
        for r in range(request["rounds"]):
            for kind in rotated(list(topics), r):
                found[kind]["batch"].append(batch(topics[kind]))
                found[kind]["available_now"].append(available_now(topics[kind]))
        reply({"found": found, "spark_version": spark.version})
    finally:
        shutil.rmtree(root, ignore_errors=True)
        spark.stop()


if __name__ == "__main__":
    main()
