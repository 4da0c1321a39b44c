"""UTF-8 text values."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from .base import DecodedBatch, payload_list


class StringDeserializer:
    """Payloads as UTF-8 strings; invalid UTF-8 is an error of that record.

    >>> batch = StringDeserializer().decode([b"caf\\xc3\\xa9", b"\\xff", None])
    >>> batch.array.to_pylist()
    ['café', None, None]
    >>> batch.errors[1]
    "invalid UTF-8: 'utf-8' codec can't decode byte 0xff in position 0: invalid start byte"
    """

    arrow_type = pa.string()

    def __repr__(self) -> str:
        return "StringDeserializer()"

    def decode(self, payloads: Sequence[bytes | None]) -> DecodedBatch:
        if isinstance(payloads, pa.ChunkedArray):
            payloads = payloads.combine_chunks()
        raw = payloads if isinstance(payloads, pa.Array) else pa.array(payloads, pa.binary())
        if raw.type != pa.binary():
            raw = raw.cast(pa.binary())
        try:
            # Arrow validates UTF-8 in C++: the common all-good batch never loops in Python.
            return DecodedBatch(raw.cast(pa.string()), [None] * len(payloads))
        except pa.ArrowInvalid:
            pass
        payloads = payload_list(payloads)
        texts: list[str | None] = [None] * len(payloads)
        errors: list[str | None] = [None] * len(payloads)
        for i, payload in enumerate(payloads):
            if payload is None:
                continue
            try:
                texts[i] = bytes(payload).decode("utf-8")
            except UnicodeDecodeError as exc:
                errors[i] = f"invalid UTF-8: {exc}"
        return DecodedBatch(pa.array(texts, type=pa.string()), errors)
