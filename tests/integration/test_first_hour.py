"""Issue 14: what a new user meets in the first hour, against the real broker and Spark:
empty and missing topics, a wrong address, the Schema Registry's default subject, error texts.
"""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from kwatermark.broker import NEVER_REACHED_BUDGET_MS, KafkaMetadata
from kwatermark.options import parse_options
from kwatermark.planner import BatchPlanner
from kwatermark.rdkafka_log import LOGGER_NAME
from tests.support.kafka import Record, TestBroker
from tests.support.streams import kwatermark_batch, kwatermark_stream, run_available_now


def missing_topic_name(broker) -> str:
    name = f"absent-{threading.get_ident()}-{id(broker)}"
    assert name not in broker.admin().list_topics(timeout=10).topics
    return name


# -- 1. empty reads ------------------------------------------------------------------------

def test_batch_read_of_an_empty_topic_is_an_empty_dataframe(spark, broker, topic_factory):
    writer = topic_factory(2)
    frame = kwatermark_batch(spark, broker, writer.topic)
    assert frame.collect() == []
    assert "watermark" in frame.columns


def test_batch_read_of_a_pattern_matching_nothing_is_an_empty_dataframe(spark, broker):
    frame = (spark.read.format("kwatermark")
             .option("kafka.bootstrap.servers", broker.bootstrap_servers)
             .option("subscribePattern", "no-topic-is-called-this-[0-9]+").load())
    assert frame.collect() == []


def test_batch_read_of_a_missing_topic_says_it_does_not_exist(spark, broker):
    name = missing_topic_name(broker)
    with pytest.raises(Exception, match=f"option subscribe: topic {name} does not exist on "
                                        f"kafka.bootstrap.servers="):
        kwatermark_batch(spark, broker, name).collect()
    # Asked for by name only (not the whole cluster's metadata), and still not created,
    # although the project's broker creates a topic that a metadata request names.
    assert name not in broker.admin().list_topics(timeout=10).topics


# -- 2. missing topics ---------------------------------------------------------------------

@pytest.mark.parametrize("read", ["batch", "stream"])
def test_assign_to_a_missing_topic_says_it_does_not_exist(spark, broker, read, checkpoint):
    name = missing_topic_name(broker)
    assign = json.dumps({name: [0]})
    if read == "batch":
        with pytest.raises(Exception, match=f"option assign: topic {name} does not exist"):
            kwatermark_batch(spark, broker, None, assign=assign).collect()
        return
    frame = kwatermark_stream(spark, broker, None, assign=assign)
    with pytest.raises(Exception, match=f"option assign: topic {name} does not exist"):
        run_available_now(frame, checkpoint)


@pytest.mark.parametrize("read", ["batch", "stream"])
def test_assign_to_a_partition_past_the_topic_end_reads_the_others_and_names_it(
        spark, broker, topic_factory, read, checkpoint, caplog):
    # As Spark's Kafka source does (AssignStrategy keeps the assigned partitions that
    # exist); the warning is logged in Spark's driver-side Python process, so it is read
    # from a planner driven directly, against the same broker.
    writer = topic_factory(2)
    writer.send([Record(0, 1_000), Record(1, 2_000)])
    assign = json.dumps({writer.topic: [0, 5]})
    if read == "batch":
        rows = kwatermark_batch(spark, broker, None, assign=assign).collect()
    else:
        rows = run_available_now(kwatermark_stream(spark, broker, None, assign=assign),
                                 checkpoint)[0].rows
    assert [(r["partition"], r["offset"]) for r in rows] == [(0, 0)]
    options = parse_options({"kafka.bootstrap.servers": broker.bootstrap_servers,
                             "assign": assign})
    planner = BatchPlanner(options, None, None)
    with caplog.at_level(logging.WARNING, logger="kwatermark.planner"):
        for _ in range(3):
            assert planner.assigned() == [(writer.topic, 0)]
    warnings = [r.getMessage() for r in caplog.records if r.name == "kwatermark.planner"]
    assert warnings == [(f"option assign: topic {writer.topic} has no partition 5 on "
                         f"kafka.bootstrap.servers={broker.bootstrap_servers!r}; the assigned "
                         f"partitions that exist are read, and partition 5 from its earliest "
                         f"offset if it is created")]


def test_stream_subscribed_to_a_missing_topic_fails_naming_it(spark, broker, checkpoint):
    # Spark's Kafka source fails such a query too (UnknownTopicOrPartitionException): a
    # mistyped topic must not give a query that runs and reads nothing.
    name = missing_topic_name(broker)
    with pytest.raises(Exception, match=f"option subscribe: topic {name} does not exist on "
                                        f"kafka.bootstrap.servers="):
        run_available_now(kwatermark_stream(spark, broker, name), checkpoint)


def test_a_subscribed_topic_deleted_while_the_stream_runs_is_warned_about_rarely(
        broker, topic_factory, caplog):
    # Only a topic the query has never read is an error when it starts; one that disappears
    # later is data loss (failOnDataLoss, test_source.py) and a warning while it is gone.
    # The planner is driven directly so the test can read the warning.
    writer = topic_factory(1)
    options = parse_options({"kafka.bootstrap.servers": broker.bootstrap_servers,
                             "subscribe": writer.topic})
    planner = BatchPlanner(options, None, None)
    first = planner.initial_offset()
    assert list(first.partitions) == [(writer.topic, 0)]
    broker.delete_topic(writer.topic)
    with caplog.at_level(logging.WARNING, logger="kwatermark.planner"):
        deadline = time.monotonic() + 30   # the deletion reaches the metadata soon after
        while planner.assigned() and time.monotonic() < deadline:
            time.sleep(0.2)
        for _ in range(5):
            assert planner.assigned() == []
    warnings = [r.getMessage() for r in caplog.records if r.name == "kwatermark.planner"]
    assert warnings == [(f"option subscribe: topic {writer.topic} does not exist on "
                         f"kafka.bootstrap.servers={broker.bootstrap_servers!r}; nothing is "
                         f"read from it until it is created")]


# -- 3. a wrong address --------------------------------------------------------------------

def test_wrong_address_fails_naming_it_and_saying_no_broker_answered(spark):
    wrong = TestBroker("127.0.0.1:1", "external")
    with pytest.raises(Exception) as failure:
        kwatermark_batch(spark, wrong, "events").collect()
    text = str(failure.value)
    assert "kafka.bootstrap.servers='127.0.0.1:1'" in text
    assert "no broker has answered since the query started: is the address right?" in text


def test_never_reached_gets_the_short_budget_a_reached_broker_the_long_one(broker):
    options = parse_options({"kafka.bootstrap.servers": broker.bootstrap_servers,
                             "subscribe": "x", "kafkaConsumer.pollTimeoutMs": "100000"})
    metadata = KafkaMetadata(options)
    assert metadata.budget_ms == NEVER_REACHED_BUDGET_MS < 100_000
    metadata.topics()
    assert metadata.budget_ms == 100_000


def test_librdkafka_lines_are_rate_limited(caplog, monkeypatch):
    # A fresh rate limit: lines of the same kind logged earlier in this process would hide
    # this test's one.
    monkeypatch.setattr(logging.getLogger(LOGGER_NAME), "filters", [])
    wrong = parse_options({"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "x",
                           "kafkaConsumer.pollTimeoutMs": "3000",
                           "fetchOffset.numRetries": "0"})
    metadata = KafkaMetadata(wrong)
    with caplog.at_level(logging.DEBUG, logger=LOGGER_NAME):
        with pytest.raises(Exception, match="127.0.0.1:1"):
            metadata.topics()
        metadata.admin.poll(0.5)  # serves librdkafka's queued log lines
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER_NAME]
    refused = [line for line in lines if "Connection refused" in line]
    # librdkafka retries the connection many times in 3 s; one line of the kind passes.
    assert len(refused) == 1, lines


# -- 5. Confluent Schema Registry: TopicNameStrategy -----------------------------------------

ORDER = {"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"}]}


def test_avro_confluent_defaults_to_the_topic_name_strategy_subject(
        spark, broker, topic_factory, schema_registry):
    writer = topic_factory(1)
    client = SchemaRegistryClient({"url": schema_registry.url})
    serialize = AvroSerializer(client, json.dumps(ORDER))  # registers <topic>-value
    ctx = SerializationContext(writer.topic, MessageField.VALUE)
    writer.send([Record(0, 1_000, serialize({"id": i}, ctx)) for i in (1, 2)])
    # No reader schema and no subject option: only <topic>-value can give the type.
    for subscription in ({"subscribe": writer.topic},
                         {"assign": json.dumps({writer.topic: [0]})}):
        rows = kwatermark_batch(spark, broker, None,
                                **{"value.format": "avro-confluent",
                                   "value.schema.registry.url": schema_registry.url},
                                **subscription).collect()
        assert [r["value_decoded"]["id"] for r in rows] == [1, 2]


def test_avro_confluent_without_a_derivable_subject_names_the_options(
        spark, broker, topic_factory, schema_registry):
    a, b = topic_factory(1), topic_factory(1)
    for subscription in ({"subscribe": f"{a.topic},{b.topic}"},
                         {"subscribePattern": "t-.*"}):
        with pytest.raises(Exception, match="set value.avro.readerSchema, "
                                            "value.avro.schema or "
                                            "value.schema.registry.subject"):
            kwatermark_batch(spark, broker, None,
                             **{"value.format": "avro-confluent",
                                "value.schema.registry.url": schema_registry.url},
                             **subscription).collect()


def test_avro_confluent_default_subject_missing_names_it(spark, broker, topic_factory,
                                                         schema_registry):
    writer = topic_factory(1)
    with pytest.raises(Exception, match=f"'{writer.topic}-value': Confluent's TopicNameStrategy"):
        kwatermark_batch(spark, broker, writer.topic,
                         **{"value.format": "avro-confluent",
                            "value.schema.registry.url": schema_registry.url}).collect()


# -- 6. error texts ------------------------------------------------------------------------

def test_misspelt_option_through_spark_suggests_the_documented_spelling(spark, broker):
    with pytest.raises(Exception, match="unknown option 'maxoffsetpertrigger' \\(as Spark passes "
                                        "it: .*did you mean 'maxOffsetsPerTrigger'"):
        kwatermark_stream(spark, broker, "events", maxOffsetPerTrigger="10")


def test_user_schema_on_a_stream_is_refused_naming_the_columns(spark, broker, topic_factory,
                                                               checkpoint):
    writer = topic_factory(1)
    frame = (spark.readStream.format("kwatermark").schema("value BINARY")
             .option("kafka.bootstrap.servers", broker.bootstrap_servers)
             .option("subscribe", writer.topic).load())
    with pytest.raises(Exception, match="does not accept a user-specified schema"):
        run_available_now(frame, checkpoint)


# -- 7. behaviour the docs describe ----------------------------------------------------------

def test_misspelt_kafka_property_is_an_option_error_naming_it(spark, broker, topic_factory):
    writer = topic_factory(1)
    with pytest.raises(Exception, match=r"OptionError: a kafka\.\* option was refused by "
                                        r"librdkafka: No such configuration property: "
                                        r"\"sesion\.timeout\.ms\""):
        kwatermark_batch(spark, broker, writer.topic,
                         **{"kafka.sesion.timeout.ms": "10000"}).collect()


def test_first_batch_runs_even_with_nothing_to_read_and_starts_at_latest(
        spark, broker, topic_factory, checkpoint):
    writer = topic_factory(1)
    writer.send([Record(0, 1_000), Record(0, 2_000)])
    frame = (spark.readStream.format("kwatermark")  # startingOffsets left at its default
             .option("kafka.bootstrap.servers", broker.bootstrap_servers)
             .option("subscribe", writer.topic).load())
    batches, _ = run_available_now(frame, checkpoint)
    # Spark always runs batch 0 (from the starting offsets); later ones only with new records.
    assert batches.by_id == {0: []}
    batches, _ = run_available_now(frame, checkpoint)
    assert batches.by_id == {}
