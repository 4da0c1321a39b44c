"""``kwatermark-demo`` as a user runs it (its own process and Spark), against the broker:
its side-by-side counts match ground truth read back from the topic it produced."""

from __future__ import annotations

import collections
import re
import shutil
import subprocess
import sys

import pytest
from confluent_kafka import Consumer, TopicPartition

WINDOW = re.compile(r"^\s*([+-]\d+) s \.\.\s+([+-]\d+) s\s+(\d+)\s+(\d+)\s+(\d+)$")
BATCH = re.compile(r"^\s*(\d+)\s+(\d+)/(\d+)/(\d+)((?:\s+(?:undefined|[+-][\d.]+ s)){4})\s+")
T0 = 1_700_000_000_000


def read_back(bootstrap: str, topic: str) -> list[tuple[int, int]]:
    """(partition, timestamp) of every record of the topic."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "demo-check",
                         "enable.auto.commit": False})
    records = []
    try:
        for p in range(3):
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), 30)
            consumer.assign([TopicPartition(topic, p, 0)])
            while len([r for r in records if r[0] == p]) < high:
                message = consumer.poll(10)
                assert message is not None and message.error() is None, message
                records.append((p, message.timestamp()[1]))
    finally:
        consumer.close()
    return records


def test_demo_prints_sparks_losses_and_kwatermarks_complete_counts_side_by_side(broker):
    run = subprocess.run(
        [sys.executable, "-m", "kwatermark.demo", "--bootstrap-servers",
         broker.bootstrap_servers, "--records", "100", "--lag", "40", "--batch", "60"],
        check=False, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    topic = re.search(r"^topic (\S+):", out, re.MULTILINE).group(1)
    records = read_back(broker.bootstrap_servers, topic)
    assert len(records) == 3 * 100 + 3

    highest = collections.defaultdict(int)
    for p, t in records:
        highest[p] = max(highest[p], t)
    final = min(highest.values()) - 1
    truth = collections.Counter(t - t % 10_000 for _, t in records
                                if t - t % 10_000 + 9_999 <= final)
    table = {T0 + int(m.group(1)) * 1000: tuple(int(m.group(i)) for i in (3, 4, 5))
             for m in map(WINDOW.match, out.splitlines()) if m}
    assert set(table) == set(truth)
    assert {w: row[0] for w, row in table.items()} == truth            # produced
    assert {w: row[2] for w, row in table.items()} == truth            # kwatermark: all
    spark = sum(row[1] for row in table.values())
    assert spark < sum(truth.values())                                 # Spark: fewer
    assert f"Spark counted {spark} of {sum(truth.values())} records and dropped " \
           f"{sum(truth.values()) - spark}" in out
    assert f"kwatermark counted {sum(truth.values())} of {sum(truth.values())}" in out

    # Per batch: every partition's watermark and the combined one, their minimum; the last
    # batches carry the final watermark without reading a record (the heartbeat).
    batches = [m for m in map(BATCH.match, out.splitlines()) if m]
    assert sum(sum(int(m.group(i)) for i in (2, 3, 4)) for m in batches) == len(records)
    for m in batches:
        marks = m.group(5).replace(" s", "").split()
        if "undefined" not in marks:
            assert float(marks[3]) == min(float(x) for x in marks[:3])
    last = batches[-1].group(5).replace(" s", "").split()
    assert [round(float(x) * 1000) + T0 for x in last] == [final] * 4


def test_demo_starts_a_local_apache_kafka_with_broker_kafka(broker):
    """``--broker kafka`` runs the demo on an Apache Kafka it starts and stops itself (the
    default stays Tansu). Small, as the full output is checked above; this checks the flag."""
    if shutil.which("java") is None or shutil.which("mvn") is None:
        pytest.fail("--broker kafka needs java and mvn, which the test machine has")
    run = subprocess.run(
        [sys.executable, "-m", "kwatermark.demo", "--broker", "kafka", "--records", "20",
         "--lag", "5", "--batch", "30"],
        check=False, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert re.search(r"^started a local Apache Kafka on 127\.0\.0\.1:\d+$", run.stdout,
                     re.MULTILINE), run.stdout[:2000]
    assert re.search(r"^topic \S+: 63 records", run.stdout, re.MULTILINE)  # 3 x 20 + 3
    counted = re.search(r"kwatermark counted (\d+) of (\d+)", run.stdout)
    assert counted and counted.group(1) == counted.group(2) and int(counted.group(1)) > 0
