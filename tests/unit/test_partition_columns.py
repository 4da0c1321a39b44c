"""A batch's partitions as columns (DESIGN §21, ``kwatermark.partition_columns``): the
planner plans, folds and writes thousands of partitions a column at a time where the
default policy leaves every partition as it is. That path must plan exactly what the
per-partition one plans: each planning here runs twice, once as the planner does and once
with the folded states handed over as a plain dict (which takes the per-partition loop),
and the two offsets' JSON must be the same, through read limits, partitions that read
nothing, a topic gaining a partition, and a restart from the checkpoint's JSON."""

from __future__ import annotations

import json
import pickle

import pytest
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from kwatermark import planner as planner_module
from kwatermark import source
from kwatermark.arrow import OutputLayout
from kwatermark.ledger import ProgressRecord, record_columns
from kwatermark.offsets import BatchOffset, PartitionLag, PartitionRange, PartitionState
from kwatermark.partition_columns import OffsetColumns, RangeMap, StateMap, columns_of
from tests.unit.test_progress_model import FakeBroker

pytestmark = pytest.mark.usefixtures("brokers_answer")

TPS = [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1)]


class Clock:
    def __init__(self):
        self.ms = 1_700_000_000_000

    def __call__(self) -> int:
        return self.ms


def _reader(path, broker: FakeBroker) -> source.KWatermarkStreamReader:
    reader = source.KWatermarkDataSource({
        "kafka.bootstrap.servers": "fake:9092", "subscribe": "a,b",
        "startingOffsets": "earliest", "watermark.stateLocation": str(path),
        "watermark.maxOutOfOrderness": "5 seconds",
    }).streamReader(from_arrow_schema(OutputLayout().schema()))
    reader.planner.metadata = broker
    return reader


def _by_objects(reader: source.KWatermarkStreamReader) -> None:
    """The folded states as a dict of PartitionState: the planner's per-partition path."""
    fold = reader.planner.fold

    def folded_as_dict(offset):
        states, highest = fold(offset)
        return dict(states.items()), highest

    reader.planner.fold = folded_as_dict


def _logged(offset: dict) -> dict:
    return json.loads(json.dumps(offset))   # what Spark hands back


def _run(reader, start: dict, limit) -> dict:
    """Plan the next batch, publish what its tasks would (every record at event time
    1,000,000 + its offset, partition b:1 ten seconds behind), and commit it."""
    end = reader.latestOffset(_logged(start), limit)
    if end == start:
        return end
    planner = reader.planner
    for split in reader.partitions(_logged(start), _logged(end)):
        behind = [10_000 if t.tp == ("b", 1) else 0 for t in split.tasks]
        records = [ProgressRecord({"max_ts": 1_000_000 + t.end - 1 - lag}, t.end - t.start,
                                  1_000_000 + t.start - lag, 1_000_000 + t.end - 1 - lag, None)
                   for t, lag in zip(split.tasks, behind)]
        planner.ledger.offer_pack(split.columns, planner.fingerprint, record_columns(records),
                                  split.ledger_key)
    reader.commit(_logged(end))
    return end


def test_the_column_path_plans_what_the_per_partition_path_plans(tmp_path, monkeypatch):
    clock = Clock()
    monkeypatch.setattr(planner_module, "now_ms", clock)
    broker = FakeBroker(list(TPS))
    columns, objects = _reader(tmp_path / "columns", broker), _reader(tmp_path / "objects",
                                                                      broker)
    _by_objects(objects)
    took_columns = []
    planned_columns = columns.planner._planned_columns
    monkeypatch.setattr(columns.planner, "_planned_columns",
                        lambda *a: took_columns.append(1) or planned_columns(*a))
    starts = [columns.initialOffset(), objects.initialOffset()]
    assert starts[0] == starts[1]
    steps = [
        ({("a", 0): 40, ("a", 1): 0, ("a", 2): 90, ("b", 0): 7, ("b", 1): 30}, ReadAllAvailable()),
        ({("a", 0): 60, ("a", 2): 300, ("b", 1): 80}, ReadMaxRows(50)),   # a read limit
        ({}, ReadMaxRows(50)),                                           # what it left
        ({}, ReadAllAvailable()),                                        # the rest
        ({}, ReadAllAvailable()),                                        # nothing new
        ({("a", 1): 5}, ReadAllAvailable()),                             # one partition only
        ({("a", 3): 12}, ReadAllAvailable()),                            # a partition joins
        ({("a", 3): 20, ("b", 0): 9}, ReadAllAvailable()),
    ]
    for ends, limit in steps:
        clock.ms += 1_000
        for tp, end in ends.items():
            if tp not in broker.tps:
                broker.tps.append(tp)
            broker.ends[tp] = end
        starts = [_run(reader, start, limit) for reader, start in zip((columns, objects),
                                                                       starts)]
        assert starts[0] == starts[1]
    # the planning the test is about happened, and read the records
    assert len(took_columns) >= 4
    assert {int(p): o for p, o in starts[0]["a"].items()} == {0: 60, 1: 5, 2: 300, 3: 20}

    # a restart: a new planner takes the checkpoint's JSON and plans the same
    restarted = [_reader(tmp_path / "columns", broker), _reader(tmp_path / "objects", broker)]
    _by_objects(restarted[1])
    clock.ms += 1_000
    broker.ends[("b", 1)] = 95
    again = [_run(reader, start, ReadAllAvailable()) for reader, start in zip(restarted, starts)]
    assert again[0] == again[1] and again[0]["b"]["1"] == 95


def test_columns_read_back_the_ranges_they_were_made_of():
    state = PartitionState(generator={"max_ts": 9}, max_event_ms=9, last_read_ms=3)
    ranges = {("t", 2): PartitionRange(5, 9, state, PartitionLag(1, 2, 3, 4, 5)),
              ("t", 0): PartitionRange(0, 3),
              ("s", 7): PartitionRange(1, 1, PartitionState(idle="exclude", held=True))}
    columns = OffsetColumns.of(ranges)
    assert columns.tps == [("s", 7), ("t", 0), ("t", 2)]
    assert columns.ranges() == ranges
    as_map = RangeMap(columns)
    assert as_map == ranges and ranges == as_map
    assert as_map[("t", 2)] == ranges[("t", 2)] and as_map.get(("t", 1)) is None
    assert ("t", 0) in as_map and ("t", 1) not in as_map and list(as_map) == columns.tps
    assert StateMap(columns) == {tp: r.state for tp, r in ranges.items()}
    # columns against columns: a range that differs anywhere makes them differ
    other = dict(ranges)
    other[("t", 0)] = PartitionRange(0, 4)
    assert RangeMap(OffsetColumns.of(other)) != as_map
    other[("t", 0)] = PartitionRange(0, 3, lag=PartitionLag())
    assert RangeMap(OffsetColumns.of(other)) != as_map
    assert pickle.loads(pickle.dumps(as_map)) == as_map
    offset = BatchOffset(5, as_map, planned_ms=7)
    assert BatchOffset.from_json(offset.to_json()) == BatchOffset(5, ranges, planned_ms=7)
    assert columns_of(offset) is columns
