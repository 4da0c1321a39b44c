"""make_deserializer: format selection, option matching, the string format, doc examples."""

from __future__ import annotations

import doctest
import importlib
import pickle

import pyarrow as pa
import pytest

from kwatermark.serde import (
    FORMATS,
    DecodedBatch,
    Deserializer,
    SerdeError,
    StringDeserializer,
    make_deserializer,
)

AVRO_LONG = '"long"'


def test_formats_are_the_documented_ones():
    assert FORMATS == ("binary", "string", "json", "avro", "avro-confluent",
                       "protobuf-confluent", "json-schema-confluent")


@pytest.mark.parametrize("options", [{}, {"value.format": "binary"}, {"VALUE.FORMAT": "Binary"}])
def test_binary_means_no_decoded_column(options):
    assert make_deserializer("value", options) is None


def test_option_names_and_values_match_case_insensitively():
    deserializer = make_deserializer("value", {"Value.Format": "STRING"})
    assert isinstance(deserializer, StringDeserializer)
    assert isinstance(deserializer, Deserializer)


def test_each_role_reads_its_own_options():
    options = {"key.format": "string", "value.format": "avro", "value.avro.schema": AVRO_LONG}
    assert isinstance(make_deserializer("key", options), StringDeserializer)
    assert make_deserializer("value", options).arrow_type == pa.int64()


def test_unknown_format_names_the_option_and_lists_accepted_values():
    with pytest.raises(SerdeError) as raised:
        make_deserializer("key", {"key.format": "xml"})
    message = str(raised.value)
    assert "key.format" in message and "'xml'" in message
    assert "binary, string, json, avro, avro-confluent" in message


def test_serde_error_is_a_value_error():
    assert issubclass(SerdeError, ValueError)


def test_unknown_role_is_rejected():
    with pytest.raises(SerdeError, match="role"):
        make_deserializer("headers", {})


def test_json_without_arrow_type_names_the_schema_option():
    with pytest.raises(SerdeError, match=r"value\.json\.schema"):
        make_deserializer("value", {"value.format": "json", "value.json.schema": "id INT"})


def test_avro_without_schema_names_the_option():
    with pytest.raises(SerdeError, match=r"key\.avro\.schema"):
        make_deserializer("key", {"key.format": "avro"})


def test_avro_confluent_without_url_names_the_option():
    with pytest.raises(SerdeError, match=r"value\.schema\.registry\.url"):
        make_deserializer("value", {"value.format": "avro-confluent",
                                    "value.avro.schema": AVRO_LONG})


# -- string ---------------------------------------------------------------------------------


def test_string_decodes_utf8_and_keeps_nulls_and_empty_strings():
    batch = make_deserializer("value", {"value.format": "string"}).decode(
        [b"hello", "café".encode(), None, b""])
    assert isinstance(batch, DecodedBatch)
    assert batch.array.type == pa.string()
    assert batch.array.to_pylist() == ["hello", "café", None, ""]
    assert batch.errors == [None, None, None, None]


def test_invalid_utf8_is_an_error_of_that_record_only():
    batch = make_deserializer("value", {"value.format": "string"}).decode(
        [b"ok", b"bad \xff byte", None, b"fine"])
    assert batch.array.to_pylist() == ["ok", None, None, "fine"]
    assert batch.errors[0] is None and batch.errors[2] is None and batch.errors[3] is None
    assert batch.errors[1].startswith("invalid UTF-8")
    assert "0xff" in batch.errors[1]


def test_string_of_empty_batch():
    batch = make_deserializer("key", {"key.format": "string"}).decode([])
    assert batch.array.to_pylist() == [] and batch.errors == []


def test_string_deserializer_is_picklable():
    deserializer = make_deserializer("value", {"value.format": "string"})
    deserializer.decode([b"x"])
    clone = pickle.loads(pickle.dumps(deserializer))
    assert clone.decode([b"y"]).array.to_pylist() == ["y"]


# -- documentation examples -----------------------------------------------------------------


@pytest.mark.parametrize("module", [
    "kwatermark.serde",
    "kwatermark.serde.base",
    "kwatermark.serde.options",
    "kwatermark.serde.arrowtypes",
    "kwatermark.serde.text",
    "kwatermark.serde.jsonvalues",
    "kwatermark.serde.avro",
    "kwatermark.serde.registry",
    "kwatermark.serde.formats",
    "kwatermark.serde.protobuf",
    "kwatermark.serde.jsonschema",
])
def test_docstring_examples_run(module):
    result = doctest.testmod(importlib.import_module(module))
    assert result.failed == 0


@pytest.mark.parametrize("wrap", [
    lambda payloads: pa.array(payloads, pa.binary()),
    lambda payloads: pa.chunked_array([pa.array(payloads, pa.binary())]),
    lambda payloads: [None if p is None else memoryview(p) for p in payloads],
])
def test_payloads_may_be_an_arrow_binary_column_or_memoryviews(wrap):
    string = make_deserializer("value", {"value.format": "string"})
    assert string.decode(wrap([b"a", None, b"\xff"])).array.to_pylist() == ["a", None, None]
    avro = make_deserializer("value", {"value.format": "avro", "value.avro.schema": AVRO_LONG})
    assert avro.decode(wrap([b"\x54", None])).array.to_pylist() == [42, None]
    json_type = pa.struct([("n", pa.int64())])
    json = make_deserializer("value", {"value.format": "json"}, json_arrow_type=json_type)
    batch = json.decode(wrap([b'{"n": 1}', None, b"[]"]))
    assert batch.array.to_pylist() == [{"n": 1}, None, None]
    assert batch.errors[2] == "JSON value is an array, not an object"


@pytest.mark.parametrize("fmt, message", [
    ("avro", ("value.avro.schema (the writer's Avro schema JSON) is required when "
             "value.format is avro")),
    ("avro-confluent", ("value.schema.registry.url is required when value.format is "
                       "avro-confluent")),
])
def test_a_format_without_its_required_option_names_it(fmt, message):
    with pytest.raises(SerdeError) as failure:
        make_deserializer("value", {"value.format": fmt})
    assert str(failure.value) == message


def test_the_source_accepts_every_serde_format():
    from kwatermark.options import FORMATS as SOURCE_FORMATS

    assert SOURCE_FORMATS == FORMATS
