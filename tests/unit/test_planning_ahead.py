"""Planning while Spark does something else (DESIGN §21): a batch's tasks are planned on a
thread once ``latestOffset`` returns it (Spark writes its offset log meanwhile, then asks
``partitions``), and what the planner needs no end offset for is done while the brokers
answer (``tests/conftest.py``'s ``brokers_answer`` runs the planner's tests both ways). What
Spark receives is the same either way."""

from __future__ import annotations

import pickle

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from tests.unit.test_idle_polls import TOPIC, _logged, _reader

pytestmark = pytest.mark.usefixtures("brokers_answer")


def _ranges(partitions) -> list[tuple[str, int, int, int]]:
    return sorted((t.topic, t.partition, t.start, t.end) for p in partitions for t in p.tasks)


def test_a_planned_batchs_tasks_are_those_spark_then_asks_for(tmp_path):
    reader, broker = _reader(tmp_path)
    for tp, end in zip(broker.tps, (4, 0, 9)):
        broker.ends[tp] = end
    start = reader.initialOffset()
    end = reader.latestOffset(_logged(start), ReadAllAvailable())
    planner = reader.planner
    offset = planner.offset(end)
    assert planner._readying is None   # not before Spark's next call, reportLatestOffset
    assert reader.reportLatestOffset() == {TOPIC: {"0": 4, "1": 0, "2": 9}}
    assert planner.pack_columns(offset) is not None, "nothing was planned ahead"
    splits = reader.partitions(_logged(start), _logged(end))
    # what the tasks receive: each partition with records from 0 to its end, nothing else
    received = [pickle.loads(pickle.dumps(split)) for split in splits]
    assert _ranges(received) == [(TOPIC, 0, 0, 4), (TOPIC, 2, 0, 9)]
    assert [r.tasks for r in received] == [s.tasks for s in splits]
    assert [r.ledger_key for r in received] == [s.ledger_key for s in splits]
    # the planner (with the reader) is pickled to the tasks: no thread, no columns in it
    copy = pickle.loads(pickle.dumps(planner))
    assert copy._readying is None and copy._columns is None


def test_tasks_that_fail_to_plan_ahead_fail_where_spark_asks_for_them(tmp_path, monkeypatch):
    reader, broker = _reader(tmp_path)
    for tp in broker.tps:
        broker.ends[tp] = 3
    start = reader.initialOffset()
    planner = reader.planner
    failures = []
    plan = planner._plan_tasks

    def failing(offset):
        if not any(r.end > r.start for r in offset.partitions.values()):
            return plan(offset)   # the start's (folded), which reads nothing
        failures.append(offset)
        raise RuntimeError("the tasks cannot be planned")

    monkeypatch.setattr(planner, "_plan_tasks", failing)
    end = reader.latestOffset(_logged(start), ReadAllAvailable())
    reader.reportLatestOffset()
    assert planner.pack_columns(planner.offset(end)) is None
    assert len(failures) == 1   # tried on the thread, quietly
    with pytest.raises(RuntimeError, match="the tasks cannot be planned"):
        reader.partitions(_logged(start), _logged(end))
    assert len(failures) == 2
    monkeypatch.undo()
    assert _ranges(reader.partitions(_logged(start), _logged(end))) == [
        (TOPIC, p, 0, 3) for p in range(3)]


def test_where_spark_never_reports_the_latest_offset_the_tasks_are_planned_at_once(tmp_path):
    """pyspark < 4.2 calls ``latestOffset()`` without a start, and never
    ``reportLatestOffset``: the tasks are planned on a thread as ``latestOffset`` returns."""
    reader, broker = _reader(tmp_path)
    for tp in broker.tps:
        broker.ends[tp] = 2
    end = reader.latestOffset()
    assert reader.planner.pack_columns(reader.planner.offset(end)) is not None
    start = reader.initialOffset()
    assert _ranges(reader.partitions(_logged(start), _logged(end))) == [
        (TOPIC, p, 0, 2) for p in range(3)]
