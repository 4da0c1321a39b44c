"""Timestamp assigners, watermark generators and the per-row combined watermark.

Pure Python + numpy/pyarrow: nothing here imports Spark or Kafka. Times are epoch ms.
Inside numpy arrays an undefined watermark or event time is ``UNDEFINED`` (Flink's
Long.MIN_VALUE), so ``min``/``max`` need no special cases.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from typing import Protocol, runtime_checkable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kwatermark.errors import PluginError
from kwatermark.options import WatermarkConfig, percentile_rank
from kwatermark.plugins import PluginOptions, load_object
from kwatermark.records import RecordBlock

UNDEFINED = int(np.iinfo(np.int64).min)
NO_PARTITIONS = int(np.iinfo(np.int64).max)  # "min over nothing": no other partition counts


@runtime_checkable
class WatermarkGenerator(Protocol):
    """Fed every record of one partition in offset order; its ``current`` is that partition's
    watermark: no record with event time <= it is expected any more.

    >>> class Lagging:                               # watermark.strategy = "mymod:Lagging"
    ...     def __init__(self, options): self.max_ts = None
    ...     def on_event(self, ts_ms, record): self.max_ts = max(ts_ms, self.max_ts or ts_ms)
    ...     def current(self): return None if self.max_ts is None else self.max_ts - 60_000
    ...     def snapshot(self): return {"max_ts": self.max_ts}
    ...     def restore(self, snapshot): self.max_ts = snapshot["max_ts"]
    """

    def on_event(self, ts_ms: int, record: dict) -> None: ...
    def current(self) -> int | None: ...
    def snapshot(self) -> object: ...
    def restore(self, snapshot: object) -> None: ...


class BoundedOutOfOrderness:
    """``wm = max_ts - bound - 1``: records up to ``bound`` ms out of order are on time.

    ``bound = 0`` is the monotonous strategy. Undefined until the first record.
    """

    needs_records = False

    def __init__(self, bound_ms: int = 0):
        self.bound_ms = bound_ms
        self.max_ts: int | None = None

    def on_event(self, ts_ms: int, record: dict | None = None) -> None:
        if self.max_ts is None or ts_ms > self.max_ts:
            self.max_ts = ts_ms

    def current(self) -> int | None:
        return None if self.max_ts is None else self.max_ts - self.bound_ms - 1

    def snapshot(self) -> dict:
        return {"max_ts": self.max_ts}

    def restore(self, snapshot: object) -> None:
        self.max_ts = (snapshot or {}).get("max_ts")

    def merge(self, later: object) -> None:
        other = (later or {}).get("max_ts")
        if other is not None:
            self.on_event(other)

    def watermarks_before(self, event_times: np.ndarray, block: RecordBlock) -> np.ndarray:
        """The partition watermark in force before each record; advances the state."""
        start = UNDEFINED if self.max_ts is None else self.max_ts
        running = np.maximum.accumulate(np.concatenate(([start], event_times)))
        if running[-1] != UNDEFINED:
            self.max_ts = int(running[-1])
        before = running[:-1]
        return np.where(before == UNDEFINED, UNDEFINED, before - (self.bound_ms + 1))


class NoWatermarks:
    """Strategy ``none``: the partition watermark never advances (stays undefined)."""

    needs_records = False

    def on_event(self, ts_ms: int, record: dict | None = None) -> None:
        pass

    def current(self) -> int | None:
        return None

    def snapshot(self) -> dict:
        return {}

    def restore(self, snapshot: object) -> None:
        pass

    def merge(self, later: object) -> None:
        pass

    def watermarks_before(self, event_times: np.ndarray, block: RecordBlock) -> np.ndarray:
        return np.full(len(event_times), UNDEFINED, dtype=np.int64)


class Punctuated:
    """``wm`` = event time of the last record the predicate marks (never decreasing: a marker
    older than the current watermark does not move it)."""

    needs_records = True

    def __init__(self, predicate: Callable[[dict], bool]):
        self.predicate = predicate
        self.marker: int | None = None

    def on_event(self, ts_ms: int, record: dict) -> None:
        if self.predicate(record) and (self.marker is None or ts_ms > self.marker):
            self.marker = ts_ms

    def current(self) -> int | None:
        return self.marker

    def snapshot(self) -> dict:
        return {"marker": self.marker}

    def restore(self, snapshot: object) -> None:
        self.marker = (snapshot or {}).get("marker")

    def merge(self, later: object) -> None:
        other = (later or {}).get("marker")
        if other is not None and (self.marker is None or other > self.marker):
            self.marker = other


class TimeLag:
    """``timelag`` (Flink's ``TimeLagWatermarkGenerator``): ``wm = planned - maxTimeLag``,
    where ``planned`` is the processing time the driver planned the batch at.

    Records are expected at most ``maxTimeLag`` behind processing time; their event times do
    not move the watermark. The planning time is in the snapshot, hence in the offset, so a
    replayed batch gets the same watermark whatever the clock says then. Defined from the
    first planning on, with or without records (Flink emits it regardless of events).

    >>> lag = TimeLag(30_000); lag.on_plan(1_700_000_060_000); lag.current()
    1700000030000
    """

    needs_records = False

    def __init__(self, lag_ms: int):
        self.lag_ms = lag_ms
        self.planned_ms: int | None = None

    def on_plan(self, now_ms: int) -> None:
        """Called by the driver when it plans a batch that reads records."""
        if self.planned_ms is None or now_ms > self.planned_ms:
            self.planned_ms = now_ms

    def on_event(self, ts_ms: int, record: dict | None = None) -> None:
        pass

    def current(self) -> int | None:
        return None if self.planned_ms is None else self.planned_ms - self.lag_ms

    def snapshot(self) -> dict:
        return {"planned": self.planned_ms}

    def restore(self, snapshot: object) -> None:
        self.planned_ms = (snapshot or {}).get("planned")

    def merge(self, later: object) -> None:
        other = (later or {}).get("planned")
        if other is not None:
            self.on_plan(other)

    def watermarks_before(self, event_times: np.ndarray, block: RecordBlock) -> np.ndarray:
        return np.full(len(event_times), _as_ms(self, self.current()), dtype=np.int64)


def plan_generator(generator: object, now_ms: int) -> bool:
    """Tell a generator the batch's planning time, if it wants it (``on_plan``, optional in
    the plug-in protocol); True when it did."""
    on_plan = getattr(generator, "on_plan", None)
    if not callable(on_plan):
        return False
    on_plan(now_ms)
    return True


def watermarks_before(generator: object, event_times: np.ndarray, block: RecordBlock
                      ) -> np.ndarray:
    """Feed a block to any generator; return the partition watermark before each record.

    Built-ins do it vectorised; other generators get one ``on_event`` call per record with
    an event time (records without one are not fed).
    """
    vectorised = getattr(generator, "watermarks_before", None)
    if vectorised is not None:
        return vectorised(event_times, block)
    out = np.empty(len(event_times), dtype=np.int64)
    for i, ts in enumerate(event_times.tolist()):
        out[i] = _as_ms(generator, generator.current())
        if ts != UNDEFINED:
            generator.on_event(ts, block.record(i))
    return out


def at_once(generator: object, assigner: object) -> bool:
    """Whether many ranges' records may be computed together (``reader.RangeColumns``) with
    this generator, fed by this assigner: the built-in generators that need no record, on
    Kafka's record timestamps."""
    return type(assigner) is KafkaTimestampAssigner and type(generator) in (
        BoundedOutOfOrderness, NoWatermarks, TimeLag)


def segmented_running_max(starts: np.ndarray, values: np.ndarray, counts: np.ndarray
                          ) -> tuple[np.ndarray, np.ndarray]:
    """Segment ``i`` is ``starts[i]`` followed by the next ``counts[i]`` of ``values``: the
    running maximum of its segment before each value, and each segment's maximum.

    >>> before, last = segmented_running_max(np.array([5, 0]), np.array([1, 7, 3, 2]),
    ...                                      np.array([2, 2]))
    >>> before.tolist(), last.tolist()
    ([5, 5, 0, 3], [7, 3])
    """
    if len(counts) <= 16:   # few segments: one accumulate each
        befores, lasts, at = [np.empty(0, dtype=np.int64)], [], 0
        for start, n in zip(starts.tolist(), counts.tolist()):
            running = np.maximum.accumulate(np.concatenate(([start], values[at:at + n])))
            befores.append(running[:-1])
            lasts.append(running[-1])
            at += n
        return np.concatenate(befores), np.array(lasts, dtype=np.int64)
    # Many: the values' ranks, offset per segment so that one accumulate restarts at each.
    lengths = counts + 1
    heads = np.cumsum(lengths) - lengths
    merged = np.empty(int(lengths.sum()), dtype=np.int64)
    head = np.zeros(len(merged), dtype=bool)
    head[heads] = True
    merged[heads] = starts
    merged[~head] = values
    distinct, rank = np.unique(merged, return_inverse=True)
    offset = np.repeat(np.arange(len(counts), dtype=np.int64) * len(distinct), lengths)
    running = distinct[np.maximum.accumulate(rank.reshape(-1) + offset) - offset]
    tails = heads + counts
    tail = np.zeros(len(merged), dtype=bool)
    tail[tails] = True
    return running[~tail], running[tails]


def current_ms(generator: object) -> int:
    """The generator's watermark as an int, UNDEFINED when it has none."""
    return _as_ms(generator, generator.current())


def _as_ms(generator: object, value: object) -> int:
    if value is None:
        return UNDEFINED
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise PluginError(f"watermark generator {type(generator).__qualname__}.current() "
                          f"returned {value!r}; expected epoch milliseconds (int) or None")
    return int(value)


def make_generator(config: WatermarkConfig) -> object:
    """A fresh generator for one partition, as ``watermark.strategy`` names it."""
    strategy = config.strategy
    if strategy == "monotonous":
        return BoundedOutOfOrderness(0)
    if strategy == "bounded":
        return BoundedOutOfOrderness(config.max_out_of_orderness_ms)
    if strategy == "none":
        return NoWatermarks()
    if strategy == "timelag":
        return TimeLag(config.max_time_lag_ms)
    if strategy == "punctuated":
        predicate = load_object(config.punctuation, "watermark.punctuation")
        if not callable(predicate):
            raise PluginError(f"option watermark.punctuation: {config.punctuation!r} is not "
                              f"callable")
        return Punctuated(predicate)
    cls = load_object(strategy, "watermark.strategy")
    try:
        generator = cls(PluginOptions(config.plugin_options))
    except Exception as exc:
        raise PluginError(f"option watermark.strategy: {strategy!r} failed to construct: "
                          f"{type(exc).__name__}: {exc}") from exc
    missing = [m for m in ("on_event", "current", "snapshot", "restore")
               if not callable(getattr(generator, m, None))]
    if missing:
        raise PluginError(f"option watermark.strategy: {strategy!r} lacks method(s) "
                          f"{', '.join(missing)}")
    return generator


def snapshot_watermark(config: WatermarkConfig) -> Callable[[object], int] | None:
    """The watermark of a built-in generator's snapshot, as ``current_ms`` of the restored
    generator gives it, without restoring one: the driver asks it of every partition
    several times per planning (~10 µs a partition through a generator, 4,096 partitions).
    None for generators that must be restored to answer (plug-ins, punctuated)."""
    reading = _snapshot_reading(config)
    if reading is None:
        return (lambda snapshot: UNDEFINED) if config.strategy == "none" else None
    key, plus = reading
    return lambda snapshot: _plus(snapshot, key, plus)


def snapshot_watermarks(config: WatermarkConfig
                        ) -> Callable[[list[object]], list[int]] | None:
    """:func:`snapshot_watermark` of a column of snapshots, a partition each (the same
    answers without a call a partition: 4,096 a planning)."""
    reading = _snapshot_reading(config)
    if reading is None:
        return ((lambda snapshots: [UNDEFINED] * len(snapshots))
                if config.strategy == "none" else None)
    key, plus = reading
    return lambda snapshots: [UNDEFINED if value is None else value + plus
                              for value in [(s or _NOTHING).get(key) for s in snapshots]]


def _snapshot_reading(config: WatermarkConfig) -> tuple[str, int] | None:
    """The snapshot key a built-in generator's watermark follows and what it adds to it
    (``max_ts - bound - 1``, ``planned - maxTimeLag``); None where there is no such key."""
    strategy = config.strategy
    if strategy in ("monotonous", "bounded"):
        return "max_ts", -(config.max_out_of_orderness_ms if strategy == "bounded" else 0) - 1
    if strategy == "timelag":
        return "planned", -config.max_time_lag_ms
    return None


_NOTHING: dict = {}   # a fresh generator's snapshot, read (never written)


def _plus(snapshot: object, key: str, plus: int) -> int:
    value = (snapshot or _NOTHING).get(key)
    return UNDEFINED if value is None else value + plus


def restore_generator(config: WatermarkConfig, snapshot: object) -> object:
    generator = make_generator(config)
    if snapshot is not None:
        generator.restore(snapshot)
    return generator


def can_split(generator: object) -> bool:
    """Sub-ranges of one partition need a ``merge`` to fold their states (DESIGN §4)."""
    return callable(getattr(generator, "merge", None))


# ---------------------------------------------------------------------------------------
# Timestamp assigners: a RecordBlock in, event times (UNDEFINED where missing) + errors out.


class KafkaTimestampAssigner:
    """Default: the Kafka record timestamp (CreateTime or LogAppendTime)."""

    def assign(self, block: RecordBlock) -> tuple[np.ndarray, list[str | None] | None]:
        ts = block.timestamps_ms
        return np.where(ts < 0, UNDEFINED, ts), None


class FieldAssigner:
    """``eventTime.field``: a dotted path into ``value_decoded``. Accepts integers (epoch
    ms), timestamps (Avro logical types) and ISO-8601 strings (JSON)."""

    def __init__(self, path: str):
        self.path = path
        self.parts = path.split(".")

    def assign(self, block: RecordBlock) -> tuple[np.ndarray, list[str | None] | None]:
        array = block.value_decoded
        errors: list[str | None] = [None] * len(block)
        try:
            for part in self.parts:
                array = pc.struct_field(array, part)
        except (KeyError, pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
            missing = [f"eventTime.field {self.path!r} does not exist in the decoded value"]
            return np.full(len(block), UNDEFINED, dtype=np.int64), missing * len(block)
        values = _to_epoch_ms(array)
        decoded = np.asarray(block.value_decoded.is_valid().to_numpy(zero_copy_only=False),
                             dtype=bool)
        known = decoded & ~np.isnan(values)
        out = np.full(len(block), UNDEFINED, dtype=np.int64)
        out[known] = values[known].astype(np.int64)
        # A record that failed to decode already carries its decoder's error.
        for i in np.flatnonzero(decoded & ~known):
            errors[i] = f"eventTime.field {self.path!r} is missing or null"
        return out, errors


def _to_epoch_ms(array: pa.Array) -> np.ndarray:
    """Float array of epoch ms (NaN for null or unparsable)."""
    kind = array.type
    if pa.types.is_timestamp(kind):
        micros = pc.cast(pc.cast(array, pa.timestamp("us", tz=kind.tz)), pa.int64())
        return np.asarray(pc.divide(pc.cast(micros, pa.float64()), 1000.0)
                          .to_numpy(zero_copy_only=False), dtype=np.float64)
    if pa.types.is_date(kind):
        days = pc.cast(pc.cast(array, pa.date32()), pa.int32())
        return np.asarray(days.to_numpy(zero_copy_only=False), dtype=np.float64) * 86_400_000
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return np.asarray(pc.cast(array, pa.float64()).to_numpy(zero_copy_only=False),
                          dtype=np.float64)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return np.array([_parse_iso_ms(v) for v in array.to_pylist()], dtype=np.float64)
    return np.full(len(array), np.nan)


def _parse_iso_ms(text: str | None) -> float:
    if text is None:
        return np.nan
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return np.nan
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.timestamp() * 1000.0


class FunctionAssigner:
    """``eventTime.assigner = "package.module:function"``: called with each record dict."""

    def __init__(self, reference: str):
        self.reference = reference
        self.function = load_object(reference, "eventTime.assigner")
        if not callable(self.function):
            raise PluginError(f"option eventTime.assigner: {reference!r} is not callable")

    def assign(self, block: RecordBlock) -> tuple[np.ndarray, list[str | None] | None]:
        out = np.empty(len(block), dtype=np.int64)
        for i in range(len(block)):
            value = self.function(block.record(i))
            if value is None:
                out[i] = UNDEFINED
            elif isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise PluginError(
                    f"eventTime.assigner {self.reference!r} returned {value!r} for topic "
                    f"{block.topic}, partition {block.partition}, offset "
                    f"{int(block.offsets[i])}; expected epoch milliseconds (int) or None")
            else:
                out[i] = int(value)
        return out, None


def make_assigner(config: WatermarkConfig) -> object:
    if config.event_time_assigner:
        return FunctionAssigner(config.event_time_assigner)
    if config.event_time_field:
        return FieldAssigner(config.event_time_field)
    return KafkaTimestampAssigner()


def needs_records(generator: object, assigner: object) -> bool:
    return getattr(generator, "needs_records", True) or isinstance(assigner, FunctionAssigner)


# ---------------------------------------------------------------------------------------
# Combining partitions.


def combined_watermark(watermarks: list[int], percentile: str = "100") -> int:
    """The ``k = ceil(p * n / 100)``-th largest of the counted partitions' watermarks (DESIGN
    §13): at least p % of them are at or past it. p = 100 (the default) is ``min``: UNDEFINED
    if any is undefined (it counts as the lowest). NO_PARTITIONS if none counts (every
    partition excluded: the caller holds the previous value)."""
    if not watermarks:
        return NO_PARTITIONS
    if percentile == "100":
        return min(watermarks)
    k = percentile_rank(percentile, len(watermarks))
    return sorted(watermarks, reverse=True)[k - 1]


def holder(watermarks: dict, percentile: str = "100") -> object | None:
    """The key of the counted partition whose watermark is the combined one (ties: the first
    key in sorted order); None when no partition counts."""
    if not watermarks:
        return None
    value = combined_watermark(list(watermarks.values()), percentile)
    return min(key for key, mark in watermarks.items() if mark == value)


def row_bounds(marks: dict, counted: set, percentile: str = "100") -> dict:
    """Per partition, ``(floor, ceiling)`` such that a row of that partition whose own
    partition watermark is ``x`` carries ``min(max(x, floor), ceiling)`` (before the
    never-decreasing step): the k-th largest of ``x`` and the other counted partitions'
    batch-start watermarks. For ``min`` the floor is UNDEFINED and the ceiling the minimum
    of the others. A partition that does not count gets the counted partitions' combined
    watermark as both."""
    ranked = sorted(((marks[tp], tp) for tp in marks if tp in counted), reverse=True)
    values = [v for v, _ in ranked]
    position = {tp: i for i, (_, tp) in enumerate(ranked)}
    n = len(values)
    k = percentile_rank(percentile, n)
    combined = combined_watermark(values, percentile)
    bounds = {}
    for tp in marks:
        if tp not in position:
            bounds[tp] = (combined, combined)
            continue
        i = position[tp]

        def other(j: int, i: int = i) -> int:
            """The j-th largest (1-based) of the others; beyond the ends: +inf / -inf."""
            if j < 1:
                return NO_PARTITIONS
            index = j - 1 if j - 1 < i else j
            return values[index] if index < n else UNDEFINED

        bounds[tp] = (other(k), other(k - 1))
    return bounds


def emitted(previous: int, computed: int) -> int:
    """The watermark never decreases; a computed value over no partitions changes nothing."""
    if computed == NO_PARTITIONS:
        return previous
    return max(previous, computed)


def row_watermarks(own_before: np.ndarray, others: int | np.ndarray,
                   previous: int | np.ndarray, counted: bool | np.ndarray,
                   floor: int | np.ndarray = UNDEFINED) -> np.ndarray:
    """Per-row watermark of one partition's records (DESIGN §2): the combined watermark in
    force when each row arrives, its own partition advancing record by record and the others
    held at their batch-start state. UNDEFINED means null. ``others``/``floor`` are the
    ceiling and floor of :func:`row_bounds` (for ``min``: the others' minimum, UNDEFINED).
    Each argument but ``own_before`` may also be one value per row."""
    computed = np.where(counted, np.minimum(np.maximum(own_before, floor), others), others)
    computed = np.where(computed == NO_PARTITIONS, UNDEFINED, computed)
    return np.maximum(computed, previous)


def to_optional(value: int) -> int | None:
    return None if value in (UNDEFINED, NO_PARTITIONS) else int(value)


def from_optional(value: int | None) -> int:
    return UNDEFINED if value is None else int(value)
