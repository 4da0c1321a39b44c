"""The input clock: what a stateful call's own input rows prove about the combined watermark,
and the tick rows that carry it to every bucket (DESIGN §10, "when a window comes out").

Spark's watermark in micro-batch N is the highest row watermark of batch N-1, and a row's
``watermark`` is the combined watermark when the row was read. So the rows of batch N already
carry a watermark one batch ahead of Spark's: a window that batch N-1's records completed
comes out in batch N when the stateful step fires by its input rows' watermark too, instead
of in batch N+1 when Spark's watermark catches up (Spark's own aggregation emits in batch N:
its watermark comes from the event times of batch N-1).

Every row watermark is a combined watermark the source has proven (the minimum over
partitions, its own partition advancing record by record), so the highest one a call sees is
safe to fire by. With several inputs, each input's highest row watermark bounds only that
input: the call may fire by the lowest of them, and only when every input sent it a row.

A bucket receives rows only for its own keys; ticks (one tiny row per bucket per task, with
the task's highest row watermark) make every bucket hear the clock in every batch. They are
flagged as heartbeats, so nothing else looks at them.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def input_clock(marks: np.ndarray, inputs: np.ndarray, streams: int, undefined: int
                ) -> int | None:
    """The watermark a call's input rows prove: per input (``inputs[i]``, 0 ..
    ``streams - 1``) the highest of its rows' watermarks (``marks``, epoch ms, ``undefined``:
    none), the lowest over the inputs; None unless every input has a row with a watermark.

    >>> input_clock(np.array([5, 9, 7]), np.array([0, 0, 1]), 2, -1)
    7
    >>> input_clock(np.array([5, 9]), np.array([0, 0]), 2, -1) is None   # input 1 silent
    True
    """
    defined = marks != undefined
    if not defined.any():
        return None
    marks, inputs = marks[defined], inputs[defined]
    if streams == 1:
        return int(marks.max())
    highest = np.full(streams, undefined, dtype=np.int64)
    np.maximum.at(highest, inputs.astype(np.int64), marks.astype(np.int64))
    if (highest == undefined).any():
        return None
    return int(highest.min())


def with_ticks(table: pa.Table, bucket: str, buckets: int, mark: str, flag: str,
               constants: dict[str, object]) -> pa.Table:
    """``table`` and one tick row per bucket ``0 .. buckets - 1``: ``mark`` the table's
    highest ``mark``, ``flag`` true, ``constants`` (column -> value, e.g. the input's index)
    as given, every other column null. Unchanged when no row has a mark."""
    highest = pc.max(table.column(mark)).as_py()
    if highest is None or not buckets:
        return table
    columns = []
    for name in table.column_names:
        dtype = table.schema.field(name).type
        if name == bucket:
            values = pa.array(np.arange(buckets), type=pa.int64()).cast(dtype)
        elif name == mark:
            values = pa.array(np.full(buckets, highest, dtype=np.int64)).cast(dtype)
        elif name == flag:
            values = pa.array(np.ones(buckets, dtype=bool))
        elif name in constants:
            values = pa.array([constants[name]] * buckets).cast(dtype)
        else:
            values = pa.nulls(buckets, type=dtype)
        columns.append(values)
    return pa.concat_tables([table, pa.table(columns, schema=table.schema)])
