"""watermark.combine=percentile (DESIGN §13): the combination, the per-row bounds, and the
real planner + reader against a brute-force oracle."""

from __future__ import annotations

import itertools
import json
import math
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kwatermark.arrow import OutputLayout
from kwatermark.errors import OptionError
from kwatermark.offsets import BatchOffset
from kwatermark.options import parse_options
from kwatermark.planner import BatchPlanner, ReadLimits
from kwatermark.reader import Decoders
from kwatermark.watermarks import (
    NO_PARTITIONS,
    UNDEFINED,
    combined_watermark,
    emitted,
    holder,
    row_bounds,
)
from tests.unit.test_progress_model import TOPIC, FakeBroker, read_task

pytestmark = pytest.mark.usefixtures("brokers_answer")

BASE = {"kafka.bootstrap.servers": "fake:9092", "subscribe": "events"}

marks_st = st.lists(st.one_of(st.just(UNDEFINED), st.integers(-1_000, 1_000)),
                    min_size=1, max_size=9)
percentiles = st.one_of(st.integers(1, 100).map(str),
                        st.decimals(min_value="0.01", max_value="100", places=2)
                        .map(lambda d: f"{d.normalize():f}"))


def oracle(values: list[int], p: str) -> int:
    """Brute force: the highest w such that at least p % of the values are >= w."""
    n = len(values)
    return max(w for w in values if 100 * sum(v >= w for v in values) >= float(p) * n - 1e-9)


def test_examples():
    assert combined_watermark([5, 3, 1, 7], "100") == 1          # min
    assert combined_watermark([5, 3, 1, 7], "50") == 5           # ceil(2) = 2nd largest
    assert combined_watermark([5, 3, 1, 7], "51") == 3           # ceil(2.04) = 3rd -> 3
    assert combined_watermark([5, 3, 1, 7], "25") == 7
    assert combined_watermark([5, UNDEFINED, 9], "50") == 5     # undefined is the lowest
    assert combined_watermark([5, UNDEFINED, 9], "100") == UNDEFINED
    assert combined_watermark([], "50") == NO_PARTITIONS


@given(marks_st)
def test_percentile_100_is_the_minimum(values):
    assert combined_watermark(values, "100") == min(values)


@given(marks_st, percentiles)
def test_percentile_matches_its_definition(values, p):
    assert combined_watermark(values, p) == oracle(values, p)
    k = math.ceil(float(p) * len(values) / 100 - 1e-12)
    # at least p % of the partitions are at or past it
    assert sum(v >= combined_watermark(values, p) for v in values) >= k


@given(marks_st, percentiles, percentiles)
def test_monotone_in_p(values, p, q):
    low, high = sorted((p, q), key=float)
    assert combined_watermark(values, low) >= combined_watermark(values, high)


@given(st.dictionaries(st.integers(0, 8), st.one_of(st.just(UNDEFINED),
                                                   st.integers(-50, 50)), min_size=1),
       percentiles)
def test_holder_holds_the_combined_watermark(marks, p):
    owner = holder(marks, p)
    assert marks[owner] == combined_watermark(list(marks.values()), p)
    assert owner == min(k for k in marks if marks[k] == marks[owner])


@given(st.dictionaries(st.integers(0, 6), st.one_of(st.just(UNDEFINED),
                                                   st.integers(-50, 50)), min_size=1),
       st.data(), percentiles, st.one_of(st.just(UNDEFINED), st.integers(-60, 60)))
def test_row_bounds_equal_the_combination_with_the_own_partition_replaced(marks, data, p, x):
    counted = data.draw(st.sets(st.sampled_from(sorted(marks))))
    bounds = row_bounds(marks, counted, p)
    for tp in marks:
        floor, ceiling = bounds[tp]
        others = [marks[q] for q in counted if q != tp]
        if tp in counted:
            assert min(max(x, floor), ceiling) == combined_watermark(others + [x], p)
        else:
            assert floor == ceiling == combined_watermark(others, p)


@given(st.lists(marks_st.map(lambda v: v[:4] + [0] * (4 - len(v[:4]))), min_size=1,
                max_size=8), percentiles)
def test_emitted_never_decreases_over_batches(batches, p):
    emitted_so_far = UNDEFINED
    for values in batches:
        now = emitted(emitted_so_far, combined_watermark(values, p))
        assert now >= emitted_so_far
        emitted_so_far = now


@pytest.mark.parametrize("value, message", [
    ("0", r"\(0, 100\]"), ("100.5", r"\(0, 100\]"), ("-3", r"\(0, 100\]"),
    ("half", "expected a number"), ("nan", r"\(0, 100\]"),
])
def test_bad_percentiles_name_the_option(value, message):
    with pytest.raises(OptionError, match=f"watermark.percentile.*{message}"):
        parse_options({**BASE, "watermark.combine": "percentile",
                       "watermark.percentile": value})


def test_percentile_and_combine_go_together():
    with pytest.raises(OptionError, match="watermark.percentile is required"):
        parse_options({**BASE, "watermark.combine": "percentile"})
    with pytest.raises(OptionError, match="watermark.combine=percentile"):
        parse_options({**BASE, "watermark.percentile": "50"})
    with pytest.raises(OptionError, match="watermark.combine.*accepted: min, percentile"):
        parse_options({**BASE, "watermark.combine": "median"})
    options = parse_options({**BASE, "watermark.combine": "PERCENTILE",
                             "watermark.percentile": "50.0"})
    assert options.watermark.percentile == "50"
    assert parse_options(BASE).watermark.percentile == "100"


# -- through the real planner and reader ---------------------------------------------------


def true_wm(timestamps: list[int]) -> int:
    return max(timestamps) - 1 if timestamps else UNDEFINED


@st.composite
def streams(draw):
    n = draw(st.integers(2, 5))
    records = [draw(st.lists(st.integers(0, 300), min_size=0, max_size=8)) for _ in range(n)]
    n_batches = draw(st.integers(1, 5))
    batches = []
    for timestamps in records:
        cuts = sorted(draw(st.lists(st.integers(0, len(timestamps)), min_size=n_batches - 1,
                                    max_size=n_batches - 1)))
        bounds = [0] + cuts + [len(timestamps)]
        batches.append([b - a for a, b in itertools.pairwise(bounds)])
    return records, [[batches[p][b] for p in range(n)] for b in range(n_batches)]


@settings(deadline=None, max_examples=60)
@given(streams(), percentiles)
def test_planner_and_reader_follow_the_percentile_oracle(stream, p):
    """Every row carries max(batch start, the p-percentile of its own partition advanced to
    the record before it and the others at the batch start); rows never decrease."""
    records, batches = stream
    n = len(records)
    tps = [(TOPIC, q) for q in range(n)]
    with tempfile.TemporaryDirectory() as ledger:
        options = parse_options({"kafka.bootstrap.servers": "fake:9092",
                                 "assign": json.dumps({TOPIC: list(range(n))}),
                                 "startingOffsets": "earliest", "watermark.stateLocation": ledger,
                                 "watermark.combine": "percentile", "watermark.percentile": p})
        planner = BatchPlanner(options, OutputLayout(), Decoders())
        broker = FakeBroker(tps)
        planner.metadata = broker
        offset = planner.initial_offset()
        read = {tp: 0 for tp in tps}
        highest_before = UNDEFINED
        for counts in batches:
            for tp, count in zip(tps, counts):
                broker.ends[tp] = read[tp] + count
            end = planner.latest_offset(offset, ReadLimits())
            if not any(counts):
                assert end is None
                continue
            end = BatchOffset.from_json(json.loads(json.dumps(end.to_json())))
            start_marks = {tp: true_wm(records[tp[1]][:read[tp]]) for tp in tps}
            computed = combined_watermark(list(start_marks.values()), p)
            assert (end.watermark if end.watermark is not None else UNDEFINED) >= computed
            assert start_marks[end.holder] == computed
            boundary = UNDEFINED if end.watermark is None else end.watermark
            got_rows = []
            for task in planner.tasks(end):
                rows, progress = read_task(planner, task, records[task.partition], 3)
                planner.ledger.publish(task, planner.fingerprint, progress)
                for row in rows:
                    own = true_wm(records[task.partition][:row.offset])
                    others = [start_marks[q] for q in tps if q != task.tp]
                    expected = max(boundary, combined_watermark(others + [own], p))
                    got = UNDEFINED if row.watermark is None else row.watermark
                    assert got == expected, (row, expected)
                    got_rows.append(got)
            # never decreasing across batches: every row >= every row of the batch before
            assert min(got_rows) >= highest_before
            highest_before = max(got_rows)
            for tp, count in zip(tps, counts):
                read[tp] += count
            offset = end
