"""Soak run (issue 7): produce and consume continuously for minutes, with one lagging and one
idle partition, and check that nothing is lost or read twice, that the watermark never
decreases, never passes the lagging partition, is not held by the idle one, and that Spark's
Python workers keep a flat memory footprint.

    .venv/bin/python -m tests.soak.soak --minutes 10 [--bootstrap-servers HOST:PORT]

Without ``--bootstrap-servers`` the run starts its own Tansu broker
(``kwatermark.localbroker.LocalBroker``). ``tests/soak/test_soak.py`` runs a shortened form
in CI through the same ``run_soak`` and ``check``.

The scenario, one topic of three partitions:

* partition 0, *leading*: ``leading_rate`` records/s, event time = now;
* partition 1, *lagging*: ``lagging_rate`` records/s, event time = now - ``lag_s``; it holds
  the combined watermark;
* partition 2, *idle*: ``idle_records`` records at the start, ``idle_age_s`` old, then
  silence. Unless the idle policy excludes it, it pins the watermark near the start.

Every value starts with its sequence number in its partition; the topic is fresh and has one
producer, so a record's sequence number is its offset. A kwatermark streaming query
(processing-time trigger, ``watermark.strategy=bounded``, an idle policy) runs alongside;
its ``foreachBatch`` has Spark aggregate each micro-batch per partition (count, offsets,
sequence mismatches, watermark range and decreases in offset order, event-time range), a
``StreamingQueryListener`` records each batch's plan (batch-start watermark and idle
decisions, from the source's end offset), and a thread samples the RSS of the Python
processes Spark started (``/proc``, no psutil).
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, fields

from confluent_kafka import Producer
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient, OffsetSpec

from tests.support.kafka import TestBroker

LEADING, LAGGING, IDLE = 0, 1, 2
PARTITIONS = 3
NAMES = {LEADING: "leading", LAGGING: "lagging", IDLE: "idle"}
SEQ_DIGITS = 12
VALUE_SIZE = 100
NEVER = -(2**63)  # an undefined watermark: below every defined one
MB = 1024 * 1024

TASK_WORKER = "task worker"      # forked by `pyspark.daemon pyspark.worker`; runs read()
SOURCE_RUNNER = "source runner"  # python_streaming_source_runner: plans every batch
JVM = "jvm"
ROLES = (TASK_WORKER, SOURCE_RUNNER, JVM)


@dataclass(frozen=True)
class SoakConfig:
    """The scenario and the thresholds of one soak run. Rates are records per second."""

    duration_s: float = 600.0
    leading_rate: int = 2_000
    lagging_rate: int = 500
    lag_s: float = 30.0
    idle_records: int = 5
    idle_age_s: float = 60.0
    max_out_of_orderness_s: float = 5.0
    idle_policy: str = "caught-up"
    idle_timeout_s: float = 10.0
    trigger_s: float = 1.0
    sample_every_s: float = 1.0
    warmup_s: float | None = None  # None: a sixth of the run, between 15 s and 60 s
    # Per-process growth allowed from the first to the last third of the steady run. Seen
    # here: <= 5 MB in one-minute runs, and bench/README.md measured 3 MB over a 5M-record
    # range on a ~210 MB worker. 32 MB is ~6x that noise and ~18 % of a worker; over 10
    # minutes it catches a leak of ~40 bytes per record or ~30 KB per task.
    rss_growth_limit_mb: float = 32.0
    drain_timeout_s: float = 180.0

    @property
    def warmup(self) -> float:
        if self.warmup_s is not None:
            return self.warmup_s
        return min(60.0, max(15.0, self.duration_s / 6))

    @property
    def bound_ms(self) -> int:
        return round(self.max_out_of_orderness_s * 1000)


def now_ms() -> int:
    return int(time.time() * 1000)


# -- producing ----------------------------------------------------------------------------


class SoakProducer:
    """Produces the scenario from a background thread. Each delivery report is checked
    against the sequence number in the value (fresh topic, one producer: seq == offset)."""

    def __init__(self, bootstrap_servers: str, topic: str, config: SoakConfig):
        self.topic = topic
        self.config = config
        # One request in flight: a retried batch cannot land after its successor, so a
        # record's sequence number stays its offset (tests/support/kafka.TopicWriter).
        self.producer = Producer({"bootstrap.servers": bootstrap_servers, "linger.ms": 5,
                                  "acks": "all", "enable.idempotence": False,
                                  "max.in.flight.requests.per.connection": 1})
        self.sent = [0] * PARTITIONS
        self.delivered = [0] * PARTITIONS
        self.last_event_ms: list[int | None] = [None] * PARTITIONS
        self.lagging_before_tail_ms: int | None = None
        self.anomalies: list[str] = []
        self.error: BaseException | None = None
        self._padding = b"x" * (VALUE_SIZE - SEQ_DIGITS - 1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-producer", daemon=True)

    def start(self) -> None:
        # The idle partition speaks first, one record per batch: Tansu's end offset is the
        # last batch's base offset + 1 (DESIGN §8), so every one of them must be readable.
        oldest = now_ms() - round(self.config.idle_age_s * 1000)
        for i in range(self.config.idle_records):
            self._send(IDLE, oldest + i)
            self._flush()
        self._thread.start()

    def _run(self) -> None:
        paced = ((LEADING, self.config.leading_rate, 0),
                 (LAGGING, self.config.lagging_rate, round(self.config.lag_s * 1000)))
        began = time.monotonic()
        try:
            while not self._stop.is_set():
                elapsed = time.monotonic() - began
                for partition, rate, behind_ms in paced:
                    for _ in range(int(elapsed * rate) - self.sent[partition]):
                        self._send(partition, now_ms() - behind_ms)
                self.producer.poll(0)
                self._stop.wait(0.02)
        except BaseException as exc:
            self.error = exc  # reported by finish()
            raise

    def halt(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def finish(self) -> list[int]:
        """Stop, then end each active partition with a single-record batch so that the
        broker's end offset covers everything produced; returns records per partition."""
        self.halt()
        if self.error is not None:
            self.anomalies.append(f"producer thread failed: {self.error!r}")
        self._flush()
        self.lagging_before_tail_ms = self.last_event_ms[LAGGING]
        self._send(LEADING, now_ms())
        self._send(LAGGING, now_ms() - round(self.config.lag_s * 1000))
        self._flush()  # batches are per partition: one flush leaves one record in each
        for p in range(PARTITIONS):
            if self.delivered[p] != self.sent[p]:
                self.anomalies.append(f"partition {p}: {self.sent[p]} records produced, "
                                      f"{self.delivered[p]} acknowledged")
        return list(self.sent)

    def _flush(self) -> None:
        left = self.producer.flush(60)
        if left:
            self.anomalies.append(f"{left} records still unsent after a 60 s flush")

    def _send(self, partition: int, event_ms: int) -> None:
        previous = self.last_event_ms[partition]
        event_ms = event_ms if previous is None else max(event_ms, previous)
        value = b"%0*d|" % (SEQ_DIGITS, self.sent[partition]) + self._padding
        while True:
            try:
                self.producer.produce(self.topic, value=value, partition=partition,
                                      timestamp=event_ms, on_delivery=self._delivered)
                break
            except BufferError:
                self.producer.poll(0.05)
        self.sent[partition] += 1
        self.last_event_ms[partition] = event_ms

    def _delivered(self, error, message) -> None:
        if error is not None:
            self._anomaly(f"partition {message.partition()}: delivery failed: {error}")
            return
        seq = int(message.value()[:SEQ_DIGITS])
        if message.offset() != seq:
            self._anomaly(f"partition {message.partition()}: record {seq} was written at "
                          f"offset {message.offset()} (a retried duplicate?)")
        self.delivered[message.partition()] += 1

    def _anomaly(self, text: str) -> None:
        if len(self.anomalies) < 20:
            self.anomalies.append(text)


def create_topic(bootstrap_servers: str) -> str:
    return TestBroker(bootstrap_servers, "external").create_topic(
        PARTITIONS, f"soak-{uuid.uuid4().hex[:10]}")


def end_offsets(bootstrap_servers: str, topic: str) -> dict[int, int]:
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    futures = admin.list_offsets({KafkaTP(topic, p): OffsetSpec.latest()
                                  for p in range(PARTITIONS)}, request_timeout=30)
    return {tp.partition: future.result().offset for tp, future in futures.items()}


# -- what each micro-batch read ---------------------------------------------------------


@dataclass(frozen=True)
class PartitionSlice:
    """One partition's rows in one micro-batch, aggregated by Spark. Times in epoch ms."""

    rows: int
    distinct_offsets: int
    min_offset: int
    max_offset: int
    seq_mismatches: int     # rows whose sequence number (in the value) is not their offset
    null_watermarks: int
    min_watermark: int | None
    max_watermark: int | None
    decreases: int          # rows whose watermark is below the previous row's, offset order
    min_event: int | None
    max_event: int | None


@dataclass(frozen=True)
class BatchRecord:
    batch_id: int
    at_s: float           # when foreachBatch was called, seconds since the run started
    wall_ms: int          # the same moment, epoch ms
    seconds: float        # spent in foreachBatch, the read included
    slices: dict[int, PartitionSlice]

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.slices.values())

    @property
    def min_watermark(self) -> int:
        """Lowest row watermark, NEVER if any row's is null."""
        if any(s.null_watermarks for s in self.slices.values()):
            return NEVER
        return min(s.min_watermark for s in self.slices.values())

    @property
    def max_watermark(self) -> int | None:
        marks = [s.max_watermark for s in self.slices.values() if s.max_watermark is not None]
        return max(marks) if marks else None


def summarise_batch(frame) -> dict[int, PartitionSlice]:
    """One Spark job per micro-batch (a second action would read the batch again)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    def count_if(condition):
        return F.sum(F.when(condition, 1).otherwise(0))

    seq = F.substring(F.col("value").cast("string"), 1, SEQ_DIGITS).cast("long")
    rows = (frame.select("partition", "offset", seq.alias("seq"),
                         F.unix_millis("watermark").alias("wm"),
                         F.unix_millis("event_time").alias("ev"))
            .withColumn("previous", F.lag("wm").over(
                Window.partitionBy("partition").orderBy("offset"))))
    wm, previous = F.col("wm"), F.col("previous")
    went_back = (wm < previous) | (wm.isNull() & previous.isNotNull())
    summary = rows.groupBy("partition").agg(
        F.count(F.lit(1)).alias("rows"),
        F.count_distinct("offset").alias("distinct_offsets"),
        F.min("offset").alias("min_offset"),
        F.max("offset").alias("max_offset"),
        count_if(~F.col("seq").eqNullSafe(F.col("offset"))).alias("seq_mismatches"),
        count_if(wm.isNull()).alias("null_watermarks"),
        F.min("wm").alias("min_watermark"),
        F.max("wm").alias("max_watermark"),
        count_if(went_back).alias("decreases"),
        F.min("ev").alias("min_event"),
        F.max("ev").alias("max_event"))
    names = [f.name for f in fields(PartitionSlice)]
    return {row["partition"]: PartitionSlice(**{n: row[n] for n in names})
            for row in summary.collect()}


class BatchLog:
    """The ``foreachBatch`` sink: a ``BatchRecord`` per micro-batch."""

    def __init__(self, clock_start: float):
        self.clock_start = clock_start
        self.by_id: dict[int, BatchRecord] = {}
        self.replays = 0
        self._next_offset = [0] * PARTITIONS
        self._lock = threading.Lock()

    def collect(self, frame, batch_id: int) -> None:
        began, wall_ms = time.monotonic(), now_ms()
        slices = summarise_batch(frame)
        record = BatchRecord(batch_id, began - self.clock_start, wall_ms,
                             time.monotonic() - began, slices)
        with self._lock:
            self.replays += batch_id in self.by_id
            self.by_id[batch_id] = record
            for p, s in slices.items():
                self._next_offset[p] = max(self._next_offset[p], s.max_offset + 1)

    def read_up_to(self) -> list[int]:
        """Per partition, one past the highest offset read so far."""
        with self._lock:
            return list(self._next_offset)

    def batches(self) -> list[BatchRecord]:
        with self._lock:
            return [self.by_id[i] for i in sorted(self.by_id)]


# -- what each micro-batch planned ------------------------------------------------------


@dataclass(frozen=True)
class PartitionPlan:
    start: int
    end: int
    idle: str               # "count", "exclude" or "advance"
    advanced: int | None    # floor from an "advance" decision


@dataclass(frozen=True)
class BatchPlan:
    watermark: int | None   # the combined watermark at the batch start
    partitions: dict[int, PartitionPlan]

    @classmethod
    def parse(cls, end_offset: str) -> BatchPlan:
        from kwatermark.offsets import BatchOffset

        offset = BatchOffset.from_json(end_offset)
        partitions = {p: PartitionPlan(r.start, r.end, r.state.idle, r.state.advanced_ms)
                      for (_, p), r in offset.partitions.items()}
        return cls(offset.watermark, partitions)


def plan_log():
    """A ``StreamingQueryListener`` that keeps each batch's plan, keyed by (query id, batch
    id); made on demand so importing this module does not import Spark."""
    from pyspark.sql.streaming import StreamingQueryListener

    class PlanLog(StreamingQueryListener):
        def __init__(self):
            super().__init__()
            self.plans: dict[tuple[str, int], BatchPlan] = {}
            self.lock = threading.Lock()

        def onQueryStarted(self, event) -> None:
            pass

        def onQueryProgress(self, event) -> None:
            progress = event.progress
            if not progress.sources or progress.sources[0].endOffset is None:
                return
            plan = BatchPlan.parse(progress.sources[0].endOffset)
            with self.lock:
                self.plans.setdefault((str(progress.id), progress.batchId), plan)

        def onQueryIdle(self, event) -> None:
            pass

        def onQueryTerminated(self, event) -> None:
            pass

        def of(self, query_id: str) -> dict[int, BatchPlan]:
            with self.lock:
                return {b: plan for (q, b), plan in self.plans.items() if q == query_id}

    return PlanLog()


# -- memory ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RssSample:
    at_s: float
    role: str
    pid: int
    rss_bytes: int


def _proc_status(pid: int) -> tuple[int, int] | None:
    """(parent pid, VmRSS bytes) of a live process; None when it is gone or has no RSS."""
    try:
        with open(f"/proc/{pid}/status") as status:
            lines = status.read().splitlines()
    except OSError:
        return None
    parent, rss = None, None
    for line in lines:
        if line.startswith("PPid:"):
            parent = int(line.split()[1])
        elif line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024  # kB
    return None if parent is None or rss is None else (parent, rss)


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().decode(errors="replace").split("\0")
    except OSError:
        return []


def spark_processes(root_pid: int) -> list[tuple[str, int, int]]:
    """(role, pid, RSS bytes) of the JVM and the Python processes Spark started under
    ``root_pid``. Descendants only: other Spark sessions on the machine do not count."""
    parents = {}
    rss = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            found = _proc_status(int(entry))
            if found is not None:
                parents[int(entry)], rss[int(entry)] = found
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    found, stack = [], list(children.get(root_pid, []))
    while stack:
        pid = stack.pop()
        stack.extend(children.get(pid, []))
        argv = _cmdline(pid)
        if "pyspark.daemon" in argv and "pyspark.worker" in argv:
            # The daemon forks one worker per concurrent task; the workers are its children.
            if "pyspark.daemon" in _cmdline(parents[pid]):
                found.append((TASK_WORKER, pid, rss[pid]))
        elif any(a.endswith("python_streaming_source_runner") for a in argv):
            found.append((SOURCE_RUNNER, pid, rss[pid]))
        elif argv and os.path.basename(argv[0]) == "java":
            found.append((JVM, pid, rss[pid]))
    return found


class RssSampler:
    """Samples ``spark_processes`` every ``every_s`` seconds from a background thread."""

    def __init__(self, clock_start: float, every_s: float, root_pid: int | None = None):
        self.clock_start = clock_start
        self.every_s = every_s
        self.root_pid = root_pid or os.getpid()
        self.samples: list[RssSample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-rss", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            at = time.monotonic() - self.clock_start
            self.samples.extend(RssSample(at, role, pid, rss)
                                for role, pid, rss in spark_processes(self.root_pid))
            self._stop.wait(self.every_s)


@dataclass(frozen=True)
class RssTrend:
    """One role's RSS over the steady part of the run, split in thirds."""

    role: str
    processes: int                   # distinct pids seen
    series: list[tuple[float, int]]  # (at_s, RSS of the role's largest process)
    first_third_max: int             # largest process's peak in the first third
    last_third_max: int              # ... in the last third
    growth: int | None               # the most any one process grew, first -> last third
    lived_through: int               # processes sampled in both thirds

    @property
    def peak(self) -> int:
        return max(rss for _, rss in self.series)


def rss_trend(samples: list[RssSample], role: str, begin_s: float, end_s: float
              ) -> RssTrend | None:
    """Thirds of [begin_s, end_s]; None when the role has no sample there.

    Growth is measured per process (peak in the last third - peak in the first third): a
    larger worker left idle by an earlier query in the same session cannot hide a growing
    one, and a worker forked mid-run does not count as growth."""
    third = (end_s - begin_s) / 3
    largest: dict[float, int] = {}
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for s in samples:
        if s.role != role or not begin_s <= s.at_s <= end_s:
            continue
        largest[s.at_s] = max(largest.get(s.at_s, 0), s.rss_bytes)
        if s.at_s < begin_s + third:
            first[s.pid] = max(first.get(s.pid, 0), s.rss_bytes)
        if s.at_s >= end_s - third:
            last[s.pid] = max(last.get(s.pid, 0), s.rss_bytes)
    if not first or not last:
        return None
    both = set(first) & set(last)
    pids = {s.pid for s in samples if s.role == role and begin_s <= s.at_s <= end_s}
    return RssTrend(role, len(pids), sorted(largest.items()), max(first.values()),
                    max(last.values()), max((last[p] - first[p] for p in both), default=None),
                    len(both))


# -- the run ----------------------------------------------------------------------------


@dataclass
class SoakReport:
    config: SoakConfig
    topic: str
    produced: list[int]
    end_offsets: dict[int, int]
    read_up_to: list[int]
    producer_anomalies: list[str]
    lagging_before_tail_ms: int | None
    batches: list[BatchRecord]
    plans: dict[int, BatchPlan]
    samples: list[RssSample]
    replays: int
    query_started_s: float
    produce_s: float              # seconds from the start of production to its stop
    drained_s: float | None       # seconds after the stop until everything was read
    wall_s: float
    query_error: str | None = None

    def rss_trend(self, role: str) -> RssTrend | None:
        return rss_trend(self.samples, role, self.config.warmup, self.produce_s)

    def summary(self) -> str:
        return "\n".join(_summary_lines(self))


def run_soak(spark, bootstrap_servers: str, duration_s: float, **settings) -> SoakReport:
    """Produce the scenario for ``duration_s`` while a kwatermark query reads it, wait until
    the query has read everything produced, stop, and report. ``settings`` override
    ``SoakConfig`` fields. Raises nothing for a failed query: see ``check``."""
    config = SoakConfig(duration_s=duration_s, **settings)
    topic = create_topic(bootstrap_servers)
    work = tempfile.mkdtemp(prefix="kwatermark-soak-")
    clock = time.monotonic()
    plans = plan_log()
    spark.streams.addListener(plans)
    log = BatchLog(clock)
    sampler = RssSampler(clock, config.sample_every_s)
    producer = SoakProducer(bootstrap_servers, topic, config)
    query = None
    try:
        sampler.start()
        producer.start()
        query = (_stream(spark, bootstrap_servers, topic, config, work)
                 .writeStream.foreachBatch(log.collect)
                 .option("checkpointLocation", os.path.join(work, "checkpoint"))
                 .trigger(processingTime=f"{round(config.trigger_s * 1000)} milliseconds")
                 .start())
        query_started_s = time.monotonic() - clock
        while time.monotonic() - clock < duration_s and query.isActive:
            time.sleep(0.5)
        produced = producer.finish()
        produce_s = time.monotonic() - clock
        ends = end_offsets(bootstrap_servers, topic)
        drained_s = _drain(query, log, [ends[p] for p in range(PARTITIONS)],
                           config.drain_timeout_s, clock, produce_s)
        _await_plans(query, plans, log, timeout_s=15)
    finally:
        producer.halt()
        if query is not None:
            query.stop()
        sampler.stop()
        spark.streams.removeListener(plans)
        shutil.rmtree(work, ignore_errors=True)
    error = query.exception()
    return SoakReport(
        config=config, topic=topic, produced=produced, end_offsets=ends,
        read_up_to=log.read_up_to(), producer_anomalies=producer.anomalies,
        lagging_before_tail_ms=producer.lagging_before_tail_ms, batches=log.batches(),
        plans=plans.of(str(query.id)), samples=sampler.samples, replays=log.replays,
        query_started_s=query_started_s, produce_s=produce_s, drained_s=drained_s,
        wall_s=time.monotonic() - clock,
        query_error=None if error is None else str(error)[:2000])


def _stream(spark, bootstrap_servers: str, topic: str, config: SoakConfig, work: str):
    return (spark.readStream.format("kwatermark")
            .option("kafka.bootstrap.servers", bootstrap_servers)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("watermark.strategy", "bounded")
            .option("watermark.maxOutOfOrderness", f"{config.bound_ms} milliseconds")
            .option("idle.policy", config.idle_policy)
            .option("idle.timeout", f"{round(config.idle_timeout_s * 1000)} milliseconds")
            .option("watermark.stateLocation", os.path.join(work, "ledger"))
            .load())


def _drain(query, log: BatchLog, ends: list[int], timeout_s: float, clock: float,
           produce_s: float) -> float | None:
    """Seconds after the producer stopped until every partition was read to its end offset;
    None if the query failed or did not get there within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and query.isActive:
        if all(read >= end for read, end in zip(log.read_up_to(), ends)):
            return time.monotonic() - clock - produce_s
        time.sleep(0.2)
    return None


def _await_plans(query, plans, log: BatchLog, timeout_s: float) -> None:
    """Progress events (hence plans) arrive after each batch's foreachBatch returns."""
    deadline = time.monotonic() + timeout_s
    wanted = {b.batch_id for b in log.batches()}
    while time.monotonic() < deadline and query.isActive:
        if wanted <= set(plans.of(str(query.id))):
            return
        time.sleep(0.2)


# -- the checks ---------------------------------------------------------------------------


def check(report: SoakReport) -> list[str]:
    """Every failed expectation of a soak run, as a sentence; empty when it passed."""
    return (_check_run(report) + _check_exactly_once(report) + _check_monotonic(report)
            + _check_true_minimum(report) + _check_released(report) + _check_memory(report))


def _check_run(report: SoakReport) -> list[str]:
    failures = []
    if report.query_error:
        failures.append(f"the query failed: {report.query_error}")
    failures += [f"producer: {a}" for a in report.producer_anomalies]
    for p in range(PARTITIONS):
        if report.end_offsets.get(p) != report.produced[p]:
            failures.append(f"partition {p}: the broker's end offset is "
                            f"{report.end_offsets.get(p)} after {report.produced[p]} records "
                            f"were produced (Tansu's last-batch quirk, DESIGN §8?)")
    if report.drained_s is None:
        failures.append(f"the query had not read everything {report.config.drain_timeout_s:.0f} "
                        f"s after production stopped: read up to {report.read_up_to}, end "
                        f"offsets {report.end_offsets}")
    ids = [b.batch_id for b in report.batches]
    if ids != list(range(len(ids))):
        failures.append(f"foreachBatch saw batch ids {ids[:10]}..., not 0, 1, 2, ...")
    if report.replays:
        failures.append(f"{report.replays} batches were delivered to foreachBatch twice")
    missing = sorted(set(ids) - set(report.plans))
    if missing:
        failures.append(f"no progress event (plan) for batches {missing[:10]}; the "
                        f"watermark-bound and idle checks need every batch's plan")
    return failures


def _check_exactly_once(report: SoakReport) -> list[str]:
    """Per partition, the batches' offsets tile [0, end) with no gap and no repeat, every
    row's sequence number is its offset, and each batch read exactly its planned range."""
    failures = []
    for p in range(PARTITIONS):
        expected = 0
        for b in report.batches:
            s = b.slices.get(p)
            plan = report.plans.get(b.batch_id)
            planned = plan.partitions.get(p) if plan else None
            if planned is not None and (planned.end - planned.start) != (s.rows if s else 0):
                failures.append(f"batch {b.batch_id} partition {p}: planned "
                                f"[{planned.start}, {planned.end}) but read "
                                f"{s.rows if s else 0} rows")
            if s is None:
                continue
            if s.rows != s.distinct_offsets:
                failures.append(f"batch {b.batch_id} partition {p}: "
                                f"{s.rows - s.distinct_offsets} offsets read twice")
            if s.max_offset - s.min_offset + 1 != s.distinct_offsets:
                failures.append(f"batch {b.batch_id} partition {p}: gaps inside "
                                f"[{s.min_offset}, {s.max_offset}]")
            if s.min_offset != expected:
                what = "lost" if s.min_offset > expected else "read again"
                failures.append(f"batch {b.batch_id} partition {p}: starts at offset "
                                f"{s.min_offset}, expected {expected} (records {what})")
            if s.seq_mismatches:
                failures.append(f"batch {b.batch_id} partition {p}: {s.seq_mismatches} rows "
                                f"whose sequence number is not their offset")
            expected = s.max_offset + 1
        if expected != report.produced[p]:
            failures.append(f"partition {p} ({NAMES[p]}): read offsets [0, {expected}) of "
                            f"{report.produced[p]} produced")
    return failures[:20]


def _check_monotonic(report: SoakReport) -> list[str]:
    """Within a batch, each partition's rows in offset order; across batches, every row of
    batch N+1 at or above every row before it (null = undefined, lowest)."""
    failures = []
    highest = NEVER
    for b in report.batches:
        for p, s in sorted(b.slices.items()):
            if s.decreases:
                failures.append(f"batch {b.batch_id} partition {p}: the watermark decreases "
                                f"{s.decreases} times in offset order")
        if b.min_watermark < highest:
            failures.append(f"batch {b.batch_id}: a row's watermark "
                            f"{_ms(b.min_watermark)} is below {_ms(highest)}, emitted earlier")
        mark = b.max_watermark
        highest = max(highest, NEVER if mark is None else mark)
    return failures[:20]


def _check_true_minimum(report: SoakReport) -> list[str]:
    """The watermark is never above the minimum, over the partitions the batch's plan
    counts, of (highest event time read so far - bound - 1) (DESIGN §4 invariant). With a
    lagging partition counted, this is what keeps its records from being late.

    Batch N's plan starts at W_N = max(W_{N-1}, highest row watermark of N-1, the counted
    partitions' minimum after N-1), and its rows may not exceed max(W_N, the counted
    partitions' minimum including N's own rows)."""
    bound = report.config.bound_ms
    failures = []
    highest_event: dict[int, int] = {}
    previous_start, previous_rows = NEVER, NEVER
    for b in report.batches:
        plan = report.plans.get(b.batch_id)
        if plan is None:
            continue  # reported by _check_run
        before = _counted_minimum(plan, highest_event, bound)
        allowed_start = max(previous_start, previous_rows, NEVER if before is None else before)
        start = NEVER if plan.watermark is None else plan.watermark
        if start > allowed_start:
            failures.append(f"batch {b.batch_id}: planned watermark {_ms(start)} is above "
                            f"{_ms(allowed_start)}, the most the partitions read allow")
        for p, s in b.slices.items():
            if s.max_event is not None:
                highest_event[p] = max(highest_event.get(p, NEVER), s.max_event)
        after = _counted_minimum(plan, highest_event, bound)
        allowed_rows = max(start, NEVER if after is None else after)
        mark = b.max_watermark
        if mark is not None and mark > allowed_rows:
            failures.append(f"batch {b.batch_id}: a row's watermark {_ms(mark)} is above "
                            f"{_ms(allowed_rows)}, the counted partitions' minimum")
        previous_start, previous_rows = start, NEVER if mark is None else mark
    return failures[:20]


def _counted_minimum(plan: BatchPlan, highest_event: dict[int, int], bound: int) -> int | None:
    """min over the partitions ``plan`` counts of their watermark given the highest event
    times read (``bounded``: highest - bound - 1, floored by an advance); None when no
    partition counts."""
    marks = []
    for p, planned in plan.partitions.items():
        if planned.idle == "exclude":
            continue
        own = highest_event[p] - bound - 1 if p in highest_event else NEVER
        marks.append(max(own, NEVER if planned.advanced is None else planned.advanced))
    return min(marks) if marks else None


def _check_released(report: SoakReport) -> list[str]:
    """The idle policy excluded the idle partition and never the lagging one, and the
    watermark followed the lagging partition to the end: its last row's watermark is that partition's (highest event time
    before the tail record - bound - 1); had the idle partition held it, it would have
    stayed ``idle_age_s`` before the start."""
    failures = []
    excluded = [b for b, plan in sorted(report.plans.items())
                if plan.partitions.get(IDLE) and plan.partitions[IDLE].idle == "exclude"]
    if not excluded:
        failures.append(f"the idle partition was never excluded (idle.policy="
                        f"{report.config.idle_policy}, idle.timeout="
                        f"{report.config.idle_timeout_s} s)")
    lagging_excluded = [b for b, plan in sorted(report.plans.items())
                        if plan.partitions.get(LAGGING)
                        and plan.partitions[LAGGING].idle != "count"]
    if lagging_excluded:
        failures.append(f"the lagging partition, read in every batch, was not counted in "
                        f"batches {lagging_excluded[:10]}")
    marked = [b for b in report.batches if b.max_watermark is not None]
    if not marked:
        return failures + ["the watermark was never defined"]
    first, final = marked[0].max_watermark, max(b.max_watermark for b in marked)
    target = report.lagging_before_tail_ms
    if target is not None and final < target - report.config.bound_ms - 1:
        failures.append(f"the final watermark {_ms(final)} is "
                        f"{(target - report.config.bound_ms - 1 - final) / 1000:.1f} s behind "
                        f"the lagging partition's ({_ms(target - report.config.bound_ms - 1)}): "
                        f"held back by the idle partition?")
    # Judged from the first batch with a watermark, not from the start of production: on a
    # busy machine Spark's start and the first batch's catch-up take half the minute.
    span_s = marked[-1].at_s - marked[0].at_s
    if final - first < span_s * 1000 / 2:
        failures.append(f"the watermark advanced {(final - first) / 1000:.1f} s in the "
                        f"{span_s:.1f} s between the first batch with a watermark and the "
                        f"last, less than half")
    return failures


def _check_memory(report: SoakReport) -> list[str]:
    """Spark's Python task workers (they run ``read()``) and the source runner (it plans
    every batch) must not grow: no such process's peak RSS in the last third of the steady
    run exceeds its peak in the first third (after warm-up) by ``rss_growth_limit_mb``."""
    failures = []
    limit = report.config.rss_growth_limit_mb
    for role in (TASK_WORKER, SOURCE_RUNNER):
        trend = report.rss_trend(role)
        if trend is None or trend.growth is None:
            failures.append(f"no {role} process was sampled in both the first and the last "
                            f"third of the run (were they found under this process?)")
        elif trend.growth > limit * MB:
            failures.append(f"a {role} process's RSS grew {trend.growth / MB:.1f} MB from the "
                            f"first to the last third of the run, above the {limit:.0f} MB "
                            f"limit")
    return failures


# -- printing ----------------------------------------------------------------------------


def _ms(value: int | None) -> str:
    if value is None or value == NEVER:
        return "null"
    return time.strftime("%H:%M:%S", time.gmtime(value / 1000)) + f".{value % 1000:03d}Z"


def _stats(values: list[float], unit: str = "", scale: float = 1.0) -> str:
    if not values:
        return "n/a"
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
    return (f"min {ordered[0] / scale:.1f}{unit}, median {statistics.median(ordered) / scale:.1f}"
            f"{unit}, p95 {p95 / scale:.1f}{unit}, max {ordered[-1] / scale:.1f}{unit}")


def _summary_lines(r: SoakReport) -> list[str]:
    c = r.config
    steady = [b for b in r.batches if c.warmup <= b.at_s <= r.produce_s]
    total = sum(r.produced)
    read = sum(b.rows for b in r.batches)
    lines = [
        (f"soak: topic {r.topic}, {PARTITIONS} partitions; production {r.produce_s:.0f} s, "
         f"wall {r.wall_s:.0f} s (query started at +{r.query_started_s:.1f} s, warm-up "
         f"{c.warmup:.0f} s)"),
        (f"scenario: leading p0 {c.leading_rate}/s at now; lagging p1 {c.lagging_rate}/s at "
         f"now - {c.lag_s:.0f} s; idle p2 {c.idle_records} records {c.idle_age_s:.0f} s old; "
         f"bounded {c.max_out_of_orderness_s:g} s; idle.policy={c.idle_policy} "
         f"({c.idle_timeout_s:g} s); trigger {c.trigger_s:g} s"),
        "produced: " + ", ".join(f"p{p} {n:,}" for p, n in enumerate(r.produced))
        + f" = {total:,} ({total / r.produce_s:,.0f} records/s); end offsets "
        + ", ".join(f"p{p} {r.end_offsets.get(p)}" for p in range(PARTITIONS)),
        f"read: {read:,} rows in {len(r.batches)} batches "
        f"({read / max(r.produce_s, 1e-9):,.0f} rows/s over the production time); drained "
        + (f"{r.drained_s:.1f} s after production stopped" if r.drained_s is not None
           else "NOT within the timeout"),
        f"rows per batch (steady): {_stats([b.rows for b in steady])}",
        f"foreachBatch seconds (steady): {_stats([b.seconds for b in steady], ' s')}",
    ]
    intervals = [later.at_s - earlier.at_s for earlier, later in itertools.pairwise(steady)]
    lines.append(f"batch interval (steady): {_stats(intervals, ' s')}")
    defined = [b for b in r.batches if b.max_watermark is not None]
    if defined:
        lag = [b.wall_ms - b.max_watermark for b in steady if b.max_watermark is not None]
        lines.append(f"watermark: first defined in batch {defined[0].batch_id} "
                     f"(+{defined[0].at_s:.1f} s), final {_ms(defined[-1].max_watermark)}; "
                     f"wall clock - watermark (steady): {_stats(lag, ' s', 1000)} "
                     f"(the lagging partition's {c.lag_s:g} s + bound {c.max_out_of_orderness_s:g}"
                     f" s + read delay)")
    else:
        lines.append("watermark: never defined")
    for p in range(PARTITIONS):
        decisions = [plan.partitions[p].idle for _, plan in sorted(r.plans.items())
                     if p in plan.partitions]
        first_excluded = next((b for b, plan in sorted(r.plans.items())
                               if p in plan.partitions
                               and plan.partitions[p].idle == "exclude"), None)
        counts = {d: decisions.count(d) for d in sorted(set(decisions))}
        where = ""
        if first_excluded is not None and first_excluded in {b.batch_id for b in r.batches}:
            at = next(b.at_s for b in r.batches if b.batch_id == first_excluded)
            where = f"; first excluded in batch {first_excluded} (+{at:.1f} s)"
        lines.append(f"p{p} ({NAMES[p]}) idle decisions over {len(decisions)} plans: "
                     f"{counts}{where}")
    for role in ROLES:
        trend = r.rss_trend(role)
        if trend is None:
            lines.append(f"RSS {role}: no samples")
            continue
        growth = "n/a" if trend.growth is None else f"{trend.growth / MB:+.1f} MB"
        lines.append(f"RSS {role} ({trend.processes} pids, {trend.lived_through} through the "
                     f"run): largest process's peak {trend.first_third_max / MB:.1f} MB in the "
                     f"first third, {trend.last_third_max / MB:.1f} MB in the last; growth of "
                     f"one process {growth}; overall peak {trend.peak / MB:.1f} MB")
        lines.append(f"  series (peak per {_bucket(r):.0f} s, MB): "
                     + " ".join(f"{m / MB:.0f}" for m in _buckets(trend, _bucket(r))))
    return lines


def _bucket(r: SoakReport) -> float:
    return max(5.0, (r.produce_s - r.config.warmup) / 10)


def _buckets(trend: RssTrend, width: float) -> list[int]:
    start = trend.series[0][0]
    peaks: dict[int, int] = {}
    for at, rss in trend.series:
        index = int((at - start) // width)
        peaks[index] = max(peaks.get(index, 0), rss)
    return [peaks[i] for i in sorted(peaks)]


# -- command line ------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Soak run (issue 7): a kwatermark query over a topic produced "
                    "continuously, with a lagging and an idle partition.")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--bootstrap-servers", help="an existing Kafka; default: start Tansu")
    parser.add_argument("--leading-rate", type=int, default=SoakConfig.leading_rate)
    parser.add_argument("--lagging-rate", type=int, default=SoakConfig.lagging_rate)
    parser.add_argument("--lag-seconds", type=float, default=SoakConfig.lag_s)
    parser.add_argument("--idle-policy", default=SoakConfig.idle_policy)
    parser.add_argument("--idle-timeout-seconds", type=float, default=SoakConfig.idle_timeout_s)
    parser.add_argument("--rss-growth-limit-mb", type=float,
                        default=SoakConfig.rss_growth_limit_mb)
    args = parser.parse_args(argv)
    # Spark's Python workers must run this interpreter (kwatermark installed).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    local = None
    bootstrap_servers = args.bootstrap_servers
    if not bootstrap_servers:
        from kwatermark.localbroker import LocalBroker

        local = LocalBroker.start()
        bootstrap_servers = local.bootstrap_servers
    spark = (SparkSession.builder.master("local[2]").appName("kwatermark-soak")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.session.timeZone", "UTC")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        report = run_soak(
            spark, bootstrap_servers, args.minutes * 60, leading_rate=args.leading_rate,
            lagging_rate=args.lagging_rate, lag_s=args.lag_seconds,
            idle_policy=args.idle_policy, idle_timeout_s=args.idle_timeout_seconds,
            rss_growth_limit_mb=args.rss_growth_limit_mb)
    finally:
        spark.stop()
        if local is not None:
            local.stop()
    print(report.summary())
    failures = check(report)
    for failure in failures:
        print(f"FAIL: {failure}")
    print("soak: " + ("FAILED" if failures else "PASSED")
          + f" ({len(failures)} failed expectations)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
