"""Issue 37: Confluent-framed Avro, Protobuf and JSON Schema values against a real Schema
Registry (Apicurio, started by the ``schema_registry`` fixture) and a real broker, the data
written by confluent-kafka's own serializers."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from kwatermark.serde import make_deserializer
from tests.support.kafka import Record
from tests.support.protos import (
    ITEM_FILE,
    ORDER_WITH_IMPORT,
    ORDERS_V1,
    ORDERS_V2,
    file_messages,
    files_messages,
)
from tests.support.streams import (
    Batches,
    kwatermark_batch,
    kwatermark_stream,
    run_available_now,
    wm_ms,
)

BASE_MS = int(dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc).timestamp() * 1000)


def utc(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc)


def naive_utc(value: dt.datetime) -> dt.datetime:
    return value.replace(tzinfo=dt.timezone.utc) if value.tzinfo is None else value


def value_ctx(topic: str) -> SerializationContext:
    return SerializationContext(topic, MessageField.VALUE)


# -- Avro ---------------------------------------------------------------------------------

ORDER_V1 = {"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "long"},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}}]}
ORDER_V2 = {**ORDER_V1, "fields": [*ORDER_V1["fields"],
                                   {"name": "note", "type": "string", "default": "none"}]}
# Not BACKWARD compatible with V2: a reader of V3 cannot read V2 data ("qty" has no default).
ORDER_V3 = {**ORDER_V1, "fields": [*ORDER_V1["fields"], {"name": "qty", "type": "int"}]}


def test_avro_default_subject_reads_old_records_with_the_latest_schema_under_backward(
        spark, broker, topic_factory, schema_registry):
    writer = topic_factory(1)
    client = SchemaRegistryClient({"url": schema_registry.url})
    ctx = value_ctx(writer.topic)
    old = AvroSerializer(client, json.dumps(ORDER_V1))
    writer.send([Record(0, 0, old({"id": 1, "at": BASE_MS + 5_000}, ctx))])
    # Confluent's default compatibility, which Apicurio does not apply unless asked.
    schema_registry.set_compatibility("BACKWARD", f"{writer.topic}-value")
    with pytest.raises(SchemaRegistryError):  # the registry enforces it
        AvroSerializer(client, json.dumps(ORDER_V3))({"id": 9, "at": 0, "qty": 1}, ctx)
    new = AvroSerializer(client, json.dumps(ORDER_V2))
    writer.send([Record(0, 0, new({"id": 2, "at": BASE_MS + 3_000, "note": "n"}, ctx))])
    rows = kwatermark_batch(spark, broker, writer.topic,
                            **{"value.format": "avro-confluent",
                               "value.schema.registry.url": schema_registry.url,
                               "eventTime.field": "at"}).collect()
    # No reader schema given: the subject <topic>-value's latest (V2) types the column, and
    # the V1 record takes V2's default.
    assert [(r["value_decoded"]["id"], r["value_decoded"]["note"]) for r in rows] == [
        (1, "none"), (2, "n")]
    assert [naive_utc(r["event_time"]) for r in rows] == [utc(BASE_MS + 5_000),
                                                          utc(BASE_MS + 3_000)]


def test_avro_schema_references_resolve_through_the_real_registry(topic_factory,
                                                                 schema_registry):
    topic = topic_factory(1).topic
    client = SchemaRegistryClient({"url": schema_registry.url})
    customer = {"type": "record", "name": "Customer", "namespace": "shop",
                "fields": [{"name": "name", "type": "string"}]}
    client.register_schema(f"{topic}-customer", Schema(json.dumps(customer), "AVRO"))
    order = {"type": "record", "name": "Order", "namespace": "shop",
             "fields": [{"name": "id", "type": "long"},
                        {"name": "customer", "type": "shop.Customer"}]}
    order_id = client.register_schema(f"{topic}-value", Schema(
        json.dumps(order), "AVRO", [SchemaReference("shop.Customer", f"{topic}-customer", 1)]))
    decoder = make_deserializer("value", {"value.format": "avro-confluent",
                                          "value.schema.registry.url": schema_registry.url},
                                topic=topic)
    batch = decoder.decode([b"\x00" + order_id.to_bytes(4, "big") + b"\x02\x06ada"])
    assert (batch.array.to_pylist(), batch.errors) == (
        [{"id": 1, "customer": {"name": "ada"}}], [None])


# -- Protobuf -----------------------------------------------------------------------------

def protobuf_orders(topic: str, registry_url: str):
    """Two V1 orders, one Item (the same schema's second message), one V2 order: the
    subject's latest schema is V2."""
    client = SchemaRegistryClient({"url": registry_url})
    ctx = value_ctx(topic)
    v1, v2 = file_messages(ORDERS_V1), file_messages(ORDERS_V2)
    conf = {"use.deprecated.format": False}
    order_v1 = ProtobufSerializer(v1["Order"], client, conf)
    item = ProtobufSerializer(v1["Item"], client, conf)
    order_v2 = ProtobufSerializer(v2["Order"], client, conf)

    def order(cls, id_, at_ms, **fields):
        message = cls(id=id_, **fields)
        message.at.FromMilliseconds(at_ms)
        return message

    first = order(v1["Order"], 1, BASE_MS + 5_000, status=2, tags=["a", "b"])
    first.counts["x"] = 3
    first.item.sku = "s-1"
    first.item.price = 2.5
    return [
        Record(0, 0, order_v1(first, ctx)),
        Record(0, 0, order_v1(order(v1["Order"], 2, BASE_MS + 3_000), ctx)),
        Record(0, 0, item(v1["Item"](sku="lonely"), ctx)),
        Record(0, 0, order_v2(order(v2["Order"], 3, BASE_MS + 9_000, note="v2"), ctx)),
    ]


def test_protobuf_values_decode_to_sparks_types_with_evolution_and_event_time(
        spark, broker, topic_factory, schema_registry):
    writer = topic_factory(1)
    writer.send(protobuf_orders(writer.topic, schema_registry.url))
    frame = kwatermark_batch(spark, broker, writer.topic,
                             **{"value.format": "protobuf-confluent",
                                "value.schema.registry.url": schema_registry.url,
                                "value.onError": "null", "eventTime.field": "at"})
    decoded = frame.schema["value_decoded"].dataType.simpleString()
    # What Spark's from_protobuf gives for shop.Order (V2, the subject's latest).
    assert decoded == ("struct<id:bigint,at:timestamp,status:string,tags:array<string>,"
                       "counts:map<string,bigint>,item:struct<sku:string,price:double>,"
                       "note:string>")
    rows = frame.collect()
    values = [r["value_decoded"] for r in rows]
    assert values[0].asDict(recursive=True) == {
        "id": 1, "at": values[0]["at"], "status": "SHIPPED", "tags": ["a", "b"],
        "counts": {"x": 3}, "item": {"sku": "s-1", "price": 2.5}, "note": None}
    assert naive_utc(values[0]["at"]) == utc(BASE_MS + 5_000)
    # Unset proto3 scalars and messages are null, unset repeated fields empty (Spark's
    # from_protobuf without emit.default.values).
    assert (values[1]["id"], values[1]["status"], values[1]["tags"], values[1]["item"]) == (
        2, None, [], None)
    assert values[2] is None
    assert "shop.Item" in rows[2]["value_error"] and "shop.Order" in rows[2]["value_error"]
    assert (values[3]["id"], values[3]["note"]) == (3, "v2")
    assert [r["value_error"] for r in rows] == [None, None, rows[2]["value_error"], None]
    assert [naive_utc(r["event_time"]) for r in (rows[0], rows[1], rows[3])] == [
        utc(BASE_MS + 5_000), utc(BASE_MS + 3_000), utc(BASE_MS + 9_000)]


def test_protobuf_message_name_option_reads_the_other_message(
        spark, broker, topic_factory, schema_registry):
    writer = topic_factory(1)
    writer.send(protobuf_orders(writer.topic, schema_registry.url))
    rows = kwatermark_batch(spark, broker, writer.topic,
                            **{"value.format": "protobuf-confluent",
                               "value.schema.registry.url": schema_registry.url,
                               "value.protobuf.messageName": "shop.Item",
                               "value.onError": "null"}).collect()
    assert [r["value_decoded"] and r["value_decoded"].asDict() for r in rows] == [
        None, None, {"sku": "lonely", "price": None}, None]


def test_protobuf_record_of_another_message_fails_the_query_naming_its_offset(
        spark, broker, topic_factory, schema_registry):
    writer = topic_factory(1)
    writer.send(protobuf_orders(writer.topic, schema_registry.url))
    frame = kwatermark_batch(spark, broker, writer.topic,
                             **{"value.format": "protobuf-confluent",
                                "value.schema.registry.url": schema_registry.url})
    with pytest.raises(Exception, match=f"topic {writer.topic}, partition 0, offset 2: "
                                        f"cannot decode value: the record is a shop.Item"):
        frame.collect()


def test_protobuf_imports_registered_as_references_by_the_serializer(topic_factory,
                                                                    schema_registry):
    topic = topic_factory(1).topic
    client = SchemaRegistryClient({"url": schema_registry.url})
    messages = files_messages(ITEM_FILE, ORDER_WITH_IMPORT)
    order = messages["Order"](id=4)
    order.items.add(sku="a")
    order.items.add(sku="b")
    payload = ProtobufSerializer(messages["Order"], client, {"use.deprecated.format": False})(
        order, value_ctx(topic))
    assert client.get_latest_version(f"{topic}-value").schema.references  # not inlined
    decoder = make_deserializer("value", {"value.format": "protobuf-confluent",
                                          "value.schema.registry.url": schema_registry.url},
                                topic=topic)
    batch = decoder.decode([payload])
    assert (batch.array.to_pylist(), batch.errors) == (
        [{"id": 4, "items": [{"sku": "a"}, {"sku": "b"}]}], [None])


# -- JSON Schema --------------------------------------------------------------------------

EVENT_V1 = {"title": "Event", "type": "object", "properties": {
    "id": {"type": "integer"},
    "at": {"type": "string", "format": "date-time"},
    "tags": {"type": "array", "items": {"type": "string"}},
    "place": {"$ref": "#/definitions/Place"}},
    "required": ["id", "at"],
    "definitions": {"Place": {"type": "object", "properties": {
        "city": {"type": "string"}, "lat": {"type": "number"}}}}}
EVENT_V2 = {**EVENT_V1, "properties": {**EVENT_V1["properties"],
                                       "ok": {"type": ["null", "boolean"]}}}


def test_json_schema_values_drive_the_watermark_with_the_latest_schema(
        spark, broker, topic_factory, schema_registry, checkpoint):
    writer = topic_factory(2)
    client = SchemaRegistryClient({"url": schema_registry.url})
    ctx = value_ctx(writer.topic)
    v1 = JSONSerializer(json.dumps(EVENT_V1), client)
    options = {"value.format": "json-schema-confluent",
               "value.schema.registry.url": schema_registry.url,
               "value.onError": "null", "eventTime.field": "at"}
    writer.send([
        Record(0, 0, v1({"id": 1, "at": "2024-01-01T00:00:05Z", "tags": ["a"],
                         "place": {"city": "Oslo", "lat": 59.9}}, ctx)),
        Record(1, 0, v1({"id": 2, "at": "2024-01-01T00:00:03Z"}, ctx))])
    v2 = JSONSerializer(json.dumps(EVENT_V2), client)
    v2({"id": 0, "at": "2024-01-01T00:00:00Z"}, ctx)  # registers V2: the latest from now on
    assert kwatermark_batch(spark, broker, writer.topic, **options).schema[
        "value_decoded"].dataType.simpleString() == (
        "struct<id:bigint,at:timestamp,tags:array<string>,place:struct<city:string,"
        "lat:double>,ok:boolean>")
    frame, seen = kwatermark_stream(spark, broker, writer.topic, **options), Batches()
    run_available_now(frame, checkpoint, seen)
    writer.send([Record(0, 0, v2({"id": 3, "at": "2024-01-01T00:00:09Z", "ok": True}, ctx)),
                 Record(1, 0, b"\x00\x00\x00\x00\x01not json")])
    run_available_now(frame, checkpoint, seen)
    first, second = [sorted(batch, key=lambda r: (r["partition"], r["offset"]))
                     for batch in seen.batches()]
    decoded = [r["value_decoded"] and r["value_decoded"].asDict(recursive=True)
               for r in first + second]
    assert [d and (d["id"], d["tags"], d["place"], d["ok"]) for d in decoded] == [
        (1, ["a"], {"city": "Oslo", "lat": 59.9}, None), (2, None, None, None),
        (3, None, None, True), None]
    assert second[1]["value_error"] is not None
    assert [naive_utc(r["event_time"]) for r in first + second[:1]] == [
        utc(BASE_MS + 5_000), utc(BASE_MS + 3_000), utc(BASE_MS + 9_000)]
    # The per-partition watermark: partition 1's event time (3 s) holds it back.
    assert wm_ms(second[0]) == BASE_MS + 3_000 - 1
