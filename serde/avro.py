"""Avro values: schemaless bodies with a given schema, and Confluent's wire format."""

from __future__ import annotations

import gc
import io
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import fastavro
import pyarrow as pa

from .arrowtypes import arrow_type_for, decodable, load_schema, parse_avro
from .base import DecodedBatch, SerdeError, describe_exception, payload_list
from .options import RoleOptions
from .registry import (
    RegistrySchema,
    SchemaLookupError,
    SchemaRegistry,
    redact_url,
    subject_for,
)

# Confluent wire format: magic byte 0, then the schema id as a 4-byte big-endian integer.
_MAGIC = 0
_HEADER_LEN = 5


@dataclass(frozen=True)
class _ReadPlan:
    """How to read datums of one writer schema: fastavro's parsed writer and reader schemas
    (reader None when it equals the writer, which skips schema resolution)."""

    writer: Any
    reader: Any


def _plan(writer: Any, writer_refs: Sequence, reader: Any, reader_refs: Sequence, option: str):
    named: dict = {}
    for ref in writer_refs:
        parse_avro(ref, option, named)
    parsed_writer = parse_avro(writer, option, named)
    if reader is None or (reader == writer and list(reader_refs) == list(writer_refs)):
        return _ReadPlan(parsed_writer, None)
    named = {}
    for ref in reader_refs:
        parse_avro(ref, option, named)
    return _ReadPlan(parsed_writer, parse_avro(reader, option, named))


@contextmanager
def _cycle_collection_paused():
    # Decoded values are trees of dicts and lists that cannot form reference cycles, yet each
    # batch allocates enough of them to trigger several full collections that traverse the
    # whole growing batch: measured, that is a third of the decoding time.
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def read_datums(
    payloads: Sequence[bytes | None],
    header_len: int,
    plan_for: Callable[[bytes], _ReadPlan | str],
) -> tuple[list, list[str | None]]:
    """Decode each payload's Avro datum after a ``header_len``-byte header.

    ``plan_for(header)`` gives the read plan for a header, or the error of every record that
    carries it; it is asked again only when the header changes. Each datum is read from its
    own buffer, so a corrupt one cannot consume its neighbour's bytes and its error message
    depends on its bytes alone (replays and split ranges agree).
    """
    with _cycle_collection_paused():
        return _read_datums(payload_list(payloads), header_len, plan_for)


def _read_datums(payloads: Sequence, header_len: int, plan_for) -> tuple[list, list]:
    values: list = [None] * len(payloads)
    errors: list[str | None] = [None] * len(payloads)
    read, buffer = fastavro.schemaless_reader, io.BytesIO
    header = writer = reader = failure = None
    for i, payload in enumerate(payloads):
        if payload is None:
            continue
        if header is None or payload[:header_len] != header:
            header = payload[:header_len]
            plan = plan_for(header)
            failure = plan if isinstance(plan, str) else None
            if failure is None:
                writer, reader = plan.writer, plan.reader
        if failure is not None:
            errors[i] = failure
            continue
        try:
            values[i] = read(buffer(payload[header_len:]), writer, reader)
        except Exception as exc:  # noqa: BLE001 - any decoder failure is this record's error
            errors[i] = (
                f"cannot decode Avro datum ({len(payload) - header_len} bytes): "
                f"{describe_exception(exc)}"
            )
    return values, errors


def to_arrow(values: list, errors: list[str | None], arrow_type: pa.DataType) -> pa.Array:
    """``pa.array(values)``; a value that does not fit ``arrow_type`` becomes a record error."""
    try:
        return pa.array(values, type=arrow_type)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        pass
    for i, value in enumerate(values):
        if value is None:
            continue
        try:
            pa.array([value], type=arrow_type)
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
            values[i] = None
            errors[i] = f"decoded value does not fit {arrow_type}: {describe_exception(exc)}"
    return pa.array(values, type=arrow_type)


class AvroDeserializer:
    """Schemaless Avro bodies written with ``{role}.avro.schema``.

    ``{role}.avro.readerSchema``, when set, is the schema values are resolved to (Avro schema
    evolution) and fixes the output type.

    >>> schema = '{"type": "record", "name": "R", "fields": [{"name": "n", "type": "int"}]}'
    >>> d = AvroDeserializer.from_options(RoleOptions("value", {"value.avro.schema": schema}))
    >>> d.decode([b"\\x54"]).array.to_pylist()
    [{'n': 42}]
    """

    def __init__(self, role: str, writer: Any, reader: Any | None = None):
        self.role = role
        self._writer = writer = decodable(writer)
        self._reader = reader = decodable(reader)
        parse_avro(writer, f"{role}.avro.schema")
        if reader is None:
            self.arrow_type = arrow_type_for(writer, f"{role}.avro.schema")
        else:
            self.arrow_type = arrow_type_for(reader, f"{role}.avro.readerSchema")
        self._read_plan: _ReadPlan | None = None

    @classmethod
    def from_options(cls, opts: RoleOptions) -> AvroDeserializer:
        text = opts.require("avro.schema", "avro", " (the writer's Avro schema JSON)")
        writer = load_schema(text, opts.name("avro.schema"))
        reader_text = opts.get("avro.readerschema")
        reader = load_schema(reader_text, opts.name("avro.readerSchema")) if reader_text else None
        return cls(opts.role, writer, reader)

    def __repr__(self) -> str:
        return f"AvroDeserializer(role={self.role!r}, arrow_type={self.arrow_type})"

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_read_plan": None}

    def _plan(self) -> _ReadPlan:
        if self._read_plan is None:
            option = f"{self.role}.avro.schema / {self.role}.avro.readerSchema"
            self._read_plan = _plan(self._writer, (), self._reader, (), option)
        return self._read_plan

    def decode_values(self, payloads: Sequence[bytes | None]) -> tuple[list, list[str | None]]:
        """Python values and record errors, without building Arrow."""
        plan = self._plan()
        return read_datums(payloads, 0, lambda header: plan)

    def decode(self, payloads: Sequence[bytes | None]) -> DecodedBatch:
        values, errors = self.decode_values(payloads)
        return DecodedBatch(to_arrow(values, errors, self.arrow_type), errors, values)


class ConfluentAvroDeserializer:
    """Avro in Confluent's wire format, writer schemas fetched from a Schema Registry by id.

    Values are resolved to one reader schema, which fixes the output type:
    ``{role}.avro.readerSchema``, else ``{role}.avro.schema``, else the latest schema of
    subject ``{role}.schema.registry.subject`` when the query starts.

    >>> d = ConfluentAvroDeserializer.from_options(RoleOptions("value", {
    ...     "value.schema.registry.url": "http://registry:8081",
    ...     "value.avro.readerSchema": '"long"'}))
    >>> d.decode([b"\\x01\\x00\\x00\\x00\\x07\\x02"]).errors
    ['unknown magic byte 1: not in Confluent wire format (magic byte 0, 4-byte schema id)']
    """

    def __init__(
        self,
        role: str,
        registry: SchemaRegistry,
        reader: RegistrySchema,
        reader_option: str = "avro.readerSchema",
    ):
        self.role = role
        self.registry = registry
        self._reader = reader = RegistrySchema(
            decodable(reader.schema), tuple(decodable(r) for r in reader.references))
        named: dict = {}
        for ref in reader.references:
            parse_avro(ref, f"{role}.{reader_option}", named)
        self.arrow_type = arrow_type_for(reader.schema, f"{role}.{reader_option}", named)
        self._plans: dict[int, _ReadPlan] = {}

    @classmethod
    def from_options(cls, opts: RoleOptions, topic: str | None = None
                     ) -> ConfluentAvroDeserializer:
        """``topic``: the one topic the query reads, if it reads exactly one; then subject
        ``<topic>-<role>`` (Confluent's TopicNameStrategy) is the default subject."""
        registry = SchemaRegistry.from_options(opts)
        for source in ("avro.readerSchema", "avro.schema"):
            text = opts.get(source.lower())
            if text is not None:
                reader = RegistrySchema(load_schema(text, opts.name(source)))
                break
        else:
            source = "schema.registry.subject"
            subject, option = subject_for(opts, topic)
            if subject is None:
                raise SerdeError(
                    f"{opts.name('format')}=avro-confluent needs the output type declared: set "
                    f"{opts.name('avro.readerSchema')}, {opts.name('avro.schema')} or "
                    f"{opts.name('schema.registry.subject')} (its latest schema is used). "
                    f"The default subject <topic>-{opts.role} (Confluent's TopicNameStrategy) "
                    f"applies only when the query reads exactly one topic (subscribe or "
                    f"assign), not with subscribePattern or several topics"
                )
            reader = registry.latest(subject, option)
        return cls(opts.role, registry, reader, source)

    def __repr__(self) -> str:
        return (
            f"ConfluentAvroDeserializer(role={self.role!r}, "
            f"registry={redact_url(self.registry.url)!r}, arrow_type={self.arrow_type})"
        )

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_plans": {}}

    def decode_values(self, payloads: Sequence[bytes | None]) -> tuple[list, list[str | None]]:
        """Python values and record errors, without building Arrow."""
        failed: dict[int, str] = {}  # one registry request per bad id and batch, not per record

        def plan_for(header: bytes) -> _ReadPlan | str:
            if len(header) < _HEADER_LEN:
                return (
                    f"payload of {len(header)} bytes is too short for Confluent wire format "
                    "(magic byte 0, 4-byte schema id)"
                )
            if header[0] != _MAGIC:
                return (
                    f"unknown magic byte {header[0]}: not in Confluent wire format "
                    "(magic byte 0, 4-byte schema id)"
                )
            schema_id = int.from_bytes(header[1:], "big")
            plan = self._plans.get(schema_id)
            if plan is not None:
                return plan
            if schema_id in failed:
                return failed[schema_id]
            try:
                plan = self._plan(schema_id)
            except (SchemaLookupError, SerdeError) as exc:
                failed[schema_id] = str(exc)
                return failed[schema_id]
            self._plans[schema_id] = plan
            return plan

        return read_datums(payloads, _HEADER_LEN, plan_for)

    def decode(self, payloads: Sequence[bytes | None]) -> DecodedBatch:
        values, errors = self.decode_values(payloads)
        return DecodedBatch(to_arrow(values, errors, self.arrow_type), errors, values)

    def _plan(self, schema_id: int) -> _ReadPlan:
        writer = self.registry.schema_by_id(schema_id)
        return _plan(
            writer.schema,
            writer.references,
            self._reader.schema,
            self._reader.references,
            f"schema id {schema_id}",
        )

