"""The measuring half of ``bench/bench_readpath.py``, under the baseline interpreter (PySpark
4.2.0 with Spark's own Kafka source, ``tests/support/sparkkafka.py``): every source warmed to
steady state, then interleaved rounds, in one SparkSession.

Request: bootstrap, workspace, topics (``[{"topic", "partitions", "records"}]``), rounds,
min_warm, max_warm, broker_pid (None: an external broker, its CPU not measured),
max_offsets_per_trigger (None: a batch read; else an AvailableNow stream with that limit),
batch_records (extra compiled-engine sources ``compiled-N`` with ``arrow.maxRecordsPerBatch=N``).
Reply: the warm-up reads and every round's figures, the load average before and after.
"""

from __future__ import annotations

import os
import time

import psutil
from child_run import fresh, log

from tests.support.sparkkafka import baseline_session, child_io

SOURCES = {   # name -> (format, extra options)
    "kafka": ("kafka", {}),
    "compiled": ("kwatermark", {"readEngine": "compiled"}),
    "python": ("kwatermark", {"readEngine": "python"}),
}
COLUMNS = ["key", "value", "partition", "offset", "timestamp"]
STEADY = 0.10   # two successive warm-up reads within 10 % of each other


def tree_cpu_split() -> dict[str, float]:
    """CPU seconds of this process and every descendant, by kind: ``jvm`` the driver JVM's
    own threads; ``jvm_exited`` the JVM's other children, live or reaped: the process Spark
    starts to plan a Python stream (it lives as long as the query; counted here while it
    runs, so a figure taken mid-query does not move when it exits) and Hadoop's ``chmod``
    of each checkpoint file; ``python`` the Python workers (``pyspark.daemon`` and its
    forks) and what they reaped; ``driver`` this process."""
    me = psutil.Process()
    split = dict.fromkeys(("driver", "jvm", "jvm_exited", "python"), 0.0)
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
            java = proc.pid != me.pid and "java" in proc.name()
            planner = (proc.pid != me.pid and not java
                       and "pyspark.daemon" not in " ".join(proc.cmdline()))
        except psutil.Error:
            continue
        own, reaped = t.user + t.system, t.children_user + t.children_system
        if java:
            split["jvm"] += own
            split["jvm_exited"] += reaped
        elif planner:
            split["jvm_exited"] += own + reaped
        else:
            split["driver" if proc.pid == me.pid else "python"] += own + reaped
    return split


def broker_cpu_s(pid: int | None) -> float | None:
    if pid is None:
        return None
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def sources(request: dict) -> dict:
    """SOURCES, and a compiled-engine source per ``batch_records`` entry."""
    extra = {f"compiled-{n}": ("kwatermark", {"readEngine": "compiled",
                                              "arrow.maxRecordsPerBatch": str(n)})
             for n in request.get("batch_records") or []}
    return {**SOURCES, **extra}


def one_read(spark, request: dict, topic: dict, source: str) -> dict:
    fmt, extra = sources(request)[source]
    options = {"kafka.bootstrap.servers": request["bootstrap"], "subscribe": topic["topic"],
               "startingOffsets": "earliest", **extra}
    if fmt == "kwatermark":
        options["watermark.stateLocation"] = fresh(request["workspace"], "ledger")
    limit = request.get("max_offsets_per_trigger")
    cpu0, broker0 = tree_cpu_split(), broker_cpu_s(request["broker_pid"])
    started, mark = time.perf_counter(), None
    if limit is None:   # a batch read
        spark.read.format(fmt).options(**options).load().select(*COLUMNS).write \
            .format("noop").mode("overwrite").save()
    else:               # a stream: AvailableNow, maxOffsetsPerTrigger records a batch
        query = spark.readStream.format(fmt).options(**options) \
            .option("maxOffsetsPerTrigger", str(limit)).load().select(*COLUMNS) \
            .writeStream.format("noop") \
            .option("checkpointLocation", fresh(request["workspace"], "checkpoint")) \
            .trigger(availableNow=True).start()
        mark = first_batch_done(query, request)
        query.awaitTermination()
        if query.exception() is not None:
            raise RuntimeError(f"{source}: {query.exception()}")
        read = sum(p.numInputRows for p in query.recentProgress)
        if read != topic["records"]:
            raise RuntimeError(f"{source}: read {read} of {topic['records']} records")
    ended = time.perf_counter()
    cpu1, broker1 = tree_cpu_split(), broker_cpu_s(request["broker_pid"])
    got = {"source": source, "partitions": topic["partitions"],
           **figures(topic["records"], ended - started, (cpu0, broker0), (cpu1, broker1)),
           "load_avg": os.getloadavg()[0]}
    if limit is not None and mark is not None:   # the stream after its first micro-batch
        n = topic["records"] - mark["records"]
        got["after_first_batch"] = {
            "records": n, **figures(n, ended - mark["at"], mark["cpu"], (cpu1, broker1))}
    return got


def first_batch_done(query, request: dict) -> dict | None:
    """Once the stream's first micro-batch has ended: the time, the process tree's and the
    broker's CPU, and the records read so far. What comes after is the stream's steady
    state: the query's start (Spark's planning process for a Python source compiles pyspark
    from ``pyspark.zip``, ~1 s of CPU; the JVM plans the first batch) is paid once in a
    query that runs for days. Polls every 20 ms until then."""
    while query.isActive:
        progress = query.recentProgress
        if progress:
            return {"at": time.perf_counter(),
                    "cpu": (tree_cpu_split(), broker_cpu_s(request["broker_pid"])),
                    "records": sum(p.numInputRows for p in progress)}
        time.sleep(0.02)
    return None


def figures(n: int, seconds: float, before: tuple, after: tuple) -> dict:
    """Wall and CPU per record of ``n`` records between two (tree split, broker) samples."""
    (cpu0, broker0), (cpu1, broker1) = before, after
    split = {kind: (cpu1[kind] - cpu0[kind]) / n * 1e6 for kind in cpu0}
    return {"seconds": seconds, "records_per_s": n / seconds,
            "client_cpu_us": sum(split.values()), "client_cpu_split_us": split,
            "broker_cpu_us": None if broker0 is None else (broker1 - broker0) / n * 1e6}


def main() -> None:
    request, reply = child_io()
    load_before = os.getloadavg()
    spark = baseline_session("kwatermark-bench-readpath")
    warmups, runs = [], []
    for topic in request["topics"]:
        for source in sources(request):
            times: list[float] = []
            while True:
                got = one_read(spark, request, topic, source)
                warmups.append(got)
                times.append(got["seconds"])
                log(f"warm-up {source} {topic['partitions']}p: {got['seconds']:.2f} s")
                steady = len(times) >= 2 and abs(times[-1] - times[-2]) / times[-2] < STEADY
                if len(times) >= request["min_warm"] and steady:
                    break
                if len(times) >= request["max_warm"]:
                    log(f"{source}: not steady after {len(times)} reads; measuring anyway")
                    break
    names = list(sources(request))
    for round_no in range(request["rounds"]):
        for topic in request["topics"]:
            turn = round_no % len(names)   # each round starts with another source
            for source in names[turn:] + names[:turn]:
                got = one_read(spark, request, topic, source)
                got["round"] = round_no + 1
                runs.append(got)
                log(f"round {round_no + 1} {source} {topic['partitions']}p: "
                    f"{got['seconds']:.2f} s, client {got['client_cpu_us']:.2f} us/record")
                reply({"partial": True, "warmups": warmups, "runs": runs})
    reply({"warmups": warmups, "runs": runs, "spark_version": spark.version,
           "load_avg_before": load_before, "load_avg_after": os.getloadavg()})
    spark.stop()


if __name__ == "__main__":
    main()
