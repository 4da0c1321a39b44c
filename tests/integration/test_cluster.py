"""Issue 12: kwatermark on a Spark standalone cluster (a master and two one-core workers from
the pip-installed pyspark, on loopback) whose executors do not share the driver's temp
directory: each worker runs in a private mount namespace where the driver's default progress
location is an empty tmpfs, and with a TMPDIR of its own (tests/support/cluster.py).

* Default options: the query refuses before its first batch reaches the sink, with an error
  naming ``watermark.stateLocation``; the driver never silently re-reads a range.
* A location every process shares: every record exactly once, each record's watermark the
  same as in local mode, no range recomputed on the driver, and an executor killed with
  SIGKILL mid-query survived.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from kwatermark.options import default_state_location
from tests.support.cluster import ClusterQuery, StandaloneCluster, rows
from tests.support.kafka import Record

BOUND_MS = 2_000
PARTITIONS = 3
PER_PARTITION = 100
PER_TRIGGER = 60      # 300 records: 5 micro-batches


def data() -> list[Record]:
    """Partition 1 lags 20 s behind the others, so it holds the watermark; partition 2 is out
    of order within the bound."""
    records = []
    for i in range(PER_PARTITION):
        records.append(Record(0, 100_000 + 1_000 * i, value=f"0:{i}".encode()))
        records.append(Record(1, 80_000 + 1_000 * i, value=f"1:{i}".encode()))
        jitter = -1_500 if i % 3 == 1 else 0
        records.append(Record(2, 100_300 + 1_000 * i + jitter, value=f"2:{i}".encode()))
    return records


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # Where an unset watermark.stateLocation puts progress records on the driver (the driver
    # subprocesses inherit this process's environment): hidden from every executor.
    started = StandaloneCluster(tmp_path_factory.mktemp("cluster"), default_state_location())
    try:
        yield started.start()
    finally:
        started.stop()


def options(broker, topic: str) -> dict:
    return {"kafka.bootstrap.servers": broker.bootstrap_servers, "subscribe": topic,
            "startingOffsets": "earliest", "maxOffsetsPerTrigger": str(PER_TRIGGER),
            "watermark.strategy": "bounded",
            "watermark.maxOutOfOrderness": f"{BOUND_MS} ms"}


def test_default_location_refuses_on_a_cluster_that_does_not_share_it(
        cluster, broker, topic_factory, tmp_path):
    writer = topic_factory(PARTITIONS)
    writer.send(data())
    query = ClusterQuery(tmp_path, cluster.url, options(broker, writer.topic))
    query.start()
    code = query.wait(cluster)
    error = query.error()
    assert code == 3 and error is not None, query.failure(cluster)
    # The user is told what to set, in the query's own exception.
    assert error.startswith("StreamingQueryException"), error
    assert "OptionError" in error and "option watermark.stateLocation is unset" in error, error
    assert 'option("watermark.stateLocation", "s3://' in error, error
    # Nothing reached the sink, and the driver never re-read a range in the executors' place.
    assert query.batches() == {}
    assert "recomputed" not in query.driver_output(), query.driver_output()[-3000:]


def test_shared_location_exactly_once_local_watermarks_executor_killed(
        cluster, broker, topic_factory, tmp_path, spark):
    writer = topic_factory(PARTITIONS)
    writer.send(data())
    shared = options(broker, writer.topic)
    shared["watermark.stateLocation"] = str(tmp_path / "ledger")   # every worker sees it

    query = ClusterQuery(tmp_path / "cluster-run", cluster.url, shared)
    query.start(pause_before_batch=2)
    # Batches 0 and 1 are written; kill an executor before batch 2's tasks run.
    query.wait_for(query.out / "paused-2", 150, cluster)
    assert sorted(query.batches()) == [0, 1]
    executors = cluster.executors()
    assert executors, query.failure(cluster)
    os.kill(executors[0], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{executors[0]}") and time.monotonic() < deadline:
        time.sleep(0.05)
    (query.out / "resume").write_text("")
    assert query.wait(cluster) == 0, query.failure(cluster)
    on_cluster = query.batches()

    # The same query in local mode, in this process.
    local_options = dict(shared, **{"watermark.stateLocation": str(tmp_path / "local-ledger")})
    local: dict[int, list[list]] = {}
    reader = spark.readStream.format("kwatermark")
    for key, value in local_options.items():
        reader = reader.option(key, value)
    (reader.load().writeStream
     .foreachBatch(lambda frame, batch_id: local.__setitem__(batch_id, rows(frame)))
     .option("checkpointLocation", str(tmp_path / "local-checkpoint"))
     .trigger(availableNow=True).start().awaitTermination())

    # Every record exactly once, from what this test produced.
    read = sorted((p, o, v) for batch in on_cluster.values() for p, o, v, _, _ in batch)
    expected = sorted((r.partition, int(r.value.decode().split(":")[1]), r.value.decode())
                      for r in data())
    assert read == expected
    assert sorted(on_cluster) == list(range(len(on_cluster))) and len(on_cluster) >= 4
    # Each record's event time and watermark as in local mode, batch by batch.
    assert on_cluster == local
    watermarks = [row[-1] for batch in on_cluster.values() for row in batch]
    assert watermarks[-1] is not None and len(set(watermarks)) > 2
    # Progress records reached the driver: no range was re-read there.
    assert "recomputed" not in query.driver_output(), query.driver_output()[-3000:]
    # The killed executor was replaced or its work moved; the driver said why nothing broke.
    progress = json.loads((query.out / "progress.json").read_text())
    print("cluster batch durations (ms):", [p["durationMs"] for p in progress])
