"""The two read engines (DESIGN §19): ``readEngine=compiled`` (kwatermark.compiled, librdkafka
into Arrow buffers) and ``readEngine=python`` (confluent-kafka's message objects) return the
same Arrow rows for the same ranges: transaction markers, aborted records under both
isolation levels, headers, null keys and values, ~1 MB values, one range or a pack of them.
The ground truth for offsets and values is what the producer wrote, not either engine."""

from __future__ import annotations

import gc
import logging
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import threading
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Consumer
from confluent_kafka import TopicPartition as KafkaTP

from kwatermark import compiled
from kwatermark.arrow import OutputLayout
from kwatermark.consumer import task_conf
from kwatermark.errors import BrokerError, DataLossError, OptionError
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


@pytest.mark.parametrize("engine", ["python"] + (
    ["compiled"] if compiled.unavailable() is None else []))
def test_records_gone_before_a_task_reads_them_are_data_loss_on_both_engines(broker, engine,
                                                                           caplog):
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
    with caplog.at_level(logging.WARNING, logger="kwatermark"):
        table = pa.Table.from_batches(list(pack(False, *spans)),
                                      schema=OutputLayout().schema())
    # failOnDataLoss=false: a warning naming what was skipped, not the advice to set it
    warned = [r.getMessage() for r in caplog.records if r.getMessage().startswith("data loss")]
    assert f"data loss (failOnDataLoss=false): topic {topic}, partition 1: offsets [20, 25) " \
           f"were planned but the partition now ends at 20 (topic recreated or truncated); " \
           f"the lost records are skipped" in warned, warned
    assert not any("Set failOnDataLoss" in w for w in warned), warned
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
    # An AvailableNow run's later plannings ask the topics ahead, not the end offsets: the
    # end offsets' answer is None, and latest_offsets asks them itself if it is called.
    topics_only = metadata.ask_ahead(tps, ends=False)
    assert topics_only.taken(topics_only.topics) == {topic: 40}
    assert topics_only.taken(topics_only.ends) is None
    assert metadata.latest_offsets(tps, topics_only) == truth
    assert metadata.latest_offsets(tps) == truth
    assert metadata.earliest_offsets(tps) == dict.fromkeys(tps, 0)
    assert metadata._quick_after == 0.0, "a lookup fell back to the admin client"
    if engine == "compiled":
        # a partition the brokers do not answer cleanly is left out, the others answered;
        # the same list again (its C arrays kept) and another
        from confluent_kafka import OFFSET_END
        client = metadata._consumer
        assert client.clean_offsets(tps + [(topic, 40)], OFFSET_END, 10, 16) == truth
        assert client.clean_offsets(tps + [(topic, 40)], OFFSET_END, 10, 16) == truth
        assert client.clean_offsets(tps[5:], OFFSET_END, 10, 16) == {
            tp: truth[tp] for tp in tps[5:]}
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


@pytest.mark.skipif(compiled.unavailable() is not None, reason="compiled engine not built")
def test_the_compiled_clients_metadata_requests_fail_when_no_broker_answers():
    """A metadata request that gets no answer (a timeout, a refused connection: librdkafka's
    own error codes, which are negative) raises. Its code negated into the answer, a
    timeout (-185) read as a topic of 185 partitions."""
    from confluent_kafka import KafkaException

    options = parse_options({"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t"})
    conf = {k: v for k, v in task_conf(options, 1).items() if k != "logger"}
    client = compiled._Client(conf, False, 1)
    try:
        for ask in (lambda: client.partition_count("t", 0.3),
                    lambda: client.list_topics("t", 0.3), lambda: client.topic_counts(0.3)):
            with pytest.raises(KafkaException) as caught:
                ask()
            assert caught.value.args[0].code() < 0, caught.value
    finally:
        client.close()


@pytest.mark.skipif(compiled.unavailable() is not None, reason="compiled engine not built")
@pytest.mark.parametrize("engine", ["compiled", "python"])
def test_a_patterns_topics_asked_ahead_are_every_topic_of_the_cluster(broker, engine):
    """A ``subscribePattern`` planning asks every topic of the cluster and its partition
    count while it folds (``ask_ahead``): in one C call where the compiled engine reads,
    through the admin client with readEngine=python. Both answer what the brokers hold (the
    topics this test made, with their counts; other tests make and delete topics on the
    same broker meanwhile, so only these are compared), the C call also when its first room
    for names is too small (it asks again with more)."""
    from kwatermark.broker import KafkaMetadata

    prefix = f"pattern-{uuid.uuid4().hex[:8]}"
    made = {f"{prefix}-{n}": n for n in (1, 3, 17)}
    for name, count in made.items():
        broker.create_topic(count, name=name)
        TopicWriter(broker, name).send([Record(p, 1_000, value=b"x") for p in range(count)])
    metadata = KafkaMetadata(parse_options({
        "kafka.bootstrap.servers": broker.bootstrap_servers,
        "subscribePattern": f"{prefix}-.*", "readEngine": engine}))
    tps = [(name, p) for name, count in made.items() for p in range(count)]
    assert metadata.topics()   # a broker has answered: the quick path opens
    ahead = metadata.ask_ahead(tps)
    answered = ahead.taken(ahead.topics)
    assert {name: answered.get(name) for name in made} == made
    assert isinstance(metadata._consumer, compiled._Client) == (engine == "compiled")
    if engine == "compiled":
        client = metadata._consumer
        client._topics_room = (2, 16)
        again = client.topic_counts(10)
        assert {name: again.get(name) for name in made} == made
        assert client._topics_room[0] >= len(made) and client._topics_room[1] > 16
