"""format=avro: schemaless Avro bodies with a schema given in the options."""

from __future__ import annotations

import gc
import io
import json
import pickle
from datetime import date, datetime, time, timezone
from decimal import Decimal

import fastavro
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kwatermark.serde import AvroDeserializer, SerdeError, make_deserializer

EVERY_TYPE = {
    "type": "record",
    "name": "Everything",
    "namespace": "test.serde",
    "fields": [
        {"name": "flag", "type": "boolean"},
        {"name": "small", "type": "int"},
        {"name": "big", "type": "long"},
        {"name": "ratio", "type": "float"},
        {"name": "score", "type": "double"},
        {"name": "name", "type": "string"},
        {"name": "blob", "type": "bytes"},
        {"name": "colour", "type": {"type": "enum", "name": "Colour",
                                    "symbols": ["RED", "GREEN"]}},
        {"name": "hash", "type": {"type": "fixed", "name": "Hash4", "size": 4}},
        {"name": "counts", "type": {"type": "array", "items": "int"}},
        {"name": "labels", "type": {"type": "map", "values": "long"}},
        {"name": "address", "type": {"type": "record", "name": "Address", "fields": [
            {"name": "city", "type": "string"},
            {"name": "zip", "type": ["null", "string"]},
        ]}},
        {"name": "maybe", "type": ["null", "string"]},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal",
                                   "precision": 9, "scale": 2}},
        {"name": "wide", "type": {"type": "fixed", "name": "Wide", "size": 10,
                                  "logicalType": "decimal", "precision": 20, "scale": 4}},
        {"name": "ts_ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "ts_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "local_ms", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
        {"name": "local_us", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "t_ms", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "t_us", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
    ],
}

EVERY_VALUE = {
    "flag": True,
    "small": -7,
    "big": 9_000_000_000,
    "ratio": 1.5,
    "score": -2.25,
    "name": "héllo",
    "blob": b"\x00\x01",
    "colour": "GREEN",
    "hash": b"abcd",
    "counts": [1, 2, 3],
    "labels": {"a": 1, "b": 2},
    "address": {"city": "Lyon", "zip": None},
    "maybe": "here",
    "price": Decimal("1234.56"),
    "wide": Decimal("-12345678.9012"),
    "ts_ms": datetime(2024, 3, 1, 12, 30, 45, 123000, tzinfo=timezone.utc),
    "ts_us": datetime(2024, 3, 1, 12, 30, 45, 123456, tzinfo=timezone.utc),
    "local_ms": datetime(2024, 3, 1, 12, 30, 45, 123000),
    "local_us": datetime(2024, 3, 1, 12, 30, 45, 123456),
    "day": date(2024, 2, 29),
    "t_ms": time(12, 30, 45, 123000),
    "t_us": time(1, 2, 3, 456789),
    "id": "12345678-1234-5678-1234-567812345678",
}

EVERY_ARROW_TYPE = pa.struct([
    ("flag", pa.bool_()),
    ("small", pa.int32()),
    ("big", pa.int64()),
    ("ratio", pa.float32()),
    ("score", pa.float64()),
    ("name", pa.string()),
    ("blob", pa.binary()),
    ("colour", pa.string()),
    ("hash", pa.binary()),
    ("counts", pa.list_(pa.int32())),
    ("labels", pa.map_(pa.string(), pa.int64())),
    ("address", pa.struct([("city", pa.string()), ("zip", pa.string())])),
    ("maybe", pa.string()),
    ("price", pa.decimal128(9, 2)),
    ("wide", pa.decimal128(20, 4)),
    ("ts_ms", pa.timestamp("us", tz="UTC")),
    ("ts_us", pa.timestamp("us", tz="UTC")),
    ("local_ms", pa.timestamp("us")),
    ("local_us", pa.timestamp("us")),
    ("day", pa.date32()),
    ("t_ms", pa.time64("us")),
    ("t_us", pa.time64("us")),
    ("id", pa.string()),
])


def avro_body(schema, value) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), value)
    return out.getvalue()


def avro_options(writer, reader=None, role="value") -> dict[str, str]:
    options = {f"{role}.format": "avro", f"{role}.avro.schema": json.dumps(writer)}
    if reader is not None:
        options[f"{role}.avro.readerSchema"] = json.dumps(reader)
    return options


def test_every_type_decodes_to_python_and_arrow():
    deserializer = make_deserializer("value", avro_options(EVERY_TYPE))
    assert deserializer.arrow_type == EVERY_ARROW_TYPE
    batch = deserializer.decode([avro_body(EVERY_TYPE, EVERY_VALUE), None])

    assert batch.errors == [None, None]
    assert batch.array.type == EVERY_ARROW_TYPE
    row = batch.array.to_pylist()[0]
    assert batch.array.to_pylist()[1] is None
    assert row == {
        **EVERY_VALUE,
        "labels": [("a", 1), ("b", 2)],  # Arrow maps come back as key/value pairs
        "ts_ms": datetime(2024, 3, 1, 12, 30, 45, 123000, tzinfo=timezone.utc),
    }
    assert row["ts_us"].utcoffset().total_seconds() == 0
    assert row["local_us"].tzinfo is None
    # The Python values are fastavro's own (maps as dicts, uuid as text).
    assert batch.values[0]["labels"] == {"a": 1, "b": 2}
    assert batch.values[0]["id"] == "12345678-1234-5678-1234-567812345678"
    assert batch.values[1] is None


def test_primitive_top_level_schema():
    deserializer = make_deserializer("key", avro_options("long", role="key"))
    batch = deserializer.decode([avro_body("long", 42), avro_body("long", -1)])
    assert batch.array.type == pa.int64()
    assert batch.array.to_pylist() == [42, -1]
    assert batch.values == [42, -1]


def test_schema_evolution_with_reader_schema_defaults_and_promotion():
    writer = {"type": "record", "name": "User", "fields": [
        {"name": "id", "type": "int"},
        {"name": "name", "type": "string"},
        {"name": "dropped", "type": "string"},
    ]}
    reader = {"type": "record", "name": "User", "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": "string"},
        {"name": "country", "type": "string", "default": "FR"},
        {"name": "nickname", "type": ["null", "string"], "default": None},
    ]}
    deserializer = make_deserializer("value", avro_options(writer, reader))
    assert deserializer.arrow_type == pa.struct([
        ("id", pa.int64()), ("name", pa.string()), ("country", pa.string()),
        ("nickname", pa.string())])
    body = avro_body(writer, {"id": 5, "name": "ada", "dropped": "x"})
    batch = deserializer.decode([body])
    assert batch.errors == [None]
    assert batch.array.to_pylist() == [
        {"id": 5, "name": "ada", "country": "FR", "nickname": None}]


def test_incompatible_reader_schema_is_a_record_error():
    writer = {"type": "record", "name": "User", "fields": [{"name": "id", "type": "int"}]}
    reader = {"type": "record", "name": "User", "fields": [
        {"name": "id", "type": "int"}, {"name": "required", "type": "string"}]}
    batch = make_deserializer("value", avro_options(writer, reader)).decode(
        [avro_body(writer, {"id": 1})])
    assert batch.array.to_pylist() == [None]
    assert "required" in batch.errors[0]


def test_corrupt_bodies_fail_alone_and_good_neighbours_decode():
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "text", "type": "string"}, {"name": "n", "type": "long"}]}
    good = avro_body(schema, {"text": "hello", "n": 3})
    other = avro_body(schema, {"text": "bye", "n": -4})
    truncated = good[:4]
    batch = make_deserializer("value", avro_options(schema)).decode(
        [good, truncated, other, b"", None, good])
    assert batch.array.to_pylist() == [
        {"text": "hello", "n": 3}, None, {"text": "bye", "n": -4}, None, None,
        {"text": "hello", "n": 3}]
    assert [e is None for e in batch.errors] == [True, False, True, False, True, True]
    assert batch.errors[1].startswith("cannot decode Avro datum (4 bytes)")
    assert batch.errors[3].startswith("cannot decode Avro datum (0 bytes)")


def test_record_error_does_not_depend_on_the_neighbours():
    schema = {"type": "record", "name": "R", "fields": [{"name": "text", "type": "string"}]}
    good = avro_body(schema, {"text": "a long enough text"})
    truncated = good[:6]
    deserializer = make_deserializer("value", avro_options(schema))
    alone = deserializer.decode([truncated]).errors[0]
    assert alone is not None
    assert deserializer.decode([truncated, good]).errors[0] == alone
    assert deserializer.decode([good, truncated, good, good]).errors[1] == alone


def test_value_outside_the_arrow_type_is_a_record_error():
    schema = {"type": "bytes", "logicalType": "decimal", "precision": 4, "scale": 2}
    too_wide = avro_body("bytes", (12345678).to_bytes(4, "big", signed=True))  # 123456.78
    fits = avro_body("bytes", (1234).to_bytes(2, "big", signed=True))  # 12.34
    batch = make_deserializer("value", avro_options(schema)).decode([fits, too_wide])
    assert batch.array.to_pylist() == [Decimal("12.34"), None]
    assert batch.errors[0] is None
    assert batch.errors[1].startswith("decoded value does not fit decimal128(4, 2)")
    assert batch.values[1] is None


def test_bad_schema_json_names_the_option():
    with pytest.raises(SerdeError, match=r"value\.avro\.schema: not valid JSON"):
        make_deserializer("value", {"value.format": "avro", "value.avro.schema": "{nope"})
    with pytest.raises(SerdeError, match=r"value\.avro\.readerSchema: not valid JSON"):
        make_deserializer("value", {"value.format": "avro", "value.avro.schema": '"long"',
                                    "value.avro.readerSchema": "{nope"})


def test_invalid_avro_schema_names_the_option():
    with pytest.raises(SerdeError, match=r"key\.avro\.schema: not a valid Avro schema"):
        make_deserializer("key", {"key.format": "avro", "key.avro.schema": '{"type": "nope"}'})


def test_reader_schema_option_name_is_case_insensitive():
    options = {"value.format": "avro", "value.avro.schema": '"int"',
               "VALUE.AVRO.READERSCHEMA": '"long"'}
    assert make_deserializer("value", options).arrow_type == pa.int64()


def test_picklable_after_use():
    deserializer = make_deserializer("value", avro_options(EVERY_TYPE))
    body = avro_body(EVERY_TYPE, EVERY_VALUE)
    first = deserializer.decode([body])
    clone = pickle.loads(pickle.dumps(deserializer))
    assert isinstance(clone, AvroDeserializer)
    assert clone.arrow_type == EVERY_ARROW_TYPE
    assert clone.decode([body]).array.to_pylist() == first.array.to_pylist()


def test_decode_values_skips_arrow():
    deserializer = make_deserializer("value", avro_options("string"))
    values, errors = deserializer.decode_values([avro_body("string", "x"), None, b"\x05"])
    assert values == ["x", None, None]
    assert errors[:2] == [None, None] and errors[2] is not None


LIST_SCHEMA = {"type": "record", "name": "Row", "fields": [
    {"name": "n", "type": "long"}, {"name": "words", "type": {"type": "array", "items": "string"}}]}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(
    st.none(),
    st.tuples(st.just("good"), st.integers(-2**63, 2**63 - 1),
              st.lists(st.text(max_size=5), max_size=3)),
    st.tuples(st.just("cut"), st.integers(-2**63, 2**63 - 1),
              st.lists(st.text(min_size=1, max_size=5), min_size=1, max_size=3)),
), max_size=30))
def test_any_mix_of_good_truncated_and_null_payloads(records):
    payloads, expected = [], []
    for record in records:
        if record is None:
            payloads.append(None)
            expected.append(None)
            continue
        kind, n, words = record
        body = avro_body(LIST_SCHEMA, {"n": n, "words": words})
        # The last byte of a datum ending in an array is its terminating 0 block count.
        payloads.append(body if kind == "good" else body[:-1])
        expected.append({"n": n, "words": words} if kind == "good" else None)
    batch = make_deserializer("value", avro_options(LIST_SCHEMA)).decode(payloads)
    assert batch.array.to_pylist() == expected
    assert [e is not None for e in batch.errors] == [
        r is not None and r[0] == "cut" for r in records]


def test_cycle_collector_state_is_restored():
    deserializer = make_deserializer("value", avro_options("long"))
    assert gc.isenabled()
    deserializer.decode([avro_body("long", 1), b"\x80"])  # one good, one truncated
    assert gc.isenabled()
    gc.disable()
    try:
        deserializer.decode([avro_body("long", 1)])
        assert not gc.isenabled()
    finally:
        gc.enable()
