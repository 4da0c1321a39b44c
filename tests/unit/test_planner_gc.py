"""The driver's calls and a Spark task's read run with Python's cyclic garbage collector
paused (``source._gc_paused``, ``source._read``, docs/operations.md): a planning at thousands
of partitions made dozens of collections that walked every partition's state again, and a
task of thousands of ranges its ranges' objects. Paused only for the call or the task: the
application's collector is as it was after it, on success and on error."""

from __future__ import annotations

import gc
import json
from typing import ClassVar

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
    seen: ClassVar[list] = []
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
    seen: ClassVar[list] = []
    _watch(monkeypatch, reader.planner, "latest_offset", seen)
    for tp in broker.tps:
        broker.ends[tp] = 2
    gc.disable()
    start = reader.initialOffset()
    reader.latestOffset(start, ReadMaxRows(10))
    assert not gc.isenabled()
    assert seen == [("latest_offset", False)]


class _Pack:
    """A stand-in for PackReader (no broker: the pause is what is tested) that records
    whether the collector runs while the task reads its ranges, and can fail mid-task."""

    seen: ClassVar[list] = []
    fail = False

    def __init__(self, options, layout, decoders, tasks):
        self.tasks = tasks
        self.records = {}

    def __iter__(self):
        for i in range(3):
            _Pack.seen.append(gc.isenabled())
            if _Pack.fail and i == 1:
                raise KWatermarkError("topic events, partition 0: the broker is down")
            yield i


def _task(tmp_path, monkeypatch):
    reader, broker = _reader(tmp_path)
    for tp in broker.tps:
        broker.ends[tp] = 7
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadMaxRows(10))
    partition, = [p for p in reader.partitions(start, end)]
    monkeypatch.setattr(source, "PackReader", _Pack)
    offered: list = []
    monkeypatch.setattr(reader.planner.ledger, "offer_pack",
                        lambda *args: offered.append(gc.isenabled()))
    _Pack.seen, _Pack.fail = [], False
    return reader, partition, offered


def test_a_task_reads_with_the_collector_paused_and_resumes_it_however_it_ends(
        tmp_path, monkeypatch, collector):
    """A Spark task of thousands of ranges made dozens of collections that walked its
    ranges' objects again: the collector is paused from the task's first range to its
    progress records, between its batches too (while Spark sends them), and runs again
    once the task ends, read to its end, stopped early by Spark, or failed."""
    reader, partition, offered = _task(tmp_path, monkeypatch)
    rows = reader.read(partition)
    assert next(rows) == 0 and not gc.isenabled()   # suspended at a batch: still paused
    assert list(rows) == [1, 2] and gc.isenabled()
    assert _Pack.seen == [False, False, False] and offered == [False]

    rows = reader.read(partition)
    next(rows)
    rows.close()                                     # Spark stops reading (a limit)
    assert gc.isenabled() and offered == [False]

    _Pack.seen, _Pack.fail = [], True
    with pytest.raises(KWatermarkError, match="broker is down"):
        list(reader.read(partition))
    assert gc.isenabled() and _Pack.seen == [False, False]


def test_a_task_leaves_a_collector_the_application_paused_paused(tmp_path, monkeypatch,
                                                                collector):
    reader, partition, offered = _task(tmp_path, monkeypatch)
    gc.disable()
    assert list(reader.read(partition)) == [0, 1, 2]
    assert not gc.isenabled() and offered == [False]


def test_a_planning_call_freezes_what_exists_and_cyclic_garbage_is_still_collected(
        monkeypatch, collector):
    """Spark's planning process keeps what a planning made out of the collections after it
    (``gc.freeze``) and collects in full at most every PLANNING_COLLECT_EVERY_S: a cycle
    left behind between plannings is freed by the next full collection, not kept."""
    import weakref

    class Node:
        pass

    monkeypatch.setattr(source, "_planning_collected_at", None)
    monkeypatch.setattr(source, "PLANNING_COLLECT_EVERY_S", 3600.0)
    call = source._planning_call(lambda: "planned")
    try:
        assert call() == "planned"            # the first call collects, then freezes
        assert gc.isenabled() and gc.get_freeze_count() > 0
        cycle = Node()
        cycle.me = cycle
        left = weakref.ref(cycle)
        del cycle
        gc.disable()                          # no collection between the two calls
        call()                                # a full collection is not due: frozen
        assert left() is not None and gc.get_freeze_count() > 0 and not gc.isenabled()
        gc.enable()
        monkeypatch.setattr(source, "PLANNING_COLLECT_EVERY_S", 0.0)
        call()                                # due: unfrozen, collected, frozen again
        assert left() is None
    finally:
        gc.unfreeze()
