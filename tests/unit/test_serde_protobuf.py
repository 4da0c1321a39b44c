"""protobuf-confluent and json-schema-confluent: Confluent's framing, the Spark types, record
errors. Schemas come from the stand-in registry (the integration tests use a real one)."""

from __future__ import annotations

import base64
import json
import pickle

import pyarrow as pa
import pytest
from google.protobuf import descriptor_pb2, text_format

from kwatermark.serde import (
    SerdeError,
    json_schema_arrow_type,
    make_deserializer,
    protobuf_arrow_type,
)
from kwatermark.serde import registry as registry_module
from kwatermark.serde.protobuf import read_message_indexes
from tests.support.protos import ORDERS_V1, file_messages
from tests.support.registry import FakeSchemaRegistry


@pytest.fixture(autouse=True)
def fresh_schema_cache():
    registry_module._SCHEMAS_BY_ID.clear()
    yield
    registry_module._SCHEMAS_BY_ID.clear()


@pytest.fixture
def registry():
    with FakeSchemaRegistry() as fake:
        yield fake


def serialized(text: str) -> str:
    """The schema string confluent-kafka's ProtobufSerializer registers: base64 of the
    FileDescriptorProto."""
    proto = text_format.Parse(text, descriptor_pb2.FileDescriptorProto())
    return base64.b64encode(proto.SerializeToString()).decode()


def zigzag(n: int) -> bytes:
    value, out = (n << 1) ^ (n >> 63), b""
    while value >= 0x80:
        out += bytes([value & 0x7F | 0x80])
        value >>= 7
    return out + bytes([value])


def frame(schema_id: int, indexes: list[int], body: bytes) -> bytes:
    head = b"\x00" if indexes == [0] else zigzag(len(indexes)) + b"".join(map(zigzag, indexes))
    return b"\x00" + schema_id.to_bytes(4, "big") + head + body


def test_message_indexes_follow_confluents_encoding():
    assert read_message_indexes(b"\x00rest", 0) == ([0], 1)  # the shortcut for [0]
    assert read_message_indexes(zigzag(2) + zigzag(1) + zigzag(300), 0) == ([1, 300], 4)
    with pytest.raises(ValueError, match="ends inside"):
        read_message_indexes(zigzag(2) + zigzag(1), 0)
    with pytest.raises(ValueError, match="invalid message-index count -1"):
        read_message_indexes(zigzag(-1), 0)


def test_spark_types_follow_from_protobuf():
    order = file_messages(ORDERS_V1)["Order"].DESCRIPTOR
    assert protobuf_arrow_type(order) == pa.struct([
        ("id", pa.int64()), ("at", pa.timestamp("us", tz="UTC")), ("status", pa.string()),
        ("tags", pa.list_(pa.string())), ("counts", pa.map_(pa.string(), pa.int64())),
        ("item", pa.struct([("sku", pa.string()), ("price", pa.float64())]))])


def test_recursive_message_is_refused_naming_the_path():
    node = file_messages("""name: "n.proto" syntax: "proto3" message_type { name: "Node"
        field { name: "next" number: 1 label: LABEL_OPTIONAL type: TYPE_MESSAGE
                type_name: ".Node" } }""")["Node"].DESCRIPTOR
    with pytest.raises(SerdeError, match="Node is recursive .at next"):
        protobuf_arrow_type(node)


def test_decodes_values_and_reports_bad_records(registry):
    schema_id = registry.register(serialized(ORDERS_V1), subject="t-value",
                                  schema_type="PROTOBUF")
    messages = file_messages(ORDERS_V1)
    order = messages["Order"](id=7, status=1, tags=["x"])
    order.at.FromMilliseconds(1_700_000_000_123)
    decoder = make_deserializer("value", {"value.format": "protobuf-confluent",
                                          "value.schema.registry.url": registry.url},
                                topic="t")
    good = frame(schema_id, [0], order.SerializeToString())
    item = frame(schema_id, [1], messages["Item"](sku="s").SerializeToString())
    batch = decoder.decode([good, item, b"\x01" + good[1:], good[:9] + b"\xff", None,
                            frame(schema_id, [5], b"")])
    assert batch.array.to_pylist()[0] == {
        "id": 7, "at": batch.array.to_pylist()[0]["at"], "status": "PAID", "tags": ["x"],
        "counts": [], "item": None}
    assert batch.array[0]["at"].value == 1_700_000_000_123_000
    assert batch.errors[0] is None and batch.errors[4] is None
    assert batch.errors[1] == (f"the record is a shop.Item (schema id {schema_id}, message "
                               "indexes [1]), not the shop.Order this query reads (the first "
                               "message of the latest schema of value.schema.registry.subject "
                               "(unset, so 't-value': Confluent's TopicNameStrategy for topic "
                               "'t'))")
    assert batch.errors[2].startswith("unknown magic byte 1")
    assert batch.errors[3].startswith("cannot decode Protobuf shop.Order")
    assert batch.errors[5] == f"message indexes [5] name no message of schema id {schema_id}"
    # Executors get a copy without descriptors or client, rebuilt on first use.
    assert pickle.loads(pickle.dumps(decoder)).decode([good]).array.to_pylist() == \
        batch.array.to_pylist()[:1]


def test_message_name_option_picks_the_message(registry):
    registry.register(serialized(ORDERS_V1), subject="t-value", schema_type="PROTOBUF")
    decoder = make_deserializer("value", {"value.format": "protobuf-confluent",
                                          "value.schema.registry.url": registry.url,
                                          "value.protobuf.messageName": "Item"}, topic="t")
    assert decoder.message_name == "shop.Item"
    with pytest.raises(SerdeError, match="value.protobuf.messageName: no message 'Nope'.*"
                                         "shop.Order, shop.Item"):
        make_deserializer("value", {"value.format": "protobuf-confluent",
                                    "value.schema.registry.url": registry.url,
                                    "value.protobuf.messageName": "Nope"}, topic="t")


def test_proto_text_schema_is_a_clear_error(registry):
    registry.register('syntax = "proto3"; message A { int64 id = 1; }', subject="t-value",
                      schema_type="PROTOBUF")
    with pytest.raises(SerdeError, match=r"\.proto source text.*format=serialized"):
        make_deserializer("value", {"value.format": "protobuf-confluent",
                                    "value.schema.registry.url": registry.url}, topic="t")


def test_an_avro_schema_id_is_a_record_error(registry):
    registry.register(serialized(ORDERS_V1), subject="t-value", schema_type="PROTOBUF")
    avro_id = registry.register('"long"')
    decoder = make_deserializer("value", {"value.format": "protobuf-confluent",
                                          "value.schema.registry.url": registry.url},
                                topic="t")
    assert decoder.decode([frame(avro_id, [0], b"")]).errors == [
        f"schema id {avro_id}: it is a AVRO schema, not Protobuf"]


def test_json_schema_types():
    schema = {"type": "object", "properties": {
        "id": {"type": "integer"}, "price": {"type": "number"}, "ok": {"type": "boolean"},
        "at": {"type": "string", "format": "date-time"}, "day": {"type": "string",
                                                                  "format": "date"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "maybe": {"type": ["null", "string"]},
        "either": {"oneOf": [{"type": "null"}, {"$ref": "#/definitions/P"}]}},
        "definitions": {"P": {"type": "object", "properties": {"x": {"type": "integer"}}}}}
    assert json_schema_arrow_type(schema) == pa.struct([
        ("id", pa.int64()), ("price", pa.float64()), ("ok", pa.bool_()),
        ("at", pa.timestamp("us", tz="UTC")), ("day", pa.date32()),
        ("tags", pa.list_(pa.string())), ("maybe", pa.string()),
        ("either", pa.struct([("x", pa.int64())]))])
    with pytest.raises(SerdeError, match="free-form object"):
        json_schema_arrow_type({"type": "object", "properties": {"m": {"type": "object"}}})
    with pytest.raises(SerdeError, match="recursive"):
        json_schema_arrow_type({"$ref": "#/definitions/N", "definitions": {"N": {
            "type": "object", "properties": {"next": {"$ref": "#/definitions/N"}}}}})


def test_json_schema_values_decode_by_name_and_check_the_id(registry):
    schema = {"type": "object", "properties": {"id": {"type": "integer"},
                                               "at": {"type": "string", "format": "date-time"}}}
    schema_id = registry.register(json.dumps(schema), subject="t-value", schema_type="JSON")
    avro_id = registry.register('"long"')
    decoder = make_deserializer("value", {"value.format": "json-schema-confluent",
                                          "value.schema.registry.url": registry.url},
                                topic="t")
    head = b"\x00" + schema_id.to_bytes(4, "big")
    batch = decoder.decode([head + b'{"id": 1, "at": "2024-01-01T00:00:01Z", "new": 1}',
                            head + b'{"id": "x"}', b"\x00" + avro_id.to_bytes(4, "big") + b"{}",
                            b"{}", None])
    assert batch.array.to_pylist()[0]["id"] == 1
    assert batch.array.to_pylist()[1:] == [None] * 4
    assert batch.errors[0] is None and batch.errors[4] is None
    assert batch.errors[1].startswith("JSON does not match the declared schema")
    assert batch.errors[2] == f"schema id {avro_id}: it is a AVRO schema, not JSON Schema"
    assert batch.errors[3].startswith("payload of 2 bytes is too short")
