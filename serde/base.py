"""The decoder contract shared by every format: errors, results and the protocol."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import pyarrow as pa


class SerdeError(ValueError):
    """A deserializer cannot be built from the given options.

    The message names the offending option (``value.format``, ``value.avro.schema``, ...) or
    schema id and says what to do. Errors of single records are never raised: they are
    reported in :attr:`DecodedBatch.errors`.

    >>> raise SerdeError("value.format: unknown format 'xml'")
    Traceback (most recent call last):
    ...
    kwatermark.serde.base.SerdeError: value.format: unknown format 'xml'
    """


@dataclass(frozen=True)
class DecodedBatch:
    """The decoded form of a batch of Kafka keys or values, one entry per payload.

    ``array`` has the deserializer's ``arrow_type`` and is null where the payload was None or
    could not be decoded; ``errors`` holds None for good records (a null payload is good) and
    the decoder's message for bad ones; ``values`` holds the Python objects when decoding
    produced them anyway (Avro), else None.

    >>> from kwatermark.serde import make_deserializer
    >>> batch = make_deserializer("value", {"value.format": "string"}).decode([b"hi", None])
    >>> batch.array.to_pylist(), batch.errors
    (['hi', None], [None, None])
    """

    array: pa.Array
    errors: list[str | None]
    values: list | None = None


@runtime_checkable
class Deserializer(Protocol):
    """Turns raw Kafka payloads into an Arrow array of ``arrow_type``.

    Implementations are picklable (they travel to Spark executors) and never raise for a bad
    record. ``payloads`` may also be an Arrow binary array (the Kafka ``value`` column).

    >>> from kwatermark.serde import make_deserializer
    >>> d = make_deserializer("key", {"key.format": "string"})
    >>> d.arrow_type
    DataType(string)
    """

    arrow_type: pa.DataType

    def decode(self, payloads: Sequence[bytes | None]) -> DecodedBatch: ...


def payload_list(payloads: Sequence[bytes | None] | pa.Array | pa.ChunkedArray) -> Sequence:
    """``payloads`` as a sequence of ``bytes``/None; an Arrow binary column is converted once."""
    if isinstance(payloads, (pa.Array, pa.ChunkedArray)):
        return payloads.to_pylist()
    return payloads


def describe_exception(exc: BaseException) -> str:
    """A one-line record error message: the decoder's own text, or its type when it has none."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
