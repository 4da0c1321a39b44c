"""What a retry mends (DESIGN §20): which broker errors are transient, how long to keep
trying, and how a refusal that no retry mends is named.

A healthy cluster answers with errors every day: while a leader moves (a rolling restart, a
broker that died, a reassignment) a request meets ``NOT_LEADER_FOR_PARTITION``,
``LEADER_NOT_AVAILABLE``, ``FENCED_LEADER_EPOCH``, a new leader whose high watermark has not
caught up (``OFFSET_NOT_AVAILABLE``), or a broker refusing connections. Kafka's own clients
retry these (they are ``RetriableException``\\ s in the Java client) with a backoff of 100 ms
doubling to 1 s; kwatermark does the same, for as long as ``kafkaConsumer.pollTimeoutMs``
passes without progress. Authentication and certificate failures are the opposite: the
broker answered and said no, and asking again gets the same answer
(``security.refusal_cause`` names them).

>>> from confluent_kafka import KafkaError
>>> transient(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION))
True
>>> transient(KafkaError(KafkaError._DESTROY_BROKER))
True
>>> transient(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
False
>>> [round(b.next_s(), 1) for b in [Backoff()] for _ in range(6)]
[0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
"""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import KafkaError

# Kafka's retriable protocol errors (the Java client's RetriableException family) and
# librdkafka's local conditions of a cluster in motion.
_TRANSIENT_NAMES = (
    "NOT_LEADER_FOR_PARTITION", "LEADER_NOT_AVAILABLE", "FENCED_LEADER_EPOCH",
    "UNKNOWN_LEADER_EPOCH", "OFFSET_NOT_AVAILABLE", "REPLICA_NOT_AVAILABLE",
    "BROKER_NOT_AVAILABLE", "NOT_ENOUGH_REPLICAS", "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
    "REQUEST_TIMED_OUT", "NETWORK_EXCEPTION", "KAFKA_STORAGE_ERROR", "NOT_CONTROLLER",
    "COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE", "NOT_COORDINATOR",
    "PREFERRED_LEADER_NOT_AVAILABLE", "ELIGIBLE_LEADERS_NOT_AVAILABLE",
    "THROTTLING_QUOTA_EXCEEDED", "UNSTABLE_OFFSET_COMMIT", "UNKNOWN_TOPIC_OR_PART",
    "UNKNOWN_TOPIC_ID", "FETCH_SESSION_ID_NOT_FOUND", "INVALID_FETCH_SESSION_EPOCH",
    "_TRANSPORT", "_TIMED_OUT", "_TIMED_OUT_QUEUE", "_ALL_BROKERS_DOWN", "_WAIT_COORD",
    "_RETRY", "_UNKNOWN_PARTITION", "_UNKNOWN_BROKER", "_RESOLVE",
    # librdkafka dropped the connection a request was waiting on because the broker left
    # the cluster's metadata (a node shutting down; the bootstrap address once the real
    # brokers are known): the next attempt goes to a broker that is there.
    "_DESTROY_BROKER",
)
TRANSIENT_CODES = frozenset(getattr(KafkaError, name) for name in _TRANSIENT_NAMES
                            if hasattr(KafkaError, name))

# Kafka's Java client defaults (retry.backoff.ms, retry.backoff.max.ms).
BACKOFF_FIRST_S = 0.1
BACKOFF_MAX_S = 1.0


def transient(error: object) -> bool:
    """A retry may mend it: a leader moving, a broker restarting, a timeout; or whatever
    librdkafka itself marks retriable. ``error``: a KafkaError (anything else: no)."""
    if not isinstance(error, KafkaError):
        return False
    return error.retriable() or error.code() in TRANSIENT_CODES


@dataclass
class Backoff:
    """Waits between attempts: ``first_s`` doubling up to ``max_s``."""

    first_s: float = BACKOFF_FIRST_S
    max_s: float = BACKOFF_MAX_S
    _next: float = 0.0

    def next_s(self) -> float:
        self._next = self.first_s if not self._next else min(self.max_s, self._next * 2)
        return self._next

    def reset(self) -> None:
        self._next = 0.0


def leader_of(client: object, topic: str, partition: int) -> str:
    """Which broker leads the partition, for an error message: ``"leader node 2 at
    127.0.0.1:9093"``, ``"no leader"``, or ``"leader unknown"`` when no broker answers within
    a second. ``client``: a Consumer or AdminClient (anything with ``list_topics``)."""
    try:
        metadata = client.list_topics(topic, timeout=1.0)
        leader = metadata.topics[topic].partitions[partition].leader
    except Exception:  # noqa: BLE001 - only for the message: a failing cluster may not say
        return "leader unknown"
    if leader < 0:
        return "no leader"
    broker = metadata.brokers.get(leader)
    return f"leader node {leader}" + (f" at {broker.host}:{broker.port}" if broker else "")
