"""Task packing (DESIGN §12): small ranges of several partitions share one Spark task, and
nothing else changes: the same ranges, rows, offsets and progress records as one task per
range."""

from __future__ import annotations

import itertools
import json
import math
import os
import shutil
import tempfile
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kwatermark.arrow import OutputLayout
from kwatermark.ledger import record_columns, record_key
from kwatermark.offsets import BatchOffset, PartitionState, RangeTask, TaskColumns, pack_bounds
from kwatermark.options import DEFAULT_MIN_RECORDS_PER_PARTITION, parse_options
from kwatermark.planner import BatchPlanner, ReadLimits
from kwatermark.reader import Decoders
from tests.unit.test_progress_model import TOPIC, FakeBroker, read_task

pytestmark = pytest.mark.usefixtures("brokers_answer")


def pack_tasks(tasks, min_records, min_partitions, max_records) -> list[tuple]:
    """``offsets.pack_bounds`` of ``tasks``' sizes, as the packs of tasks it makes."""
    return [tuple(tasks[low:high]) for low, high in pack_bounds(
        [t.end - t.start for t in tasks], min_records, min_partitions, max_records)]


def ranges_of(sizes: list[int]) -> list[RangeTask]:
    return [RangeTask(TOPIC, p, 10, 10 + n, PartitionState(), True, None, 0)
            for p, n in enumerate(sizes)]


def sizes(pack: tuple[RangeTask, ...]) -> list[int]:
    return [t.end - t.start for t in pack]


def test_packing_off_is_one_task_per_range():
    tasks = ranges_of([5, 1, 7])
    assert pack_tasks(tasks, 1, None, None) == [(t,) for t in tasks]
    assert pack_tasks(tasks, None, 4, 2) == [(t,) for t in tasks]


def test_small_ranges_fill_a_task_up_to_min_records():
    # the last 10 records, less than half of 25, join the pack before them: a short task of
    # its own would wait for a core behind the others
    packs = pack_tasks(ranges_of([10] * 10 + [100, 5, 5]), 25, None, None)
    assert [sum(sizes(p)) for p in packs] == [30, 30, 30, 120]
    packs = pack_tasks(ranges_of([10] * 10 + [100, 5, 10]), 25, None, None)
    assert [sum(sizes(p)) for p in packs] == [30, 30, 30, 110, 15]
    assert [len(p) for p in pack_tasks(ranges_of([10] * 10), 1000, None, None)] == [10]
    # 40,960 records over 4,096 partitions, 20,000 a task: two tasks, not 2,000 + 2,000 + 96
    packs = pack_tasks(ranges_of([10] * 4096), 20_000, None, None)
    assert [len(p) for p in packs] == [2000, 2096]
    # kwatermark's packing before (rule 1, which a batch planned before an upgrade used)
    assert [hi - lo for lo, hi in pack_bounds([10] * 4096, 20_000, None, None, 1)] == \
        [2000, 2000, 96]


def test_min_partitions_and_max_records_per_partition_still_hold():
    tasks = ranges_of([10] * 10 + [100, 5, 5])
    assert [sum(sizes(p)) for p in pack_tasks(tasks, 1000, 4, None)] == [50, 50, 100, 10]
    assert [sum(sizes(p)) for p in pack_tasks(tasks, 1000, None, 30)] == [
        30, 30, 30, 10, 100, 10]
    # more tasks wanted than ranges: every range alone
    assert len(pack_tasks(tasks, 1000, 20, None)) == len(tasks)


@settings(deadline=None, max_examples=200)
@given(range_sizes=st.lists(st.integers(1, 500), min_size=0, max_size=60),
       min_records=st.one_of(st.none(), st.integers(1, 3000)),
       min_partitions=st.one_of(st.none(), st.integers(1, 80)),
       max_records=st.one_of(st.none(), st.integers(1, 1000)))
def test_packs_cover_every_range_once_in_order(range_sizes, min_records, min_partitions,
                                               max_records):
    tasks = ranges_of(range_sizes)
    packs = pack_tasks(tasks, min_records, min_partitions, max_records)
    assert packs == pack_tasks(list(tasks), min_records, min_partitions, max_records)
    assert [t for pack in packs for t in pack] == tasks
    assert all(packs)
    assert len(packs) >= min(min_partitions or 1, len(tasks))
    total = sum(range_sizes)
    uncapped = (min_partitions or 1) == 1 and not max_records
    for index, pack in enumerate(packs):
        if len(pack) > 1:
            assert sum(sizes(pack)) <= (max_records or math.inf)
            if min_partitions and min_partitions > 1:
                assert sum(sizes(pack)) <= math.ceil(total / min(min_partitions, len(tasks)))
            # a pack grows only while it is below the minimum; uncapped, the last one may
            # then take a rest of less than half the minimum that follows it
            grown = sizes(pack)
            if uncapped and index == len(packs) - 1 and sum(grown[:-1]) >= min_records:
                first = next(i for i in range(len(grown)) if sum(grown[:i + 1]) >= min_records)
                assert sum(grown[first + 1:]) < min_records / 2
                grown = grown[:first + 1]
            assert sum(grown[:-1]) < min_records
    if uncapped and min_records and len(packs) > 1:
        assert sum(sizes(packs[-1])) >= min_records / 2
    if not min_records or min_records <= 1:
        assert all(len(p) == 1 for p in packs)


def planner_for(n: int, ledger_dir: str, **extra: str) -> tuple[BatchPlanner, FakeBroker]:
    options = parse_options({"kafka.bootstrap.servers": "fake:9092",
                             "assign": json.dumps({TOPIC: list(range(n))}),
                             "startingOffsets": "earliest",
                             "watermark.strategy": "bounded",
                             "watermark.maxOutOfOrderness": "20 milliseconds",
                             "watermark.stateLocation": ledger_dir, **extra})
    planner = BatchPlanner(options, OutputLayout(), Decoders())
    broker = FakeBroker([(TOPIC, p) for p in range(n)])
    planner.metadata = broker
    return planner, broker


def drive(records: list[list[int]], batches: list[list[int]], ledger_dir: str,
          **extra: str) -> list[dict]:
    """Run every batch through the real planner, reading each Spark task's ranges as
    ``source._read`` does; per batch: the offset, the rows, the progress records by ledger
    key, and the Spark tasks."""
    planner, broker = planner_for(len(records), ledger_dir, **extra)
    # Every record is in the ledger: the fold must find it, never re-read a range.
    planner._recompute = mock.Mock(side_effect=AssertionError("a range was recomputed"))
    offset = planner.initial_offset()
    seen = []
    for counts in batches:
        for p, count in enumerate(counts):
            broker.ends[(TOPIC, p)] += count
        end = planner.latest_offset(BatchOffset.from_json(offset.to_json()), ReadLimits())
        if end is None:
            continue
        end = BatchOffset.from_json(json.loads(json.dumps(end.to_json())))
        packs = planner.packed_tasks(end)
        keys = planner.pack_keys(end)
        assert [t for pack in packs for t in pack] == planner.tasks(end)
        rows, progress = [], {}
        for pack, key in zip(packs, keys):
            pack_records = []
            for task in pack:
                task_rows, record = read_task(planner, task, records[task.partition], 7)
                pack_records.append(record)
                rows += [(r.tp, r.offset, r.event_time, r.watermark) for r in task_rows]
                progress[record_key(task, planner.fingerprint)] = record
            # As source._read: one ledger file per Spark task.
            planner.ledger.publish_pack(TaskColumns.of(pack), planner.fingerprint,
                                        record_columns(pack_records), key)
        seen.append({"offset": end.dumps(), "rows": sorted(rows), "progress": progress,
                     "tasks": [[(t.partition, t.start, t.end) for t in pack]
                               for pack in packs]})
        offset = end
    states, highest = planner.fold(BatchOffset.from_json(offset.to_json()))
    seen.append({"folded": {tp: s.to_json() for tp, s in states.items()}, "highest": highest})
    return seen


@st.composite
def streams(draw):
    n = draw(st.integers(2, 16))
    n_batches = draw(st.integers(1, 3))
    batches = [[draw(st.integers(0, 20)) for _ in range(n)] for _ in range(n_batches)]
    records = [draw(st.lists(st.integers(0, 400), min_size=sum(b[p] for b in batches),
                             max_size=sum(b[p] for b in batches))) for p in range(n)]
    extra = {"minRecordsPerPartition": str(draw(st.integers(2, 200)))}
    if draw(st.booleans()):
        extra["minPartitions"] = str(draw(st.integers(1, 30)))
    if draw(st.booleans()):
        extra["maxRecordsPerPartition"] = str(draw(st.integers(1, 40)))
    return records, batches, extra


@settings(deadline=None, max_examples=25)
@given(stream=streams())
def test_packing_changes_only_which_spark_task_reads_a_range(stream):
    """Offsets, rows, watermarks, progress records and the folded state are those of one
    task per range; only the grouping into Spark tasks differs."""
    records, batches, extra = stream
    # Offsets carry the processing time partitions were last planned: the same clock for
    # both; progress records are keyed by watermark.stateLocation too: the same location.
    with tempfile.TemporaryDirectory() as root, \
            mock.patch("kwatermark.planner.now_ms", return_value=1_700_000_000_000):
        ledger = os.path.join(root, "ledger")
        packed = drive(records, batches, ledger, **extra)
        shutil.rmtree(ledger, ignore_errors=True)
        alone = drive(records, batches, ledger, **{**extra, "minRecordsPerPartition": "1"})
    assert len(packed) == len(alone)
    for with_packing, without in zip(packed, alone):
        if "folded" in with_packing:
            assert with_packing == without
            continue
        assert with_packing["offset"] == without["offset"]
        assert with_packing["rows"] == without["rows"]
        assert with_packing["progress"] == without["progress"]
        assert [t for pack in with_packing["tasks"] for t in pack] == [
            t for pack in without["tasks"] for t in pack]
        assert all(len(pack) == 1 for pack in without["tasks"])
        assert len(with_packing["tasks"]) <= len(without["tasks"])


def test_small_partitions_share_tasks_by_default(tmp_path):
    records = [[100 + i for i in range(5)] for _ in range(64)]
    stages = drive(records, [[5] * 64], str(tmp_path))
    assert DEFAULT_MIN_RECORDS_PER_PARTITION > 64 * 5
    assert len(stages[0]["tasks"]) == 1
    assert len(stages[0]["tasks"][0]) == 64


def test_min_records_per_partition_option_is_validated():
    import pytest

    from kwatermark.errors import OptionError

    base = {"kafka.bootstrap.servers": "b:9092", "subscribe": "t"}
    assert parse_options(base).min_records_per_partition == DEFAULT_MIN_RECORDS_PER_PARTITION
    assert parse_options({**base, "minrecordsperpartition": "7"}).min_records_per_partition == 7
    with pytest.raises(OptionError, match="option minRecordsPerPartition"):
        parse_options({**base, "minRecordsPerPartition": "0"})


def test_a_lost_pack_is_recomputed_range_by_range_and_counted(tmp_path, caplog):
    """The driver finds a pack's records in its one file; without it, each range's own
    record (one the driver recomputed before) or, failing that, a recompute of the ranges
    still missing, together."""
    ledger = str(tmp_path / "ledger")
    planner, broker = planner_for(6, ledger)
    start = planner.initial_offset()
    for p in range(6):
        broker.ends[(TOPIC, p)] += 3
    end = planner.latest_offset(start, ReadLimits())
    [pack] = planner.packed_tasks(end)
    assert len(pack) == 6
    read = {task: read_task(planner, task, [100 + i for i in range(3)], 7)[1] for task in pack}
    planner.ledger.publish_pack(TaskColumns.of(pack), planner.fingerprint,
                                record_columns([read[t] for t in pack]),
                                planner.pack_keys(end)[0])
    planner._recompute = mock.Mock(side_effect=lambda tasks: [read[t] for t in tasks])
    expected = planner.fold(end)
    assert planner._recompute.call_count == 0
    shutil.rmtree(ledger)
    planner.ledger.publish(pack[1], planner.fingerprint, read[pack[1]])
    planner._folded = None
    with caplog.at_level("WARNING", logger="kwatermark.planner"):
        assert planner.fold(end) == expected
    # The five missing ranges are read together, in order (one consumer, as a pack).
    planner._recompute.assert_called_once_with([t for t in pack if t != pack[1]])
    assert "recomputed 5 of 6 ranges of the last batch on the driver" in caplog.text


def test_a_batch_packed_by_the_rule_before_folds_from_its_files(tmp_path, caplog):
    """A query upgraded between two batches: the last batch before was packed by
    kwatermark's rule before (packing 1: a short last pack on its own) and its Spark tasks
    wrote their records under that rule's packs and keys. The next planning folds it from
    those files: nothing recomputed, no warning, the same state as under today's packing."""
    from kwatermark.ledger import pack_keys

    ledger = str(tmp_path / "ledger")
    planner, broker = planner_for(7, ledger, minRecordsPerPartition="5")
    start = planner.initial_offset()
    for p in range(7):
        broker.ends[(TOPIC, p)] += 2
    end = planner.latest_offset(start, ReadLimits())
    tasks = planner.tasks(end)
    read = {task: read_task(planner, task, [100 + i for i in range(2)], 7)[1] for task in tasks}

    def publish(packs, keys) -> None:
        for pack, key in zip(packs, keys):   # as each Spark task does (source._read)
            planner.ledger.publish_pack(pack, planner.fingerprint,
                                        record_columns([read[t] for t in pack.tasks]), key)

    packs = planner.packed_tasks(end)
    assert [len(pack) for pack in packs] == [3, 4]   # 6 records, then 6 + a short 2
    publish(packs, planner.pack_keys(end))
    planner._recompute = mock.Mock(side_effect=AssertionError("a range was recomputed"))
    expected = planner.fold(end)

    shutil.rmtree(ledger)
    planner._folded = None
    before = planner._packs(TaskColumns.of(tasks), packing=1)
    assert [len(pack) for pack in before] == [3, 3, 1]
    # the keys kwatermark wrote before the rule was part of them
    publish(before, pack_keys(planner._json_of(end), planner.fingerprint, (5, None, None), 3))
    with caplog.at_level("WARNING"):
        assert planner.fold(end) == expected
    assert not caplog.records


def test_a_pack_fetches_per_request_its_partitions_worth_up_to_8_mb():
    from kwatermark.consumer import pack_fetch_bytes

    mib = 1_048_576                                            # librdkafka's partition default
    assert pack_fetch_bytes({}, 2) == 2 * mib
    assert pack_fetch_bytes({}, 3) == pack_fetch_bytes({}, 4) == 4 * mib   # a power of two
    assert pack_fetch_bytes({}, 512) == 8 * mib                # not librdkafka's 50 MB
    assert pack_fetch_bytes({"max.partition.fetch.bytes": "65536"}, 4) == 1_000_000
    assert pack_fetch_bytes({"max.partition.fetch.bytes": "65536"}, 64) == 4 * mib
    assert pack_fetch_bytes({"max.partition.fetch.bytes": "16777216"}, 8) == 16 * mib
    assert pack_fetch_bytes({"fetch.message.max.bytes": "2000000"}, 2) == 4_000_000
    assert pack_fetch_bytes({"max.partition.fetch.bytes": "65536",
                             "message.max.bytes": "100000"}, 2) == 131_072


def test_a_task_prefetches_an_eighth_of_its_range_not_past_it():
    """librdkafka refills its queue to queued.min.messages as the task consumes: what is
    queued when a range ends before the log does was fetched for nothing. Small ranges
    prefetch all they read; larger ones an eighth (at least 8,192), a power of two so a
    steady stream's tasks share a kept consumer; never more than 100,000. A user's
    kafka.queued.min.messages wins."""
    from kwatermark.consumer import prefetch, task_conf

    assert [prefetch(n) for n in (1, 2, 100, 5_000, 8_192)] == [1, 2, 128, 8_192, 8_192]
    assert prefetch(62_500) == 8_192            # was 65,536: a whole range past the end
    assert prefetch(250_000) == 32_768
    assert prefetch(500_000) == 65_536
    assert prefetch(1_000_000) == prefetch(10**9) == 100_000
    sizes = range(1, 2_000_000, 997)
    assert all(prefetch(a) <= prefetch(b) for a, b in itertools.pairwise(sizes))
    assert all(prefetch(n) & (prefetch(n) - 1) == 0 or prefetch(n) == 100_000 for n in sizes)
    assert all(prefetch(n) >= min(n, 8_192) for n in sizes)
    options = parse_options({"kafka.bootstrap.servers": "b:9092", "subscribe": "t"})
    assert task_conf(options, 62_500)["queued.min.messages"] == 8_192
    mine = parse_options({"kafka.bootstrap.servers": "b:9092", "subscribe": "t",
                          "kafka.queued.min.messages": "500"})
    assert task_conf(mine, 62_500)["queued.min.messages"] == "500"


def test_a_tasks_consumer_does_not_hold_a_fetch_at_the_log_end_unless_asked():
    """A worker's next task reads with the kept consumer, behind the Fetch its last task left
    at the log's end: the broker holds that one only 5 ms, not librdkafka's 500, unless the
    user sets kafka.fetch.wait.max.ms."""
    from kwatermark.consumer import task_conf

    def conf(**kafka: str) -> dict:
        return task_conf(parse_options({"kafka.bootstrap.servers": "b:9092", "subscribe": "t",
                                        **{f"kafka.{k}": v for k, v in kafka.items()}}), 100)

    assert conf()["fetch.wait.max.ms"] == 5
    assert conf(**{"fetch.wait.max.ms": "500"})["fetch.wait.max.ms"] == "500"


def test_offsets_are_asked_256_partitions_per_call_in_order_within_one_timeout():
    """librdkafka's ListOffsets handling grows faster than its partitions (4,096 in one call:
    ~70 ms, in sixteen calls ~16): offsets are asked 256 partitions at a time, every
    partition once and in order, and the calls share the caller's timeout."""
    from confluent_kafka import TopicPartition as KafkaTP

    from kwatermark.consumer import chunked_offsets

    calls: list[tuple[int, float]] = []

    class Consumer:
        def offsets_for_times(self, tps, timeout):
            calls.append((len(tps), timeout))
            return [KafkaTP(tp.topic, tp.partition, tp.partition * 10) for tp in tps]

    asked = [KafkaTP("t", p, -1) for p in range(1_100)]
    answer = chunked_offsets(Consumer(), asked, 5.0)
    assert [(tp.partition, tp.offset) for tp in answer] == [(p, p * 10) for p in range(1_100)]
    assert [n for n, _ in calls] == [256, 256, 256, 256, 76]
    assert all(0 < timeout <= 5.0 for _, timeout in calls)


def test_a_task_of_hundreds_of_partitions_parks_them_only_over_short_ranges():
    """The compiled engine parks a task's partitions at its end (keeping what it polled
    past its ranges, up to twice each range) rather than stopping them: always above 1,024
    partitions; above 64 when no partition's ranges add up to more than 1,024 records, so
    that what a consumer holds between tasks stays small."""
    from kwatermark.compiled import parks

    assert not parks(64, 80)          # a 64-partition topic's two tasks stop theirs
    assert parks(65, 80) and parks(256, 1024)
    assert not parks(256, 1025)       # long ranges: stopping costs little beside them
    assert parks(1025, 100_000) and parks(2048, 10)
