"""The offset Spark checkpoints, and the pure arithmetic of planning a batch (DESIGN §4).

An offset is a :class:`BatchOffset`: the batch reads ``[from, to)`` of each partition starting
from ``state`` (the partition's generator and idle state at ``from``), and ``watermark`` is the
combined watermark at the batch start: the floor of every row's watermark in the batch. Its
JSON (Spark's Kafka offsets plus the state, compactly) is ``kwatermark.offset_layout``'s.
"""

from __future__ import annotations

import json
import math
import re
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, replace
from itertools import accumulate

import numpy as np

from kwatermark.errors import KWatermarkError

OFFSET_VERSION = 1   # the layout of PartitionState.to_json (keys progress records)

TopicPartition = tuple[str, int]


def tp_key(tp: TopicPartition) -> str:
    return f"{tp[0]}:{tp[1]}"


def parse_tp_key(key: str) -> TopicPartition:
    topic, sep, partition = key.rpartition(":")
    # ASCII digits only: str.isdigit() accepts "²", and lstrip("-") let "--1" through to int().
    if not sep or not topic or not re.fullmatch(r"[0-9]+", partition):
        raise OffsetFormatError(f"offset: partition key {key!r} is not 'topic:partition'")
    return topic, int(partition)


class OffsetFormatError(KWatermarkError):
    """An offset restored from a checkpoint cannot be understood."""


@dataclass(frozen=True)
class PartitionState:
    """One partition's progress at an offset: its generator snapshot and idle bookkeeping."""

    generator: object = None           # the generator's JSON snapshot; None = fresh
    max_event_ms: int | None = None    # highest event time read so far
    advanced_ms: int | None = None     # floor set by an idle policy's "advance"
    last_read_ms: int = 0              # processing time its records were last planned
    idle: str = "count"                # decision in force: "count", "exclude", "advance"
    held: bool = False                 # watermark alignment paused it this batch (§11)

    def to_json(self) -> dict:
        data = {"gen": self.generator, "maxEvent": self.max_event_ms,
                "advanced": self.advanced_ms, "lastRead": self.last_read_ms,
                "idle": self.idle}
        if self.held:
            data["held"] = True   # written only when true: older offsets have no such key
        return data

    def updated(self, **changes: object) -> PartitionState:
        """``dataclasses.replace(self, **changes)`` at a third of its cost: the planner makes
        two per partition and batch (8,192 at 4,096 partitions)."""
        state = object.__new__(PartitionState)
        values = state.__dict__   # frozen: the dict is the way in
        values.update(self.__dict__)
        values.update(changes)
        if len(values) != len(_STATE_NAMES):
            unknown = min(changes.keys() - _STATE_NAMES)
            raise TypeError(f"PartitionState has no field {unknown!r}")
        return state

    @classmethod
    def from_json(cls, where: str, data: object) -> PartitionState:
        if not isinstance(data, dict):
            raise OffsetFormatError(f"offset: {where}: state must be an object, got {data!r}")
        idle = data.get("idle", "count")
        if idle not in ("count", "exclude", "advance"):
            raise OffsetFormatError(f"offset: {where}: unknown idle decision {idle!r}")
        held = data.get("held", False)
        if not isinstance(held, bool):
            raise OffsetFormatError(f"offset: {where}: held must be true or false, got "
                                    f"{held!r}")
        return cls(
            generator=data.get("gen"),
            max_event_ms=optional_int(where, "maxEvent", data.get("maxEvent")),
            advanced_ms=optional_int(where, "advanced", data.get("advanced")),
            last_read_ms=optional_int(where, "lastRead", data.get("lastRead")) or 0,
            idle=idle,
            held=held,
        )


_STATE_NAMES = frozenset(f.name for f in fields(PartitionState))


@dataclass(frozen=True)
class PartitionLag:
    """What the driver saw of one partition when it planned the batch (DESIGN §13); for
    observation only: no row depends on it. JSON ``"lag"`` beside ``"state"``, absent in
    offsets written before kwatermark 0.2 (every field then reads as None).

    ``processing_wm_ms`` is the processing-time watermark: the planning time of the last
    batch after which the partition had no unread records (every record appended before
    then has been read). The lags are ``planned - watermark`` and ``planned -
    processing_wm_ms`` (None while the watermark it is measured from is undefined).
    """

    watermark_ms: int | None = None       # the partition's event-time watermark at "from"
    processing_wm_ms: int | None = None
    event_lag_ms: int | None = None
    processing_lag_ms: int | None = None
    unread: int | None = None             # records from "from" to the broker's end offset

    def to_json(self) -> dict:
        return {"wm": self.watermark_ms, "procWm": self.processing_wm_ms,
                "eventLag": self.event_lag_ms, "procLag": self.processing_lag_ms,
                "unread": self.unread}

    @classmethod
    def from_json(cls, where: str, data: object) -> PartitionLag | None:
        if data is None:
            return None
        if not isinstance(data, dict):
            raise OffsetFormatError(f"offset: {where}: lag must be an object, got {data!r}")
        return cls(*(optional_int(where, name, data.get(name))
                     for name in ("wm", "procWm", "eventLag", "procLag", "unread")))


@dataclass(frozen=True)
class PartitionRange:
    start: int
    end: int
    state: PartitionState = field(default_factory=PartitionState)
    lag: PartitionLag | None = None


@dataclass(frozen=True)
class BatchOffset:
    watermark: int | None
    partitions: dict[TopicPartition, PartitionRange]
    # A heartbeat batch reads no record: its one row carries `watermark` (DESIGN §10).
    heartbeat: bool = False
    # Observation (DESIGN §13), optional for offsets of older versions: when the driver
    # planned this batch, and which counted partition held the combined watermark then.
    planned_ms: int | None = None
    holder: TopicPartition | None = None

    def to_json(self) -> dict:
        """Spark's Kafka offsets plus kwatermark's state, compactly (layout 2,
        ``kwatermark.offset_layout``)."""
        from kwatermark import offset_layout

        return offset_layout.to_json(self)

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, data: object) -> BatchOffset:
        """Parse and validate an offset, e.g. one restored from a checkpoint (layout 2, or
        layout 1 of kwatermark 0.1)."""
        from kwatermark import offset_layout

        if isinstance(data, str):
            try:
                data = json.loads(data)
            except json.JSONDecodeError as exc:
                raise OffsetFormatError(f"offset: malformed JSON: {exc}") from None
        if not isinstance(data, dict):
            raise OffsetFormatError(f"offset: expected an object, got {str(data)[:200]!r} "
                                    f"(was the checkpoint written by another source?)")
        return offset_layout.from_json(data)


def optional_int(where: str, name: str, value: object) -> int | None:
    """``value`` when it is an integer (not a bool) or None; else an error naming it."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise OffsetFormatError(f"offset: {where}: {name} must be an integer, got {value!r}")
    return value


def rate_limit(begins: dict[TopicPartition, int], ends: dict[TopicPartition, int],
               max_rows: int, priority: dict[TopicPartition, int] | None = None,
               density: dict[TopicPartition, float] | None = None
               ) -> dict[TopicPartition, int]:
    """Spend ``max_rows`` so that no partition with unread records is starved and the
    partitions holding the combined watermark are served first (DESIGN §11).

    Every partition with unread records gets one record; the rest of the budget goes to the
    partitions in ``priority`` order (lower first: the planner passes each partition's
    watermark, so an undefined one, ``UNDEFINED``, comes first). Partitions of equal priority
    share what reaches them in proportion to their lag (:func:`proportional`); with no
    ``priority`` that is every partition, as in Spark.

    The partitions given a ``density`` (records per ms of event time, as they last read) are
    served together, at the place of the lowest of them, by :func:`fill_levels`: the lowest
    watermark is raised to the next one, then both, and so on, as far as the budget goes.
    Served strictly one after the other instead, partitions whose watermarks differ by a few
    ms (every partition of a topic written at an even pace) took turns: one partition read the
    whole budget per trigger, on one task, and the combined watermark stood still for all but
    one trigger of every round.

    The total exceeds ``max_rows`` only when more partitions have unread records than
    ``max_rows``, and then by less than their number. :func:`rate_limit_rows` is the same
    over columns.
    """
    tps = sorted(ends)
    rank = priority or {}
    limited = rate_limit_rows(
        np.array([begins[tp] for tp in tps], dtype=np.int64),
        np.array([ends[tp] for tp in tps], dtype=np.int64), max_rows,
        np.array([rank.get(tp, 0) for tp in tps], dtype=np.int64) if rank else None,
        np.array([density.get(tp, 0) if tp in rank else 0 for tp in tps], dtype=np.float64)
        if density and rank else None)
    return dict(zip(tps, limited.tolist()))


def rate_limit_rows(begin: np.ndarray, end: np.ndarray, max_rows: int,
                    rank: np.ndarray | None = None, density: np.ndarray | None = None
                    ) -> np.ndarray:
    """:func:`rate_limit` over partitions as rows in (topic, partition) order, the planner's
    columns: ``begin`` and ``end`` (int64), each one's ``rank`` (int64, its priority; None:
    all equal) and ``density`` (float64; 0 where unknown, None: none known). Returns the
    ends. At 4,096 partitions a planning, its dicts cost the planner ~10 ms."""
    lag = end - begin
    lagging = lag > 0
    if int(lag[lagging].sum()) <= max_rows:
        return end.copy()
    taken = lagging.astype(np.int64)
    budget = max_rows - int(taken.sum())
    if rank is None:
        rank = np.zeros(len(end), dtype=np.int64)
        density = None
    filled = lagging & (density > 0) & (density < math.inf) if density is not None \
        else np.zeros(len(end), dtype=bool)
    # The other partitions with unread records, grouped by rank (rows in order in a group).
    others = np.flatnonzero(lagging & ~filled)
    others = others[np.argsort(rank[others], kind="stable")]
    levels, firsts = np.unique(rank[others], return_index=True)
    groups = dict(zip(levels.tolist(), np.split(others, firsts[1:]) if others.size else []))
    rows = np.flatnonzero(filled)
    together = int(rank[rows].min()) if rows.size else None
    for level in sorted(set(groups) | ({together} if together is not None else set())):
        if budget <= 0:
            break
        if level == together:
            share = _fill_rows(rank[rows], density[rows], lag[rows] - 1, budget)
            taken[rows] += share
            budget -= int(share.sum())
        group = groups.get(level)
        if group is not None and budget > 0:
            caps = lag[group] - 1
            if group.size == 1:   # proportional() of one partition: as much as it may take
                share = np.minimum(caps, budget)
            else:
                share = _proportional_rows(caps, min(budget, int(caps.sum())))
            taken[group] += share
            budget -= int(share.sum())
    return np.where(lagging, begin + taken, end)


def fill_levels(parts: dict[TopicPartition, tuple[int, float, int]], rows: int
                ) -> dict[TopicPartition, int]:
    """Split ``rows`` over partitions given as (watermark ms, records per ms of event time,
    records it may take) so that their watermarks are raised to one common level, the lowest
    first: the level ``L`` where each takes ``density * (L - watermark)`` records (none if
    it is above ``L``, at most what it may take) and that adds up to ``rows``. Integers
    exactly, the leftover to the largest remainders (ties: partition order).

    >>> fill_levels({("t", 0): (0, 1.0, 100), ("t", 1): (10, 1.0, 100)}, 30)
    {('t', 0): 20, ('t', 1): 10}
    """
    tps = sorted(parts)
    columns = [np.array(column) for column in zip(*map(parts.__getitem__, tps))]
    if not columns:
        return {}
    marks, rates, caps = columns
    return dict(zip(tps, _fill_rows(marks, rates, caps.astype(np.int64), rows).tolist()))


def _fill_rows(marks: np.ndarray, rates: np.ndarray, caps: np.ndarray, rows: int
               ) -> np.ndarray:
    """:func:`fill_levels` over rows in (topic, partition) order."""
    rows = min(rows, int(caps.sum()))
    if rows <= 0:
        return np.zeros(len(caps), dtype=np.int64)
    # f(level) = sum of the takes is piecewise linear: each partition adds its rate from its
    # watermark on and stops at its cap. Walk the breakpoints (sorted by place, then by
    # change) to the segment reaching rows: as a loop would, in the same float operations
    # in the same order (cumsum adds one after the other), with numpy at thousands of
    # partitions a planning.
    marks = marks.astype(np.float64)
    rates = rates.astype(np.float64)
    points = np.concatenate([marks, marks + caps / rates])
    changes = np.concatenate([rates, -rates])
    order = np.lexsort((changes, points))
    points, changes = points[order], changes[order]
    slope = np.concatenate(([0.0], np.cumsum(changes)[:-1]))     # before each point
    level = np.concatenate((points[:1], points[:-1]))              # where it stood then
    step = slope * (points - level)
    total = np.concatenate(([0.0], np.cumsum(step)[:-1]))
    reached = np.flatnonzero((slope > 0) & (total + step >= rows))
    if reached.size:
        k = reached[0]
        at = level[k] + (rows - total[k]) / slope[k]
    else:
        at = points[-1]
    takes = np.minimum(caps.astype(np.float64), np.maximum(0.0, (at - marks) * rates))
    return _whole_rows(takes, caps, rows)


def fill_densities(known: np.ndarray, holders: np.ndarray) -> np.ndarray | None:
    """A density for each holder (``holders``: a mask over rows): its own (``known``; NaN
    where it has none), else the median of the other holders' (a partition that read one
    record, or none, last time); 0 for the rows that hold nothing. None when no holder's is
    known: the read limit then serves them strictly by watermark, as before the first
    estimate."""
    unknown = np.isnan(known)
    own = np.sort(known[holders & ~unknown])
    if not own.size:
        return None
    middle = own.size // 2
    median = own[middle] if own.size % 2 else (own[middle - 1] + own[middle]) / 2
    return np.where(holders, np.where(unknown, median, known), 0.0)


def proportional(lags: dict[TopicPartition, int], rows: int) -> dict[TopicPartition, int]:
    """Split ``rows`` (at most the total lag) in proportion to lag, exactly: shares are
    floored and the rows left over go to the largest remainders (ties: larger lag, then
    topic/partition order)."""
    tps = sorted(lags)
    caps = np.array([lags[tp] for tp in tps], dtype=np.int64)
    return dict(zip(tps, _proportional_rows(caps, rows).tolist()))


def _proportional_rows(caps: np.ndarray, rows: int) -> np.ndarray:
    """:func:`proportional` over rows in (topic, partition) order."""
    total = int(caps.sum())
    if total == 0 or rows <= 0:
        return np.zeros(len(caps), dtype=np.int64)
    # Python's int / int is the exactly rounded quotient (numpy's rounds rows * lag first).
    return _whole_rows(np.array([rows * lag / total for lag in caps.tolist()]), caps, rows)


def _whole_rows(shares: np.ndarray, caps: np.ndarray, rows: int) -> np.ndarray:
    """``shares`` (of rows in (topic, partition) order) as integers within ``caps`` adding up
    to ``rows`` (at most the caps' total): floored, then one more each to the largest
    remainders (ties: larger cap, then row order), as many rounds as it takes."""
    taken = np.minimum(caps, np.maximum(0, np.floor(shares)).astype(np.int64))
    left = rows - int(taken.sum())
    # largest remainder first (taken - share is exactly -(share - taken)), then larger cap,
    # then row order: topic/partition order
    order = np.lexsort((np.arange(len(caps)), -caps, taken - shares))
    backwards = order[::-1]
    while left < 0:   # rounding above rows: back from the smallest remainders
        can = backwards[taken[backwards] > 0][:-left]
        if not can.size:
            break
        taken[can] -= 1
        left += can.size
    while left > 0:
        can = order[taken[order] < caps[order]][:left]
        if not can.size:
            break
        taken[can] += 1
        left -= can.size
    return taken


def held_by_alignment(watermarks: dict[TopicPartition, int], unread: dict[TopicPartition, int],
                      counted: dict[TopicPartition, bool], max_drift_ms: int
                      ) -> set[TopicPartition]:
    """Watermark alignment (DESIGN §11): the counted partitions with unread records whose
    watermark is more than ``max_drift_ms`` above the *alignment floor*, the lowest watermark
    of a counted partition that has unread records.

    A partition with nothing unread is not part of the floor, so a silent partition never holds
    the others back; the partition at the floor is never held, so some partition always reads.
    ``watermarks`` use ``UNDEFINED`` for an undefined one, which is the lowest.
    """
    active = [tp for tp, n in unread.items() if n > 0 and counted.get(tp, True)]
    if not active:
        return set()
    floor = min(watermarks[tp] for tp in active)
    return {tp for tp in active if watermarks[tp] - floor > max_drift_ms}


@dataclass(frozen=True)
class RangeTask:
    """One Spark task's work: ``[start, end)`` of one partition, and all it needs to compute
    every row's watermark deterministically (DESIGN §4)."""

    topic: str
    partition: int
    start: int
    end: int
    state: PartitionState
    counted: bool
    previous_ms: int | None   # combined watermark at the batch start
    others_ms: int            # min over the other counted partitions (watermarks.UNDEFINED /
    # NO_PARTITIONS sentinels included); with watermark.combine=percentile, the ceiling of
    # watermarks.row_bounds
    floor_ms: int | None = None   # percentile only: the floor of watermarks.row_bounds

    @property
    def tp(self) -> TopicPartition:
        return self.topic, self.partition


# A RangeTask's fields but its state, and a PartitionState's, in declaration order.
_TASK_NAMES = tuple(f.name for f in fields(RangeTask) if f.name != "state")
_STATE_ORDER = tuple(f.name for f in fields(PartitionState))


def task_columns(tasks: tuple[RangeTask, ...]) -> tuple[list[list], list[list]]:
    """``tasks`` as columns: a list per RangeTask field (but ``state``) and a list per
    PartitionState field, one value a task (:func:`tasks_of_columns` reads them back).
    Pickled so, a 4,096-range Spark task is half the bytes and half the driver's time of
    4,096 pickled objects and their states (bench/README.md, "Fewer objects, and none
    walked again")."""
    return ([[getattr(task, name) for task in tasks] for name in _TASK_NAMES],
            [[getattr(task.state, name) for task in tasks] for name in _STATE_ORDER])


def tasks_of_columns(columns: tuple[list[list], list[list]]) -> tuple[RangeTask, ...]:
    """The tasks :func:`task_columns` made the columns of, equal field for field."""
    task_values, state_values = columns
    tasks = []
    new = object.__new__
    for values, state_of in zip(zip(*task_values), zip(*state_values)):
        state = new(PartitionState)
        state.__dict__.update(zip(_STATE_ORDER, state_of))
        task = new(RangeTask)
        fields_of = task.__dict__   # frozen: the dict is the way in
        fields_of.update(zip(_TASK_NAMES, values))
        fields_of["state"] = state
        tasks.append(task)
    return tuple(tasks)


class TaskColumns:
    """The ranges of one Spark task as columns (:func:`task_columns`' lists): what a task of
    thousands of ranges reads by (``kwatermark.compiled``, ``reader.RangeColumns``) and
    publishes (``ProgressLedger.offer_pack``) without a ``RangeTask`` and a
    ``PartitionState`` object a range; ``tasks`` builds those, once, where one is needed
    (the Python engine, an error that names a range).

    A RangeTask field is a list by its own name (``columns.start[i]``), a PartitionState
    field by its name in ``state`` (``columns.state["generator"][i]``). As a sequence it is
    its ``tasks``."""

    def __init__(self, columns: tuple[list[list], list[list]],
                 tasks: tuple[RangeTask, ...] | None = None):
        self.raw = columns
        task_values, state_values = columns
        for name, values in zip(_TASK_NAMES, task_values):
            setattr(self, name, values)
        self.state = dict(zip(_STATE_ORDER, state_values))
        self._tasks = tasks

    @classmethod
    def of(cls, tasks: tuple[RangeTask, ...]) -> TaskColumns:
        return cls(task_columns(tasks), tuple(tasks))

    @classmethod
    def planned(cls, topic: list[str], partition: list[int], start: list[int],
                end: list[int], states: dict[str, list], counted: list[bool],
                previous_ms: int | None, others_ms: list[int], floor_ms: list[int | None]
                ) -> TaskColumns:
        """A batch's ranges as the planner makes them, a column at a time (``RangeTask``'s
        fields, ``states`` a list per PartitionState field by name; ``previous_ms`` is the
        batch's, the same for every range)."""
        fields_of = {"topic": topic, "partition": partition, "start": start, "end": end,
                     "counted": counted, "previous_ms": [previous_ms] * len(start),
                     "others_ms": others_ms, "floor_ms": floor_ms}
        return cls(([fields_of[name] for name in _TASK_NAMES],
                    [states[name] for name in _STATE_ORDER]))

    def __len__(self) -> int:
        return len(self.start)

    def __iter__(self) -> Iterator[RangeTask]:
        return iter(self.tasks)

    def __getitem__(self, row: int) -> RangeTask:
        return self.tasks[row]

    def rows(self, low: int, high: int) -> TaskColumns:
        """Ranges ``low`` to ``high - 1`` (a pack of the batch's ranges)."""
        task_values, state_values = self.raw
        return TaskColumns(([v[low:high] for v in task_values],
                            [v[low:high] for v in state_values]),
                           None if self._tasks is None else self._tasks[low:high])

    @property
    def tasks(self) -> tuple[RangeTask, ...]:
        if self._tasks is None:
            self._tasks = tasks_of_columns(self.raw)
        return self._tasks

    def task(self, row: int) -> RangeTask:
        """The ``row``-th range as a RangeTask (built alone when ``tasks`` is not)."""
        if self._tasks is not None:
            return self._tasks[row]
        task_values, state_values = self.raw
        return tasks_of_columns(([[v[row]] for v in task_values],
                                 [[v[row]] for v in state_values]))[0]


def split_range(start: int, end: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous, nearly equal sub-ranges of ``[start, end)``."""
    parts = max(1, min(parts, end - start))
    size, extra = divmod(end - start, parts)
    bounds, pos = [], start
    for i in range(parts):
        step = size + (1 if i < extra else 0)
        bounds.append((pos, pos + step))
        pos += step
    return bounds


def plan_splits(ranges: dict[TopicPartition, tuple[int, int]], min_partitions: int | None,
                max_records: int | None, splittable: bool
                ) -> dict[TopicPartition, list[tuple[int, int]]]:
    """Sub-ranges per partition, as Spark's KafkaOffsetRangeCalculator does for
    ``minPartitions`` (proportional to size) and ``maxRecordsPerPartition``."""
    nonempty = {tp: r for tp, r in ranges.items() if r[1] > r[0]}
    splits = {tp: [r] for tp, r in nonempty.items()}
    if not splittable:
        return splits
    if max_records:
        splits = {tp: split_range(s, e, math.ceil((e - s) / max_records))
                  for tp, (s, e) in nonempty.items()}
    if min_partitions and sum(len(v) for v in splits.values()) < min_partitions:
        total = sum(e - s for s, e in nonempty.values())
        ideal = total / min_partitions
        splits = {tp: [piece for s, e in splits[tp]
                       for piece in split_range(s, e, max(1, round((e - s) / ideal)))]
                  for tp in nonempty}
    return splits


# The packing rule, part of each pack's ledger key (BatchPlanner.pack_keys): 2 joins a short
# last pack to the one before it (_packs_of_at_least); 1, kwatermark's rule before it, kept
# it alone. A batch planned under 1 (a query upgraded mid-stream) is folded under 1.
PACKING = 2


def _packs_of_at_least(sizes: list[int], min_records: int, packing: int = PACKING
                       ) -> list[tuple[int, int]]:
    """``pack_bounds`` with no cap and one pack wanted: each pack closes at the range that
    brings it to ``min_records`` (thousands of ranges, a handful of packs: a search a pack,
    not a step a range); a last pack of less than half ``min_records`` joins the one before
    it. A Spark task costs a fixed ~30 ms, and with as many tasks as cores a short third
    task waits for a core: 40,960 records over 4,096 partitions packed 2,000 + 2,000 + 96
    partitions, and the 96 started 200-380 ms into the batch, after a long one ended, and
    ended it 50-80 ms later (bench/README.md, "A short last pack")."""
    totals = list(accumulate(sizes))   # totals[i]: the records of ranges 0 to i
    bounds, low, n = [], 0, len(sizes)
    while low < n:
        before = totals[low - 1] if low else 0
        high = min(bisect_left(totals, before + min_records, lo=low), n - 1) + 1
        bounds.append((low, high))
        low = high
    if packing >= 2 and len(bounds) > 1 and \
            totals[-1] - totals[bounds[-1][0] - 1] < min_records / 2:
        bounds[-2:] = [(bounds[-2][0], n)]
    return bounds


def with_state(offset: BatchOffset, tp: TopicPartition, **changes) -> BatchOffset:
    partitions = dict(offset.partitions)
    current = partitions[tp]
    partitions[tp] = replace(current, state=replace(current.state, **changes))
    return replace(offset, partitions=partitions)


def pack_bounds(sizes: list[int], min_records: int | None, min_partitions: int | None,
                max_records: int | None, packing: int = PACKING) -> list[tuple[int, int]]:
    """Group consecutive ranges (of ``sizes[i]`` records each) into Spark tasks of at least
    ``min_records`` records: each pack as ``(low, high)``, ranges ``low`` to ``high - 1``.

    Spark pays a fixed cost per Python task (~30 ms here, DESIGN §12), so many small ranges
    are cheaper read by one task. The ranges themselves are untouched: each keeps its own
    start state, rows and progress record, so packing changes only which Spark task reads
    what. Deterministic in ``sizes`` (a replayed batch packs the same way). A pack is closed
    once it holds ``min_records``; it never grows past ``maxRecordsPerPartition`` nor past
    an even share of the batch among ``minPartitions`` tasks, and there are never fewer
    packs than ``min(minPartitions, len(sizes))``. Where neither bounds it, a last pack of
    less than half ``min_records`` joins the one before (``packing`` 2, ``PACKING``).
    ``min_records`` of None or 1 packs nothing.
    """
    n = len(sizes)
    if not min_records or min_records <= 1 or n <= 1:
        return [(i, i + 1) for i in range(n)]
    wanted = min(min_partitions or 1, n)
    if wanted == 1 and not max_records:
        return _packs_of_at_least(sizes, min_records, packing)
    cap = max_records or math.inf
    if wanted > 1:
        cap = min(cap, math.ceil(sum(sizes) / wanted))
    lows: list[int] = []
    filled = 0
    for placed, size in enumerate(sizes):
        left = n - placed   # this one included
        if (lows and filled < min_records and filled + size <= cap
                and len(lows) + left - 1 >= wanted):
            filled += size
        else:
            lows.append(placed)
            filled = size
    return list(zip(lows, lows[1:] + [n]))
