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
import math
import os
import pickle
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql import DataFrame
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

from kwatermark.clock import (
    check_heartbeat,
    follow_watermarks,
    prepare_session,
    refuse_union,
    require_min_policy,
    streams,
)
from kwatermark.options import parse_duration_ms
from kwatermark.windowing import (
    IS_LATE,
    NO_WATERMARK,
    START,
    Agg,
    Assigner,
    Emission,
    KeyWindows,
    Rows,
    Session,
    Sliding,
    Tumbling,
    WindowError,
    WindowSpec,
    accumulator_columns,
    combine,
    partials,
)

log = logging.getLogger("kwatermark.windows")

__all__ = ["WindowError", "aggregate", "session", "sliding", "tumbling"]

# Spark renames pandas columns whose names start with "__": plain, unlikely names instead.
_TIME, _MARK, _BUCKET = "kwatermark_time", "kwatermark_watermark", "kwatermark_bucket"
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
    prepare_session(frames[0], "kwatermark.windows", WindowError)
    if len(frames) > 1:
        require_min_policy(frames[0], "kwatermark.windows.aggregate", WindowError)
    by = list(by)
    inputs = sorted({a.column for a in spec.aggs if a.column is not None} - set(by))
    bucket = F.pmod(F.xxhash64(*[F.col(c) for c in by]), F.lit(key_buckets)) if by else \
        F.lit(0)
    # Each stream is prepared (and combined) on its own, then follows its own watermark
    # (kwatermark.clock): with several, Spark's min policy drives the windows by the lowest.
    prepared = [frame.select(
        bucket.cast("int").alias(_BUCKET),
        *[F.col(c) for c in by], *[F.col(c) for c in inputs],
        F.unix_millis(F.col(time_column)).alias(_TIME),
        F.unix_millis(F.col("watermark")).alias(_MARK),
        F.col("is_heartbeat")) for frame in frames]
    schema = _common_schema(frames, by, inputs, time_column)
    combined = None
    if _combinable(schema, by, spec):
        # Fixed windows: each task combines its rows per (key, window, late?) before the
        # shuffle, as Spark's own aggregation does; the stateful step merges accumulators.
        combined = _combined_schema(prepared[0].schema, by, spec)
        prepared = [p.mapInArrow(Combiner(spec, [_BUCKET, *by, "is_heartbeat"], combined),
                                 combined) for p in prepared]
    output = _output_schema(schema, by, spec)
    processor = WindowProcessor(spec, by, inputs, combined)
    return (follow_watermarks(prepared, _MARK)
            .groupBy(_BUCKET)
            .transformWithStateInPandas(processor, output, "Append", "EventTime"))


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
    fields = [prepared[_BUCKET], *(prepared[c] for c in by), prepared["is_heartbeat"],
              StructField(START, LongType(), True), StructField(IS_LATE, BooleanType(), True)]
    for agg, columns in zip(spec.aggs, accumulator_columns(spec)):
        source = None if agg.column is None else prepared[agg.column].dataType
        for name, role in columns:
            dtype = LongType() if role != "value" or agg.function == "count" else \
                _result_type(agg.function, source)
            fields.append(StructField(name, dtype, True))
    fields.append(StructField(_MARK, LongType(), True))
    return StructType(fields)


class Combiner:
    """The ``mapInArrow`` step: a task's rows combined by :func:`kwatermark.windowing.combine`."""

    def __init__(self, spec: WindowSpec, keys: list[str], schema: StructType):
        self.spec = spec
        self.keys = keys
        self.schema = to_arrow_schema(schema)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        collected = [b for b in batches if b.num_rows]
        if not collected:
            return
        combined = combine(self.spec, pa.Table.from_batches(collected), self.keys, _TIME,
                           _MARK)
        yield from combined.cast(self.schema).to_batches()


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


class WindowProcessor(StatefulProcessor):
    """The thin shell. Spark groups by a bucket of keys; per bucket, one value state holds
    every key's :class:`KeyWindows` slots (pickled) and one event-time timer wakes the bucket
    at the first watermark at which any of its keys has something to emit or forget."""

    def __init__(self, spec: WindowSpec, by: list[str], inputs: list[str],
                 combined: StructType | None = None):
        self.spec = spec
        self.by = by
        self.inputs = inputs
        # Rows are Combiner's partials (schema given), not records: its accumulator columns,
        # and whether each holds integers.
        self.combined = None if combined is None else {
            name: isinstance(combined[name].dataType, _INTEGRAL)
            for columns in accumulator_columns(spec) for name, _ in columns}

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self._profile = _start_profile()
        self.state = handle.getValueState(
            "windows", StructType([StructField("slots", BinaryType(), True)]))

    def handleInputRows(self, key: tuple, rows: Iterator[pd.DataFrame],
                        timerValues: TimerValues) -> Iterator[pd.DataFrame]:
        frames = [f for f in rows if len(f)]
        batch = pd.concat(frames, ignore_index=True) if len(frames) > 1 else \
            (frames[0] if frames else None)
        if batch is not None:
            beats = batch["is_heartbeat"].to_numpy() == True  # null-safe: a null flag is a record
            if beats.any():
                batch = batch[~beats].reset_index(drop=True)
        if batch is None or batch.empty:
            return
        watermark = timerValues.getCurrentWatermarkInMs()
        keys, timer = self._load()
        if self.combined is None:
            every, fold = _rows(batch, self.inputs), KeyWindows.apply
        else:
            every, fold = _partials(batch, self.spec, self.combined), KeyWindows.apply_partials
        out = []
        for user_key, index in _key_groups(batch, self.by):
            windows = KeyWindows(keys.get(user_key, {}))
            emissions = fold(windows, self.spec, every.take(index), watermark)
            if windows.slots:
                keys[user_key] = windows.slots
            else:
                keys.pop(user_key, None)
            if emissions:
                out.append((user_key, emissions))
        self._save(keys, timer, watermark, expired=None)
        if out:
            yield self._frame(out)

    def handleExpiredTimer(self, key: tuple, timerValues: TimerValues,
                           expiredTimerInfo: ExpiredTimerInfo) -> Iterator[pd.DataFrame]:
        watermark = timerValues.getCurrentWatermarkInMs()
        keys, timer = self._load()
        out, changed = [], False
        for user_key in list(keys):
            windows = KeyWindows(keys[user_key])
            before = len(windows.slots)
            emissions = windows.fire(self.spec, watermark)
            if emissions:
                out.append((user_key, emissions))
            if emissions or len(windows.slots) != before:
                changed = True
            if not windows.slots:
                del keys[user_key]
        if changed or timer is None or timer <= watermark:
            self._save(keys, timer, watermark, expired=expiredTimerInfo.getExpiryTimeInMs())
        if out:
            yield self._frame(out)

    def close(self) -> None:
        if self._profile is not None:
            self._profile.disable()
            self._profile.dump_stats(os.path.join(os.environ[PROFILE_ENV],
                                                  f"{os.getpid()}-{id(self):x}.prof"))

    def _load(self) -> tuple[dict, int | None]:
        """The bucket's keys (key tuple -> window slots) and its one timer (None: none)."""
        stored = self.state.get()
        if not stored:
            return {}, None
        return pickle.loads(stored[0])

    def _save(self, keys: dict, timer: int | None, watermark: int, expired: int | None
              ) -> None:
        """Store the keys and keep one timer per bucket, at the first watermark above the
        current one at which ``fire`` has something to do for any key.

        Spark fires an event-time timer in the first micro-batch whose watermark is at or
        above the timer's time (measured: a timer at ``t`` fires at watermark ``t``), after
        the batch's input rows. So the timer goes at that watermark itself, never below it: a
        timer one below fired with nothing due yet, its successor was the very timer Spark
        deletes once ``handleExpiredTimer`` returns (``expired``), and the bucket was left
        with no timer, its windows never emitted. An earlier timer that is still ahead is
        superseded and deleted; one at or below the current watermark is due in this batch
        and is left to fire: the input rows fired only their own keys' windows, it fires the
        other keys' (``handleExpiredTimer`` fires every key of the bucket)."""
        wanted = min((m for slots in keys.values() for m in KeyWindows(slots).wake_ups(self.spec)
                      if m > watermark), default=None)
        if timer != wanted:
            if timer is not None and timer != expired and timer > watermark:
                self.handle.deleteTimer(timer)
            if wanted is not None:
                self.handle.registerTimer(wanted)
        if not keys:
            self.state.clear()
            return
        self.state.update((pickle.dumps((keys, wanted), protocol=5),))

    def _frame(self, out: list[tuple[tuple, list[Emission]]]) -> pd.DataFrame:
        # Built column by column in the output's order: a `columns=` argument would make
        # pandas reindex, which costs more than building the frame.
        emissions = [e for _, es in out for e in es]
        data: dict[str, object] = {
            c: [k[i] for k, es in out for _ in es] for i, c in enumerate(self.by)}
        data["window_start"] = _instants([e.start for e in emissions])
        data["window_end"] = _instants([e.end for e in emissions])
        for i, agg in enumerate(self.spec.aggs):
            data[agg.name] = [e.values[i] for e in emissions]
        data["kind"] = [e.kind for e in emissions]
        return pd.DataFrame(data, copy=False)


def _key_groups(batch: pd.DataFrame, by: list[str]) -> Iterator[tuple[tuple, np.ndarray]]:
    """(key, row positions) for every key of a bucket's batch; a null key part is None."""
    if not by:
        yield (), np.arange(len(batch))
        return
    groups = batch.groupby(by if len(by) > 1 else by[0], sort=False, dropna=False).indices
    for value, index in groups.items():
        parts = value if len(by) > 1 else (value,)
        yield tuple(None if _is_missing(v) else v for v in parts), index


def _is_missing(value: object) -> bool:
    return value is None or value is pd.NaT or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def _start_profile():
    if not os.environ.get(PROFILE_ENV):
        return None
    import cProfile

    profile = cProfile.Profile()
    profile.enable()
    return profile


def _rows(batch: pd.DataFrame, inputs: list[str]) -> Rows:
    def millis(column: str) -> np.ndarray:
        return batch[column].fillna(NO_WATERMARK).to_numpy(dtype=np.int64)

    return Rows(millis(_TIME), millis(_MARK), {c: batch[c].to_numpy() for c in inputs})


def _partials(batch: pd.DataFrame, spec: WindowSpec, integral: dict[str, bool]):
    """Combiner's rows as :class:`kwatermark.windowing.Partials` (nulls None; integers that
    pandas made floats to hold nulls, integers again)."""
    def column(name: str, whole: bool) -> list:
        series = batch[name]
        if not series.hasnans:
            values = series.tolist()
            return [int(v) for v in values] if whole and series.dtype.kind == "f" else values
        return [None if missing else (int(v) if whole else v)
                for v, missing in zip(series.tolist(), series.isna().tolist())]

    return partials(spec, column(START, True), batch[IS_LATE].tolist(),
                    {name: column(name, integral[name]) for name in integral})


def _instants(ms: list[int | None]) -> pd.api.extensions.ExtensionArray:
    """Epoch milliseconds (None: null) as UTC instants."""
    return pd.DatetimeIndex(np.array(ms, dtype="datetime64[ms]")).tz_localize("UTC").array
