"""Running kwatermark queries in tests and collecting their micro-batches."""

from __future__ import annotations

import threading
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
    """Run ``frame`` with Trigger.AvailableNow to completion; return batches and query."""
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
