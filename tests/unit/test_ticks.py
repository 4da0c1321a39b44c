"""The input clock and the tick rows (kwatermark.ticks): pure, no Spark."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from kwatermark.ticks import input_clock, with_ticks

NONE = -(2 ** 63)


def test_one_input_fires_by_its_highest_row_watermark_ignoring_undefined_ones():
    assert input_clock(np.array([NONE, 3, 8, 5]), np.zeros(4), 1, NONE) == 8


def test_no_defined_watermark_proves_nothing():
    assert input_clock(np.array([NONE, NONE]), np.zeros(2), 1, NONE) is None


def test_several_inputs_take_the_lowest_of_each_inputs_highest():
    marks = np.array([100, 900, 40, 70])
    assert input_clock(marks, np.array([0, 0, 1, 1]), 2, NONE) == 70


def test_an_input_without_a_row_leaves_the_clock_to_spark():
    # Input 1 sent nothing here: its watermark could be anything below input 0's.
    assert input_clock(np.array([100, 900]), np.array([0, 0]), 2, NONE) is None
    assert input_clock(np.array([100, NONE]), np.array([0, 1]), 2, NONE) is None


def test_ticks_reach_every_bucket_with_the_tables_highest_mark():
    table = pa.table({"bucket": pa.array([3, 3], pa.int32()), "k": ["x", "y"],
                      "beat": [False, False], "input": pa.array([1, 1], pa.int32()),
                      "n": [2, 5], "mark": pa.array([7, 9], pa.int64())})
    out = with_ticks(table, "bucket", 4, "mark", "beat", {"input": 1})
    assert out.num_rows == 6
    ticks = out.slice(2).to_pylist()
    assert [t["bucket"] for t in ticks] == [0, 1, 2, 3]
    assert {(t["mark"], t["beat"], t["input"], t["k"], t["n"]) for t in ticks} == \
        {(9, True, 1, None, None)}
    assert out.schema == table.schema
    assert out.slice(0, 2).equals(table)


def test_no_ticks_without_a_mark():
    table = pa.table({"bucket": pa.array([0], pa.int32()), "beat": [True],
                      "mark": pa.array([None], pa.int64())})
    assert with_ticks(table, "bucket", 4, "mark", "beat", {}).equals(table)
