"""kwatermark as a drop-in for Spark's own Kafka source (DESIGN §17, issue 21).

The same topics are read through ``format("kafka")`` and ``format("kwatermark")`` with the
same options, in one child SparkSession on PySpark 4.2.0 (Maven Central serves Spark's
connector up to 4.2.0 only; tests/support/sparkkafka.py). Both must give the same rows in
Spark's Kafka columns and the same schema for them; the expected rows come from a plain
confluent-kafka consumer, never from either source.
"""

from __future__ import annotations

import json
import uuid

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from tests.support.sparkkafka import REPO_ROOT, run_baseline

pytestmark = pytest.mark.broker

BASE_TS = 1_700_000_000_000  # ms; record i of partition p has BASE_TS + p*100_000 + i*1000
PER_PARTITION = 30
MAX_OFFSETS = 20


def _headers(p: int, i: int):
    if i % 2 == 0:
        return None  # Spark gives null headers for a record without any
    if i % 5 == 0:
        return [("h", None), ("h", b"dup")]  # a null header value, a repeated name
    return [("seq", str(i).encode()), ("part", str(p).encode())]


def _produce_plain(bootstrap: str, topic: str, partitions: int, per_partition: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for p in range(partitions):
        for i in range(per_partition):
            producer.produce(
                topic, partition=p, timestamp=BASE_TS + p * 100_000 + i * 1000,
                key=None if i % 3 == 0 else f"k{p}-{i}".encode(),
                value=None if i == 7 else f"value {p}-{i}".encode(),  # one tombstone
                headers=_headers(p, i))
    producer.flush(30)


def _produce_transactional(bootstrap: str, topic: str, partitions: int) -> None:
    """Committed, aborted, committed: aborted records and transaction markers sit in the
    log, so offsets have gaps and isolation.level matters."""
    producer = Producer({"bootstrap.servers": bootstrap,
                         "transactional.id": f"dropin-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(30)
    for txn, (count, commit) in enumerate([(5, True), (3, False), (4, True)]):
        producer.begin_transaction()
        for p in range(partitions):
            for i in range(count):
                producer.produce(topic, partition=p, key=f"t{txn}".encode(),
                                 value=f"txn {txn} {p}-{i}".encode(),
                                 timestamp=BASE_TS + txn * 10_000 + i)
        if commit:
            producer.commit_transaction(30)
        else:
            # abort_transaction purges what is still queued: flush so the aborted records
            # are in the log, as a producer that failed half-way leaves them.
            producer.flush(30)
            producer.abort_transaction(30)


def _ground_truth(bootstrap: str, topics: dict[str, int], isolation: str) -> list[list]:
    """Every record, as a plain consumer sees it, in the child's encoding."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "dropin-truth",
                         "enable.auto.commit": False, "isolation.level": isolation,
                         "enable.partition.eof": True})
    rows = []
    try:
        assigned = [TopicPartition(t, p, OFFSET_BEGINNING)
                    for t, n in topics.items() for p in range(n)]
        pending = {(tp.topic, tp.partition) for tp in assigned
                   if consumer.get_watermark_offsets(tp, 30)[1] > 0}
        consumer.assign(assigned)
        while pending:
            msg = consumer.poll(30)
            assert msg is not None, f"no record within 30 s; waiting for {pending}"
            if msg.error():
                assert msg.error().code() == -191, msg.error()  # _PARTITION_EOF
                pending.discard((msg.topic(), msg.partition()))
                continue
            ts_type, ts = msg.timestamp()
            headers = msg.headers()
            rows.append([
                None if msg.key() is None else msg.key().hex(),
                None if msg.value() is None else msg.value().hex(),
                msg.topic(), msg.partition(), msg.offset(), ts * 1000,
                ts_type - 1,  # librdkafka's 1 = CreateTime, Kafka's Java id is 0
                None if headers is None else [[k, None if v is None else v.hex()]
                                              for k, v in headers]])
    finally:
        consumer.close()
    return sorted(rows, key=lambda r: (r[2], r[3], r[4]))


def _no_headers(rows: list[list]) -> list[list]:
    return [r[:7] for r in rows]


@pytest.fixture(scope="module")
def dropin(broker, tmp_path_factory):
    """Topics, their ground truth, and every case read through both sources in one child."""
    bs = broker.bootstrap_servers
    prefix = f"dropin-{uuid.uuid4().hex[:8]}"
    a, b, tx, other = f"{prefix}-a", f"{prefix}-b", f"{prefix}-tx", f"other-{prefix}"
    broker.create_topic(3, name=a)
    broker.create_topic(2, name=b)
    broker.create_topic(2, name=tx)
    broker.create_topic(1, name=other)
    _produce_plain(bs, a, 3, PER_PARTITION)
    _produce_plain(bs, b, 2, 10)
    _produce_plain(bs, other, 1, 5)
    _produce_transactional(bs, tx, 2)
    # Differences 1-4 of issue 33: a pattern found in a part of a name; an assigned partition
    # that does not exist; a topic that does not exist; a topic deleted and recreated.
    found = {name: f"{prefix}-{name}" for name in ("ct", "lat", "ct-x")}
    for topic in found.values():
        broker.create_topic(1, name=topic)
        _produce_plain(bs, topic, 1, 12)
    absent = f"{prefix}-absent"
    loss = f"{prefix}-loss-{{fmt}}"     # one topic per format: the child substitutes it
    for fmt in ("kafka", "kwatermark"):
        broker.create_topic(2, name=loss.replace("{fmt}", fmt))
        _produce_plain(bs, loss.replace("{fmt}", fmt), 2, 10)

    truth = {
        "a": _ground_truth(bs, {a: 3}, "read_uncommitted"),
        "b": _ground_truth(bs, {b: 2}, "read_uncommitted"),
        "tx_uncommitted": _ground_truth(bs, {tx: 2}, "read_uncommitted"),
        "tx_committed": _ground_truth(bs, {tx: 2}, "read_committed"),
        "found": _ground_truth(bs, {t: 1 for t in found.values()}, "read_uncommitted"),
        "loss_before": {fmt: _ground_truth(bs, {loss.replace("{fmt}", fmt): 2},
                                           "read_uncommitted") for fmt in ("kafka", "kwatermark")},
    }
    ts = {p: BASE_TS + p * 100_000 for p in range(3)}
    headers = {"includeHeaders": "true"}
    # kwatermark's reader on main asks librdkafka for as many records as the range has
    # offsets and so waits out kafkaConsumer.pollTimeoutMs (120 s) at a range whose offsets
    # include transaction markers (the txn branch reads to the consumer's position instead).
    # Both sources poll with this shorter timeout here, so the test stays short meanwhile.
    tx_poll = {"kafkaConsumer.pollTimeoutMs": "15000"}
    cases = [
        ("batch_subscribe", "batch", {"subscribe": a, **headers}),
        ("stream_subscribe", "stream",
         {"subscribe": a, "startingOffsets": "earliest", **headers}),
        ("batch_two_topics", "batch", {"subscribe": f"{a},{b}"}),
        ("batch_offsets_json", "batch",
         {"subscribe": a, **headers,
          "startingOffsets": json.dumps({a: {"0": 5, "1": -2, "2": 10}}),
          "endingOffsets": json.dumps({a: {"0": 20, "1": -1, "2": 25}})}),
        ("stream_offsets_json", "stream",
         {"assign": json.dumps({a: [0, 2]}),
          "startingOffsets": json.dumps({a: {"0": 12, "2": -2}})}),
        ("batch_earliest_latest", "batch",
         {"subscribe": a, "startingOffsets": "earliest", "endingOffsets": "latest"}),
        ("stream_latest", "stream", {"subscribe": a, "startingOffsets": "latest"}),
        ("batch_assign", "batch", {"assign": json.dumps({a: [0, 2], b: [1]}), **headers}),
        ("batch_pattern", "batch", {"subscribePattern": f"{prefix}-(a|b)"}),
        ("stream_pattern", "stream",
         {"subscribePattern": f"{prefix}-[ab]", "startingOffsets": "earliest"}),
        ("batch_by_timestamp", "batch",
         {"subscribe": a, "startingOffsetsByTimestamp": json.dumps(
             {a: {"0": ts[0] + 4_500, "1": ts[1], "2": ts[2] + 29_000}})}),
        ("batch_starting_timestamp", "batch",
         {"subscribe": a, "startingTimestamp": str(ts[1] + 10_000),
          "startingOffsetsByTimestampStrategy": "latest"}),
        ("batch_ending_by_timestamp", "batch",
         {"subscribe": a, "endingOffsetsByTimestamp": json.dumps(
             {a: {"0": ts[0] + 10_000, "1": ts[1] + 29_500, "2": ts[2]}})}),
        ("batch_ending_timestamp", "batch",
         {"subscribe": a, "endingTimestamp": str(ts[1] + 15_000)}),
        ("batch_min_partitions", "batch", {"subscribe": a, "minPartitions": "7"}),
        ("batch_max_records_per_partition", "batch",
         {"subscribe": a, "maxRecordsPerPartition": "8"}),
        ("stream_starting_timestamp", "stream",
         {"subscribe": a, "startingTimestamp": str(ts[0] + 20_000)}),
        ("stream_max_offsets", "stream",
         {"subscribe": a, "startingOffsets": "earliest",
          "maxOffsetsPerTrigger": str(MAX_OFFSETS)}),
        ("batch_tx_default", "batch", {"subscribe": tx, **tx_poll}),
        ("batch_tx_committed", "batch",
         {"subscribe": tx, "kafka.isolation.level": "read_committed", **tx_poll}),
        ("stream_tx_committed", "stream",
         {"subscribe": tx, "startingOffsets": "earliest",
          "kafka.isolation.level": "read_committed", **tx_poll}),
        ("batch_pattern_found", "batch", {"subscribePattern": f"{prefix}-(ct|lat)"}),
        ("stream_pattern_found", "stream",
         {"subscribePattern": f"{prefix}-(ct|lat)", "startingOffsets": "earliest"}),
        ("batch_pattern_anchored", "batch", {"subscribePattern": f"^{prefix}-(ct|lat)$"}),
        ("batch_assign_missing_partition", "batch", {"assign": json.dumps({b: [0, 5]})}),
        ("stream_assign_missing_partition", "stream",
         {"assign": json.dumps({b: [0, 5]}), "startingOffsets": "earliest"}),
        ("batch_missing_topic", "batch", {"subscribe": absent}),
        ("stream_missing_topic", "stream", {"subscribe": absent}),
    ]
    # Read, delete the topic, create it again with fewer records, read on: last, since it
    # deletes topics while the child runs.
    recreate = [{"run": True}, {"delete": loss}, {"create": loss, "partitions": 2},
                {"produce": loss, "records": [[p, BASE_TS + 500_000 + i, f"k{p}-{i}",
                                               f"new {p}-{i}"] for p in range(2)
                                              for i in range(3)]},
                {"run": True}]
    request = {"bootstrap": bs, "checkpoints": str(tmp_path_factory.mktemp("dropin")),
               "cases": [{"name": n, "mode": m, "options": o} for n, m, o in cases] + [
                   {"name": "stream_recreated_topic", "mode": "stream", "steps": recreate,
                    "options": {"subscribe": loss, "startingOffsets": "earliest",
                                "failOnDataLoss": "false"}}]}
    reply = run_baseline(REPO_ROOT / "tests" / "support" / "dropin_compare.py", request,
                         timeout=1500)
    truth["loss_after"] = {fmt: _ground_truth(bs, {loss.replace("{fmt}", fmt): 2},
                                              "read_uncommitted")
                           for fmt in ("kafka", "kwatermark")}
    return {"topics": {"a": a, "b": b, "tx": tx, "absent": absent}, "truth": truth, "ts": ts,
            "spark_version": reply["spark_version"], "cases": reply["cases"]}


def _both(dropin, name: str) -> tuple[dict, dict]:
    case = dropin["cases"][name]
    for fmt in ("kafka", "kwatermark"):
        assert "error" not in case[fmt], f"{name}, format({fmt!r}) failed:\n{case[fmt]['error']}"
    return case["kafka"], case["kwatermark"]


def _check(dropin, name: str, expected: list[list]) -> tuple[dict, dict]:
    spark, ours = _both(dropin, name)
    assert spark["schema"] == ours["schema"], name
    assert spark["rows"] == expected, f"{name}: format('kafka') differs from the consumer"
    assert ours["rows"] == expected, f"{name}: format('kwatermark') differs from the consumer"
    return spark, ours


def test_the_baseline_is_spark_with_its_own_connector(dropin):
    assert dropin["spark_version"] == "4.2.0"


def test_schema_is_sparks_kafka_schema(dropin):
    spark, _ = _check(dropin, "batch_subscribe", dropin["truth"]["a"])
    assert [(f["name"], f["type"] if isinstance(f["type"], str) else f["type"]["type"])
            for f in spark["schema"]["fields"]] == [
        ("key", "binary"), ("value", "binary"), ("topic", "string"), ("partition", "integer"),
        ("offset", "long"), ("timestamp", "timestamp"), ("timestampType", "integer"),
        ("headers", "array")]


def test_batch_and_stream_read_every_record_with_keys_and_headers(dropin):
    truth = dropin["truth"]["a"]
    assert any(r[0] is None for r in truth) and any(r[7] is None for r in truth)
    assert any(h[1] is None for r in truth if r[7] for h in r[7])
    _check(dropin, "batch_subscribe", truth)
    _check(dropin, "stream_subscribe", truth)
    _check(dropin, "batch_earliest_latest", _no_headers(truth))
    _check(dropin, "batch_two_topics",
           _no_headers(sorted(truth + dropin["truth"]["b"], key=lambda r: (r[2], r[3], r[4]))))


def test_offsets_as_json(dropin):
    a = dropin["topics"]["a"]
    bounds = {0: (5, 20), 1: (0, PER_PARTITION), 2: (10, 25)}
    _check(dropin, "batch_offsets_json",
           [r for r in dropin["truth"]["a"] if bounds[r[3]][0] <= r[4] < bounds[r[3]][1]])
    starts = {0: 12, 2: 0}
    _check(dropin, "stream_offsets_json",
           [r for r in _no_headers(dropin["truth"]["a"])
            if r[2] == a and r[3] in starts and r[4] >= starts[r[3]]])


def test_latest_start_reads_nothing_already_there(dropin):
    _check(dropin, "stream_latest", [])


def test_assign_and_subscribe_pattern(dropin):
    a, b = dropin["topics"]["a"], dropin["topics"]["b"]
    both = sorted(dropin["truth"]["a"] + dropin["truth"]["b"], key=lambda r: (r[2], r[3], r[4]))
    assigned = {(a, 0), (a, 2), (b, 1)}
    _check(dropin, "batch_assign", [r for r in both if (r[2], r[3]) in assigned])
    _check(dropin, "batch_pattern", _no_headers(both))  # other-<prefix> does not match
    _check(dropin, "stream_pattern", _no_headers(both))


def test_starting_offsets_by_timestamp(dropin):
    ts, truth = dropin["ts"], _no_headers(dropin["truth"]["a"])
    # Timestamps grow with the offset in every partition, so "the first offset whose
    # timestamp is >= t" keeps exactly the records at or after t.
    by_partition = {0: ts[0] + 4_500, 1: ts[1], 2: ts[2] + 29_000}
    _check(dropin, "batch_by_timestamp", [r for r in truth if r[5] >= by_partition[r[3]] * 1000])
    # One time for every partition: partition 0's records all precede it, so with the
    # "latest" strategy it starts at its end and reads none.
    t = ts[1] + 10_000
    _check(dropin, "batch_starting_timestamp", [r for r in truth if r[5] >= t * 1000])
    t = ts[0] + 20_000
    _check(dropin, "stream_starting_timestamp", [r for r in truth if r[5] >= t * 1000])


def test_ending_offsets_by_timestamp(dropin):
    ts, truth = dropin["ts"], _no_headers(dropin["truth"]["a"])
    # The read ends before the first record at or after the time; a partition with none
    # there reads to its end (partition 1 here: its last record precedes the time).
    by_partition = {0: ts[0] + 10_000, 1: ts[1] + 29_500, 2: ts[2]}
    _check(dropin, "batch_ending_by_timestamp",
           [r for r in truth if r[5] < by_partition[r[3]] * 1000 or r[3] == 1])
    t = ts[1] + 15_000
    _check(dropin, "batch_ending_timestamp", [r for r in truth if r[5] < t * 1000 or r[3] == 0])


def test_task_splitting_options_do_not_change_rows(dropin):
    truth = _no_headers(dropin["truth"]["a"])
    _check(dropin, "batch_min_partitions", truth)
    _check(dropin, "batch_max_records_per_partition", truth)


def test_max_offsets_per_trigger_under_available_now(dropin):
    truth = _no_headers(dropin["truth"]["a"])
    spark, ours = _check(dropin, "stream_max_offsets", truth)
    for fmt, got in (("kafka", spark), ("kwatermark", ours)):
        sizes = got["batches"]
        assert sum(sizes) == len(truth), fmt
        assert max(sizes) <= MAX_OFFSETS, f"format({fmt!r}) batches {sizes}"
        assert len([s for s in sizes if s]) >= -(-len(truth) // MAX_OFFSETS), sizes


def test_transactional_topic(dropin):
    uncommitted, committed = dropin["truth"]["tx_uncommitted"], dropin["truth"]["tx_committed"]
    assert len(committed) < len(uncommitted)  # the aborted transaction is in the log
    # Spark's consumer defaults to read_uncommitted, and so does kwatermark.
    _check(dropin, "batch_tx_default", _no_headers(uncommitted))
    _check(dropin, "batch_tx_committed", _no_headers(committed))
    _check(dropin, "stream_tx_committed", _no_headers(committed))


# -- issue 33: where the two differed -------------------------------------------------------
# Each test asserts both sources against the consumer's ground truth (or the failure each
# gives), so a change in Spark's behaviour shows up here, not only one in kwatermark's.

def test_subscribe_pattern_selects_every_topic_the_pattern_is_found_in(dropin):
    # Spark's default offset reader keeps a topic when the pattern is found in its name
    # (Matcher.find): <p>-(ct|lat) reads <p>-ct-x too. kwatermark selects the same topics.
    found = _no_headers(dropin["truth"]["found"])
    assert len(found) == 36 and len({r[2] for r in found}) == 3
    _check(dropin, "batch_pattern_found", found)
    _check(dropin, "stream_pattern_found", found)
    # Anchored, the pattern asks for the whole name in both.
    _check(dropin, "batch_pattern_anchored", [r for r in found if not r[2].endswith("-ct-x")])


def test_assign_reads_the_partitions_that_exist_and_ignores_a_missing_one(dropin):
    b = [r for r in dropin["truth"]["b"] if r[3] == 0]
    assert len(b) == 10
    _check(dropin, "batch_assign_missing_partition", _no_headers(b))
    _check(dropin, "stream_assign_missing_partition", _no_headers(b))


@pytest.mark.parametrize("mode", ["batch", "stream"])
def test_a_topic_that_does_not_exist_fails_both(dropin, mode):
    case, absent = dropin["cases"][f"{mode}_missing_topic"], dropin["topics"]["absent"]
    assert "UnknownTopicOrPartitionException" in case["kafka"].get("error", ""), case["kafka"]
    assert f"option subscribe: topic {absent} does not exist on kafka.bootstrap.servers=" \
        in case["kwatermark"].get("error", ""), case["kwatermark"]


def test_a_recreated_topic_under_fail_on_data_loss_false(dropin):
    """The topic is read (end offsets 10), deleted, recreated with 3 records a partition, and
    read on from the checkpoint. Spark goes on from its old offsets and reads none of the new
    records (they stay unread: it continues from the new end); kwatermark reads them from the
    new topic's earliest offset (docs/options.md: nothing is lost)."""
    truth = dropin["truth"]
    for fmt in ("kafka", "kwatermark"):
        first, second = dropin["cases"]["stream_recreated_topic"][fmt]["runs"]
        assert "error" not in first and "error" not in second, (fmt, first, second)
        assert first["rows"] == _no_headers(truth["loss_before"][fmt]), fmt
        assert len(first["rows"]) == 20 and len(truth["loss_after"][fmt]) == 6
    assert dropin["cases"]["stream_recreated_topic"]["kafka"]["runs"][1]["rows"] == []
    assert dropin["cases"]["stream_recreated_topic"]["kwatermark"]["runs"][1]["rows"] == \
        _no_headers(truth["loss_after"]["kwatermark"])
