"""A Spark task's partition crosses to the executor as Spark pickles it (cloudpickle), whole,
and its cost does not grow with a pickler callback per range (issue 36)."""

from __future__ import annotations

from pyspark.cloudpickle import cloudpickle
from pyspark.serializers import CloudPickleSerializer

from kwatermark.offsets import PartitionState, RangeTask
from kwatermark.source import HeartbeatPartition, RangePartition


def _pack(ranges: int) -> tuple:
    states = [
        PartitionState(),
        PartitionState(generator={"max_ts": 1_700_000_000_000, "seen": [1, 2]},
                       max_event_ms=1_700_000_000_000, advanced_ms=5, last_read_ms=9,
                       idle="advance", held=True),
        PartitionState(generator=[3, None, "plug-in"], idle="exclude"),
    ]
    return tuple(RangeTask("events" if p % 2 else "other", p, 10 * p, 10 * p + 3,
                           states[p % 3], p % 4 != 0, None if p % 5 else 77, -1001,
                           None if p % 2 else 12)
                 for p in range(ranges))


def test_a_range_partition_reaches_the_executor_whole():
    partition = RangePartition(_pack(7), True, "/tmp/mark", "key-1")
    serializer = CloudPickleSerializer()
    back = serializer.loads(serializer.dumps(partition))
    assert type(back) is RangePartition
    assert back.tasks == partition.tasks
    assert back.value == partition.tasks   # InputPartition's own field
    assert (back.publish, back.ledger_mark, back.ledger_key) == (True, "/tmp/mark", "key-1")
    assert back.tasks[1].state.generator == {"max_ts": 1_700_000_000_000, "seen": [1, 2]}
    batch = RangePartition(_pack(2))
    again = serializer.loads(serializer.dumps(batch))
    assert (again.tasks, again.publish, again.ledger_mark, again.ledger_key) == (
        batch.tasks, False, None, None)
    beat = serializer.loads(serializer.dumps(HeartbeatPartition(1234)))
    assert beat.watermark_ms == 1234


def test_pickling_a_pack_does_not_call_back_into_python_per_range(monkeypatch):
    calls = []
    original = cloudpickle.Pickler.reducer_override

    def counting(self, obj):
        calls.append(type(obj).__name__)
        return original(self, obj)

    monkeypatch.setattr(cloudpickle.Pickler, "reducer_override", counting)
    serializer = CloudPickleSerializer()
    small = serializer.dumps(RangePartition(_pack(4), True, "m", "k"))
    few = len(calls)
    calls.clear()
    large = serializer.loads(serializer.dumps(RangePartition(_pack(4096), True, "m", "k")))
    assert len(large.tasks) == 4096 and small
    assert len(calls) == few <= 4, calls[:10]
