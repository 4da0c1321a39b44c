"""The measuring half of ``bench/bench_idle.py``: runs under the baseline interpreter (PySpark
4.2.0 with Spark's own Kafka source), one SparkSession, each source's query idle in turn.

Request: bootstrap, workspace, broker_pid (or null), cases (``[{"partitions", "topic"}]``),
formats, seconds, settle, rounds. Reply: per round, case and format, the CPU (cores) of the
driver JVM (it runs the local executors too), of its Python processes (the planning process
and the workers) and of the broker while the query ran with nothing to read.
"""

from __future__ import annotations

import os
import statistics
import time

import common
from child_run import fresh, log, measure_and_reply
from partitions_child import descendants

from tests.support.sparkkafka import baseline_session, child_io


def idle_cpu(spark, request: dict, case: dict, fmt: str) -> dict:
    """Start ``fmt``'s query on ``case``'s topic at its end (nothing to read), let it settle,
    then count each party's CPU over ``seconds``."""
    options = {"kafka.bootstrap.servers": request["bootstrap"], "subscribe": case["topic"],
               "startingOffsets": "latest"}
    if fmt == "kwatermark":
        options.update({"watermark.stateLocation": fresh(request["workspace"], "ledger"),
                        "watermark.strategy": "bounded",
                        "watermark.maxOutOfOrderness": "5 seconds"})
    query = (spark.readStream.format(fmt).options(**options).load().writeStream
             .format("noop").option("checkpointLocation", fresh(request["workspace"], "ck"))
             .start())   # the default trigger: Spark asks again every few ms
    try:
        time.sleep(request["settle"])
        if query.exception() is not None:
            raise RuntimeError(f"{fmt}, {case['partitions']} partitions: {query.exception()}")
        jvm = spark.sparkContext._gateway.proc.pid
        pythons = descendants(jvm)
        parties = {"jvm": [jvm], "python": pythons, "broker": [request["broker_pid"]]}
        before = {pid: common.process_cpu_s(pid) for pids in parties.values() for pid in pids}
        started = time.monotonic()
        time.sleep(request["seconds"])
        elapsed = time.monotonic() - started
        # a process gone in the meantime (a worker Spark ended) is not counted
        spent = {pid: max(0.0, common.process_cpu_s(pid) - cpu)
                 for pid, cpu in before.items()}
        # Spark reports an idle query every 10 s (noDataProgressEventInterval): the
        # duration of its last ask for new offsets
        polls = [p.durationMs.get("latestOffset") for p in query.recentProgress
                 if p.durationMs.get("latestOffset") is not None]
        if query.exception() is not None or sum(p.numInputRows for p in query.recentProgress):
            raise RuntimeError(f"{fmt}, {case['partitions']} partitions: the query was not "
                               f"idle ({query.exception()})")
    finally:
        query.stop()
    cores = {k: sum(spent[p] for p in pids) / elapsed for k, pids in parties.items()}
    cores["total"] = sum(cores.values())
    cores["poll_ms"] = statistics.median(polls) if polls else None
    return cores


def main() -> None:
    request, reply = child_io()
    load_before = os.getloadavg()
    started = time.perf_counter()
    spark = baseline_session("kwatermark-bench-idle")
    session_s = time.perf_counter() - started

    def measure(runs: list) -> None:
        formats = request["formats"]
        for round_ in range(request["rounds"]):
            order = formats[round_ % len(formats):] + formats[:round_ % len(formats)]
            for case in request["cases"]:
                for fmt in order:
                    cores = idle_cpu(spark, request, case, fmt)
                    log(f"round {round_ + 1}, {case['partitions']} partitions, {fmt}: "
                        + ", ".join(f"{k} {v:.3f}" for k, v in cores.items()))
                    runs.append({"round": round_, "partitions": case["partitions"],
                                 "format": fmt, **cores})

    measure_and_reply(spark, reply, session_s, load_before, measure)


if __name__ == "__main__":
    main()
