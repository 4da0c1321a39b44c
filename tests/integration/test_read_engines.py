"""The two read engines (DESIGN §19): ``readEngine=compiled`` (kwatermark.compiled, librdkafka
into Arrow buffers) and ``readEngine=python`` (confluent-kafka's message objects) return the
same Arrow rows for the same ranges: transaction markers, aborted records under both
isolation levels, headers, null keys and values, ~1 MB values, one range or a pack of them.
The ground truth for offsets and values is what the producer wrote, not either engine."""

from __future__ import annotations

import gc
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Consumer
from confluent_kafka import TopicPartition as KafkaTP

from kwatermark import compiled, pack
from kwatermark.arrow import OutputLayout
from kwatermark.consumer import closed_aside, task_conf
from kwatermark.errors import BrokerError, DataLossError, KWatermarkError, OptionError
from kwatermark.offsets import PartitionState, RangeTask
from kwatermark.options import parse_options
from kwatermark.pack import PackReader
from kwatermark.reader import Decoders
from kwatermark.retries import leader_of
from kwatermark.watermarks import NO_PARTITIONS
from tests.support.kafka import Record, TestBroker, TopicWriter
from tests.support.transactions import TransactionalWriter, end_offsets

ROOT = Path(__file__).resolve().parents[2]
MIB = 900_000  # about 1 MB: under the producer's default message.max.bytes (1,000,000)


def c_compiler() -> str | None:
    """The C compiler Python's own build uses (sysconfig's CC), if the machine has it."""
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(cc)


def test_the_compiled_engine_is_built_wherever_a_c_compiler_is():
    """`pip install -e ".[test]"` builds the extension where a C compiler exists (CI's
    machines have one): a silent fall-back to the Python engine would otherwise pass every
    read test twice on it. Without one, the engine says why it is not there."""
    if c_compiler():
        assert compiled.unavailable() is None
    else:
        assert "not built" in (compiled.unavailable() or "")


def test_the_read_tests_pass_on_the_python_engine(broker):
    """The suite reads with the default engine (compiled where built); the main read tests
    run again, in a pytest of their own against the same broker, with the Python engine
    (``KWATERMARK_READ_ENGINE=python``, the option's default): both engines must give the
    rows those tests assert."""
    env = dict(os.environ, KWATERMARK_READ_ENGINE="python",
               KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap_servers)
    files = ["tests/integration/test_source.py", "tests/integration/test_transactions.py",
             "tests/integration/test_watermarks.py"]
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *files], check=False, capture_output=True, text=True, env=env,
                          cwd=str(ROOT), timeout=1500)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    passed = re.search(r"(\d+) passed", output)
    assert passed and int(passed.group(1)) >= 30, output[-3000:]
    assert not re.search(r"\d+ (skipped|failed|error)", output), output[-3000:]


def test_python_engine_chosen_and_compiled_refused_where_not_built(monkeypatch):
    options = parse_options({"kafka.bootstrap.servers": "localhost:1", "subscribe": "t",
                             "readEngine": "python"})
    assert compiled.use_compiled(options) is False
    monkeypatch.setitem(compiled._state, "reason", "kwatermark._fastread is not built (test)")
    wanted = parse_options({"kafka.bootstrap.servers": "localhost:1", "subscribe": "t",
                            "readEngine": "compiled"})
    with pytest.raises(OptionError, match="option readEngine=compiled: .*not built"):
        compiled.use_compiled(wanted)
    with pytest.raises(OptionError, match="option readEngine: unknown value 'rust'"):
        parse_options({"kafka.bootstrap.servers": "localhost:1", "subscribe": "t",
                       "readEngine": "rust"})


def mixed_topic(broker) -> TransactionalWriter:
    """Two partitions: committed and aborted transactions (markers, aborted records), then
    plain records with headers, null keys, null values, empty values and ~1 MB values."""
    writer = TransactionalWriter(broker, broker.create_topic(2))
    for t in range(4):
        batch = [Record(p, 1_000 * (t + 1) + i, value=f"t{t}-{p}-{i}".encode(),
                        key=None if i % 5 == 0 else f"k{i}".encode())
                 for i in range(30) for p in range(2)]
        writer.commit(batch) if t % 2 == 0 else writer.abort(batch)
    plain = []
    for p in range(2):
        for i in range(40):
            value = (None if i % 7 == 3 else b"" if i % 7 == 4
                     else bytes([i % 251]) * MIB if i % 13 == 5 else f"plain-{i}".encode())
            headers = (None if i % 3 == 0 else [("h", f"v{i}".encode()), ("n", None)]
                       if i % 3 == 1 else [("only", b"x")])
            plain.append(Record(p, 9_000 + i, value=value,
                                key=None if i % 4 == 0 else f"pk{i}".encode(),
                                headers=headers))
    writer.plain(plain)
    return writer


def read(broker, topic: str, engine: str, isolation: str, spans, headers: bool) -> pa.Table:
    options = parse_options({"kafka.bootstrap.servers": broker.bootstrap_servers,
                             "subscribe": topic, "kafka.isolation.level": isolation,
                             "includeHeaders": str(headers).lower(), "readEngine": engine,
                             "arrow.maxRecordsPerBatch": "17"})
    layout = OutputLayout(include_headers=headers)
    tasks = [RangeTask(topic, p, a, b, PartitionState(), True, None, NO_PARTITIONS)
             for p, a, b in spans]
    pack = PackReader(options, layout, Decoders(), tasks)
    batches = list(pack)
    table = pa.Table.from_batches(batches, schema=layout.schema())
    return table.sort_by([("partition", "ascending"), ("offset", "ascending")]), [
        record for _, record in pack.progress]


@pytest.mark.skipif(compiled.unavailable() is not None, reason="compiled engine not built")
@pytest.mark.parametrize("isolation", ["read_uncommitted", "read_committed"])
def test_both_engines_give_identical_arrow_rows(broker, isolation):
    writer = mixed_topic(broker)
    ends = end_offsets(broker, writer.topic, 2)
    visible = writer.everything if isolation == "read_uncommitted" else writer.committed
    truth = sorted((w.partition, w.offset, w.key, w.value) for w in visible)
    cases = [
        [(0, 0, ends[0])],                                     # one range, ends on the log end
        [(0, 0, ends[0]), (1, 0, ends[1])],                    # a pack of two partitions
        [(0, 0, 31), (0, 31, 62), (0, 62, ends[0]), (1, 15, 95)],  # sub-ranges on markers
    ]
    for spans in cases:
        for headers in (False, True):
            python, python_progress = read(broker, writer.topic, "python", isolation, spans,
                                           headers)
            fast, fast_progress = read(broker, writer.topic, "compiled", isolation, spans,
                                       headers)
            assert fast.equals(python), (spans, headers)
            assert fast_progress == python_progress
            wanted = [t for t in truth if any(p == t[0] and a <= t[1] < b
                                              for p, a, b in spans)]
            got = list(zip(fast.column("partition").to_pylist(),
                           fast.column("offset").to_pylist(), fast.column("key").to_pylist(),
                           fast.column("value").to_pylist()))
            assert got == wanted, (spans, headers)
    assert any(v is not None and len(v) == MIB for *_, v in truth)


@pytest.mark.skipif(compiled.unavailable() is not None, reason="compiled engine not built")
def test_both_engines_name_the_partition_and_its_leader_when_offsets_fail(broker):
    """A task's offsets query that fails refreshes the topic's metadata and, when no retry
    mends it, names topic, partition and broker: the same on both engines (the compiled
    engine's client once had no metadata call, so its first failed query, as a rolling
    restart gives, ended the query with an AttributeError)."""
    topic = broker.create_topic(1)
    TopicWriter(broker, topic).send([Record(0, 1_000, value=b"a")])
    for engine in ("python", "compiled"):
        options = parse_options({"kafka.bootstrap.servers": broker.bootstrap_servers,
                                 "subscribe": topic, "readEngine": engine,
                                 "kafkaConsumer.pollTimeoutMs": "2000"})
        task = RangeTask(topic, 3, 0, 1, PartitionState(), True, None, NO_PARTITIONS)
        pack = PackReader(options, OutputLayout(), Decoders(), [task])
        with pytest.raises(BrokerError) as failed:
            list(pack)
        assert f"topic {topic}, partition 3: cannot fetch offsets from " \
               f"kafka.bootstrap.servers={broker.bootstrap_servers!r}" in str(failed.value)
        assert "AttributeError" not in str(failed.value)
    conf = task_conf(parse_options({"kafka.bootstrap.servers": broker.bootstrap_servers,
                                    "subscribe": topic}), 1)
    conf.pop("group.id")
    conf.pop("logger", None)
    client = compiled._Client(conf, False, 100)
    python = Consumer(task_conf(parse_options({"kafka.bootstrap.servers":
                                                broker.bootstrap_servers,
                                                "subscribe": topic}), 1))
    try:
        named = {leader_of(c, topic, 0) for c in (client, python)}
    finally:
        client.close()
        python.close()
    port = broker.bootstrap_servers.split(",")[0].rsplit(":", 1)[1]
    assert len(named) == 1 and re.fullmatch(rf"leader node \d+ at [\w.]+:{port}",
                                            named.pop()), named


@pytest.mark.skipif(compiled.unavailable() is not None, reason="compiled engine not built")
def test_a_pack_of_many_ranges_reads_every_range_on_both_engines(broker):
    """A pack of 16 ranges, some starting mid-partition, read ten times on each engine:
    every record of every range each time. The compiled engine once kept the addresses of
    its first 8 lanes from before the lane array grew, and ranges ended unread (records
    silently skipped), in some reads and not others."""
    topic = broker.create_topic(16)
    writer = TopicWriter(broker, topic)
    writer.send([Record(p, 1_000 + i * (10 + p), value=f"{p}-{i}".encode())
                 for i in range(9) for p in range(16)])
    spans = [(p, 5 if p < 8 else 4, 9) for p in range(16)]
    truth = sorted((r.partition, i, r.value) for p, a, b in spans
                   for i, r in enumerate(r for r in writer.produced if r.partition == p)
                   if a <= i < b)
    for engine in ("compiled", "python"):
        for _ in range(10):
            table, _progress = read(broker, topic, engine, "read_uncommitted", spans, False)
            got = list(zip(table.column("partition").to_pylist(),
                           table.column("offset").to_pylist(),
                           table.column("value").to_pylist()))
            assert got == truth, engine


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
    opened = pack.open_consumer
    for partitions in (6, 3):
        calls: list = []
        monkeypatch.setattr(pack, "open_consumer",
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


@pytest.mark.parametrize("engine", ["python"] + (
    ["compiled"] if compiled.unavailable() is None else []))
def test_records_gone_before_a_task_reads_them_are_data_loss_on_both_engines(broker, engine):
    """Records planned and then deleted before the task reads them (retention, here
    ``delete_records``), and a range that ends past its partition's end (a topic recreated
    with fewer records): with ``failOnDataLoss=true`` the task fails naming the topic, the
    partition and the lost offsets; with false it warns and reads every record still there,
    sub-ranges of one partition included. The compiled engine asks a partition's offsets
    only once its answers say records are missing (out of range, or its end before the
    range's), not before every task."""
    if broker.kind == "tansu":
        pytest.skip("the Tansu test broker does not delete records (DeleteRecords)")
    topic = broker.create_topic(2)
    writer = TopicWriter(broker, topic)
    writer.send([Record(p, 1_000 + i, value=f"{p}-{i}".encode())
                 for i in range(20) for p in range(2)])
    admin = broker.admin()
    for future in admin.delete_records([KafkaTP(topic, 0, 8)]).values():
        assert future.result(30).low_watermark == 8

    def pack(fail: bool, *spans) -> PackReader:
        options = parse_options({"kafka.bootstrap.servers": broker.bootstrap_servers,
                                 "subscribe": topic, "readEngine": engine,
                                 "failOnDataLoss": str(fail).lower()})
        tasks = [RangeTask(topic, p, a, b, PartitionState(), True, None, NO_PARTITIONS)
                 for p, a, b in spans]
        return PackReader(options, OutputLayout(), Decoders(), tasks)

    with pytest.raises(DataLossError, match=rf"topic {topic}, partition 0: offsets \[2, 8\) "
                                            rf"are no longer available \(earliest is 8;"):
        list(pack(True, (0, 2, 15)))
    with pytest.raises(DataLossError, match=rf"topic {topic}, partition 1: offsets \[20, 25\) "
                                            rf"were planned but the partition now ends at 20"):
        list(pack(True, (1, 5, 25)))
    spans = [(0, 0, 5), (0, 5, 12), (0, 12, 15), (1, 5, 25)]
    table = pa.Table.from_batches(list(pack(False, *spans)), schema=OutputLayout().schema())
    got = sorted(zip(table.column("partition").to_pylist(), table.column("offset").to_pylist(),
                     table.column("value").to_pylist()))
    kept = {0: range(8, 15), 1: range(5, 20)}   # what delete_records and the log's end left
    assert got == [(p, i, f"{p}-{i}".encode()) for p in (0, 1) for i in kept[p]]


def test_a_task_whose_brokers_are_all_down_fails_once_poll_timeout_passes_on_both_engines():
    """A pack's offsets query with every broker down fails once kafkaConsumer.pollTimeoutMs
    passes without an answer, naming the topic, a partition and the bootstrap servers, on
    both engines (a worker's kept consumer too). A query of several partitions that got no
    answer at all once counted as progress (only its first partition was marked failed), so
    the task retried for ever (a 512-partition read sat 20 minutes on a dead broker)."""
    from kwatermark.localbroker import LocalBroker

    engines = ["python"] + (["compiled"] if compiled.unavailable() is None else [])
    own = LocalBroker.start(kind="kafka")   # this test stops it
    try:
        broker = TestBroker(own.bootstrap_servers, "kafka")
        topic = broker.create_topic(8)
        TopicWriter(broker, topic).send([Record(p, 1_000 + i) for i in range(3) for p in range(8)])
        packs = {}
        for engine in engines:
            options = parse_options({"kafka.bootstrap.servers": own.bootstrap_servers,
                                     "subscribe": topic, "readEngine": engine,
                                     "kafkaConsumer.pollTimeoutMs": "3000"})
            tasks = [RangeTask(topic, p, 0, 3, PartitionState(), True, None, NO_PARTITIONS)
                     for p in range(8)]
            assert sum(b.num_rows for b in PackReader(options, OutputLayout(), Decoders(),
                                                      tasks)) == 24
            packs[engine] = (options, tasks)
    finally:
        own.stop()
    for engine, (options, tasks) in packs.items():
        outcome: list[BaseException] = []

        def read(options=options, tasks=tasks, outcome=outcome) -> None:
            try:
                list(PackReader(options, OutputLayout(), Decoders(), tasks))
            except BaseException as exc:   # noqa: BLE001 - handed to the test's thread
                outcome.append(exc)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(120)   # 40x the budget: a hang, not a speed, is what fails here
        assert not reader.is_alive(), f"{engine}: still retrying 120 s after pollTimeoutMs=3000"
        assert len(outcome) == 1 and isinstance(outcome[0], BrokerError), (engine, outcome)
        assert re.search(rf"topic {topic}, partition \d: cannot fetch offsets from "
                         rf"kafka.bootstrap.servers='{re.escape(own.bootstrap_servers)}'.*"
                         rf"no answer for kafkaConsumer.pollTimeoutMs=3000",
                         str(outcome[0])), (engine, str(outcome[0]))


@pytest.mark.skipif(compiled.unavailable() is not None, reason="compiled engine not built")
@pytest.mark.parametrize("engine", ["compiled", "python"])
def test_the_drivers_offsets_lookups_answer_every_partition_on_both_engines(
        broker, monkeypatch, engine):
    """The driver asks many partitions' offsets through one client (``KafkaMetadata._quick``,
    ``ask_ahead``): the compiled engine's where it reads, which asks every chunk of
    ``OFFSETS_CHUNK`` partitions in one C call (the GIL released throughout), and counts a
    named topic's partitions in C; confluent-kafka's with readEngine=python. Both give each
    partition its own end and earliest offset, in chunks of uneven size, and the count; a
    topic that does not exist fails the answer asked ahead, which the usual path then
    asks again. The client closes with the metadata that made it (a driver plans query
    after query)."""
    from kwatermark import consumer
    from kwatermark.broker import KafkaMetadata

    monkeypatch.setattr(consumer, "OFFSETS_CHUNK", 16)   # 40 partitions: 16, 16 and 8
    topic = broker.create_topic(40)
    writer = TopicWriter(broker, topic)
    writer.send([Record(p, 1_000 + i, value=b"x") for p in range(40) for i in range(p % 7 + 1)])
    truth = {(topic, p): sum(r.partition == p for r in writer.produced) for p in range(40)}
    metadata = KafkaMetadata(parse_options({
        "kafka.bootstrap.servers": broker.bootstrap_servers, "subscribe": topic,
        "readEngine": engine}))
    tps = sorted(truth)
    assert metadata.topics() == {topic: 40}   # a broker has answered: the quick path opens
    ahead = metadata.ask_ahead(tps)
    assert ahead.taken(ahead.topics) == {topic: 40}
    assert ahead.taken(ahead.ends) == truth
    assert isinstance(metadata._consumer, compiled._Client) == (engine == "compiled")
    assert metadata.latest_offsets(tps) == truth
    assert metadata.earliest_offsets(tps) == dict.fromkeys(tps, 0)
    assert metadata._quick_after == 0.0, "a lookup fell back to the admin client"
    missing = KafkaMetadata(parse_options({
        "kafka.bootstrap.servers": broker.bootstrap_servers,
        "subscribe": f"{topic},{topic}-never-created", "readEngine": engine}))
    assert missing.topics() == {topic: 40}
    ahead = missing.ask_ahead(tps)
    assert ahead.taken(ahead.topics) == (None if engine == "compiled" else {topic: 40})
    assert ahead.taken(ahead.ends) == truth
    # a driver runs query after query: each one's client is closed with its metadata
    client = metadata._consumer
    del metadata, ahead, missing
    gc.collect()
    if engine == "compiled":
        assert client.handle == compiled.ffi.NULL, "the driver's offsets client stays open"
