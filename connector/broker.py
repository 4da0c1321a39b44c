"""Driver-side questions to the brokers: which partitions, and their offsets, in batched
requests with bounded time."""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient, OffsetSpec

from kwatermark import consumer as consumers
from kwatermark import retries, security
from kwatermark.consumer import chunked_offsets, task_conf
from kwatermark.errors import BrokerError, OptionError
from kwatermark.offsets import TopicPartition
from kwatermark.options import SourceOptions, Subscription
from kwatermark.range_end import Stall
from kwatermark.rdkafka_log import librdkafka_logger, line_kind

log = logging.getLogger("kwatermark.broker")

# A wrong address fails this soon: until a broker has answered once in this process, all
# attempts together get at most this long, not ``kafkaConsumer.pollTimeoutMs`` (DESIGN §3).
NEVER_REACHED_BUDGET_MS = 15_000
# Distinct connection errors kept for a failure's message (see _record_connection_error).
CONNECTION_ERRORS = 3
TIMESTAMP_LOOKUP = "looking up offsets by timestamp"
# One attempt's wait: the first FIRST_ATTEMPT_S, doubling up to ATTEMPT_S (a shorter one
# leaves librdkafka's own retries of a moving leader no room; a longer one waits out a dead
# broker instead of asking another). A blocking metadata request cannot see a refused
# handshake before its attempt ends: the first one is short.
FIRST_ATTEMPT_S = 1.0
ATTEMPT_S = 5.0
LEADER_CHECK_S = 0.5   # how often a retried offsets request asks whether its leader moved
# A subscription naming at most this many topics asks for their metadata one request each
# (~0.6 ms), not for the whole cluster's (KafkaMetadata._topic_counts).
NAMED_METADATA_MAX = 8
# KafkaMetadata._quick: from how many partitions, how long one call may take, and how long
# it rests after a call that did not answer every partition.
QUICK_FROM = 16   # below this, the admin client costs little (4 partitions: 2 ms)
QUICK_TIMEOUT_S = 1.0
QUICK_REST_S = 30.0


class Progress(Exception):
    """Raised by a request's attempt that got part of its answer: retry the rest, with a
    fresh no-progress budget."""

T = TypeVar("T")


class Ahead:
    """Answers ``KafkaMetadata.ask_ahead`` is getting on its threads: each taken once, by
    the call it stands in for; a failed one is asked again there."""

    def __init__(self, topics: concurrent.futures.Future, ends: concurrent.futures.Future):
        self.topics = topics
        self.ends = ends

    @staticmethod
    def taken(answer: concurrent.futures.Future) -> dict | None:
        try:
            return answer.result()
        except KafkaException as exc:
            log.debug("asked ahead: %s; asking again", exc)
            return None


def _in_background(call: Callable[[], T]) -> concurrent.futures.Future:
    """``call()`` on a daemon thread (not joined at exit: one attempt of a request, bounded
    by its own timeout)."""
    answer: concurrent.futures.Future = concurrent.futures.Future()

    def run() -> None:
        try:
            answer.set_result(call())
        except Exception as exc:  # noqa: BLE001 - raised where the answer is taken
            answer.set_exception(exc)
    threading.Thread(target=run, name="kwatermark-ahead", daemon=True).start()
    return answer


class KafkaMetadata:
    """One AdminClient per driver process, created on first use (the reader is pickled)."""

    def __init__(self, options: SourceOptions):
        self.options = options
        self._admin: AdminClient | None = None
        # Why connections failed since a broker last answered: the text of each kind (digits
        # ignored), the first CONNECTION_ERRORS kinds in the order they came.
        self._connection_errors: dict[str, str] = {}
        self._reached = False  # a broker answered once since this process started the query
        self._consumer: object = None   # _quick's (_offsets_consumer)
        self._quick_after = 0.0   # monotonic time before which _quick is not tried
        self._quick_lock = threading.Lock()   # _quick runs on ask_ahead's thread too

    def __getstate__(self) -> dict:
        return {"options": self.options, "_admin": None, "_connection_errors": {},
                "_reached": False, "_consumer": None, "_quick_after": 0.0}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _quick_lock=threading.Lock())

    @property
    def admin(self) -> AdminClient:
        if self._admin is None:
            conf = self.options.consumer_conf()
            # A metadata request naming a topic that does not exist would create it on
            # brokers with auto.create.topics.enable (Kafka's default), as an admin client
            # (a producer to librdkafka) allows by default; Spark's consumers do not.
            conf.setdefault("allow.auto.create.topics", False)
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
        """How long a request may go without progress: ``kafkaConsumer.pollTimeoutMs``, or
        at most NEVER_REACHED_BUDGET_MS while no broker has ever answered (a wrong
        address)."""
        if self._reached:
            return self.options.poll_timeout_ms
        return min(self.options.poll_timeout_ms, NEVER_REACHED_BUDGET_MS)

    @property
    def timeout_s(self) -> float:
        """One attempt's longest wait (see ATTEMPT_S)."""
        return max(0.5, min(ATTEMPT_S, self.budget_ms / 1000.0))

    def _refusal(self) -> str | None:
        """The cause, in the user's options' terms, of a connection refusal that no retry
        mends (authentication, the broker's or the client's certificate), among the
        connection errors since a broker last answered; None when there is none."""
        self.admin.poll(0)  # serves the queued error_cb calls
        conf = self.options.consumer_conf()
        jaas = "sasl.jaas.config" in {k.lower() for k in dict(self.options.kafka_conf)}
        for text in self._connection_errors.values():
            verified = (security.tls_verify_reason(text, conf)
                        if "certificate verify failed" in text else "")
            cause = security.refusal_cause(text, conf, verified, jaas)
            if cause is not None:
                return f"{cause} (kafka.bootstrap.servers={self.options.bootstrap_servers!r}" \
                       f"; librdkafka: {text})"
        return None

    def _failure(self, what: str, error: object, attempts: int, exhausted: str
                 ) -> BrokerError:
        errors = " | ".join(self._connection_errors.values())
        cause = (f"; connection errors: {errors}" + security.tls_verify_reason(
            errors, self.options.consumer_conf()) if errors else "")
        return BrokerError(
            f"{what} failed against kafka.bootstrap.servers="
            f"{self.options.bootstrap_servers!r}: {error}{cause} (gave up after "
            f"{attempts} attempt(s) {exhausted})")

    def _retrying(self, what: str, call: Callable[[float], T]) -> T:
        """``call(timeout_s)`` until it answers (DESIGN §20, docs/operations.md):

        * a refusal no retry mends (authentication, certificates) fails at once, naming it;
        * a transient error (``kwatermark.retries``: a leader moving, a broker down while
          others answer, a timeout) is retried with backoff until
          ``kafkaConsumer.pollTimeoutMs`` passes without an answer (15 s while no broker
          has ever answered: a wrong address);
        * any other error is retried ``fetchOffset.numRetries`` times,
          ``fetchOffset.retryIntervalMs`` apart (Spark's meaning of those options).

        ``call`` may raise :class:`Progress` to say part of the request was answered: the
        no-progress clock restarts."""
        _ = self.admin  # created outside the retries: a bad kafka.* option is not a broker fault
        stall = Stall(self.budget_ms / 1000.0, time.monotonic())
        backoff = retries.Backoff()
        others = 0
        attempt = 0
        while True:
            attempt += 1
            try:
                grown = FIRST_ATTEMPT_S * 2 ** min(attempt - 1, 8)
                timeout = max(0.5, min(self.timeout_s, grown,
                                       stall.last + stall.limit_s - time.monotonic()))
                result = call(timeout)
                self._reached = True
                self._connection_errors.clear()
                return result
            except Progress:
                self._reached = True
                stall.progressed(time.monotonic())
                backoff.reset()
                continue
            except KafkaException as exc:
                error = exc.args[0] if exc.args else exc
                refusal = self._refusal()
                if refusal is not None:
                    raise BrokerError(refusal) from None
                if retries.transient(error):
                    wait = backoff.next_s()
                    stall.limit_s = self.budget_ms / 1000.0  # a broker may have answered since
                    if stall.expired(time.monotonic() + wait):
                        raise self._failure(what, error, attempt, self._exhausted()) from exc
                    log.info("%s: %s; retrying in %.1f s (attempt %d)", what, error, wait,
                             attempt)
                    time.sleep(wait)
                    continue
                others += 1
                if others > self.options.fetch_offset_retries:
                    raise self._failure(what, error, attempt, (
                        f"as fetchOffset.numRetries={self.options.fetch_offset_retries} "
                        f"allows for an error that is not a transient one")) from exc
                time.sleep(self.options.fetch_offset_retry_interval_ms / 1000.0)

    def _exhausted(self) -> str:
        if self._reached:
            return (f"with no answer for kafkaConsumer.pollTimeoutMs="
                    f"{self.options.poll_timeout_ms}")
        return (f"within {self.budget_ms / 1000:g} s, as no broker has answered since the "
                f"query started: is the address right?")

    def topics(self, ahead: Ahead | None = None) -> dict[str, int]:
        """Topic -> partition count of the topics the subscription can read that exist:
        every topic the brokers know for ``subscribePattern`` (or more than
        NAMED_METADATA_MAX named ones), the named ones otherwise (``ahead``: as ``ask_ahead``
        found them, a few ms ago)."""
        answered = ahead.taken(ahead.topics) if ahead is not None else None
        if answered is not None:
            return answered
        return self._retrying("listing topics", self._topic_counts)

    def _topic_counts(self, timeout: float) -> dict[str, int]:
        subscription = self.options.subscription
        names = sorted(set(subscription.topics) | {t for t, _ in subscription.assigned})
        if subscription.kind == "subscribePattern" or len(names) > NAMED_METADATA_MAX:
            listed = [self.admin.list_topics(timeout=timeout)]
        else:
            # Only the named topics: the whole cluster's metadata grows with every partition
            # of every topic (22 ms a planning with one 4,096-partition topic beside a
            # 4-partition query's, against 0.6 ms for its own). The admin client creates no
            # topic it names (allow.auto.create.topics, KafkaMetadata.admin).
            listed = [self.admin.list_topics(topic=name, timeout=timeout) for name in names]
        return {name: len(t.partitions) for metadata in listed
                for name, t in metadata.topics.items() if t.error is None}

    def assigned_partitions(self, subscription: Subscription) -> list[TopicPartition]:
        """The partitions the subscription covers right now (Spark's semantics: a topic or
        an assigned partition that does not exist has no partitions; a pattern is found in
        a name, internal topics never match)."""
        return self.coverage(subscription)[0]

    def coverage(self, subscription: Subscription, ahead: Ahead | None = None
                 ) -> tuple[list[TopicPartition], list[tuple[str, int | None]]]:
        """The partitions the subscription covers right now, and what it names that the
        brokers do not have: ``(topic, None)`` for a ``subscribe``/``assign`` topic that does
        not exist, ``(topic, p)`` for an assigned partition past the topic's count. Topics
        follow Spark's consumer strategies (``Subscription.selects`` for a pattern)."""
        topics = self.topics(ahead)
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

    def topic_ids(self, topics: Iterable[str]) -> dict[str, str]:
        """Each topic's id (a recreated topic has a new one); topics the brokers do not
        describe are left out."""
        from confluent_kafka import TopicCollection

        names = sorted(set(topics))
        if not names:
            return {}

        def fetch(timeout: float) -> dict[str, str]:
            futures = self.admin.describe_topics(TopicCollection(names),
                                                 request_timeout=timeout)
            self._await(futures, timeout)
            found = {}
            for name, future in futures.items():
                try:
                    found[name] = str(future.result().topic_id)
                except KafkaException as exc:
                    error = exc.args[0] if exc.args else exc
                    gone = isinstance(error, KafkaError) and error.code() in (
                        KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC)
                    if retries.transient(error) and not gone:
                        raise
            return found
        return self._retrying("describing topics", fetch)

    def _list_offsets(self, what: str, specs: dict[TopicPartition, OffsetSpec]
                      ) -> dict[TopicPartition, int]:
        """One batched ListOffsets request per leader; a partition answered with a transient
        error (its leader moving) is asked again alone, the others' answers are kept."""
        if not specs:
            return {}
        isolation = dict(self.options.kafka_conf).get("isolation.level", "read_uncommitted")
        found: dict[TopicPartition, int] = {}
        timed = set(specs) if what == TIMESTAMP_LOOKUP else set()
        retried = False   # an attempt has failed or answered in part

        def fetch(timeout: float):
            nonlocal retried
            from confluent_kafka import IsolationLevel
            level = (IsolationLevel.READ_COMMITTED if isolation == "read_committed"
                     else IsolationLevel.READ_UNCOMMITTED)
            asked = {tp: spec for tp, spec in specs.items() if tp not in found}
            # Asked again after a failure: a request queued for a leader that is down waits
            # out its whole timeout in librdkafka, even once another broker leads; note the
            # leaders now and stop waiting when one of them changes.
            leaders = self._leaders(set(asked), timeout) if retried else None
            retried = True
            futures = self.admin.list_offsets(
                {KafkaTP(t, p): spec for (t, p), spec in asked.items()},
                isolation_level=level, request_timeout=timeout)
            moved = None if leaders is None else (
                lambda: self._leaders(set(leaders), 1.0) not in (None, leaders))
            self._await(futures, timeout, moved)
            failed: list[tuple[TopicPartition, KafkaException]] = []
            for tp, future in futures.items():
                key = (tp.topic, tp.partition)
                if not future.done():
                    failed.append((key, KafkaException(KafkaError(
                        KafkaError.NOT_LEADER_FOR_PARTITION,
                        "its leader changed while the request waited"))))
                    continue
                try:
                    offset = future.result().offset
                except KafkaException as exc:
                    failed.append((key, exc))
                    continue
                # A partition whose leader is not ready (a new topic, a leader moving) can
                # come back without an error and without an offset (-1001, librdkafka's
                # "invalid"): no answer yet. -1 is an answer only for a timestamp (no record
                # at or after it).
                if offset < (-1 if key in timed else 0):
                    failed.append((key, KafkaException(KafkaError(
                        KafkaError.LEADER_NOT_AVAILABLE, f"no offset yet ({offset})"))))
                else:
                    found[key] = offset
            if not failed:
                return dict(found)
            self._refresh({t for (t, _), _ in failed}, timeout)
            (topic, partition), exc = failed[0]
            error = exc.args[0] if exc.args else exc
            if not retries.transient(error) or len(failed) == len(futures):
                raise KafkaException(_named(error, topic, partition, len(failed))) from None
            raise Progress()
        return self._retrying(what, fetch)

    def _refresh(self, topics: set[str], timeout: float) -> None:
        """Ask for the topics' metadata again: librdkafka's ListOffsets sends the leader and
        leader epoch it has cached, and does not refresh them on FENCED_LEADER_EPOCH or
        NOT_LEADER (seen here: the same stale epoch for 120 s after a leader was killed)."""
        for topic in sorted(topics):
            with contextlib.suppress(KafkaException):
                self.admin.list_topics(topic=topic, timeout=min(timeout, 2.0))

    def _leaders(self, tps: set[TopicPartition], timeout: float
                 ) -> dict[TopicPartition, int] | None:
        """Each partition's leader as the brokers say now (asking refreshes librdkafka's
        cache); None when no broker answers."""
        leaders = {}
        try:
            for topic in sorted({t for t, _ in tps}):
                described = self.admin.list_topics(topic=topic, timeout=timeout).topics.get(topic)
                partitions = described.partitions if described is not None else {}
                leaders.update({(topic, p): part.leader for p, part in partitions.items()
                                if (topic, p) in tps})
        except KafkaException:
            return None
        return leaders

    def _await(self, futures: dict, timeout: float,
               moved: Callable[[], bool] | None = None) -> None:
        """Wait for the futures, serving error_cb meanwhile: a refusal that no retry mends
        (a failed authentication or TLS handshake) ends the wait at once; so does a leader
        change (``moved``, asked each LEADER_CHECK_S), after which the pending futures are
        left to librdkafka's timeout and asked again."""
        started = time.monotonic()
        deadline = started + timeout + 1.0
        checked = started
        pending = list(futures.values())
        while pending and time.monotonic() < deadline:
            _, waiting = concurrent.futures.wait(pending, timeout=0.1)
            pending = list(waiting)
            if pending:
                self.admin.poll(0)  # serves the queued error_cb calls
            if pending and self._connection_errors:
                refusal = self._refusal()
                if refusal is not None:
                    raise BrokerError(refusal)
            if pending and moved is not None and \
                    time.monotonic() - checked >= LEADER_CHECK_S:
                if moved():
                    return
                checked = time.monotonic()

    def ask_ahead(self, tps: list[TopicPartition], ends: bool = True) -> Ahead | None:
        """Start asking what the next planning asks the brokers first, each on a thread of
        its own: every topic's partition count (``topics``) and, with ``ends``, the end
        offsets of ``tps``, the partitions already read (``latest_offsets``; without, the
        answer is None: asked there if needed). The planner asks before folding
        the last batch, so the answers (~17 and ~30 ms at 4,096 partitions inside Spark's
        planning process, in librdkafka, without the GIL; the end offsets four ListOffsets
        calls at a time, kw_offsets) come while Python folds. One short attempt each (the metadata
        within FIRST_ATTEMPT_S, the end offsets through the quick path, QUICK_TIMEOUT_S), so
        a cluster that does not answer delays the usual path by a second at most: what fails
        or is not answered is asked again there, with its retries. None below QUICK_FROM
        partitions, or before a broker has answered (a wrong address is named by the usual
        path)."""
        if not self._quick_ready(tps):
            return None
        first_attempt = min(self.timeout_s, FIRST_ATTEMPT_S)   # as _retrying's first
        if ends:
            asked_ends = _in_background(lambda: self._quick(tps, OFFSET_END))
        else:
            asked_ends = concurrent.futures.Future()
            asked_ends.set_result(None)
        return Ahead(_in_background(lambda: self._counts_ahead(first_attempt)), asked_ends)

    def _counts_ahead(self, timeout: float) -> dict[str, int]:
        """``_topic_counts`` for ``ask_ahead``, through the compiled engine's client where it
        reads: a few named topics' (one C call a topic), or the whole cluster's for a
        pattern (one C call). The admin client's answer makes a Python object per partition
        (6-7 ms of the process's CPU at 4,096 partitions, beside the fold; for a pattern,
        every partition of the cluster). A named topic it cannot count (missing, not
        allowed) fails the answer, which the usual path then asks the admin client again."""
        subscription = self.options.subscription
        names = sorted(set(subscription.topics) | {t for t, _ in subscription.assigned})
        # Not behind _quick's lock, held through its lookup on the other thread: the two
        # requests go out together (librdkafka's handle is thread-safe).
        client = self._consumer
        if client is None:
            with self._quick_lock:
                client = self._consumer = self._consumer or self._offsets_consumer()
        if not hasattr(client, "topic_counts"):   # confluent-kafka's (readEngine=python)
            return self._topic_counts(timeout)
        if subscription.kind == "subscribePattern" or len(names) > NAMED_METADATA_MAX:
            # The whole cluster's topics (a pattern's): one C call, no Python object a
            # partition of the cluster (bench/README.md, "A pattern's topics in one call").
            return client.topic_counts(timeout)
        return {name: client.partition_count(name, timeout) for name in names}

    def latest_offsets(self, tps: Iterable[TopicPartition], ahead: Ahead | None = None
                       ) -> dict[TopicPartition, int]:
        """End offsets of all partitions in one batched ListOffsets request per leader
        (``ahead``: ``ask_ahead``'s answers for some of them, a few ms older)."""
        tps = list(tps)
        answered = ahead.taken(ahead.ends) if ahead is not None else None
        found = {tp: answered[tp] for tp in tps if tp in answered} if answered else {}
        found.update(self._quick([tp for tp in tps if tp not in found], OFFSET_END))
        found.update(self._list_offsets("fetching end offsets", {
            tp: OffsetSpec.latest() for tp in tps if tp not in found}))
        return found

    def earliest_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        tps = list(tps)
        found = self._quick(tps, OFFSET_BEGINNING)
        found.update(self._list_offsets("fetching earliest offsets", {
            tp: OffsetSpec.earliest() for tp in tps if tp not in found}))
        return found

    def _quick(self, tps: list[TopicPartition], which: int) -> dict[TopicPartition, int]:
        """The partitions' offsets through a consumer's ``offsets_for_times``: one C call per
        512 partitions (``chunked_offsets``), where the AdminClient makes a Python future per
        partition (about 1 s of the driver's planning at 4,096 partitions). Only clean
        answers are kept; whatever it does not answer at once (a leader moving, a broker
        down: no retry here) goes to ``_list_offsets``, and after such a failure the quick
        path rests for QUICK_REST_S. Not tried before a broker has answered the admin
        client (a wrong address or a refusal is named there)."""
        if not self._quick_ready(tps):
            return {}
        with self._quick_lock:
            try:
                if self._consumer is None:
                    self._consumer = self._offsets_consumer()
                if hasattr(self._consumer, "clean_offsets"):
                    found = self._consumer.clean_offsets(tps, which, QUICK_TIMEOUT_S,
                                                         consumers.OFFSETS_CHUNK)
                else:
                    answer = chunked_offsets(self._consumer,
                                             [KafkaTP(t, p, which) for t, p in tps],
                                             QUICK_TIMEOUT_S)
                    found = {(tp.topic, tp.partition): tp.offset for tp in answer
                             if tp.error is None and tp.offset >= 0}
            except KafkaException as exc:
                log.debug("quick offsets lookup failed (%s); asking through the admin client",
                          exc)
                self._quick_after = time.monotonic() + QUICK_REST_S
                return {}
        if len(found) < len(tps):
            self._quick_after = time.monotonic() + QUICK_REST_S
        return found

    def _offsets_consumer(self) -> object:
        """``_quick``'s consumer: the compiled engine's client where it reads
        (``compiled.offsets_client``: every chunk of a lookup in one call without the GIL,
        so the answer ``ask_ahead`` waits for comes while Python folds the last batch),
        else confluent-kafka's."""
        from kwatermark import compiled
        conf = task_conf(self.options, 1)
        client = compiled.offsets_client(self.options, conf, self)
        if client is not None:
            return client
        conf["logger"] = librdkafka_logger()
        return Consumer(conf)

    def _quick_ready(self, tps: list[TopicPartition]) -> bool:
        return len(tps) >= QUICK_FROM and self._reached and \
            time.monotonic() >= self._quick_after

    def offsets_for_times(self, times: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        """First offset with timestamp >= the time, or -1 when there is none (broker's
        timestamp index)."""
        return self._list_offsets(TIMESTAMP_LOOKUP,
                                  {tp: OffsetSpec.for_timestamp(ts) for tp, ts in times.items()})


def _named(error: object, topic: str, partition: int, failed: int) -> KafkaError:
    """``error`` with the partition it came from (and how many more failed) in its text."""
    more = f" and {failed - 1} more partition(s)" if failed > 1 else ""
    if isinstance(error, KafkaError):
        return KafkaError(error.code(), f"topic {topic}, partition {partition}{more}: "
                                        f"{error.str()} [{error.name()}]",
                          retriable=error.retriable())
    return KafkaError(KafkaError.UNKNOWN, f"topic {topic}, partition {partition}{more}: {error}")
