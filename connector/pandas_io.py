"""pandas at the edge of the window processors (:mod:`kwatermark.windows`): a bucket's rows
as Spark hands them over (records, ``Combiner``'s partials, heartbeats and ticks), the input
clock they prove, and the emitted windows as the frame Spark takes back. The window logic
itself is pure (:mod:`kwatermark.windowing`)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pandas as pd

from kwatermark.ticks import input_clock
from kwatermark.windowing import (
    IS_LATE,
    NO_WATERMARK,
    START,
    Emission,
    Rows,
    WindowSpec,
    partials,
)

# The columns aggregate prepares. Spark renames pandas columns whose names start with "__":
# plain, unlikely names instead.
TIME, MARK, BUCKET = "kwatermark_time", "kwatermark_watermark", "kwatermark_bucket"
INPUT = "kwatermark_input"          # which of aggregate's streams a row came from


def records(rows: Iterator[pd.DataFrame]) -> pd.DataFrame | None:
    """A bucket's rows of the batch without the heartbeat rows (None: nothing left)."""
    batch = gather(rows)
    return None if batch is None else without_heartbeats(batch)


def gather(rows: Iterator[pd.DataFrame]) -> pd.DataFrame | None:
    """A bucket's rows of the batch, heartbeats and ticks included (None: none)."""
    frames = [f for f in rows if len(f)]
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else \
        (frames[0] if frames else None)


def without_heartbeats(batch: pd.DataFrame) -> pd.DataFrame | None:
    beats = batch["is_heartbeat"].to_numpy() == True  # null-safe: a null flag is a record
    if beats.any():
        batch = batch[~beats].reset_index(drop=True)
    return None if batch.empty else batch


def clock(batch: pd.DataFrame, streams: int, watermark: int) -> int:
    """Spark's watermark, or the input clock the rows prove when it is ahead of it."""
    marks = batch[MARK].fillna(NO_WATERMARK).to_numpy(dtype=np.int64)
    clock = input_clock(marks, batch[INPUT].to_numpy(), streams, NO_WATERMARK)
    return watermark if clock is None else max(watermark, clock)


def emitted_frame(by: list[str], spec: WindowSpec, out: list[tuple[tuple, Emission]]
                  ) -> pd.DataFrame:
    # Built column by column in the output's order: a `columns=` argument would make pandas
    # reindex, which costs more than building the frame.
    emissions = [e for _, e in out]
    data: dict[str, object] = {c: [k[i] for k, _ in out] for i, c in enumerate(by)}
    data["window_start"] = instants([e.start for e in emissions])
    data["window_end"] = instants([e.end for e in emissions])
    for i, agg in enumerate(spec.aggs):
        data[agg.name] = [e.values[i] for e in emissions]
    data["kind"] = [e.kind for e in emissions]
    return pd.DataFrame(data, copy=False)


def row_keys(batch: pd.DataFrame, by: list[str]) -> list[tuple]:
    """Every row's key as a tuple; a null key part is None."""
    if not by:
        return [()] * len(batch)
    columns = []
    for c in by:
        series = batch[c]
        values = series.tolist()
        if series.dtype.kind in "fO" and series.hasnans:
            values = [None if is_missing(v) else v for v in values]
        columns.append(values)
    return list(zip(*columns))


def key_groups(batch: pd.DataFrame, by: list[str]) -> Iterator[tuple[tuple, np.ndarray]]:
    """(key, row positions) for every key of a bucket's batch; a null key part is None."""
    if not by:
        yield (), np.arange(len(batch))
        return
    groups = batch.groupby(by if len(by) > 1 else by[0], sort=False, dropna=False).indices
    for value, index in groups.items():
        parts = value if len(by) > 1 else (value,)
        yield tuple(None if is_missing(v) else v for v in parts), index


def is_missing(value: object) -> bool:
    return (value is None or value is pd.NaT or value is pd.NA
            or (isinstance(value, float) and math.isnan(value)))


def record_rows(batch: pd.DataFrame, inputs: list[str]) -> Rows:
    def millis(column: str) -> np.ndarray:
        return batch[column].fillna(NO_WATERMARK).to_numpy(dtype=np.int64)

    return Rows(millis(TIME), millis(MARK), {c: batch[c].to_numpy() for c in inputs})


def combined_partials(batch: pd.DataFrame, spec: WindowSpec, integral: dict[str, bool]):
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


def instants(ms: list[int | None]) -> pd.api.extensions.ExtensionArray:
    """Epoch milliseconds (None: null) as UTC instants."""
    return pd.DatetimeIndex(np.array(ms, dtype="datetime64[ms]")).tz_localize("UTC").array
