"""Batch times on a Spark standalone cluster against local mode, and what the driver pays
when progress records do not reach it (the ledger's recompute).

Run: ``python bench/bench_cluster.py [--per-partition 20000] [--per-trigger 15000]``
(as root: the workers run in private mount namespaces, see tests/support/cluster.py).
Results go to ``bench/results/cluster.json``.

One 3-partition topic, one partition 20 s behind in event time. On a cluster of two
one-core workers (one driver, executors started once), four ``Trigger.AvailableNow`` queries
in ABBA order: ``shared`` (a ``watermark.stateLocation`` every process writes) and
``unshared`` (a location the executors do not share with the driver, so the driver re-reads
every range); then the same query twice in ``local[2]`` (same JVM options as the cluster's:
C1 only, serial GC). Each batch counts its rows. Figures are
the median ``triggerExecution`` of every batch but each query's first (planning and worker
start-up), and ratios against ``shared`` measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # tests.support
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH"))
                                           if p)
os.environ["TZ"] = "UTC"

from kwatermark.options import default_state_location
from tests.support.cluster import ClusterDriver, StandaloneCluster, durations
from tests.support.jvm import TEST_JVM_OPTIONS
from tests.support.kafka import Record, TopicWriter, start_test_broker


def records(per_partition: int) -> list[Record]:
    out = []
    for i in range(per_partition):
        out.append(Record(0, 100_000 + 10 * i, value=b"x" * 100))
        out.append(Record(1, 80_000 + 10 * i, value=b"x" * 100))
        out.append(Record(2, 100_300 + 10 * i, value=b"x" * 100))
    return out


def warm(batch_durations: list[dict]) -> list[int]:
    return [d["triggerExecution"] for d in batch_durations[1:]]


def local_session():
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("kwatermark-bench-local")
             .config("spark.driver.extraJavaOptions", TEST_JVM_OPTIONS)   # as on the cluster
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def local_run(spark, options: dict, root: Path) -> list[dict]:
    reader = spark.readStream.format("kwatermark")
    for key, value in dict(options, **{"watermark.stateLocation": str(root / "ledger")}
                           ).items():
        reader = reader.option(key, value)
    query = (reader.load().writeStream.foreachBatch(lambda frame, _: frame.count())
             .option("checkpointLocation", str(root / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    return durations(query)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--per-partition", type=int, default=20_000)
    parser.add_argument("--per-trigger", type=int, default=15_000)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="kwatermark-bench-cluster-"))
    broker = start_test_broker()
    cluster = driver = None
    try:
        writer = TopicWriter(broker, broker.create_topic(3))
        writer.send(records(args.per_partition))
        hidden = default_state_location()
        base = {"kafka.bootstrap.servers": broker.bootstrap_servers,
                "subscribe": writer.topic, "startingOffsets": "earliest",
                "maxOffsetsPerTrigger": str(args.per_trigger),
                "watermark.strategy": "bounded", "watermark.maxOutOfOrderness": "2 seconds"}
        shared = dict(base, **{"watermark.stateLocation": str(root / "ledger")})
        unshared = dict(base, **{"watermark.stateLocation": hidden})
        order = [("shared-1", shared), ("unshared-1", unshared), ("unshared-2", unshared),
                 ("shared-2", shared)]
        (root / "daemons").mkdir()
        cluster = StandaloneCluster(root / "daemons", hidden)
        driver = ClusterDriver(root / "driver", cluster.url, [
            {"name": name, "options": opts, "count_only": True} for name, opts in order])
        started = time.monotonic()
        cluster.start()
        driver.start()
        cluster.wait_ready()
        done = {name: driver.done(name, cluster) for name, _ in order}
        cluster_s = time.monotonic() - started
        for name, result in done.items():
            assert result["error"] is None, (name, result["error"])
        driver.stop()
        cluster.stop()
        cluster = driver = None
        spark = local_session()
        local = (local_run(spark, shared, root / "local-1")
                 + local_run(spark, shared, root / "local-2"))
        spark.stop()
    finally:
        if driver is not None:
            driver.stop()
        if cluster is not None:
            cluster.stop()
        broker.stop()

    figures = {
        "shared": warm(done["shared-1"]["durations"]) + warm(done["shared-2"]["durations"]),
        "unshared": (warm(done["unshared-1"]["durations"])
                     + warm(done["unshared-2"]["durations"])),
        "local": warm(local[:len(local) // 2]) + warm(local[len(local) // 2:]),
    }
    medians = {k: statistics.median(v) for k, v in figures.items()}
    report = {
        "records_per_batch": args.per_trigger, "partitions": 3,
        "load_average": os.getloadavg(), "cluster_wall_s": round(cluster_s, 1),
        "batch_ms": figures, "median_ms": medians,
        "unshared_over_shared": round(medians["unshared"] / medians["shared"], 2),
        "cluster_over_local": round(medians["shared"] / medians["local"], 2),
    }
    print(json.dumps(report, indent=1))
    out = Path(ROOT) / "bench" / "results" / "cluster.json"
    out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
