"""The pure window logic (DESIGN §10): assignment, session merging, accumulators and the
final / update / late decision of one key's windows, without Spark."""

from __future__ import annotations

import doctest
import math
import pickle

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kwatermark import windowing
from kwatermark.windowing import (
    FINAL,
    LATE,
    NO_WATERMARK,
    UPDATE,
    Agg,
    Emission,
    KeyWindows,
    Rows,
    Session,
    Sliding,
    Tumbling,
    WindowError,
    WindowSpec,
    merge_intervals,
)

COUNT = (Agg("n", "count", None),)


def windows_of(assigner, times) -> list[list[int]]:
    """Per time, the sorted window starts the assigner gives it."""
    rows, starts = assigner.assign(np.asarray(times, dtype=np.int64))
    return [sorted(int(s) for r, s in zip(rows, starts) if r == i) for i in range(len(times))]


def kinds(emissions: list[Emission]) -> list[tuple]:
    return [(e.kind, e.start, e.end, e.values) for e in emissions]


def test_the_module_example_runs():
    assert doctest.testmod(windowing).failed == 0


# -- assigners --------------------------------------------------------------------------------


def test_tumbling_assigns_each_time_to_the_window_that_contains_it():
    assert windows_of(Tumbling(10), [0, 9, 10, 19, 25]) == [[0], [0], [10], [10], [20]]


def test_tumbling_negative_times_round_down_not_toward_zero():
    assert windows_of(Tumbling(10), [-1, -10, -11]) == [[-10], [-10], [-20]]


def test_tumbling_offset_shifts_the_grid():
    assert windows_of(Tumbling(10, offset_ms=3), [2, 3, 12, 13, -8]) == [[-7], [3], [3], [13],
                                                                         [-17]]
    # An offset beyond the size is the same grid as offset mod size.
    assert windows_of(Tumbling(10, offset_ms=23), [2, 3]) == windows_of(Tumbling(10, 3), [2, 3])


def test_sliding_assigns_size_over_slide_windows_each_containing_the_time():
    assert windows_of(Sliding(30, 10), [0, 15, 29, -1]) == [
        [-20, -10, 0], [-10, 0, 10], [0, 10, 20], [-30, -20, -10]]
    for t, starts in zip([0, 15, 29, -1], windows_of(Sliding(30, 10), [0, 15, 29, -1])):
        assert all(s <= t < s + 30 for s in starts)


def test_sliding_with_offset_and_with_size_equal_to_slide():
    assert windows_of(Sliding(20, 10, offset_ms=5), [5, 4]) == [[-5, 5], [-15, -5]]
    assert windows_of(Sliding(10, 10), [3, 17]) == windows_of(Tumbling(10), [3, 17])


@pytest.mark.parametrize("build, words", [
    (lambda: Tumbling(0), "tumbling window size must be positive"),
    (lambda: Tumbling(-5), "got -5 ms"),
    (lambda: Sliding(30, 0), "size and slide must be positive"),
    (lambda: Sliding(0, 10), "size and slide must be positive"),
    (lambda: Sliding(25, 10), "(25 ms) must be a multiple of its slide (10 ms)"),
    (lambda: Session(0), "session gap must be positive"),
    (lambda: Agg("x", "median", "v"), "'x': unknown function 'median'"),
    (lambda: Agg("x", "sum", None), "'x': sum needs a column"),
    (lambda: WindowSpec(Tumbling(10), COUNT, lateness_ms=-1), "must not be negative"),
    (lambda: WindowSpec(Tumbling(10), COUNT + COUNT), "names must be unique"),
])
def test_bad_definitions_fail_saying_what_is_wrong(build, words):
    with pytest.raises(WindowError) as info:
        build()
    assert words in str(info.value)


# -- merge_intervals --------------------------------------------------------------------------


def test_merge_intervals_joins_touching_and_overlapping_intervals_transitively():
    intervals = [(20, 30), (0, 10), (10, 15), (40, 50), (28, 35), (36, 40)]
    assert merge_intervals(intervals) == [([1, 2], 0, 15), ([0, 4], 20, 35), ([5, 3], 36, 50)]


def test_merge_intervals_keeps_apart_what_does_not_touch_and_handles_nesting():
    assert merge_intervals([(0, 10), (11, 20)]) == [([0], 0, 10), ([1], 11, 20)]
    assert merge_intervals([(0, 100), (10, 20), (50, 60)]) == [([0, 1, 2], 0, 100)]
    assert merge_intervals([]) == []


# -- accumulators -----------------------------------------------------------------------------


def aggregate(function: str, values, times=None):
    """One function over one group, built from two partials merged (as state does)."""
    agg = Agg("a", function, None if function == "count" and values is None else "v")
    values = None if values is None else np.asarray(values)
    times = np.arange(len(values)) if times is None else np.asarray(times)
    half = len(times) // 2
    parts = [agg.partial(None if values is None else values[sl], times[sl])
             for sl in (slice(0, half), slice(half, None))]
    return agg.result(agg.merge(agg.merge(agg.zero(), parts[0]), parts[1]))


@pytest.mark.parametrize("values", [
    [3.0, float("nan"), 5.0, 1.0],           # float column, NaN = null
    np.asarray([3, None, 5, 1], dtype=object),  # object column, None = null
    np.asarray([3, float("nan"), 5, None, 1], dtype=object),
])
def test_each_function_skips_nulls(values):
    assert aggregate("count", values) == 3
    assert aggregate("sum", values) == 9
    assert aggregate("min", values) == 1
    assert aggregate("max", values) == 5
    assert aggregate("avg", values) == 3.0


def test_count_of_rows_counts_nulls_too():
    assert aggregate("count", None, times=[1, 2, 3]) == 3


def test_integer_column_sum_avg_min_max():
    values = [4, -2, 7, 1]
    assert aggregate("sum", values) == 10 and isinstance(aggregate("sum", values), int)
    assert aggregate("avg", values) == 2.5
    assert (aggregate("min", values), aggregate("max", values)) == (-2, 7)


@pytest.mark.parametrize("function", ["sum", "min", "max", "avg", "first", "last"])
def test_all_null_or_empty_groups_give_null(function):
    assert aggregate(function, [float("nan"), float("nan")]) is None
    assert aggregate(function, np.asarray([None], dtype=object)) is None
    assert aggregate(function, np.asarray([], dtype=float)) is None


def test_count_of_an_all_null_column_is_zero():
    assert aggregate("count", [float("nan")]) == 0


def test_first_and_last_are_by_event_time_not_arrival():
    values, times = ["c", "a", "d", "b"], [30, 10, 40, 20]
    assert aggregate("first", values, times) == "a"
    assert aggregate("last", values, times) == "d"
    # Across partials too: the later partial holds the earlier time.
    assert aggregate("first", ["late", "early"], [50, 5]) == "early"
    assert aggregate("last", ["late", "early"], [50, 5]) == "late"


def test_first_and_last_skip_nulls():
    values = np.asarray([None, "b", "c", None], dtype=object)
    assert aggregate("first", values, [1, 2, 3, 4]) == "b"
    assert aggregate("last", values, [1, 2, 3, 4]) == "c"


def test_first_and_last_ties_keep_arrival_order():
    assert aggregate("first", ["x", "y", "z"], [7, 7, 7]) == "x"
    assert aggregate("last", ["x", "y", "z"], [7, 7, 7]) == "z"


def test_avg_of_integers_is_a_float():
    assert aggregate("avg", [1, 2]) == 1.5
    assert math.isclose(aggregate("avg", [0.1, 0.2, 0.3]), 0.2)


# -- the final / update / late decision --------------------------------------------------------


SUM_SPEC = (Agg("n", "count", None), Agg("total", "sum", "v"))


def spec(assigner=None, lateness=0, aggs=SUM_SPEC) -> WindowSpec:
    return WindowSpec(assigner or Tumbling(10), aggs, lateness_ms=lateness)


def rows(times, marks, values=None) -> Rows:
    return Rows.of(times, marks, {"v": values if values is not None else [1] * len(times)})


def test_on_time_rows_come_out_final_once_the_watermark_reaches_end_minus_one():
    s, state = spec(), KeyWindows()
    assert state.apply(s, rows([1, 5, 12], [None, 0, 3], [1, 2, 4]), NO_WATERMARK) == []
    assert state.fire(s, 8) == []                     # 9 not reached yet
    assert kinds(state.fire(s, 9)) == [(FINAL, 0, 10, [2, 3])]
    assert state.fire(s, 9) == []                     # only once
    assert list(state.slots) == [(10, 20)]            # purged: no lateness
    assert kinds(state.fire(s, 100)) == [(FINAL, 10, 20, [1, 4])]
    assert state.slots == {}


def test_without_lateness_a_row_whose_watermark_reached_end_minus_one_is_late():
    s, state = spec(), KeyWindows()
    state.apply(s, rows([1], [None], [10]), NO_WATERMARK)
    # Batch 2, Spark's watermark 9: the window comes out final, then the batch's own rows:
    # one late (w=9 >= end-1), one on time for the next window.
    out = state.apply(s, rows([2, 3, 15], [9, 9, 9], [100, 200, 7]), 9)
    assert kinds(out) == [(FINAL, 0, 10, [1, 10]), (LATE, 0, 10, [2, 300])]
    # Late rows are never accumulated.
    assert kinds(state.fire(s, 19)) == [(FINAL, 10, 20, [1, 7])]


def test_a_row_with_watermark_just_below_end_minus_one_is_on_time():
    s, state = spec(), KeyWindows()
    assert state.apply(s, rows([9], [8]), 8) == []
    assert kinds(state.fire(s, 9)) == [(FINAL, 0, 10, [1, 1])]


def test_late_rows_are_aggregated_per_window_and_batch():
    s, state = spec(), KeyWindows()
    out = state.apply(s, rows([1, 2, 11, 25], [40, 40, 40, 40], [1, 2, 3, 4]), 40)
    assert sorted(kinds(out)) == [(LATE, 0, 10, [2, 3]), (LATE, 10, 20, [1, 3]),
                                  (LATE, 20, 30, [1, 4])]
    assert state.slots == {}


def test_allowed_lateness_accumulates_and_reemits_updates_then_purges():
    s, state = spec(lateness=5), KeyWindows()
    state.apply(s, rows([1], [None], [1]), NO_WATERMARK)
    assert kinds(state.fire(s, 9)) == [(FINAL, 0, 10, [1, 1])]
    assert (0, 10) in state.slots                                     # kept for lateness
    # w in [end-1, end-1+L) = [9, 14): accumulated, re-emitted as an update in the same batch.
    assert kinds(state.apply(s, rows([3], [9], [10]), 9)) == [(UPDATE, 0, 10, [2, 11])]
    assert kinds(state.apply(s, rows([4, 5], [13, 13], [100, 1000]), 13)) == [
        (UPDATE, 0, 10, [4, 1111])]
    # A batch with nothing new for the window: no re-emission.
    assert state.fire(s, 13) == []
    # w = end-1+L: late; the window is purged at that watermark.
    assert kinds(state.apply(s, rows([6], [14], [5]), 14)) == [(LATE, 0, 10, [1, 5])]
    assert state.slots == {}


def test_with_lateness_a_window_first_seen_after_completion_comes_out_final():
    s, state = spec(lateness=5), KeyWindows()
    # The window [0, 10) is complete (watermark 9) but has never had a row; this one is late
    # but allowed: the window's first emission is a final, in the same batch.
    assert kinds(state.apply(s, rows([2], [10], [3]), 9)) == [(FINAL, 0, 10, [1, 3])]
    assert kinds(state.apply(s, rows([2], [11], [3]), 11)) == [(UPDATE, 0, 10, [2, 6])]


def test_final_in_a_batch_comes_before_the_batchs_own_rows_for_that_window():
    s, state = spec(lateness=10), KeyWindows()
    state.apply(s, rows([1], [None], [1]), NO_WATERMARK)
    out = state.apply(s, rows([2], [12], [2]), 12)
    assert kinds(out) == [(FINAL, 0, 10, [1, 1]), (UPDATE, 0, 10, [2, 3])]


def test_rows_without_event_time_come_out_late_with_no_window():
    s, state = spec(), KeyWindows()
    out = state.apply(s, rows([NO_WATERMARK, 4, NO_WATERMARK], [None, None, None], [1, 2, 3]),
                      NO_WATERMARK)
    assert kinds(out) == [(LATE, None, None, [2, 4])]
    assert kinds(state.fire(s, 9)) == [(FINAL, 0, 10, [1, 2])]


def test_sliding_rows_count_in_every_window_they_fall_in():
    s, state = spec(Sliding(20, 10)), KeyWindows()
    state.apply(s, rows([5, 15], [None, None], [1, 2]), NO_WATERMARK)
    assert kinds(state.fire(s, 19)) == [(FINAL, -10, 10, [1, 1]), (FINAL, 0, 20, [2, 3])]
    # A row late for [0, 20)'s neighbour but on time for [10, 30).
    out = state.apply(s, rows([12], [19], [4]), 19)
    assert kinds(out) == [(LATE, 0, 20, [1, 4])]
    assert kinds(state.fire(s, 29)) == [(FINAL, 10, 30, [2, 6])]


def test_fire_purges_only_past_lateness_and_keeps_incomplete_windows():
    s, state = spec(lateness=3), KeyWindows()
    state.apply(s, rows([1, 11, 21], [None] * 3), NO_WATERMARK)
    state.fire(s, 19)
    assert sorted(state.slots) == [(10, 20), (20, 30)]       # (0, 10): 9 + 3 <= 19
    state.fire(s, 21)
    assert sorted(state.slots) == [(10, 20), (20, 30)]       # 19 + 3 = 22 > 21
    state.fire(s, 22)
    assert sorted(state.slots) == [(20, 30)]


def test_wake_ups_are_completions_and_ends_of_lateness():
    state = KeyWindows()
    state.apply(spec(), rows([1, 11], [None, None]), NO_WATERMARK)
    assert state.wake_ups(spec()) == {9, 19}
    assert state.wake_ups(spec(lateness=4)) == {9, 13, 19, 23}
    assert KeyWindows().wake_ups(spec()) == set()


def test_state_survives_pickling_as_the_shell_stores_it():
    import pickle

    s, state = spec(lateness=2), KeyWindows()
    state.apply(s, rows([1, 2], [None, None], [1.5, float("nan")]), NO_WATERMARK)
    restored = pickle.loads(pickle.dumps(state))
    assert kinds(restored.fire(s, 9)) == kinds(state.fire(s, 9)) == [(FINAL, 0, 10, [2, 1.5])]


# -- sessions ---------------------------------------------------------------------------------


def test_session_rows_closer_than_the_gap_share_a_window():
    s, state = spec(Session(10)), KeyWindows()
    state.apply(s, rows([0, 5, 14, 30], [None] * 4, [1, 2, 3, 4]), NO_WATERMARK)
    assert sorted(state.slots) == [(0, 24), (30, 40)]
    assert kinds(state.fire(s, 100)) == [(FINAL, 0, 24, [3, 6]), (FINAL, 30, 40, [1, 4])]


def test_sessions_that_touch_merge():
    s, state = spec(Session(10)), KeyWindows()
    state.apply(s, rows([0, 10], [None] * 2), NO_WATERMARK)          # [0,10) touches [10,20)
    assert sorted(state.slots) == [(0, 20)]


def test_a_record_bridging_two_sessions_merges_all_three():
    s, state = spec(Session(10)), KeyWindows()
    state.apply(s, rows([0, 30], [None] * 2, [1, 2]), NO_WATERMARK)
    assert sorted(state.slots) == [(0, 10), (30, 40)]
    state.apply(s, rows([15], [None], [4]), NO_WATERMARK)           # [15,25) touches neither
    assert sorted(state.slots) == [(0, 10), (15, 25), (30, 40)]
    state.apply(s, rows([8, 22], [None] * 2, [8, 16]), NO_WATERMARK)  # [8,18) and [22,32)
    assert sorted(state.slots) == [(0, 40)]
    assert kinds(state.fire(s, 39)) == [(FINAL, 0, 40, [5, 31])]


def test_a_session_emitted_with_lateness_merges_and_comes_out_as_an_update():
    s, state = spec(Session(10), lateness=20), KeyWindows()
    state.apply(s, rows([0], [None], [1]), NO_WATERMARK)
    assert kinds(state.fire(s, 9)) == [(FINAL, 0, 10, [1, 1])]
    # t=-3 merges into [-3, 10), already complete: re-emitted at once. The update names the
    # merged window, not the one the final named: a sink keys session updates by its start.
    out = state.apply(s, rows([-3], [12], [2]), 12)                  # w=12 < 9 + 20
    assert kinds(out) == [(UPDATE, -3, 10, [2, 3])]
    # t=5 extends it to [-3, 15), not complete at 12: the update waits for watermark 14.
    assert state.apply(s, rows([5], [12], [4]), 12) == []
    assert kinds(state.fire(s, 14)) == [(UPDATE, -3, 15, [3, 7])]


def test_a_late_record_that_would_have_merged_into_a_purged_session_is_late_alone():
    s, state = spec(Session(10)), KeyWindows()
    state.apply(s, rows([0, 5], [None] * 2, [1, 2]), NO_WATERMARK)
    assert kinds(state.fire(s, 14)) == [(FINAL, 0, 15, [2, 3])]
    assert state.slots == {}
    # t=3 would have merged into [0, 15); that session is gone, its own [3, 13) is late.
    # Late records that touch come out as one late session; t=8's own [8, 18) is on time.
    out = state.apply(s, rows([3, 4, 8, 40], [14, 14, 14, 14], [4, 8, 16, 32]), 14)
    assert kinds(out) == [(LATE, 3, 14, [2, 12])]
    assert sorted(state.slots) == [(8, 18), (40, 50)]


def test_a_record_late_alone_but_merging_into_a_live_session_is_judged_by_the_merged_window():
    s, state = spec(Session(10)), KeyWindows()
    state.apply(s, rows([12], [None], [1]), NO_WATERMARK)
    # [3, 13) alone would be late at w=12, but it merges into [12, 22), which is not.
    assert state.apply(s, rows([3], [12], [2]), 12) == []
    assert kinds(state.fire(s, 21)) == [(FINAL, 3, 22, [2, 3])]


def test_session_rows_without_event_time_are_late_with_no_window():
    s, state = spec(Session(10)), KeyWindows()
    out = state.apply(s, rows([NO_WATERMARK, 1], [None, None], [5, 1]), NO_WATERMARK)
    assert kinds(out) == [(LATE, None, None, [1, 5])]
    assert sorted(state.slots) == [(1, 11)]


def test_a_record_at_a_fired_sessions_end_starts_a_new_session_as_in_flink():
    # [0, 10) is complete at watermark 9 and, without lateness, purged. A record at t=10 with
    # watermark 9 is on time for its own [10, 20), and would have touched [0, 10): like Flink
    # (the merged state is gone), it starts a new session rather than extending the old one.
    s, state = spec(Session(10)), KeyWindows()
    state.apply(s, rows([0], [None], [1]), NO_WATERMARK)
    assert kinds(state.fire(s, 9)) == [(FINAL, 0, 10, [1, 1])]
    assert state.apply(s, rows([10], [9], [2]), 9) == []
    assert kinds(state.fire(s, 19)) == [(FINAL, 10, 20, [1, 2])]


# -- property: KeyWindows driven as the processor drives it, against a brute-force oracle --------
#
# A stream is a list of micro-batches of rows (event time t, row watermark w, value v). Row
# watermarks never decrease across batches (every one in batch b+1 >= every one in batch b), as
# the source guarantees; within a batch they are arbitrary but >= Spark's watermark at the batch
# start, S_b = the highest row watermark of the batches before b. None = undefined watermark.

ORACLE_AGGS = (Agg("n", "count", None), Agg("sum", "sum", "v"), Agg("min", "min", "v"),
               Agg("max", "max", "v"))


def below(w, bound) -> bool:
    """``bound <= w`` with None (undefined) below everything."""
    return w is not None and bound <= w


@st.composite
def streams(draw, step=20, watermark_cap=None):
    """Batches of (t, w, v). ``watermark_cap(b, batches)`` bounds the row watermarks of batch b
    from above (None: no bound)."""
    batch_times = draw(st.lists(st.lists(st.integers(-30, 60), max_size=8), min_size=1,
                                max_size=6))
    batches, level = [], None           # level: Spark's watermark at the batch start
    for b, ts in enumerate(batch_times):
        cap = None if watermark_cap is None else watermark_cap(b, batch_times)
        rows_ = []
        for t in ts:
            if level is None and (cap is None or draw(st.booleans())) and draw(st.booleans()):
                w = None
            else:
                # Near the row's own event time, as a watermark usually is, but never below
                # the batch start nor above the cap.
                lo = level if level is not None else -40 if cap is None else cap - step
                w = max(lo, t + draw(st.integers(-step, step // 2)))
                w = w if cap is None else max(lo, min(w, cap))
            rows_.append((t, w, draw(st.integers(-5, 5))))
        batches.append(rows_)
        marks = [w for _, w, _ in rows_ if w is not None]
        if marks:
            level = max(marks) if level is None else max(level, *marks)
    return batches


def watermarks_at_batch_starts(batches) -> list:
    """S_b for every batch and for the closing no-data batch."""
    out, level = [], None
    for batch in batches + [[]]:
        out.append(level)
        marks = [w for _, w, _ in batch if w is not None]
        if marks:
            level = max(marks) if level is None else max(level, *marks)
    return out


def drive(spec_, batches, flush=None, feed=None) -> list[list[tuple]]:
    """The processor's calls: per batch ``apply`` (or ``feed(state, b, batch, s)``) then the
    timer phase's ``fire``, then one no-data batch at the highest row watermark (and, if
    given, one more at ``flush``)."""
    state, out = KeyWindows(), []
    marks = watermarks_at_batch_starts(batches)
    for b, (batch, mark) in enumerate(zip(batches, marks)):
        s = NO_WATERMARK if mark is None else mark
        emitted = []
        if batch and feed is not None:
            emitted += feed(state, b, batch, s)
        elif batch:
            emitted += state.apply(spec_, Rows.of([t for t, _, _ in batch],
                                                  [w for _, w, _ in batch],
                                                  {"v": [v for _, _, v in batch]}), s)
        emitted += state.fire(spec_, s)
        out.append(emitted)
    out.append(state.fire(spec_, NO_WATERMARK if marks[-1] is None else marks[-1]))
    if flush is not None:
        out.append(state.fire(spec_, flush))
    # (kind, start, end) is unique in a batch; a late row without event time has no start.
    return [sorted(((e.kind, e.start, e.end, tuple(e.values)) for e in batch),
                   key=lambda x: (x[0], x[1] is not None, x[1] or 0)) for batch in out]


def summary(values: list[int]) -> tuple:
    return (len(values), sum(values), min(values), max(values)) if values else \
        (0, None, None, None)


def fixed_windows(t: int, size: int, slide: int, offset: int) -> list[tuple[int, int]]:
    """By definition: every [s, s+size) with s = offset (mod slide) that contains t."""
    return [(s, s + size) for s in range(t - size + 1, t + 1) if (s - offset) % slide == 0]


def oracle_fixed(batches, size, slide, offset, lateness) -> list[list[tuple]]:
    marks = watermarks_at_batch_starts(batches)
    rows_by_window: dict[tuple[int, int], list[tuple[int, object, int]]] = {}
    for b, batch in enumerate(batches):
        for t, w, v in batch:
            for window in fixed_windows(t, size, slide, offset):
                rows_by_window.setdefault(window, []).append((b, w, v))
    out = [[] for _ in marks]
    for (start, end), members in rows_by_window.items():
        late = [(b, v) for b, w, v in members if below(w, end - 1 + lateness)]
        kept = [(b, v) for b, w, v in members if not below(w, end - 1 + lateness)]
        for b in sorted({b for b, _ in late}):
            out[b].append((LATE, start, end, summary([v for c, v in late if c == b])))
        complete = [b for b, mark in enumerate(marks) if below(mark, end - 1)]
        if not complete or not kept:
            continue
        # The first emission: at completion, of what came before; or, if nothing had, in the
        # first later batch with a row still accepted (allowed lateness), of what came so far.
        first = complete[0]
        if not any(b < first for b, _ in kept):
            first = min(b for b, _ in kept if b >= first)
            out[first].append((FINAL, start, end, summary([v for b, v in kept if b <= first])))
        else:
            out[first].append((FINAL, start, end, summary([v for b, v in kept if b < first])))
            if any(b == first for b, _ in kept):
                out[first].append((UPDATE, start, end,
                                   summary([v for b, v in kept if b <= first])))
        for later in sorted({b for b, _ in kept if b > first}):
            out[later].append((UPDATE, start, end, summary([v for b, v in kept if b <= later])))
    return [sorted(batch) for batch in out]


fixed_assigners = st.one_of(
    st.builds(lambda size, offset: (size, size, offset % size),
              st.integers(1, 20), st.integers(0, 40)),
    st.builds(lambda slide, k, offset: (slide * k, slide, offset % slide),
              st.integers(1, 10), st.integers(1, 4), st.integers(0, 40)))


@settings(max_examples=200, deadline=None)
@given(streams(), fixed_assigners, st.sampled_from([0, 0, 1, 5, 17, 40]))
def test_fixed_windows_match_the_brute_force_oracle(batches, geometry, lateness):
    size, slide, offset = geometry
    assigner = Tumbling(size, offset) if size == slide else Sliding(size, slide, offset)
    got = drive(WindowSpec(assigner, ORACLE_AGGS, lateness), batches)
    assert got == oracle_fixed(batches, size, slide, offset, lateness)

    # For count and sum: last final/update + every late row = the truth, for every window
    # complete by the end.
    end_mark = watermarks_at_batch_starts(batches)[-1]
    truth: dict[tuple[int, int], list[int]] = {}
    for batch in batches:
        for t, _, v in batch:
            for window in fixed_windows(t, size, slide, offset):
                truth.setdefault(window, []).append(v)
    last, late = {}, {}
    for batch in got:
        for kind, start, end, (n, total, _, _) in batch:
            if kind == LATE:
                late[start, end] = tuple(map(sum, zip(late.get((start, end), (0, 0)),
                                                      (n, total))))
            else:
                last[start, end] = (n, total or 0)
    for window, values in truth.items():
        if below(end_mark, window[1] - 1):
            n, total = last.get(window, (0, 0))
            late_n, late_total = late.get(window, (0, 0))
            assert (n + late_n, total + late_total) == (len(values), sum(values)), window


def offline_sessions(times_values, gap) -> list[tuple]:
    """Sessionize all rows at once: sorted by time, a row joins the running session when its
    [t, t+gap) touches it."""
    sessions = []
    for t, v in sorted(times_values):
        if sessions and t <= sessions[-1][1]:
            start, end, values = sessions[-1]
            sessions[-1] = (start, max(end, t + gap), values + [v])
        else:
            sessions.append((t, t + gap, [v]))
    return sorted((FINAL, s, e, summary(vs)) for s, e, vs in sessions)


def never_late_cap(b, batch_times):
    """A row watermark at most every later event time - 2: no row is late, and no row can
    touch (t = end) a session that a watermark of end - 1 already completed."""
    later = [t for ts in batch_times[b:] for t in ts]
    return min(later) - 2 if later else None


FLUSH = 10**9


@settings(max_examples=200, deadline=None)
@given(st.data(), st.integers(1, 15))
def test_sessions_without_late_rows_equal_offline_sessionization(data, gap):
    batches = data.draw(streams(watermark_cap=never_late_cap))
    got = [e for batch in drive(WindowSpec(Session(gap), ORACLE_AGGS), batches, flush=FLUSH)
           for e in batch]
    everything = [(t, v) for batch in batches for t, _, v in batch]
    assert sorted(got) == offline_sessions(everything, gap)


@settings(max_examples=200, deadline=None)
@given(streams(), st.integers(1, 15))
def test_sessions_conserve_every_row_as_final_or_late(batches, gap):
    got = [e for batch in drive(WindowSpec(Session(gap), ORACLE_AGGS), batches, flush=FLUSH)
           for e in batch]
    # Without lateness a session is forgotten as it comes out, so nothing is ever updated.
    assert {kind for kind, *_ in got} <= {FINAL, LATE}
    rows_ = [v for batch in batches for _, _, v in batch]
    assert sum(n for *_, (n, _, _, _) in got) == len(rows_)
    assert sum(total or 0 for *_, (_, total, _, _) in got) == sum(rows_)


# -- combining before the shuffle: combine + apply_partials == apply ---------------------------

ALL_AGGS = (Agg("rows", "count", None), Agg("n", "count", "v"), Agg("sum", "sum", "v"),
            Agg("min", "min", "v"), Agg("max", "max", "v"), Agg("avg", "avg", "v"),
            Agg("first", "first", "u"), Agg("last", "last", "u"))


def table_of(rows_) -> pa.Table:
    """A task's rows (t, w, v) as the shell hands them to combine; ``u`` is a function of the
    time, so that first/last agree whichever of two rows at the same time is taken."""
    return pa.table({
        "key": pa.array([0] * len(rows_), pa.int64()),
        "t": pa.array([t for t, _, _ in rows_], pa.int64()),
        "w": pa.array([w for _, w, _ in rows_], pa.int64()),
        "v": pa.array([v for _, _, v in rows_], pa.int64()),
        "u": pa.array([None if v is None or t is None else (t * 7) % 11 for t, _, v in rows_],
                      pa.int64())})


def combined_feed(spec_, splits):
    """Each batch's rows cut into two tasks at ``splits[b]``, each task's rows combined on
    their own, and the stateful step fed the partials (in either order)."""
    def feed(state, b, batch, s):
        tasks = [batch[:splits[b]], batch[splits[b]:]]
        combined = pa.concat_tables([windowing.combine(spec_, table_of(task), ["key"], "t", "w")
                                     for task in tasks[::-1] if task])
        columns = {name: combined.column(name).to_pylist() for name in combined.column_names}
        return state.apply_partials(spec_, windowing.partials(
            spec_, columns[windowing.START], columns[windowing.IS_LATE], columns), s)
    return feed


def raw_feed(spec_):
    """The records as they are, with null times and values (``apply``)."""
    def feed(state, b, batch, s):
        return state.apply(spec_, Rows(
            np.asarray([NO_WATERMARK if t is None else t for t, _, _ in batch], np.int64),
            np.asarray([NO_WATERMARK if w is None else w for _, w, _ in batch], np.int64),
            {"v": np.asarray([np.nan if v is None else v for _, _, v in batch]),
             "u": np.asarray(table_of(batch).column("u").to_pylist(), dtype=object)}), s)
    return feed


@settings(max_examples=200, deadline=None)
@given(st.data(), streams(), fixed_assigners, st.sampled_from([0, 0, 1, 5, 17, 40]))
def test_rows_combined_per_task_give_what_the_rows_give(data, batches, geometry, lateness):
    size, slide, offset = geometry
    assigner = Tumbling(size, offset) if size == slide else Sliding(size, slide, offset)
    spec_ = WindowSpec(assigner, ALL_AGGS, lateness)
    # Some values null, some records without event time (late, no window).
    batches = [[(None if data.draw(st.integers(0, 9)) == 0 else t, w,
                 None if data.draw(st.integers(0, 5)) == 0 else v) for t, w, v in batch]
               for batch in batches]
    splits = [data.draw(st.integers(0, len(batch))) for batch in batches]
    assert drive(spec_, batches, feed=combined_feed(spec_, splits)) == \
        drive(spec_, batches, feed=raw_feed(spec_))


def test_combine_refuses_sessions():
    with pytest.raises(WindowError, match="session"):
        windowing.combine(WindowSpec(Session(5), COUNT), table_of([(1, 0, 1)]), ["key"], "t",
                          "w")


# -- a bucket of keys stored window by window: BucketWindows == one KeyWindows per key ---------


def keyed(batches, keys):
    """Each row of ``batches`` given a key from ``keys`` (one per row, in order)."""
    it = iter(keys)
    return [[(next(it), t, w, v) for t, w, v in batch] for batch in batches]


def per_key_drive(spec_, batches, flush):
    """What one KeyWindows per key emits, per batch and key, in order."""
    states, out = {}, []
    marks = watermarks_at_batch_starts([[(t, w, v) for _, t, w, v in b] for b in batches])
    for batch, mark in zip(batches + [[]], marks):
        s = NO_WATERMARK if mark is None else mark
        emitted = []
        for key in sorted({k for k, *_ in batch}):
            rows_ = [r for r in batch if r[0] == key]
            state = states.setdefault(key, KeyWindows())
            emitted += [(key, e) for e in state.apply(spec_, raw_rows(rows_), s)]
        for key, state in sorted(states.items()):
            emitted += [(key, e) for e in state.fire(spec_, s)]
        out.append(emitted)
    out.append([(k, e) for k, state in sorted(states.items()) for e in state.fire(spec_, flush)])
    return out


def raw_rows(rows_) -> Rows:
    return Rows(np.asarray([NO_WATERMARK if t is None else t for _, t, _, _ in rows_], np.int64),
                np.asarray([NO_WATERMARK if w is None else w for _, _, w, _ in rows_], np.int64),
                {"v": np.asarray([np.nan if v is None else v for *_, v in rows_])})


def bucket_drive(spec_, batches, flush, store, layout_2_after=None):
    """The processor's calls on one bucket: the batch's partials (from row_partials, per key,
    keys interleaved), then the timer phase; the index and chunks pickled between calls as
    the shell stores them. ``layout_2_after``: after that many batches, the state rewritten
    as the first chunked layout stored it (a checkpoint of that version going on)."""
    index, out = windowing.WindowIndex(), []
    marks = watermarks_at_batch_starts([[(t, w, v) for _, t, w, v in b] for b in batches])
    for n, (batch, mark) in enumerate(zip(batches + [[]], marks)):
        if n == layout_2_after:
            as_layout_2(index, store)
        s = NO_WATERMARK if mark is None else mark
        emitted = []
        if batch:
            keys, starts, late, accs = [], [], [], []
            for key in sorted({k for k, *_ in batch}, reverse=True):
                p = windowing.row_partials(spec_, raw_rows([r for r in batch if r[0] == key]))
                keys += [key] * len(p.starts)
                starts += p.starts
                late += p.late
                accs += p.accs
            bucket = windowing.BucketWindows(pickle.loads(pickle.dumps(index)), store)
            emitted += bucket.apply_partials(spec_, keys, windowing.Partials(starts, late, accs),
                                             s)
            index = bucket.index
            assert (index.wake_up(spec_, NO_WATERMARK) or math.inf) > s   # nothing left due
        # Spark's timer phase: the bucket's timer is at its first wake-up, less 1 ms.
        wake = index.wake_up(spec_, NO_WATERMARK)
        if wake is not None and wake <= s:
            bucket = windowing.BucketWindows(pickle.loads(pickle.dumps(index)), store)
            emitted += bucket.fire(spec_, s)
            index = bucket.index
        out.append(emitted)
    out.append(windowing.BucketWindows(index, store).fire(spec_, flush))
    return out, index


def as_layout_2(index, store):
    """``index`` and ``store`` rewritten as the first chunked layout stored them: every chunk
    one window's ``(keys, accs)``."""
    old = dict(store.chunks)
    store.chunks.clear()
    for window, entry in index.windows.items():
        moved = []
        for chunk in ([] if entry.fired is None else [entry.fired]) + entry.deltas:
            store.chunks[index.next_chunk] = old[chunk][window]
            moved.append(index.next_chunk)
            index.next_chunk += 1
        if entry.fired is not None:
            entry.fired = moved.pop(0)
        entry.deltas = moved


def by_key(out):
    """Per batch, per key: the emissions in order; per (key, window) the order is what a
    sink applies, across keys it does not matter."""
    return [{k: [(e.kind, e.start, e.end, tuple(e.values)) for kk, e in batch if kk == k]
             for k in {kk for kk, _ in batch}} for batch in out]


@settings(max_examples=300, deadline=None)
@given(st.data(), streams(), fixed_assigners, st.sampled_from([0, 0, 1, 5, 17, 40]))
def test_a_bucket_stored_window_by_window_emits_what_each_keys_windows_emit(
        data, batches, geometry, lateness):
    size, slide, offset = geometry
    assigner = Tumbling(size, offset) if size == slide else Sliding(size, slide, offset)
    spec_ = WindowSpec(assigner, ALL_AGGS[:6], lateness)
    batches = [[(None if data.draw(st.integers(0, 9)) == 0 else t, w, v) for t, w, v in batch]
               for batch in batches]
    rows_ = keyed(batches, data.draw(st.lists(st.sampled_from(["a", "b", "c"]),
                                              min_size=sum(map(len, batches)),
                                              max_size=sum(map(len, batches)))))
    flush = 1_000
    store = windowing.ChunkStore()
    got, index = bucket_drive(spec_, rows_, flush, store)
    assert by_key(got) == by_key(per_key_drive(spec_, rows_, flush))
    assert not index.windows and not store.chunks      # everything released at the end


@settings(max_examples=200, deadline=None)
@given(st.data(), streams(), fixed_assigners, st.sampled_from([0, 1, 5, 40]))
def test_a_bucket_of_one_window_chunks_goes_on_as_if_never_rewritten(data, batches, geometry,
                                                                     lateness):
    """A checkpoint whose chunks hold one window each (before windows shared chunks) is read
    as it is, and its chunks are released."""
    size, slide, offset = geometry
    assigner = Tumbling(size, offset) if size == slide else Sliding(size, slide, offset)
    spec_ = WindowSpec(assigner, ALL_AGGS[:6], lateness)
    rows_ = keyed(batches, data.draw(st.lists(st.sampled_from(["a", "b", "c"]),
                                              min_size=sum(map(len, batches)),
                                              max_size=sum(map(len, batches)))))
    store = windowing.ChunkStore()
    got, index = bucket_drive(spec_, rows_, 1_000, store,
                              layout_2_after=data.draw(st.integers(0, len(rows_))))
    assert by_key(got) == by_key(per_key_drive(spec_, rows_, 1_000))
    assert not index.windows and not store.chunks


def test_windows_given_partials_in_one_call_share_a_chunk():
    """One state-store write for a batch's windows (up to WINDOWS_PER_CHUNK), and the chunk
    is removed with its last window."""
    spec_ = WindowSpec(Tumbling(10), COUNT, 0)
    store = windowing.ChunkStore()
    bucket = windowing.BucketWindows(windowing.WindowIndex(), store)
    starts = [0, 10, 20, 30, 0]
    assert bucket.apply_partials(spec_, [("a",)] * 4 + [("b",)],
                                 windowing.Partials(starts, [False] * 5, [[1]] * 5),
                                 watermark=-1) == []
    assert len(store.chunks) == 1
    first = windowing.BucketWindows(bucket.index, store).fire(spec_, 19)
    assert [(k, e.start, e.values) for k, e in first] == [(("a",), 0, [1]), (("b",), 0, [1]),
                                                          (("a",), 10, [1])]
    assert len(store.chunks) == 1                       # windows 20 and 30 still in it
    rest = windowing.BucketWindows(bucket.index, store).fire(spec_, 39)
    assert [(k, e.start) for k, e in rest] == [(("a",), 20), (("a",), 30)]
    assert not store.chunks and not bucket.index.windows
    many = windowing.BucketWindows(windowing.WindowIndex(), store)
    n = windowing.WINDOWS_PER_CHUNK + 1
    many.apply_partials(spec_, [("a",)] * n, windowing.Partials(
        [10 * i for i in range(n)], [False] * n, [[1]] * n), watermark=-1)
    assert len(store.chunks) == 2


@settings(max_examples=200, deadline=None)
@given(st.data(), streams(), fixed_assigners, st.sampled_from([0, 1, 5, 40]))
def test_a_bucket_stored_the_first_way_goes_on_as_if_never_moved(data, batches, geometry,
                                                                 lateness):
    """A checkpoint written before the window-by-window layout: the bucket's KeyWindows after
    some batches, moved into chunks, then the rest of the stream."""
    size, slide, offset = geometry
    assigner = Tumbling(size, offset) if size == slide else Sliding(size, slide, offset)
    spec_ = WindowSpec(assigner, COUNT + ALL_AGGS[2:4], lateness)
    rows_ = keyed(batches, data.draw(st.lists(st.sampled_from(["a", "b"]),
                                              min_size=sum(map(len, batches)),
                                              max_size=sum(map(len, batches)))))
    cut = data.draw(st.integers(0, len(rows_)))
    marks = watermarks_at_batch_starts([[(t, w, v) for _, t, w, v in b] for b in rows_])
    states = {}
    for batch, mark in zip(rows_[:cut], marks):
        s = NO_WATERMARK if mark is None else mark
        for key in sorted({k for k, *_ in batch}):
            states.setdefault(key, KeyWindows()).apply(
                spec_, raw_rows([r for r in batch if r[0] == key]), s)
        for state in states.values():
            state.fire(spec_, s)
    legacy = pickle.loads(pickle.dumps({k: s.slots for k, s in states.items() if s.slots}))
    store = windowing.ChunkStore()
    index = windowing.index_of_key_windows(spec_, legacy, store, timer=7)
    assert index.timer == 7
    # The rest through the bucket, against the KeyWindows carried on.
    expected_states = {k: KeyWindows(pickle.loads(pickle.dumps(v))) for k, v in legacy.items()}
    rest = rows_[cut:]
    for batch, mark in zip(rest + [[]], marks[cut:]):
        s = NO_WATERMARK if mark is None else mark
        want, got = [], []
        keys, starts, late, accs = [], [], [], []
        for key in sorted({k for k, *_ in batch}):
            chosen = raw_rows([r for r in batch if r[0] == key])
            want += [(key, e) for e in expected_states.setdefault(key, KeyWindows()).apply(
                spec_, chosen, s)]
            p = windowing.row_partials(spec_, chosen)
            keys += [key] * len(p.starts)
            starts += p.starts
            late += p.late
            accs += p.accs
        bucket = windowing.BucketWindows(index, store)
        if batch:
            got += bucket.apply_partials(spec_, keys, windowing.Partials(starts, late, accs), s)
        got += bucket.fire(spec_, s)
        want += [(k, e) for k, st_ in sorted(expected_states.items()) for e in st_.fire(spec_, s)]
        assert by_key([got]) == by_key([want])


def session_bucket_drive(spec_, batches, flush):
    """The processor's calls on one bucket of sessions: the batch's rows per key, then the
    timer phase when the bucket's timer is due; index and store pickled between calls."""
    index, store, out = windowing.SessionIndex(), windowing.KeyStore(), []
    marks = watermarks_at_batch_starts([[(t, w, v) for _, t, w, v in b] for b in batches])
    for batch, mark in zip(batches + [[]], marks):
        s = NO_WATERMARK if mark is None else mark
        emitted = []
        if batch:
            groups = [(key, raw_rows([r for r in batch if r[0] == key]))
                      for key in sorted({k for k, *_ in batch}, reverse=True)]
            bucket = windowing.BucketSessions(pickle.loads(pickle.dumps(index)), store)
            emitted += bucket.apply(spec_, groups, s)
            index = bucket.index
            assert (index.wake_up(NO_WATERMARK) or math.inf) > s   # nothing left due
        wake = index.wake_up(NO_WATERMARK)
        if wake is not None and wake <= s:
            bucket = windowing.BucketSessions(pickle.loads(pickle.dumps(index)), store)
            emitted += bucket.fire(spec_, s)
            index = bucket.index
        out.append(emitted)
    out.append(windowing.BucketSessions(index, store).fire(spec_, flush))
    return out, index, store


@settings(max_examples=300, deadline=None)
@given(st.data(), streams(), st.integers(1, 15), st.sampled_from([0, 0, 1, 5, 17]))
def test_a_bucket_of_sessions_stored_key_by_key_emits_what_each_keys_sessions_emit(
        data, batches, gap, lateness):
    spec_ = WindowSpec(Session(gap), ALL_AGGS[:6], lateness)
    batches = [[(None if data.draw(st.integers(0, 9)) == 0 else t, w, v) for t, w, v in batch]
               for batch in batches]
    rows_ = keyed(batches, data.draw(st.lists(st.sampled_from(["a", "b", "c"]),
                                              min_size=sum(map(len, batches)),
                                              max_size=sum(map(len, batches)))))
    got, index, store = session_bucket_drive(spec_, rows_, 1_000)
    assert by_key(got) == by_key(per_key_drive(spec_, rows_, 1_000))
    assert not store.keys and not store.wakes and not index.wakes
