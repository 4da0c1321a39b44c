"""Protobuf values in Confluent's wire format, schemas from a Schema Registry.

The wire format: magic byte 0, the schema id (4 bytes, big-endian), the message indexes (a
zig-zag varint count, then that many zig-zag varints: the path from the file's top-level
messages down to nested ones; a single 0 stands for ``[0]``, the first message), then the
message's bytes. Messages are built from the registry's descriptors by
``google.protobuf``'s ``message_factory``; the Spark types follow Spark's own
``from_protobuf``.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import FieldDescriptor

from .avro import to_arrow
from .base import DecodedBatch, SerdeError, describe_exception, payload_list
from .options import RoleOptions
from .registry import (
    PROTOBUF,
    RegistrySchema,
    SchemaLookupError,
    SchemaRegistry,
    redact_url,
    subject_for,
)

_MAGIC = 0
_HEADER_LEN = 5
_WIRE = "Confluent wire format (magic byte 0, 4-byte schema id, message indexes)"

_TIMESTAMP = "google.protobuf.Timestamp"
_DURATION = "google.protobuf.Duration"

_SCALARS = {
    FieldDescriptor.CPPTYPE_INT32: pa.int32(),
    FieldDescriptor.CPPTYPE_UINT32: pa.int32(),   # Spark: IntegerType, bits reinterpreted
    FieldDescriptor.CPPTYPE_INT64: pa.int64(),
    FieldDescriptor.CPPTYPE_UINT64: pa.int64(),   # Spark: LongType, bits reinterpreted
    FieldDescriptor.CPPTYPE_FLOAT: pa.float32(),
    FieldDescriptor.CPPTYPE_DOUBLE: pa.float64(),
    FieldDescriptor.CPPTYPE_BOOL: pa.bool_(),
    FieldDescriptor.CPPTYPE_ENUM: pa.string(),
}


def _well_known_files() -> list[bytes]:
    """Serialized descriptors of the files every schema may import without a reference."""
    from google.protobuf import (
        any_pb2,
        api_pb2,
        duration_pb2,
        empty_pb2,
        field_mask_pb2,
        source_context_pb2,
        struct_pb2,
        timestamp_pb2,
        type_pb2,
        wrappers_pb2,
    )

    files = [m.DESCRIPTOR.serialized_pb for m in (
        any_pb2, source_context_pb2, type_pb2, api_pb2, descriptor_pb2, duration_pb2,
        empty_pb2, field_mask_pb2, struct_pb2, timestamp_pb2, wrappers_pb2)]
    try:  # Confluent's own imports (confluent/meta.proto, decimals), shipped with its client
        from confluent_kafka.schema_registry.confluent import meta_pb2
        from confluent_kafka.schema_registry.confluent.type import decimal_pb2
        files += [meta_pb2.DESCRIPTOR.serialized_pb, decimal_pb2.DESCRIPTOR.serialized_pb]
    except ImportError:
        pass
    return files


def file_descriptor_proto(name: str, text: str, where: str) -> descriptor_pb2.FileDescriptorProto:
    """The ``FileDescriptorProto`` a registry served as base64 text, named ``name``."""
    proto = descriptor_pb2.FileDescriptorProto()
    try:
        proto.ParseFromString(base64.b64decode(text.encode("ascii"), validate=True))
    except (binascii.Error, UnicodeEncodeError, ValueError):
        if "message" in text or "syntax" in text:
            raise SchemaLookupError(
                f"{where} is .proto source text: the registry did not serve it as a serialized "
                "descriptor (?format=serialized, which Confluent's Schema Registry answers for "
                "every Protobuf schema); kwatermark reads Protobuf schemas as descriptors only "
                "(register them as confluent-kafka's ProtobufSerializer does)") from None
        raise SchemaLookupError(f"{where} is neither a base64 FileDescriptorProto nor .proto "
                                "text") from None
    except Exception as exc:  # noqa: BLE001 - DecodeError and friends
        raise SchemaLookupError(f"{where} is not a valid FileDescriptorProto: "
                                f"{describe_exception(exc)}") from None
    proto.name = name
    return proto


class ProtobufSchema:
    """The messages of one registered Protobuf schema, in a descriptor pool of their own."""

    def __init__(self, schema: RegistrySchema, where: str):
        pool = descriptor_pool.DescriptorPool()
        for serialized in _well_known_files():
            pool.AddSerializedFile(serialized)
        try:
            for name, text in schema.references:
                pool.AddSerializedFile(file_descriptor_proto(
                    name, text, f"{where}, reference {name!r}").SerializeToString())
            main = file_descriptor_proto("kwatermark-schema.proto", schema.schema, where)
            self.file = pool.AddSerializedFile(main.SerializeToString())
        except SchemaLookupError:
            raise
        except Exception as exc:  # noqa: BLE001 - TypeError on unresolved imports, ...
            raise SchemaLookupError(f"{where}: the Protobuf schema does not build: "
                                    f"{describe_exception(exc)}") from None
        if not self.file.message_types_by_name:
            raise SchemaLookupError(f"{where}: the Protobuf schema defines no message")
        self.pool = pool

    def first_message(self):
        return next(iter(self.file.message_types_by_name.values()))  # declaration order

    def message_named(self, name: str):
        """The message whose full name is ``name`` (or whose short name is, if one is)."""
        try:
            return self.pool.FindMessageTypeByName(name)
        except KeyError:
            pass
        found = [m for m in self._all_messages() if m.name == name]
        return found[0] if len(found) == 1 else None

    def message_at(self, indexes: Sequence[int]):
        """The message that Confluent's message indexes name, or None."""
        candidates = list(self.file.message_types_by_name.values())
        message = None
        for index in indexes:
            if not 0 <= index < len(candidates):
                return None
            message = candidates[index]
            candidates = list(message.nested_types)
        return message

    def _all_messages(self) -> list:
        out, todo = [], list(self.file.message_types_by_name.values())
        while todo:
            message = todo.pop(0)
            out.append(message)
            todo.extend(message.nested_types)
        return out


def read_message_indexes(payload: bytes, start: int) -> tuple[list[int], int]:
    """Confluent's message-index array at ``payload[start:]`` and the offset after it."""
    count, pos = _zigzag(payload, start)
    if count == 0:
        return [0], pos
    if count < 0 or count > len(payload):
        raise ValueError(f"invalid message-index count {count}")
    indexes = []
    for _ in range(count):
        index, pos = _zigzag(payload, pos)
        indexes.append(index)
    return indexes, pos


def _zigzag(payload: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if pos >= len(payload):
            raise ValueError("payload ends inside the message indexes")
        byte = payload[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 63:
            raise ValueError("message-index varint longer than 10 bytes")


def protobuf_arrow_type(message) -> pa.DataType:
    """The Arrow (Spark) type of a message descriptor, as Spark's ``from_protobuf`` types it:
    enums as strings, repeated as lists, maps as maps, nested messages as structs,
    ``google.protobuf.Timestamp`` as a timestamp and ``Duration`` as a duration."""
    return _TypeBuilder().message(message, "")


class _TypeBuilder:
    def __init__(self):
        self.building: set[str] = set()

    def message(self, message, path: str) -> pa.DataType:
        if message.full_name == _TIMESTAMP:
            return pa.timestamp("us", tz="UTC")
        if message.full_name == _DURATION:
            return pa.duration("us")
        if message.full_name in self.building:
            raise SerdeError(f"Protobuf message {message.full_name} is recursive (at "
                             f"{path or 'the top level'}); Spark types cannot nest without end")
        self.building.add(message.full_name)
        fields = [pa.field(f.name, self.field(f, _join(path, f.name)), nullable=True)
                  for f in message.fields]
        self.building.discard(message.full_name)
        return pa.struct(fields)

    def field(self, field, path: str) -> pa.DataType:
        if _is_map(field):
            key, value = field.message_type.fields_by_name["key"], \
                field.message_type.fields_by_name["value"]
            return pa.map_(self.single(key, path), self.single(value, f"{path}{{}}"))
        single = self.single(field, path)
        return pa.list_(single) if _repeated(field) else single

    def single(self, field, path: str) -> pa.DataType:
        kind = field.cpp_type
        if kind == FieldDescriptor.CPPTYPE_MESSAGE:
            return self.message(field.message_type, path)
        if kind == FieldDescriptor.CPPTYPE_STRING:
            return pa.binary() if field.type == FieldDescriptor.TYPE_BYTES else pa.string()
        return _SCALARS[kind]


def _repeated(field) -> bool:
    repeated = getattr(field, "is_repeated", None)  # protobuf 6+ (``label`` went in 7)
    if repeated is None:
        return field.label == FieldDescriptor.LABEL_REPEATED
    return bool(repeated)


def _is_map(field) -> bool:
    return (_repeated(field) and field.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE
            and field.message_type.GetOptions().map_entry)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _converter(message) -> Callable[[Any], dict]:
    """A function from a message of ``message`` to the Python value of its Arrow type.

    Only fields that are set are read (``ListFields``): an unset singular field is null, as
    with Spark's ``from_protobuf`` (``emit.default.values`` false); an unset repeated field or
    map is empty.
    """
    fields = {}
    template: dict[str, Any] = {}
    for field in message.fields:
        template[field.name] = [] if _repeated(field) else None
        if _is_map(field):
            key = _single(field.message_type.fields_by_name["key"])
            value = _single(field.message_type.fields_by_name["value"])
            fields[field.name] = _map_of(key, value)
        elif _repeated(field):
            one = _single(field)
            fields[field.name] = None if one is None else _list_of(one)
        else:
            fields[field.name] = _single(field)

    def convert(msg) -> dict:
        out = dict(template)
        for field, value in msg.ListFields():
            name = field.name
            if name in fields:
                conv = fields[name]
                out[name] = value if conv is None else conv(value)
        return out

    return convert


def _list_of(one):
    return lambda values: [one(v) for v in values]


def _map_of(key, value):
    if key is None and value is None:
        return lambda entries: list(entries.items())
    key = key or (lambda v: v)
    value = value or (lambda v: v)
    return lambda entries: [(key(k), value(v)) for k, v in entries.items()]


def _single(field) -> Callable[[Any], Any] | None:
    """The conversion of one value of ``field``, or None when the value is already right."""
    kind = field.cpp_type
    if kind == FieldDescriptor.CPPTYPE_MESSAGE:
        full_name = field.message_type.full_name
        if full_name in (_TIMESTAMP, _DURATION):
            return lambda t: t.seconds * 1_000_000 + t.nanos // 1_000
        return _LazyConverter(field.message_type)
    if kind == FieldDescriptor.CPPTYPE_ENUM:
        names = {v.number: v.name for v in field.enum_type.values}
        return lambda number: names.get(number, str(number))
    if kind == FieldDescriptor.CPPTYPE_UINT32:
        return lambda v: v - (1 << 32) if v >= 1 << 31 else v
    if kind == FieldDescriptor.CPPTYPE_UINT64:
        return lambda v: v - (1 << 64) if v >= 1 << 63 else v
    return None


class _LazyConverter:
    """A nested message's converter, built on first use (the type builder has already
    rejected recursive messages)."""

    def __init__(self, message):
        self.message = message
        self.convert = None

    def __call__(self, value):
        if self.convert is None:
            self.convert = _converter(self.message)
        return self.convert(value)


class ConfluentProtobufDeserializer:
    """Protobuf in Confluent's wire format, schemas fetched from a Schema Registry.

    The output type is one message of the subject's latest schema (the reader schema):
    ``{role}.protobuf.messageName`` if set, else its first message. A record is decoded with
    that message's descriptor (Protobuf schema evolution: fields matched by number, unknown
    fields skipped); its message indexes must name a message of the same full name in the
    writer's schema, else the record is bad.

    >>> read_message_indexes(b"\\x00\\x08", 0), read_message_indexes(b"\\x04\\x02\\x04", 0)
    (([0], 1), ([1, 2], 3))
    """

    def __init__(self, role: str, registry: SchemaRegistry, reader: RegistrySchema,
                 message_name: str | None, reader_option: str):
        self.role = role
        self.registry = registry
        self._reader_schema = reader
        self._message_option = self._names(message_name, reader_option)
        self._message_name = message_name
        self._reader_option = reader_option
        self._state = None
        message = self._reader()[0]
        self.message_name = message.full_name
        self.arrow_type = protobuf_arrow_type(message)

    def _names(self, message_name, reader_option) -> str:
        if message_name is None:
            return f"the first message of the latest schema of {reader_option}"
        return f"{self.role}.protobuf.messageName"

    @classmethod
    def from_options(cls, opts: RoleOptions, topic: str | None = None
                     ) -> ConfluentProtobufDeserializer:
        registry = SchemaRegistry.from_options(opts, "protobuf-confluent")
        subject, option = subject_for(opts, topic)
        if subject is None:
            raise SerdeError(
                f"{opts.name('format')}=protobuf-confluent needs a subject whose latest schema "
                f"gives the output type: set {opts.name('schema.registry.subject')}. The "
                f"default subject <topic>-{opts.role} (Confluent's TopicNameStrategy) applies "
                f"only when the query reads exactly one topic")
        reader = registry.latest(subject, option, PROTOBUF)
        try:
            return cls(opts.role, registry, reader, opts.get("protobuf.messagename"), option)
        except SchemaLookupError as exc:
            raise SerdeError(f"{option}: {exc}") from None

    def __repr__(self) -> str:
        return (f"ConfluentProtobufDeserializer(role={self.role!r}, "
                f"registry={redact_url(self.registry.url)!r}, message={self.message_name!r})")

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_state": None}

    def _reader(self):
        """(message descriptor, message class, converter, per-id plans), built once."""
        if self._state is None:
            schema = ProtobufSchema(self._reader_schema, self._reader_option)
            if self._message_name is None:
                message = schema.first_message()
            else:
                message = schema.message_named(self._message_name)
                if message is None:
                    names = ", ".join(m.full_name for m in schema._all_messages())
                    raise SerdeError(f"{self.role}.protobuf.messageName: no message "
                                     f"{self._message_name!r} in the latest schema of "
                                     f"{self._reader_option} (its messages: {names})")
            self._state = (message, message_factory.GetMessageClass(message),
                           _converter(message), {}, {})
        return self._state

    def _plan(self, schema_id: int, indexes: tuple, failed: dict) -> str | None:
        """None when records of this id and message indexes decode as the reader message,
        else their error. A schema that cannot be fetched is asked for again in the next
        batch (``failed`` is this batch's); a mismatch is remembered."""
        _, _, _, plans, writers = self._reader()
        key = (schema_id, indexes)
        if key in plans:
            return plans[key]
        if schema_id in failed:
            return failed[schema_id]
        where = f"schema id {schema_id}"
        writer = writers.get(schema_id)
        if writer is None:
            try:
                writer = ProtobufSchema(self.registry.schema_by_id(schema_id, PROTOBUF), where)
            except SchemaLookupError as exc:
                failed[schema_id] = str(exc)
                return failed[schema_id]
            writers[schema_id] = writer
        message = writer.message_at(indexes)
        if message is None:
            plans[key] = f"message indexes {list(indexes)} name no message of {where}"
        elif message.full_name != self.message_name:
            plans[key] = (f"the record is a {message.full_name} ({where}, message indexes "
                          f"{list(indexes)}), not the {self.message_name} this query reads "
                          f"({self._message_option})")
        else:
            plans[key] = None
        return plans[key]

    def decode_values(self, payloads: Sequence[bytes | None]) -> tuple[list, list[str | None]]:
        payloads = payload_list(payloads)
        _, message_class, convert, _, _ = self._reader()
        failed: dict[int, str] = {}
        values: list = [None] * len(payloads)
        errors: list[str | None] = [None] * len(payloads)
        for i, payload in enumerate(payloads):
            if payload is None:
                continue
            if len(payload) < _HEADER_LEN:
                errors[i] = f"payload of {len(payload)} bytes is too short for {_WIRE}"
                continue
            if payload[0] != _MAGIC:
                errors[i] = f"unknown magic byte {payload[0]}: not in {_WIRE}"
                continue
            schema_id = int.from_bytes(payload[1:_HEADER_LEN], "big")
            try:
                indexes, start = read_message_indexes(payload, _HEADER_LEN)
            except ValueError as exc:
                errors[i] = f"schema id {schema_id}: {exc}"
                continue
            failure = self._plan(schema_id, tuple(indexes), failed)
            if failure is not None:
                errors[i] = failure
                continue
            try:
                values[i] = convert(message_class.FromString(payload[start:]))
            except Exception as exc:  # noqa: BLE001 - any parser failure is this record's error
                errors[i] = (f"cannot decode Protobuf {self.message_name} "
                             f"({len(payload) - start} bytes): {describe_exception(exc)}")
        return values, errors

    def decode(self, payloads: Sequence[bytes | None]) -> DecodedBatch:
        values, errors = self.decode_values(payloads)
        return DecodedBatch(to_arrow(values, errors, self.arrow_type), errors, values)
