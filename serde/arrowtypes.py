"""The Arrow (and so Spark) type of the values fastavro decodes for an Avro schema."""

from __future__ import annotations

import json
from typing import Any

import fastavro
import pyarrow as pa
from fastavro.schema import SchemaParseException

from .base import SerdeError

_PRIMITIVES = {
    "null": pa.null(),
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "bytes": pa.binary(),
    "string": pa.string(),
}

# Keyed like fastavro's LOGICAL_READERS ("<avro type>-<logical type>"). Any other logical type
# is decoded and typed as its underlying Avro type (decodable() drops the annotation).
_LOGICAL = {
    "int-date": pa.date32(),
    "int-time-millis": pa.time64("us"),
    "long-time-micros": pa.time64("us"),
    "long-timestamp-millis": pa.timestamp("us", tz="UTC"),
    "long-timestamp-micros": pa.timestamp("us", tz="UTC"),
    # fastavro returns naive datetimes for local timestamps: Spark's TimestampNTZType.
    "long-local-timestamp-millis": pa.timestamp("us"),
    "long-local-timestamp-micros": pa.timestamp("us"),
    "string-uuid": pa.string(),  # decoded as plain text, see decodable()
}

_DECODED_LOGICAL = {key for key in _LOGICAL if key != "string-uuid"} | {
    "bytes-decimal",
    "fixed-decimal",
}

# Spark's DecimalType stops at 38 digits.
_MAX_DECIMAL_PRECISION = 38


def load_schema(text: str, option: str) -> Any:
    """Parse Avro schema JSON text given by ``option``; SerdeError naming the option if bad."""
    try:
        schema = json.loads(text)
    except ValueError as exc:
        raise SerdeError(f"{option}: not valid JSON: {exc}") from None
    return decodable(schema)


def decodable(schema: Any) -> Any:
    """``schema`` keeping only the logical types that fastavro should decode for Arrow.

    fastavro decodes ``uuid`` to ``uuid.UUID``, which Arrow cannot convert, and a future
    fastavro may decode logical types this mapping treats as their underlying type; without
    the annotation fastavro returns exactly what the Arrow type expects.
    """
    if isinstance(schema, list):
        return [decodable(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    kept = {k: decodable(v) for k, v in schema.items()}
    logical = schema.get("logicalType")
    if logical is not None and f"{schema.get('type')}-{logical}" not in _DECODED_LOGICAL:
        del kept["logicalType"]
    return kept


def parse_avro(schema: Any, option: str, named: dict | None = None) -> Any:
    """fastavro's parsed form of ``schema``; SerdeError naming ``option`` if it is invalid."""
    try:
        return fastavro.parse_schema(schema, named)
    except KeyError as exc:  # fastavro's way of saying a required attribute is missing
        raise SerdeError(f"{option}: not a valid Avro schema: missing {exc}") from None
    except (SchemaParseException, ValueError, TypeError, AttributeError) as exc:
        raise SerdeError(f"{option}: not a valid Avro schema: {exc}") from None


def avro_to_arrow_type(schema: Any, named: dict | None = None) -> pa.DataType:
    """The Arrow type of the values fastavro decodes with ``schema``.

    ``schema`` is Avro schema JSON text or its parsed form; ``named`` maps full names of types
    defined elsewhere (Schema Registry references) to their definitions. Every Arrow field is
    nullable, as Spark expects.

    >>> avro_to_arrow_type({"type": "record", "name": "R", "fields": [
    ...     {"name": "id", "type": "long"}, {"name": "tag", "type": ["null", "string"]}]})
    StructType(struct<id: int64, tag: string>)
    """
    if isinstance(schema, str) and schema.lstrip()[:1] in ('{', '[', '"'):
        schema = load_schema(schema, "schema")
    return arrow_type_for(schema, "schema", named)


def arrow_type_for(schema: Any, option: str, named: dict | None = None) -> pa.DataType:
    """:func:`avro_to_arrow_type` of a loaded schema; errors name ``option``."""
    named = dict(named or {})
    parsed = parse_avro(decodable(schema), option, named)
    try:
        return _ArrowTypeBuilder(named).build(parsed, "")
    except SerdeError as exc:
        raise SerdeError(f"{option}: {exc}") from None


class _ArrowTypeBuilder:
    def __init__(self, named: dict):
        self.named = named
        self.done: dict[str, pa.DataType] = {}
        self.building: set[str] = set()

    def build(self, schema: Any, path: str) -> pa.DataType:
        if isinstance(schema, str):
            if schema in _PRIMITIVES:
                return _PRIMITIVES[schema]
            return self._named(schema, path)
        if isinstance(schema, list):
            return self._union(schema, path)
        avro_type = schema["type"]
        logical = schema.get("logicalType")
        if logical == "decimal" and avro_type in ("bytes", "fixed"):
            return _decimal(schema, path)
        if logical and f"{avro_type}-{logical}" in _LOGICAL:
            return _LOGICAL[f"{avro_type}-{logical}"]
        if avro_type in ("record", "error"):
            return self._record(schema, path)
        if avro_type == "enum":
            return pa.string()
        if avro_type == "fixed":
            return pa.binary()
        if avro_type == "array":
            return pa.list_(self.build(schema["items"], f"{path}[]"))
        if avro_type == "map":
            return pa.map_(pa.string(), self.build(schema["values"], f"{path}{{}}"))
        return self.build(avro_type, path)

    def _named(self, name: str, path: str) -> pa.DataType:
        if name in self.building:
            raise SerdeError(
                f"Avro type {name} is recursive (at {path or 'the top level'}); "
                "Spark types cannot nest without end"
            )
        if name in self.done:
            return self.done[name]
        if name not in self.named:
            raise SerdeError(f"Avro type {name} is not defined (at {path or 'the top level'})")
        return self.build(self.named[name], path)

    def _record(self, schema: dict, path: str) -> pa.DataType:
        name = schema["name"]
        self.building.add(name)
        fields = [
            pa.field(f["name"], self.build(f["type"], _join(path, f["name"])), nullable=True)
            for f in schema["fields"]
        ]
        self.building.discard(name)
        self.done[name] = pa.struct(fields)
        return self.done[name]

    def _union(self, branches: list, path: str) -> pa.DataType:
        non_null = [b for b in branches if b != "null"]
        if not non_null:
            return pa.null()
        if len(non_null) == 1:
            return self.build(non_null[0], path)
        names = ", ".join(b if isinstance(b, str) else str(b.get("name", b["type"]))
                          for b in non_null)
        raise SerdeError(
            f"unsupported Avro union [{names}] at {path or 'the top level'}: only unions of "
            'one type with "null" map to a Spark type; use a reader schema that avoids it'
        )


def _decimal(schema: dict, path: str) -> pa.DataType:
    try:
        precision, scale = int(schema["precision"]), int(schema.get("scale", 0))
    except (KeyError, TypeError, ValueError):
        raise SerdeError(
            f"Avro decimal at {path or 'the top level'} needs an integer precision (and scale)"
        ) from None
    if precision > _MAX_DECIMAL_PRECISION:
        raise SerdeError(
            f"Avro decimal({precision}, {scale}) at {path or 'the top level'} exceeds Spark's "
            f"maximum precision of {_MAX_DECIMAL_PRECISION}"
        )
    return pa.decimal128(precision, scale)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name
