"""Errors as Spark shows them (issue 23): a KWatermarkError leaves kwatermark's Spark-facing
methods with a one-frame traceback and no chained cause, so the text Spark builds from the
traceback has the message right after its prefix; other exceptions keep their traceback."""

from __future__ import annotations

import traceback

import pytest

from kwatermark.errors import (
    BrokerError,
    DataLossError,
    DecodeError,
    KWatermarkError,
    OptionError,
    PluginError,
)
from kwatermark.offsets import OffsetFormatError
from kwatermark.source import FULL_TRACEBACK_ENV, _cause_first, _cause_first_rows

ERRORS = [OptionError, DataLossError, BrokerError, PluginError, DecodeError, OffsetFormatError]


def deep(error: type[Exception], depth: int = 6) -> None:
    if depth:
        deep(error, depth - 1)
        return
    try:
        raise KeyError("an internal cause")
    except KeyError as cause:
        raise error(f"{error.__name__}: topic t, partition 0") from cause


def formatted(exc: BaseException) -> list[str]:
    """What PySpark's worker writes for an exception: its traceback without the caller's
    leading frames (Spark's own, there; this test's, here), then its message."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return "".join(traceback.TracebackException(type(exc), exc, tb, compact=True).format()
                   ).splitlines()


@pytest.mark.parametrize("error", ERRORS)
def test_a_kwatermark_error_leaves_a_spark_facing_method_with_one_frame(error):
    with pytest.raises(error) as info:
        _cause_first(deep)(error)
    lines = formatted(info.value)
    assert len(lines) == 4   # "Traceback ...", the frame, its line, the message
    assert lines[-1].endswith(f"{error.__name__}: topic t, partition 0")
    assert info.value.__cause__ is None and info.value.__suppress_context__


@pytest.mark.parametrize("error", ERRORS)
def test_so_does_one_raised_while_rows_are_read(error):
    def rows():
        yield 1
        deep(error)

    with pytest.raises(error) as info:
        list(_cause_first_rows(rows()))
    assert len(formatted(info.value)) == 4


def test_other_exceptions_keep_their_whole_traceback():
    """A user plugin's own exception: its frames are what the user needs."""
    with pytest.raises(ZeroDivisionError) as info:
        _cause_first(lambda: deep(ZeroDivisionError))()
    assert not isinstance(info.value, KWatermarkError)
    assert len(formatted(info.value)) > 10


def test_the_full_traceback_stays_on_request(monkeypatch):
    monkeypatch.setenv(FULL_TRACEBACK_ENV, "1")
    with pytest.raises(OptionError) as info:
        _cause_first(deep)(OptionError)
    assert len(formatted(info.value)) > 10
    assert isinstance(info.value.__cause__, KeyError)



def test_a_broker_failure_names_each_kind_of_connection_error_in_the_order_they_came():
    # librdkafka words the first failure of a kind and its repeats differently (the CI run
    # of be2bfe8 reported only the terse repeat of a TLS failure, which lacks its cause).
    from confluent_kafka import KafkaError, KafkaException

    from kwatermark.broker import KafkaMetadata
    from kwatermark.options import parse_options

    metadata = KafkaMetadata(parse_options({"kafka.bootstrap.servers": "127.0.0.1:1",
                                            "subscribe": "t", "fetchOffset.numRetries": "0",
                                            "kafkaConsumer.pollTimeoutMs": "1000"}))
    first = ("127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused "
             "(after 0ms in state CONNECT)")
    repeat = ("127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused "
              "(after 0ms in state CONNECT, {} identical error(s) suppressed)")
    for text in (first, repeat.format(3), repeat.format(4), "1/1 brokers are down"):
        code = KafkaError._ALL_BROKERS_DOWN if "down" in text else KafkaError._TRANSPORT
        metadata._record_connection_error(KafkaError(code, text))

    def timed_out(_timeout):
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "Broker transport failure"))

    with pytest.raises(BrokerError) as failure:
        metadata._retrying("listing topics", timed_out)
    message = str(failure.value)
    assert f"connection errors: {first} | {repeat.format(3)}" in message, message
    assert repeat.format(4) not in message and "brokers are down" not in message
    assert message.endswith("as no broker has answered since the query started: is the "
                            "address right?)"), message


@pytest.mark.parametrize("text, cause", [
    (("ssl://127.0.0.1:1/bootstrap: SSL handshake failed: error:0A000086:SSL routines::"
     "certificate verify failed: broker certificate could not be verified"),
     "the broker's certificate is not signed by a CA in kafka.ssl.truststore.location"),
    (("sasl_ssl://127.0.0.1:1/bootstrap: SASL authentication error: Authentication failed "
     "during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512"),
     ("authentication failed for SASL user 'alice' (SCRAM-SHA-512): check the password in "
     "kafka.sasl.jaas.config")),
], ids=["untrusted", "sasl"])
def test_a_refusal_no_retry_mends_fails_at_the_first_answer_naming_its_cause(text, cause):
    from confluent_kafka import KafkaError, KafkaException

    from kwatermark.broker import KafkaMetadata
    from kwatermark.options import parse_options
    from kwatermark.security import SCRAM_MODULE

    metadata = KafkaMetadata(parse_options({
        "kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t",
        "kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.jaas.config": f'{SCRAM_MODULE} required username="alice" '
                                  f'password="secret-9";'}))
    calls = []

    def refused(_timeout):
        calls.append(1)
        metadata._record_connection_error(KafkaError(KafkaError._AUTHENTICATION, text))
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "Broker transport failure"))

    with pytest.raises(BrokerError) as failure:
        metadata._retrying("listing topics", refused)
    message = str(failure.value)
    assert message.startswith(cause), message
    assert "is the address right" not in message and "secret-9" not in message
    assert calls == [1]


def test_a_listing_asks_again_only_for_the_partitions_not_answered_yet():
    """DESIGN §20: a partition answered with a transient error, or with no offset (-1001:
    its leader not ready), is asked again alone; the others' answers are kept."""
    from concurrent.futures import Future

    from confluent_kafka import KafkaError, KafkaException

    from kwatermark.broker import KafkaMetadata
    from kwatermark.options import parse_options

    class Answer:
        def __init__(self, offset):
            self.offset = offset

    class Admin:
        def __init__(self):
            self.asked = []
            self.answers = [{0: -1001, 1: 5, 2: KafkaError.NOT_LEADER_FOR_PARTITION},
                            {0: 7, 2: KafkaError.FENCED_LEADER_EPOCH}, {2: 9}]

        def list_offsets(self, specs, **_):
            self.asked.append(sorted(tp.partition for tp in specs))
            answer = self.answers.pop(0)
            futures = {}
            for tp in specs:
                future = Future()
                value = answer[tp.partition]
                if value in (KafkaError.NOT_LEADER_FOR_PARTITION,
                             KafkaError.FENCED_LEADER_EPOCH):
                    future.set_exception(KafkaException(KafkaError(value)))
                else:
                    future.set_result(Answer(value))
                futures[tp] = future
            return futures

        def poll(self, _):
            return 0

        def list_topics(self, topic=None, timeout=None):
            self.refreshed.append(topic)  # librdkafka's cached leader epochs renewed
            return described(topic, {p: 1 for p in range(3)})

    metadata = KafkaMetadata(parse_options({"kafka.bootstrap.servers": "127.0.0.1:1",
                                            "subscribe": "t"}))
    admin = Admin()
    admin.refreshed = []
    metadata._admin = admin
    assert metadata.latest_offsets([("t", 0), ("t", 1), ("t", 2)]) == {
        ("t", 0): 7, ("t", 1): 5, ("t", 2): 9}
    assert admin.asked == [[0, 1, 2], [0, 2], [2]]
    # refreshed after each failed attempt, and asked for the leaders before each retry
    assert admin.refreshed == ["t"] * 4


def described(topic: str, leaders: dict[int, int]):
    """A ClusterMetadata of one topic as confluent-kafka's AdminClient.list_topics gives it."""
    from types import SimpleNamespace
    partitions = {p: SimpleNamespace(id=p, leader=leader) for p, leader in leaders.items()}
    return SimpleNamespace(topics={topic: SimpleNamespace(partitions=partitions, error=None)})


def test_a_retried_listing_stops_waiting_for_a_leader_that_was_replaced():
    """DESIGN §20: librdkafka keeps a request queued for a leader that is down until the
    request's timeout, even once the controller has elected another. A retried listing
    notes the leaders and asks again as soon as one changes, without waiting out the
    request still queued for the dead one."""
    import threading
    from concurrent.futures import Future
    from types import SimpleNamespace

    from confluent_kafka import KafkaError, KafkaException

    from kwatermark.broker import KafkaMetadata
    from kwatermark.options import parse_options

    class Admin:
        def __init__(self):
            self.futures = []
            self.leader = 1

        def list_offsets(self, specs, request_timeout, **_):
            future = Future()
            if len(self.futures) == 0:
                future.set_exception(KafkaException(KafkaError(KafkaError._TRANSPORT)))
            elif len(self.futures) == 1:
                self.leader = 2       # elected while this request waits for node 1
                timer = threading.Timer(request_timeout, future.set_exception, [
                    KafkaException(KafkaError(KafkaError._TIMED_OUT))])  # as librdkafka
                timer.daemon = True
                timer.start()
            else:
                future.set_result(SimpleNamespace(offset=42))
            self.futures.append(future)
            return {tp: future for tp in specs}

        def poll(self, _):
            return 0

        def list_topics(self, topic=None, timeout=None):
            return described(topic, {0: self.leader})

    metadata = KafkaMetadata(parse_options({"kafka.bootstrap.servers": "127.0.0.1:1",
                                            "subscribe": "t"}))
    admin = Admin()
    metadata._admin = admin
    assert metadata.latest_offsets([("t", 0)]) == {("t", 0): 42}
    assert len(admin.futures) == 3
    assert not admin.futures[1].done()   # the request queued for node 1 was not waited out


def test_many_partitions_are_listed_in_one_consumer_call_and_the_rest_by_the_admin():
    """DESIGN §21: from QUICK_FROM partitions the end offsets come from one
    ``offsets_for_times`` call (no Python future per partition); a partition it does not
    answer cleanly (an error, or no offset yet) is asked through the admin client's
    retrying path, and the quick call rests after such an answer."""
    from concurrent.futures import Future
    from types import SimpleNamespace

    from confluent_kafka import KafkaError

    from kwatermark import broker
    from kwatermark.broker import KafkaMetadata
    from kwatermark.options import parse_options

    n = broker.QUICK_FROM
    answers = {p: (None, 100 + p) for p in range(n)}
    answers[3] = (KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION), -1)
    answers[5] = (None, -1001)

    class Consumer:
        calls = 0

        def offsets_for_times(self, tps, timeout):
            Consumer.calls += 1
            return [SimpleNamespace(topic=tp.topic, partition=tp.partition,
                                    error=answers[tp.partition][0],
                                    offset=answers[tp.partition][1]) for tp in tps]

    class Admin:
        def __init__(self):
            self.asked = []

        def list_offsets(self, specs, **_):
            self.asked.append(sorted(tp.partition for tp in specs))
            futures = {}
            for tp in specs:
                future = Future()
                future.set_result(SimpleNamespace(offset=100 + tp.partition))
                futures[tp] = future
            return futures

        def poll(self, _):
            return 0

    metadata = KafkaMetadata(parse_options({"kafka.bootstrap.servers": "127.0.0.1:1",
                                            "subscribe": "t"}))
    admin = Admin()
    metadata._admin, metadata._consumer, metadata._reached = admin, Consumer(), True
    tps = [("t", p) for p in range(n)]
    assert metadata.latest_offsets(tps) == {("t", p): 100 + p for p in range(n)}
    assert Consumer.calls == 1 and admin.asked == [[3, 5]]
    # resting after an incomplete answer: the next listing goes to the admin client alone
    assert metadata.latest_offsets(tps) == {("t", p): 100 + p for p in range(n)}
    assert Consumer.calls == 1 and admin.asked[-1] == list(range(n))


def test_a_task_asks_earliest_and_end_offsets_together_not_one_after_the_other():
    """A task's first fetch waits for one ListOffsets round trip, not two: both listings are
    in flight at once (each call here returns only once the other has been made)."""
    import threading
    from types import SimpleNamespace

    from confluent_kafka import OFFSET_BEGINNING

    from kwatermark.consumer import partition_bounds
    from kwatermark.offsets import PartitionState, RangeTask
    from kwatermark.options import parse_options
    from kwatermark.watermarks import NO_PARTITIONS

    both_asked = threading.Barrier(2, timeout=10)

    class Consumer:
        def offsets_for_times(self, tps, timeout):
            both_asked.wait()   # broken (an error) if the other listing never comes
            return [SimpleNamespace(topic=tp.topic, partition=tp.partition, error=None,
                                    offset=3 if tp.offset == OFFSET_BEGINNING else 40)
                    for tp in tps]

    options = parse_options({"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t"})
    tasks = [RangeTask("t", p, 5, 30, PartitionState(), True, None, NO_PARTITIONS)
             for p in (0, 1)]
    assert partition_bounds(Consumer(), options, tasks) == {("t", 0): (3, 40),
                                                            ("t", 1): (3, 40)}


def test_a_named_subscription_asks_for_its_own_topics_not_the_whole_cluster():
    """The whole cluster's metadata grows with every partition of every topic; a query that
    names its topics asks for those. A topic's own error (it does not exist, may not be
    described) leaves it out, as the full listing does; a request no broker answered is
    asked again. A pattern, or many names, still list the cluster."""
    from types import SimpleNamespace

    from confluent_kafka import KafkaError, KafkaException

    from kwatermark.broker import NAMED_METADATA_MAX, KafkaMetadata
    from kwatermark.options import parse_options

    errors = {"gone": KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART),
              "denied": KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)}

    class Admin:
        def __init__(self):
            self.asked = []

        def list_topics(self, topic=None, timeout=None):
            self.asked.append(topic)
            if len(self.asked) == 1:   # no broker answered the first request
                raise KafkaException(KafkaError(KafkaError._TRANSPORT))
            names = [topic] if topic else ["t", "other", "big"]
            return SimpleNamespace(topics={   # as AdminClient.list_topics answers
                name: SimpleNamespace(partitions=dict.fromkeys(range(3)),
                                      error=errors.get(name)) for name in names})

        def poll(self, _):
            return 0

    def topics(**options):
        metadata = KafkaMetadata(parse_options({"kafka.bootstrap.servers": "127.0.0.1:1",
                                                "fetchOffset.retryIntervalMs": "1",
                                                **options}))
        metadata._admin = Admin()
        return metadata.topics(), metadata._admin.asked

    assert topics(subscribe="t,gone,denied") == ({"t": 3}, ["denied", "denied", "gone", "t"])
    assert topics(subscribePattern="t") == ({"t": 3, "other": 3, "big": 3}, [None, None])
    many = ",".join(f"t{i}" for i in range(NAMED_METADATA_MAX + 1))
    assert topics(subscribe=many)[1] == [None, None]
