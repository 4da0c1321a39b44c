"""The measuring half of ``bench/bench_partitions.py --scale`` (DESIGN §21): runs under the
baseline interpreter (PySpark 4.2.0 with Spark's own Kafka source,
``tests/support/sparkkafka.py``), kwatermark and ``format("kafka")`` in one SparkSession.

Request: bootstrap, workspace, the cases (``[{"label", "partitions", "subscribe" or
"subscribePattern", "records", "per_batch", "formats"}]``), the triggers, rounds. Reply: per
run, every data batch's ``triggerExecution``, ``latestOffset`` (driver planning), ``addBatch``
and ``walCommit`` times, the bytes of each offsets-log entry and progress event, and the RSS of
the driver JVM (which runs the local executors' threads too), the Python process that plans
(``python_streaming_source_runner``) and the Python workers that read.
"""

from __future__ import annotations

import json
import os
import time

from child_run import fresh, log, measure_and_reply

from tests.support.sparkkafka import baseline_session, child_io


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process in KiB; (0, 0) when it is gone."""
    found = {"VmRSS": 0, "VmHWM": 0}
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                key = line.split(":")[0]
                if key in found:
                    found[key] = int(line.split()[1])
    except OSError:
        pass
    return found["VmRSS"], found["VmHWM"]


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        for child in children.get(pid, []):
            out.append(child)
            todo.append(child)
    return out


def memory(spark) -> dict:
    """Peak RSS (MiB) of the driver JVM, the planning Python process and the largest Python
    worker, as the kernel counts them now (VmHWM: the highest since each process started).
    Where Spark forks the planning process from ``pyspark.daemon`` (pyspark 4.2) its command
    line is the daemon's: it is then counted among the workers and ``planner`` stays 0."""
    jvm = spark.sparkContext._gateway.proc.pid
    planner, workers = 0, 0
    for pid in descendants(jvm):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmd:
                line = cmd.read().replace(b"\0", b" ")
        except OSError:
            continue
        if b"python" not in line:
            continue
        peak = rss_kib(pid)[1]
        if b"streaming_source_runner" in line:
            planner = max(planner, peak)
        else:
            workers = max(workers, peak)
    return {"driver_jvm_mib": rss_kib(jvm)[1] / 1024, "planner_python_mib": planner / 1024,
            "worker_python_mib": workers / 1024}


def offsets_bytes(checkpoint: str) -> dict[int, int]:
    """Bytes of each entry of the checkpoint's offset log."""
    directory = os.path.join(checkpoint, "offsets")
    return {int(n): os.path.getsize(os.path.join(directory, n))
            for n in os.listdir(directory) if n.isdigit()}


def run_case(spark, case: dict, fmt: str, trigger: str, workspace: str) -> dict:
    options = {"kafka.bootstrap.servers": case["bootstrap"], "startingOffsets": "earliest",
               "maxOffsetsPerTrigger": str(case["per_batch"])}
    options[case["kind"]] = case["topics"]
    if fmt == "kwatermark":
        options.update({"watermark.stateLocation": fresh(workspace, "ledger"),
                        "watermark.strategy": "bounded",
                        "watermark.maxOutOfOrderness": "5 seconds"})
    checkpoint = fresh(workspace, "checkpoint")
    writer = (spark.readStream.format(fmt).options(**options).load().writeStream
              .format("noop").option("checkpointLocation", checkpoint))
    started = time.perf_counter()
    if trigger == "availableNow":
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination(1800)
    else:
        query = writer.trigger(processingTime=trigger).start()
        deadline = time.monotonic() + 1800
        while time.monotonic() < deadline:
            read = sum(p["numInputRows"] for p in query.recentProgress)
            if read >= case["records"] or query.exception() is not None:
                break
            time.sleep(0.5)
    wall = time.perf_counter() - started
    error = query.exception()
    progress = list(query.recentProgress)
    if query.isActive:
        query.stop()
    if error is not None:
        raise RuntimeError(f"{fmt} {case['label']} {trigger}: {error}")
    data = [p for p in progress if p.numInputRows > 0]
    read = sum(p.numInputRows for p in data)
    if read != case["records"]:
        raise RuntimeError(f"{fmt} {case['label']} {trigger}: read {read} records, expected "
                           f"{case['records']}")
    sizes = offsets_bytes(checkpoint)
    batches = [{
        "batch": p.batchId, "rows": p.numInputRows,
        "trigger_ms": p.durationMs.get("triggerExecution", 0),
        "latest_offset_ms": p.durationMs.get("latestOffset", 0),
        "add_batch_ms": p.durationMs.get("addBatch", 0),
        "wal_commit_ms": p.durationMs.get("walCommit", 0),
        "progress_bytes": len(p.json),
        "start_offset_bytes": len(p.sources[0].startOffset or ""),
        "end_offset_bytes": len(p.sources[0].endOffset or ""),
        "latest_offset_bytes": len(p.sources[0].latestOffset or ""),
        "offsets_entry_bytes": sizes.get(p.batchId),
    } for p in data]
    return {"label": case["label"], "partitions": case["partitions"], "format": fmt,
            "trigger": trigger, "records": read, "wall_s": wall, "batches": batches,
            **memory(spark)}


def main() -> None:
    request, reply = child_io()
    started = time.perf_counter()
    load_before = os.getloadavg()
    spark = baseline_session("kwatermark-partitions-scale")
    session_s = time.perf_counter() - started
    workspace = request["workspace"]

    def measure(runs: list) -> None:
        plan = [(case, fmt, trigger) for case in request["cases"]
                for trigger in request["triggers"] for fmt in case["formats"]]
        # Warm-up, not reported: JIT, Python workers, the Kafka source's classes.
        for fmt in {fmt for _, fmt, _ in plan}:
            warm = dict(request["cases"][0])
            run_case(spark, warm, fmt, "availableNow", workspace)
        for round_ in range(request["rounds"]):
            for case, fmt, trigger in plan:
                log(f"round {round_ + 1}: {fmt} {case['label']} {trigger}")
                result = run_case(spark, case, fmt, trigger, workspace)
                result["round"] = round_ + 1
                result["load_avg"] = os.getloadavg()
                runs.append(result)
                log(json.dumps({k: v for k, v in result.items() if k != "batches"}))

    measure_and_reply(spark, reply, session_s, load_before, measure)


if __name__ == "__main__":
    main()
