"""Issue 32 (DESIGN §20): what operators do to a production cluster every week, under running
queries, on one 3-node KRaft Apache Kafka shared by the module (``LocalBroker.start(
brokers=3)``): a topic of 6 partitions with replication 3 and ``min.insync.replicas=2``, an
idempotent producer (``acks=all``) whose delivery reports are the ground truth.

Scenarios: a rolling restart of every node under a running stream (and Spark's own
``format("kafka")`` under the same restart, beside it); the leader SIGKILLed and started
again 10 s later; a batch read and a query restarted from its checkpoint while a node is
down; a partition reassignment. Each asserts: the query never fails, every acknowledged
record is read exactly once (topic, partition, offset and value), and no batch's rows carry
a watermark below an earlier batch's.

Stall lengths are figures, not assertions: bench/bench_failover.py measures them.
"""

from __future__ import annotations

import datetime
import time
from collections import Counter

import pyarrow as pa
import pytest

from kwatermark import compiled
from kwatermark.arrow import OutputLayout
from kwatermark.localbroker import LocalBroker
from kwatermark.offsets import PartitionState, RangeTask
from kwatermark.options import parse_options
from kwatermark.pack import PackReader
from kwatermark.reader import Decoders
from kwatermark.watermarks import NO_PARTITIONS
from tests.support.failover import (
    PARTITIONS,
    Batch,
    ChildStream,
    RecordedStream,
    SteadyWriter,
    create_topic,
    elect_preferred,
    exactly_once,
    kill_leader,
    leaders,
    log_records,
    move_leaders,
    reassign,
    rolling_restart,
    unread,
    wait_for_leaders,
    watermark_regressions,
    write_acked,
)
from tests.support.streams import epoch_ms, kwatermark_batch, progress_offset

RATE = 200          # records a second, as in the issue
CATCH_UP_S = 180    # after the fault, until every acknowledged record is read


@pytest.fixture(scope="module")
def cluster():
    broker = LocalBroker.start(kind="kafka", brokers=3)
    yield broker.cluster
    broker.stop()


def assert_exactly_once(rows, writer: SteadyWriter, who: str, cluster) -> None:
    """Every acknowledged record read, no record of the topic's log twice, nothing else."""
    acked = writer.acked
    missing, duplicated, unexpected = exactly_once(
        rows, acked, log_records(cluster, writer.topic, writer.partitions))
    assert (missing, duplicated, unexpected) == ([], [], []), (
        f"{who}: {len(missing)} missing (e.g. {missing[:3]}), {len(duplicated)} duplicated "
        f"(e.g. {duplicated[:3]}), {len(unexpected)} unexpected (e.g. {unexpected[:3]}) of "
        f"{len(acked)} acknowledged")


def finish(stream: RecordedStream, writer: SteadyWriter, cluster) -> None:
    """Stop writing, read to the end, stop; then the three assertions."""
    writer.stop()
    stream.wait_for(writer.acked, CATCH_UP_S)
    stream.check()
    stream.stop()
    assert len(writer.acked) > RATE * 5
    assert_exactly_once(stream.rows(), writer, "kwatermark", cluster)
    assert watermark_regressions(stream.batches) == []
    assert any(m is not None for b in stream.batches for m in b.watermarks)


def test_a_rolling_restart_under_a_running_stream_and_sparks_own_source_beside_it(
        spark, cluster, tmp_path):
    topic = create_topic(cluster)
    writer = SteadyWriter(cluster.bootstrap_servers, topic, RATE)
    spark_kafka = ChildStream(cluster.bootstrap_servers, topic, tmp_path, "kafka")
    stream = RecordedStream(spark, cluster.bootstrap_servers, topic, str(tmp_path / "cp"))
    try:
        spark_kafka.wait_started()
        stream.wait_for(list(writer.acked), CATCH_UP_S)
        rolling_restart(cluster)
        stream.check()
        finish(stream, writer, cluster)
        spark_kafka.wait_for(writer.acked, CATCH_UP_S)
    finally:
        reply = spark_kafka.stop()
        if stream.query.isActive:
            stream.stop()
    # Spark's own source rode through the same restart: the reference behaviour.
    assert reply.get("error") is None, reply
    assert_exactly_once(spark_kafka.rows(), writer, "format('kafka')", cluster)


def test_a_rolling_restart_under_a_stream_planned_ahead_of_its_trigger(
        spark, cluster, tmp_path):
    """24 partitions under the 1 s trigger: the end offsets are asked, and the last batch
    folded, just before each tick (docs/operations.md, "Planning ahead of the trigger"),
    and those early questions meet the restarted nodes too. The restart begins once a
    batch was planned ahead (four plannings at the cadence first)."""
    topic = create_topic(cluster, partitions=24)
    writer = SteadyWriter(cluster.bootstrap_servers, topic, RATE, partitions=24)
    stream = RecordedStream(spark, cluster.bootstrap_servers, topic, str(tmp_path / "cp"))
    try:
        stream.wait_for(list(writer.acked), CATCH_UP_S)
        deadline = time.monotonic() + 60
        while not _planned_ahead(stream.query) and time.monotonic() < deadline:
            stream.check()
            time.sleep(0.5)
        assert _planned_ahead(stream.query), "no batch was planned ahead of its trigger"
        rolling_restart(cluster)
        stream.check()
        finish(stream, writer, cluster)
    finally:
        if stream.query.isActive:
            stream.stop()


def _planned_ahead(query) -> list[int]:
    """The ids of the recent batches whose end offsets were asked before their trigger."""
    return [event["batchId"] for event in query.recentProgress
            if event["numInputRows"] and progress_offset(
                event["sources"][0]["endOffset"])["@kwatermark"]["plannedAt"]
            < epoch_ms(datetime.datetime.fromisoformat(event["timestamp"]))]


def test_an_available_now_run_through_a_rolling_restart(spark, cluster, tmp_path):
    """After its first micro-batch an AvailableNow run plans from the end it fixed when it
    started, asking the brokers only for its topics: a rolling restart during the run
    leaves it reading every record once, to that end, and finishing on its own."""
    from kwatermark.sparkapi import ADMISSION_CONTROL

    if not ADMISSION_CONTROL:
        pytest.skip("pyspark < 4.2 runs AvailableNow on a Python source as one batch "
                    "(docs/operations.md, 'Spark versions'): no later planning to restart "
                    "under")
    topic = create_topic(cluster)
    acked = write_acked(cluster.bootstrap_servers, topic,
                        {p: [f"{p}-{i}" for i in range(300)] for p in range(PARTITIONS)})
    batches: list[Batch] = []

    def collect(frame, batch_id: int) -> None:
        rows = frame.select("partition", "offset", "value").collect()
        batches.append(Batch(batch_id, time.monotonic(), [
            (r["partition"], r["offset"], bytes(r["value"]).decode()) for r in rows]))
        time.sleep(1)   # 30 batches span the restarts

    query = (spark.readStream.format("kwatermark")
             .option("kafka.bootstrap.servers", cluster.bootstrap_servers)
             .option("subscribe", topic).option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", "60").load()
             .writeStream.foreachBatch(collect)
             .option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(availableNow=True).start())
    try:
        deadline = time.monotonic() + 60
        while len(batches) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        restarts = rolling_restart(cluster)
        query.awaitTermination(CATCH_UP_S)
    finally:
        if query.isActive:
            query.stop()
    assert query.exception() is None
    planned_during = [b.batch_id for b in batches if restarts[0][1] <= b.at <= restarts[-1][2]]
    assert len(planned_during) >= 3, "the run did not span the restart"
    missing, duplicated, unexpected = exactly_once(
        [row for b in batches for row in b.rows], acked, log_records(cluster, topic))
    assert (missing, duplicated, unexpected) == ([], [], []), (
        missing[:3], duplicated[:3], unexpected[:3])
    assert len(acked) == 300 * PARTITIONS


def test_a_leader_killed_and_started_again_10_s_later(spark, cluster, tmp_path):
    topic = create_topic(cluster)
    writer = SteadyWriter(cluster.bootstrap_servers, topic, RATE)
    stream = RecordedStream(spark, cluster.bootstrap_servers, topic, str(tmp_path / "cp"))
    try:
        stream.wait_for(list(writer.acked), CATCH_UP_S)
        kill_leader(cluster, topic, down_s=10)
        stream.check()
        finish(stream, writer, cluster)
    finally:
        if stream.query.isActive:
            stream.stop()


def test_a_batch_read_and_a_query_restarted_from_its_checkpoint_while_a_node_is_down(
        spark, cluster, tmp_path):
    topic = create_topic(cluster)
    writer = SteadyWriter(cluster.bootstrap_servers, topic, RATE)
    checkpoint = str(tmp_path / "cp")
    first = RecordedStream(spark, cluster.bootstrap_servers, topic, checkpoint)
    down = cluster.node(2)
    try:
        first.wait_for(list(writer.acked), CATCH_UP_S)
        first.stop()
        down.stop()
        # A batch read with the node down: everything acknowledged before it started.
        before = list(writer.acked)
        batch = kwatermark_batch(spark, _Servers(cluster.bootstrap_servers), topic,
                                 startingOffsets="earliest", endingOffsets="latest")
        read = [(r["partition"], r["offset"], bytes(r["value"]).decode())
                for r in batch.select("partition", "offset", "value").collect()]
        missing, duplicated, _ = exactly_once(read, before)
        assert (missing, duplicated) == ([], []), (missing[:3], duplicated[:3])
        assert len(set(read)) == len(read)
        # The stream again, from its checkpoint, while the node is still down.
        # It goes on where the first stopped: it reads what the first did not.
        second = RecordedStream(spark, cluster.bootstrap_servers, topic, checkpoint)
        second.wait_for(unread(first.rows(), list(writer.acked)), CATCH_UP_S)
        down.restart()
        cluster.wait_in_sync(down.node_id)
        writer.stop()
        second.wait_for(unread(first.rows(), list(writer.acked)), CATCH_UP_S)
        second.check()
        second.stop()
        # A batch the sink got but the checkpoint did not commit runs again after the
        # restart: a batch id's last run is what an idempotent sink keeps.
        batches = {b.batch_id: b for b in first.batches + second.batches}
        rows = [row for b in batches.values() for row in b.rows]
        assert_exactly_once(rows, writer, "kwatermark, restarted", cluster)
        assert watermark_regressions(list(batches.values())) == []
    finally:
        if not down.running:
            down.restart()
            cluster.wait_in_sync(down.node_id)
        for stream in (first, locals().get("second")):
            if stream is not None and stream.query.isActive:
                stream.stop()


def test_a_partition_reassignment_under_a_running_stream(spark, cluster, tmp_path):
    topic = create_topic(cluster)
    writer = SteadyWriter(cluster.bootstrap_servers, topic, RATE)
    stream = RecordedStream(spark, cluster.bootstrap_servers, topic, str(tmp_path / "cp"))
    try:
        stream.wait_for(list(writer.acked), CATCH_UP_S)
        reassign(cluster, topic)
        stream.check()
        finish(stream, writer, cluster)
    finally:
        if stream.query.isActive:
            stream.stop()


@pytest.fixture
def parked_pool(monkeypatch):
    """A fresh pool of kept consumers (compiled._Clients) for tasks of 6 partitions that
    park them (MANY_PARTITIONS patched to 2); closed at the end."""
    pool = compiled._Clients()
    monkeypatch.setattr(compiled, "_clients", pool)
    monkeypatch.setattr(compiled, "MANY_PARTITIONS", 2)
    # Every partition parked at every task's end, none stopped as it finishes (a task that
    # waits for an election runs longer than STOP_AFTER_S): each next task resumes them all.
    monkeypatch.setattr(compiled, "STOP_AFTER_S", 600)
    # A node restarted on a loaded machine can take longer than a minute: the worker's
    # consumer is not closed as idle meanwhile.
    monkeypatch.setattr(compiled._Clients, "IDLE_S", 600)
    yield pool
    pool.close_all()


class _ParkedTasks:
    """Tasks of ranges over the partitions of ``topic`` read as a Python worker reads a task
    of more than ``compiled.MANY_PARTITIONS`` partitions (``PackReader``,
    ``readEngine=compiled``: its consumer parked between tasks in ``compiled._clients``),
    each range going on where its partition's last range ended, as a stream's micro-batches
    do. The ground truth is the producer's delivery reports (``write_acked``).

    Every task's longest range is at most 64 records, so every task asks the same consumer
    configuration (``compiled.MANY_PREFETCH``), and no partition's log runs past its range
    by more than the partition may carry (twice its range, at least 64): each resumes."""

    def __init__(self, cluster, topic: str, partitions: int):
        self.cluster, self.topic, self.partitions = cluster, topic, partitions
        self.truth: dict[tuple[int, int], str] = {}   # (partition, offset) -> value
        self.written = 0                  # every partition's log holds 0..written-1
        self.read_to = [0] * partitions   # where each partition's next range begins
        self.timings: list[tuple[str, float, int]] = []
        self.options = parse_options({
            "kafka.bootstrap.servers": cluster.bootstrap_servers, "subscribe": topic,
            "readEngine": "compiled", "kafkaConsumer.pollTimeoutMs": "60000"})

    def write(self, upto: int) -> None:
        """Every partition's log to offset ``upto`` (values ``"p-i"``), acknowledged."""
        values = {p: [f"{p}-{i}" for i in range(self.written, upto)]
                  for p in range(self.partitions)}
        for p, offset, value in write_acked(self.cluster.bootstrap_servers, self.topic,
                                            values):
            assert (p, offset) not in self.truth, f"offset {offset} of {p} reported twice"
            self.truth[(p, offset)] = value
        for p in range(self.partitions):   # the ground truth itself: no gap, no transaction
            offsets = sorted(o for q, o in self.truth if q == p)
            assert offsets == list(range(upto)), f"partition {p}'s offsets {offsets[-5:]}"
        self.written = upto

    def task(self, end: int, label: str, skip: tuple[int, ...] = ()
             ) -> tuple[compiled._Client, int]:
        """One task of a range to ``end`` on every partition but ``skip``: its rows must be
        exactly their records, none missing, none twice, and it must not fail; (the
        worker's kept consumer after it, how many partitions its start resumed)."""
        spans = [(p, self.read_to[p], end) for p in range(self.partitions) if p not in skip]
        assert max(b - a for _, a, b in spans) <= compiled.MANY_PREFETCH
        tasks = [RangeTask(self.topic, p, a, b, PartitionState(), True, None, NO_PARTITIONS)
                 for p, a, b in spans]
        began = time.monotonic()
        table = pa.Table.from_batches(list(PackReader(self.options, OutputLayout(),
                                                      Decoders(), tasks)),
                                      schema=OutputLayout().schema())
        took = time.monotonic() - began
        got = Counter(zip(table.column("topic").to_pylist(),
                          table.column("partition").to_pylist(),
                          table.column("offset").to_pylist(),
                          [bytes(v).decode() for v in table.column("value").to_pylist()]))
        want = Counter((self.topic, p, o, self.truth[(p, o)]) for p, a, b in spans
                       for o in range(a, b))
        missing, extra = sorted((want - got).elements()), sorted((got - want).elements())
        twice = sorted(row for row, n in got.items() if n > 1)
        assert (missing, extra) == ([], []), (
            f"task {label}, ranges {[(p, a, b) for p, a, b in spans]}: {len(missing)} "
            f"missing (e.g. {missing[:3]}), {len(twice)} read twice (e.g. {twice[:3]}), "
            f"{len(extra)} surplus (a second copy, or not of its ranges: e.g. {extra[:3]}) "
            f"of {sum(want.values())}")
        for p, _, b in spans:
            self.read_to[p] = b
        (client, _), = compiled._clients.kept.values()
        resumed = compiled.lib.kw_resumed(client.handle)
        self.timings.append((label, took, resumed))
        print(f"parked task {label}: {took:.3f} s, {resumed} of {len(spans)} partitions "
              f"resumed")
        return client, resumed


@pytest.mark.skipif(compiled.unavailable() is not None, reason="compiled engine not built")
def test_parked_partitions_resumed_after_their_leader_is_killed(cluster, parked_pool):
    """A worker's tasks of thousands of partitions (6 here, MANY_PARTITIONS patched to 2)
    keep one consumer with its partitions paused between tasks (kw_park); each task resumes
    them where the last ended, with what was fetched past its ranges. A user relies on the
    stream reading exactly its records when the leader of parked partitions is SIGKILLed:
    the next task (planned before the kill: records past what its partitions carried are on
    the leader that is gone until the controller fences it and elects another), those after
    it while the node is down (records the new leaders took, acks=all; one partition left
    parked through a task), once the node is back in every ISR, and once it leads its
    partitions again (Kafka's preferred leader election): each task reads exactly its
    ranges' records (topic, partition, offset, value), none missing, none twice, none
    failing. The worker keeps the same consumer throughout (a task that fails closes it;
    none does) and each task resumes every partition it reads. What each task took is
    printed, not asserted."""
    topic = create_topic(cluster)
    tasks = _ParkedTasks(cluster, topic, 6)
    tasks.write(80)
    first, _ = tasks.task(40, "1 (before the kill)")
    kept = []
    tasks.write(100)   # on the old leaders, fetched by no task yet
    before = leaders(cluster, topic)
    killed = cluster.node(before[0])
    moved = sorted(p for p, leader in before.items() if leader == killed.node_id)
    try:
        killed.kill()
        killed_at = time.monotonic()
        kept.append(tasks.task(100, "2 (just after the kill)")[0])
        after = wait_for_leaders(cluster, topic, without=killed.node_id)
        print(f"node {killed.node_id} killed, leader of {moved}; new leaders "
              f"{ {p: after[p] for p in moved} } {time.monotonic() - killed_at:.1f} s later")
        tasks.write(180)
        kept.append(tasks.task(130, "3 (node down, new leaders)", skip=(moved[0],))[0])
        kept.append(tasks.task(160, "4 (node down)")[0])
        tasks.write(200)
        kept.append(tasks.task(200, "5 (node down, carried and fetched)")[0])
        killed.restart()
        cluster.wait_in_sync(killed.node_id)
        tasks.write(260)
        kept.append(tasks.task(240, "6 (node back)")[0])
        # Kafka's preferred leader election (every 5 minutes): the node leads its
        # partitions again, which move back while parked
        print(f"preferred leaders elected: {elect_preferred(cluster, topic)}")
        tasks.write(300)
        kept.append(tasks.task(280, "7 (leaders back on the node)")[0])
        kept.append(tasks.task(300, "8 (leaders back on the node)")[0])
    finally:
        if not killed.running:
            killed.restart()
            cluster.wait_in_sync(killed.node_id)
    assert [resumed for _, _, resumed in tasks.timings] == [0, 6, 5, 6, 6, 6, 6, 6], \
        tasks.timings
    assert all(client is first for client in kept), "the worker's consumer was replaced"
    assert first.handle != compiled.ffi.NULL and len(parked_pool.kept) == 1


@pytest.mark.skipif(compiled.unavailable() is not None, reason="compiled engine not built")
def test_parked_partitions_resumed_after_a_rolling_restart(cluster, parked_pool):
    """As above, through a rolling restart while the worker's consumer is parked: every
    node stopped (its leadership moved away first) and started again in turn, so most
    partitions are led elsewhere than when they were parked, and the last node restarted
    leads none. The next tasks, whose ranges go on where the last ended (records carried
    from the old leaders, then fetched from the new ones), read exactly their ranges'
    records with the same consumer, every partition resumed. What each task took is
    printed, not asserted."""
    topic = create_topic(cluster)
    tasks = _ParkedTasks(cluster, topic, 6)
    tasks.write(80)
    first, _ = tasks.task(40, "1 (before the restart)")
    tasks.write(100)
    before = leaders(cluster, topic)
    began = time.monotonic()
    rolling_restart(cluster)
    print(f"rolling restart {time.monotonic() - began:.1f} s; leaders {before} -> "
          f"{leaders(cluster, topic)}")
    kept = [tasks.task(100, "2 (after the restart)")[0]]
    tasks.write(160)
    kept.append(tasks.task(140, "3 (after the restart)")[0])
    kept.append(tasks.task(160, "4 (after the restart)")[0])
    assert [resumed for _, _, resumed in tasks.timings] == [0, 6, 6, 6], tasks.timings
    assert all(client is first for client in kept), "the worker's consumer was replaced"
    assert first.handle != compiled.ffi.NULL and len(parked_pool.kept) == 1


@pytest.mark.skipif(compiled.unavailable() is not None, reason="compiled engine not built")
def test_parked_partitions_resumed_after_their_leaders_move(cluster, parked_pool,
                                                            monkeypatch):
    """Leadership moved while the worker's consumer is parked (a reassignment and a
    preferred leader election, as an operator's rebalancing does), so that one node now
    leads only partitions that other nodes led when the consumer learned its leaders, and
    none of the partitions the next task seeks to wake a leader's fetching (kw_start: one
    resumed partition of each leader the consumer's metadata named). Every task still reads
    exactly its ranges' records with the same consumer, every partition resumed.

    No partition says its leader moved (none is fetched while parked): the consumer asks
    its leaders again by their age (compiled.LEADERS_FRESH_S, patched to 0 here: every
    task), and after the move it knows the new ones. What each task took is printed, not
    asserted: with the leaders it learned before the move, the tasks that fetch from that
    node took 0.4-1.0 s (its broker thread not woken: librdkafka's idle wait, up to a
    second), 7-22 ms once they are asked again."""
    monkeypatch.setattr(compiled, "LEADERS_FRESH_S", 0.0)
    topic = create_topic(cluster)
    tasks = _ParkedTasks(cluster, topic, 6)
    tasks.write(80)
    first, _ = tasks.task(40, "1 (before the move)")
    before = leaders(cluster, topic)
    woken = {}   # each leader's first partition in the task's order: the one kw_start seeks
    for p in sorted(before):
        woken.setdefault(before[p], p)
    lonely = before[min(p for p in before if p not in woken.values())]
    elsewhere = next(node for node in sorted(set(before.values())) if node != lonely)
    target = {p: (elsewhere if before[p] == lonely else before[p]) if p in woken.values()
              else lonely for p in before}
    move_leaders(cluster, topic, target)
    print(f"leaders {before} -> {leaders(cluster, topic)}: node {lonely} leads only "
          f"{sorted(p for p in target if target[p] == lonely)}")
    tasks.write(100)
    kept = [tasks.task(100, "2 (carried, then fetched)")[0]]
    assert {p: first.leader(topic, p) for p in range(6)} == leaders(cluster, topic)
    tasks.write(160)
    kept.append(tasks.task(140, "3 (fetched)")[0])
    # what the last task had polled past its ranges is carried; what librdkafka had
    # fetched and it had not polled is fetched again (the pause outdates it)
    kept.append(tasks.task(160, "4 (carried, the rest fetched again)")[0])
    tasks.write(220)
    kept.append(tasks.task(220, "5 (fetched)")[0])
    assert [resumed for _, _, resumed in tasks.timings] == [0, 6, 6, 6, 6], tasks.timings
    assert all(client is first for client in kept), "the worker's consumer was replaced"
    assert first.handle != compiled.ffi.NULL and len(parked_pool.kept) == 1


class _Servers:
    """What kwatermark_batch needs of a broker: its addresses."""

    def __init__(self, bootstrap_servers: str):
        self.bootstrap_servers = bootstrap_servers
