"""Writer schemas (Avro, Protobuf, JSON Schema) from a Confluent Schema Registry, fetched by
id and cached."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from .arrowtypes import decodable
from .base import SerdeError, describe_exception
from .options import RoleOptions, scrub

# confluent-kafka checks these settings' types; Spark options are always strings.
_NUMERIC_SETTINGS = {
    "timeout",
    "cache.capacity",
    "cache.latest.ttl.sec",
    "max.retries",
    "retries.wait.ms",
    "retries.max.wait.ms",
}

# A schema id names one schema forever, so a Python worker that Spark reuses across tasks and
# micro-batches fetches each id once, not once per deserialized task. Keyed by the whole client
# configuration too: a query must not read schemas with another query's credentials.
_SCHEMAS_BY_ID: dict[tuple, RegistrySchema] = {}
_SCHEMAS_LOCK = threading.Lock()


class SchemaLookupError(Exception):
    """A writer schema cannot be fetched; the message is ready to be a record error."""


# The registry's schemaType for each format; Avro schemas may omit it.
AVRO, PROTOBUF, JSON = "AVRO", "PROTOBUF", "JSON"


@dataclass(frozen=True)
class RegistrySchema:
    """A registered schema and the schemas it references, dependencies first.

    Avro: the schema JSON object, references the same. JSON Schema: the schema JSON object.
    Protobuf: the schema text as served (a base64 ``FileDescriptorProto`` when asked with
    ``format=serialized``), references ``(import name, text)`` pairs.
    """

    schema: Any
    references: tuple = ()
    kind: str = AVRO


def subject_for(opts: RoleOptions, topic: str | None) -> tuple[str | None, str]:
    """The subject whose latest schema a query reads, and the option to name in errors:
    ``{role}.schema.registry.subject``, else ``<topic>-<role>`` (Confluent's
    TopicNameStrategy) when the query reads exactly one topic, else None."""
    option = opts.name("schema.registry.subject")
    subject = opts.get("schema.registry.subject")
    if subject is None and topic is not None:
        subject = f"{topic}-{opts.role}"
        option = (f"{option} (unset, so {subject!r}: Confluent's TopicNameStrategy "
                  f"for topic {topic!r})")
    return subject, option


def redact_url(url: str) -> str:
    """``url`` with any ``user:password@`` replaced, for messages."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]))


class SchemaRegistry:
    """Fetches Avro schemas through confluent-kafka's ``SchemaRegistryClient``.

    The client is created on first use and dropped when pickled, so the object can travel to
    Spark executors. Settings come from ``{role}.schema.registry.url`` and every other
    ``{role}.schema.registry.<setting>`` option, passed to the client as ``<setting>``.

    >>> registry = SchemaRegistry.from_options(RoleOptions("value", {
    ...     "value.schema.registry.url": "http://registry:8081",
    ...     "value.schema.registry.basic.auth.user.info": "user:secret"}))
    >>> registry
    SchemaRegistry(url='http://registry:8081')
    """

    def __init__(self, url: str, settings: dict[str, Any], option_prefix: str, secrets: list[str]):
        self.url = url
        self._settings = settings
        self._option_prefix = option_prefix
        self._secrets = secrets
        self._client = None

    @classmethod
    def from_options(cls, opts: RoleOptions, fmt: str = "avro-confluent") -> SchemaRegistry:
        url = opts.require("schema.registry.url", fmt)
        settings: dict[str, Any] = {}
        for key, value in opts.with_prefix("schema.registry.").items():
            if key in ("url", "subject"):
                continue
            settings[key] = _number(value) if key in _NUMERIC_SETTINGS else value
        registry = cls(url, settings, opts.name("schema.registry."), opts.secrets())
        registry.client()  # fail at query start, naming the option, not on an executor
        return registry

    def __repr__(self) -> str:
        return f"SchemaRegistry(url={redact_url(self.url)!r})"

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_client"] = None
        return state

    def client(self):
        if self._client is None:
            from confluent_kafka.schema_registry import SchemaRegistryClient

            try:
                self._client = SchemaRegistryClient({"url": self.url, **self._settings})
            except (ValueError, TypeError) as exc:
                raise SerdeError(
                    f"invalid Schema Registry settings ({self._option_prefix}*): "
                    f"{self._scrub(str(exc))}"
                ) from None
        return self._client

    def schema_by_id(self, schema_id: int, kind: str = AVRO) -> RegistrySchema:
        """The writer schema registered under ``schema_id``; SchemaLookupError if unavailable
        or not of ``kind``."""
        key = (self.url, tuple(sorted(self._settings.items())), schema_id, kind)
        cached = _SCHEMAS_BY_ID.get(key)
        if cached is not None:
            return cached
        try:
            found = self._resolve(self.client().get_schema(schema_id, fmt=_fmt(kind)), kind)
        except SchemaLookupError as exc:
            raise SchemaLookupError(f"schema id {schema_id}: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - SchemaRegistryError, httpx errors...: all
            # become the error of this id's records, never an exception that stops the batch
            raise SchemaLookupError(
                f"schema id {schema_id} could not be fetched from the Schema Registry at "
                f"{redact_url(self.url)}: {self._scrub(describe_exception(exc))}"
            ) from None
        with _SCHEMAS_LOCK:
            _SCHEMAS_BY_ID[key] = found
        return found

    def latest(self, subject: str, option: str, kind: str = AVRO) -> RegistrySchema:
        """The latest schema of ``subject``; SerdeError naming ``option`` if unavailable."""
        try:
            latest = self.client().get_latest_version(subject, fmt=_fmt(kind))
            return self._resolve(latest.schema, kind)
        except SerdeError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported with the option to fix
            raise SerdeError(
                f"{option}: cannot fetch the latest schema of subject {subject!r} from the Schema "
                f"Registry at {redact_url(self.url)}: {self._scrub(describe_exception(exc))}"
            ) from None

    def _resolve(self, schema, kind: str = AVRO, seen: frozenset = frozenset()) -> RegistrySchema:
        found = (schema.schema_type or AVRO).upper()
        if found != kind:
            raise SchemaLookupError(f"it is a {found} schema, not {_KIND_NAMES[kind]}")
        references: list = []
        for ref in schema.references or ():
            if (ref.subject, ref.version) in seen:
                continue
            seen = seen | {(ref.subject, ref.version)}
            if kind == PROTOBUF and _builtin_proto(ref.name):
                continue  # google/protobuf/*.proto: every descriptor pool has them
            registered = self.client().get_version(ref.subject, ref.version, fmt=_fmt(kind))
            nested = self._resolve(registered.schema, kind, seen)
            own = (ref.name, nested.schema) if kind == PROTOBUF else nested.schema
            references.extend(r for r in [*nested.references, own] if r not in references)
        if kind == PROTOBUF:
            return RegistrySchema(schema.schema_str, tuple(references), kind)
        if kind == JSON:
            if references:
                raise SchemaLookupError("JSON Schema references to other subjects are not "
                                        "supported; only $ref within the schema")
            return RegistrySchema(json.loads(schema.schema_str), (), kind)
        return RegistrySchema(decodable(json.loads(schema.schema_str)), tuple(references))

    def _scrub(self, message: str) -> str:
        return scrub(message.replace(self.url, redact_url(self.url)), self._secrets)


_KIND_NAMES = {AVRO: "Avro", PROTOBUF: "Protobuf", JSON: "JSON Schema"}


def _fmt(kind: str) -> str | None:
    # Confluent's registry serves any Protobuf schema as a base64 FileDescriptorProto when
    # asked: no .proto parser needed (a registry that ignores it serves the text registered).
    return "serialized" if kind == PROTOBUF else None


def _builtin_proto(name: str | None) -> bool:
    return bool(name) and name.startswith(("google/protobuf/", "confluent/"))


def _number(value: Any) -> Any:
    try:
        return int(value)
    except (TypeError, ValueError):
        try:
            return float(value)
        except (TypeError, ValueError):
            return value  # let confluent-kafka report the bad type, naming the setting
