"""Choosing a deserializer from the ``{role}.format`` option."""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa

from .avro import AvroDeserializer, ConfluentAvroDeserializer
from .base import Deserializer, SerdeError
from .jsonschema import ConfluentJsonSchemaDeserializer
from .jsonvalues import JsonDeserializer
from .options import RoleOptions
from .protobuf import ConfluentProtobufDeserializer
from .text import StringDeserializer

FORMATS = ("binary", "string", "json", "avro", "avro-confluent", "protobuf-confluent",
           "json-schema-confluent")


def make_deserializer(
    role: str,
    options: Mapping[str, str],
    *,
    json_arrow_type: pa.DataType | None = None,
    topic: str | None = None,
) -> Deserializer | None:
    """The deserializer ``{role}.format`` asks for, or None for ``binary`` (no decoded column).

    ``role`` is ``"key"`` or ``"value"``; option names and the format value are matched
    case-insensitively. ``json_arrow_type`` is the struct the caller derived from
    ``{role}.json.schema`` (serde does not parse Spark DDL). ``topic`` is the one topic the
    query reads, if it reads exactly one: the ``*-confluent`` formats then default to subject
    ``<topic>-<role>`` (Confluent's TopicNameStrategy).

    >>> make_deserializer("value", {"value.format": "String"}).decode([b"a"]).array.to_pylist()
    ['a']
    """
    opts = RoleOptions(role, options)
    fmt = (opts.get("format") or "binary").strip().lower()
    if fmt == "binary":
        return None
    if fmt == "string":
        return StringDeserializer()
    if fmt == "json":
        if json_arrow_type is None:
            raise SerdeError(
                f"{opts.name('json.schema')} (a Spark DDL schema such as 'id BIGINT, ts "
                f"TIMESTAMP') is required when {opts.name('format')} is json"
            )
        return JsonDeserializer(role, json_arrow_type)
    if fmt == "avro":
        return AvroDeserializer.from_options(opts)
    if fmt == "avro-confluent":
        return ConfluentAvroDeserializer.from_options(opts, topic)
    if fmt == "protobuf-confluent":
        return ConfluentProtobufDeserializer.from_options(opts, topic)
    if fmt == "json-schema-confluent":
        return ConfluentJsonSchemaDeserializer.from_options(opts, topic)
    raise SerdeError(
        f"{opts.name('format')}: unknown format {opts.get('format')!r}; "
        f"accepted values: {', '.join(FORMATS)}"
    )
