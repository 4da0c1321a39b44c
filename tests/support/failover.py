"""Faults of a multi-node Apache Kafka under running streams, and the ground truth they are
judged by (DESIGN §20, issue 32). Shared by tests/integration/test_cluster_faults.py and
bench/bench_failover.py.

* :class:`SteadyWriter`: an idempotent producer (``enable.idempotence``, ``acks=all``)
  writing a steady rate round-robin over the partitions; its delivery reports say what must
  be read (partition, offset, value of every acknowledged record), and :func:`log_records`,
  the topic read back with a plain consumer after the run, what may be.
* :class:`RecordedStream`: a stream in this process (``format("kwatermark")`` by default)
  whose every micro-batch is kept with the wall time it ran.
* ``tests/support/failover_child.py`` runs the same kind of stream under the baseline
  interpreter (Spark's own ``format("kafka")``, tests/support/sparkkafka.py):
  :class:`ChildStream` starts it in a thread and reads its batches as they come.
* The faults: :func:`rolling_restart`, :func:`kill_leader`, :func:`reassign`,
  :func:`elect_preferred`, :func:`move_leaders`.
* :func:`write_acked`: records written at once, the ground truth of a test that plans its
  own ranges.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import NewTopic

from kwatermark.kafkabroker import KafkaCluster, runtime_classpath
from kwatermark.retries import transient
from tests.support.streams import epoch_ms
from tests.support.transactions import plain_read

PARTITIONS = 6
REASSIGN = Path(__file__).with_name("Reassign.java")
CHILD = Path(__file__).with_name("failover_child.py")


def create_topic(cluster: KafkaCluster, partitions: int = PARTITIONS) -> str:
    """A topic as production runs them: replication 3, ``min.insync.replicas=2``."""
    topic = f"fo-{uuid.uuid4().hex[:10]}"
    admin = cluster.admin()
    replicas = min(3, len(cluster.nodes))
    new = NewTopic(topic, partitions, replicas,
                   config={"min.insync.replicas": str(min(2, replicas))})
    for attempt in range(1, 6):
        try:
            admin.create_topics([new])[topic].result(60)
            break
        except KafkaException as exc:
            # A cluster just started: the request went to the bootstrap address, which
            # librdkafka drops (_DESTROY_BROKER) once it knows the nodes themselves.
            error = exc.args[0]
            if attempt > 1 and error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                break
            if attempt == 5 or not transient(error):
                raise
            time.sleep(1)
    return topic


# --- the ground truth --------------------------------------------------------------------------

@dataclass
class SteadyWriter:
    """Writes ``rate`` records a second to ``topic``, record n to partition n % partitions,
    value ``b"n"``, until :meth:`stop`; ``acked`` holds (partition, offset, value) of every
    delivery report without error (offset None where the report has none), ``failed`` the
    errors of the others."""

    bootstrap: str
    topic: str
    rate: int = 200
    partitions: int = PARTITIONS
    acked: list[tuple[int, int, str]] = field(default_factory=list)
    ack_times: list[float] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    def __post_init__(self):
        self._stop = threading.Event()
        self._producer = Producer({"bootstrap.servers": self.bootstrap,
                                   "enable.idempotence": True, "acks": "all",
                                   "linger.ms": 5, "log_level": 0})
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _delivered(self, error, message) -> None:
        if error is not None:
            self.failed.append(str(error))
            return
        self.acked.append((message.partition(), message.offset(), message.value().decode()))
        self.ack_times.append(time.monotonic())

    def _run(self) -> None:
        n = 0
        started = time.monotonic()
        while not self._stop.is_set():
            due = started + n / self.rate
            wait = due - time.monotonic()
            if wait > 0:
                self._producer.poll(wait)
                continue
            self._producer.produce(self.topic, str(n).encode(), partition=n % self.partitions,
                                   on_delivery=self._delivered)
            self._producer.poll(0)
            n += 1

    def stop(self) -> None:
        """Stop writing and wait for every delivery report."""
        self._stop.set()
        self._thread.join(30)
        left = self._producer.flush(180)
        assert left == 0, f"{left} records without a delivery report after 180 s"
        assert not self.failed, self.failed[:5]

    def longest_ack_gap(self, since: float, until: float) -> float:
        """The longest time without a delivery report between ``since`` and ``until``
        (monotonic seconds): the cluster's own unavailability to the producer."""
        times = [since] + [t for t in self.ack_times if since < t < until] + [until]
        return max(b - a for a, b in itertools.pairwise(times))


# --- streams ------------------------------------------------------------------------------------

@dataclass
class Batch:
    batch_id: int
    at: float      # monotonic seconds when the sink got it (time.time() for a child's)
    rows: list[tuple[int, int, str]]
    watermarks: list[int | None] = field(default_factory=list)


class RecordedStream:
    """A stream of ``topic`` from the earliest offset with a 1 s trigger, every batch kept."""

    def __init__(self, spark, bootstrap: str, topic: str, checkpoint: str,
                 fmt: str = "kwatermark", trigger: str = "1 second", **options):
        self.batches: list[Batch] = []
        self._lock = threading.Lock()
        reader = (spark.readStream.format(fmt).option("kafka.bootstrap.servers", bootstrap)
                  .option("subscribe", topic).option("startingOffsets", "earliest"))
        for key, value in options.items():
            reader = reader.option(key, value)
        columns = ["partition", "offset", "value"] + (["watermark"] if fmt == "kwatermark"
                                                       else [])
        self.query = (reader.load().select(*columns).writeStream
                      .foreachBatch(self._collect).option("checkpointLocation", checkpoint)
                      .trigger(processingTime=trigger).start())

    def _collect(self, frame, batch_id: int) -> None:
        rows = frame.collect()
        batch = Batch(batch_id, time.monotonic(),
                      [(r["partition"], r["offset"], bytes(r["value"]).decode()) for r in rows],
                      [epoch_ms(r["watermark"]) for r in rows] if rows and
                      "watermark" in rows[0].asDict() else [])
        with self._lock:
            self.batches.append(batch)

    def rows(self) -> list[tuple[int, int, str]]:
        with self._lock:
            return [row for b in self.batches for row in b.rows]

    def wait_for(self, acked: list[tuple[int, int, str]], timeout_s: float = 120) -> None:
        """Until every acknowledged record was read, or the query failed (raises)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check()
            if not unread(self.rows(), acked):
                return
            time.sleep(0.5)
        missing = unread(self.rows(), acked)
        raise AssertionError(f"{len(missing)} acknowledged record(s) not read within "
                             f"{timeout_s:g} s, e.g. {missing[:5]}")

    def check(self) -> None:
        """Raise the query's exception if it failed."""
        if not self.query.isActive:
            raise AssertionError(f"the query stopped: {self.query.exception()}")

    def stop(self) -> None:
        self.query.stop()


class ChildStream:
    """Spark's own source (or any format) streaming in the baseline interpreter: the child
    appends each non-empty batch to a JSON-lines file and runs until :meth:`stop`."""

    def __init__(self, bootstrap: str, topic: str, workdir: Path, fmt: str = "kafka"):
        from tests.support.sparkkafka import run_baseline

        self.out = workdir / f"{fmt}-batches.jsonl"
        self.stop_file = workdir / f"{fmt}-stop"
        self.started = workdir / f"{fmt}-started"
        self.reply: dict | None = None
        self.error: BaseException | None = None
        request = {"bootstrap": bootstrap, "topic": topic, "fmt": fmt, "out": str(self.out),
                   "stop": str(self.stop_file), "started": str(self.started),
                   "checkpoint": str(workdir / f"{fmt}-checkpoint")}

        def run() -> None:
            try:
                self.reply = run_baseline(CHILD, request, timeout=1200,
                                          log_path=workdir / f"{fmt}-child.log")
            except BaseException as exc:  # noqa: BLE001 - reported by stop()/wait_started()
                self.error = exc

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def wait_started(self, timeout_s: float = 600) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.started.exists():
            if self.error is not None or not self._thread.is_alive():
                raise AssertionError(f"the baseline child ended before its stream started: "
                                     f"{self.error}")
            if time.monotonic() > deadline:
                raise AssertionError(f"the baseline stream did not start in {timeout_s:g} s")
            time.sleep(0.5)

    def batches(self) -> list[Batch]:
        if not self.out.exists():
            return []
        found = []
        for line in self.out.read_text().splitlines():
            if line.strip():
                item = json.loads(line)
                found.append(Batch(item["batch"], item["at"], [tuple(r) for r in item["rows"]]))
        return found

    def rows(self) -> list[tuple[int, int, str]]:
        return [row for b in self.batches() for row in b.rows]

    def wait_for(self, acked: list[tuple[int, int, str]], timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.error is not None or not self._thread.is_alive():
                raise AssertionError(f"the baseline child ended: {self.error or self.reply}")
            if not unread(self.rows(), acked):
                return
            time.sleep(0.5)
        raise AssertionError(f"{len(unread(self.rows(), acked))} acknowledged record(s) not "
                             f"read by the baseline within {timeout_s:g} s")

    def stop(self) -> dict:
        """Stop the child's query; its reply: ``{"error": None or the query's failure}``."""
        self.stop_file.write_text("stop")
        self._thread.join(120)
        if self.error is not None:
            raise self.error
        return self.reply or {}


# --- what must hold -------------------------------------------------------------------------

def _order(row: tuple) -> tuple:
    return row[0], -1 if row[1] is None else row[1], row[2]


def unread(rows: list[tuple[int, int, str]], acked: list[tuple[int, int | None, str]]
           ) -> list[tuple[int, int | None, str]]:
    """The acknowledged records no row holds, matched by partition and value (values are
    unique): a delivery report can carry no offset (librdkafka's idempotent producer after
    a leader change answers some retried batches as duplicates, offset unknown)."""
    read = {(p, v) for p, _, v in rows}
    return sorted((a for a in acked if (a[0], a[2]) not in read), key=_order)


def exactly_once(rows: list[tuple[int, int, str]], acked: list[tuple[int, int | None, str]],
                 log: list[tuple[int, int, str]] | None = None) -> tuple[list, list, list]:
    """(missing, duplicated, unexpected) rows: acknowledged records not read, log records
    read more than once, rows that are no record of the topic's log (``log``, read back by
    :func:`log_records`; without it, no acknowledged record). The log, not the delivery
    reports, says what exists: a producer retry after a leader change can leave a record
    in the log twice, once unacknowledged, and both are records a reader must return."""
    seen = Counter(rows)
    if log is None:
        unsure = {(p, v) for p, o, v in acked if o is None}
        truth = {a for a in acked if a[1] is not None}
        unexpected = [r for r in seen if r not in truth and (r[0], r[2]) not in unsure]
    else:
        truth = set(log)
        unexpected = [r for r in seen if r not in truth]
    return (unread(rows, acked), sorted(r for r, n in seen.items() if n > 1),
            sorted(unexpected, key=_order))


def log_records(cluster: KafkaCluster, topic: str, partitions: int = PARTITIONS
                ) -> list[tuple[int, int, str]]:
    """Every record of ``topic`` as (partition, offset, value), read to each partition's end
    by a plain confluent-kafka consumer (``transactions.plain_read``): the ground truth of
    what a stream can read."""
    return [(p, o, v.decode()) for p, o, _, v in plain_read(cluster, topic, partitions)]


def watermark_regressions(batches: list[Batch]) -> list[tuple[int, int, int]]:
    """(batch id, highest watermark before it, its lowest) wherever a batch's rows carry a
    watermark below one an earlier batch's rows carried (nulls only before any value)."""
    found = []
    highest: int | None = None
    for batch in sorted(batches, key=lambda b: b.batch_id):
        marks = batch.watermarks
        if not marks:
            continue
        if highest is not None and (None in marks or min(marks) < highest):
            lowest = min((m for m in marks if m is not None), default=-1)
            found.append((batch.batch_id, highest, lowest if None not in marks else -1))
        known = [m for m in marks if m is not None]
        if known:
            highest = max(highest or known[0], max(known))
    return found


def longest_gap(times: list[float], since: float, until: float) -> float:
    """The longest time between non-empty batches from ``since`` to ``until`` (the last
    batch before ``since`` opens the first gap)."""
    times = sorted(times)
    before = [t for t in times if t <= since]
    inside = [t for t in times if since < t <= until]
    points = ([before[-1]] if before else [since]) + inside
    if not inside:
        return until - points[0]
    return max(b - a for a, b in itertools.pairwise(points))


# --- the faults ---------------------------------------------------------------------------------

def rolling_restart(cluster: KafkaCluster) -> list[tuple[int, float, float]]:
    """Restart every node in turn as an upgrade does: SIGTERM, start again, wait until it is
    back in every ISR before the next. Returns (node, stopped at, in sync at) each."""
    done = []
    for node in cluster.nodes:
        stopped = time.monotonic()
        node.stop()
        node.restart()
        cluster.wait_in_sync(node.node_id)
        done.append((node.node_id, stopped, time.monotonic()))
    return done


def leader_of(cluster: KafkaCluster, topic: str, partition: int = 0) -> int:
    metadata = cluster.admin().list_topics(topic, timeout=10)
    return metadata.topics[topic].partitions[partition].leader


def leaders(cluster: KafkaCluster, topic: str) -> dict[int, int]:
    """Each partition's leader as the cluster's metadata says now (-1: none)."""
    metadata = cluster.admin().list_topics(topic, timeout=10)
    return {p: part.leader for p, part in metadata.topics[topic].partitions.items()}


def wait_for_leaders(cluster: KafkaCluster, topic: str, without: int,
                     timeout_s: float = 120.0) -> dict[int, int]:
    """Until every partition of ``topic`` has a leader other than node ``without`` (killed:
    the controller fences it once its session times out, ``broker.session.timeout.ms``,
    9 s); the leaders then."""
    deadline = time.monotonic() + timeout_s
    found: dict[int, int] = {}
    while time.monotonic() < deadline:
        try:
            found = leaders(cluster, topic)
        except KafkaException:
            found = {}
        if found and all(leader not in (without, -1) for leader in found.values()):
            return found
        time.sleep(0.25)
    raise AssertionError(f"partitions of {topic} still without a leader other than node "
                         f"{without} after {timeout_s:g} s: {found}")


def write_acked(bootstrap: str, topic: str, values: dict[int, list[str]]
                ) -> list[tuple[int, int, str]]:
    """Write each partition's ``values`` in order with an idempotent producer
    (``acks=all``) and wait for every delivery report: (partition, offset, value) of each,
    the ground truth of what a reader must return. A report with an error, or without an
    offset, fails: the caller writes while the cluster's leaders stand still."""
    acked: list[tuple[int, int, str]] = []
    failed: list[str] = []

    def delivered(error, message) -> None:
        if error is not None:
            failed.append(str(error))
        else:
            acked.append((message.partition(), message.offset(), message.value().decode()))

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "acks": "all", "linger.ms": 5, "log_level": 0})
    for partition, items in values.items():
        for value in items:
            producer.produce(topic, value.encode(), partition=partition,
                             on_delivery=delivered)
            producer.poll(0)
    left = producer.flush(120)
    assert left == 0 and not failed, f"{left} records without a report; errors {failed[:5]}"
    unknown = [a for a in acked if a[1] is None or a[1] < 0]
    assert not unknown, f"delivery reports without an offset: {unknown[:5]}"
    return acked


def elect_preferred(cluster: KafkaCluster, topic: str, expected: dict[int, int] | None = None,
                    timeout_s: float = 60.0) -> dict[int, int]:
    """Move every partition's leadership back to its preferred replica (the election Kafka
    runs itself every ``leader.imbalance.check.interval.seconds``, 5 minutes, once a node
    that was down is back) and wait until the metadata shows ``expected`` leaders (by
    default each partition's first replica); the leaders then."""
    from confluent_kafka import ElectionType, TopicPartition

    admin = cluster.admin()   # referenced until answered: a collected one fails with _DESTROY
    if expected is None:
        metadata = admin.list_topics(topic, timeout=10)
        expected = {p: part.replicas[0] for p, part in metadata.topics[topic].partitions.items()}
    partitions = [TopicPartition(topic, p) for p in expected]
    deadline = time.monotonic() + timeout_s
    found: dict[int, int] = {}
    while time.monotonic() < deadline:
        try:
            admin.elect_leaders(ElectionType.PREFERRED, partitions).result(30)
        except KafkaException:
            pass   # ELECTION_NOT_NEEDED for those already there; the leaders say
        found = leaders(cluster, topic)
        if found == expected:
            return found
        time.sleep(0.5)
    raise AssertionError(f"preferred leaders of {topic} not elected in {timeout_s:g} s: "
                         f"{found}, expected {expected}")


def move_leaders(cluster: KafkaCluster, topic: str, target: dict[int, int]) -> None:
    """Make node ``target[p]`` the leader of each partition ``p``, its replicas the same:
    every partition's replicas reordered with the target first (a reassignment that copies
    no data, through Reassign.java), then a preferred leader election."""
    metadata = cluster.admin().list_topics(topic, timeout=10)
    partitions = metadata.topics[topic].partitions
    _run_reassign(cluster, topic, {p: [node] + [r for r in partitions[p].replicas if r != node]
                                   for p, node in target.items()})
    elect_preferred(cluster, topic, {**{p: part.leader for p, part in partitions.items()},
                                     **target})


def kill_leader(cluster: KafkaCluster, topic: str, down_s: float = 10.0) -> int:
    """SIGKILL the leader of the topic's partition 0, start it again ``down_s`` later, wait
    until it is back in every ISR; returns its node id."""
    node = cluster.node(leader_of(cluster, topic))
    node.kill()
    time.sleep(down_s)
    node.restart()
    cluster.wait_in_sync(node.node_id)
    return node.node_id


def reassign(cluster: KafkaCluster, topic: str) -> None:
    """Move every partition's leader away by reassignment (Kafka's Admin API, through
    Reassign.java): drop each partition's leader from its replicas, wait, then add it back
    at the end (its data copied again)."""
    metadata = cluster.admin().list_topics(topic, timeout=10)
    partitions = metadata.topics[topic].partitions
    dropped = {p: [r for r in part.replicas if r != part.leader] for p, part in
               partitions.items()}
    restored = {p: dropped[p] + [partitions[p].leader] for p in partitions}
    for moves in (dropped, restored):
        _run_reassign(cluster, topic, moves)


def _run_reassign(cluster: KafkaCluster, topic: str, moves: dict[int, list[int]]) -> None:
    java = "java"
    args = [f"{p}={','.join(map(str, replicas))}" for p, replicas in sorted(moves.items())]
    done = subprocess.run([java, "-cp", runtime_classpath(), str(REASSIGN),
                           cluster.bootstrap_servers, topic, *args],
                          check=False, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "JAVA_TOOL_OPTIONS": "-XX:TieredStopAtLevel=1"})
    assert done.returncode == 0, done.stderr[-3000:]
