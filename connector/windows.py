"""Event-time windowed aggregation that follows kwatermark's per-partition watermark.

Spark's ``groupBy(window(...))`` evicts by Spark's own global watermark and cannot be tied to
the ``watermark`` column, so kwatermark ships the windowing itself (DESIGN §10): the window
logic is pure (:mod:`kwatermark.windowing`), held per key in Spark's state store by a
``transformWithStateInPandas`` processor and woken by Spark's event-time timers, which fire as
Spark's watermark, fed from the ``watermark`` column, passes them.

>>> from kwatermark.windows import aggregate, tumbling           # doctest: +SKIP
>>> events = (spark.readStream.format("kwatermark")
...           .option("kafka.bootstrap.servers", "localhost:9092")
...           .option("subscribe", "events")
...           .option("watermark.heartbeat", "true")         # the last windows come out
...           .load())
>>> counts = aggregate(events, tumbling("10 seconds"), by=["key"],
...                    aggs={"n": ("count", None)})
>>> counts.writeStream.outputMode("append").format("console").start()
"""

from __future__ import annotations

import logging
import os
import pickle
from collections.abc import Iterator, Mapping, Sequence

import pandas as pd
import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from kwatermark import pandas_io
from kwatermark.clock import (
    check_heartbeat,
    follow_watermarks,
    prepare_session,
    refuse_union,
    require_min_policy,
    streams,
)
from kwatermark.options import parse_duration_ms
from kwatermark.pandas_io import BUCKET, INPUT, MARK, TIME
from kwatermark.ticks import with_ticks
from kwatermark.windowing import (
    IS_LATE,
    START,
    Agg,
    Assigner,
    BucketSessions,
    BucketWindows,
    ChunkStore,
    KeyStore,
    Partials,
    Session,
    SessionIndex,
    Sliding,
    Tumbling,
    WindowError,
    WindowIndex,
    WindowSpec,
    accumulator_columns,
    combine,
    index_of_key_sessions,
    index_of_key_windows,
    row_partials,
)

log = logging.getLogger("kwatermark.windows")

__all__ = ["WindowError", "aggregate", "session", "sliding", "tumbling"]

_INTEGRAL = (ByteType, ShortType, IntegerType, LongType)
# Keys share Spark's grouping key (and state value, and timer) by their hash modulo this: one
# processor call per bucket and batch instead of one per key (see docs/windows.md, "State").
KEY_BUCKETS = 32
# A directory: each task's processor writes a cProfile there (bench/bench_windows.py --profile).
PROFILE_ENV = "KWATERMARK_WINDOWS_PROFILE"


def tumbling(size: str, offset: str = "0 seconds") -> Tumbling:
    """Fixed windows: ``tumbling("10 seconds")``."""
    return Tumbling(parse_duration_ms("tumbling size", size),
                    parse_duration_ms("tumbling offset", offset))


def sliding(size: str, slide: str) -> Sliding:
    """Overlapping windows: ``sliding("1 minute", "10 seconds")`` (size a multiple of slide)."""
    return Sliding(parse_duration_ms("sliding size", size),
                   parse_duration_ms("sliding slide", slide))


def session(gap: str) -> Session:
    """Per-key sessions closed by ``gap`` of silence: ``session("30 seconds")``."""
    return Session(parse_duration_ms("session gap", gap))


def aggregate(df: DataFrame | Sequence[DataFrame], windows: Assigner, by: Sequence[str] = (),
              aggs: Mapping[str, tuple[str, str | None]] | None = None,
              allowed_lateness: str = "0 seconds", time_column: str = "event_time",
              key_buckets: int = KEY_BUCKETS) -> DataFrame:
    """Windowed aggregates of a ``format("kwatermark")`` stream, complete by the per-partition
    watermark; write the result in append mode.

    Output: the ``by`` columns, ``window_start``, ``window_end``, one column per ``aggs``
    entry (``count``, ``sum``, ``min``, ``max``, ``avg``, ``first``, ``last``) and ``kind``:
    ``final`` (once per window, when the watermark completes it), ``update`` (the whole
    aggregate again after a record within ``allowed_lateness``), ``late`` (the aggregate of
    the records past the lateness alone; never silently dropped). See docs/windows.md.

    Several streams (say two topics read by two sources) are windowed together when passed as
    a list, ``aggregate([clicks, views], ...)``: each keeps its own watermark and the lowest
    completes the windows. A union made beforehand (``clicks.unionByName(views)``) is refused:
    one watermark above a union follows the fastest input.

    ``key_buckets``: the keys are held in this many groups in Spark's state store (one state
    value and one timer per group); fixed for the life of a checkpoint.

    >>> aggregate([clicks, views], tumbling("10 seconds"), by=["key"])   # doctest: +SKIP
    """
    if not isinstance(windows, (Tumbling, Sliding, Session)):
        raise WindowError(f"windows must be tumbling(...), sliding(...) or session(...), got "
                          f"{windows!r}")
    aggs = {"count": ("count", None)} if aggs is None else dict(aggs)
    spec = WindowSpec(windows, tuple(Agg(name, *_pair(name, fn)) for name, fn in aggs.items()),
                      parse_duration_ms("allowed_lateness", allowed_lateness))
    if isinstance(key_buckets, bool) or not isinstance(key_buckets, int) or key_buckets < 1:
        raise WindowError(f"key_buckets must be a positive integer, got {key_buckets!r}")
    frames = streams(df)
    if not frames:
        raise WindowError("aggregate needs at least one stream")
    for frame in frames:
        _check_stream(frame, by, spec, time_column)
        refuse_union(frame, "kwatermark.windows.aggregate", "aggregate([a, b], ...)",
                     WindowError)
    prepare_session(frames[0], "kwatermark.windows", WindowError, "transformWithStateInPandas")
    if len(frames) > 1:
        require_min_policy(frames[0], "kwatermark.windows.aggregate", WindowError)
    by = list(by)
    inputs = sorted({a.column for a in spec.aggs if a.column is not None} - set(by))
    bucket = F.pmod(F.xxhash64(*[F.col(c) for c in by]), F.lit(key_buckets)) if by else \
        F.lit(0)
    # Each stream is prepared (and combined) on its own, then follows its own watermark
    # (kwatermark.clock): with several, Spark's min policy drives the windows by the lowest.
    prepared = [frame.select(
        bucket.cast("int").alias(BUCKET),
        *[F.col(c) for c in by], *[F.col(c) for c in inputs],
        F.unix_millis(F.col(time_column)).alias(TIME),
        F.unix_millis(F.col("watermark")).alias(MARK),
        F.col("is_heartbeat"), F.lit(i).cast("int").alias(INPUT))
        for i, frame in enumerate(frames)]
    schema = _common_schema(frames, by, inputs, time_column)
    combined = None
    if _combinable(schema, by, spec):
        # Fixed windows: each task combines its rows per (key, window, late?) before the
        # shuffle, as Spark's own aggregation does; the stateful step merges accumulators.
        # Each task also ticks every bucket with its rows' watermark (kwatermark.ticks).
        combined = _combined_schema(prepared[0].schema, by, spec)
        prepared = [p.mapInArrow(Combiner(spec, [BUCKET, *by, "is_heartbeat", INPUT],
                                          combined, key_buckets if by else 1, i), combined)
                    for i, p in enumerate(prepared)]
    output = _output_schema(schema, by, spec)
    processor = SessionProcessor(spec, by, inputs) if spec.assigner.merging else \
        WindowProcessor(spec, by, inputs, combined, streams=len(frames))
    return (follow_watermarks(prepared, _spark_mark(combined is not None, len(frames)))
            .groupBy(BUCKET)
            .transformWithStateInPandas(processor, output, "Append", "EventTime"))


def _spark_mark(ticked: bool, inputs: int) -> str | Column:
    """What Spark's watermark follows. One stream of fixed windows fires by its input clock
    alone: every bucket hears every batch's highest row watermark through the ticks, so a
    timer never finds anything due that the clock had not fired a batch earlier. There Spark's
    watermark follows the records' rows and not the heartbeats: a heartbeat batch then fires
    the last windows by its clock and Spark runs no extra batch after it (it runs one whenever
    its watermark advances), which is one micro-batch less at the end of every AvailableNow
    run or lull. Sessions and several streams need Spark's watermark (and timers) to move on
    a heartbeat; they follow every row."""
    if ticked and inputs == 1:
        return F.when(F.col("is_heartbeat"), F.lit(None)).otherwise(F.col(MARK))
    return MARK


def _common_schema(frames: Sequence[DataFrame], by: Sequence[str], inputs: Sequence[str],
                   time_column: str) -> StructType:
    """The first stream's schema, once every stream agrees on the columns aggregate uses."""
    schema = frames[0].schema
    for other in frames[1:]:
        for c in (*by, *inputs, time_column):
            if other.schema[c].dataType != schema[c].dataType:
                raise WindowError(f"aggregate: column {c!r} is "
                                  f"{schema[c].dataType.simpleString()} in the first stream "
                                  f"and {other.schema[c].dataType.simpleString()} in another")
    return schema


def _combinable(schema: StructType, by: Sequence[str], spec: WindowSpec) -> bool:
    """Fixed windows over atomic columns (Arrow groups and aggregates those)."""
    columns = [*by, *(a.column for a in spec.aggs if a.column is not None)]
    return not spec.assigner.merging and not any(
        isinstance(schema[c].dataType, (ArrayType, MapType, StructType)) for c in columns)


def _combined_schema(prepared: StructType, by: Sequence[str], spec: WindowSpec) -> StructType:
    """What :class:`Combiner` hands on: the keys, window start, lateness, the accumulators
    (:func:`kwatermark.windowing.accumulator_columns`) and the highest row watermark."""
    fields = [prepared[BUCKET], *(prepared[c] for c in by), prepared["is_heartbeat"],
              prepared[INPUT], StructField(START, LongType(), True),
              StructField(IS_LATE, BooleanType(), True)]
    for agg, columns in zip(spec.aggs, accumulator_columns(spec)):
        source = None if agg.column is None else prepared[agg.column].dataType
        for name, role in columns:
            dtype = LongType() if role != "value" or agg.function == "count" else \
                _result_type(agg.function, source)
            fields.append(StructField(name, dtype, True))
    fields.append(StructField(MARK, LongType(), True))
    return StructType(fields)


class Combiner:
    """The ``mapInArrow`` step: a task's rows combined by :func:`kwatermark.windowing.combine`,
    and a tick for each of the ``buckets`` (:func:`kwatermark.ticks.with_ticks`) from input
    ``stream``."""

    def __init__(self, spec: WindowSpec, keys: list[str], schema: StructType, buckets: int,
                 stream: int):
        self.spec = spec
        self.keys = keys
        self.schema = to_arrow_schema(schema)
        self.buckets = buckets
        self.stream = stream

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        collected = [b for b in batches if b.num_rows]
        if not collected:
            return
        combined = combine(self.spec, pa.Table.from_batches(collected), self.keys, TIME,
                           MARK)
        combined = with_ticks(combined.cast(self.schema), BUCKET, self.buckets, MARK,
                              "is_heartbeat", {INPUT: self.stream})
        yield from combined.to_batches()


def _pair(name: str, fn: object) -> tuple[str, str | None]:
    if not (isinstance(fn, tuple) and len(fn) == 2):
        raise WindowError(f"aggs[{name!r}] must be (function, column), e.g. "
                          f"('sum', 'amount') or ('count', None); got {fn!r}")
    return str(fn[0]).lower(), fn[1]


def _check_stream(df: DataFrame, by: Sequence[str], spec: WindowSpec, time_column: str
                  ) -> None:
    check_heartbeat(df, "kwatermark.windows.aggregate", WindowError)
    columns = set(df.columns)
    wanted = [*by, time_column, *(a.column for a in spec.aggs if a.column is not None)]
    missing = [c for c in wanted if c not in columns]
    if missing:
        raise WindowError(f"aggregate: no column {missing[0]!r} in the stream; its columns are "
                          f"{', '.join(df.columns)}")
    if not isinstance(df.schema[time_column].dataType, TimestampType):
        raise WindowError(f"aggregate: time_column {time_column!r} must be a timestamp, is "
                          f"{df.schema[time_column].dataType.simpleString()}")
    for agg in spec.aggs:
        if agg.function in ("sum", "avg") and not _numeric(df.schema[agg.column].dataType):
            raise WindowError(f"aggregation {agg.name!r}: {agg.function} needs a numeric "
                              f"column, {agg.column!r} is "
                              f"{df.schema[agg.column].dataType.simpleString()}")


def _numeric(dtype: DataType) -> bool:
    return isinstance(dtype, (*_INTEGRAL, DecimalType, DoubleType)) or \
        dtype.typeName() == "float"


def _output_schema(schema: StructType, by: Sequence[str], spec: WindowSpec) -> StructType:
    fields = [StructField(c, schema[c].dataType, True) for c in by]
    fields += [StructField("window_start", TimestampType(), True),
               StructField("window_end", TimestampType(), True)]
    for agg in spec.aggs:
        source = None if agg.column is None else schema[agg.column].dataType
        fields.append(StructField(agg.name, _result_type(agg.function, source), True))
    fields.append(StructField("kind", StringType(), False))
    return StructType(fields)


def _result_type(function: str, source: DataType | None) -> DataType:
    if function == "count":
        return LongType()
    if function == "avg":
        return DoubleType()
    if function == "sum":
        if isinstance(source, _INTEGRAL):
            return LongType()
        if isinstance(source, DecimalType):
            return DecimalType(min(38, source.precision + 10), source.scale)
        return DoubleType()
    return source


# The state layout, recorded in every bucket's index: a checkpoint whose buckets say another
# layout fails at once instead of being misread.
LAYOUT = 2
_LEGACY = "windows"               # layout 1: every key's windows of a bucket in one value


class WindowProcessor(StatefulProcessor):
    """The thin shell for tumbling and sliding windows. Spark groups by a bucket of keys; a
    bucket's windows are a :class:`kwatermark.windowing.WindowIndex` (one small value: each
    open window's chunks, the bucket's one timer) and chunks in a map state, one window's
    partials for some keys each (:class:`kwatermark.windowing.BucketWindows` decides what is
    read, written and emitted). One event-time timer per bucket wakes it at the first
    watermark at which a window completes or its lateness ends."""

    def __init__(self, spec: WindowSpec, by: list[str], inputs: list[str],
                 combined: StructType | None = None, streams: int = 1):
        self.spec = spec
        self.by = by
        self.inputs = inputs
        self.streams = streams
        # Rows are Combiner's partials (schema given), not records: its accumulator columns,
        # and whether each holds integers.
        self.combined = None if combined is None else {
            name: isinstance(combined[name].dataType, _INTEGRAL)
            for columns in accumulator_columns(spec) for name, _ in columns}

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self._profile = _start_profile()
        self.index = handle.getValueState("window_index", _INDEX_SCHEMA)
        self.store = _MapChunks(handle.getMapState(
            "window_chunks", StructType([StructField("chunk", LongType(), True)]),
            StructType([StructField("data", BinaryType(), True)])))
        # Declared so that a checkpoint of layout 1 is read (and moved) rather than refused.
        self.legacy = handle.getValueState(_LEGACY, _LEGACY_SCHEMA)

    def handleInputRows(self, key: tuple, rows: Iterator[pd.DataFrame],
                        timerValues: TimerValues) -> Iterator[pd.DataFrame]:
        """Fires by the input clock (:mod:`kwatermark.ticks`), Spark's watermark of the next
        micro-batch, which the rows already carry; the timer stays on Spark's watermark."""
        every = pandas_io.gather(rows)
        if every is None:
            return
        watermark = timerValues.getCurrentWatermarkInMs()
        clock = pandas_io.clock(every, self.streams, watermark)
        batch = pandas_io.without_heartbeats(every)
        if batch is None:
            yield from self._fire_by_clock(clock, watermark)
            return
        keys, partials = self._partials(batch)
        bucket = BucketWindows(self._load(), self.store)
        # The rows first, by the watermark they arrived under, then what the clock completed:
        # the rows were read before the clock's watermark was proven.
        out = bucket.apply_partials(self.spec, keys, partials, watermark)
        if clock > watermark:
            out += bucket.fire(self.spec, clock)
        _save(self, bucket.index, bucket.index.wake_up(self.spec, clock), watermark,
              expired=None)
        if out:
            yield pandas_io.emitted_frame(self.by, self.spec, out)

    def _fire_by_clock(self, clock: int, watermark: int) -> Iterator[pd.DataFrame]:
        """A bucket that got only ticks: fire what the clock completed, if it holds windows.
        One state read for a bucket without windows (most, with few keys); a bucket still in
        layout 1 is left to its timer, one batch later, and moved when next touched."""
        if clock <= watermark:
            return
        index = _load_index(self.index)
        if index is None or not index.windows:
            return
        bucket = BucketWindows(index, self.store)
        out = bucket.fire(self.spec, clock)
        _save(self, bucket.index, bucket.index.wake_up(self.spec, clock), watermark,
              expired=None)
        if out:
            yield pandas_io.emitted_frame(self.by, self.spec, out)

    def handleExpiredTimer(self, key: tuple, timerValues: TimerValues,
                           expiredTimerInfo: ExpiredTimerInfo) -> Iterator[pd.DataFrame]:
        watermark = timerValues.getCurrentWatermarkInMs()
        bucket = BucketWindows(self._load(), self.store)
        out = bucket.fire(self.spec, watermark)
        _save(self, bucket.index, bucket.index.wake_up(self.spec, watermark), watermark,
              expired=expiredTimerInfo.getExpiryTimeInMs())
        if out:
            yield pandas_io.emitted_frame(self.by, self.spec, out)

    def close(self) -> None:
        _stop_profile(self._profile, self)

    def _partials(self, batch: pd.DataFrame) -> tuple[list[tuple], Partials]:
        """Every row's key and the batch as partials (Combiner's rows, or records combined
        here per key when Combiner could not run)."""
        if self.combined is not None:
            return (pandas_io.row_keys(batch, self.by),
                    pandas_io.combined_partials(batch, self.spec, self.combined))
        every = pandas_io.record_rows(batch, self.inputs)
        keys, starts, late, accs = [], [], [], []
        for user_key, index in pandas_io.key_groups(batch, self.by):
            part = row_partials(self.spec, every.take(index))
            keys += [user_key] * len(part.starts)
            starts += part.starts
            late += part.late
            accs += part.accs
        return keys, Partials(starts, late, accs)

    def _load(self) -> WindowIndex:
        index = _load_index(self.index)
        if index is not None:
            return index
        legacy = self.legacy.get()
        if not legacy:
            return WindowIndex()
        # Layout 1 (before the window-by-window state): moved once, bucket by bucket, as the
        # buckets are next touched; the bucket's timer is kept.
        keys, timer = pickle.loads(legacy[0])
        self.legacy.clear()
        return index_of_key_windows(self.spec, keys, self.store, timer)


_LEGACY_SCHEMA = StructType([StructField("slots", BinaryType(), True)])
_INDEX_SCHEMA = StructType([StructField("layout", IntegerType(), True),
                            StructField("index", BinaryType(), True)])


class _MapChunks(ChunkStore):
    """Chunks in a ``MapState`` (chunk id -> a pickled :class:`ChunkStore` chunk)."""

    def __init__(self, state):
        self.state = state

    def get(self, chunk: int) -> object:
        return pickle.loads(self.state.getValue((chunk,))[0])

    def put(self, chunk: int, data: object) -> None:
        self.state.updateValue((chunk,), (pickle.dumps(data, protocol=5),))

    def remove(self, chunk: int) -> None:
        self.state.removeKey((chunk,))


class SessionProcessor(StatefulProcessor):
    """The thin shell for session windows (a session's window depends on its key's others):
    per bucket, a :class:`kwatermark.windowing.SessionIndex` (one small value), each key's
    :class:`KeyWindows` in a map state keyed by the key, and wake chunks listing the keys by
    when they next need firing (:class:`kwatermark.windowing.BucketSessions`)."""

    def __init__(self, spec: WindowSpec, by: list[str], inputs: list[str]):
        self.spec = spec
        self.by = by
        self.inputs = inputs

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self._profile = _start_profile()
        self.index = handle.getValueState("session_index", _INDEX_SCHEMA)
        binary = StructType([StructField("data", BinaryType(), True)])
        self.store = _MapKeys(
            handle.getMapState("session_keys",
                               StructType([StructField("key", BinaryType(), True)]), binary),
            handle.getMapState("session_wakes",
                               StructType([StructField("chunk", LongType(), True)]), binary))
        self.legacy = handle.getValueState(_LEGACY, _LEGACY_SCHEMA)

    def handleInputRows(self, key: tuple, rows: Iterator[pd.DataFrame],
                        timerValues: TimerValues) -> Iterator[pd.DataFrame]:
        batch = pandas_io.records(rows)
        if batch is None:
            return
        watermark = timerValues.getCurrentWatermarkInMs()
        every = pandas_io.record_rows(batch, self.inputs)
        bucket = BucketSessions(self._load(), self.store)
        groups = pandas_io.key_groups(batch, self.by)
        out = bucket.apply(self.spec, [(user_key, every.take(index))
                                       for user_key, index in groups], watermark)
        _save(self, bucket.index, bucket.index.wake_up(watermark), watermark, expired=None)
        if out:
            yield pandas_io.emitted_frame(self.by, self.spec, out)

    def handleExpiredTimer(self, key: tuple, timerValues: TimerValues,
                           expiredTimerInfo: ExpiredTimerInfo) -> Iterator[pd.DataFrame]:
        watermark = timerValues.getCurrentWatermarkInMs()
        bucket = BucketSessions(self._load(), self.store)
        out = bucket.fire(self.spec, watermark)
        _save(self, bucket.index, bucket.index.wake_up(watermark), watermark,
              expired=expiredTimerInfo.getExpiryTimeInMs())
        if out:
            yield pandas_io.emitted_frame(self.by, self.spec, out)

    def close(self) -> None:
        _stop_profile(self._profile, self)

    def _load(self) -> SessionIndex:
        index = _load_index(self.index)
        if index is not None:
            return index
        legacy = self.legacy.get()
        if not legacy:
            return SessionIndex()
        keys, timer = pickle.loads(legacy[0])
        self.legacy.clear()
        return index_of_key_sessions(self.spec, keys, self.store, timer)


class _MapKeys(KeyStore):
    """Each key's slots and home chunk, and the wake chunks, in two ``MapState``s."""

    def __init__(self, keys, wakes):
        self.key_state = keys
        self.wake_state = wakes

    def get(self, key: tuple) -> tuple[dict, int] | None:
        stored = self.key_state.getValue((pickle.dumps(key, protocol=5),))
        return None if stored is None else pickle.loads(stored[0])

    def put(self, key: tuple, slots: dict, home: int) -> None:
        self.key_state.updateValue((pickle.dumps(key, protocol=5),),
                                   (pickle.dumps((slots, home), protocol=5),))

    def remove(self, key: tuple) -> None:
        self.key_state.removeKey((pickle.dumps(key, protocol=5),))

    def get_wake(self, chunk: int) -> list:
        keys = pickle.loads(self.wake_state.getValue((chunk,))[0])
        self.wake_state.removeKey((chunk,))
        return keys

    def put_wake(self, chunk: int, keys: list) -> None:
        self.wake_state.updateValue((chunk,), (pickle.dumps(keys, protocol=5),))


def _load_index(state) -> WindowIndex | SessionIndex | None:
    stored = state.get()
    if not stored:
        return None
    layout, data = stored
    if layout != LAYOUT:
        raise WindowError(
            f"this checkpoint's window state has layout {layout}; this kwatermark reads "
            f"layout {LAYOUT} (and moves layout 1 on): run the kwatermark version that wrote "
            f"the checkpoint, or start on a new checkpoint")
    return pickle.loads(data)


def _save(processor, index: WindowIndex | SessionIndex, first: int | None, watermark: int,
          expired: int | None) -> None:
    """Store a bucket's index and keep its one timer at ``first``, the first watermark above
    the current one at which ``fire`` has something to do.

    Spark fires an event-time timer in the first micro-batch whose watermark is at or above
    the timer's time (measured: a timer at ``t`` fires at watermark ``t``), after the batch's
    input rows. So the timer goes at ``first`` itself. One 1 ms below (as before) could be at
    the current watermark: it fired with nothing due, its successor was the very timer Spark
    deletes as ``handleExpiredTimer`` returns (``expired``), and the bucket was left with no
    timer, its windows never emitted. An earlier timer still ahead of the watermark is
    superseded and deleted; one at or below it is due in this batch and is left to fire: the
    input rows fire only the windows they touch, the timer fires the bucket's others."""
    wanted = first
    if index.timer != wanted:
        if index.timer is not None and index.timer != expired and index.timer > watermark:
            processor.handle.deleteTimer(index.timer)
        if wanted is not None:
            processor.handle.registerTimer(wanted)
        index.timer = wanted
    if wanted is None:
        processor.index.clear()
        return
    processor.index.update((LAYOUT, pickle.dumps(index, protocol=5)))


def _start_profile():
    if not os.environ.get(PROFILE_ENV):
        return None
    import cProfile

    profile = cProfile.Profile()
    profile.enable()
    return profile


def _stop_profile(profile, owner) -> None:
    if profile is not None:
        profile.disable()
        profile.dump_stats(os.path.join(os.environ[PROFILE_ENV],
                                        f"{os.getpid()}-{id(owner):x}.prof"))
