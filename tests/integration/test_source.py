"""Issue 2: format("kwatermark") is a drop-in for format("kafka")."""

from __future__ import annotations

import datetime
import json
import time

import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from tests.support.kafka import Record
from tests.support.streams import (
    Batches,
    epoch_ms,
    kwatermark_batch,
    kwatermark_stream,
    progress_offset,
    run_available_now,
)

# Spark's Kafka source schema, from Spark's documentation, then kwatermark's two columns.
SPARK_KAFKA_FIELDS = [
    StructField("key", BinaryType()), StructField("value", BinaryType()),
    StructField("topic", StringType()), StructField("partition", IntegerType()),
    StructField("offset", LongType()), StructField("timestamp", TimestampType()),
    StructField("timestampType", IntegerType()),
]
HEADERS = StructField("headers", ArrayType(StructType([
    StructField("key", StringType()), StructField("value", BinaryType())])))
KWATERMARK_FIELDS = [StructField("event_time", TimestampType()),
                     StructField("watermark", TimestampType())]


def records(partitions: int, per_partition: int, base: int = 1_000) -> list[Record]:
    return [Record(p, base + i * 10 + p, value=f"{p}-{i}".encode(), key=f"k{i}".encode())
            for i in range(per_partition) for p in range(partitions)]


def keyset(rows) -> list[tuple]:
    return sorted((r["topic"], r["partition"], r["offset"]) for r in rows)


def test_same_job_text_as_format_kafka_reads_every_record_once_with_spark_types(
        spark, broker, topic_factory, checkpoint):
    writer = topic_factory(3)
    writer.send(records(3, 20))
    # The job text a Spark user already has, with only the format name changed.
    frame = (spark.readStream.format("kwatermark")
             .option("kafka.bootstrap.servers", broker.bootstrap_servers)
             .option("subscribe", writer.topic)
             .option("startingOffsets", "earliest")
             .option("failOnDataLoss", "true")
             .load()
             .selectExpr("CAST(key AS STRING) AS k", "CAST(value AS STRING) AS v", "topic",
                         "partition", "offset", "timestamp", "timestampType"))
    assert frame.schema["timestamp"].dataType == TimestampType()
    batches, _ = run_available_now(frame, checkpoint)
    rows = batches.rows
    assert len(rows) == 60
    assert sorted((r["partition"], r["offset"]) for r in rows) == sorted(
        (p, o) for p in range(3) for o in range(20))
    expected = {(r.partition, r.value.decode()) for r in writer.produced}
    assert {(r["partition"], r["v"]) for r in rows} == expected
    assert {r["timestampType"] for r in rows} == {0}  # CreateTime, Kafka's Java id


def test_schema_is_spark_kafka_schema_then_event_time_and_watermark(spark, broker,
                                                                      topic_factory):
    topic = topic_factory(1).topic
    plain = kwatermark_stream(spark, broker, topic)
    assert [(f.name, f.dataType) for f in plain.schema.fields] == [
        (f.name, f.dataType) for f in SPARK_KAFKA_FIELDS + KWATERMARK_FIELDS]
    with_headers = kwatermark_stream(spark, broker, topic, includeHeaders="true")
    assert [(f.name, f.dataType) for f in with_headers.schema.fields] == [
        (f.name, f.dataType) for f in SPARK_KAFKA_FIELDS + [HEADERS] + KWATERMARK_FIELDS]


def test_discovered_in_a_fresh_process_without_registration(broker, topic_factory):
    import subprocess
    import sys

    writer = topic_factory(1)
    writer.send([Record(0, 1_000, b"a"), Record(0, 2_000, b"b")])
    script = (
        "from pyspark.sql import SparkSession\n"
        "s = SparkSession.builder.master('local[1]').config('spark.ui.enabled','false')"
        ".getOrCreate()\n"
        f"df = s.read.format('kwatermark').option('kafka.bootstrap.servers', "
        f"'{broker.bootstrap_servers}').option('subscribe', '{writer.topic}').load()\n"
        "print('ROWS', df.count())\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=240, cwd="/", check=False)
    assert "ROWS 2" in done.stdout, done.stderr[-3000:]


def test_batch_read_with_starting_and_ending_offsets_json(spark, broker, topic_factory):
    writer = topic_factory(2)
    writer.send(records(2, 10))
    frame = kwatermark_batch(
        spark, broker, writer.topic,
        startingOffsets=json.dumps({writer.topic: {"0": 2, "1": -2}}),
        endingOffsets=json.dumps({writer.topic: {"0": 5, "1": -1}}))
    assert keyset(frame.collect()) == sorted(
        [(writer.topic, 0, o) for o in range(2, 5)] + [(writer.topic, 1, o) for o in range(10)])


def test_starting_offsets_latest_reads_only_new_records(spark, broker, topic_factory,
                                                        checkpoint):
    writer = topic_factory(1)
    writer.send(records(1, 5))
    frame = kwatermark_stream(spark, broker, writer.topic, startingOffsets="latest")
    first, _ = run_available_now(frame, checkpoint)
    assert first.rows == []
    writer.send(records(1, 3, base=50_000))
    second, _ = run_available_now(frame, checkpoint)
    assert [r["offset"] for r in second.rows] == [5, 6, 7]


def test_assign_and_subscribe_pattern(spark, broker, topic_factory):
    a, b = topic_factory(2), topic_factory(1)
    a.send(records(2, 3))
    b.send(records(1, 4))
    assigned = kwatermark_batch(spark, broker, assign=json.dumps({a.topic: [1], b.topic: [0]}))
    assert keyset(assigned.collect()) == sorted(
        [(a.topic, 1, o) for o in range(3)] + [(b.topic, 0, o) for o in range(4)])
    pattern = kwatermark_batch(spark, broker, subscribePattern=f"{a.topic[:-3]}.*")
    topics = {r["topic"] for r in pattern.collect()}
    assert a.topic in topics
    both = kwatermark_batch(spark, broker, subscribe=f"{a.topic},{b.topic}")
    assert len(both.collect()) == 10


def test_exactly_one_subscription_option_is_required(spark, broker, topic_factory):
    topic = topic_factory(1).topic
    with pytest.raises(Exception, match="exactly one of the options 'subscribe', "
                                        "'subscribePattern' or 'assign'"):
        kwatermark_batch(spark, broker, topic, assign=json.dumps({topic: [0]})).collect()


def test_include_headers(spark, broker, topic_factory):
    writer = topic_factory(1)
    writer.send([Record(0, 1_000, b"x", headers=[("h1", b"a"), ("h2", None)]),
                 Record(0, 2_000, b"y")])
    rows = kwatermark_batch(spark, broker, writer.topic, includeHeaders="true").collect()
    assert [[(h["key"], h["value"]) for h in r["headers"]] if r["headers"] else r["headers"]
            for r in rows] == [[("h1", b"a"), ("h2", None)], None]


def test_max_offsets_per_trigger_bounds_every_micro_batch_under_available_now(
        spark, broker, topic_factory, checkpoint):
    writer = topic_factory(3)
    writer.send([Record(0, 1_000 + i) for i in range(40)]
                + [Record(1, 1_000 + i) for i in range(15)] + [Record(2, 1_000)])
    frame = kwatermark_stream(spark, broker, writer.topic, maxOffsetsPerTrigger=10)
    batches, _ = run_available_now(frame, checkpoint)
    sizes = [len(b) for b in batches.batches()]
    assert sum(sizes) == 56
    assert all(0 < s <= 10 for s in sizes), sizes
    assert len(sizes) >= 6
    assert keyset(batches.rows) == sorted(set(keyset(batches.rows)))  # no duplicates


def test_an_available_now_run_reads_what_was_there_when_it_started(
        spark, broker, topic_factory, checkpoint):
    """Records produced and a partition created during the run wait for the next run, as in
    Spark's source (its allDataForTriggerAvailableNow), which then reads each once."""
    from kwatermark.sparkapi import ADMISSION_CONTROL

    if not ADMISSION_CONTROL:
        pytest.skip("pyspark < 4.2 runs AvailableNow on a Python source as one batch, "
                    "planned once (docs/operations.md, 'Spark versions'): nothing to plan "
                    "from the run's end")
    from confluent_kafka.admin import NewPartitions

    writer = topic_factory(2)
    writer.send([Record(p, 1_000 + i) for p in range(2) for i in range(12)])
    added = [Record(0, 5_000), Record(1, 5_000), Record(1, 5_001)]
    if broker.supports_create_partitions:
        added.append(Record(2, 6_000))

    class During(Batches):
        def collect(self, frame, batch_id: int) -> None:
            super().collect(frame, batch_id)
            if batch_id == 0:
                if broker.supports_create_partitions:
                    admin = broker.admin()   # kept until its answer: its handle answers
                    for future in admin.create_partitions(
                            [NewPartitions(writer.topic, 3)]).values():
                        future.result(30)
                writer.send(added)

    frame = kwatermark_stream(spark, broker, writer.topic, maxOffsetsPerTrigger=5)
    first, _ = run_available_now(frame, checkpoint, During())
    assert len(first.batches()) >= 5   # 24 records, 5 a batch: planned after the additions
    assert sorted((r["partition"], r["offset"]) for r in first.rows) == sorted(
        (p, o) for p in range(2) for o in range(12))
    second, _ = run_available_now(frame, checkpoint)
    assert sorted((r["partition"], r["offset"]) for r in second.rows) == sorted(
        [(0, 12), (1, 12), (1, 13)] + ([(2, 0)] if broker.supports_create_partitions else []))


def test_trigger_once_reads_everything_despite_max_offsets_per_trigger(
        spark, broker, topic_factory, checkpoint):
    writer = topic_factory(2)
    writer.send(records(2, 15))
    frame = kwatermark_stream(spark, broker, writer.topic, maxOffsetsPerTrigger=4)
    batches = Batches()
    query = (frame.writeStream.foreachBatch(batches.collect)
             .option("checkpointLocation", checkpoint).trigger(once=True).start())
    query.awaitTermination(120)
    assert [len(b) for b in batches.batches()] == [30]


def test_stop_and_restart_from_checkpoint_no_loss_no_duplicates(
        spark, broker, topic_factory, checkpoint):
    writer = topic_factory(2)
    writer.send(records(2, 10))
    frame = kwatermark_stream(spark, broker, writer.topic, maxOffsetsPerTrigger=7)
    seen = Batches()
    run_available_now(frame, checkpoint, seen)
    writer.send(records(2, 10, base=100_000))
    run_available_now(frame, checkpoint, seen)
    offsets = keyset(seen.rows)
    assert offsets == sorted((writer.topic, p, o) for p in range(2) for o in range(20))


def test_a_processing_time_trigger_plans_ahead_of_its_tick_reading_every_record_once(
        spark, broker, topic_factory, checkpoint):
    """Under a regular cadence (a 0.5 s trigger, 24 partitions) the end offsets are asked,
    and the last batch folded, just before the tick (docs/operations.md, "Planning ahead of
    the trigger"): such a batch's planning time is before its trigger's, and records
    produced all along are each read once, those after the early answer by the next
    batch."""
    partitions = 24
    writer = topic_factory(partitions)
    sent: list[tuple[int, int]] = []
    frame = kwatermark_stream(spark, broker, writer.topic)
    batches = Batches()
    query = (frame.writeStream.foreachBatch(batches.collect)
             .option("checkpointLocation", checkpoint)
             .trigger(processingTime="500 milliseconds").start())
    try:
        produced_until = time.monotonic() + 8
        round_ = 0
        while time.monotonic() < produced_until:   # records arriving between the ticks
            writer.send([Record(p, 1_000 + round_) for p in range(partitions)])
            sent += [(p, round_) for p in range(partitions)]
            round_ += 1
            time.sleep(0.05)
        deadline = time.monotonic() + 60
        while len(batches.rows) < len(sent) and time.monotonic() < deadline:
            time.sleep(0.2)
        progress = query.recentProgress
    finally:
        query.stop()
    assert sorted((r["partition"], r["offset"]) for r in batches.rows) == sorted(sent)
    ahead = []
    for event in progress:
        if event["numInputRows"] == 0:
            continue
        planned = progress_offset(event["sources"][0]["endOffset"])["@kwatermark"]["plannedAt"]
        trigger = epoch_ms(datetime.datetime.fromisoformat(event["timestamp"]))
        if planned < trigger:
            ahead.append(trigger - planned)
    assert ahead, "no batch was planned ahead of its trigger"
    assert max(ahead) <= 250   # cadence.FRESH_MS: never an older answer


def test_min_partitions_splits_a_large_range(spark, broker, topic_factory):
    writer = topic_factory(1)
    writer.send([Record(0, 1_000 + i) for i in range(100)])
    frame = kwatermark_batch(spark, broker, writer.topic, minPartitions=4)
    assert frame.rdd.getNumPartitions() == 4
    assert [r["offset"] for r in frame.orderBy("offset").collect()] == list(range(100))


def test_min_offsets_per_trigger_waits_until_max_trigger_delay(
        spark, broker, topic_factory, checkpoint):
    writer = topic_factory(1)
    writer.send([Record(0, 1_000 + i) for i in range(3)])
    frame = kwatermark_stream(spark, broker, writer.topic, minOffsetsPerTrigger=50,
                              maxTriggerDelay="4 seconds")
    batches = Batches()
    query = (frame.writeStream.foreachBatch(batches.collect)
             .option("checkpointLocation", checkpoint)
             .trigger(processingTime="500 milliseconds").start())
    try:
        time.sleep(2)
        early = len(batches.rows)
        deadline = time.time() + 60
        while not batches.rows and time.time() < deadline:
            time.sleep(0.5)
    finally:
        query.stop()
    assert early == 0
    assert len(batches.rows) == 3


def test_kafka_options_reach_librdkafka(spark, broker, topic_factory):
    writer = topic_factory(1)
    writer.send([Record(0, 1_000)])
    ok = kwatermark_batch(spark, broker, writer.topic, **{"kafka.client.id": "kw-test",
                                                          "kafka.fetch.max.bytes": "1048576"})
    assert ok.count() == 1
    with pytest.raises(Exception, match="kafka.auto.offset.reset is not supported"):
        kwatermark_batch(spark, broker, writer.topic,
                         **{"kafka.auto.offset.reset": "earliest"}).collect()
    with pytest.raises(Exception, match="No such configuration property"):
        kwatermark_batch(spark, broker, writer.topic,
                         **{"kafka.no.such.property": "1"}).collect()


def test_new_topic_matching_pattern_mid_query_is_read_from_earliest(
        spark, broker, topic_factory, checkpoint):
    first = topic_factory(1)
    prefix = first.topic
    first.send([Record(0, 1_000)])
    frame = kwatermark_stream(spark, broker, subscribePattern=f"{prefix}.*")
    seen = Batches()
    run_available_now(frame, checkpoint, seen)
    later = broker.create_topic(2, name=f"{prefix}-late")
    from tests.support.kafka import TopicWriter

    TopicWriter(broker, later).send([Record(0, 2_000), Record(1, 2_000), Record(1, 2_001)])
    run_available_now(frame, checkpoint, seen)
    assert keyset(seen.rows) == [(prefix, 0, 0), (later, 0, 0), (later, 1, 0), (later, 1, 1)]


@pytest.mark.parametrize("fail", [True, False])
def test_deleted_topic_mid_query(spark, broker, topic_factory, checkpoint, fail):
    # 17 partitions: the planner asks the end offsets of those it reads, the deleted ones
    # included, ahead of knowing which are gone (KafkaMetadata.ask_ahead, from 16 on).
    keep, gone = topic_factory(1), topic_factory(16)
    keep.send([Record(0, 1_000)])
    gone.send([Record(0, 1_000)])
    frame = kwatermark_stream(spark, broker, subscribe=f"{keep.topic},{gone.topic}",
                              failOnDataLoss=str(fail).lower())
    seen = Batches()
    run_available_now(frame, checkpoint, seen)
    broker.delete_topic(gone.topic)
    keep.send([Record(0, 2_000)])
    if fail:
        with pytest.raises(Exception, match=f"topic {gone.topic}, partition 0: the partition "
                                            f"is gone"):
            run_available_now(frame, checkpoint, seen)
    else:
        run_available_now(frame, checkpoint, seen)
        assert keyset(seen.rows) == sorted([(keep.topic, 0, 0), (keep.topic, 0, 1),
                                            (gone.topic, 0, 0)])


def test_starting_offsets_by_timestamp(spark, broker, topic_factory):
    if not broker.has_timestamp_index:
        pytest.skip("the Tansu test broker has no timestamp index (offsets_for_times); "
                    "runs against Apache Kafka (Docker or KAFKA_BOOTSTRAP_SERVERS)")
    writer = topic_factory(1)
    writer.send([Record(0, 1_000 * i) for i in range(1, 6)])
    frame = kwatermark_batch(spark, broker, writer.topic,
                             startingOffsetsByTimestamp=json.dumps({writer.topic: {"0": 3_000}}))
    assert [r["offset"] for r in frame.collect()] == [2, 3, 4]
    frame = kwatermark_batch(spark, broker, writer.topic, startingTimestamp=4_000)
    assert [r["offset"] for r in frame.collect()] == [3, 4]
