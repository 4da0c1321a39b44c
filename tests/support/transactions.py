"""Writing topics the way exactly-once producers do (DESIGN §14), and reading them back with a
plain confluent-kafka consumer: the ground truth the transaction tests compare against.

Every record's offset comes from the producer's delivery report and whether it was committed
from what the test did, never from kwatermark.

>>> writer = TransactionalWriter(broker, topic)               # doctest: +SKIP
>>> writer.commit([Record(0, 1_000), Record(1, 1_000)])      # one transaction, 2 records
>>> writer.abort([Record(0, 2_000)])
>>> writer.begin([Record(0, 3_000)]); ...; writer.finish(commit=True)
>>> writer.committed   # what read_committed must return
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import OffsetSpec

from tests.support.kafka import Record, TestBroker

# Spark's Kafka source and kwatermark both take this long to give up on a read that makes no
# progress. The transaction tests set it and finish far below it: a read that waited it out
# (the bug of issue 22) shows as a failure of `finished_well_within`, not only a slow test.
POLL_TIMEOUT_MS = 120_000


@dataclass(frozen=True)
class Written:
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    committed: bool


@dataclass
class TransactionalWriter:
    """A transactional producer (``transactional.id``) writing one topic: each call is one
    transaction over all the records given, leaving one marker per partition it touched."""

    broker: TestBroker
    topic: str
    written: list[Written] = field(default_factory=list)
    _producer: Producer | None = None
    _open: list | None = None

    @property
    def producer(self) -> Producer:
        if self._producer is None:
            self._producer = Producer({
                "bootstrap.servers": self.broker.bootstrap_servers,
                "transactional.id": f"kw-test-{uuid.uuid4().hex[:10]}",
                "linger.ms": 5,
            })
            self._producer.init_transactions(30)
        return self._producer

    def commit(self, records: Iterable[Record]) -> list[Written]:
        return self._transaction(records, commit=True)

    def abort(self, records: Iterable[Record]) -> list[Written]:
        return self._transaction(records, commit=False)

    def begin(self, records: Iterable[Record]) -> None:
        """Start a transaction, write ``records`` (flushed: they are in the log) and leave it
        open until ``finish``."""
        assert self._open is None, "one open transaction at a time"
        self.producer.begin_transaction()
        self._open = self._produce(records)

    def finish(self, commit: bool = True) -> list[Written]:
        reports, self._open = self._open, None
        return self._end(reports, commit)

    def _transaction(self, records: Iterable[Record], commit: bool) -> list[Written]:
        self.producer.begin_transaction()
        return self._end(self._produce(records), commit)

    def _end(self, reports: list, commit: bool) -> list[Written]:
        if commit:
            self.producer.commit_transaction(30)
        else:
            self.producer.abort_transaction(30)
        return self._record(reports, commit)

    def _produce(self, records: Iterable[Record]) -> list:
        reports: list = []

        def delivered(error, message, record) -> None:
            if error is not None:
                raise AssertionError(f"test producer: {error}")
            reports.append((record, message.offset()))

        for r in records:
            self.producer.produce(self.topic, key=r.key, value=r.value, partition=r.partition,
                                  timestamp=r.timestamp,
                                  on_delivery=lambda e, m, r=r: delivered(e, m, r))
        self.producer.flush(30)
        return reports

    def _record(self, reports: list, committed: bool) -> list[Written]:
        done = [Written(r.partition, offset, r.timestamp, r.key, r.value, committed)
                for r, offset in reports]
        self.written.extend(done)
        return done

    def plain(self, records: Iterable[Record]) -> list[Written]:
        """Records outside any transaction (a non-transactional producer), for topics that
        mix both."""
        producer = Producer({"bootstrap.servers": self.broker.bootstrap_servers,
                             "linger.ms": 5, "enable.idempotence": False})
        reports: list = []
        records = list(records)
        # Each partition's last record in a batch of its own: Tansu reports a partition's
        # end offset as its last batch's base offset + 1 (tests/support/kafka.TopicWriter).
        last = {r.partition: i for i, r in enumerate(records)}
        for i, r in enumerate(records):
            if i in last.values():
                continue
            self._plain_one(producer, r, reports)
        producer.flush(30)
        for i in sorted(last.values()):
            self._plain_one(producer, records[i], reports)
            producer.flush(30)
        return self._record(reports, True)

    def _plain_one(self, producer: Producer, r: Record, reports: list) -> None:
        producer.produce(self.topic, key=r.key, value=r.value, partition=r.partition,
                         timestamp=r.timestamp,
                         on_delivery=lambda e, m, r=r: reports.append((r, m.offset())))

    @property
    def committed(self) -> list[Written]:
        return sorted((w for w in self.written if w.committed),
                      key=lambda w: (w.partition, w.offset))

    @property
    def everything(self) -> list[Written]:
        return sorted(self.written, key=lambda w: (w.partition, w.offset))


def expected(writer: TransactionalWriter, isolation: str, broker: TestBroker) -> list[Written]:
    """What a consumer with ``isolation`` returns: under read_committed Apache Kafka hides
    aborted records; Tansu returns them anyway (DESIGN §14)."""
    if isolation == "read_committed" and broker.filters_aborted_records:
        return writer.committed
    return writer.everything


def end_offsets(broker: TestBroker, topic: str, partitions: int,
                isolation: str = "read_uncommitted") -> dict[int, int]:
    from confluent_kafka import IsolationLevel

    level = (IsolationLevel.READ_COMMITTED if isolation == "read_committed"
             else IsolationLevel.READ_UNCOMMITTED)
    admin = broker.admin()
    futures = admin.list_offsets({KafkaTP(topic, p): OffsetSpec.latest()
                                  for p in range(partitions)}, isolation_level=level,
                                 request_timeout=30)
    return {tp.partition: f.result().offset for tp, f in futures.items()}


def end_offsets_when_settled(broker: TestBroker, topic: str, want: dict[int, int],
                             isolation: str = "read_uncommitted", within_s: float = 15.0
                             ) -> dict[int, int]:
    """``end_offsets`` once they are ``want``, or as they are after ``within_s``. A producer's
    commit returns once the coordinator has logged it; the transaction's markers are written
    to the partitions just after (KIP-98), so the log's end can lag the commit briefly."""
    deadline = time.monotonic() + within_s
    while True:
        found = end_offsets(broker, topic, len(want), isolation)
        if found == want or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def plain_read(broker: TestBroker, topic: str, partitions: int,
               isolation: str = "read_uncommitted") -> list[tuple[int, int, bytes | None,
                                                                  bytes | None]]:
    """Every record a plain confluent-kafka consumer gets from the start of each partition to
    its end offset (listed with ``isolation``): ``(partition, offset, key, value)``."""
    ends = end_offsets(broker, topic, partitions, isolation)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers,
                         "group.id": f"plain-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "isolation.level": isolation, "auto.offset.reset": "earliest"})
    try:
        pending = {p for p in range(partitions) if ends[p] > 0}
        consumer.assign([KafkaTP(topic, p, 0) for p in pending])
        found = []
        deadline = time.monotonic() + 60
        while pending:
            assert time.monotonic() < deadline, f"plain consumer stuck on {topic} {pending}"
            for m in consumer.consume(1000, 0.5):
                if m.error() is not None:
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        pending.discard(m.partition())
                        continue
                    raise AssertionError(f"plain consumer: {m.error()}")
                if m.offset() < ends[m.partition()]:
                    found.append((m.partition(), m.offset(), m.key(), m.value()))
                if m.offset() + 1 >= ends[m.partition()]:
                    pending.discard(m.partition())
            for p in list(pending):
                position = consumer.position([KafkaTP(topic, p)])[0].offset
                if position >= ends[p]:
                    pending.discard(p)
        return sorted(found)
    finally:
        consumer.close()


def finished_well_within(started: float, poll_timeout_ms: int = POLL_TIMEOUT_MS) -> None:
    """A liveness check, not a speed figure: a read that waited for a marker's offset would
    have taken the whole ``kafkaConsumer.pollTimeoutMs`` (120 s); half of it is far above
    anything a working read needs on a loaded machine."""
    took = time.monotonic() - started
    assert took < poll_timeout_ms / 2000, (
        f"the read took {took:.0f} s: it waited out kafkaConsumer.pollTimeoutMs="
        f"{poll_timeout_ms} somewhere")
