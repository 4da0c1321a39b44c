"""Running kwatermark queries in tests and collecting their micro-batches."""

from __future__ import annotations

import ast
import json
import threading
import time
from dataclasses import dataclass, field

from tests.support.kafka import Record


def kwatermark_stream(spark, broker, topic: str | None = None, fmt: str = "kwatermark",
                      **options):
    reader = spark.readStream.format(fmt).option("kafka.bootstrap.servers",
                                                 broker.bootstrap_servers)
    if topic is not None:
        reader = reader.option("subscribe", topic)
    options.setdefault("startingOffsets", "earliest")
    for key, value in options.items():
        reader = reader.option(key.replace("__", "."), str(value))
    return reader.load()


def kwatermark_batch(spark, broker, topic: str | None = None, **options):
    reader = spark.read.format("kwatermark").option("kafka.bootstrap.servers",
                                                    broker.bootstrap_servers)
    if topic is not None:
        reader = reader.option("subscribe", topic)
    for key, value in options.items():
        reader = reader.option(key.replace("__", "."), str(value))
    return reader.load()


@dataclass
class Batches:
    """Rows of each micro-batch a query ran, keyed by batch id, in (partition, offset) order."""

    by_id: dict[int, list] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def collect(self, frame, batch_id: int) -> None:
        rows = sorted(frame.collect(), key=lambda r: (r["topic"], r["partition"], r["offset"]))
        with self.lock:
            self.by_id[batch_id] = rows

    @property
    def rows(self) -> list:
        return [row for batch_id in sorted(self.by_id) for row in self.by_id[batch_id]]

    def batches(self) -> list[list]:
        return [self.by_id[i] for i in sorted(self.by_id)]


def run_available_now(frame, checkpoint: str, batches: Batches | None = None,
                      timeout_s: float = 180) -> tuple[Batches, object]:
    """Run ``frame`` with Trigger.AvailableNow to completion; return batches and query.

    pyspark < 4.2 runs AvailableNow on a Python source as one micro-batch (Spark's fallback
    for sources without SupportsTriggerAvailableNow; docs/operations.md, "Spark versions").
    There the tests that need several batches run the same query on a processing-time
    trigger until it has caught up (:func:`run_until_caught_up`): what a user of that Spark
    runs to catch up in several batches."""
    from kwatermark.sparkapi import ADMISSION_CONTROL

    if not ADMISSION_CONTROL:
        return run_until_caught_up(frame, checkpoint, batches, timeout_s)
    batches = batches if batches is not None else Batches()
    query = (frame.writeStream.foreachBatch(batches.collect)
             .option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination(timeout_s)
    if query.isActive:
        query.stop()
        raise AssertionError(f"query did not finish in {timeout_s}s")
    if query.exception() is not None:
        raise query.exception()
    return batches, query


def run_until_caught_up(frame, checkpoint: str, batches: Batches | None = None,
                        timeout_s: float = 180, quiet_s: float = 2.0
                        ) -> tuple[Batches, object]:
    """Run ``frame`` on a 100 ms processing-time trigger until no batch has started for
    ``quiet_s`` and Spark sees no new data, then stop it; return batches and query."""
    batches = batches if batches is not None else Batches()
    query = (frame.writeStream.foreachBatch(batches.collect)
             .option("checkpointLocation", checkpoint)
             .trigger(processingTime="100 milliseconds").start())
    deadline = time.monotonic() + timeout_s
    last, quiet_since = None, time.monotonic()
    try:
        while True:
            if query.exception() is not None:
                raise query.exception()
            progress = query.lastProgress
            batch = progress["batchId"] if progress else None
            status = query.status
            # "Initializing sources" until the first trigger has asked the source
            waiting = status["message"].startswith("Waiting for")
            if batch != last or status["isDataAvailable"] or not waiting:
                last, quiet_since = batch, time.monotonic()
            elif time.monotonic() - quiet_since >= quiet_s:
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"query did not catch up in {timeout_s}s")
            time.sleep(0.2)
    finally:
        query.stop()
    if query.exception() is not None:
        raise query.exception()
    return batches, query


def progress_offset(text: str) -> dict:
    """An offset from a query's progress (``sources[i]["endOffset"]``): JSON, except that
    pyspark 4.0 and 4.1 give a Python source's offset as ``str()`` of the parsed dict (their
    ``SourceProgress.fromJson``)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return ast.literal_eval(text)


def wm_ms(row) -> int | None:
    """A row's watermark in epoch ms (None when null)."""
    return epoch_ms(row["watermark"])


def ev_ms(row) -> int | None:
    return epoch_ms(row["event_time"])


def epoch_ms(value) -> int | None:
    """A collected timestamp (naive datetimes are UTC in the tests) in epoch ms; None stays."""
    import datetime as dt

    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    return round(value.timestamp() * 1000)


def lagging_three_partitions(per_partition: int) -> list[Record]:
    """Three partitions: partition 1 lags 20 s behind the others, so it holds the watermark;
    partition 2 is out of order within a 2 s bound. Values are "<partition>:<i>"."""
    records = []
    for i in range(per_partition):
        records.append(Record(0, 100_000 + 1_000 * i, value=f"0:{i}".encode()))
        records.append(Record(1, 80_000 + 1_000 * i, value=f"1:{i}".encode()))
        jitter = -1_500 if i % 3 == 1 else 0
        records.append(Record(2, 100_300 + 1_000 * i + jitter, value=f"2:{i}".encode()))
    return records
