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

import pytest

from kwatermark.localbroker import LocalBroker
from tests.support.failover import (
    ChildStream,
    RecordedStream,
    SteadyWriter,
    create_topic,
    exactly_once,
    kill_leader,
    log_records,
    reassign,
    rolling_restart,
    unread,
    watermark_regressions,
)
from tests.support.streams import kwatermark_batch

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


class _Servers:
    """What kwatermark_batch needs of a broker: its addresses."""

    def __init__(self, bootstrap_servers: str):
        self.bootstrap_servers = bootstrap_servers
