"""Deduplication that follows kwatermark's per-partition watermark (DESIGN §16): the first row
per key comes out at once, later rows of the key within ``within`` of its event time are
dropped, and the key's state is released when the combined watermark passes
``first + within``. The decision is pure (:class:`kwatermark.joining.KeyFirsts`, a bucket's
keys in :class:`kwatermark.deduping.BucketFirsts`); the processor here holds a bucket of keys
per grouping key of Spark's state store with ``transformWithState``.

>>> from kwatermark.dedup import drop_duplicates                  # doctest: +SKIP
>>> unique = drop_duplicates(events, ["event_id"], within="10 minutes")
>>> unique.writeStream.outputMode("append").format("console").start()
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterator, Sequence

from pyspark.sql import DataFrame, Row
from pyspark.sql import functions as F
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from kwatermark.clock import (
    check_heartbeat,
    follow_watermarks,
    prepare_session,
    refuse_union,
    require_min_policy,
    streams,
    wake_at,
)
from kwatermark.deduping import BucketFirsts, ChunkStore, FirstsIndex
from kwatermark.joining import FIRST, LATE, JoinError, is_late, operator_watermark
from kwatermark.options import parse_duration_ms

__all__ = ["drop_duplicates"]

TIME, MARK = "kwatermark_time", "kwatermark_watermark"
BUCKET, CHUNK = "kwatermark_dedup_bucket", "kwatermark_chunk"
# Keys share Spark's grouping key (one processor call, one index and one timer per bucket and
# micro-batch instead of per key) by their hash modulo KEY_BUCKETS; within a bucket, their
# firsts are held in CHUNKS map-state values by a second hash (one state read and write per
# touched chunk instead of per key). Measured in bench/bench_joins.py.
KEY_BUCKETS = 32
CHUNKS = 4
# The state layout, recorded in every bucket's index. Layout 1 (before buckets) grouped by
# the key columns, one value per key: Spark refuses such a checkpoint at start (its grouping
# key differs; the error names kwatermark_dedup_bucket), see docs/dedup.md.
LAYOUT = 2
# A directory: each task's processor writes a cProfile there (bench/README.md, dedup profile).
PROFILE_ENV = "KWATERMARK_DEDUP_PROFILE"


def drop_duplicates(df: DataFrame | Sequence[DataFrame], cols: Sequence[str], within: str
                    ) -> DataFrame:
    """The rows of a ``format("kwatermark")`` stream (``watermark.heartbeat=true``) without
    the duplicates of a key: the first row of a key comes out at once (``kind = first``);
    a later row of the same ``cols`` whose event time is within ``within`` of a first's is
    dropped; a row at or below the operator's watermark (its own row's with one stream, the
    lowest of the streams' with several) comes out with ``kind = late`` (never silently
    dropped; not checked for duplicates). Output: the input's columns and ``kind``; append
    mode. Several streams (a list) are deduplicated together, each following its own
    watermark. See docs/dedup.md.

    >>> drop_duplicates(events, ["event_id"], within="1 hour")        # doctest: +SKIP
    """
    within_ms = parse_duration_ms("within", within)
    cols = list(cols)
    frames = streams(df)
    if not cols or not frames:
        raise JoinError("drop_duplicates needs a stream and at least one key column")
    schema = frames[0].schema
    for frame in frames:
        check_heartbeat(frame, "kwatermark.dedup.drop_duplicates", JoinError)
        refuse_union(frame, "kwatermark.dedup.drop_duplicates",
                     "drop_duplicates([a, b], ...)", JoinError)
        missing = [c for c in (*cols, "event_time") if c not in frame.columns]
        if missing:
            raise JoinError(f"drop_duplicates: no column {missing[0]!r} in the stream; its "
                            f"columns are {', '.join(frame.columns)}")
        if frame.schema != schema:
            raise JoinError("drop_duplicates: the streams must have the same columns")
    if not isinstance(schema["event_time"].dataType, TimestampType):
        raise JoinError("drop_duplicates: event_time must be a timestamp")
    prepare_session(frames[0], "kwatermark.dedup", JoinError)
    if len(frames) > 1:
        require_min_policy(frames[0], "kwatermark.dedup.drop_duplicates", JoinError)
    names = [f.name for f in schema.fields]
    keys = [F.col(c) for c in cols]
    prepared = [f.select(*[F.col(c) for c in names],
                         F.unix_millis(F.col("event_time")).alias(TIME),
                         F.unix_millis(F.col("watermark")).alias(MARK),
                         F.pmod(F.xxhash64(*keys), F.lit(KEY_BUCKETS)).cast("int").alias(BUCKET),
                         F.pmod(F.xxhash64(F.lit("chunk"), *keys), F.lit(CHUNKS)).cast("int")
                         .alias(CHUNK)) for f in frames]
    output = StructType([*(StructField(f.name, f.dataType, True) for f in schema.fields),
                         StructField("kind", StringType(), False)])
    return (follow_watermarks(prepared, MARK)
            .groupBy(BUCKET)
            .transformWithState(DedupProcessor(within_ms, names, cols, output.names, CHUNKS,
                                               len(frames)),
                                output, "Append", "EventTime"))


class DedupProcessor(StatefulProcessor):
    """The thin shell: Spark groups by a bucket of keys; per bucket, a
    :class:`kwatermark.deduping.FirstsIndex` (one small value: each chunk's earliest release),
    the chunks (``{key: [first event time, ...]}``, pickled) in a map state, and one event-time
    timer at the bucket's earliest release."""

    def __init__(self, within_ms: int, columns: list[str], cols: list[str], output: list[str],
                 chunks: int, inputs: int = 1):
        self.within_ms = within_ms
        self.chunks = chunks
        self.inputs = inputs  # streams deduplicated together: see operator_watermark
        self.columns = columns
        self.cols = cols
        # Spark converts output rows by field name: a Row class with the output's names.
        self.output = Row(*output)

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self._profile = None
        if os.environ.get(PROFILE_ENV):
            import cProfile

            self._profile = cProfile.Profile()
            self._profile.enable()
        self.index = handle.getValueState("dedup_index", _INDEX_SCHEMA)
        self.store = _MapChunks(handle.getMapState(
            "dedup_chunks", StructType([StructField("chunk", IntegerType(), True)]),
            StructType([StructField("firsts", BinaryType(), True)])))

    def handleInputRows(self, key: tuple, rows: Iterator[Row],
                        timerValues: TimerValues) -> Iterator[Row]:
        batch = [r for r in rows if r["is_heartbeat"] is not True]
        if not batch:
            return
        # Replays see the same rows in any order: one order, for the same first every time.
        batch.sort(key=lambda r: (r[MARK] is not None, r[MARK] or 0, r[TIME] or 0,
                                  repr(tuple(r[c] for c in self.columns))))
        watermark = timerValues.getCurrentWatermarkInMs()
        kinds: list[str | None] = [None] * len(batch)
        keyed = []
        for n, r in enumerate(batch):
            user_key = tuple(_hashable(r[c]) for c in self.cols)
            mark = operator_watermark(r[MARK], watermark, self.inputs)
            if any(part is None for part in user_key):
                # A null key part is no key (Spark's dropDuplicates keeps such rows apart too,
                # but a null event id is not a duplicate of another): each row comes out.
                kinds[n] = LATE if is_late(r[TIME], mark) else FIRST
            else:
                keyed.append((n, (r[CHUNK], user_key, r[TIME], mark)))
        if keyed:
            bucket = BucketFirsts(self._load(), self.store)
            for (n, _), kind in zip(keyed, bucket.apply(self.within_ms, [k for _, k in keyed],
                                                        watermark)):
                kinds[n] = kind
            self._save(bucket.index, watermark)
        for r, kind in zip(batch, kinds):
            if kind is not None:
                yield self.output(*(r[c] for c in self.columns), kind)

    def handleExpiredTimer(self, key: tuple, timerValues: TimerValues,
                           expiredTimerInfo: ExpiredTimerInfo) -> Iterator[Row]:
        # A timer fires once Spark's watermark reaches its time (kwatermark.clock.wake_at puts
        # it at the wake-up itself); the chunks due then release their firsts.
        watermark = timerValues.getCurrentWatermarkInMs()
        bucket = BucketFirsts(self._load(), self.store)
        bucket.fire(self.within_ms, watermark)
        self._save(bucket.index, watermark)
        return iter(())

    def close(self) -> None:
        if self._profile is not None:
            self._profile.disable()
            self._profile.dump_stats(os.path.join(os.environ[PROFILE_ENV],
                                                  f"{os.getpid()}-{id(self):x}.prof"))

    def _load(self) -> FirstsIndex:
        stored = self.index.get()
        if not stored:
            return FirstsIndex()
        layout, data = stored
        chunks, wakes = pickle.loads(data) if layout == LAYOUT else (None, None)
        if layout != LAYOUT or chunks != self.chunks:
            # A key's chunk is its hash modulo the chunk count: read with another count, its
            # firsts would not be found and its duplicates would come out again.
            raise JoinError(
                f"this checkpoint's dedup state has layout {layout}"
                + (f" with {chunks} chunks per bucket" if chunks is not None else "")
                + f"; this kwatermark reads layout {LAYOUT} with {self.chunks}: run the "
                f"kwatermark version that wrote the checkpoint, or start on a new checkpoint")
        return FirstsIndex(wakes)

    def _save(self, index: FirstsIndex, watermark: int) -> None:
        wake_at(self.handle, index.wake_up(), watermark)
        if index.wakes:
            self.index.update((LAYOUT, pickle.dumps((self.chunks, index.wakes), protocol=5)))
        else:
            self.index.clear()


_INDEX_SCHEMA = StructType([StructField("layout", IntegerType(), True),
                            StructField("wakes", BinaryType(), True)])


class _MapChunks(ChunkStore):
    """Chunks in a ``MapState`` (chunk id -> pickled ``{key: [first, ...]}``)."""

    def __init__(self, state):
        self.state = state

    def get(self, chunk: int) -> dict:
        stored = self.state.getValue((chunk,))
        return pickle.loads(stored[0]) if stored else {}

    def put(self, chunk: int, firsts: dict) -> None:
        self.state.updateValue((chunk,), (pickle.dumps(firsts, protocol=5),))

    def remove(self, chunk: int) -> None:
        self.state.removeKey((chunk,))


def _hashable(value: object) -> object:
    """A key column's value as a dict key: Spark gives binary as bytearray, arrays as lists,
    maps as dicts and structs as Rows."""
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((_hashable(k), _hashable(v)) for k, v in value.items()))
    if isinstance(value, tuple):          # Row
        return tuple(_hashable(v) for v in value)
    return value
