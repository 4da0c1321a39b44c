"""The driver's calls run with Python's cyclic garbage collector paused
(``source._gc_paused``, docs/operations.md): a planning at thousands of partitions made
dozens of collections that walked every partition's state again. Paused only for the call:
the application's collector is as it was after it, on success and on error."""

from __future__ import annotations

import gc
import json

import pytest
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.streaming.datasource import ReadMaxRows

from kwatermark import source
from kwatermark.arrow import OutputLayout
from kwatermark.errors import KWatermarkError
from tests.unit.test_progress_model import FakeBroker

TOPIC = "events"


def _reader(tmp_path, partitions: int = 3) -> tuple[source.KWatermarkStreamReader, FakeBroker]:
    reader = source.KWatermarkDataSource({
        "kafka.bootstrap.servers": "fake:9092", "subscribe": TOPIC,
        "startingOffsets": "earliest", "maxOffsetsPerTrigger": "10",
        "watermark.stateLocation": str(tmp_path),
    }).streamReader(from_arrow_schema(OutputLayout().schema()))
    broker = FakeBroker([(TOPIC, p) for p in range(partitions)])
    reader.planner.metadata = broker
    return reader, broker


def _watch(monkeypatch, obj, name: str, seen: list) -> None:
    """Record whether the collector ran when ``obj.name`` was called."""
    method = getattr(obj, name)

    def watched(*args, **kwargs):
        seen.append((name, gc.isenabled()))
        return method(*args, **kwargs)
    monkeypatch.setattr(obj, name, watched)


@pytest.fixture
def collector():
    """The test's collector state, restored whatever the test did to it."""
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_planning_and_committing_run_with_the_collector_paused_and_resume_it(
        tmp_path, monkeypatch, collector):
    reader, broker = _reader(tmp_path)
    seen: list = []
    planner = reader.planner
    for name in ("initial_offset", "latest_offset", "packed_tasks", "commit"):
        _watch(monkeypatch, planner, name, seen)
    for tp in broker.tps:
        broker.ends[tp] = 7
    start = reader.initialOffset()
    assert gc.isenabled()
    end = reader.latestOffset(json.loads(json.dumps(start)), ReadMaxRows(10))
    assert gc.isenabled()
    splits = reader.partitions(start, end)
    assert gc.isenabled()
    reader.commit(end)
    assert gc.isenabled()
    # The batch was planned as asked: 10 of the 21 records, every range within its partition.
    planned = [(t.partition, t.start, t.end) for split in splits for t in split.tasks]
    assert sum(e - s for _, s, e in planned) == 10
    assert all(0 <= s <= e <= 7 for _, s, e in planned)
    assert [name for name, _ in seen] == ["initial_offset", "latest_offset", "packed_tasks",
                                          "commit"]
    assert not any(enabled for _, enabled in seen)


def test_a_call_that_fails_resumes_the_collector(tmp_path, monkeypatch, collector):
    reader, _ = _reader(tmp_path)

    def broken(*args, **kwargs):
        assert not gc.isenabled()
        raise KWatermarkError("topic events: the broker is down")
    monkeypatch.setattr(reader.planner, "initial_offset", broken)
    with pytest.raises(KWatermarkError, match="broker is down"):
        reader.initialOffset()
    assert gc.isenabled()


def test_a_collector_the_application_paused_stays_paused(tmp_path, monkeypatch, collector):
    reader, broker = _reader(tmp_path)
    seen: list = []
    _watch(monkeypatch, reader.planner, "latest_offset", seen)
    for tp in broker.tps:
        broker.ends[tp] = 2
    gc.disable()
    start = reader.initialOffset()
    reader.latestOffset(start, ReadMaxRows(10))
    assert not gc.isenabled()
    assert seen == [("latest_offset", False)]
