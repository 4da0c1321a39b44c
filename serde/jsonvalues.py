"""JSON objects, decoded in bulk by Arrow's JSON reader into a declared struct type."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.json as pa_json

from .base import DecodedBatch, SerdeError, describe_exception, payload_list

_MIN_BLOCK_SIZE = 1 << 20
# A failed chunk this small is retried record by record rather than halved further.
_ONE_BY_ONE_BELOW = 8


class JsonDeserializer:
    """JSON objects decoded into ``arrow_type``, a struct the connector derives from the Spark
    DDL in ``{role}.json.schema``.

    Fields absent from the type are ignored, absent fields are null, timestamps are ISO-8601
    strings and dates ``yyyy-MM-dd`` strings. A payload that is not one JSON object, or whose
    fields do not convert, is an error of that record only.

    >>> d = JsonDeserializer("value", pa.struct([("id", pa.int64())]))
    >>> batch = d.decode([b'{"id": 7, "extra": true}', b'[1]', None])
    >>> batch.array.to_pylist(), batch.errors
    ([{'id': 7}, None, None], [None, 'JSON value is an array, not an object', None])
    """

    def __init__(self, role: str, arrow_type: pa.DataType):
        option = f"{role}.json.schema"
        if not pa.types.is_struct(arrow_type):
            raise SerdeError(f"{option} must describe a struct, not {arrow_type}")
        _reject_maps(arrow_type, option)
        self.role = role
        self.arrow_type = arrow_type
        # Arrow's JSON reader converts dates only from numbers: read them as text, cast after.
        self._parse_type = _dates_as_strings(arrow_type)

    def __repr__(self) -> str:
        return f"JsonDeserializer(role={self.role!r}, arrow_type={self.arrow_type})"

    def decode(self, payloads: Sequence[bytes | None]) -> DecodedBatch:
        payloads = payload_list(payloads)
        errors: list[str | None] = [None] * len(payloads)
        candidates = []
        for i, payload in enumerate(payloads):
            if payload is None:
                continue
            if _is_one_object(payload):
                candidates.append(i)
            else:
                errors[i] = _explain(payload, None)
        pieces: list[tuple[list[int], pa.Array]] = []
        self._parse_into(payloads, candidates, pieces, errors)
        if not pieces:
            return DecodedBatch(pa.nulls(len(payloads), self.arrow_type), errors)
        row_of: list[int | None] = [None] * len(payloads)
        row = 0
        for indices, _ in pieces:
            for i in indices:
                row_of[i] = row
                row += 1
        rows = pa.concat_arrays([array for _, array in pieces])
        return DecodedBatch(rows.take(pa.array(row_of, type=pa.int64())), errors)

    def _parse_into(self, payloads, indices: list[int], pieces: list, errors: list) -> None:
        """Parse ``indices`` in bulk; when that fails, halve until the bad records are alone."""
        if not indices:
            return
        try:
            pieces.append((indices, self._parse([payloads[i] for i in indices])))
            return
        except (pa.ArrowException, _RowCountMismatch) as exc:
            if len(indices) == 1:
                errors[indices[0]] = _explain(payloads[indices[0]], exc)
                return
        if len(indices) <= _ONE_BY_ONE_BELOW:
            parts = [[i] for i in indices]
        else:
            middle = len(indices) // 2
            parts = [indices[:middle], indices[middle:]]
        for part in parts:
            self._parse_into(payloads, part, pieces, errors)

    def _parse(self, objects: list[bytes]) -> pa.Array:
        data = b"\n".join(objects)
        parse_options = pa_json.ParseOptions(
            explicit_schema=pa.schema(list(self._parse_type)),
            unexpected_field_behavior="ignore",
            newlines_in_values=data.count(b"\n") != len(objects) - 1,
        )
        # One object must never straddle two blocks: Arrow would fail the whole block.
        block_size = max(_MIN_BLOCK_SIZE, max(map(len, objects)) + 1)
        # Threads only pay off with several blocks; a thread pool per tiny retry costs more.
        read_options = pa_json.ReadOptions(
            block_size=block_size, use_threads=len(data) > block_size)
        table = pa_json.read_json(io.BytesIO(data), read_options=read_options,
                                  parse_options=parse_options)
        if table.num_rows != len(objects):
            raise _RowCountMismatch()
        rows = table.to_struct_array().combine_chunks()
        rows.validate(full=True)  # Arrow's JSON reader lets invalid UTF-8 into strings
        return rows if rows.type == self.arrow_type else rows.cast(self.arrow_type)


class _RowCountMismatch(Exception):
    """Some payload held more than one JSON object."""


def _is_one_object(payload: bytes) -> bool:
    # Every payload must start with "{" and end with "}": then no truncated object can merge
    # with the next payload in the newline-joined input (after "}" only "," or a closing
    # bracket may follow inside an object, never "{"). Arrow also crashes on a bare "null".
    if payload[:1] == b"{" and payload[-1:] == b"}":
        return True
    stripped = bytes(payload).strip()
    return stripped[:1] == b"{" and stripped[-1:] == b"}"


_KINDS = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}


def _explain(payload: bytes, exc: BaseException | None) -> str:
    try:
        value = json.loads(bytes(payload))
    except UnicodeDecodeError as error:
        return f"invalid UTF-8 in JSON: {error}"
    except ValueError as error:
        return f"invalid JSON: {error}"
    if not isinstance(value, dict):
        return f"JSON value is {_KINDS.get(type(value), 'a number')}, not an object"
    if exc is None or isinstance(exc, _RowCountMismatch):
        return "payload holds more than one JSON value"
    message = describe_exception(exc).removeprefix("ArrowInvalid: ")
    return f"JSON does not match the declared schema: {message.removesuffix(' in row 0')}"


def _reject_maps(arrow_type: pa.DataType, option: str) -> None:
    if pa.types.is_map(arrow_type):
        raise SerdeError(
            f"{option}: map types are not supported for JSON (Arrow's JSON reader cannot build "
            "them); declare a struct with the expected keys instead"
        )
    if pa.types.is_struct(arrow_type):
        for field in arrow_type:
            _reject_maps(field.type, option)
    elif pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        _reject_maps(arrow_type.value_type, option)


def _dates_as_strings(arrow_type: pa.DataType) -> pa.DataType:
    if pa.types.is_date(arrow_type):
        return pa.string()
    if pa.types.is_struct(arrow_type):
        return pa.struct([f.with_type(_dates_as_strings(f.type)) for f in arrow_type])
    if pa.types.is_list(arrow_type):
        return pa.list_(arrow_type.value_field.with_type(_dates_as_strings(arrow_type.value_type)))
    return arrow_type
