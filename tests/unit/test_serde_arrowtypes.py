"""Avro schema -> Arrow type, as documented in docs/serde.md."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from kwatermark.serde import SerdeError, avro_to_arrow_type

UTC_MICROS = pa.timestamp("us", tz="UTC")


def record(*fields, name="R"):
    return {"type": "record", "name": name, "fields": [{"name": n, "type": t} for n, t in fields]}


@pytest.mark.parametrize("avro, arrow", [
    ("null", pa.null()),
    ("boolean", pa.bool_()),
    ("int", pa.int32()),
    ("long", pa.int64()),
    ("float", pa.float32()),
    ("double", pa.float64()),
    ("bytes", pa.binary()),
    ("string", pa.string()),
    ({"type": "enum", "name": "E", "symbols": ["A", "B"]}, pa.string()),
    ({"type": "fixed", "name": "F", "size": 4}, pa.binary()),
    ({"type": "array", "items": "int"}, pa.list_(pa.int32())),
    ({"type": "map", "values": "long"}, pa.map_(pa.string(), pa.int64())),
    ({"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2},
     pa.decimal128(9, 2)),
    ({"type": "fixed", "name": "D", "size": 10, "logicalType": "decimal", "precision": 20,
      "scale": 4}, pa.decimal128(20, 4)),
    ({"type": "bytes", "logicalType": "decimal", "precision": 5}, pa.decimal128(5, 0)),
    ({"type": "long", "logicalType": "timestamp-millis"}, UTC_MICROS),
    ({"type": "long", "logicalType": "timestamp-micros"}, UTC_MICROS),
    ({"type": "long", "logicalType": "local-timestamp-millis"}, pa.timestamp("us")),
    ({"type": "long", "logicalType": "local-timestamp-micros"}, pa.timestamp("us")),
    ({"type": "int", "logicalType": "date"}, pa.date32()),
    ({"type": "int", "logicalType": "time-millis"}, pa.time64("us")),
    ({"type": "long", "logicalType": "time-micros"}, pa.time64("us")),
    ({"type": "string", "logicalType": "uuid"}, pa.string()),
    # Logical types fastavro does not decode come back as their underlying type.
    ({"type": "long", "logicalType": "timestamp-nanos"}, pa.int64()),
    ({"type": "string", "logicalType": "made-up"}, pa.string()),
    (["null", "string"], pa.string()),
    (["double", "null"], pa.float64()),
    (["null"], pa.null()),
])
def test_type_mapping(avro, arrow):
    assert avro_to_arrow_type(avro) == arrow
    assert avro_to_arrow_type(record(("f", avro))) == pa.struct([pa.field("f", arrow)])


def test_records_become_structs_of_nullable_fields_in_order():
    schema = record(
        ("id", "long"),
        ("address", record(("city", "string"), ("zip", ["null", "string"]), name="Address")),
        ("tags", {"type": "array", "items": "string"}),
    )
    expected = pa.struct([
        pa.field("id", pa.int64(), nullable=True),
        pa.field("address", pa.struct([pa.field("city", pa.string()),
                                       pa.field("zip", pa.string())])),
        pa.field("tags", pa.list_(pa.string())),
    ])
    arrow_type = avro_to_arrow_type(json.dumps(schema))
    assert arrow_type == expected
    assert all(field.nullable for field in arrow_type)
    assert all(field.nullable for field in arrow_type.field("address").type)


def test_named_types_are_reused_by_name_and_namespace():
    schema = {
        "type": "record", "name": "Trip", "namespace": "travel",
        "fields": [
            {"name": "start", "type": {"type": "record", "name": "Point",
                                       "fields": [{"name": "x", "type": "double"}]}},
            {"name": "end", "type": "Point"},
            {"name": "kind", "type": {"type": "enum", "name": "Kind", "namespace": "other",
                                      "symbols": ["A"]}},
            {"name": "again", "type": "other.Kind"},
        ],
    }
    point = pa.struct([pa.field("x", pa.float64())])
    assert avro_to_arrow_type(schema) == pa.struct([
        ("start", point), ("end", point), ("kind", pa.string()), ("again", pa.string())])


def test_accepts_schema_json_text_and_bare_type_names():
    assert avro_to_arrow_type('{"type": "array", "items": "long"}') == pa.list_(pa.int64())
    assert avro_to_arrow_type('"string"') == pa.string()
    assert avro_to_arrow_type("boolean") == pa.bool_()


def test_unions_of_several_types_are_unsupported_and_say_where():
    schema = record(("payload", ["null", "int", "string"]))
    with pytest.raises(SerdeError) as raised:
        avro_to_arrow_type(schema)
    assert "unsupported" in str(raised.value)
    assert "payload" in str(raised.value)


def test_nested_union_error_gives_the_path():
    schema = record(("outer", record(("inner", ["int", "string"]), name="Inner")))
    with pytest.raises(SerdeError, match=r"outer\.inner"):
        avro_to_arrow_type(schema)


def test_recursive_types_are_rejected():
    schema = {"type": "record", "name": "Node", "fields": [
        {"name": "value", "type": "long"},
        {"name": "next", "type": ["null", "Node"]},
    ]}
    with pytest.raises(SerdeError, match="recursive"):
        avro_to_arrow_type(schema)


def test_decimals_wider_than_spark_are_rejected():
    schema = {"type": "bytes", "logicalType": "decimal", "precision": 39, "scale": 2}
    with pytest.raises(SerdeError, match="38"):
        avro_to_arrow_type(schema)


def test_invalid_schema_is_a_serde_error():
    with pytest.raises(SerdeError):
        avro_to_arrow_type({"type": "record", "name": "R", "fields": [{"name": "a"}]})
    with pytest.raises(SerdeError):
        avro_to_arrow_type("no-such-type")
