"""Issue 12: kwatermark on a Spark standalone cluster (a master and two one-core workers from
the pip-installed pyspark, on loopback) whose executors do not share the driver's temp
directory: each worker runs in a private mount namespace where the driver's default progress
location is an empty tmpfs, and with a TMPDIR of its own (tests/support/cluster.py).

One driver process runs three queries over the same records, one after the other:

* ``default``: options left unset. The query refuses before its first batch reaches the
  sink, with an error naming ``watermark.stateLocation``; no range is re-read on the driver.
* ``unshared``: ``watermark.stateLocation`` set to a path the executors do not share (the
  same hidden directory). Right results, and the driver says once per batch how many ranges
  it recomputed.
* ``shared``: a location every process shares. Every record exactly once, each record's
  watermark as in local mode, no range recomputed, and an executor killed with SIGKILL
  between batches 1 and 2 survived with the same rows.
"""

from __future__ import annotations

import os
import re
import signal
import tempfile
import time
from pathlib import Path

import pytest

from kwatermark.options import default_state_location
from tests.support.cluster import ClusterDriver, StandaloneCluster, durations, rows
from tests.support.kafka import Record, TopicWriter
from tests.support.streams import lagging_three_partitions

BOUND_MS = 2_000
PARTITIONS = 3
PER_PARTITION = 100
PER_TRIGGER = 60      # 300 records: 5 micro-batches


def data() -> list[Record]:
    return lagging_three_partitions(PER_PARTITION)


def produced() -> list[tuple]:
    """(partition, offset, value) of every record, from what this test wrote."""
    offsets = {p: 0 for p in range(PARTITIONS)}
    out = []
    for r in data():
        out.append((r.partition, offsets[r.partition], r.value.decode()))
        offsets[r.partition] += 1
    return sorted(out)


def options(broker, topic: str) -> dict:
    return {"kafka.bootstrap.servers": broker.bootstrap_servers, "subscribe": topic,
            "startingOffsets": "earliest", "maxOffsetsPerTrigger": str(PER_TRIGGER),
            "watermark.strategy": "bounded",
            "watermark.maxOutOfOrderness": f"{BOUND_MS} ms"}


class Run:
    def __init__(self, cluster: StandaloneCluster, driver: ClusterDriver,
                 local: tuple[dict[int, list[list]], list[dict]], shared: dict):
        self.cluster, self.driver, self.shared = cluster, driver, shared
        self.local, self.local_durations = local

    def read_all(self, query: str) -> list[tuple]:
        return sorted((p, o, v) for batch in self.driver.batches(query).values()
                      for p, o, v, _, _ in batch)


def recomputed_lines(driver: ClusterDriver, query: str, location: str) -> list[tuple]:
    """The driver's "recomputed" warnings about ``location`` since ``query`` started."""
    text = driver.output()
    start = text.find(f"kwatermark-test: query {query} starts")
    assert start >= 0, text[-3000:]
    return re.findall(r"recomputed (\d+) of (\d+) ranges of the last batch on the driver: "
                      r"their progress records were not in watermark\.stateLocation="
                      + re.escape(location) + r" ", text[start:])


def run_locally(spark, options: dict, root) -> tuple[dict[int, list[list]], list[dict]]:
    """The same query in local mode, in this process: rows per batch, batch durations."""
    local: dict[int, list[list]] = {}
    reader = spark.readStream.format("kwatermark")
    for key, value in dict(options, **{"watermark.stateLocation": str(root / "ledger")}
                           ).items():
        reader = reader.option(key, value)
    query = (reader.load().writeStream
             .foreachBatch(lambda frame, batch_id: local.__setitem__(batch_id, rows(frame)))
             .option("checkpointLocation", str(root / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    return local, durations(query)


@pytest.fixture(scope="module")
def run(tmp_path_factory, broker, spark):
    root = tmp_path_factory.mktemp("cluster")
    writer = TopicWriter(broker, broker.create_topic(PARTITIONS))
    writer.send(data())
    # Where an unset watermark.stateLocation puts progress records on the driver (the driver
    # process inherits this process's environment): hidden from every executor.
    hidden = default_state_location()
    (root / "daemons").mkdir()
    cluster = StandaloneCluster(root / "daemons", hidden)
    base = options(broker, writer.topic)
    shared = dict(base, **{"watermark.stateLocation": str(root / "ledger")})
    driver = ClusterDriver(root / "driver", cluster.url, [
        {"name": "default", "options": base},
        {"name": "unshared", "options": dict(base, **{"watermark.stateLocation": hidden})},
        {"name": "shared", "options": shared, "pause_before_batch": 2},
    ])
    try:
        cluster.start()
        driver.start()           # registers with the master while the workers start
        (root / "local").mkdir()
        local = run_locally(spark, shared, root / "local")   # meanwhile, in local mode
        cluster.wait_ready()
        yield Run(cluster, driver, local, shared)
    finally:
        driver.stop()
        cluster.stop()


def test_default_location_refuses_on_a_cluster_that_does_not_share_it(run):
    done = run.driver.done("default", run.cluster)
    error = done["error"]
    assert error is not None, run.driver.failure(run.cluster)
    # The user is told what to set, in the query's own exception.
    assert error.startswith("StreamingQueryException"), error
    assert "OptionError" in error and "option watermark.stateLocation is unset" in error, error
    assert 'option("watermark.stateLocation", "s3://' in error, error
    # Nothing reached the sink, and the driver never re-read a range in the executors' place.
    assert run.driver.batches("default") == {}
    assert "recomputed" not in run.driver.section("default"), run.driver.output()[-3000:]


def test_unshared_location_is_recomputed_on_the_driver_and_said_once_per_batch(run):
    done = run.driver.done("unshared", run.cluster)
    assert done["error"] is None, run.driver.failure(run.cluster)
    assert run.read_all("unshared") == produced()
    # One line per batch (the driver folds batch k when it plans what follows it). The
    # planning runs in a Python process of its own, whose log reaches the driver's output
    # through the JVM, at times after the driver's own "query ended" line: count the lines
    # naming this query's location from its start on, and give the last one time to come.
    wanted = len(run.driver.batches("unshared"))
    deadline = time.monotonic() + 30
    while True:
        said = recomputed_lines(run.driver, "unshared", default_state_location())
        if len(said) >= wanted or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(said) == wanted, run.driver.output()[-3000:]
    assert all(n == m and int(n) > 0 for n, m in said), said
    print("\nunshared: batch durations (ms)", [d["triggerExecution"]
                                                for d in done["durations"]])


def test_shared_location_exactly_once_local_watermarks_executor_killed(run):
    driver, cluster = run.driver, run.cluster
    # Batches 0 and 1 are written; kill an executor before batch 2's tasks run.
    driver.wait_for(driver.path("shared", "paused-2"), cluster)
    assert sorted(driver.batches("shared")) == [0, 1]
    executors = cluster.executors()
    assert executors, driver.failure(cluster)
    # The executors really do not share the driver's temp directory.
    for pid in executors:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert f"TMPDIR={tempfile.gettempdir()}".encode() not in environ
        mounts = Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
        assert any(line.split()[4] == default_state_location() and "tmpfs" in line
                   for line in mounts), mounts
    os.kill(executors[0], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{executors[0]}") and time.monotonic() < deadline:
        time.sleep(0.05)
    driver.path("shared", "resume").write_text("")

    done = driver.done("shared", cluster)
    assert done["error"] is None, driver.failure(cluster)
    on_cluster = driver.batches("shared")
    # Every record exactly once.
    assert run.read_all("shared") == produced()
    assert sorted(on_cluster) == list(range(len(on_cluster))) and len(on_cluster) >= 4
    # Each record's event time and watermark as in local mode, batch by batch.
    assert on_cluster == run.local
    watermarks = [row[-1] for batch in on_cluster.values() for row in batch]
    assert watermarks[-1] is not None and len(set(watermarks)) > 2
    # Progress records reached the driver: no range was re-read there.
    assert "recomputed" not in driver.section("shared"), driver.output()[-3000:]
    print("\nshared on the cluster: batch durations (ms)",
          [d["triggerExecution"] for d in done["durations"]],
          "\nshared in local mode: batch durations (ms)",
          [d["triggerExecution"] for d in run.local_durations])
