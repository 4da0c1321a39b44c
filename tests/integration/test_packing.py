"""Task packing (DESIGN §12) against the broker: ranges of many partitions read by one Spark
task and one consumer give exactly the rows, watermarks and progress records of one task
per range."""

from __future__ import annotations

import pyarrow as pa
from confluent_kafka import TopicPartition as KafkaTP
from pyspark.sql import functions as F

from kwatermark.arrow import OutputLayout
from kwatermark.consumer import open_consumer, partition_bounds
from kwatermark.offsets import PartitionState, RangeTask
from kwatermark.options import parse_options
from kwatermark.pack import PackReader
from kwatermark.reader import Decoders, RangeReader
from kwatermark.watermarks import NO_PARTITIONS
from tests.support.kafka import Record
from tests.support.streams import Batches, kwatermark_stream, run_available_now

PARTITIONS = 16
PER_PARTITION = 9


def skewed_records(partitions: int, per_partition: int) -> list[Record]:
    """Event times that run ahead in some partitions and out of order in others, so each
    partition's watermark (and so every row's) differs."""
    return [Record(p, 1_000 + i * (10 + p) - (7 * p if i % 3 == 1 else 0),
                   value=f"{p}-{i}".encode())
            for i in range(per_partition) for p in range(partitions)]


def rows_of(batch: pa.RecordBatch) -> list[tuple]:
    columns = ["partition", "offset", "value", "event_time", "watermark"]
    return list(zip(*(batch.column(c).to_pylist() for c in columns)))


def test_one_consumer_reads_a_pack_as_each_range_alone(broker, topic_factory, ledger_dir):
    """Sub-ranges of one partition, ranges whose partitions continue past them, and a
    range that starts from a watermark state: the same rows and progress records."""
    writer = topic_factory(6)
    writer.send(skewed_records(6, 20))
    options = parse_options({"kafka.bootstrap.servers": broker.bootstrap_servers,
                             "subscribe": writer.topic, "watermark.strategy": "bounded",
                             "watermark.maxOutOfOrderness": "5 milliseconds",
                             "watermark.stateLocation": ledger_dir,
                             "arrow.maxRecordsPerBatch": "4"})
    layout, decoders = OutputLayout(), Decoders()
    started = PartitionState(generator={"max_ts": 1_030})
    tasks = [RangeTask(writer.topic, 0, 0, 7, PartitionState(), True, 900, 950),
             RangeTask(writer.topic, 0, 7, 20, PartitionState(), True, 900, 950),
             RangeTask(writer.topic, 1, 3, 9, started, True, 900, 950),
             RangeTask(writer.topic, 2, 0, 20, PartitionState(), False, 900, NO_PARTITIONS),
             RangeTask(writer.topic, 4, 19, 20, started, True, None, 950),
             RangeTask(writer.topic, 5, 5, 6, PartitionState(), True, 900, 950)]
    alone_rows, alone_progress = [], []
    for task in tasks:
        reader = RangeReader(options, layout, decoders, task)
        alone_rows += [row for batch in reader for row in rows_of(batch)]
        alone_progress.append((task, reader.progress))
    pack = PackReader(options, layout, decoders, tasks)
    packed_rows = [row for batch in pack for row in rows_of(batch)]
    assert sorted(packed_rows) == sorted(alone_rows)
    assert len(packed_rows) == sum(t.end - t.start for t in tasks)
    assert pack.progress == alone_progress
    # The pack's one offset check per leader answers what librdkafka's per-partition
    # get_watermark_offsets does.
    consumer = open_consumer(options, 1)
    try:
        bounds = partition_bounds(consumer, options, tasks)
        assert bounds == {(writer.topic, p): consumer.get_watermark_offsets(
            KafkaTP(writer.topic, p), timeout=30, cached=False) for p in (0, 1, 2, 4, 5)}
        assert bounds[(writer.topic, 0)] == (0, 20)
    finally:
        consumer.close()


def run(spark, broker, topic: str, checkpoint: str, ledger: str, **options) -> Batches:
    frame = kwatermark_stream(spark, broker, topic, watermark__strategy="bounded",
                              watermark__maxOutOfOrderness="15 milliseconds",
                              watermark__stateLocation=ledger,
                              maxOffsetsPerTrigger=PARTITIONS * PER_PARTITION // 2, **options)
    frame = frame.withColumn("spark_task", F.spark_partition_id())
    batches, _ = run_available_now(frame, checkpoint)
    return batches


def test_packed_tasks_give_the_rows_and_watermarks_of_one_task_per_range(
        spark, broker, topic_factory, tmp_path):
    writer = topic_factory(PARTITIONS)
    writer.send(skewed_records(PARTITIONS, PER_PARTITION))
    packed = run(spark, broker, writer.topic, str(tmp_path / "cp-packed"),
                 str(tmp_path / "ledger-packed"))
    alone = run(spark, broker, writer.topic, str(tmp_path / "cp-alone"),
                str(tmp_path / "ledger-alone"), minRecordsPerPartition=1)

    def seen(batches: Batches) -> list[list[tuple]]:
        return [[(r["partition"], r["offset"], r["value"], r["event_time"], r["watermark"])
                 for r in batch] for batch in batches.batches()]

    assert seen(packed) == seen(alone)
    assert len(packed.batches()) >= 2
    assert sorted((p, o) for batch in seen(packed) for p, o, *_ in batch) == sorted(
        (p, o) for p in range(PARTITIONS) for o in range(PER_PARTITION))
    # Later batches carry watermarks: the comparison is not between nulls.
    assert any(r["watermark"] is not None for r in packed.batches()[-1])
    for with_packing, without in zip(packed.batches(), alone.batches()):
        ranges = {r["partition"] for r in without}
        assert len({r["spark_task"] for r in without}) == len(ranges)
        # Every range of the batch shares one task: far below the default minimum.
        assert len({r["spark_task"] for r in with_packing}) == 1


MANY = 160   # partitions: every Spark task of a batch reads more than PARK_PARTITIONS
MANY_PER_PARTITION = 12


def test_tasks_of_many_partitions_that_park_read_every_record_once(
        spark, broker, topic_factory, tmp_path):
    """A backlog of a topic of 160 partitions, read in ranges of a few records a partition:
    each task has more than ``compiled.PARK_PARTITIONS`` partitions and short ranges, so it
    parks them at its end (the records polled past its ranges kept, each partition paused
    where they end) and the next task on the worker resumes them. Every record is read
    exactly once, with the rows and watermarks of the Python engine, which stops its
    partitions at every task's end."""
    from kwatermark import compiled

    if compiled.unavailable() is not None:
        raise AssertionError(f"the compiled engine is not built: {compiled.unavailable()}")
    writer = topic_factory(MANY)
    writer.send(skewed_records(MANY, MANY_PER_PARTITION))

    def read(engine: str) -> list[list[tuple]]:
        frame = kwatermark_stream(spark, broker, writer.topic, readEngine=engine,
                                  watermark__strategy="bounded",
                                  watermark__maxOutOfOrderness="15 milliseconds",
                                  watermark__stateLocation=str(tmp_path / f"ledger-{engine}"),
                                  maxOffsetsPerTrigger=MANY * 3)
        frame = frame.withColumn("spark_task", F.spark_partition_id())
        batches, _ = run_available_now(frame, str(tmp_path / f"cp-{engine}"))
        for batch in batches.batches():
            per_task: dict[int, set] = {}
            for r in batch:
                per_task.setdefault(r["spark_task"], set()).add(r["partition"])
            assert min(map(len, per_task.values())) > compiled.PARK_PARTITIONS, \
                "a task of too few partitions to park"
        return [[(r["partition"], r["offset"], r["value"], r["event_time"], r["watermark"])
                 for r in batch] for batch in batches.batches()]

    parked = read("compiled")
    read_apart = [(p, o, v) for batch in parked for p, o, v, *_ in batch]
    assert len(parked) >= 3
    assert sorted(read_apart) == sorted(
        (p, o, f"{p}-{o}".encode()) for p in range(MANY) for o in range(MANY_PER_PARTITION))
    assert parked == read("python")
    assert any(r[4] is not None for r in parked[-1])
