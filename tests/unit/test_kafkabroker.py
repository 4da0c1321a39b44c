"""kwatermark.kafkabroker: listeners added beside PLAINTEXT, and the KRaft cluster id."""

from __future__ import annotations

from kwatermark.kafkabroker import cluster_id, server_properties


def test_added_listeners_are_bound_advertised_and_mapped_and_plaintext_stays():
    props = server_properties(9092, 9093, "/tmp/d", {"sasl.enabled.mechanisms": "PLAIN"},
                              {"SECURE": ("SASL_SSL", 9094), "MTLS": ("SSL", 9095)})
    assert props["listeners"] == ("PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093,"
                                  "SECURE://127.0.0.1:9094,MTLS://127.0.0.1:9095")
    assert props["advertised.listeners"] == ("PLAINTEXT://127.0.0.1:9092,"
                                             "SECURE://127.0.0.1:9094,MTLS://127.0.0.1:9095")
    assert props["listener.security.protocol.map"] == (
        "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SECURE:SASL_SSL,MTLS:SSL")
    assert props["inter.broker.listener.name"] == "PLAINTEXT"
    assert props["sasl.enabled.mechanisms"] == "PLAIN"


def test_without_added_listeners_the_properties_are_unchanged():
    props = server_properties(9092, 9093, "/tmp/d")
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:9092"
    assert props["listener.security.protocol.map"] == "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"


def test_a_cluster_id_never_starts_with_a_dash_the_storage_tool_would_read_as_an_option():
    ids = [cluster_id() for _ in range(5000)]  # ~78 would start with "-" if drawn plainly
    assert all(len(i) == 22 and not i.startswith("-") for i in ids)
