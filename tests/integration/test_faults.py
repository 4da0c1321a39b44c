"""Issue 7: faults broken on purpose — no loss, no duplicates, same watermarks, no hangs."""

from __future__ import annotations

import json
import os
import re
import signal

import pytest

from kwatermark.arrow import OutputLayout
from kwatermark.errors import BrokerError
from kwatermark.localbroker import LocalBroker
from kwatermark.offsets import PartitionState, RangeTask
from kwatermark.options import parse_options
from kwatermark.reader import Decoders, RangeReader
from kwatermark.watermarks import NO_PARTITIONS
from tests.support import kafka as kafka_support
from tests.support.kafka import Record, TestBroker, TopicWriter
from tests.support.secrets import gather, leaks
from tests.support.streams import (
    Batches,
    kwatermark_batch,
    kwatermark_stream,
    run_available_now,
    wm_ms,
)


def data() -> list[Record]:
    return [Record(p, 1_000 * i + 3 * p, value=f"{p}:{i}".encode())
            for i in range(1, 41) for p in range(3)]


def rows_of(batches: Batches) -> list[tuple]:
    return [(r["partition"], r["offset"], r["value"], wm_ms(r)) for r in batches.rows]


def test_task_failing_mid_range_is_retried_with_identical_output(
        spark, broker, topic_factory, tmp_path, fault_dir):
    results = {}
    for faulty in (False, True):
        writer = topic_factory(3)
        writer.send(data())
        if faulty:
            open(os.path.join(fault_dir, f"{writer.topic}.arm"), "w").close()
        frame = kwatermark_stream(spark, broker, writer.topic, maxOffsetsPerTrigger=50,
                                  **{"watermark.strategy": "bounded",
                                     "watermark.maxOutOfOrderness": "2 seconds",
                                     "watermark.stateLocation": str(tmp_path / f"l{faulty}")})
        seen, _ = run_available_now(frame, str(tmp_path / f"c{faulty}"))
        results[faulty] = rows_of(seen)
        if faulty:  # the fault really fired (a marker per failed first attempt)
            assert any(name.startswith(writer.topic + "-") for name in os.listdir(fault_dir))
    assert len(results[True]) == 120
    assert len({(p, o) for p, o, _, _ in results[True]}) == 120
    assert results[True] == results[False]


def test_unreachable_broker_at_start_fails_in_bounded_time_naming_the_option(spark):
    unreachable = TestBroker("127.0.0.1:1", "external")
    # Bounded: the retries the options allow, within their time budget, then the error.
    with pytest.raises(Exception, match=r"(?s)kafka.bootstrap.servers='127.0.0.1:1'.*gave up "
                                        r"after 2 attempt\(s\) within 2 s, as no broker"):
        kwatermark_batch(spark, unreachable, "anything",
                         **{"kafkaConsumer.pollTimeoutMs": "2000",
                            "fetchOffset.numRetries": "1"}).collect()


def test_broker_stopped_mid_query_fails_clearly_then_restart_is_data_loss(spark, tmp_path):
    local = LocalBroker.start()
    own = TestBroker(local.bootstrap_servers, "tansu")
    try:
        writer = TopicWriter(own, own.create_topic(1))
        writer.send([Record(0, 1_000), Record(0, 2_000)])
        frame = kwatermark_stream(spark, own, writer.topic,
                                  **{"kafkaConsumer.pollTimeoutMs": "2000",
                                     "fetchOffset.numRetries": "1"})
        checkpoint = str(tmp_path / "ckpt")
        run_available_now(frame, checkpoint)
        local.stop()
        # The restarted query has not reached the broker: the never-reached budget, here
        # the 2 s of pollTimeoutMs, bounds it.
        with pytest.raises(Exception, match=r"(?s)kafka.bootstrap.servers=.*gave up after 2 "
                                            r"attempt\(s\) within 2 s"):
            run_available_now(frame, checkpoint)
        # The in-memory test broker comes back empty on the same port: the topic is gone.
        local = LocalBroker.start_on(local.port)
        with pytest.raises(Exception, match=f"topic {writer.topic}, partition 0: the "
                                            f"partition is gone"):
            run_available_now(frame, checkpoint)
    finally:
        local.stop()


def test_broker_that_stops_answering_mid_read_fails_the_attempt_then_the_retry_reads_all_once(
        spark, tmp_path):
    """Issue 22: ``kafkaConsumer.pollTimeoutMs`` bounds time without progress. The broker
    freezes (SIGSTOP) at the first record the task decodes: the attempt fails once the
    timeout has passed without progress (it does not wait for ever), and Spark's retry, the
    broker answering again, reads every record once. The executor loop alone, frozen the
    same way, shows the attempt's error (in Spark it stays in the executor's log)."""
    local = LocalBroker.start(kind="tansu" if kafka_support.test_broker_kind() == "tansu" else "kafka")
    own = TestBroker(local.bootstrap_servers, local.kind)
    marker = tmp_path / "frozen"
    try:
        writer = TopicWriter(own, own.create_topic(1))
        # 100 sends of 100 records of 1 KB: ~200 record batches, fetched one a request and
        # decoded 100 records at a time, so the broker freezes long before all is fetched.
        for chunk in range(100):
            writer.send([Record(0, 1_000 * (100 * chunk + i), value=b"v" * 1024)
                         for i in range(100)])
        frame = kwatermark_batch(spark, own, writer.topic, **{
            "kafkaConsumer.pollTimeoutMs": "3000",
            "kafka.queued.min.messages": "1", "kafka.max.partition.fetch.bytes": "1",
            "arrow.maxRecordsPerBatch": "100",
            "watermark.strategy": "kw_test_plugins:BrokerFreezingGenerator",
            "watermark.freezePid": str(local.process.pid),
            "watermark.freezeMarker": str(marker)})
        offsets = [r["offset"] for r in frame.select("offset").collect()]
        assert marker.exists() and (tmp_path / "frozen.resumed").exists()  # froze, then retried
        assert sorted(offsets) == list(range(10_000))

        # The same freeze under the executor loop itself (no Spark: its message stays in the
        # executor's log): the error names topic, partition, the offset it waits at, the
        # option and the address.
        options = parse_options({"kafka.bootstrap.servers": own.bootstrap_servers,
                                 "subscribe": writer.topic,
                                 "kafkaConsumer.pollTimeoutMs": "3000",
                                 "kafka.queued.min.messages": "1",
                                 "kafka.max.partition.fetch.bytes": "1",
                                 "arrow.maxRecordsPerBatch": "100"}, streaming=False)
        task = RangeTask(writer.topic, 0, 0, 10_000, PartitionState(), True, None,
                         NO_PARTITIONS)
        batches = iter(RangeReader(options, OutputLayout(), Decoders(), task))
        read = next(batches).num_rows
        os.kill(local.process.pid, signal.SIGSTOP)
        with pytest.raises(BrokerError) as stalled:
            for batch in batches:
                read += batch.num_rows
        waits_at = re.fullmatch(
            rf"topic {writer.topic}, partition 0: no records at offset (\d+) \(range ends at "
            rf"10000\) and no progress for kafkaConsumer.pollTimeoutMs=3000 from "
            rf"kafka.bootstrap.servers='{re.escape(own.bootstrap_servers)}'", str(stalled.value))
        assert waits_at, str(stalled.value)
        # Where the read stands: past what it handed on, the records decoded since not yet.
        assert 0 < read <= int(waits_at.group(1)) < 10_000
    finally:
        os.kill(local.process.pid, signal.SIGCONT)
        local.stop()


def test_partition_added_mid_query_is_read_from_its_start(spark, broker, topic_factory,
                                                        tmp_path):
    if not broker.supports_create_partitions:
        pytest.skip("the Tansu test broker has no CreatePartitions (test_source.py covers the "
                    "same new-partition path with a new topic matching subscribePattern); "
                    "runs against Apache Kafka (Docker or KAFKA_BOOTSTRAP_SERVERS)")
    from confluent_kafka.admin import NewPartitions

    writer = topic_factory(1)
    writer.send([Record(0, 1_000), Record(0, 2_000)])
    frame = kwatermark_stream(spark, broker, writer.topic,
                              **{"watermark.stateLocation": str(tmp_path / "ledger")})
    seen = Batches()
    checkpoint = str(tmp_path / "ckpt")
    run_available_now(frame, checkpoint, seen)
    admin = broker.admin()
    for future in admin.create_partitions([NewPartitions(writer.topic, 2)]).values():
        future.result(30)
    writer.send([Record(0, 3_000), Record(1, 500), Record(1, 4_000)])
    run_available_now(frame, checkpoint, seen)
    assert [(r["partition"], r["offset"]) for r in seen.rows] == [
        (0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    marks = [wm_ms(r) for r in seen.rows if r["partition"] == 0]
    assert marks == sorted(marks, key=lambda w: -1 if w is None else w)  # never backwards


SECRET = "s3cr3t-Pa55word-4242"


def test_secrets_never_appear_in_offsets_progress_ledger_logs_or_errors(
        spark, broker, topic_factory, tmp_path, capfd, request):
    writer = topic_factory(2)
    writer.send([Record(0, 1_000), Record(1, 2_000)])
    ledger = tmp_path / "ledger"
    checkpoint = tmp_path / "ckpt"
    secrets = {"kafka.sasl.password": SECRET, "kafka.ssl.key.password": SECRET,
               "value.schema.registry.basic.auth.user.info": f"user:{SECRET}"}
    frame = kwatermark_stream(spark, broker, writer.topic,
                              **{"watermark.stateLocation": str(ledger)}, **secrets)
    _, query = run_available_now(frame, str(checkpoint))
    assert query.lastProgress["numInputRows"] == 2
    with pytest.raises(Exception) as failure:  # an option error raised with secrets present
        kwatermark_stream(spark, broker, writer.topic, maxOffsetsPerTrigger="-1",
                          **secrets).writeStream.format("noop").start().awaitTermination(30)
    query.explain(extended=True)  # the plan (with options) goes to stdout, searched below
    places = gather([ledger, checkpoint], {"progress": json.dumps(query.recentProgress,
                                                                  default=str),
                                           "error": str(failure.value)}, capfd, request)
    assert leaks(SECRET, places) == []
    assert len(places) > 6  # offsets, commits, metadata and ledger files were searched
