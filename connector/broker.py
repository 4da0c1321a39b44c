"""Driver-side questions to the brokers: which partitions, and their offsets, in batched
requests with bounded time."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient, OffsetSpec

from kwatermark import security
from kwatermark.errors import BrokerError, OptionError
from kwatermark.offsets import TopicPartition
from kwatermark.options import SourceOptions, Subscription
from kwatermark.rdkafka_log import librdkafka_logger, line_kind

log = logging.getLogger("kwatermark.broker")

# A wrong address fails this soon: until a broker has answered once in this process, all
# attempts together get at most this long, not ``kafkaConsumer.pollTimeoutMs`` (DESIGN §3).
NEVER_REACHED_BUDGET_MS = 15_000
# Distinct connection errors kept for a failure's message (see _record_connection_error).
CONNECTION_ERRORS = 3

T = TypeVar("T")


class KafkaMetadata:
    """One AdminClient per driver process, created on first use (the reader is pickled)."""

    def __init__(self, options: SourceOptions):
        self.options = options
        self._admin: AdminClient | None = None
        # Why connections failed since a broker last answered: the text of each kind (digits
        # ignored), the first CONNECTION_ERRORS kinds in the order they came.
        self._connection_errors: dict[str, str] = {}
        self._reached = False  # a broker answered once since this process started the query

    def __getstate__(self) -> dict:
        return {"options": self.options, "_admin": None, "_connection_errors": {},
                "_reached": False}

    @property
    def admin(self) -> AdminClient:
        if self._admin is None:
            conf = self.options.consumer_conf()
            conf["logger"] = librdkafka_logger()
            conf["error_cb"] = self._record_connection_error
            try:
                self._admin = AdminClient(conf)
            except KafkaException as exc:
                error = exc.args[0] if exc.args else exc
                text = error.str() if isinstance(error, KafkaError) else str(error)
                raise OptionError(f"a kafka.* option was refused by librdkafka: {text}"
                                  ) from exc
        return self._admin

    def _record_connection_error(self, error: KafkaError) -> None:
        # Why a connection failed (refused, TLS, SASL) reaches only this callback; the
        # request that then times out says just "Broker transport failure". librdkafka words
        # a repeated failure differently from the first ("SSL handshake failed: ...
        # certificate verify failed: broker certificate could not be verified, verify that
        # ssl.ca.location ...", then "...certificate verify failed (after 3ms in state
        # SSL_HANDSHAKE)"), so each kind is kept, not only the last.
        if error.code() == KafkaError._ALL_BROKERS_DOWN:
            return
        text = error.str()
        kind = line_kind(text)
        if kind not in self._connection_errors and \
                len(self._connection_errors) < CONNECTION_ERRORS:
            self._connection_errors[kind] = text

    @property
    def budget_ms(self) -> int:
        """All attempts of one request together: ``kafkaConsumer.pollTimeoutMs``, or at most
        NEVER_REACHED_BUDGET_MS while no broker has ever answered (a wrong address)."""
        if self._reached:
            return self.options.poll_timeout_ms
        return min(self.options.poll_timeout_ms, NEVER_REACHED_BUDGET_MS)

    @property
    def timeout_s(self) -> float:
        """Per attempt: all attempts together stay within :attr:`budget_ms`."""
        attempts = self.options.fetch_offset_retries + 1
        return max(0.5, self.budget_ms / 1000.0 / attempts)

    def _retrying(self, what: str, call: Callable[[], T]) -> T:
        """Retry as ``fetchOffset.numRetries``/``retryIntervalMs`` say, then fail naming the
        brokers; the whole call is bounded by ``kafkaConsumer.pollTimeoutMs`` per attempt."""
        attempts = self.options.fetch_offset_retries + 1
        _ = self.admin  # created outside the retries: a bad kafka.* option is not a broker fault
        for attempt in range(attempts):
            try:
                result = call()
                self._reached = True
                self._connection_errors.clear()
                return result
            except KafkaException as exc:
                error = exc.args[0] if exc.args else exc
                if attempt + 1 >= attempts:
                    self.admin.poll(0)  # serves the queued error_cb calls
                    errors = " | ".join(self._connection_errors.values())
                    cause = (f"; connection errors: {errors}" + security.tls_verify_reason(
                        errors, self.options.consumer_conf()) if errors else "")
                    if self._reached:
                        budget = f"kafkaConsumer.pollTimeoutMs={self.options.poll_timeout_ms}"
                    else:
                        budget = (f"{self.budget_ms / 1000:g} s, as no broker has answered "
                                  f"since the query started: is the address right?")
                    raise BrokerError(
                        f"{what} failed against kafka.bootstrap.servers="
                        f"{self.options.bootstrap_servers!r}: {error}{cause} (gave up after "
                        f"{attempts} attempt(s) within {budget})") from exc
                time.sleep(self.options.fetch_offset_retry_interval_ms / 1000.0)
        raise AssertionError("unreachable")

    def topics(self) -> dict[str, int]:
        """Topic -> partition count, for every topic the brokers know."""
        def fetch():
            metadata = self.admin.list_topics(timeout=self.timeout_s)
            return {name: len(t.partitions) for name, t in metadata.topics.items()
                    if t.error is None}
        return self._retrying("listing topics", fetch)

    def assigned_partitions(self, subscription: Subscription) -> list[TopicPartition]:
        """The partitions the subscription covers right now (Spark's semantics: a topic or
        an assigned partition that does not exist has no partitions; a pattern is found in
        a name, internal topics never match)."""
        return self.coverage(subscription)[0]

    def coverage(self, subscription: Subscription
                 ) -> tuple[list[TopicPartition], list[tuple[str, int | None]]]:
        """The partitions the subscription covers right now, and what it names that the
        brokers do not have: ``(topic, None)`` for a ``subscribe``/``assign`` topic that does
        not exist, ``(topic, p)`` for an assigned partition past the topic's count. Topics
        follow Spark's consumer strategies (``Subscription.selects`` for a pattern)."""
        topics = self.topics()
        named = (subscription.topics if subscription.kind == "subscribe"
                 else [t for t, _ in subscription.assigned])
        self._refuse_unauthorized(sorted({t for t in named if t not in topics}))
        if subscription.kind == "assign":
            missing = [(t, None) for t in sorted({t for t, _ in subscription.assigned
                                                  if t not in topics})]
            missing += [(t, p) for t, p in subscription.assigned
                        if t in topics and p >= topics[t]]
            return sorted((t, p) for t, p in subscription.assigned
                          if t in topics and p < topics[t]), missing
        if subscription.kind == "subscribe":
            names = [t for t in subscription.topics if t in topics]
            missing = [(t, None) for t in subscription.topics if t not in topics]
        else:
            names = [t for t in topics if subscription.selects(t)]
            missing = []
        return sorted((t, p) for t in names for p in range(topics[t])), missing

    def _refuse_unauthorized(self, topics: list[str]) -> None:
        """A topic the principal may not describe is left out of the metadata, as if it did
        not exist: ask for it by name (DescribeTopics never creates it), so a missing ACL is
        reported as one instead of a missing topic."""
        if not topics:
            return
        from confluent_kafka import TopicCollection

        denied = []
        futures = self.admin.describe_topics(TopicCollection(topics),
                                             request_timeout=self.timeout_s)
        for name, future in futures.items():
            try:
                future.result()
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if isinstance(error, KafkaError) and \
                        error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                    denied.append(name)
        if denied:
            raise BrokerError(
                f"topic {', '.join(denied)}: not authorized for "
                f"{security.principal_hint(self.options.consumer_conf())} on "
                f"kafka.bootstrap.servers={self.options.bootstrap_servers!r} "
                f"(TOPIC_AUTHORIZATION_FAILED): grant it DESCRIBE and READ on the topic")

    def _list_offsets(self, what: str, specs: dict[TopicPartition, OffsetSpec]
                      ) -> dict[TopicPartition, int]:
        if not specs:
            return {}
        isolation = dict(self.options.kafka_conf).get("isolation.level", "read_uncommitted")

        def fetch():
            from confluent_kafka import IsolationLevel
            level = (IsolationLevel.READ_COMMITTED if isolation == "read_committed"
                     else IsolationLevel.READ_UNCOMMITTED)
            futures = self.admin.list_offsets(
                {KafkaTP(t, p): spec for (t, p), spec in specs.items()},
                isolation_level=level, request_timeout=self.timeout_s)
            return {(tp.topic, tp.partition): future.result().offset
                    for tp, future in futures.items()}
        return self._retrying(what, fetch)

    def latest_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """End offsets of all partitions in one batched ListOffsets request per leader."""
        return self._list_offsets("fetching end offsets",
                                  {tp: OffsetSpec.latest() for tp in tps})

    def earliest_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return self._list_offsets("fetching earliest offsets",
                                  {tp: OffsetSpec.earliest() for tp in tps})

    def offsets_for_times(self, times: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        """First offset with timestamp >= the time, or -1 when there is none (broker's
        timestamp index)."""
        return self._list_offsets("looking up offsets by timestamp",
                                  {tp: OffsetSpec.for_timestamp(ts) for tp, ts in times.items()})
