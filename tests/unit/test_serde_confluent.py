"""format=avro-confluent against a stand-in Schema Registry, with payloads written by
confluent-kafka's own AvroSerializer."""

from __future__ import annotations

import json
import pickle
import struct
from datetime import datetime, timezone

import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from kwatermark.serde import ConfluentAvroDeserializer, SerdeError, make_deserializer
from kwatermark.serde import registry as registry_module
from tests.support.registry import FakeSchemaRegistry

ORDER_V1 = {
    "type": "record", "name": "Order", "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "placed", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": [
            {"name": "name", "type": "string"},
            {"name": "vip", "type": "boolean"},
        ]}},
    ],
}
ORDER_V2 = {
    **ORDER_V1,
    "fields": [*ORDER_V1["fields"],
               {"name": "channel", "type": "string", "default": "web"},
               {"name": "coupon", "type": ["null", "string"], "default": None}],
}
ORDER_V2_TYPE = pa.struct([
    ("id", pa.int64()),
    ("placed", pa.timestamp("us", tz="UTC")),
    ("customer", pa.struct([("name", pa.string()), ("vip", pa.bool_())])),
    ("channel", pa.string()),
    ("coupon", pa.string()),
])
PLACED = datetime(2024, 5, 6, 7, 8, 9, 10000, tzinfo=timezone.utc)
SECRET = "s3cr3t-pa55"


@pytest.fixture(autouse=True)
def fresh_schema_cache():
    # The per-process schema cache is keyed by registry URL; a port reused by a later fake
    # registry must not see an earlier test's schemas.
    registry_module._SCHEMAS_BY_ID.clear()
    yield
    registry_module._SCHEMAS_BY_ID.clear()


@pytest.fixture
def registry():
    with FakeSchemaRegistry() as fake:
        yield fake


def produce(registry_url: str, schema: dict, value: dict, topic="orders", conf=None) -> bytes:
    """Frame ``value`` exactly as a confluent-kafka producer would (auto-registering)."""
    client = SchemaRegistryClient({"url": registry_url, **(conf or {})})
    serializer = AvroSerializer(client, json.dumps(schema))
    return serializer(value, SerializationContext(topic, MessageField.VALUE))


def order(i: int, **extra) -> dict:
    return {"id": i, "placed": PLACED, "customer": {"name": f"c{i}", "vip": i % 2 == 0}, **extra}


def options(url: str, **extra: str) -> dict[str, str]:
    return {"value.format": "avro-confluent", "value.schema.registry.url": url, **extra}


def test_decodes_records_framed_by_confluent_kafka(registry):
    payload = produce(registry.url, ORDER_V1, order(1))
    assert payload[0] == 0  # Confluent framing, written by confluent-kafka itself
    schema_id = struct.unpack(">I", payload[1:5])[0]
    deserializer = make_deserializer(
        "value", options(registry.url, **{"value.avro.schema": json.dumps(ORDER_V1)}))
    batch = deserializer.decode([payload, None])
    assert batch.errors == [None, None]
    assert batch.array.to_pylist() == [
        {"id": 1, "placed": PLACED, "customer": {"name": "c1", "vip": False}}, None]
    assert batch.values[0] == {"id": 1, "placed": PLACED, "customer": {"name": "c1", "vip": False}}
    assert registry.paths_for(schema_id) == [f"/schemas/ids/{schema_id}"]


def test_output_type_from_the_latest_subject_version_and_evolution(registry):
    old = produce(registry.url, ORDER_V1, order(1))
    new = produce(registry.url, ORDER_V2, order(2, channel="app", coupon="X1"))
    deserializer = make_deserializer(
        "value", options(registry.url, **{"value.schema.registry.subject": "orders-value"}))
    assert deserializer.arrow_type == ORDER_V2_TYPE
    batch = deserializer.decode([old, new, old])
    assert batch.errors == [None, None, None]
    assert batch.array.to_pylist() == [
        {"id": 1, "placed": PLACED, "customer": {"name": "c1", "vip": False},
         "channel": "web", "coupon": None},
        {"id": 2, "placed": PLACED, "customer": {"name": "c2", "vip": True},
         "channel": "app", "coupon": "X1"},
        {"id": 1, "placed": PLACED, "customer": {"name": "c1", "vip": False},
         "channel": "web", "coupon": None},
    ]


def test_reader_schema_option_wins_over_the_others(registry):
    payload = produce(registry.url, ORDER_V2, order(3, channel="shop"))
    reader = {"type": "record", "name": "Order", "namespace": "shop",
              "fields": [{"name": "id", "type": "long"}, {"name": "channel", "type": "string"}]}
    deserializer = make_deserializer("value", options(
        registry.url,
        **{"value.avro.readerSchema": json.dumps(reader),
           "value.avro.schema": json.dumps(ORDER_V1),
           "value.schema.registry.subject": "orders-value"}))
    assert deserializer.arrow_type == pa.struct([("id", pa.int64()), ("channel", pa.string())])
    assert deserializer.decode([payload]).array.to_pylist() == [{"id": 3, "channel": "shop"}]


def test_without_a_declared_type_the_error_lists_the_three_options(registry):
    with pytest.raises(SerdeError) as raised:
        make_deserializer("value", options(registry.url))
    message = str(raised.value)
    for option in ("value.avro.readerSchema", "value.avro.schema",
                   "value.schema.registry.subject"):
        assert option in message


def test_unknown_subject_names_the_option(registry):
    with pytest.raises(SerdeError) as raised:
        make_deserializer("key", {"key.format": "avro-confluent",
                                  "key.schema.registry.url": registry.url,
                                  "key.schema.registry.subject": "nope-key"})
    assert "key.schema.registry.subject" in str(raised.value)
    assert "nope-key" in str(raised.value)


def test_one_registry_request_per_schema_id(registry):
    v1 = [produce(registry.url, ORDER_V1, order(i)) for i in range(3)]
    v2 = [produce(registry.url, ORDER_V2, order(i)) for i in range(3)]
    id1, id2 = (struct.unpack(">I", p[1:5])[0] for p in (v1[0], v2[0]))
    assert id1 != id2
    deserializer = make_deserializer(
        "value", options(registry.url, **{"value.avro.readerSchema": json.dumps(ORDER_V2)}))
    payloads = (v1 + v2) * 200
    for _ in range(3):
        batch = deserializer.decode(payloads)
        assert not any(batch.errors)
    clone = pickle.loads(pickle.dumps(deserializer))
    assert not any(clone.decode(payloads).errors)
    assert registry.paths_for(id1) == [f"/schemas/ids/{id1}"]
    assert registry.paths_for(id2) == [f"/schemas/ids/{id2}"]


def test_unknown_schema_id_is_a_record_error_with_id_and_registry_message(registry):
    good = produce(registry.url, ORDER_V1, order(1))
    unknown = b"\x00" + struct.pack(">I", 4242) + good[5:]
    deserializer = make_deserializer(
        "value", options(registry.url, **{"value.avro.schema": json.dumps(ORDER_V1)}))
    batch = deserializer.decode([unknown, good, unknown])
    assert batch.array.to_pylist()[0] is None and batch.array.to_pylist()[2] is None
    assert batch.errors[1] is None
    assert "schema id 4242" in batch.errors[0]
    assert "Schema not found" in batch.errors[0]
    assert batch.errors[2] == batch.errors[0]
    # Within one batch the failing id is asked for once.
    assert registry.paths_for(4242) == ["/schemas/ids/4242"]


def test_corrupt_framing_and_bodies_fail_alone(registry):
    good = produce(registry.url, ORDER_V1, order(1))
    payloads = [
        good,
        b"\x01" + good[1:],  # wrong magic byte
        good[:3],  # shorter than the header
        good[:-4],  # truncated Avro body
        b"",
        good,
    ]
    deserializer = make_deserializer(
        "value", options(registry.url, **{"value.avro.schema": json.dumps(ORDER_V1)}))
    batch = deserializer.decode(payloads)
    expected = {"id": 1, "placed": PLACED, "customer": {"name": "c1", "vip": False}}
    assert batch.array.to_pylist() == [expected, None, None, None, None, expected]
    assert batch.errors[0] is None and batch.errors[5] is None
    assert batch.errors[1] == (
        "unknown magic byte 1: not in Confluent wire format (magic byte 0, 4-byte schema id)")
    assert batch.errors[2] == (
        "payload of 3 bytes is too short for Confluent wire format "
        "(magic byte 0, 4-byte schema id)")
    assert batch.errors[3].startswith(f"cannot decode Avro datum ({len(good) - 9} bytes)")
    assert batch.errors[4].startswith("payload of 0 bytes is too short")


def test_non_avro_schema_is_a_record_error(registry):
    schema_id = registry.register('{"type": "object"}', schema_type="JSON")
    payload = b"\x00" + struct.pack(">I", schema_id) + b"{}"
    deserializer = make_deserializer("value", options(registry.url,
                                                      **{"value.avro.schema": '"string"'}))
    error = deserializer.decode([payload]).errors[0]
    assert f"schema id {schema_id}" in error and "JSON" in error and "not Avro" in error


def test_schema_references_are_resolved(registry):
    customer = {"type": "record", "name": "Customer", "namespace": "shop",
                "fields": [{"name": "name", "type": "string"}]}
    registry.register(json.dumps(customer), subject="customer")
    order_schema = {"type": "record", "name": "Order", "namespace": "shop",
                    "fields": [{"name": "id", "type": "long"},
                               {"name": "customer", "type": "shop.Customer"}]}
    order_id = registry.register(
        json.dumps(order_schema), subject="orders-value",
        references=[{"name": "shop.Customer", "subject": "customer", "version": 1}])
    body = b"\x02\x06ada"  # id=1, customer.name="ada"
    deserializer = make_deserializer(
        "value", options(registry.url, **{"value.schema.registry.subject": "orders-value"}))
    assert deserializer.arrow_type == pa.struct(
        [("id", pa.int64()), ("customer", pa.struct([("name", pa.string())]))])
    batch = deserializer.decode([b"\x00" + struct.pack(">I", order_id) + body])
    assert batch.errors == [None]
    assert batch.array.to_pylist() == [{"id": 1, "customer": {"name": "ada"}}]


def test_basic_auth_and_secrets_never_leak():
    with FakeSchemaRegistry(basic_auth=("alice", SECRET)) as fake:
        auth = {"basic.auth.user.info": f"alice:{SECRET}"}
        good = produce(fake.url, ORDER_V1, order(1), conf=auth)
        unknown = b"\x00" + struct.pack(">I", 999) + good[5:]
        opts = options(fake.url, **{
            "value.avro.schema": json.dumps(ORDER_V1),
            "value.schema.registry.basic.auth.user.info": f"alice:{SECRET}"})
        deserializer = make_deserializer("value", opts)
        batch = deserializer.decode([good, unknown])
        assert batch.errors[0] is None
        assert "schema id 999" in batch.errors[1]

        wrong = make_deserializer("value", {**opts, "value.schema.registry.basic.auth.user.info":
                                            f"alice:{SECRET}-wrong"})
        denied = wrong.decode([good]).errors[0]
        assert "Unauthorized" in denied

        with pytest.raises(SerdeError) as raised:
            make_deserializer("value", {**opts, "value.schema.registry.no.such.setting": "1",
                                        "value.schema.registry.ssl.key.password": SECRET})
        assert "value.schema.registry." in str(raised.value)

        in_url = fake.url.replace("http://", f"http://alice:{SECRET}@")
        url_auth = make_deserializer("value", options(
            in_url, **{"value.avro.schema": json.dumps(ORDER_V1)}))
        url_error = url_auth.decode([unknown]).errors[0]
        assert "***@127.0.0.1" in url_error

        texts = [batch.errors[1], denied, str(raised.value), url_error,
                 repr(deserializer), repr(deserializer.registry), repr(url_auth),
                 repr(url_auth.registry)]
        for text in texts:
            assert SECRET not in text


def test_registry_settings_are_passed_to_the_client_with_numbers_converted(registry):
    deserializer = make_deserializer("value", options(
        registry.url, **{"value.avro.schema": '"long"',
                         "Value.Schema.Registry.Timeout": "5",
                         "value.schema.registry.max.retries": "0"}))
    client = deserializer.registry.client()
    assert client._rest_client.timeout == 5
    assert client._rest_client.max_retries == 0


def test_unreachable_registry_is_a_record_error(registry):
    payload = produce(registry.url, ORDER_V1, order(1))
    registry.close()
    deserializer = make_deserializer("value", options(
        registry.url, **{"value.avro.schema": json.dumps(ORDER_V1),
                         "value.schema.registry.max.retries": "0"}))
    error = deserializer.decode([payload]).errors[0]
    assert error.startswith("schema id 1 could not be fetched from the Schema Registry at "
                            f"{registry.url}")


def test_picklable_after_use_without_a_live_client(registry):
    payload = produce(registry.url, ORDER_V1, order(5))
    deserializer = make_deserializer(
        "value", options(registry.url, **{"value.schema.registry.subject": "orders-value"}))
    first = deserializer.decode([payload]).array.to_pylist()
    assert deserializer.registry._client is not None
    clone = pickle.loads(pickle.dumps(deserializer))
    assert isinstance(clone, ConfluentAvroDeserializer)
    assert clone.registry._client is None and clone._plans == {}
    assert clone.arrow_type == deserializer.arrow_type
    registry_module._SCHEMAS_BY_ID.clear()  # as in a fresh executor process
    assert clone.decode([payload]).array.to_pylist() == first


def test_the_default_subject_comes_from_exactly_one_topic():
    # Confluent's TopicNameStrategy needs one topic: subscribe or assign naming just one.
    from kwatermark.options import parse_options
    from kwatermark.source import _single_topic

    def topic(**subscription):
        return _single_topic(parse_options({"kafka.bootstrap.servers": "b:9092",
                                            **subscription}))

    assert topic(subscribe="orders") == "orders"
    assert topic(assign='{"orders": [0, 1]}') == "orders"
    assert topic(subscribe="orders,refunds") is None
    assert topic(assign='{"orders": [0], "refunds": [0]}') is None
    assert topic(subscribePattern="orders") is None
