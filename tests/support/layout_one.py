"""Layout 1 of kwatermark.windows' state, as every window kind stored it before issue 24: per
bucket of keys, one value state ("windows") holding every key's KeyWindows slots and the
bucket's timer, pickled. Kept here to write checkpoints of that layout, so tests can check that
the current processors go on from them (connector/windows.py at 87944de, verbatim but for the
class name)."""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterator

import pandas as pd
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)
from pyspark.sql.types import BinaryType, StructField, StructType

from kwatermark.pandas_io import combined_partials, instants, key_groups, record_rows
from kwatermark.windowing import Emission, KeyWindows, WindowSpec
from kwatermark.windows import (
    _INTEGRAL,
    PROFILE_ENV,
    _start_profile,
    accumulator_columns,
)


class OneValueProcessor(StatefulProcessor):
    """The thin shell. Spark groups by a bucket of keys; per bucket, one value state holds
    every key's :class:`KeyWindows` slots (pickled) and one event-time timer wakes the bucket
    at the first watermark at which any of its keys has something to emit or forget."""

    def __init__(self, spec: WindowSpec, by: list[str], inputs: list[str],
                 combined: StructType | None = None, streams: int = 1):
        # streams: today's aggregate passes it; layout 1 fired by Spark's watermark only.
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
            every, fold = record_rows(batch, self.inputs), KeyWindows.apply
        else:
            every, fold = combined_partials(batch, self.spec, self.combined), KeyWindows.apply_partials
        out = []
        for user_key, index in key_groups(batch, self.by):
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
        if changed or timer is None or timer < watermark:
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
        current one at which ``fire`` has something to do for any key: everything at or below
        the current watermark was fired already, so any earlier timer is superseded (deleted
        here, or by Spark once it has fired: ``expired``)."""
        first = min((m for slots in keys.values() for m in KeyWindows(slots).wake_ups(self.spec)
                     if m > watermark), default=None)
        # Spark fires an event-time timer once its watermark is above the timer's time.
        wanted = None if first is None else first - 1
        if timer != wanted:
            if timer is not None and timer != expired:
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
        data["window_start"] = instants([e.start for e in emissions])
        data["window_end"] = instants([e.end for e in emissions])
        for i, agg in enumerate(self.spec.aggs):
            data[agg.name] = [e.values[i] for e in emissions]
        data["kind"] = [e.kind for e in emissions]
        return pd.DataFrame(data, copy=False)


