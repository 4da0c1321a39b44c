"""A task's Kafka consumer (kwatermark.compiled's pool, kwatermark.consumer): kept by the
worker between tasks and reset, or, for a task of thousands of partitions, destroyed aside
after it with the next task's made ahead; the Python engine's likewise learns its topics
first and is closed aside. Every task reads exactly its ranges; the ground truth is what
the producer wrote."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest
from confluent_kafka import Consumer

from kwatermark import compiled
from kwatermark import pack as pack_module
from kwatermark.arrow import OutputLayout
from kwatermark.consumer import closed_aside
from kwatermark.errors import KWatermarkError
from kwatermark.offsets import PartitionState, RangeTask
from kwatermark.options import parse_options
from kwatermark.pack import PackReader
from kwatermark.reader import Decoders
from kwatermark.watermarks import NO_PARTITIONS
from tests.support.kafka import Record, TopicWriter


@pytest.mark.skipif(compiled.unavailable() is not None, reason="compiled engine not built")
def test_a_worker_keeps_its_consumer_between_tasks_and_nothing_of_the_last_task(
        broker, monkeypatch):
    """A Python worker's next task reads with the consumer its last task used (as Spark's
    source keeps consumers between tasks), reset: each task gets exactly its own range's
    records, after ranges ahead of, behind and overlapping what the consumer fetched last
    and on another partition. Without the reset (the last task's lanes and partitions left
    as they were) the third task got 50 of its 100 records. It also reads a partition
    again after a range that ended at the log's end, with records appended since. A task
    that fails, or that stops early, does not give its consumer back; one unused for a
    while is closed."""
    monkeypatch.setattr(compiled, "_clients", compiled._Clients())
    topic = broker.create_topic(2)
    TopicWriter(broker, topic).send([Record(p, 1_000 + i, value=f"{p}-{i}".encode())
                                     for i in range(3_000) for p in range(2)])
    options = parse_options({"kafka.bootstrap.servers": broker.bootstrap_servers,
                             "subscribe": topic, "readEngine": "compiled"})

    def pack(p: int, start: int, end: int) -> PackReader:
        task = RangeTask(topic, p, start, end, PartitionState(), True, None, NO_PARTITIONS)
        return PackReader(options, OutputLayout(), Decoders(), [task])

    kept = []
    steps = [(0, 0), (0, 2_000), (0, 50), (1, 0), (0, 100), (0, 2_900), (1, 2_900), (0, 3_000)]
    for p, start in steps:
        if start == 3_000:   # after a range that ended at the log's end: records since
            TopicWriter(broker, topic).send([Record(0, 5_000 + i, value=f"0-{i}".encode())
                                             for i in range(3_000, 3_100)])
        table = pa.Table.from_batches(list(pack(p, start, start + 100)))
        assert table.column("partition").to_pylist() == [p] * 100
        assert table.column("offset").to_pylist() == list(range(start, start + 100))
        assert table.column("value").to_pylist() == [f"{p}-{i}".encode()
                                                     for i in range(start, start + 100)]
        assert len(compiled._clients.kept) == 1
        kept.append(next(iter(compiled._clients.kept.values()))[0])
    assert all(client is kept[0] for client in kept), "a new consumer for every task"

    stopped = iter(pack(0, 0, 100))
    next(stopped)
    stopped.close()   # Spark stops reading (a limit): the consumer is closed, not kept
    assert not compiled._clients.kept and kept[0].handle == compiled.ffi.NULL
    with pytest.raises(KWatermarkError, match=f"topic {topic}, partition 0"):
        list(pack(0, 3_090, 3_110))   # past the log's end
    assert not compiled._clients.kept

    monkeypatch.setattr(compiled._Clients, "IDLE_S", 0.4)
    idle = compiled._Clients()
    monkeypatch.setattr(compiled, "_clients", idle)
    assert len(pa.Table.from_batches(list(pack(1, 0, 100)))) == 100
    client = next(iter(idle.kept.values()))[0]
    deadline = time.monotonic() + 10
    while client.handle != compiled.ffi.NULL and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not idle.kept and client.handle == compiled.ffi.NULL, "an idle consumer stays open"


@pytest.mark.skipif(compiled.unavailable() is not None, reason="compiled engine not built")
@pytest.mark.parametrize("stop_after_s", [60.0, 0.0])
def test_a_task_of_many_partitions_destroys_its_consumer_with_them_started(
        broker, monkeypatch, stop_after_s):
    """A task of more than DISCARD_PARTITIONS partitions (thousands, in use; 4 here) leaves
    the partitions whose ranges are done fetching, and destroys its consumer at the end
    instead of stopping them one by one: its records are still exactly its ranges', when the
    task ends within STOP_AFTER_S (nothing stopped) and when it runs longer (its finished
    partitions stopped then), with one range far longer than the others whose partitions
    go on past their ranges; its consumer is not kept but destroyed on a thread of its own,
    which then makes the worker's next task a consumer that knows the topic, and the next
    task reads on with that one."""
    monkeypatch.setattr(compiled, "_clients", compiled._Clients())
    monkeypatch.setattr(compiled, "DISCARD_PARTITIONS", 4)
    monkeypatch.setattr(compiled, "STOP_AFTER_S", stop_after_s)
    topic = broker.create_topic(6)
    writer = TopicWriter(broker, topic)
    writer.send([Record(p, 1_000 + i, value=f"{p}-{i}".encode())
                 for i in range(3_000) for p in range(6)])
    options = parse_options({"kafka.bootstrap.servers": broker.bootstrap_servers,
                             "subscribe": topic, "readEngine": "compiled",
                             "arrow.maxRecordsPerBatch": "500"})
    made_ahead = []
    # (the longest range of each task the same length: the same prefetch, so the same
    # consumer configuration, as a steady stream's micro-batches ask)
    for spans in ([(0, 0, 1_200)] + [(p, 0, 3) for p in range(1, 6)],
                  [(0, 1_200, 2_400)] + [(p, 3, 40) for p in range(1, 6)]):
        tasks = [RangeTask(topic, p, a, b, PartitionState(), True, None, NO_PARTITIONS)
                 for p, a, b in spans]
        before = [client for client, _ in compiled._clients.kept.values()]
        table = pa.Table.from_batches(list(PackReader(options, OutputLayout(), Decoders(),
                                                      tasks)),
                                      schema=OutputLayout().schema())
        got = sorted(zip(table.column("partition").to_pylist(),
                         table.column("offset").to_pylist(),
                         table.column("value").to_pylist()))
        assert got == [(p, i, f"{p}-{i}".encode()) for p, a, b in spans
                       for i in range(a, b)]
        assert before == made_ahead
        assert all(client.handle == compiled.ffi.NULL for client in before), \
            "the consumer made ahead was not the one this task read and destroyed"
        # the task ended without waiting for its consumer's destroy, which still ends
        assert closed_aside(30), "a discarded consumer never closed"
        made_ahead = [client for client, _ in compiled._clients.kept.values()]
        assert len(made_ahead) == 1 and made_ahead[0] not in before
        assert made_ahead[0].handle != compiled.ffi.NULL
        assert made_ahead[0].described == {topic}


class _Recorded:
    """A real confluent-kafka consumer whose calls are recorded: (method, thread)."""

    def __init__(self, consumer: Consumer, calls: list):
        self._consumer, self._calls = consumer, calls

    def __getattr__(self, name: str):
        method = getattr(self._consumer, name)

        def call(*args, **kwargs):
            self._calls.append((name, threading.current_thread()))
            return method(*args, **kwargs)
        return call


def test_a_python_task_of_many_partitions_learns_its_topics_and_closes_aside(broker,
                                                                             monkeypatch):
    """The Python engine's task of more than DISCARD_PARTITIONS partitions (thousands, in
    use; 4 here) asks its topic's metadata before its partitions' offsets (a consumer that
    learns a 4,096-partition topic from its first offsets request waited up to 0.77 s), and
    its consumer is closed on a thread of its own after the task's last row, not by the
    task (~170 ms at 2,048 partitions); a task of fewer closes its own. Both read exactly
    their ranges."""
    monkeypatch.setattr(compiled, "DISCARD_PARTITIONS", 4)
    topic = broker.create_topic(6)
    TopicWriter(broker, topic).send([Record(p, 1_000 + i, value=f"{p}-{i}".encode())
                                     for i in range(50) for p in range(6)])
    options = parse_options({"kafka.bootstrap.servers": broker.bootstrap_servers,
                             "subscribe": topic, "readEngine": "python"})
    opened = pack_module.open_consumer
    for partitions in (6, 3):
        calls: list = []
        monkeypatch.setattr(pack_module, "open_consumer",
                            lambda *args, calls=calls: _Recorded(opened(*args), calls))
        spans = [(p, 5, 20 + p) for p in range(partitions)]
        tasks = [RangeTask(topic, p, a, b, PartitionState(), True, None, NO_PARTITIONS)
                 for p, a, b in spans]
        table = pa.Table.from_batches(list(PackReader(options, OutputLayout(), Decoders(),
                                                      tasks)),
                                      schema=OutputLayout().schema())
        read_by = [name for name, _ in calls]
        assert closed_aside(30), "a consumer closed aside never closed"
        assert sorted(zip(table.column("partition").to_pylist(),
                          table.column("offset").to_pylist(),
                          table.column("value").to_pylist())) == \
            [(p, i, f"{p}-{i}".encode()) for p, a, b in spans for i in range(a, b)]
        closers = [thread for name, thread in calls if name == "close"]
        assert len(closers) == 1
        if partitions > 4:
            assert read_by.index("list_topics") < read_by.index("offsets_for_times")
            assert closers[0] is not threading.current_thread()
        else:
            assert "list_topics" not in read_by
            assert closers[0] is threading.current_thread(), "a small task closes its own"
