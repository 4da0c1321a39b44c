"""Many small ranges computed at once (``reader.compute_ranges``, the compiled engine's packs
of thousands of partitions, as columns) give the rows and progress records of computing each
alone.

The ground truth is ``RangeReader._compute`` on each range's own block, a different code path
(one ``np.maximum.accumulate`` per range); the ranges' blocks, states and options are drawn at
random, and the comparison covers every row and every state a progress record is made of."""

from __future__ import annotations

import random

import numpy as np
import pytest

from kwatermark import arrow
from kwatermark.ledger import record_columns
from kwatermark.offsets import PartitionState, RangeTask, TaskColumns
from kwatermark.options import parse_options
from kwatermark.reader import Decoders, RangeColumns, RangeReader, compute_ranges, ranges_at_once
from kwatermark.records import RecordBlock
from kwatermark.watermarks import (
    NO_PARTITIONS,
    UNDEFINED,
    segmented_running_max,
)

STRATEGIES = [
    {"watermark.strategy": "monotonous"},
    {"watermark.strategy": "bounded", "watermark.maxOutOfOrderness": "5 seconds"},
    {"watermark.strategy": "none"},
    {"watermark.strategy": "timelag", "watermark.maxTimeLag": "30 seconds"},
]


def _options(strategy: dict, late: str):
    return parse_options({"kafka.bootstrap.servers": "fake:9092", "subscribe": "t",
                          "lateRecords": late, "allowedLateness": "1 second", **strategy})


def _snapshot(strategy: dict, rng: random.Random) -> object:
    name = strategy["watermark.strategy"]
    if name in ("monotonous", "bounded"):
        return rng.choice([None, {"max_ts": None}, {"max_ts": rng.randrange(0, 60_000)}])
    if name == "timelag":
        return rng.choice([None, {"planned": 1_000_000 + rng.randrange(0, 60_000)}])
    return None


def _task(p: int, strategy: dict, rng: random.Random) -> RangeTask:
    start = rng.randrange(0, 1000)
    return RangeTask(
        "t", p, start, start + 50,
        PartitionState(generator=_snapshot(strategy, rng),
                       advanced_ms=rng.choice([None, None, rng.randrange(0, 40_000)])),
        counted=rng.random() < 0.8,
        previous_ms=rng.choice([None, rng.randrange(0, 30_000)]),
        others_ms=rng.choice([UNDEFINED, NO_PARTITIONS, rng.randrange(0, 60_000)]),
        floor_ms=rng.choice([None, rng.randrange(0, 20_000)]))


def _block(topic: str, partition: int, stamps: list[int]) -> RecordBlock:
    n = len(stamps)
    return RecordBlock(topic, partition, [b"k"] * n, [b"v"] * n,
                       np.arange(n, dtype=np.int64), np.array(stamps, dtype=np.int64),
                       np.zeros(n, dtype=np.int32))


def _records(readers: list[RangeReader]) -> dict[str, list]:
    """The progress records of ranges each read alone, as a pack file's columns."""
    return record_columns([reader._progress() for reader in readers])


@pytest.mark.parametrize("ranges", [1, 3, 16, 17, 300])
@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s["watermark.strategy"])
@pytest.mark.parametrize("late", ["keep", "flag", "drop"])
def test_many_ranges_at_once_give_each_range_s_own_rows_and_state(ranges, strategy, late):
    rng = random.Random(f"{ranges}-{strategy}-{late}")
    options = _options(strategy, late)
    layout = arrow.OutputLayout(flag_late=late == "flag")
    tasks = [_task(p, strategy, rng) for p in range(ranges)]
    assert ranges_at_once(options, Decoders())
    for _ in range(3):   # three blocks in a row, each range starting where the last left it
        alone = [RangeReader(options, layout, Decoders(), task) for task in tasks]
        stamps = [[rng.choice([-1, rng.randrange(0, 90_000)]) for _ in range(rng.randrange(1, 6))]
                  for _ in tasks]
        expected = [reader._compute(_block("t", task.partition, s))
                    for reader, task, s in zip(alone, tasks, stamps)]
        block = _block("t", 0, [stamp for s in stamps for stamp in s])
        got, records = compute_ranges(options, TaskColumns.of(tuple(tasks)), block,
                                      np.array([len(s) for s in stamps]))
        assert got.event_times.tolist() == [v for e in expected for v in e.event_times.tolist()]
        assert got.rows.tolist() == [v for e in expected for v in e.rows.tolist()]
        if late == "keep":
            assert got.late is None and all(e.late is None for e in expected)
        else:
            assert got.late.tolist() == [v for e in expected for v in e.late.tolist()]
        assert records == _records(alone)
        tasks = [RangeTask(t.topic, t.partition, t.start, t.end,
                           PartitionState(generator=r.generator.snapshot(),
                                          advanced_ms=t.state.advanced_ms),
                           t.counted, t.previous_ms, t.others_ms, t.floor_ms)
                 for t, r in zip(tasks, alone)]


@pytest.mark.parametrize("ranges", [1, 17, 300])
@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s["watermark.strategy"])
def test_a_task_s_ranges_as_columns_over_many_blocks_end_in_each_range_s_own_state(
        ranges, strategy):
    """The compiled engine keeps a task's ranges as columns from its first block to its
    last (``RangeColumns``): each block holds some of the ranges, in any order (those with
    records ready), and the states handed back at the end are each range's own, computed
    alone block by block."""
    rng = random.Random(f"columns-{ranges}-{strategy}")
    options = _options(strategy, "flag")
    layout = arrow.OutputLayout(flag_late=True)
    tasks = [_task(p, strategy, rng) for p in range(ranges)]
    alone = [RangeReader(options, layout, Decoders(), task) for task in tasks]
    columns = RangeColumns(options, TaskColumns.of(tuple(tasks)))
    for _ in range(6):
        rows = rng.sample(range(ranges), rng.randrange(1, ranges + 1))
        stamps = [[rng.choice([-1, rng.randrange(0, 90_000)]) for _ in range(rng.randrange(1, 5))]
                  for _ in rows]
        expected = [alone[row]._compute(_block("t", row, s)) for row, s in zip(rows, stamps)]
        got = columns.compute(np.array(rows), _block("t", 0, [t for s in stamps for t in s]),
                              np.array([len(s) for s in stamps]))
        assert got.rows.tolist() == [v for e in expected for v in e.rows.tolist()]
        assert got.late.tolist() == [v for e in expected for v in e.late.tolist()]
    assert columns.records() == _records(alone)


@pytest.mark.parametrize("segments", [0, 1, 5, 16, 17, 200])
def test_segmented_running_max_restarts_at_each_segment(segments):
    rng = np.random.default_rng(segments)
    counts = rng.integers(0, 6, size=segments)
    starts = rng.choice([UNDEFINED, 3, -7, 2**62], size=segments).astype(np.int64)
    values = rng.choice([UNDEFINED, -5, 0, 4, 10, 2**62 + 1], size=int(counts.sum())
                        ).astype(np.int64)
    before, last = segmented_running_max(starts, values, counts)
    want_before, want_last, at = [], [], 0
    for start, n in zip(starts.tolist(), counts.tolist()):
        top = start
        for v in values[at:at + n].tolist():
            want_before.append(top)
            top = max(top, v)
        want_last.append(top)
        at += n
    assert before.tolist() == want_before
    assert last.tolist() == want_last


def test_a_range_that_decodes_or_assigns_its_own_way_is_computed_alone():
    options = _options(STRATEGIES[0], "keep")
    assert ranges_at_once(options, Decoders())
    assert not ranges_at_once(options, Decoders(value=object()))
    by_function = parse_options({"kafka.bootstrap.servers": "fake:9092", "subscribe": "t",
                                 "eventTime.assigner": "builtins:len"})
    assert not ranges_at_once(by_function, Decoders())
    punctuated = parse_options({"kafka.bootstrap.servers": "fake:9092", "subscribe": "t",
                                "watermark.strategy": "punctuated",
                                "watermark.punctuation": "builtins:bool"})
    assert not ranges_at_once(punctuated, Decoders())
