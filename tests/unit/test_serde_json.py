"""format=json: JSON objects decoded in bulk into the struct the connector declares."""

from __future__ import annotations

import json
import pickle
from datetime import date, datetime, timezone
from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kwatermark.serde import JsonDeserializer, SerdeError, make_deserializer

ORDER = pa.struct([
    ("id", pa.int64()),
    ("customer", pa.string()),
    ("amount", pa.float64()),
    ("paid", pa.bool_()),
    ("created", pa.timestamp("us", tz="UTC")),
    ("day", pa.date32()),
    ("price", pa.decimal128(10, 2)),
    ("tags", pa.list_(pa.string())),
    ("address", pa.struct([("city", pa.string()), ("seen", pa.timestamp("us", tz="UTC"))])),
])
UTC = timezone.utc


def decoder(arrow_type=ORDER, role="value"):
    return make_deserializer(role, {f"{role}.format": "json"}, json_arrow_type=arrow_type)


def test_objects_decode_into_the_declared_struct():
    payload = (
        b'{"id": 1, "customer": "ada", "amount": 9.5, "paid": true,'
        b' "created": "2024-03-01T12:30:45.123456Z", "day": "2024-02-29", "price": "12.34",'
        b' "tags": ["a", "b"], "address": {"city": "Lyon", "seen": "2024-03-01T14:00:00+02:00"},'
        b' "ignored": {"deep": [1, 2]}}'
    )
    batch = decoder().decode([payload, None, b'{"id": 2}'])
    assert batch.array.type == ORDER
    assert batch.errors == [None, None, None]
    assert batch.values is None
    assert batch.array.to_pylist() == [
        {
            "id": 1, "customer": "ada", "amount": 9.5, "paid": True,
            "created": datetime(2024, 3, 1, 12, 30, 45, 123456, tzinfo=UTC),
            "day": date(2024, 2, 29),
            "price": Decimal("12.34"),
            "tags": ["a", "b"],
            "address": {"city": "Lyon", "seen": datetime(2024, 3, 1, 12, 0, tzinfo=UTC)},
        },
        None,
        {"id": 2, "customer": None, "amount": None, "paid": None, "created": None, "day": None,
         "price": None, "tags": None, "address": None},
    ]


def test_iso_timestamps_without_offset_are_utc():
    arrow_type = pa.struct([("ts", pa.timestamp("us", tz="UTC"))])
    batch = decoder(arrow_type).decode([b'{"ts": "2024-01-02 03:04:05"}'])
    assert batch.array.to_pylist() == [{"ts": datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)}]


def test_pretty_printed_objects_decode():
    arrow_type = pa.struct([("id", pa.int64()), ("name", pa.string())])
    pretty = b'{\n  "id": 1,\n  "name": "a"\n}\n'
    batch = decoder(arrow_type).decode([pretty, b'{"id": 2, "name": "b"}', b'\r\n{"id": 3}\r\n'])
    assert batch.errors == [None, None, None]
    assert batch.array.to_pylist() == [
        {"id": 1, "name": "a"}, {"id": 2, "name": "b"}, {"id": 3, "name": None}]


SIMPLE = pa.struct([("id", pa.int64()), ("name", pa.string())])


@pytest.mark.parametrize("payload, message", [
    (b"[1, 2]", "JSON value is an array, not an object"),
    (b"42", "JSON value is a number, not an object"),
    (b'"text"', "JSON value is a string, not an object"),
    (b"true", "JSON value is a boolean, not an object"),
    (b"null", "JSON value is null, not an object"),
    (b"", "invalid JSON: Expecting value: line 1 column 1 (char 0)"),
    (b"   ", "invalid JSON: Expecting value: line 1 column 4 (char 3)"),
    (b'{"id": 1', "invalid JSON: Expecting ',' delimiter: line 1 column 9 (char 8)"),
    (b'{"id": 1}{"id": 2}', "invalid JSON: Extra data: line 1 column 10 (char 9)"),
    (b'{"id": 1} {"id": 2}', "invalid JSON: Extra data: line 1 column 11 (char 10)"),
    (b'{"id": "one"}', "JSON does not match the declared schema"),
    (b'{"id": 3000000000000000000000}', "JSON does not match the declared schema"),
    (b'{"id": 1, "name": "\xff"}', "invalid UTF-8 in JSON"),
])
def test_bad_payloads_are_errors_of_their_record_only(payload, message):
    good = b'{"id": 7, "name": "ok"}'
    batch = decoder(SIMPLE).decode([good, payload, None, good])
    assert batch.array.to_pylist() == [
        {"id": 7, "name": "ok"}, None, None, {"id": 7, "name": "ok"}]
    assert batch.errors[0] is None and batch.errors[2] is None and batch.errors[3] is None
    assert batch.errors[1].startswith(message)


def test_type_mismatch_message_names_the_field():
    batch = decoder(SIMPLE).decode([b'{"id": "one"}'])
    assert "/id" in batch.errors[0]


def test_bad_date_string_is_a_record_error():
    arrow_type = pa.struct([("day", pa.date32())])
    batch = decoder(arrow_type).decode([b'{"day": "2024-02-29"}', b'{"day": "yesterday"}'])
    assert batch.array.to_pylist() == [{"day": date(2024, 2, 29)}, None]
    assert batch.errors[0] is None
    assert batch.errors[1].startswith("JSON does not match the declared schema")


def test_one_bad_record_among_many():
    payloads = [json.dumps({"id": i, "name": f"n{i}"}).encode() for i in range(1000)]
    payloads[613] = b'{"id": "bad"}'
    batch = decoder(SIMPLE).decode(payloads)
    rows = batch.array.to_pylist()
    assert rows[613] is None and batch.errors[613] is not None
    assert rows[612] == {"id": 612, "name": "n612"}
    assert rows[999] == {"id": 999, "name": "n999"}
    assert sum(e is not None for e in batch.errors) == 1


def test_all_null_and_empty_batches():
    assert decoder(SIMPLE).decode([]).array.to_pylist() == []
    batch = decoder(SIMPLE).decode([None, None])
    assert batch.array.type == SIMPLE
    assert batch.array.to_pylist() == [None, None] and batch.errors == [None, None]


def test_missing_arrow_type_names_the_option():
    with pytest.raises(SerdeError, match=r"key\.json\.schema"):
        make_deserializer("key", {"key.format": "json"})


def test_arrow_type_must_be_a_struct():
    with pytest.raises(SerdeError, match=r"value\.json\.schema"):
        decoder(pa.int64())


def test_maps_are_rejected_with_advice():
    arrow_type = pa.struct([("attrs", pa.list_(pa.map_(pa.string(), pa.string())))])
    with pytest.raises(SerdeError, match=r"value\.json\.schema: map types are not supported"):
        decoder(arrow_type)


def test_picklable_after_use():
    deserializer = decoder(SIMPLE)
    deserializer.decode([b'{"id": 1}'])
    clone = pickle.loads(pickle.dumps(deserializer))
    assert isinstance(clone, JsonDeserializer)
    assert clone.decode([b'{"id": 2}']).array.to_pylist() == [{"id": 2, "name": None}]


def test_large_payload_bigger_than_a_block():
    big = "x" * (3 << 20)
    batch = decoder(SIMPLE).decode([json.dumps({"id": 1, "name": big}).encode(), b'{"id": 2}'])
    assert batch.errors == [None, None]
    assert batch.array.to_pylist()[0]["name"] == big


BAD_PAYLOADS = st.sampled_from([b"", b"null", b"[]", b"1", b"{", b'{"id": "x"}', b"}{", b"{}{}"])


@settings(max_examples=80, deadline=None)
@given(st.lists(st.one_of(
    st.none(),
    st.tuples(st.integers(-2**63, 2**63 - 1), st.one_of(st.none(), st.text(max_size=8))),
    BAD_PAYLOADS,
), max_size=40))
def test_any_mix_of_good_bad_and_null_payloads(records):
    payloads, expected, expect_error = [], [], []
    for record in records:
        if record is None:
            payloads.append(None)
            expected.append(None)
            expect_error.append(False)
        elif isinstance(record, tuple):
            payloads.append(json.dumps({"id": record[0], "name": record[1]}).encode())
            expected.append({"id": record[0], "name": record[1]})
            expect_error.append(False)
        else:
            payloads.append(record)
            expected.append(None)
            expect_error.append(True)
    batch = decoder(SIMPLE).decode(payloads)
    assert batch.array.to_pylist() == expected
    assert [e is not None for e in batch.errors] == expect_error
