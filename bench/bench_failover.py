"""Stalls during a cluster's faults (issue 32, DESIGN §20): the longest gap between
non-empty micro-batches while each fault lasts, ``format("kwatermark")`` beside Spark's own
``format("kafka")``, both streaming the same topic under the same fault at the same time.

Run: ``python bench/bench_failover.py [--rounds 1] [--rate 200] [--faults rolling,kill,reassign]``
(``none``: the same window without a fault, the gaps the machine gives anyway). Results go to
``bench/results/failover.json``.

A 3-node KRaft Apache Kafka on loopback (``LocalBroker.start(brokers=3)``), a topic of 6
partitions with replication 3 and ``min.insync.replicas=2`` per fault, an idempotent
producer (``acks=all``) writing ``--rate`` records a second. kwatermark streams in this
process (the project's pyspark), Spark's own source in the baseline interpreter
(tests/support/sparkkafka.py), both with a 1 s trigger. Faults, in order: a rolling
restart (every node SIGTERMed and started again, the next once it is back in every ISR),
the leader of partition 0 SIGKILLed and started again 10 s later, every partition's leader
moved away by reassignment and back. For each: the longest gap between non-empty batches
from the fault's start until 10 s after the cluster is whole again, for each source; the
producer's own longest gap between delivery reports (the cluster's unavailability to a
writer); and the targets: kwatermark within 2 s of Spark's, and no longer than the
producer's gap plus two triggers.
"""

from __future__ import annotations

import argparse
import json
import os
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

from kwatermark.localbroker import LocalBroker
from tests.support.failover import (
    ChildStream,
    RecordedStream,
    SteadyWriter,
    create_topic,
    exactly_once,
    kill_leader,
    longest_gap,
    reassign,
    rolling_restart,
)

TRIGGER_S = 1.0
SETTLE_S = 10.0   # the window goes on this long after the cluster is whole again


def faults() -> dict[str, tuple[str, object]]:
    return {"rolling": ("rolling restart", lambda cluster, topic: rolling_restart(cluster)),
            "kill": ("leader SIGKILL, back 10 s later", lambda cluster, topic: kill_leader(
                cluster, topic, 10.0)),
            "reassign": ("reassignment", reassign),
            # the same window with no fault: the longest gap a loaded machine gives anyway
            "none": ("no fault (30 s)", lambda cluster, topic: time.sleep(30.0))}


def one_fault(spark, cluster, name: str, act, rate: int, workdir: Path) -> dict:
    topic = create_topic(cluster)
    writer = SteadyWriter(cluster.bootstrap_servers, topic, rate)
    spark_kafka = ChildStream(cluster.bootstrap_servers, topic, workdir, "kafka")
    ours = RecordedStream(spark, cluster.bootstrap_servers, topic, str(workdir / "cp"))
    try:
        spark_kafka.wait_started()
        ours.wait_for(list(writer.acked), 300)
        spark_kafka.wait_for(list(writer.acked), 300)
        started = time.monotonic()
        act(cluster, topic)
        whole = time.monotonic()
        time.sleep(SETTLE_S)
        until = time.monotonic()
        writer.stop()
        ours.wait_for(writer.acked, 300)
        spark_kafka.wait_for(writer.acked, 300)
    finally:
        reply = spark_kafka.stop()
        if ours.query.isActive:
            ours.stop()
    gap_ours = longest_gap([b.at for b in ours.batches if b.rows], started, until)
    gap_spark = longest_gap([b.at for b in spark_kafka.batches()], started, until)
    producer = writer.longest_ack_gap(started, until)
    lost = [len(x) for x in exactly_once(ours.rows(), writer.acked)[:2]]
    lost_spark = [len(x) for x in exactly_once(spark_kafka.rows(), writer.acked)[:2]]
    return {"fault": name, "fault_s": round(whole - started, 1),
            "kwatermark_gap_s": round(gap_ours, 2), "spark_gap_s": round(gap_spark, 2),
            "difference_s": round(gap_ours - gap_spark, 2),
            "producer_gap_s": round(producer, 2),
            "within_2s_of_spark": gap_ours <= gap_spark + 2.0,
            "within_producer_gap_plus_2_triggers": gap_ours <= producer + 2 * TRIGGER_S,
            "kwatermark_missing_duplicated": lost, "spark_missing_duplicated": lost_spark,
            "spark_query_error": reply.get("error"), "records": len(writer.acked)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--rate", type=int, default=200)
    parser.add_argument("--faults", default="rolling,kill,reassign",
                        help="comma-separated: rolling, kill, reassign, none")
    args = parser.parse_args()
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("kwatermark-bench-failover")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    broker = LocalBroker.start(kind="kafka", brokers=3)
    results = []
    try:
        for round_ in range(args.rounds):
            for key in args.faults.split(","):
                name, act = faults()[key]
                with tempfile.TemporaryDirectory(prefix="kwatermark-failover-") as tmp:
                    found = one_fault(spark, broker.cluster, name, act, args.rate, Path(tmp))
                found["round"] = round_ + 1
                found["load_average"] = [round(x, 1) for x in os.getloadavg()]
                results.append(found)
                print(json.dumps(found), flush=True)
    finally:
        broker.stop()
        spark.stop()
    print(f"{'fault':34} {'kwatermark':>10} {'kafka':>7} {'diff':>6} {'producer':>8}  load")
    for r in results:
        print(f"{r['fault']:34} {r['kwatermark_gap_s']:>9.1f}s {r['spark_gap_s']:>6.1f}s "
              f"{r['difference_s']:>+5.1f}s {r['producer_gap_s']:>7.1f}s  {r['load_average']}")
    out = Path(ROOT) / "bench" / "results" / "failover.json"
    out.write_text(json.dumps({"trigger_s": TRIGGER_S, "rate": args.rate,
                               "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
