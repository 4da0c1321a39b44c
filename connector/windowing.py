"""Event-time windows as pure values (DESIGN §10): assignment, session merging, accumulators,
and the per-key state machine that decides when a window is ``final``, re-emitted as an
``update`` or surfaced as ``late``. Nothing here imports Spark or Kafka; the
``transformWithState`` processor in :mod:`kwatermark.windows` only stores a :class:`KeyWindows`
in Spark's state store and wakes it with Spark's event-time timers.

A window ``[start, end)`` is complete once the watermark reaches ``end - 1`` (its maximum
timestamp, as in Flink). With allowed lateness ``L``, a record is judged from its own event
time and the watermark in force when it arrived (its row's ``watermark``):

* ``end - 1 > w``           on time: accumulated, part of the window's ``final``;
* ``end - 1 <= w < end - 1 + L``  late but allowed: accumulated, the window re-emits its whole
  aggregate as an ``update`` (or is still in its ``final`` if that has not come out yet);
* ``end - 1 + L <= w``      late: never accumulated; each batch emits, per window, the
  aggregate of such records alone as a ``late`` row.

So for ``count`` and ``sum`` the true value of a window is its last ``final``/``update`` plus
the sum of its ``late`` rows.

>>> state = KeyWindows()
>>> spec = WindowSpec(Tumbling(10_000), (Agg("n", "count", None),), lateness_ms=0)
>>> state.apply(spec, Rows.of([1_000, 2_000], [None, 500]), watermark=-1)
[]
>>> [(e.kind, e.start, e.values) for e in state.fire(spec, 9_999)]
[('final', 0, [2])]
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kwatermark.errors import KWatermarkError

FINAL, UPDATE, LATE = "final", "update", "late"
NO_WATERMARK = int(np.iinfo(np.int64).min)


class WindowError(KWatermarkError):
    """A window definition or an aggregation that cannot be built."""


# -- assigners --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tumbling:
    """Fixed, non-overlapping windows of ``size_ms``, aligned to the epoch plus ``offset_ms``."""

    size_ms: int
    offset_ms: int = 0
    merging = False

    def __post_init__(self):
        if self.size_ms <= 0:
            raise WindowError(f"tumbling window size must be positive, got {self.size_ms} ms")

    def assign(self, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row index, window start) for every window each time falls in."""
        starts = times - np.mod(times - self.offset_ms, self.size_ms)
        return np.arange(len(times)), starts

    @property
    def length_ms(self) -> int:
        return self.size_ms


@dataclass(frozen=True)
class Sliding:
    """Windows of ``size_ms`` starting every ``slide_ms``: a time is in ``size / slide``
    of them."""

    size_ms: int
    slide_ms: int
    offset_ms: int = 0
    merging = False

    def __post_init__(self):
        if self.size_ms <= 0 or self.slide_ms <= 0:
            raise WindowError(f"sliding window size and slide must be positive, got "
                              f"{self.size_ms} ms and {self.slide_ms} ms")
        if self.size_ms % self.slide_ms:
            raise WindowError(f"sliding window size ({self.size_ms} ms) must be a multiple of "
                              f"its slide ({self.slide_ms} ms)")

    def assign(self, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        last = times - np.mod(times - self.offset_ms, self.slide_ms)
        per = self.size_ms // self.slide_ms
        rows = np.repeat(np.arange(len(times)), per)
        starts = np.repeat(last, per) - np.tile(np.arange(per) * self.slide_ms, len(times))
        return rows, starts

    @property
    def length_ms(self) -> int:
        return self.size_ms


@dataclass(frozen=True)
class Session:
    """Per key, records closer than ``gap_ms`` share a window ``[first, last + gap)``; windows
    that touch merge (Flink's ``EventTimeSessionWindows``)."""

    gap_ms: int
    merging = True

    def __post_init__(self):
        if self.gap_ms <= 0:
            raise WindowError(f"session gap must be positive, got {self.gap_ms} ms")


Assigner = Tumbling | Sliding | Session


def merge_intervals(intervals: Sequence[tuple[int, int]]) -> list[tuple[list[int], int, int]]:
    """Groups of intervals that touch or overlap, transitively: ``(members, start, end)``
    with member indices into ``intervals``, ordered by start."""
    order = sorted(range(len(intervals)), key=lambda i: intervals[i])
    groups: list[tuple[list[int], int, int]] = []
    for i in order:
        start, end = intervals[i]
        if groups and start <= groups[-1][2]:
            members, first, last = groups[-1]
            groups[-1] = (members + [i], first, max(last, end))
        else:
            groups.append(([i], start, end))
    return groups


# -- accumulators -----------------------------------------------------------------------------

FUNCTIONS = ("count", "sum", "min", "max", "avg", "first", "last")


@dataclass(frozen=True)
class Agg:
    """One output column: ``name = function(column)``; ``column`` None only for ``count``
    (rows). ``first``/``last`` are by event time."""

    name: str
    function: str
    column: str | None

    def __post_init__(self):
        if self.function not in FUNCTIONS:
            raise WindowError(f"aggregation {self.name!r}: unknown function {self.function!r}; "
                              f"use one of {', '.join(FUNCTIONS)}")
        if self.column is None and self.function != "count":
            raise WindowError(f"aggregation {self.name!r}: {self.function} needs a column")

    def zero(self) -> object:
        return {"count": 0, "sum": None, "avg": (0.0, 0)}.get(self.function)

    def partial(self, values: np.ndarray | None, times: np.ndarray) -> object:
        """The accumulator of one group of rows (``values`` None: count rows)."""
        f = self.function
        if values is None:
            return len(times)
        present = ~_is_null(values)
        if f == "count":
            return int(present.sum())
        if not present.any():
            return self.zero()
        kept, kept_times = values[present], times[present]
        if f == "sum":
            return _scalar(kept.sum())
        if f == "avg":
            return (float(kept.astype(float).sum()), int(kept.size))
        if f == "min":
            return _scalar(min(kept))
        if f == "max":
            return _scalar(max(kept))
        at = int(np.argmin(kept_times)) if f == "first" else \
            len(kept_times) - 1 - int(np.argmax(kept_times[::-1]))
        return (int(kept_times[at]), _scalar(kept[at]))

    def merge(self, a: object, b: object) -> object:
        f = self.function
        if f == "count":
            return a + b
        if f == "avg":
            return (a[0] + b[0], a[1] + b[1])
        if a is None:
            return b
        if b is None:
            return a
        if f == "sum":
            return a + b
        if f == "min":
            return min(a, b)
        if f == "max":
            return max(a, b)
        if f == "first":
            return a if a[0] <= b[0] else b
        return b if b[0] >= a[0] else a  # last: the later one; ties: the later partial

    def result(self, acc: object) -> object:
        if self.function == "avg":
            return acc[0] / acc[1] if acc[1] else None
        if self.function in ("first", "last"):
            return None if acc is None else acc[1]
        return acc


def _is_null(values: np.ndarray) -> np.ndarray:
    if values.dtype.kind == "f":
        return np.isnan(values)
    if values.dtype.kind in "iub":
        return np.zeros(len(values), dtype=bool)
    if values.dtype.kind == "M":
        return np.isnat(values)
    return np.fromiter((v is None or (isinstance(v, float) and math.isnan(v)) for v in values),
                       dtype=bool, count=len(values))


def _scalar(value: object) -> object:
    return value.item() if isinstance(value, np.generic) else value


@dataclass(frozen=True)
class WindowSpec:
    """What ``aggregate`` computes: the windows, the aggregations, the allowed lateness."""

    assigner: Assigner
    aggs: tuple[Agg, ...]
    lateness_ms: int = 0

    def __post_init__(self):
        if self.lateness_ms < 0:
            raise WindowError(f"allowed_lateness must not be negative, got {self.lateness_ms} ms")
        names = [a.name for a in self.aggs]
        if len(set(names)) != len(names):
            raise WindowError(f"aggregation names must be unique, got {names}")

    def zero(self) -> list:
        return [a.zero() for a in self.aggs]

    def merge(self, a: list, b: list) -> list:
        return [agg.merge(x, y) for agg, x, y in zip(self.aggs, a, b)]

    def partial(self, columns: dict[str, np.ndarray], times: np.ndarray,
                rows: np.ndarray) -> list:
        return [agg.partial(None if agg.column is None else columns[agg.column][rows],
                            times[rows]) for agg in self.aggs]

    def results(self, acc: list) -> list:
        return [agg.result(a) for agg, a in zip(self.aggs, acc)]


# -- one key's windows ------------------------------------------------------------------------


@dataclass
class Rows:
    """One key's rows of a micro-batch: event times, row watermarks (None/NaN = undefined) and
    the aggregated columns."""

    times: np.ndarray                      # epoch ms, int64
    watermarks: np.ndarray                 # epoch ms, int64 (NO_WATERMARK = undefined)
    columns: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def of(cls, times: Sequence[int], watermarks: Sequence[int | None],
           columns: dict[str, Sequence] | None = None) -> Rows:
        marks = [NO_WATERMARK if w is None else w for w in watermarks]
        return cls(np.asarray(times, dtype=np.int64), np.asarray(marks, dtype=np.int64),
                   {k: np.asarray(v) for k, v in (columns or {}).items()})

    def __len__(self) -> int:
        return len(self.times)

    def take(self, index: np.ndarray) -> Rows:
        """The rows at ``index`` (positions)."""
        return Rows(self.times[index], self.watermarks[index],
                    {k: v[index] for k, v in self.columns.items()})


@dataclass
class Slot:
    """A window in state: its accumulator, whether it was emitted, whether it changed since."""

    acc: list
    emitted: bool = False
    pending: bool = True

    def __reduce__(self):
        # Pickled by position: half the time of a dataclass's attribute dict (the shell pickles
        # every open window of a bucket of keys in every micro-batch).
        return (Slot, (self.acc, self.emitted, self.pending))


@dataclass(frozen=True)
class Emission:
    kind: str            # FINAL, UPDATE or LATE
    start: int | None    # None: a late record without an event time
    end: int | None
    values: list


def fixed_window_groups(spec: WindowSpec, rows: Rows, placed: np.ndarray
                        ) -> Iterator[tuple[bool, int, np.ndarray]]:
    """The rows ``placed`` (indices of rows with an event time) grouped by fixed window and
    lateness: ``(late?, window start, row indices in arrival order)``, on-time groups first.
    A row is late for a window once its own row watermark reaches ``end - 1 + lateness``."""
    index, starts = spec.assigner.assign(rows.times[placed])
    index = placed[index]
    is_late = starts + spec.assigner.length_ms - 1 + spec.lateness_ms <= rows.watermarks[index]
    for flag in (False, True):
        chosen = is_late == flag
        if not chosen.any():
            continue
        windows, inverse = np.unique(starts[chosen], return_inverse=True)
        picked = index[chosen]
        order = np.argsort(inverse, kind="stable")
        bounds = np.searchsorted(inverse[order], np.arange(len(windows) + 1))
        for w, start in enumerate(windows.tolist()):
            yield flag, start, picked[order[bounds[w]:bounds[w + 1]]]


@dataclass
class KeyWindows:
    """The windows of one key that can still change. ``apply`` takes a micro-batch's rows,
    ``fire`` emits what the watermark completed and drops what can no longer change."""

    slots: dict[tuple[int, int], Slot] = field(default_factory=dict)

    def apply(self, spec: WindowSpec, rows: Rows, watermark: int) -> list[Emission]:
        """Fold one micro-batch's rows in; ``watermark`` is Spark's (the batch start's).

        Returns the ``final``/``update`` rows that are due and the batch's ``late`` rows.
        """
        emitted = self.fire(spec, watermark)
        known = rows.times != NO_WATERMARK if len(rows) else np.zeros(0, dtype=bool)
        late = []
        if (~known).any():
            missing = np.flatnonzero(~known)
            late.append(Emission(LATE, None, None,
                                 spec.results(spec.partial(rows.columns, rows.times, missing))))
        placed = np.flatnonzero(known)
        if spec.assigner.merging:
            late += self._apply_sessions(spec, rows, placed)
        else:
            late += self._apply_fixed(spec, rows, placed)
        return emitted + self.fire(spec, watermark) + late

    def _apply_fixed(self, spec: WindowSpec, rows: Rows, placed: np.ndarray) -> list[Emission]:
        late = []
        for flag, start, members in fixed_window_groups(spec, rows, placed):
            partial = spec.partial(rows.columns, rows.times, members)
            window = (start, start + spec.assigner.length_ms)
            if flag:
                late.append(Emission(LATE, *window, spec.results(partial)))
            else:
                self._add(spec, window, partial)
        return late

    def _apply_sessions(self, spec: WindowSpec, rows: Rows, placed: np.ndarray
                        ) -> list[Emission]:
        gap = spec.assigner.gap_ms
        late_rows = []
        # Arrival order: the row watermark never decreases within a partition.
        for i in sorted(placed.tolist(), key=lambda i: (rows.watermarks[i], rows.times[i])):
            t = int(rows.times[i])
            start, end = t, t + gap
            touching = [w for w in self.slots if w[0] <= end and start <= w[1]]
            for w in touching:
                start, end = min(start, w[0]), max(end, w[1])
            if end - 1 + spec.lateness_ms <= rows.watermarks[i]:
                late_rows.append(i)
                continue
            merged = Slot(spec.partial(rows.columns, rows.times, np.asarray([i])))
            for w in touching:
                old = self.slots.pop(w)
                merged.acc = spec.merge(old.acc, merged.acc)
                merged.emitted |= old.emitted
            self.slots[(start, end)] = merged
        late = []
        intervals = [(int(rows.times[i]), int(rows.times[i]) + gap) for i in late_rows]
        for members, start, end in merge_intervals(intervals):
            chosen = np.asarray([late_rows[m] for m in members])
            late.append(Emission(LATE, start, end,
                                 spec.results(spec.partial(rows.columns, rows.times, chosen))))
        return late

    def apply_partials(self, spec: WindowSpec, partials: Partials, watermark: int
                       ) -> list[Emission]:
        """:meth:`apply` for rows already combined per window and lateness (fixed windows
        only): the same emissions as ``apply`` on the rows the partials were made of."""
        emitted = self.fire(spec, watermark)
        late: dict[tuple, list] = {}
        for start, is_late, acc in zip(partials.starts, partials.late, partials.accs):
            window = (None, None) if start is None else (start, start + spec.assigner.length_ms)
            if is_late:
                late[window] = spec.merge(late[window], acc) if window in late else acc
            else:
                self._add(spec, window, acc)
        # As apply: rows without event time first, then the windows in order.
        order = sorted(late, key=lambda w: (w[0] is not None, w[0] or 0))
        return emitted + self.fire(spec, watermark) + [
            Emission(LATE, *window, spec.results(late[window])) for window in order]

    def _add(self, spec: WindowSpec, window: tuple[int, int], partial: list) -> None:
        slot = self.slots.get(window)
        if slot is None:
            self.slots[window] = Slot(list(partial))      # merge(zero, partial) == partial
        else:
            slot.acc = spec.merge(slot.acc, partial)
            slot.pending = True

    def fire(self, spec: WindowSpec, watermark: int) -> list[Emission]:
        """Emit every changed window the watermark completed; forget the ones past lateness."""
        out = []
        for window in sorted(self.slots):
            slot = self.slots[window]
            if window[1] - 1 > watermark:
                continue
            if slot.pending:
                out.append(Emission(UPDATE if slot.emitted else FINAL, *window,
                                    spec.results(slot.acc)))
                slot.emitted, slot.pending = True, False
            if window[1] - 1 + spec.lateness_ms <= watermark:
                del self.slots[window]
        return out

    def wake_ups(self, spec: WindowSpec) -> set[int]:
        """Watermarks at which ``fire`` has something to do: each window's completion and, with
        lateness, the end of its lateness."""
        marks = set()
        for start, end in self.slots:
            marks.add(end - 1)
            if spec.lateness_ms:
                marks.add(end - 1 + spec.lateness_ms)
        return marks


# -- combining rows before the shuffle (fixed windows) ----------------------------------------
#
# Whether a record is on time, allowed late or late depends only on its event time and its own
# row watermark, so rows can be combined per (key, window, late?) where they are read, before
# Spark moves them to the stateful step: what Spark's own aggregation does with its partial
# aggregates. The stateful step then merges accumulators instead of folding records.

START, IS_LATE = "kwatermark_start", "kwatermark_late"


@dataclass
class Partials:
    """One key's combined rows: window start (None: records without event time, always late),
    whether they are late, and per row the accumulators of ``spec.aggs``."""

    starts: list
    late: list
    accs: list[list]

    def take(self, index: Sequence[int]) -> Partials:
        return Partials([self.starts[i] for i in index], [self.late[i] for i in index],
                        [self.accs[i] for i in index])


def accumulator_columns(spec: WindowSpec) -> list[list[tuple[str, str]]]:
    """Per aggregation, the columns :func:`combine` gives its accumulator:
    ``(name, role)`` with role ``value``, ``n`` (avg's count) or ``time`` (first/last)."""
    out = []
    for i, agg in enumerate(spec.aggs):
        columns = [(f"kwatermark_a{i}", "value")]
        if agg.function == "avg":
            columns.append((f"kwatermark_a{i}_n", "n"))
        if agg.function in ("first", "last"):
            columns.append((f"kwatermark_a{i}_t", "time"))
        out.append(columns)
    return out


def combine(spec: WindowSpec, table: pa.Table, keys: Sequence[str], time: str, mark: str
            ) -> pa.Table:
    """The rows of ``table`` combined per ``keys``, window start (column :data:`START`, null
    for rows without event time) and lateness (:data:`IS_LATE`): the accumulators of
    :func:`accumulator_columns` and ``mark``'s maximum. ``time`` and ``mark`` are epoch ms
    (null: none / undefined watermark). Fixed windows only: sessions depend on their key's
    other rows."""
    if spec.assigner.merging:
        raise WindowError("session windows cannot be combined before the shuffle")
    times = table.column(time)
    known = pc.is_valid(times).to_numpy(zero_copy_only=False)
    marks = pc.fill_null(table.column(mark), NO_WATERMARK).to_numpy()
    placed = np.flatnonzero(known)
    index, starts = spec.assigner.assign(pc.fill_null(times, 0).to_numpy()[placed])
    index = placed[index]
    late = starts + spec.assigner.length_ms - 1 + spec.lateness_ms <= marks[index]
    missing = np.flatnonzero(~known)
    rows = table.take(np.concatenate([index, missing]))
    rows = rows.append_column(START, pa.array(
        np.concatenate([starts, np.zeros(len(missing), dtype=np.int64)]),
        mask=np.concatenate([np.zeros(len(index), dtype=bool), np.ones(len(missing), bool)])))
    rows = rows.append_column(IS_LATE, pa.array(
        np.concatenate([late, np.ones(len(missing), dtype=bool)])))
    if any(a.function in ("first", "last") for a in spec.aggs):
        rows = rows.take(pc.sort_indices(rows, [(time, "ascending")]))  # stable
    aggregations, names = [], []
    for agg, columns in zip(spec.aggs, accumulator_columns(spec)):
        name = columns[0][0]
        if agg.column is None:
            aggregations.append(([], "count_all"))
            names.append((name, "count_all"))
            continue
        values = rows.column(agg.column)
        rows = rows.append_column(name, values.cast(pa.float64()) if agg.function == "avg"
                                  else values)
        function = {"count": "count", "avg": "sum"}.get(agg.function, agg.function)
        aggregations.append((name, function))
        names.append((name, f"{name}_{function}"))
        if agg.function == "avg":
            aggregations.append((name, "count"))
            names.append((f"{name}_n", f"{name}_count"))
        if agg.function in ("first", "last"):
            present = pc.if_else(pc.is_valid(values), rows.column(time),
                                 pa.scalar(None, pa.int64()))
            rows = rows.append_column(f"{name}_t", present)
            aggregations.append((f"{name}_t", agg.function))
            names.append((f"{name}_t", f"{name}_t_{agg.function}"))
    aggregations.append((mark, "max"))
    grouped = rows.group_by([*keys, START, IS_LATE], use_threads=False).aggregate(aggregations)
    columns = [*keys, START, IS_LATE]
    return pa.table([grouped.column(c) for c in columns]
                    + [grouped.column(produced) for _, produced in names]
                    + [grouped.column(f"{mark}_max")],
                    names=[*columns, *(n for n, _ in names), mark])


def partials(spec: WindowSpec, starts: Sequence, late: Sequence[bool],
             columns: dict[str, Sequence]) -> Partials:
    """:class:`Partials` from :func:`combine`'s columns as Python lists (None: null)."""
    per_agg = []
    for agg, names in zip(spec.aggs, accumulator_columns(spec)):
        value = columns[names[0][0]]
        f = agg.function
        if f == "count":
            per_agg.append([int(v) for v in value])
        elif f == "avg":
            per_agg.append([(0.0 if s is None else float(s), int(n))
                            for s, n in zip(value, columns[names[1][0]])])
        elif f in ("first", "last"):
            per_agg.append([None if t is None else (int(t), v)
                            for v, t in zip(value, columns[names[1][0]])])
        else:
            per_agg.append(list(value))
    return Partials([None if s is None else int(s) for s in starts], [bool(x) for x in late],
                    [list(acc) for acc in zip(*per_agg)] if per_agg else [[] for _ in starts])


# -- a bucket of keys' fixed windows, stored window by window ---------------------------------
#
# The shell keeps many keys under one Spark grouping key (a bucket). Storing every key's windows
# as one value made each micro-batch rewrite the whole bucket: cost quadratic in keys. Here a
# bucket's state is a small index plus chunks, each chunk one window's partials for some keys,
# so a micro-batch writes what it touched and reads only the windows it must emit or update.
# A window's slot for a key is the merge of its entries over the window's chunks: the chunk
# written when the window last fired (every key in it emitted, nothing pending) and the chunks
# of partials added since (pending, not emitted unless the fired chunk has the key).


@dataclass
class WindowEntry:
    """Where one window's slots are: ``fired``, the chunk of every key's accumulator as of
    the window's last firing; ``deltas``, the chunks of partials added since."""

    fired: int | None = None
    deltas: list[int] = field(default_factory=list)

    def __reduce__(self):
        return (WindowEntry, (self.fired, self.deltas))


@dataclass
class WindowIndex:
    """A bucket's windows (``(start, end)`` -> entry), the next chunk id and the bucket's
    event-time timer (None: none registered)."""

    windows: dict[tuple[int, int], WindowEntry] = field(default_factory=dict)
    next_chunk: int = 0
    timer: int | None = None

    def __reduce__(self):
        return (WindowIndex, (self.windows, self.next_chunk, self.timer))

    def wake_up(self, spec: WindowSpec, watermark: int) -> int | None:
        """The first watermark above ``watermark`` at which :meth:`BucketWindows.fire` has
        something to do: a window with pending partials completes, or a window's lateness
        ends."""
        marks = [end - 1 + spec.lateness_ms for _, end in self.windows]
        marks += [end - 1 for (_, end), entry in self.windows.items() if entry.deltas]
        return min((m for m in marks if m > watermark), default=None)


class ChunkStore:
    """Where :class:`BucketWindows` keeps chunks. A chunk is ``{window: (keys, accs)}``: some
    windows' partials for some keys (a checkpoint of the first chunked layout holds one
    window's ``(keys, accs)`` instead, read as such). A dict here; the shell passes one backed
    by Spark's state store."""

    def __init__(self):
        self.chunks: dict[int, object] = {}

    def get(self, chunk: int) -> object:
        return self.chunks[chunk]

    def put(self, chunk: int, data: object) -> None:
        self.chunks[chunk] = data

    def remove(self, chunk: int) -> None:
        del self.chunks[chunk]


# Windows given partials in one call share a chunk, up to this many: one state-store write
# (and, when they complete together, one read and one removal) for all of them instead of one
# per window. Bounded because a window fired alone reads its chunk's other windows too.
WINDOWS_PER_CHUNK = 16


class BucketWindows:
    """Fixed windows of a bucket of keys over a :class:`WindowIndex` and a chunk store: for
    every key, the same emissions as that key's :class:`KeyWindows` (per key and window in
    the same order), at a cost set by what a micro-batch touches:

    * partials for windows the watermark has not completed are appended, nothing read: one
      chunk for up to :data:`WINDOWS_PER_CHUNK` such windows;
    * a window the watermark completed (with pending partials, or touched by allowed-late
      ones) is read, emitted and, while its lateness lasts, written back (the windows written
      back by one call share a chunk);
    * a window past its lateness with nothing pending is dropped without being read;
    * a chunk is removed once no window refers to it, and read at most once per call.

    Call :meth:`apply_partials` or :meth:`fire` once per instance (the shell makes one per
    call): each writes its new chunks as it returns.
    """

    def __init__(self, index: WindowIndex, store: ChunkStore):
        self.index = index
        self.store = store
        self._read: dict[int, object] = {}          # chunks read (or written) by this call
        self._new: dict[tuple[int, int], tuple[list, list]] = {}
        self._new_id: int | None = None              # the written-back windows' chunk

    def apply_partials(self, spec: WindowSpec, keys: Sequence[tuple], partials: Partials,
                       watermark: int) -> list[tuple[tuple, Emission]]:
        """:meth:`KeyWindows.apply_partials` for every key at once: ``keys[i]`` is the key of
        partial ``i``. Returns (key, emission) pairs."""
        out = self._fire(spec, watermark)
        length = spec.assigner.length_ms
        fresh: dict[tuple[int, int], tuple[list, list]] = {}
        late: dict[tuple, list] = {}
        for key, start, is_late, acc in zip(keys, partials.starts, partials.late,
                                            partials.accs):
            if is_late:
                window = (None, None) if start is None else (start, start + length)
                at = (key, window)
                late[at] = spec.merge(late[at], acc) if at in late else acc
            else:
                chunk = fresh.get((start, start + length))
                if chunk is None:
                    fresh[(start, start + length)] = ([key], [acc])
                else:
                    chunk[0].append(key)
                    chunk[1].append(acc)
        ahead = []
        for window in sorted(fresh):
            added_keys, added = fresh[window]
            if window[1] - 1 > watermark:
                ahead.append(window)
            else:
                out += self._fold(spec, window, watermark, added_keys, added)
        for at in range(0, len(ahead), WINDOWS_PER_CHUNK):
            group = ahead[at:at + WINDOWS_PER_CHUNK]
            chunk = self._put({window: fresh[window] for window in group})
            for window in group:
                self.index.windows.setdefault(window, WindowEntry()).deltas.append(chunk)
        self._flush()
        order = sorted(late, key=lambda at: (at[1][0] is not None, at[1][0] or 0))
        return out + [(key, Emission(LATE, *window, spec.results(late[(key, window)])))
                      for key, window in order]

    def fire(self, spec: WindowSpec, watermark: int) -> list[tuple[tuple, Emission]]:
        """:meth:`KeyWindows.fire` for every key: emit the windows the watermark completed
        that have pending partials; drop the ones past their lateness."""
        out = self._fire(spec, watermark)
        self._flush()
        return out

    def _fire(self, spec: WindowSpec, watermark: int) -> list[tuple[tuple, Emission]]:
        out = []
        for window in sorted(self.index.windows):
            entry = self.index.windows[window]
            if window[1] - 1 > watermark:
                continue
            if entry.deltas:
                out += self._fold(spec, window, watermark, [], [])
            elif window[1] - 1 + spec.lateness_ms <= watermark:
                self._drop(window)
        return out

    def _fold(self, spec: WindowSpec, window: tuple[int, int], watermark: int,
              added_keys: list, added: list) -> list[tuple[tuple, Emission]]:
        """A completed window read, fired, given ``added`` (KeyWindows' fire, add, fire) and
        written back or dropped."""
        entry = self.index.windows.get(window)
        if entry is not None and entry.fired is None and not added_keys:
            return self._first_firing(spec, window, watermark, entry)
        slots: dict[tuple, Slot] = {}
        if entry is not None:
            if entry.fired is not None:
                for key, acc in zip(*self._get(entry.fired, window)):
                    slots[key] = Slot(acc, emitted=True, pending=False)
            for chunk in entry.deltas:
                for key, acc in zip(*self._get(chunk, window)):
                    _add_slot(spec, slots, key, acc)
        out = _fire_slots(spec, window, slots, watermark)
        if window[1] - 1 + spec.lateness_ms <= watermark:
            slots = {}
        for key, acc in zip(added_keys, added):
            _add_slot(spec, slots, key, acc)
        out += _fire_slots(spec, window, slots, watermark)
        if window[1] - 1 + spec.lateness_ms <= watermark:
            slots = {}
        if entry is not None:
            self._drop(window)
        if slots:
            # Every slot is emitted and nothing is pending after a fire at a watermark past
            # the window's end.
            self._write_back(window, list(slots), [s.acc for s in slots.values()])
        return out

    def _first_firing(self, spec: WindowSpec, window: tuple[int, int], watermark: int,
                      entry: WindowEntry) -> list[tuple[tuple, Emission]]:
        """:meth:`_fold` of a window never fired, nothing added: every key's ``final``
        (the common case, without a slot per key)."""
        accs: dict[tuple, list] = {}
        for chunk in entry.deltas:
            for key, acc in zip(*self._get(chunk, window)):
                known = accs.get(key)
                accs[key] = acc if known is None else spec.merge(known, acc)
        self._drop(window)
        if window[1] - 1 + spec.lateness_ms > watermark:
            self._write_back(window, list(accs), list(accs.values()))
        return [(key, Emission(FINAL, *window, spec.results(acc))) for key, acc in accs.items()]

    def _get(self, chunk: int, window: tuple[int, int]) -> tuple[list, list]:
        data = self._read.get(chunk)
        if data is None:
            data = self._read[chunk] = self.store.get(chunk)
        return data[window] if isinstance(data, dict) else data   # else: one window's, as before

    def _put(self, windows: dict[tuple[int, int], tuple[list, list]]) -> int:
        chunk = self.index.next_chunk
        self.index.next_chunk += 1
        self.store.put(chunk, windows)
        return chunk

    def _write_back(self, window: tuple[int, int], keys: list, accs: list) -> None:
        """A fired window's slots into this call's write-back chunk (written by _flush)."""
        if self._new_id is None:
            self._new_id = self.index.next_chunk
            self.index.next_chunk += 1
            self._read[self._new_id] = self._new
        self._new[window] = (keys, accs)
        self.index.windows[window] = WindowEntry(self._new_id)

    def _flush(self) -> None:
        if self._new:
            self.store.put(self._new_id, self._new)

    def _drop(self, window: tuple[int, int]) -> None:
        entry = self.index.windows.pop(window)
        for chunk in ([] if entry.fired is None else [entry.fired]) + entry.deltas:
            if chunk == self._new_id:
                self._new.pop(window, None)
            elif not any(chunk == e.fired or chunk in e.deltas
                         for e in self.index.windows.values()):
                self.store.remove(chunk)
                self._read.pop(chunk, None)


def _add_slot(spec: WindowSpec, slots: dict, key: tuple, acc: list) -> None:
    slot = slots.get(key)
    if slot is None:
        slots[key] = Slot(list(acc))
    else:
        slot.acc = spec.merge(slot.acc, acc)
        slot.pending = True


def _fire_slots(spec: WindowSpec, window: tuple[int, int], slots: dict, watermark: int
                ) -> list[tuple[tuple, Emission]]:
    if window[1] - 1 > watermark:
        return []
    out = []
    for key, slot in slots.items():
        if slot.pending:
            out.append((key, Emission(UPDATE if slot.emitted else FINAL, *window,
                                      spec.results(slot.acc))))
            slot.emitted, slot.pending = True, False
    return out


def index_of_key_windows(spec: WindowSpec, keys: dict[tuple, dict], store: ChunkStore,
                         timer: int | None) -> WindowIndex:
    """A bucket stored the first way (every key's :class:`KeyWindows` slots in one value)
    moved into ``store``: how a checkpoint written before the window-by-window layout goes
    on."""
    index = WindowIndex(timer=timer)
    by_window: dict[tuple[int, int], tuple[dict, dict]] = {}
    for key, slots in keys.items():
        for window, slot in slots.items():
            fired, pending = by_window.setdefault(window, ({}, {}))
            if slot.emitted:
                fired[key] = slot.acc
                if slot.pending:   # emitted, then changed: the change as a zero partial
                    pending[key] = spec.zero()
            else:
                pending[key] = slot.acc
    bucket = BucketWindows(index, store)
    for window in sorted(by_window):
        fired, pending = by_window[window]
        entry = index.windows[window] = WindowEntry()
        if fired:
            entry.fired = bucket._put({window: (list(fired), list(fired.values()))})
        if pending:
            entry.deltas.append(bucket._put({window: (list(pending),
                                                      list(pending.values()))}))
    return index


def row_partials(spec: WindowSpec, rows: Rows) -> Partials:
    """One key's records as partials, per window and lateness (fixed windows): what
    :func:`combine` gives for columns Arrow cannot group (lists, maps, structs)."""
    starts, late, accs = [], [], []
    known = rows.times != NO_WATERMARK if len(rows) else np.zeros(0, dtype=bool)
    if (~known).any():
        starts.append(None)
        late.append(True)
        accs.append(spec.partial(rows.columns, rows.times, np.flatnonzero(~known)))
    for flag, start, members in fixed_window_groups(spec, rows, np.flatnonzero(known)):
        starts.append(int(start))
        late.append(flag)
        accs.append(spec.partial(rows.columns, rows.times, members))
    return Partials(starts, late, accs)


# -- a bucket of keys' sessions, stored key by key --------------------------------------------
#
# A session's window depends on its key's other sessions, so sessions are stored per key (a
# key's KeyWindows slots in a map state keyed by the key). What the timer needs is which keys
# have something due: the keys a micro-batch left with sessions go into "wake" chunks, grouped
# by when they next need firing (one chunk per gap-wide span of wake-up times), and the index
# keeps each chunk's earliest wake-up. A key names the chunk that last listed it (its home), so
# an older listing of it is skipped when its chunk is read.


@dataclass
class SessionIndex:
    """A bucket's wake chunks (chunk id -> earliest wake-up of its keys), the next chunk id
    and the bucket's event-time timer (None: none registered)."""

    wakes: dict[int, int] = field(default_factory=dict)
    next_chunk: int = 0
    timer: int | None = None

    def __reduce__(self):
        return (SessionIndex, (self.wakes, self.next_chunk, self.timer))

    def wake_up(self, watermark: int) -> int | None:
        return min((m for m in self.wakes.values() if m > watermark), default=None)


class KeyStore:
    """Where :class:`BucketSessions` keeps each key's slots and home chunk, and the wake
    chunks' key lists. Dicts here; the shell passes map states."""

    def __init__(self):
        self.keys: dict[tuple, tuple[dict, int]] = {}
        self.wakes: dict[int, list] = {}

    def get(self, key: tuple) -> tuple[dict, int] | None:
        return self.keys.get(key)

    def put(self, key: tuple, slots: dict, home: int) -> None:
        self.keys[key] = (slots, home)

    def remove(self, key: tuple) -> None:
        del self.keys[key]

    def get_wake(self, chunk: int) -> list:
        return self.wakes.pop(chunk)

    def put_wake(self, chunk: int, keys: list) -> None:
        self.wakes[chunk] = keys


class BucketSessions:
    """Session windows of a bucket of keys: each key's :class:`KeyWindows`, read and written
    only when the key has records in the micro-batch or something due at the watermark."""

    def __init__(self, index: SessionIndex, store: KeyStore):
        self.index = index
        self.store = store

    def apply(self, spec: WindowSpec, groups: Sequence[tuple[tuple, Rows]], watermark: int
              ) -> list[tuple[tuple, Emission]]:
        """:meth:`KeyWindows.apply` for each (key, rows) of the micro-batch, after firing what
        is due (the shell moves the bucket's timer past the watermark)."""
        out, kept = self.fire(spec, watermark), []
        for key, rows in groups:
            stored = self.store.get(key)
            windows = KeyWindows({} if stored is None else stored[0])
            out += [(key, e) for e in windows.apply(spec, rows, watermark)]
            kept.append((key, windows, stored is not None))
        self._home(spec, kept, watermark)
        return out

    def fire(self, spec: WindowSpec, watermark: int) -> list[tuple[tuple, Emission]]:
        """:meth:`KeyWindows.fire` for every key listed in a wake chunk that is due."""
        out, kept = [], []
        for chunk in sorted(c for c, m in self.index.wakes.items() if m <= watermark):
            del self.index.wakes[chunk]
            for key in self.store.get_wake(chunk):
                stored = self.store.get(key)
                if stored is None or stored[1] != chunk:
                    continue            # listed again since, or gone
                windows = KeyWindows(stored[0])
                out += [(key, e) for e in windows.fire(spec, watermark)]
                kept.append((key, windows, True))
        self._home(spec, kept, watermark)
        return out

    def _home(self, spec: WindowSpec, kept: list[tuple[tuple, KeyWindows, bool]],
              watermark: int) -> None:
        """Store the keys' windows (``kept``: key, windows, whether stored before) and list
        each key that has any in the wake chunk of its next wake-up's span."""
        span = spec.assigner.gap_ms
        chunks: dict[int, tuple[int, list]] = {}
        for key, windows, stored in kept:
            if not windows.slots:
                if stored:
                    self.store.remove(key)
                continue
            wake = min(m for m in windows.wake_ups(spec) if m > watermark)
            slot = chunks.get(wake // span)
            if slot is None:
                slot = chunks[wake // span] = (self.index.next_chunk, [])
                self.index.next_chunk += 1
                self.index.wakes[slot[0]] = wake
            else:
                self.index.wakes[slot[0]] = min(self.index.wakes[slot[0]], wake)
            slot[1].append(key)
            self.store.put(key, windows.slots, slot[0])
        for chunk, keys in chunks.values():
            self.store.put_wake(chunk, keys)


def index_of_key_sessions(spec: WindowSpec, keys: dict[tuple, dict], store: KeyStore,
                          timer: int | None) -> SessionIndex:
    """A bucket of sessions stored the first way (every key's slots in one value) moved into
    ``store``."""
    index = SessionIndex(timer=timer)
    BucketSessions(index, store)._home(
        spec, [(key, KeyWindows(slots), False) for key, slots in keys.items()], NO_WATERMARK)
    return index
