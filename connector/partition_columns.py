"""A batch's partitions as columns (DESIGN §21): what the planner plans, folds and writes
at thousands of partitions without a ``PartitionRange``, ``PartitionState`` and
``PartitionLag`` object a partition and batch.

``BatchOffset.partitions`` is a mapping from (topic, partition) to ``PartitionRange``. The
planner's offsets keep it as a :class:`RangeMap`: an :class:`OffsetColumns` (one list per
field, partitions in (topic, partition) order) that builds a ``PartitionRange`` only for the
partition asked for, and the whole dict only when it is iterated as one. An offset made
from a dict (a test's, an older caller's) reads the same: :func:`columns_of` makes its
columns.

>>> from kwatermark.offsets import BatchOffset, PartitionRange
>>> offset = BatchOffset(None, {("t", 1): PartitionRange(5, 9), ("t", 0): PartitionRange(0, 3)})
>>> columns = columns_of(offset)
>>> columns.tps, columns.start, columns.end
([('t', 0), ('t', 1)], [0, 5], [3, 9])
>>> RangeMap(columns) == offset.partitions
True
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import fields
from operator import sub

from kwatermark.offsets import (
    BatchOffset,
    PartitionLag,
    PartitionRange,
    PartitionState,
    TopicPartition,
)
from kwatermark.watermarks import NO_PARTITIONS, UNDEFINED

# PartitionState's and PartitionLag's fields, in declaration order: the columns' names.
STATE_FIELDS = tuple(f.name for f in fields(PartitionState))
LAG_FIELDS = tuple(f.name for f in fields(PartitionLag))

_new = object.__new__


def _state(values: tuple) -> PartitionState:
    state = _new(PartitionState)
    state.__dict__.update(zip(STATE_FIELDS, values))   # frozen: the dict is the way in
    return state


class OffsetColumns:
    """Each partition's range, state and lag at an offset, a list per field, in (topic,
    partition) order: ``start[i]``, ``end[i]``, ``state["generator"][i]``,
    ``lag["unread"][i]`` (a lag column is None where ``has_lag[i]`` is false)."""

    def __init__(self, tps: list[TopicPartition], start: list[int], end: list[int],
                 state: dict[str, list], has_lag: list[bool], lag: dict[str, list]):
        self.tps = tps
        self.start = start
        self.end = end
        self.state = state
        self.has_lag = has_lag
        self.lag = lag
        self._index: dict[TopicPartition, int] | None = None

    @classmethod
    def of(cls, partitions: Mapping[TopicPartition, PartitionRange]) -> OffsetColumns:
        """The columns of a dict of ranges."""
        tps = sorted(partitions)
        ranges = [partitions[tp] for tp in tps]
        states = [r.state for r in ranges]
        lags = [r.lag for r in ranges]
        return cls(tps, [r.start for r in ranges], [r.end for r in ranges],
                   {name: [getattr(s, name) for s in states] for name in STATE_FIELDS},
                   [lag is not None for lag in lags],
                   {name: [None if lag is None else getattr(lag, name) for lag in lags]
                    for name in LAG_FIELDS})

    def __len__(self) -> int:
        return len(self.tps)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, OffsetColumns):
            return NotImplemented
        # A lag column holds None where the partition has no lag.
        return (self.tps == other.tps and self.start == other.start
                and self.end == other.end and self.state == other.state
                and self.has_lag == other.has_lag and self.lag == other.lag)

    def __reduce__(self):
        return OffsetColumns, (self.tps, self.start, self.end, self.state, self.has_lag,
                               self.lag)

    @property
    def index(self) -> dict[TopicPartition, int]:
        """Each partition's row."""
        if self._index is None:
            self._index = dict(zip(self.tps, range(len(self.tps))))
        return self._index

    def state_at(self, row: int) -> PartitionState:
        return _state(tuple(self.state[name][row] for name in STATE_FIELDS))

    def range_at(self, row: int) -> PartitionRange:
        lag = None
        if self.has_lag[row]:
            lag = _new(PartitionLag)
            lag.__dict__.update((name, self.lag[name][row]) for name in LAG_FIELDS)
        r = _new(PartitionRange)
        r.__dict__.update(start=self.start[row], end=self.end[row],
                          state=self.state_at(row), lag=lag)
        return r

    def ranges(self) -> dict[TopicPartition, PartitionRange]:
        return {tp: self.range_at(row) for row, tp in enumerate(self.tps)}


class _Lazy(Mapping):
    """A mapping over an :class:`OffsetColumns`' partitions whose values are built from a row
    when asked (``_at``), all of them once when iterated as items or values."""

    def __init__(self, columns: OffsetColumns):
        self.columns = columns
        self._built: dict | None = None

    def _at(self, row: int) -> object:
        raise NotImplementedError

    def _all(self) -> dict:
        if self._built is None:
            self._built = {tp: self._at(row) for row, tp in enumerate(self.columns.tps)}
        return self._built

    def __getitem__(self, tp: TopicPartition) -> object:
        if self._built is not None:
            return self._built[tp]
        return self._at(self.columns.index[tp])

    def get(self, tp: TopicPartition, default: object = None) -> object:
        row = self.columns.index.get(tp)
        return default if row is None else self[tp]

    def __contains__(self, tp: object) -> bool:
        return tp in self.columns.index

    def __iter__(self) -> Iterator[TopicPartition]:
        return iter(self.columns.tps)

    def __len__(self) -> int:
        return len(self.columns.tps)

    def items(self):
        return self._all().items()

    def values(self):
        return self._all().values()

    def __eq__(self, other: object) -> bool:
        # Columns against columns, without a value object (the planner compares the offset
        # it folded with the one it is handed: 4,096 ranges a planning).
        if type(other) is type(self):
            return self.columns == other.columns
        return Mapping.__eq__(self, other)

    def __repr__(self) -> str:
        return repr(self._all())

    def __reduce__(self):
        return type(self), (self.columns,)


class RangeMap(_Lazy):
    """``BatchOffset.partitions`` as columns: ``PartitionRange`` values, built when asked."""

    def _at(self, row: int) -> PartitionRange:
        return self.columns.range_at(row)


class StateMap(_Lazy):
    """Each partition's ``PartitionState`` (``BatchPlanner.fold``'s answer) as columns: the
    lag columns are unused."""

    def _at(self, row: int) -> PartitionState:
        return self.columns.state_at(row)


def columns_of(offset: BatchOffset) -> OffsetColumns:
    """``offset``'s partitions as columns: its own where it keeps them, else made."""
    partitions = offset.partitions
    if isinstance(partitions, RangeMap):
        return partitions.columns
    return OffsetColumns.of(partitions)


def with_columns(offset: BatchOffset) -> BatchOffset:
    """``offset`` keeping its partitions as columns (itself if it does)."""
    if isinstance(offset.partitions, RangeMap):
        return offset
    return BatchOffset(offset.watermark, RangeMap(OffsetColumns.of(offset.partitions)),
                       offset.heartbeat, offset.planned_ms, offset.holder)


def observe_lags(before: OffsetColumns, planned: int | None, tps: list[TopicPartition],
                 begins: list[int], latest: list[int], marks: list[int], now: int
                 ) -> tuple[list[bool], dict[str, list]]:
    """The next batch's lag columns (``OffsetColumns.lag``, each partition's ``tps[i]``
    reading from ``begins[i]``, the broker's end offset ``latest[i]``, its watermark
    ``marks[i]``): its event-time and processing lag as the driver sees them at ``now``
    (DESIGN §13), from the batch before (``before``, planned at ``planned``).

    The processing-time watermark moves to the planning time of the previous batch when that
    batch planned everything the partition had then (it has run since: every record appended
    before it was planned has been read), and to ``now`` when nothing is unread now.
    """
    if before.tps == tps:
        had, earlier, left, starts, ends = (before.has_lag, before.lag["processing_wm_ms"],
                                            before.lag["unread"], before.start, before.end)
    else:   # partitions joined or left: each one's row before, if it had one
        rows = [before.index.get(tp) for tp in tps]
        had = [row is not None and before.has_lag[row] for row in rows]
        earlier, left, starts, ends = (
            [None if row is None else column[row] for row in rows]
            for column in (before.lag["processing_wm_ms"], before.lag["unread"],
                           before.start, before.end))
    # A column at a time (4,096 partitions a planning): the processing-time watermark a
    # partition had, moved to ``planned`` where that batch planned all it had unread then,
    # then to ``now`` where nothing is unread now.
    if planned is None:
        moved = [wm if has else None for has, wm in zip(had, earlier)]
    else:
        moved = [None if not has else wm if then is None or end - start != then
                 else planned if wm is None or wm < planned else wm
                 for has, wm, then, start, end in zip(had, earlier, left, starts, ends)]
    unread_of = [unread if unread > 0 else 0   # noqa: FURB136 (no call a partition)
                 for unread in map(sub, latest, begins)]
    processing_of = [wm if unread else now if wm is None or wm < now else wm
                     for wm, unread in zip(moved, unread_of)]
    marks_of = [None if mark == UNDEFINED or mark == NO_PARTITIONS else mark for mark in marks]
    return [True] * len(tps), {
        "watermark_ms": marks_of, "processing_wm_ms": processing_of,
        "event_lag_ms": [None if mark is None else now - mark for mark in marks_of],
        "processing_lag_ms": [None if wm is None else now - wm for wm in processing_of],
        "unread": unread_of}


def read_densities(start: BatchOffset, states: dict[TopicPartition, PartitionState],
                   lowest: dict[TopicPartition, int] | None = None
                   ) -> dict[TopicPartition, float]:
    """Records per ms of event time each partition read in the batch that ended at
    ``start``: its range over how far its highest event time moved (``states``: the states at
    the ranges' ends), or, read from no event time (a new query's first batch), over the span
    from the ``lowest`` event time it read. None for a partition that read nothing or whose
    event times did not move."""
    tps = columns_of(start).tps
    return {tp: density for tp, density in zip(tps, density_rows(start, states, lowest))
            if not math.isnan(density)}


def density_rows(start: BatchOffset, states: dict[TopicPartition, PartitionState],
                 lowest: dict[TopicPartition, int] | None = None) -> list[float]:
    """:func:`read_densities` of each of ``start``'s partitions in its order, NaN where it
    has none (a column: 4,096 partitions a planning)."""
    columns = columns_of(start)
    if isinstance(states, StateMap) and states.columns.tps == columns.tps:
        after_of = states.columns.state["max_event_ms"]
    else:
        after_of = [states[tp].max_event_ms if tp in states else None for tp in columns.tps]
    before_of = columns.state["max_event_ms"]
    if lowest and None in before_of:
        before_of = [lowest.get(tp) if before is None else before
                     for tp, before in zip(columns.tps, before_of)]
    nan = math.nan
    return [(end - start_at) / (after - before)
            if end > start_at and before is not None and after is not None and after > before
            else nan
            for start_at, end, before, after in zip(columns.start, columns.end, before_of,
                                                    after_of)]
