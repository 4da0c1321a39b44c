"""Secured Apache Kafka read with Spark's own security options (DESIGN §18, issue 26).

One broker for the module (kwatermark.kafkabroker), started by the test with four listeners:

* PLAINTEXT (the super user ``User:ANONYMOUS``): the test's admin and producer, and the
  reference read every secured read is compared with;
* ``SASL``: SASL_SSL with PLAIN (users in the broker's JAAS) and SCRAM-SHA-512;
* ``MTLS``: SSL requiring a client certificate (principal = the certificate's CN);
* ``WRONGHOST``: SSL with a certificate for ``wrong.example``, not 127.0.0.1.

KRaft's StandardAuthorizer denies what no ACL allows: ``alice`` and ``reader`` may read every
topic, ``carol`` may only describe it, ``bob`` has nothing. Certificates and stores are made
here: a CA, the broker's certificate for 127.0.0.1 and localhost, client certificates; JKS and
PKCS12 truststores by keytool, a PKCS12 keystore by cryptography, a JKS one by keytool.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

from kwatermark.kafkabroker import ApacheKafka
from kwatermark.security import PLAIN_MODULE, SCRAM_MODULE
from tests.support.certs import (
    issue,
    make_ca,
    write_jks_keystore,
    write_keytool_truststore,
    write_pkcs12,
)
from tests.support.kafka import Record, TestBroker, TopicWriter
from tests.support.secrets import gather, leaks
from tests.support.sparkkafka import run_baseline
from tests.support.streams import kwatermark_batch, kwatermark_stream, run_available_now

PLAIN_PASSWORD = "Plain-Pa55-alice-4417"
SCRAM_PASSWORD = "Scram-Pa55-alice-9021"
STORE_PASSWORD = "Store-Pa55-8830"
KEY_PASSWORD = "Key-Pa55-6614"
BROKER_STORE_PASSWORD = "broker-store-pw"
SECRETS = (PLAIN_PASSWORD, SCRAM_PASSWORD, STORE_PASSWORD, KEY_PASSWORD)
# kwatermark's own bound: the attempts and budget its error reports (no timed assertion)
FAIL_FAST = {"kafkaConsumer.pollTimeoutMs": "4000", "fetchOffset.numRetries": "1"}

@dataclass
class Secured:
    kafka: ApacheKafka
    tmp: Path
    topic: str
    plaintext: TestBroker
    client_key_line: str  # a line of the client's private key PEM: must never be written

    def broker(self, listener: str) -> TestBroker:
        return TestBroker(self.kafka.address(listener), "kafka")

    def path(self, name: str) -> str:
        return str(self.tmp / name)


def jaas(module: str, user: str, password: str) -> str:
    return f'{module} required username="{user}" password="{password}";'


def sasl_options(mechanism: str, user: str, password: str, truststore: str = "trust.jks",
                 store_type: str = "JKS") -> dict[str, str]:
    """Spark's options for SASL_SSL: JAAS and a Java truststore."""
    module = PLAIN_MODULE if mechanism == "PLAIN" else SCRAM_MODULE
    return {"kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": mechanism,
            "kafka.sasl.jaas.config": jaas(module, user, password),
            "kafka.ssl.truststore.location": truststore,
            "kafka.ssl.truststore.password": STORE_PASSWORD,
            "kafka.ssl.truststore.type": store_type}


@pytest.fixture(scope="module")
def secured(tmp_path_factory) -> Secured:
    # Apache Kafka is started here whatever broker the other tests use (it needs java and
    # mvn, and says so); Tansu cannot serve TLS nor create a SASL user.
    tmp = tmp_path_factory.mktemp("security")
    ca, stranger = make_ca(), make_ca("a CA nobody trusts")
    write_pkcs12(tmp / "broker.p12", BROKER_STORE_PASSWORD,
                 issue(ca, "broker", ("localhost", "127.0.0.1")), (ca,))
    write_pkcs12(tmp / "wronghost.p12", BROKER_STORE_PASSWORD,
                 issue(ca, "broker", ("wrong.example",)), (ca,))
    (tmp / "ca.pem").write_text(ca.cert_pem())
    reader = issue(ca, "reader")
    write_keytool_truststore(tmp / "trust.jks", STORE_PASSWORD, ca, "JKS")
    write_keytool_truststore(tmp / "trust.p12", STORE_PASSWORD, ca, "PKCS12")
    write_keytool_truststore(tmp / "stranger.jks", STORE_PASSWORD, stranger, "JKS")
    write_pkcs12(tmp / "reader.p12", STORE_PASSWORD, reader, (ca,))
    write_jks_keystore(tmp / "reader.jks", STORE_PASSWORD, reader, ca, KEY_PASSWORD)
    store = {"type": "PKCS12", "location": str(tmp / "broker.p12"),
             "password": BROKER_STORE_PASSWORD}
    properties = {
        **{f"ssl.keystore.{k}": v for k, v in store.items()},
        **{f"listener.name.wronghost.ssl.keystore.{k}": v for k, v in store.items()},
        "listener.name.wronghost.ssl.keystore.location": str(tmp / "wronghost.p12"),
        "ssl.truststore.type": "PEM", "ssl.truststore.location": str(tmp / "ca.pem"),
        "listener.name.mtls.ssl.client.auth": "required",
        "ssl.principal.mapping.rules": "RULE:^CN=([^,]*)$/$1/,DEFAULT",
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
        "listener.name.sasl.plain.sasl.jaas.config":
            f'{PLAIN_MODULE} required user_alice="{PLAIN_PASSWORD}" user_bob="bob-pw" '
            f'user_carol="carol-pw";',
        "listener.name.sasl.scram-sha-512.sasl.jaas.config": f"{SCRAM_MODULE} required;",
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:ANONYMOUS",  # PLAINTEXT: the broker itself and the test
        "allow.everyone.if.no.acl.found": "false",
    }
    kafka = ApacheKafka.start(properties=properties,
                              scram_users=[("SCRAM-SHA-512", "alice", SCRAM_PASSWORD)],
                              listeners={"SASL": "SASL_SSL", "MTLS": "SSL",
                                         "WRONGHOST": "SSL"})
    plaintext = TestBroker(kafka.bootstrap_servers, "kafka")
    grants = [("alice", ResourceType.TOPIC, AclOperation.READ),
              ("reader", ResourceType.TOPIC, AclOperation.READ),
              ("carol", ResourceType.TOPIC, AclOperation.DESCRIBE)]
    admin = plaintext.admin()
    for future in admin.create_acls([
            AclBinding(kind, "*", ResourcePatternType.LITERAL, f"User:{user}", "*", operation,
                       AclPermissionType.ALLOW) for user, kind, operation in grants]).values():
        future.result(30)
    writer = TopicWriter(plaintext, plaintext.create_topic(3))
    writer.send([Record(i % 3, 1_000 * i, f"v{i}".encode(), f"k{i}".encode())
                 for i in range(30)])
    yield Secured(kafka, tmp, writer.topic, plaintext, reader.key_pem().splitlines()[1])
    kafka.stop()


def rows(frame) -> list[tuple]:
    return sorted((r["topic"], r["partition"], r["offset"], r["key"], r["value"],
                   r["timestamp"]) for r in frame.collect())


@pytest.fixture(scope="module")
def reference(spark, secured) -> list[tuple]:
    """What a PLAINTEXT read of the topic returns."""
    found = rows(kwatermark_batch(spark, secured.plaintext, secured.topic))
    assert len(found) == 30
    return found


def in_tmp(secured: Secured, options: dict[str, str]) -> dict[str, str]:
    """Store file names made absolute under the fixture's directory."""
    return {k: (secured.path(v) if k.endswith(".location") else v) for k, v in options.items()}


# -- reads ------------------------------------------------------------------------------------

@pytest.mark.parametrize("mechanism, password, truststore, store_type", [
    ("PLAIN", PLAIN_PASSWORD, "trust.jks", "JKS"),
    ("SCRAM-SHA-512", SCRAM_PASSWORD, "trust.p12", "PKCS12"),
], ids=["PLAIN-JKS", "SCRAM-SHA-512-PKCS12"])
def test_sasl_ssl_batch_with_jaas_and_a_java_truststore_reads_what_plaintext_reads(
        spark, secured, reference, mechanism, password, truststore, store_type):
    options = in_tmp(secured, sasl_options(mechanism, "alice", password, truststore,
                                           store_type))
    assert rows(kwatermark_batch(spark, secured.broker("SASL"), secured.topic,
                                 **options)) == reference


@pytest.mark.parametrize("keystore, store_type", [("reader.jks", "JKS"),
                                                  ("reader.p12", "PKCS12")])
def test_mtls_batch_with_a_java_keystore_reads_what_plaintext_reads(
        spark, secured, reference, keystore, store_type, capfd, request):
    options = {"kafka.security.protocol": "SSL",
               "kafka.ssl.truststore.location": secured.path("trust.jks"),
               "kafka.ssl.truststore.password": STORE_PASSWORD,
               "kafka.ssl.keystore.location": secured.path(keystore),
               "kafka.ssl.keystore.type": store_type,
               "kafka.ssl.keystore.password": STORE_PASSWORD}
    if store_type == "JKS":
        options["kafka.ssl.key.password"] = KEY_PASSWORD
    frame = kwatermark_batch(spark, secured.broker("MTLS"), secured.topic, **options)
    assert rows(frame) == reference
    frame.explain(extended=True)
    places = gather([], {}, capfd, request)
    for secret in (*SECRETS, secured.client_key_line):
        assert leaks(secret, places) == [], secret


def test_scram_stream_reads_what_plaintext_reads_and_no_secret_is_written_anywhere(
        spark, secured, reference, tmp_path, capfd, request):
    checkpoint, ledger = tmp_path / "ckpt", tmp_path / "ledger"
    options = in_tmp(secured, sasl_options("SCRAM-SHA-512", "alice", SCRAM_PASSWORD,
                                           "trust.p12", "PKCS12"))
    frame = kwatermark_stream(spark, secured.broker("SASL"), secured.topic, **options,
                              **{"watermark.stateLocation": str(ledger)})
    batches, query = run_available_now(frame, str(checkpoint))
    assert sorted((r["topic"], r["partition"], r["offset"], r["key"], r["value"],
                   r["timestamp"]) for r in batches.rows) == reference
    frame.explain(extended=True)  # the plan, with its options, goes to stdout
    places = gather([checkpoint, ledger], {
        "lastProgress": json.dumps(query.lastProgress, default=str),
        "recentProgress": json.dumps(query.recentProgress, default=str)}, capfd, request)
    assert str(checkpoint / "metadata") in places and "stdout" in places
    for secret in SECRETS:
        assert leaks(secret, places) == [], secret


# -- failures ---------------------------------------------------------------------------------

def failure_of(spark, broker: TestBroker, topic: str, options: dict[str, str]) -> str:
    with pytest.raises(Exception) as failure:
        kwatermark_batch(spark, broker, topic, **options, **FAIL_FAST).collect()
    message = str(failure.value)
    for secret in SECRETS:
        assert secret not in message
    return message


# A definitive refusal fails at the broker's first answer (issue 33), not after the retries
# of a wrong address (15 s). Spark's own planning of the read is included: the bound is
# generous for a loaded machine, and still below the 15 s the retries took.
REFUSED_WITHIN_S = 10.0


def refusal_of(spark, broker: TestBroker, topic: str, options: dict[str, str]
               ) -> tuple[str, float]:
    """kwatermark's own line of the failure (its message: the cause first) and the seconds
    from the read's start to the failure, with the default retry options. Ask for the
    ``reference`` fixture: Spark's first read of a session starts its Python workers."""
    frame = kwatermark_batch(spark, broker, topic, **options)
    started = time.monotonic()
    with pytest.raises(Exception) as failure:
        frame.collect()
    elapsed = time.monotonic() - started
    message = str(failure.value)
    for secret in SECRETS:
        assert secret not in message
    assert "is the address right" not in message, message
    line = next((line for line in message.splitlines() if "kwatermark.errors." in line),
                message)
    return line.split("Error: ", 1)[-1], elapsed


@pytest.mark.parametrize("mechanism, password", [("PLAIN", PLAIN_PASSWORD),
                                                 ("SCRAM-SHA-512", SCRAM_PASSWORD)])
def test_a_wrong_password_fails_at_the_first_answer_naming_the_user_and_the_option(
        spark, secured, reference, mechanism, password):
    broker = secured.broker("SASL")
    cause, elapsed = refusal_of(spark, broker, secured.topic, in_tmp(
        secured, sasl_options(mechanism, "alice", "not-" + password)))
    assert cause.startswith(f"authentication failed for SASL user 'alice' ({mechanism}): "
                            f"check the password in kafka.sasl.jaas.config"), cause
    assert f"kafka.bootstrap.servers='{broker.bootstrap_servers}'" in cause
    assert elapsed < REFUSED_WITHIN_S, (elapsed, cause)


def test_an_untrusted_broker_certificate_fails_at_once_naming_the_truststore(
        spark, secured, reference):
    broker = secured.broker("MTLS")
    cause, elapsed = refusal_of(spark, broker, secured.topic, {
        "kafka.security.protocol": "SSL",
        "kafka.ssl.truststore.location": secured.path("stranger.jks"),
        "kafka.ssl.truststore.password": STORE_PASSWORD,
        "kafka.ssl.keystore.location": secured.path("reader.p12"),
        "kafka.ssl.keystore.type": "PKCS12", "kafka.ssl.keystore.password": STORE_PASSWORD})
    assert cause.startswith("the broker's certificate is not signed by a CA in "
                            "kafka.ssl.truststore.location (self-signed certificate in "
                            "certificate chain)"), cause
    assert f"kafka.bootstrap.servers='{broker.bootstrap_servers}'" in cause
    assert elapsed < REFUSED_WITHIN_S, (elapsed, cause)


def test_a_hostname_mismatch_fails_at_once_and_an_empty_endpoint_algorithm_accepts_it(
        spark, secured, reference):
    broker = secured.broker("WRONGHOST")
    trust = {"kafka.security.protocol": "SSL",
             "kafka.ssl.truststore.location": secured.path("trust.jks"),
             "kafka.ssl.truststore.password": STORE_PASSWORD}
    cause, elapsed = refusal_of(spark, broker, secured.topic, trust)
    assert cause.startswith("the broker's certificate is not valid for host 127.0.0.1: use a "
                            "name in its certificate in kafka.bootstrap.servers (or set "
                            "kafka.ssl.endpoint.identification.algorithm to empty)"), cause
    assert elapsed < REFUSED_WITHIN_S, (elapsed, cause)
    # Same CA, same listener: only the host name was wrong. Spark's "" turns the check off.
    unchecked = {**trust, "kafka.ssl.endpoint.identification.algorithm": ""}
    assert rows(kwatermark_batch(spark, broker, secured.topic, **unchecked)) == reference


def test_a_listener_wanting_a_client_certificate_says_so(spark, secured, reference):
    broker = secured.broker("MTLS")
    cause, elapsed = refusal_of(spark, broker, secured.topic, {
        "kafka.security.protocol": "SSL",
        "kafka.ssl.truststore.location": secured.path("trust.jks"),
        "kafka.ssl.truststore.password": STORE_PASSWORD})
    assert cause.startswith("the listener wants a client certificate: set "
                            "kafka.ssl.keystore.location"), cause
    assert elapsed < REFUSED_WITHIN_S, (elapsed, cause)


def test_a_wrong_key_password_is_named_as_the_key_password(spark, secured):
    """The store opens with kafka.ssl.keystore.password; its key does not with
    kafka.ssl.key.password."""
    broker = secured.broker("MTLS")
    with pytest.raises(Exception) as failure:
        kwatermark_batch(spark, broker, secured.topic, **{
            "kafka.security.protocol": "SSL",
            "kafka.ssl.truststore.location": secured.path("trust.jks"),
            "kafka.ssl.truststore.password": STORE_PASSWORD,
            "kafka.ssl.keystore.location": secured.path("reader.jks"),
            "kafka.ssl.keystore.password": STORE_PASSWORD,
            "kafka.ssl.key.password": "not-" + KEY_PASSWORD}).collect()
    message = str(failure.value)
    for secret in SECRETS:
        assert secret not in message
    assert (f"option kafka.ssl.key.password: the key in {secured.path('reader.jks')!r} does "
            f"not open with it (kafka.ssl.keystore.password opened the store)") in message, \
        message


# -- authorization ----------------------------------------------------------------------------

@pytest.mark.parametrize("user, password", [("bob", "bob-pw"), ("carol", "carol-pw")],
                         ids=["no-ACL", "DESCRIBE-only"])
def test_a_user_without_read_on_the_topic_fails_naming_the_topic_and_the_principal(
        spark, secured, user, password):
    """bob may not even see the topic (Kafka then answers as if it did not exist); carol sees
    it but may not read it."""
    broker = secured.broker("SASL")
    message = failure_of(spark, broker, secured.topic,
                         in_tmp(secured, sasl_options("PLAIN", user, password)))
    assert secured.topic in message and "not authorized" in message.lower()
    assert f"SASL user '{user}'" in message
    assert f"kafka.bootstrap.servers='{broker.bootstrap_servers}'" in message


# -- the drop-in proof ------------------------------------------------------------------------

def test_spark_kafka_source_reads_the_same_rows_with_the_same_options(secured, reference):
    """Spark's own format("kafka") (pyspark 4.2.0 with spark-sql-kafka, the newest Maven
    Central serves) and kwatermark, given the same Spark-style options, read what PLAINTEXT
    reads: SASL_SSL PLAIN with a JKS truststore, SCRAM-SHA-512 with a PKCS12 one, and mTLS
    with a JKS keystore whose key has its own password."""
    mtls = {"kafka.security.protocol": "SSL",
            "kafka.ssl.truststore.location": secured.path("trust.jks"),
            "kafka.ssl.truststore.password": STORE_PASSWORD,
            "kafka.ssl.keystore.location": secured.path("reader.jks"),
            "kafka.ssl.keystore.password": STORE_PASSWORD,
            "kafka.ssl.key.password": KEY_PASSWORD}
    cases = [
        {"name": "SASL_SSL PLAIN", "bootstrap": secured.kafka.address("SASL"),
         "options": in_tmp(secured, sasl_options("PLAIN", "alice", PLAIN_PASSWORD))},
        {"name": "SASL_SSL SCRAM-SHA-512", "bootstrap": secured.kafka.address("SASL"),
         "options": in_tmp(secured, sasl_options("SCRAM-SHA-512", "alice", SCRAM_PASSWORD,
                                                 "trust.p12", "PKCS12"))},
        {"name": "mTLS", "bootstrap": secured.kafka.address("MTLS"), "options": mtls},
    ]
    answer = run_baseline(Path(__file__).with_name("security_dropin_child.py"),
                          {"topic": secured.topic, "cases": cases})
    expected = [[t, p, o, k.hex(), v.hex(), ts.isoformat()] for t, p, o, k, v, ts in reference]
    for case in cases:
        assert answer[case["name"]] == {"kafka": expected, "kwatermark": expected}, case["name"]


def test_a_stream_without_access_to_its_topic_fails_instead_of_waiting_for_it(
        spark, secured, tmp_path):
    """A topic bob may not describe looks missing; a stream waits for a missing topic, but
    must not wait for one it is refused."""
    frame = kwatermark_stream(spark, secured.broker("SASL"), secured.topic, **FAIL_FAST,
                              **in_tmp(secured, sasl_options("PLAIN", "bob", "bob-pw")))
    with pytest.raises(Exception) as failure:
        run_available_now(frame, str(tmp_path / "ckpt"))
    message = str(failure.value)
    assert f"topic {secured.topic}: not authorized for the SASL user 'bob' (PLAIN)" in message


def test_a_consumer_group_needs_no_acl(spark, secured, reference):
    """No ACL names a group on this broker: kwatermark's consumers are assigned their
    partitions and commit nothing, so kafka.group.id is never checked (as with Spark's
    source), and a user with READ on the topic reads."""
    options = in_tmp(secured, sasl_options("SCRAM-SHA-512", "alice", SCRAM_PASSWORD))
    assert rows(kwatermark_batch(spark, secured.broker("SASL"), secured.topic,
                                 **options, **{"kafka.group.id": "no-acl-names-me"})
                ) == reference
