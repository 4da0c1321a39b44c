"""JSON Schema values in Confluent's wire format: magic byte 0, the 4-byte big-endian schema
id, then the JSON text. The output type comes from the subject's latest JSON Schema; the
bodies are decoded by :class:`~kwatermark.serde.jsonvalues.JsonDeserializer` (fields by name,
so a record written with an older schema reads with the latest). Values are not validated
against the schema: a value whose fields do not convert to the type is a bad record.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from .base import DecodedBatch, SerdeError, payload_list
from .jsonvalues import JsonDeserializer
from .options import RoleOptions
from .registry import JSON, SchemaLookupError, SchemaRegistry, redact_url, subject_for

_MAGIC = 0
_HEADER_LEN = 5
_WIRE = "Confluent wire format (magic byte 0, 4-byte schema id)"

_STRING_FORMATS = {"date-time": pa.timestamp("us", tz="UTC"), "date": pa.date32()}
_SIMPLE = {"integer": pa.int64(), "number": pa.float64(), "boolean": pa.bool_(),
           "string": pa.string()}


def json_schema_arrow_type(schema: Any, option: str = "schema") -> pa.DataType:
    """The Arrow (Spark) type of values of a JSON Schema: object -> struct of its
    ``properties`` (in order), array -> list of its ``items``, ``integer`` -> int64,
    ``number`` -> float64, ``boolean``, ``string`` (a timestamp with ``format: date-time``, a
    date with ``format: date``); ``["null", T]`` and ``oneOf``/``anyOf`` of null and one T
    are T; ``$ref`` within the schema is followed.

    >>> json_schema_arrow_type({"type": "object", "properties": {
    ...     "id": {"type": "integer"}, "at": {"type": "string", "format": "date-time"}}})
    StructType(struct<id: int64, at: timestamp[us, tz=UTC]>)
    """
    try:
        return _Builder(schema).build(schema, "", ())
    except SerdeError as exc:
        raise SerdeError(f"{option}: {exc}") from None


class _Builder:
    def __init__(self, root: Any):
        self.root = root

    def build(self, schema: Any, path: str, refs: tuple) -> pa.DataType:
        where = path or "the top level"
        if not isinstance(schema, dict):
            raise SerdeError(f"unsupported JSON Schema {schema!r} at {where}")
        if "$ref" in schema:
            ref = schema["$ref"]
            if ref in refs:
                raise SerdeError(f"JSON Schema $ref {ref!r} is recursive (at {where}); Spark "
                                 "types cannot nest without end")
            return self.build(self._resolve(ref, where), path, (*refs, ref))
        for key in ("oneOf", "anyOf"):
            if key in schema:
                branches = [b for b in schema[key] if b.get("type") != "null"]
                if len(branches) != 1:
                    raise SerdeError(f"JSON Schema {key} at {where}: only null and one other "
                                     "schema map to a Spark type")
                return self.build(branches[0], path, refs)
        kind = schema.get("type")
        if isinstance(kind, list):
            kinds = [k for k in kind if k != "null"]
            if len(kinds) != 1:
                raise SerdeError(f"JSON Schema type {kind} at {where}: only null and one "
                                 "other type map to a Spark type")
            kind = kinds[0]
        if kind is None and "properties" in schema:
            kind = "object"
        if kind == "object":
            properties = schema.get("properties")
            if not properties:
                raise SerdeError(f"JSON Schema object at {where} declares no properties (a "
                                 "free-form object or map has no Spark struct type)")
            return pa.struct([pa.field(name, self.build(sub, _join(path, name), refs))
                              for name, sub in properties.items()])
        if kind == "array":
            return pa.list_(self.build(schema.get("items", {}), f"{path}[]", refs))
        if kind == "string" and schema.get("format") in _STRING_FORMATS:
            return _STRING_FORMATS[schema["format"]]
        if kind in _SIMPLE:
            return _SIMPLE[kind]
        raise SerdeError(f"JSON Schema at {where} has no supported type (type {kind!r})")

    def _resolve(self, ref: str, where: str) -> Any:
        if not ref.startswith("#"):
            raise SerdeError(f"JSON Schema $ref {ref!r} at {where}: only references within "
                             "the schema (#/...) are supported")
        node = self.root
        for part in [p for p in ref[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, dict) or part not in node:
                raise SerdeError(f"JSON Schema $ref {ref!r} at {where} names nothing")
            node = node[part]
        return node


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


class ConfluentJsonSchemaDeserializer:
    """JSON values in Confluent's wire format, typed by the subject's latest JSON Schema.

    Each record's schema id must be a JSON Schema the registry knows (checked once per id);
    the value is then read by field name into the latest schema's type.
    """

    def __init__(self, role: str, registry: SchemaRegistry, reader: Any, reader_option: str):
        self.role = role
        self.registry = registry
        self.arrow_type = json_schema_arrow_type(reader, reader_option)
        self._json = JsonDeserializer(role, self.arrow_type)
        self._known: set[int] = set()

    @classmethod
    def from_options(cls, opts: RoleOptions, topic: str | None = None
                     ) -> ConfluentJsonSchemaDeserializer:
        registry = SchemaRegistry.from_options(opts, "json-schema-confluent")
        subject, option = subject_for(opts, topic)
        if subject is None:
            raise SerdeError(
                f"{opts.name('format')}=json-schema-confluent needs a subject whose latest "
                f"schema gives the output type: set {opts.name('schema.registry.subject')}. "
                f"The default subject <topic>-{opts.role} (Confluent's TopicNameStrategy) "
                f"applies only when the query reads exactly one topic")
        reader = registry.latest(subject, option, JSON)
        return cls(opts.role, registry, reader.schema, option)

    def __repr__(self) -> str:
        return (f"ConfluentJsonSchemaDeserializer(role={self.role!r}, "
                f"registry={redact_url(self.registry.url)!r}, arrow_type={self.arrow_type})")

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_known": set()}

    def decode(self, payloads: Sequence[bytes | None]) -> DecodedBatch:
        payloads = payload_list(payloads)
        errors: list[str | None] = [None] * len(payloads)
        bodies: list[bytes | None] = [None] * len(payloads)
        failed: dict[int, str] = {}  # one registry request per bad id and batch
        for i, payload in enumerate(payloads):
            if payload is None:
                continue
            if len(payload) < _HEADER_LEN:
                errors[i] = f"payload of {len(payload)} bytes is too short for {_WIRE}"
            elif payload[0] != _MAGIC:
                errors[i] = f"unknown magic byte {payload[0]}: not in {_WIRE}"
            else:
                errors[i] = self._check_id(int.from_bytes(payload[1:_HEADER_LEN], "big"), failed)
                if errors[i] is None:
                    bodies[i] = payload[_HEADER_LEN:]
        decoded = self._json.decode(bodies)
        merged = [own or theirs for own, theirs in zip(errors, decoded.errors)]
        return DecodedBatch(decoded.array, merged)

    def _check_id(self, schema_id: int, failed: dict) -> str | None:
        if schema_id in self._known:
            return None
        if schema_id not in failed:
            try:
                self.registry.schema_by_id(schema_id, JSON)
            except SchemaLookupError as exc:
                failed[schema_id] = str(exc)
                return failed[schema_id]
            self._known.add(schema_id)
            return None
        return failed[schema_id]
