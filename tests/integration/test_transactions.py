"""Issue 22: topics written by exactly-once producers and compacted topics (DESIGN §14).

Transaction markers, aborted records and compacted-away records leave offsets no consumer
ever gets. Every read here sets ``kafkaConsumer.pollTimeoutMs`` to 120 s and must finish far
below it (``finished_well_within``): a read that waited for a marker's offset, as issue 22
measured, fails. The ground truth is what the test wrote (offsets from the producer's
delivery reports) or a plain confluent-kafka consumer, never kwatermark's own view.
"""

from __future__ import annotations

import time

import pytest

from kwatermark.arrow import OutputLayout
from kwatermark.offsets import PartitionState, RangeTask
from kwatermark.options import parse_options
from kwatermark.pack import PackReader
from kwatermark.reader import Decoders, RangeReader
from kwatermark.watermarks import NO_PARTITIONS
from tests.support.kafka import Record
from tests.support.streams import Batches, kwatermark_batch, kwatermark_stream, run_available_now
from tests.support.transactions import (
    POLL_TIMEOUT_MS,
    TransactionalWriter,
    end_offsets,
    end_offsets_when_settled,
    expected,
    finished_well_within,
    plain_read,
)

ISOLATIONS = ["read_uncommitted", "read_committed"]
PATIENT = {"kafkaConsumer.pollTimeoutMs": str(POLL_TIMEOUT_MS), "failOnDataLoss": "true"}


def records(partitions: int, count: int, base: int, tag: str) -> list[Record]:
    return [Record(p, base + i, value=f"{tag}-{p}-{i}".encode(), key=f"k{i}".encode())
            for i in range(count) for p in range(partitions)]


def ten_transactions(writer: TransactionalWriter, partitions: int = 2, size: int = 50) -> None:
    """Issue 22's topic: 10 committed transactions of ``size`` records per partition."""
    for t in range(10):
        writer.commit(records(partitions, size, 1_000 * (t + 1), f"t{t}"))


def seen(rows) -> list[tuple[int, int, bytes]]:
    return sorted((r["partition"], r["offset"], bytes(r["value"])) for r in rows)


def truth(written) -> list[tuple[int, int, bytes]]:
    return sorted((w.partition, w.offset, w.value) for w in written)


def batch_read(spark, broker, topic: str, **options) -> list:
    started = time.monotonic()
    rows = kwatermark_batch(spark, broker, topic, **{**PATIENT, **options}).collect()
    finished_well_within(started)
    return rows


def available_now(spark, broker, topic: str, checkpoint: str, **options) -> Batches:
    started = time.monotonic()
    frame = kwatermark_stream(spark, broker, topic, **{**PATIENT, **options})
    batches, _ = run_available_now(frame, checkpoint)
    finished_well_within(started)
    return batches


def direct(broker, topic: str, isolation: str, **extra) -> tuple[object, OutputLayout,
                                                                   Decoders]:
    options = parse_options({"kafka.bootstrap.servers": broker.bootstrap_servers,
                             "subscribe": topic, "kafka.isolation.level": isolation,
                             **PATIENT, **extra})
    return options, OutputLayout(), Decoders()


def read_ranges(broker, topic: str, isolation: str, spans: list[tuple[int, int, int]],
                packed: bool) -> tuple[list[tuple[int, int, bytes]], list]:
    """Read ``(partition, from, to)`` ranges outside Spark, alone or as one pack."""
    options, layout, decoders = direct(broker, topic, isolation)
    tasks = [RangeTask(topic, p, a, b, PartitionState(), True, None, NO_PARTITIONS)
             for p, a, b in spans]
    started = time.monotonic()
    if packed:
        reader = PackReader(options, layout, decoders, tasks)
        batches = list(reader)
        progress = [record for _, record in reader.progress]
    else:
        batches, progress = [], []
        for task in tasks:
            one = RangeReader(options, layout, decoders, task)
            batches += list(one)
            progress.append(one.progress)
    finished_well_within(started)
    rows = [(p, o, v) for b in batches for p, o, v in zip(
        b.column("partition").to_pylist(), b.column("offset").to_pylist(),
        b.column("value").to_pylist())]
    return sorted(rows), progress


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_committed_transactions_batch_read_and_available_now(spark, broker, checkpoint,
                                                            isolation):
    """Issue 22's measurement: every range ends on a marker. Both reads return every
    record once, without waiting for the marker."""
    writer = TransactionalWriter(broker, broker.create_topic(2))
    ten_transactions(writer)
    want_ends = {0: 510, 1: 510}   # 10 markers each
    assert end_offsets_when_settled(broker, writer.topic, want_ends) == want_ends
    want = truth(writer.committed)
    assert seen(batch_read(spark, broker, writer.topic,
                           **{"kafka.isolation.level": isolation})) == want
    streamed = available_now(spark, broker, writer.topic, checkpoint,
                             **{"kafka.isolation.level": isolation,
                                "maxOffsetsPerTrigger": "205"})
    assert seen(streamed.rows) == want
    # Small triggers: ranges end on markers and in the middle of transactions alike.
    assert len(streamed.batches()) >= 5


def test_interleaved_committed_and_aborted_under_both_isolation_levels(spark, broker,
                                                                      checkpoint):
    writer = TransactionalWriter(broker, broker.create_topic(2))
    for t in range(6):
        batch = records(2, 7, 1_000 * (t + 1), f"t{t}")
        writer.commit(batch) if t % 2 == 0 else writer.abort(batch)
    writer.plain(records(2, 3, 9_000, "plain"))
    assert len(writer.committed) < len(writer.everything)
    for isolation in ISOLATIONS:
        want = truth(expected(writer, isolation, broker))
        rows = batch_read(spark, broker, writer.topic, **{"kafka.isolation.level": isolation})
        assert seen(rows) == want, isolation
        # The same as a plain consumer with that isolation level.
        assert [(p, o, v) for p, o, _, v in plain_read(broker, writer.topic, 2, isolation)] \
            == want
    streamed = available_now(spark, broker, writer.topic, checkpoint,
                             **{"kafka.isolation.level": "read_committed",
                                "maxOffsetsPerTrigger": "9"})
    assert seen(streamed.rows) == truth(expected(writer, "read_committed", broker))
    if broker.filters_aborted_records:
        assert not any(b"t1-" in bytes(r["value"]) for r in streamed.rows)


@pytest.mark.parametrize("packed", [False, True], ids=["alone", "packed"])
def test_ranges_of_only_markers_only_aborted_records_or_ending_on_them(broker, packed):
    """Each kind of range, read outside Spark so each range is exactly the one planned:
    done at once, with the records a plain consumer gets and a progress record each."""
    writer = TransactionalWriter(broker, broker.create_topic(3))
    first = writer.commit(records(3, 4, 1_000, "a"))       # offsets 0-3, marker 4
    writer.abort(records(3, 4, 2_000, "b"))                # offsets 5-8, marker 9
    writer.commit(records(3, 4, 3_000, "c"))               # offsets 10-13, marker 14
    assert {w.offset for w in first} == {0, 1, 2, 3}
    want_ends = {0: 15, 1: 15, 2: 15}
    assert end_offsets_when_settled(broker, writer.topic, want_ends) == want_ends
    spans = [(0, 4, 5),     # only a marker
             (0, 5, 10),    # only aborted records and their marker
             (0, 10, 15),   # ends on a marker at the log's end
             (1, 2, 7),     # starts inside one transaction, ends inside the next
             (1, 7, 12),
             (2, 0, 15)]    # markers at the end and in the middle
    for isolation in ISOLATIONS:
        rows, progress = read_ranges(broker, writer.topic, isolation, spans, packed)
        wanted = [(w.partition, w.offset, w.value) for w in expected(writer, isolation, broker)
                  if any(p == w.partition and a <= w.offset < b for p, a, b in spans)]
        assert rows == sorted(wanted), isolation
        assert len(progress) == len(spans)
        counts = [sum(1 for p, o, _ in rows if p == sp and a <= o < b) for sp, a, b in spans]
        assert [r.count for r in progress] == counts
        assert progress[0].count == 0
        if isolation == "read_committed" and broker.filters_aborted_records:
            assert progress[1].count == 0
            assert progress[1].max_event_ms is None   # watermark from delivered records only


def test_open_transaction_while_a_live_stream_runs(spark, broker, tmp_path):
    """read_committed plans to the last stable offset: records before an open transaction
    arrive while it stays open; its records arrive once it commits; an aborted one never.
    The stream goes quiet between steps (its last range ends on a marker)."""
    writer = TransactionalWriter(broker, broker.create_topic(2))
    writer.commit(records(2, 5, 1_000, "before"))
    # Tansu answers a read_committed ListOffsets with 0 while a transaction is open
    # (measured here): no last stable offset to plan to. There the stream reads
    # read_uncommitted, as Kafka's default: the open transaction's records as they come.
    isolation = "read_committed" if broker.filters_aborted_records else "read_uncommitted"
    frame = kwatermark_stream(spark, broker, writer.topic,
                              **{**PATIENT, "kafka.isolation.level": isolation})
    batches = Batches()
    query = (frame.writeStream.foreachBatch(batches.collect)
             .option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(processingTime="200 milliseconds").start())
    started = time.monotonic()
    try:
        assert wait_for_rows(batches, truth(writer.committed), query)
        writer.begin(records(2, 6, 2_000, "open"))
        # Committed by another producer while the first transaction stays open: above the
        # last stable offset, so under read_committed it waits for the open transaction, as
        # Kafka defines it.
        later = TransactionalWriter(broker, writer.topic).commit(records(2, 2, 2_500, "other"))
        # Quiet: a few triggers pass; nothing of the open transaction is read.
        time.sleep(2)
        if broker.filters_aborted_records:
            assert end_offsets(broker, writer.topic, 2, "read_committed") == {0: 6, 1: 6}
            assert seen(batches.rows) == truth(writer.committed)
        opened = writer.finish(commit=True)
        writer.abort(records(2, 3, 3_000, "aborted"))
        writer.commit(records(2, 2, 4_000, "after"))
        want = truth(writer.committed + later)
        if not broker.filters_aborted_records:
            want = truth(writer.everything + later)
        assert wait_for_rows(batches, want, query), (seen(batches.rows), want)
        assert {w.value for w in opened} <= {bytes(r["value"]) for r in batches.rows}
        assert query.exception() is None
    finally:
        query.stop()
    finished_well_within(started)


def wait_for_rows(batches: Batches, want: list, query, timeout_s: float = 60) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if query.exception() is not None:
            raise query.exception()
        if seen(batches.rows) == want:
            return True
        time.sleep(0.2)
    return False


def test_packed_task_whose_partitions_end_on_markers(spark, broker, checkpoint):
    """Many small partitions in one Spark task (minRecordsPerPartition): every range ends on
    a marker, some partitions hold only aborted records."""
    partitions = 8
    writer = TransactionalWriter(broker, broker.create_topic(partitions))
    for t in range(3):
        writer.commit(records(partitions, 3, 1_000 * (t + 1), f"c{t}"))
    writer.abort([Record(p, 9_000, value=f"x{p}".encode()) for p in range(0, partitions, 2)])
    for isolation in ISOLATIONS:
        rows = batch_read(spark, broker, writer.topic, minRecordsPerPartition="1000",
                          **{"kafka.isolation.level": isolation})
        assert seen(rows) == truth(expected(writer, isolation, broker)), isolation
    streamed = available_now(spark, broker, writer.topic, checkpoint,
                             minRecordsPerPartition="1000", maxOffsetsPerTrigger="40",
                             **{"kafka.isolation.level": "read_committed"})
    assert seen(streamed.rows) == truth(expected(writer, "read_committed", broker))


def test_restart_mid_topic_gives_every_record_once(spark, broker, tmp_path):
    """A query stopped after some batches and restarted from its checkpoint, with
    transactions written in between: every committed record once, and the partitions'
    progress continues from ranges that ended on markers."""
    writer = TransactionalWriter(broker, broker.create_topic(2))
    for t in range(4):
        writer.commit(records(2, 10, 1_000 * (t + 1), f"a{t}"))
    checkpoint, ledger = str(tmp_path / "cp"), str(tmp_path / "ledger")
    options = {"kafka.isolation.level": "read_committed", "maxOffsetsPerTrigger": "23",
               "watermark.strategy": "bounded", "watermark.maxOutOfOrderness": "1 second",
               "watermark.stateLocation": ledger}
    first = available_now(spark, broker, writer.topic, checkpoint, **options)
    writer.abort(records(2, 5, 8_000, "gone"))
    for t in range(3):
        writer.commit(records(2, 10, 10_000 + 1_000 * t, f"b{t}"))
    second = available_now(spark, broker, writer.topic, checkpoint, **options)
    both = first.rows + second.rows
    assert seen(both) == truth(expected(writer, "read_committed", broker))
    assert len({(r["partition"], r["offset"]) for r in both}) == len(both)
    # The watermark carried over the restart (it comes from delivered records only).
    assert all(r["watermark"] is not None for r in second.rows)


def compact_config() -> dict[str, str]:
    return {"cleanup.policy": "compact", "segment.ms": "100",
            "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "100",
            "min.compaction.lag.ms": "0", "max.compaction.lag.ms": "1000",
            "file.delete.delay.ms": "100"}


def keyed(rows) -> list[tuple[int, int, bytes, bytes]]:
    return sorted((r["partition"], r["offset"], bytes(r["key"]), bytes(r["value"]))
                  for r in rows)


def plain_view(broker, topic: str) -> list[tuple[int, int, bytes, bytes]]:
    return plain_read(broker, topic, 2)


def latest(rows: list[tuple[int, int, bytes, bytes]]) -> dict[tuple[int, bytes], bytes]:
    found = {}
    for p, _, k, v in sorted(rows):
        found[(p, k)] = v
    return found


def test_compacted_topic_reads_every_keys_latest_value(spark, broker, checkpoint):
    if broker.kind == "tansu":
        pytest.skip("Tansu does not compact (DESIGN §14); the marker tests here cover gaps "
                    "inside ranges on it")
    topic = broker.create_topic(2, config=compact_config())
    writer = TransactionalWriter(broker, topic)
    keys = [f"key{k}".encode() for k in range(6)]
    for rnd in range(8):
        writer.plain([Record(p, 1_000 * (rnd + 1) + p, key=k,
                             value=f"{rnd}-{k.decode()}".encode())
                      for p in range(2) for k in keys])
        time.sleep(0.2)   # past segment.ms: the next write rolls a segment, cleanable
    # A transaction too: compaction keeps its marker's gap and the record, the latest.
    writer.commit([Record(p, 20_000, key=keys[0], value=b"txn-final") for p in range(2)])
    # The active segment is never cleaned: keep rolling it until a plain consumer sees
    # records gone (the cleaner runs every second or so).
    deadline = time.monotonic() + 90
    while len(plain_view(broker, topic)) >= len(writer.written) / 2:
        assert time.monotonic() < deadline, "the broker did not compact the topic in 90 s"
        writer.plain([Record(p, 30_000, key=b"roll", value=b"roll") for p in range(2)])
        time.sleep(1)
    written = latest([(w.partition, w.offset, w.key, w.value) for w in writer.written])
    # Compaction only removes records, and may go on during the read: what kwatermark reads
    # lies between what a plain consumer reads before and after it.
    before = plain_view(broker, topic)
    got = keyed(batch_read(spark, broker, topic))
    after = plain_view(broker, topic)
    assert set(after) <= set(got) <= set(before)
    assert latest(got) == written
    # Gaps inside the ranges: the partitions still start at offset 0 (compaction keeps the
    # log start), most offsets below their ends are gone, and none was reported lost
    # (failOnDataLoss=true).
    assert sum(end_offsets(broker, topic, 2).values()) > 2 * len(got)
    streamed = available_now(spark, broker, topic, checkpoint, maxOffsetsPerTrigger="7")
    again = keyed(streamed.rows)
    assert set(plain_view(broker, topic)) <= set(again) <= set(before)
    assert len({(p, o) for p, o, _, _ in again}) == len(again)
    assert latest(again) == written


def test_ground_truth_offsets_are_those_a_plain_consumer_reads(broker):
    """Sanity of the ground truth: offsets from delivery reports are those a plain
    consumer returns."""
    writer = TransactionalWriter(broker, broker.create_topic(1))
    writer.commit(records(1, 3, 1_000, "x"))
    writer.abort(records(1, 2, 2_000, "y"))
    plain = plain_read(broker, writer.topic, 1, "read_uncommitted")
    assert [(p, o, v) for p, o, _, v in plain] == truth(writer.everything)
