"""The output schema and Arrow record batch building.

Spark validates a yielded batch against the declared schema exactly (DESIGN §9): field
order, nullable fields, ``binary`` (not large_binary), timestamps as ``timestamp("us",
tz="UTC")``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from kwatermark.watermarks import UNDEFINED

TIMESTAMP = pa.timestamp("us", tz="UTC")
HEADERS = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))


@dataclass(frozen=True)
class OutputLayout:
    """Which optional columns the source emits, and the decoded columns' types."""

    include_headers: bool = False
    heartbeat: bool = False
    flag_late: bool = False
    key_type: pa.DataType | None = None
    value_type: pa.DataType | None = None
    error_column: bool = False
    key_error_column: bool = False

    def schema(self) -> pa.Schema:
        fields = [
            pa.field("key", pa.binary()),
            pa.field("value", pa.binary()),
            pa.field("topic", pa.string()),
            pa.field("partition", pa.int32()),
            pa.field("offset", pa.int64()),
            pa.field("timestamp", TIMESTAMP),
            pa.field("timestampType", pa.int32()),
        ]
        if self.include_headers:
            fields.append(pa.field("headers", HEADERS))
        fields += [pa.field("event_time", TIMESTAMP), pa.field("watermark", TIMESTAMP)]
        if self.heartbeat:
            fields.append(pa.field("is_heartbeat", pa.bool_()))
        if self.flag_late:
            fields.append(pa.field("is_late", pa.bool_()))
        if self.key_type is not None:
            fields.append(pa.field("key_decoded", self.key_type))
        if self.value_type is not None:
            fields.append(pa.field("value_decoded", self.value_type))
        if self.error_column:
            fields.append(pa.field("value_error", pa.string()))
        if self.key_error_column:
            fields.append(pa.field("key_error", pa.string()))
        return pa.schema(fields)


@functools.lru_cache(maxsize=64)
def schema_of(layout: OutputLayout) -> pa.Schema:
    """``layout.schema()``, built once per layout (a pack makes a reader per range)."""
    return layout.schema()


def timestamps(ms: np.ndarray, missing: np.ndarray | None = None) -> pa.Array:
    """Epoch ms (int64) as a UTC microsecond timestamp array, null where ``missing`` (by
    default where ``ms`` is UNDEFINED). Without nulls the microseconds become the array's
    buffer as they are (no mask, no cast: three of these per block, every block)."""
    if missing is None:
        missing = ms == UNDEFINED
    if missing.any():
        return pa.array(np.where(missing, 0, ms) * 1000, type=pa.int64(), mask=missing
                        ).cast(TIMESTAMP)
    micros = np.asarray(ms, dtype=np.int64) * 1000
    return pa.Array.from_buffers(TIMESTAMP, len(micros), [None, pa.py_buffer(micros)])


def _topic_column(topics: list[str], topic_index: np.ndarray) -> pa.Array:
    """Each row's topic name (``topics[topic_index[i]]``). One topic, the usual case, is
    written out directly: a dictionary cast took ~12 times as long."""
    name = topics[0].encode()   # a Kafka topic name is never empty
    n = len(topic_index)
    if len(topics) > 1 or n * len(name) > np.iinfo(np.int32).max:
        return pa.DictionaryArray.from_arrays(pa.array(topic_index),
                                              pa.array(topics)).cast(pa.string())
    offsets = np.arange(0, (n + 1) * len(name), len(name), dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets),
                                                  pa.py_buffer(name * n)])


def kafka_columns(layout: OutputLayout, topic: str, partition: int, keys: list, values: list,
                  offsets: np.ndarray, timestamps_ms: np.ndarray, timestamp_types: np.ndarray,
                  headers: list | None) -> list[pa.Array]:
    n = len(offsets)
    return _kafka_columns(layout, [topic], np.full(n, partition, dtype=np.int32),
                          np.zeros(n, dtype=np.int32), keys, values, offsets, timestamps_ms,
                          timestamp_types, headers)


def kafka_columns_of(layout: OutputLayout, blocks: list) -> list[pa.Array]:
    """The Kafka columns of several ``RecordBlock``s (of any partitions), one after another."""
    if len(blocks) == 1 and blocks[0].placed is None:
        b = blocks[0]
        return kafka_columns(layout, b.topic, b.partition, b.keys, b.values, b.offsets,
                             b.timestamps_ms, b.timestamp_types, b.headers)
    placed = [b.placed if b.placed is not None else
              ([b.topic], np.zeros(len(b), dtype=np.int32),
               np.full(len(b), b.partition, dtype=np.int32)) for b in blocks]
    topics = sorted({topic for names, _, _ in placed for topic in names})
    index = {topic: i for i, topic in enumerate(topics)}
    return _kafka_columns(
        layout, topics, _joined([partitions for _, _, partitions in placed]),
        _joined([np.array([index[t] for t in names], dtype=np.int32)[at]
                 for names, at, _ in placed]),
        _joined([b.keys for b in blocks]), _joined([b.values for b in blocks]),
        _joined([b.offsets for b in blocks]),
        _joined([b.timestamps_ms for b in blocks]),
        _joined([b.timestamp_types for b in blocks]),
        _joined([b.headers for b in blocks]) if layout.include_headers else None)


def _joined(columns: list) -> list | pa.Array | np.ndarray:
    """Blocks' columns one after another: Python lists (the Python engine), Arrow arrays (the
    compiled engine, kwatermark.compiled) or numpy arrays. One column is itself, not a copy:
    a compiled block of several ranges (``placed``) comes alone, and concatenating it alone
    copied every key and value once more."""
    if len(columns) == 1:
        return columns[0]
    if isinstance(columns[0], pa.Array):
        return pa.concat_arrays(columns)
    if isinstance(columns[0], np.ndarray):
        return np.concatenate(columns)
    return [item for column in columns for item in column]


def _column(items: list | pa.Array, kind: pa.DataType) -> pa.Array:
    return items if isinstance(items, pa.Array) else pa.array(items, type=kind)


def _kafka_columns(layout: OutputLayout, topics: list[str], partitions: np.ndarray,
                   topic_index: np.ndarray, keys: list, values: list, offsets: np.ndarray,
                   timestamps_ms: np.ndarray, timestamp_types: np.ndarray,
                   headers: list | None) -> list[pa.Array]:
    columns = [
        _column(keys, pa.binary()),
        _column(values, pa.binary()),
        _topic_column(topics, topic_index),
        pa.array(partitions),
        pa.array(offsets, type=pa.int64()),
        timestamps(timestamps_ms, missing=timestamps_ms < 0),
        pa.array(timestamp_types, type=pa.int32()),
    ]
    if layout.include_headers:
        columns.append(_column(headers, HEADERS))
    return columns


def heartbeat_batch(layout: OutputLayout, watermark_ms: int | None) -> pa.RecordBatch:
    """The one row of a heartbeat micro-batch (DESIGN §10): no Kafka record, only the
    watermark it carries and ``is_heartbeat`` true."""
    schema = layout.schema()
    columns = []
    for f in schema:
        if f.name == "watermark":
            columns.append(pa.array([None if watermark_ms is None else watermark_ms * 1000],
                                    type=pa.int64()).cast(TIMESTAMP))
        elif f.name == "is_heartbeat":
            columns.append(pa.array([True]))
        else:
            columns.append(pa.nulls(1, type=f.type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)
