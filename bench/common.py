"""What the benchmark's figures share: the broker, the data set, the single-process floor and
the executor loop run without Spark. ``bench/run.py`` drives them; child processes (the
memory probe) import this module on their own, so it imports nothing from Spark.
"""

from __future__ import annotations

import logging
import os
import platform
import resource
import sys
import time
import uuid
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from kwatermark import arrow
from kwatermark.offsets import split_range

BASE_TS_MS = 1_700_000_000_000
VALUE_SIZE = 100

FLOOR_BATCH = 10_000


# -- broker and data -------------------------------------------------------------------


@dataclass
class Broker:
    bootstrap_servers: str
    kind: str                 # "tansu" or "kafka" (started here), or "external"
    _local: object = None

    @classmethod
    def open(cls, bootstrap_servers: str | None, kind: str = "tansu") -> Broker:
        """The broker at ``bootstrap_servers``, else a local one of ``kind`` started here."""
        if bootstrap_servers:
            return cls(bootstrap_servers, "external")
        from kwatermark.localbroker import LocalBroker

        local = LocalBroker.start(kind=kind)
        return cls(local.bootstrap_servers, kind, local)

    @property
    def pid(self) -> int | None:
        return self._local.process.pid if self._local is not None else None

    def admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap_servers})

    def create_topic(self, partitions: int, prefix: str) -> str:
        topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
        admin = self.admin()  # the futures die with their client: keep it referenced
        for future in admin.create_topics([NewTopic(topic, partitions, 1)],
                                          operation_timeout=60).values():
            future.result(120)
        return topic

    def delete_topic(self, topic: str) -> None:
        """Drop a topic a benchmark is done with: a broker kept between runs (an external
        one) otherwise holds every run's partitions open, and at thousands of partitions a
        run ran Apache Kafka out of file descriptors ("Too many open files")."""
        admin = self.admin()
        for future in admin.delete_topics([topic], operation_timeout=60).values():
            future.result(120)

    def end_offsets(self, topic: str, partitions: int) -> dict[int, int]:
        admin = self.admin()
        futures = admin.list_offsets({KafkaTP(topic, p): OffsetSpec.latest()
                                      for p in range(partitions)}, request_timeout=60)
        return {tp.partition: f.result().offset for tp, f in futures.items()}

    def stop(self) -> None:
        if self._local is not None:
            self._local.stop()


def fast_producer(bootstrap_servers: str) -> Producer:
    return Producer({
        "bootstrap.servers": bootstrap_servers,
        "linger.ms": 50,
        "batch.num.messages": 10_000,
        "compression.type": "none",
        "enable.idempotence": False,
        "queue.buffering.max.messages": 1_000_000,
        "queue.buffering.max.kbytes": 1_048_576,
    })


def _produce(producer: Producer, topic: str, partition: int, value: bytes, ts: int) -> None:
    while True:
        try:
            producer.produce(topic, value=value, partition=partition, timestamp=ts)
            return
        except BufferError:
            producer.poll(0.05)


def produce_sequence(broker: Broker, topic: str, partitions: int, per_partition: int,
                     tail_flush_each: bool = True) -> float:
    """``per_partition`` records of ``VALUE_SIZE`` bytes in every partition, event times
    increasing by 1 ms per record across the topic; returns seconds spent.

    Tansu reports a partition's end offset as the base offset of its last batch + 1 (DESIGN
    §8): flush the bulk, then send each partition's last record in a batch of its own.
    Batches are per partition, so one flush after all the tails would do as well; with
    ``tail_flush_each`` every tail is flushed on its own, as tests/support/kafka.py does.
    """
    started = time.perf_counter()
    producer = fast_producer(broker.bootstrap_servers)
    payload = bytearray(os.urandom(VALUE_SIZE))
    ts = BASE_TS_MS
    for i in range(per_partition - 1):
        for p in range(partitions):
            payload[:8] = ts.to_bytes(8, "big")
            _produce(producer, topic, p, bytes(payload), ts)
            ts += 1
        if i % 1000 == 999:
            producer.poll(0)
    if producer.flush(300) != 0:
        raise RuntimeError(f"topic {topic}: records left unsent after flush")
    for p in range(partitions):
        _produce(producer, topic, p, bytes(payload), ts)
        ts += 1
        if tail_flush_each:
            producer.flush(60)
    if producer.flush(60) != 0:
        raise RuntimeError(f"topic {topic}: records left unsent after flush")
    ends = broker.end_offsets(topic, partitions)
    wrong = {p: e for p, e in ends.items() if e != per_partition}
    if wrong:
        raise RuntimeError(f"topic {topic}: end offsets {wrong} differ from the "
                           f"{per_partition} records produced per partition (broker quirk?)")
    return time.perf_counter() - started


# -- the floor: one process, one consumer, same Arrow columns --------------------------


def floor_read(bootstrap_servers: str, topic: str, ranges: dict[int, tuple[int, int]]
               ) -> tuple[int, float]:
    """Read ``ranges`` (partition -> [start, end)) with one tuned confluent-kafka Consumer
    into Arrow batches of Spark's Kafka columns; returns (records, seconds)."""
    layout = arrow.OutputLayout()
    schema = pa.schema(list(layout.schema())[:7])
    total = sum(end - start for start, end in ranges.values())
    started = time.perf_counter()
    # The tuned prefetch of DESIGN §9: the local queue may hold the whole range and no more.
    # librdkafka compares the *shared* consumer queue (every assigned partition's fetch queue
    # is forwarded to it) against queued.min.messages and queued.max.messages.kbytes, and
    # pauses fetching for fetch.queue.backoff.ms once either is reached, so both caps are
    # set for the total range, not per partition, and the backoff is kwatermark's 1 ms.
    consumer = Consumer({
        "bootstrap.servers": bootstrap_servers,
        "group.id": f"bench-floor-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "enable.partition.eof": False,
        "queued.min.messages": max(1, total),
        "queued.max.messages.kbytes": 2_097_151,
        "fetch.max.bytes": 64 * 1024 * 1024,
        "fetch.queue.backoff.ms": 1,
        "receive.message.max.bytes": 100 * 1024 * 1024,
    })
    consumer.assign([KafkaTP(topic, p, start) for p, (start, _) in ranges.items()])
    pending = {p: end - start for p, (start, end) in ranges.items() if end > start}
    buffers = {p: ([], [], [], [], []) for p in ranges}
    rows = 0

    def emit(p: int) -> None:
        nonlocal rows
        keys, values, offsets, ts, types = buffers[p]
        columns = arrow.kafka_columns(layout, topic, p, keys, values,
                                      np.asarray(offsets, dtype=np.int64),
                                      np.asarray(ts, dtype=np.int64),
                                      np.asarray(types, dtype=np.int32), None)
        rows += pa.RecordBatch.from_arrays(columns, schema=schema).num_rows
        buffers[p] = ([], [], [], [], [])

    try:
        while pending:
            for message in consumer.consume(min(sum(pending.values()), FLOOR_BATCH), 10.0):
                if message.error() is not None:
                    if message.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise RuntimeError(message.error().str())
                p = message.partition()
                if p not in pending:
                    continue
                keys, values, offsets, ts, types = buffers[p]
                keys.append(message.key())
                values.append(message.value())
                offsets.append(message.offset())
                kind, stamp = message.timestamp()
                types.append(kind - 1)
                ts.append(stamp)
                if message.offset() + 1 >= ranges[p][1]:
                    del pending[p]
                    emit(p)
                elif len(offsets) >= FLOOR_BATCH:
                    emit(p)
                    pending[p] = ranges[p][1] - message.offset() - 1
                else:
                    pending[p] = ranges[p][1] - message.offset() - 1
    finally:
        consumer.close()
    return rows, time.perf_counter() - started


# -- the executor loop without Spark ---------------------------------------------------


def range_reader(bootstrap_servers: str, topic: str, partition: int, start: int, end: int,
                 extra_options: dict[str, str] | None = None):
    """kwatermark's executor loop (RangeReader) over one task, built as the planner builds
    it, for a partition whose state at ``start`` is fresh."""
    from kwatermark.offsets import PartitionState, RangeTask
    from kwatermark.options import parse_options
    from kwatermark.reader import Decoders, RangeReader
    from kwatermark.watermarks import NO_PARTITIONS

    raw = {"kafka.bootstrap.servers": bootstrap_servers, "subscribe": topic,
           "watermark.strategy": "bounded", "watermark.maxOutOfOrderness": "5 seconds"}
    raw.update(extra_options or {})
    options = parse_options(raw, streaming=True)
    layout = arrow.OutputLayout(flag_late=options.late_records == "flag")
    task = RangeTask(topic, partition, start, end, PartitionState(), True, None, NO_PARTITIONS)
    return RangeReader(options, layout, Decoders(), task)


def drain(reader) -> tuple[int, float]:
    started = time.perf_counter()
    rows = 0
    for batch in reader:
        rows += batch.num_rows
    return rows, time.perf_counter() - started


def process_cpu_s(pid: int | None) -> float:
    """CPU seconds (user + system) a process has used, from /proc; 0 for no process (an
    external broker) or one that has ended."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb() -> float:
    """This process's peak resident set size so far, in MB.

    Linux's ``getrusage().ru_maxrss`` carries the high-water mark of the image that exec'd
    this one (a child started from a 500 MB parent reports 500 MB), so the peak of this
    image is read from VmHWM in /proc/self/status where it exists.
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024.0 if sys.platform != "darwin" else peak / 1024.0 / 1024.0


def memory_probe(bootstrap_servers: str, topic: str, partition: int, start: int, end: int,
                 extra_options: dict[str, str] | None = None) -> dict:
    """Run in a fresh child process: the executor loop over one range; peak RSS before and
    after reading (imports and consumer set-up are in the first figure)."""
    logging.basicConfig(level=logging.WARNING)
    reader = range_reader(bootstrap_servers, topic, partition, start, end, extra_options)
    before = rss_mb()
    cpu = resource.getrusage(resource.RUSAGE_SELF)
    rows, seconds = drain(reader)
    after = resource.getrusage(resource.RUSAGE_SELF)
    return {"records": rows, "seconds": seconds, "records_per_s": rows / seconds,
            "cpu_s": (after.ru_utime + after.ru_stime) - (cpu.ru_utime + cpu.ru_stime),
            "rss_before_mb": before, "peak_rss_mb": rss_mb()}


# -- Spark's own ceiling: a Python data source that does no work ----------------------

CEILING_FORMAT = "kwatermark-bench-ceiling"
# kwatermark's columns with watermark.strategy=bounded and lateRecords=keep.
CEILING_SCHEMA = ("`key` binary, `value` binary, `topic` string, `partition` int, "
                  "`offset` bigint, `timestamp` timestamp, `timestampType` int, "
                  "`event_time` timestamp, `watermark` timestamp")
_CEILING_BATCH: list = []


def _ceiling_batch() -> pa.RecordBatch:
    """One ready-made batch of FLOOR_BATCH rows shaped like kwatermark's, built once per
    Python worker."""
    if not _CEILING_BATCH:
        n = FLOOR_BATCH
        micros = (BASE_TS_MS + np.arange(n, dtype=np.int64)) * 1000
        stamps = pa.array(micros, type=pa.int64()).cast(arrow.TIMESTAMP)
        _CEILING_BATCH.append(pa.RecordBatch.from_arrays([
            pa.array([None] * n, type=pa.binary()),
            pa.array([os.urandom(VALUE_SIZE) for _ in range(n)], type=pa.binary()),
            pa.array(["ceiling"] * n, type=pa.string()),
            pa.array(np.zeros(n, dtype=np.int32)),
            pa.array(np.arange(n, dtype=np.int64)),
            stamps,
            pa.array(np.zeros(n, dtype=np.int32)),
            stamps,
            stamps,
        ], names=["key", "value", "topic", "partition", "offset", "timestamp",
                  "timestampType", "event_time", "watermark"]))
    return _CEILING_BATCH[0]


def _ceiling_rows(rows: int):
    batch = _ceiling_batch()
    while rows > 0:
        yield batch if rows >= batch.num_rows else batch.slice(0, rows)
        rows -= batch.num_rows


def ceiling_source():
    """``format("kwatermark-bench-ceiling")``: yields ``rows`` ready-made rows of kwatermark's
    schema over ``parts`` tasks (and, streaming, ``perTrigger`` rows per micro-batch), so
    its throughput is what Spark's Python data source path allows with no source work.
    Workers import this module: ``bench/`` must be on their PYTHONPATH."""
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceReader,
        DataSourceStreamReader,
        InputPartition,
    )
    from pyspark.sql.streaming.datasource import ReadMaxRows, SupportsTriggerAvailableNow

    class CeilingBatchReader(DataSourceReader):
        def __init__(self, rows: int, parts: int):
            self.rows, self.parts = rows, parts

        def partitions(self):
            return [InputPartition(b) for b in split_range(0, self.rows, self.parts)]

        def read(self, partition):
            start, end = partition.value
            yield from _ceiling_rows(end - start)

    class CeilingStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
        def __init__(self, rows: int, parts: int, per_trigger: int):
            self.rows, self.parts, self.per_trigger = rows, parts, per_trigger

        def initialOffset(self):
            return {"offset": 0}

        def prepareForTriggerAvailableNow(self):
            pass

        def getDefaultReadLimit(self):
            return ReadMaxRows(self.per_trigger)

        def latestOffset(self, start, limit):
            step = getattr(limit, "max_rows", self.rows)
            return {"offset": min(self.rows, start["offset"] + step)}

        def partitions(self, start, end):
            return [InputPartition(b)
                    for b in split_range(start["offset"], end["offset"], self.parts)]

        def read(self, partition):
            start, end = partition.value
            yield from _ceiling_rows(end - start)

        def commit(self, end):
            pass

    class CeilingSource(DataSource):
        @classmethod
        def name(cls):
            return CEILING_FORMAT

        def schema(self):
            return CEILING_SCHEMA

        def reader(self, schema):
            return CeilingBatchReader(int(self.options["rows"]), int(self.options["parts"]))

        def streamReader(self, schema):
            return CeilingStreamReader(int(self.options["rows"]), int(self.options["parts"]),
                                       int(self.options["perTrigger"]))

    return CeilingSource


# -- the machine -----------------------------------------------------------------------


def _first(version: object) -> str:
    return version[0] if isinstance(version, tuple) else str(version)


def machine_info() -> dict:
    import confluent_kafka
    import pyspark

    info = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "pyspark": pyspark.__version__,
        "pyarrow": pa.__version__,
        "confluent_kafka": _first(confluent_kafka.version()),
        "librdkafka": confluent_kafka.libversion()[0],
    }
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            models = [line.split(":", 1)[1].strip() for line in cpuinfo
                      if line.startswith("model name")]
        info["cpu_model"] = models[0] if models else platform.processor()
        with open("/proc/meminfo") as meminfo:
            info["mem_total_mb"] = int(meminfo.readline().split()[1]) // 1024
    except OSError:
        info["cpu_model"] = platform.processor()
    try:
        info["load_avg_at_start"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    return info
