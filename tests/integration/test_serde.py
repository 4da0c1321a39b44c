"""Issue 5: JSON, Avro and Confluent-framed Avro values against a real broker."""

from __future__ import annotations

import datetime as dt
import io
import json

import fastavro
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from tests.support.kafka import Record
from tests.support.streams import (
    Batches,
    kwatermark_batch,
    kwatermark_stream,
    run_available_now,
    wm_ms,
)

ORDER = {
    "type": "record", "name": "Order", "fields": [
        {"name": "id", "type": "long"},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "note", "type": ["null", "string"], "default": None},
    ]}


def avro_body(schema: dict, record: dict) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def utc(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc)


def test_json_values_with_event_time_from_a_field_drive_the_watermark(
        spark, broker, topic_factory, checkpoint):
    writer = topic_factory(2)
    frame = kwatermark_stream(spark, broker, writer.topic,
                              **{"value.format": "json",
                                 "value.json.schema": "id INT, at TIMESTAMP, tags ARRAY<STRING>",
                                 "eventTime.field": "at"})
    seen = Batches()
    # Kafka timestamps are 0: only the field can give these event times.
    writer.send([Record(0, 0, json.dumps({"id": 1, "at": "2024-01-01T00:00:05Z",
                                          "tags": ["a"]}).encode()),
                 Record(1, 0, json.dumps({"id": 2, "at": "2024-01-01T00:00:03Z"}).encode())])
    run_available_now(frame, checkpoint, seen)
    writer.send([Record(0, 0, json.dumps({"id": 3, "at": "2024-01-01T00:00:09Z"}).encode())])
    run_available_now(frame, checkpoint, seen)
    first, second = seen.batches()
    assert [(r["value_decoded"]["id"], r["value_decoded"]["tags"]) for r in first] == [
        (1, ["a"]), (2, None)]
    base = int(dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc).timestamp() * 1000)
    assert [wm_ms(r) for r in second] == [base + 3_000 - 1]


def test_avro_value_and_string_key_decoded(spark, broker, topic_factory):
    writer = topic_factory(1)
    writer.send([Record(0, 1_000, avro_body(ORDER, {"id": 7, "at": 1_700_000_000_123,
                                                    "note": "hi"}), key="ké".encode()),
                 Record(0, 2_000, avro_body(ORDER, {"id": 8, "at": 1_700_000_001_000,
                                                    "note": None}))])
    rows = kwatermark_batch(spark, broker, writer.topic,
                            **{"value.format": "avro", "key.format": "string",
                               "value.avro.schema": json.dumps(ORDER)}).collect()
    assert [r["key_decoded"] for r in rows] == ["ké", None]
    assert [(r["value_decoded"]["id"], r["value_decoded"]["note"]) for r in rows] == [
        (7, "hi"), (8, None)]
    assert rows[0]["value_decoded"]["at"].replace(tzinfo=dt.timezone.utc) == utc(
        1_700_000_000_123)


def test_confluent_avro_written_by_confluents_serializer_with_evolution(
        spark, broker, topic_factory, schema_registry):
    writer = topic_factory(1)
    old_schema = {"type": "record", "name": "Order", "fields": ORDER["fields"][:2]}
    client = SchemaRegistryClient({"url": schema_registry.url})
    serialize = AvroSerializer(client, json.dumps(old_schema))
    ctx = SerializationContext(writer.topic, MessageField.VALUE)
    writer.send([Record(0, 1_000, serialize({"id": i, "at": 1_000 * i}, ctx))
                 for i in range(1, 4)])
    rows = kwatermark_batch(spark, broker, writer.topic,
                            **{"value.format": "avro-confluent",
                               "value.schema.registry.url": schema_registry.url,
                               "value.avro.readerSchema": json.dumps(ORDER),
                               "eventTime.field": "at"}).collect()
    # Written with the old schema, read with the new one: the added field takes its default.
    assert [(r["value_decoded"]["id"], r["value_decoded"]["note"]) for r in rows] == [
        (1, None), (2, None), (3, None)]
    assert [r["event_time"].replace(tzinfo=dt.timezone.utc) for r in rows] == [
        utc(1_000), utc(2_000), utc(3_000)]


def corrupt_topic(topic_factory):
    writer = topic_factory(1)
    writer.send([Record(0, 1_000, avro_body(ORDER, {"id": 1, "at": 5, "note": None})),
                 Record(0, 2_000, b"\x02"),  # truncated: "at" and "note" are missing
                 Record(0, 3_000, avro_body(ORDER, {"id": 3, "at": 6, "note": None}))])
    return writer


def test_corrupt_record_fails_the_query_naming_its_location(spark, broker, topic_factory):
    writer = corrupt_topic(topic_factory)
    frame = kwatermark_batch(spark, broker, writer.topic,
                             **{"value.format": "avro", "value.avro.schema": json.dumps(ORDER)})
    with pytest.raises(Exception, match=f"topic {writer.topic}, partition 0, offset 1: "
                                        f"cannot decode value"):
        frame.collect()


def test_corrupt_record_with_on_error_null_yields_a_null_value_and_its_error(
        spark, broker, topic_factory):
    writer = corrupt_topic(topic_factory)
    rows = kwatermark_batch(spark, broker, writer.topic,
                            **{"value.format": "avro", "value.avro.schema": json.dumps(ORDER),
                               "value.onError": "null"}).collect()
    assert [r["value_decoded"] is None for r in rows] == [False, True, False]
    assert [r["value_error"] is None for r in rows] == [True, False, True]
    assert [r["value_decoded"]["id"] for r in rows if r["value_decoded"]] == [1, 3]
