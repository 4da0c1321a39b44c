"""A task's Kafka consumer (kwatermark.compiled's pool, kwatermark.consumer): kept by the
worker between tasks and reset, or, for a task of thousands of partitions, kept with its
partitions paused for the next task to resume; the Python engine's learns its topics first
and is closed aside. Every task reads exactly its ranges; the ground truth is what
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


def read_exactly(options, topic: str, spans: list[tuple[int, int, int]]) -> None:
    """Read ``spans`` (partition, start, end) of ``topic`` as one Spark task does (one
    ``PackReader``) and check that it got exactly their records, each valued ``"p-i"``
    by its writer."""
    tasks = [RangeTask(topic, p, a, b, PartitionState(), True, None, NO_PARTITIONS)
             for p, a, b in spans]
    table = pa.Table.from_batches(list(PackReader(options, OutputLayout(), Decoders(), tasks)),
                                  schema=OutputLayout().schema())
    assert sorted(zip(table.column("partition").to_pylist(),
                      table.column("offset").to_pylist(),
                      table.column("value").to_pylist())) == \
        [(p, i, f"{p}-{i}".encode()) for p, a, b in sorted(spans) for i in range(a, b)]


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
def test_a_task_of_many_partitions_parks_them_for_the_next(broker, monkeypatch):
    """A task of more than MANY_PARTITIONS partitions (thousands, in use; 5 or 6 here)
    leaves the partitions whose ranges are done fetching and, at its end, pauses them where
    they stand instead of stopping them: the worker keeps its consumer, and the next task
    resumes each partition whose range begins where the last one's ended, with what was
    fetched past that end. Every task's records are exactly its ranges': ranges that go on
    (resumed; one a task also sought, to wake the broker's fetching), a range behind and
    one ahead of where the partition stood (sought), a partition parked through a task that
    did not read it, a partition whose log runs far past its short range (it keeps what it
    may, which serves its next ranges; sought once they run past it), one whose carry holds
    its whole next range (it stays paused through the task: nothing fetched again, no pause
    at the end), records appended after a range that ended at
    the log's end, and a task that runs longer than STOP_AFTER_S (its finished partitions
    paused as they finish, so parked for the next task, which resumes them). A task that
    fails closes its consumer; the next makes a new one."""
    monkeypatch.setattr(compiled, "_clients", compiled._Clients())
    monkeypatch.setattr(compiled, "MANY_PARTITIONS", 4)
    topic = broker.create_topic(6)
    writer = TopicWriter(broker, topic)
    written = [0] * 6

    def log_to(p: int, end: int) -> None:
        writer.send([Record(p, 1_000 + i, value=f"{p}-{i}".encode())
                     for i in range(written[p], end)])
        written[p] = max(written[p], end)

    options = parse_options({"kafka.bootstrap.servers": broker.bootstrap_servers,
                             "subscribe": topic, "readEngine": "compiled",
                             "arrow.maxRecordsPerBatch": "500",
                             "kafkaConsumer.pollTimeoutMs": "20000"})

    def read(spans: list[tuple[int, int, int]], grow: bool = True
             ) -> tuple[compiled._Client, int]:
        for p, _, end in spans:
            if grow and written[p] < end:
                log_to(p, end)
        read_exactly(options, topic, spans)
        (client, _), = compiled._clients.kept.values()
        return client, (compiled.lib.kw_resumed(client.handle),
                        compiled.lib.kw_slept(client.handle))

    log_to(0, 3_000)   # partition 0's log runs on 1,800 records past its first range
    log_to(1, 900)     # partition 1's, 897 past its first range of 3: more than it keeps
    # (the longest range of each task the same length: the same prefetch, so the same
    # consumer configuration, as a steady stream's micro-batches ask)
    monkeypatch.setattr(compiled, "STOP_AFTER_S", 60)
    first, _ = read([(0, 0, 1_200)] + [(p, 0, 3) for p in range(1, 6)])
    # a task's ranges; how many of its partitions go on where they stood (resumed, or kept
    # paused because what they carry holds their ranges) and how many of those stay paused;
    # STOP_AFTER_S
    steps = [
        # every range goes on where the last ended; partitions 0 and 1 carry their whole
        # ranges (partition 1 the first 64 of the 897 records its log runs past its first
        # range: all it may keep), so they stay paused
        ([(0, 1_200, 2_400)] + [(p, 3, 40) for p in range(1, 6)], (6, 2), 60),
        # partition 0 behind where it stood, 1 ahead of it: sought
        ([(0, 100, 1_300), (1, 2_000, 2_010)] + [(p, 40, 45) for p in range(2, 6)],
         (4, 0), 60),
        # partition 0 not read: it stays parked
        ([(1, 2_010, 2_020)] + [(p, 45, 1_245) for p in range(2, 6)], (5, 0), 60),
        # partition 0 again where it stood, from its carry (paused); 5 to the log's end;
        # the others paused as they finish, past STOP_AFTER_S (not stopped: they stay parked)
        ([(0, 1_300, 2_500), (1, 2_020, 2_030)] + [(p, 1_245, 1_250) for p in (2, 3, 4)]
         + [(5, 1_245, 3_000)], (6, 1), 0),
        # so every one resumes; records appended to partition 5 after it ended at the log's
        # end
        ([(0, 2_500, 2_510)] + [(p, 1_250, 1_260) for p in (2, 3, 4)]
         + [(1, 2_030, 2_040), (5, 3_000, 4_200)], (6, 1), 60),
        # partition 0's short range left 490 records of its log past it: it keeps the first
        # 64, which hold its next range, so it stays paused
        ([(0, 2_510, 2_520)] + [(p, 1_260, 1_270) for p in (2, 3, 4)]
         + [(1, 2_040, 2_050), (5, 4_200, 5_400)], (6, 1), 60),
    ]
    for spans, resumed, stop_after_s in steps:
        monkeypatch.setattr(compiled, "STOP_AFTER_S", stop_after_s)
        client, resumed_now = read(spans)
        assert client is first and client.handle != compiled.ffi.NULL
        assert resumed_now == resumed, spans

    # A task that is not parked (MANY_PARTITIONS above its partitions) on the same consumer:
    # partition 3 reads from what it carries, paused; the task's end stops every partition,
    # that one too, and the next task starts each again where its range begins (librdkafka
    # keeps a pause through a stop and a start: left paused, partition 3 would read nothing
    # and the task stall). Partition 2's log stays at 1,270 (the failing task below).
    # First, partition 0's range runs past the 64 records it may keep: it was paused when it
    # had kept them (and what that poll handed over past them), where librdkafka then stood,
    # so it goes on from its carry (resumed, or kept paused if the carry holds the range).
    # Left fetching, it ran to its log's end, kept 64 and was sought (4 resumed).
    log_to(3, 1_300)   # 20 records past its next range: it keeps them
    client, resumed_now = read([(0, 2_520, 2_600), (1, 2_050, 2_060), (2, 1_260, 1_270)]
                               + [(p, 1_270, 1_280) for p in (3, 4)] + [(5, 5_400, 6_600)])
    assert client is first and resumed_now[0] == 5
    monkeypatch.setattr(compiled, "MANY_PARTITIONS", 10)
    client, resumed_now = read([(0, 2_500, 2_510), (1, 2_060, 2_070), (2, 1_260, 1_270)]
                               + [(p, 1_280, 1_290) for p in (3, 4)] + [(5, 6_600, 7_800)])
    assert client is first and resumed_now == (4, 1)
    monkeypatch.setattr(compiled, "MANY_PARTITIONS", 4)
    client, resumed_now = read([(0, 2_550, 2_560), (1, 2_070, 2_080), (2, 1_260, 1_270)]
                               + [(p, 1_290, 1_300) for p in (3, 4)] + [(5, 7_800, 9_000)])
    assert client is first and resumed_now == (0, 0)

    with pytest.raises(KWatermarkError, match=f"topic {topic}, partition 2"):
        read([(0, 2_560, 2_570), (1, 2_070, 2_080), (3, 1_290, 1_300), (4, 1_290, 1_300),
              (2, 1_270, 2_470)], grow=False)   # partition 2's log ends at 1,270
    assert not compiled._clients.kept and first.handle == compiled.ffi.NULL
    again, resumed_now = read([(0, 1_500, 2_700), (1, 2_040, 2_050)]
                              + [(p, 1_260, 1_270) for p in (2, 3, 4)], grow=False)
    assert again is not first and resumed_now == (0, 0)


@pytest.mark.skipif(compiled.unavailable() is not None, reason="compiled engine not built")
def test_partitions_parked_through_a_task_of_few_partitions_read_again(broker, monkeypatch):
    """A worker's tasks of more and of fewer than MANY_PARTITIONS partitions share its kept
    consumer where their settings match (packs over 16 topics at 4,096 partitions: their
    bounds move between batches). A task of few partitions leaves the consumer reset at its
    end, which stops the partitions an earlier task parked and it did not read; a later
    task that reads them gets their ranges' records. Stopped while paused (librdkafka keeps
    a pause through a stop and a start), they fetched nothing: the task stalled for
    kafkaConsumer.pollTimeoutMs and failed, and so did the query."""
    monkeypatch.setattr(compiled, "_clients", compiled._Clients())
    # Ranges of MANY_PREFETCH records over 5 to 8 partitions: a task of many partitions
    # prefetches at least that many a partition, so both kinds ask the same settings.
    n = compiled.MANY_PREFETCH
    topic = broker.create_topic(8)
    TopicWriter(broker, topic).send([Record(p, 1_000 + i, value=f"{p}-{i}".encode())
                                     for i in range(4 * n) for p in range(8)])
    options = parse_options({"kafka.bootstrap.servers": broker.bootstrap_servers,
                             "subscribe": topic, "readEngine": "compiled",
                             "kafkaConsumer.pollTimeoutMs": "5000"})

    def read(spans: list[tuple[int, int, int]], many: int) -> compiled._Client:
        monkeypatch.setattr(compiled, "MANY_PARTITIONS", many)
        read_exactly(options, topic, spans)
        (client, _), = compiled._clients.kept.values()
        return client

    parked = read([(p, 0, n) for p in range(6)], many=4)   # parked at its end
    few = read([(p, n, 2 * n) for p in (1, 2, 3)] + [(p, 0, n) for p in (6, 7)], many=10)
    assert few is parked   # its end stopped partitions 0, 4 and 5, parked and unread
    again = read([(p, n, 2 * n) for p in (0, 4, 5)] + [(p, n, 2 * n) for p in (6, 7)],
                 many=10)
    assert again is parked
    assert read([(p, 2 * n, 3 * n) for p in range(6)], many=4) is parked


@pytest.mark.skipif(compiled.unavailable() is not None, reason="compiled engine not built")
def test_parked_partitions_a_few_records_behind_their_ranges_are_resumed(broker, monkeypatch):
    """Spark gives a micro-batch's tasks to whichever Python worker is free, and each worker
    keeps its own consumer: when a pack's task runs on the other worker, that worker's parked
    partitions stand where its own last task of them ended, a batch or more behind the new
    ranges. Those at most KW_CATCH_UP (256) records behind are resumed and read up to their
    ranges, the records between dropped, instead of sought (a pass of librdkafka's broker
    thread over every partition the consumer knows, each): a task of 4,096 partitions of a
    stream read as it is written took 655 ms on the other worker sought, 431 resumed (377 and
    396 on the same worker; bench/bench_worker_swap.py). One further behind is sought. Every
    task reads exactly its ranges, read as the log is written (each range ends at the log's
    end)."""
    monkeypatch.setattr(compiled, "MANY_PARTITIONS", 4)
    workers = [compiled._Clients(), compiled._Clients()]
    topic = broker.create_topic(6)
    writer = TopicWriter(broker, topic)
    written = [0] * 6
    options = parse_options({"kafka.bootstrap.servers": broker.bootstrap_servers,
                             "subscribe": topic, "readEngine": "compiled",
                             "kafkaConsumer.pollTimeoutMs": "20000"})

    def read(worker: int, spans: list[tuple[int, int, int]]) -> int:
        for p, _, end in spans:   # the log ends where the range does
            writer.send([Record(p, 1_000 + i, value=f"{p}-{i}".encode())
                         for i in range(written[p], end)])
            written[p] = max(written[p], end)
        monkeypatch.setattr(compiled, "_clients", workers[worker])
        read_exactly(options, topic, spans)
        (client, _), = workers[worker].kept.values()
        return compiled.lib.kw_resumed(client.handle)

    try:
        assert read(0, [(p, 0, 10) for p in range(6)]) == 0    # started, then parked
        assert read(1, [(p, 10, 20) for p in range(6)]) == 0   # the other worker's first
        # worker 0's partitions stand at 10, their ranges begin at 20: resumed, every one
        assert read(0, [(p, 20, 30) for p in range(6)]) == 6
        assert read(1, [(0, 30, 40)] + [(p, 30, 90) for p in range(1, 6)]) == 6
        # (ranges of at most 64 records: one consumer configuration, compiled.MANY_PREFETCH)
        for start in range(90, 330, 60):
            assert read(1, [(p, start, start + 60) for p in range(1, 6)]) == 5
        # worker 0's stand at 30: partition 0's range 10 records on, the others' 300
        assert read(0, [(0, 40, 50)] + [(p, 330, 340) for p in range(1, 6)]) == 1
        assert read(0, [(0, 50, 60)] + [(p, 340, 350) for p in range(1, 6)]) == 6
    finally:
        for pool in workers:
            pool.close_all()


@pytest.mark.skipif(compiled.unavailable() is not None, reason="compiled engine not built")
def test_a_backlog_read_in_short_ranges_goes_on_where_each_partition_was_held(broker,
                                                                              monkeypatch):
    """A backlog read in micro-batches (AvailableNow over a topic whose logs run far past a
    batch's ranges): each partition a task of many partitions reads is fetched past its
    range, and once it has kept the 64 records it may (what the same poll handed over past
    them too) it is paused there. Its worker's next task goes on from what it kept, and a
    task on the other worker's consumer, which last read it batches before, catches up from
    where that consumer held it. Left fetching, each partition ran to its log's end, kept 64
    and was sought by every later task on either worker (a pass of librdkafka's broker thread
    over every partition it knows, each): at 4,096 partitions, 1.2-1.7 s batches. Every task
    reads exactly its ranges."""
    monkeypatch.setattr(compiled, "MANY_PARTITIONS", 4)
    workers = [compiled._Clients(), compiled._Clients()]
    topic = broker.create_topic(6)
    TopicWriter(broker, topic).send([Record(p, 1_000 + i, value=f"{p}-{i}".encode())
                                     for i in range(2_000) for p in range(6)])
    # a poll hands over at most 50 records: a partition held keeps at most 64 + 50 past its
    # range, so a consumer stands between its last range's end and 114 past it
    options = parse_options({"kafka.bootstrap.servers": broker.bootstrap_servers,
                             "subscribe": topic, "readEngine": "compiled",
                             "arrow.maxRecordsPerBatch": "50",
                             "kafkaConsumer.pollTimeoutMs": "20000"})

    def read(worker: int, start: int) -> int:
        monkeypatch.setattr(compiled, "_clients", workers[worker])
        read_exactly(options, topic, [(p, start, start + 10) for p in range(6)])
        (client, _), = workers[worker].kept.values()
        return compiled.lib.kw_resumed(client.handle)

    try:
        assert read(0, 0) == 0     # started
        assert read(1, 10) == 0    # the other worker's first
        # each range 200 records past where the consumer's last ended (so past what it
        # may have kept, but at most KW_CATCH_UP past where it stands): caught up
        assert read(0, 200) == 6
        assert read(0, 210) == 6   # from what it kept, or where it stands
        assert read(1, 220) == 6
        assert read(0, 420) == 6
    finally:
        for pool in workers:
            pool.close_all()


def _six_partitions(broker, records: int, engine: str):
    """A topic of 6 partitions holding ``records`` records each (value ``"p-i"``), and the
    options that read it with ``engine``."""
    topic = broker.create_topic(6)
    TopicWriter(broker, topic).send([Record(p, 1_000 + i, value=f"{p}-{i}".encode())
                                     for i in range(records) for p in range(6)])
    return topic, parse_options({"kafka.bootstrap.servers": broker.bootstrap_servers,
                                 "subscribe": topic, "readEngine": engine})


@pytest.mark.skipif(compiled.unavailable() is not None, reason="compiled engine not built")
def test_a_steady_streams_tasks_of_many_partitions_share_one_parked_consumer(broker,
                                                                            monkeypatch):
    """Successive tasks of many partitions whose longest range differs by a record (a
    steady stream's micro-batches at thousands of partitions: 2, 3 or 4 records a range)
    ask for the same consumer configuration, so the worker's one kept consumer serves them
    and resumes every partition; with the prefetch following the longest range each took
    a consumer of its own, whose partitions stood behind."""
    monkeypatch.setattr(compiled, "_clients", compiled._Clients())
    monkeypatch.setattr(compiled, "MANY_PARTITIONS", 4)
    topic, options = _six_partitions(broker, 9, "compiled")
    clients, resumed = [], []
    for start, end in ((0, 2), (2, 5), (5, 7), (7, 9)):
        tasks = [RangeTask(topic, p, start, end, PartitionState(), True, None, NO_PARTITIONS)
                 for p in range(6)]
        table = pa.Table.from_batches(list(PackReader(options, OutputLayout(), Decoders(),
                                                      tasks)),
                                      schema=OutputLayout().schema())
        assert sorted(zip(table.column("partition").to_pylist(),
                          table.column("offset").to_pylist())) == \
            [(p, i) for p in range(6) for i in range(start, end)]
        (client, _), = compiled._clients.kept.values()
        clients.append(client)
        resumed.append(compiled.lib.kw_resumed(client.handle))
    assert all(client is clients[0] for client in clients)
    assert resumed == [0, 6, 6, 6]


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
    """The Python engine's task of more than MANY_PARTITIONS partitions (thousands, in
    use; 4 here) asks its topic's metadata before its partitions' offsets (a consumer that
    learns a 4,096-partition topic from its first offsets request waited up to 0.77 s), and
    its consumer is closed on a thread of its own after the task's last row, not by the
    task (~170 ms at 2,048 partitions); a task of fewer closes its own. Both read exactly
    their ranges."""
    monkeypatch.setattr(compiled, "MANY_PARTITIONS", 4)
    topic, options = _six_partitions(broker, 50, "python")
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
