"""kwatermark's benchmark suite: throughput against a single-process floor, watermark overhead,
batch reads, driver planning time and executor memory, on one broker and one data set.

Run: ``python bench/run.py`` (defaults finish in a few minutes on 2 cores); ``--help`` lists
the size flags; ``--profile`` profiles the executor loop instead. Results go to
``bench/results/results.json`` and ``bench/results/throughput.png``; bench/README.md says what
each figure means.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime, timezone

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
RESULTS_DIR = os.path.join(BENCH_DIR, "results")
sys.path.insert(0, BENCH_DIR)

import common

# (label, extra source options) of every streaming configuration measured.
STREAMING_CONFIGS = [
    ("none", {"watermark.strategy": "none"}),
    ("monotonous", {"watermark.strategy": "monotonous"}),
    ("bounded", {"watermark.strategy": "bounded", "watermark.maxOutOfOrderness": "5 seconds"}),
    ("bounded+flag", {"watermark.strategy": "bounded", "watermark.maxOutOfOrderness": "5 seconds",
                      "lateRecords": "flag"}),
]

TARGETS = {
    "streaming_vs_floor": 1.3,       # warm bounded records/s >= 1.3 x floor
    "watermark_overhead": 0.10,      # none/bounded throughput ratio - 1 < 10 %
    "planning_1000_s": 0.5,          # latestOffset + partitions for 1,000 partitions
    "memory_growth_mb": 100.0,       # worker peak RSS, 5M-record range minus 100k range
}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--bootstrap-servers",
                        help="use these Kafka brokers; default: start a Tansu broker")
    parser.add_argument("--records", type=int, default=1_000_000,
                        help="records in the throughput topic (default 1,000,000)")
    parser.add_argument("--partitions", type=int, default=4,
                        help="partitions of the throughput topic (default 4)")
    parser.add_argument("--batches", type=int, default=5,
                        help="micro-batches per streaming run (maxOffsetsPerTrigger = "
                             "records / batches); the first is excluded (default 5)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs of every throughput configuration; medians are reported")
    parser.add_argument("--planning-partitions", default="1,100,1000",
                        help="partition counts for the planning figure (default 1,100,1000)")
    parser.add_argument("--planning-calls", type=int, default=5,
                        help="timed planning calls per partition count (median reported)")
    parser.add_argument("--memory-small", type=int, default=100_000,
                        help="records of the small range of the memory probe (default 100k)")
    parser.add_argument("--memory-large", type=int, default=5_000_000,
                        help="records of the large range of the memory probe (default 5M)")
    parser.add_argument("--configs", default=",".join(label for label, _ in STREAMING_CONFIGS),
                        help="streaming configurations to run (default: all of "
                             + ", ".join(label for label, _ in STREAMING_CONFIGS) + ")")
    parser.add_argument("--skip", default="",
                        help="comma-separated parts to skip: floor, streaming, batch, "
                             "ceiling, overhead, planning, memory")
    parser.add_argument("--profile", action="store_true",
                        help="only profile the executor loop (RangeReader) under pyinstrument "
                             "and print the top of the profile")
    parser.add_argument("--profile-records", type=int, default=1_000_000,
                        help="records of the single-partition range profiled (default 1M)")
    parser.add_argument("--results", default=RESULTS_DIR,
                        help="directory for results.json and throughput.png")
    args = parser.parse_args(argv)
    args.skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    known = dict(STREAMING_CONFIGS)
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in args.configs if c not in known]
    if unknown:
        parser.error(f"--configs: unknown {unknown}; choose from {list(known)}")
    if args.records % args.partitions:
        parser.error("--records must be a multiple of --partitions")
    if args.batches < 2:
        parser.error("--batches must be >= 2: the first batch is excluded as warm-up")
    return args


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


# -- Spark -----------------------------------------------------------------------------


def start_spark(app: str = "kwatermark-bench", shuffle_partitions: int = 2,
                conf: dict[str, str] | None = None):
    """The benchmarks' local[2] session (every script's), and the seconds it took to start."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # The ceiling source lives in bench/common.py: Spark's Python workers import it.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (BENCH_DIR, os.environ.get("PYTHONPATH")) if p)
    from pyspark.sql import SparkSession

    started = time.perf_counter()
    builder = (SparkSession.builder.master("local[2]")
               .appName(app)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
               .config("spark.driver.memory", "2g")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.streaming.stopTimeout", "30s"))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(common.ceiling_source())
    return spark, time.perf_counter() - started


class CpuMeter:
    """CPU seconds spent by each party during a measurement: this driver process, the
    broker (when started here), Spark's JVM, and the Python processes Spark starts
    (workers, the streaming source runner; exited ones through their parents' counters)."""

    def __init__(self, broker_pid: int | None):
        import psutil

        self.psutil = psutil
        self.me = psutil.Process()
        self.broker = psutil.Process(broker_pid) if broker_pid else None
        self.jvm = None

    def _own(self, process, children: bool) -> float:
        try:
            t = process.cpu_times()
        except (self.psutil.NoSuchProcess, self.psutil.AccessDenied):
            return 0.0
        return t.user + t.system + ((t.children_user + t.children_system) if children else 0)

    def snapshot(self) -> dict[str, float]:
        taken = {"driver": self._own(self.me, children=False)}
        if self.broker is not None:
            taken["broker"] = self._own(self.broker, children=False)
        jvm = self._jvm()
        if jvm is not None:
            taken["jvm"] = self._own(jvm, children=False)
            taken["py tasks"] = taken["py planning"] = 0.0
            try:
                t = jvm.cpu_times()
                taken["py planning"] += t.children_user + t.children_system
                for child in jvm.children(recursive=True):
                    taken[self._python_role(child)] += self._own(child, children=True)
            except self.psutil.NoSuchProcess:
                pass
        return taken

    def _jvm(self):
        if self.jvm is None or not self.jvm.is_running():
            self.jvm = None
            for child in self.me.children(recursive=True):
                try:
                    if child.name() == "java":
                        self.jvm = child
                        break
                except (self.psutil.NoSuchProcess, self.psutil.AccessDenied):
                    continue
        return self.jvm

    def _python_role(self, process) -> str:
        """Spark's task workers run under ``pyspark.daemon`` with no worker module named;
        planning runs in ``pyspark.daemon pyspark.sql.worker.*`` and the streaming source
        runner (the driver-side reader)."""
        try:
            argv = process.cmdline()
        except (self.psutil.NoSuchProcess, self.psutil.AccessDenied):
            return "py planning"
        if "pyspark.daemon" in argv:
            after = argv[argv.index("pyspark.daemon") + 1:]
            if not after or after[0] == "pyspark.worker":
                return "py tasks"
        return "py planning"

    def since(self, before: dict[str, float], wall: float) -> dict:
        after = self.snapshot()
        spent = {k: max(0.0, after[k] - before.get(k, 0.0)) for k in after}
        return {"seconds": {k: round(v, 3) for k, v in spent.items()},
                "cores_busy": round(sum(spent.values()) / wall, 2)}


class Workspace:
    """Fresh checkpoint and ledger directories for every run, removed at the end."""

    def __init__(self):
        self.root = tempfile.mkdtemp(prefix="kwatermark-bench-")

    def fresh(self, kind: str) -> str:
        return os.path.join(self.root, f"{kind}-{uuid.uuid4().hex[:8]}")

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def source_options(bootstrap: str, topic: str, ws: Workspace) -> dict[str, str]:
    return {"kafka.bootstrap.servers": bootstrap, "subscribe": topic,
            "startingOffsets": "earliest", "watermark.stateLocation": ws.fresh("ledger")}


def ceiling_options(records: int, partitions: int, batches: int) -> dict[str, str]:
    return {"rows": str(records), "parts": str(partitions),
            "perTrigger": str(-(-records // batches))}


def available_now_progress(spark, fmt: str, options: dict[str, str], records: int,
                           label: str, ws: Workspace, timeout_s: int = 600) -> list:
    """One AvailableNow run into the noop sink on a fresh checkpoint: the progress of its
    batches that read records, after checking they read exactly ``records``."""
    reader = spark.readStream.format(fmt)
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (reader.load().writeStream.format("noop")
             .option("checkpointLocation", ws.fresh("checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination(timeout_s)
    if query.isActive:
        query.stop()
        raise RuntimeError(f"streaming run {label} did not finish in {timeout_s} s")
    if query.exception() is not None:
        raise RuntimeError(f"streaming run {label} failed: {query.exception()}")
    progress = [p for p in query.recentProgress if p.numInputRows > 0]
    total = sum(p.numInputRows for p in progress)
    if total != records:
        raise RuntimeError(f"streaming run {label} read {total} records, expected {records}")
    return progress


def run_streaming(spark, fmt: str, options: dict[str, str], records: int, label: str,
                  ws: Workspace, meter: CpuMeter) -> dict:
    """One AvailableNow run into the noop sink on a fresh checkpoint, split into micro-batches
    by the options; warm throughput is the records of batches 2.. over the sum of their
    durations (Spark's durationMs.triggerExecution, and addBatch alone)."""
    cpu = meter.snapshot()
    started = time.perf_counter()
    progress = available_now_progress(spark, fmt, options, records, label, ws)
    wall = time.perf_counter() - started
    cpu = meter.since(cpu, wall)
    warm = progress[1:]
    rows = sum(p.numInputRows for p in warm)
    trigger_ms = sum(p.durationMs.get("triggerExecution", 0) for p in warm)
    add_ms = sum(p.durationMs.get("addBatch", 0) for p in warm)
    return {
        "batches": len(progress),
        "first_batch_s": progress[0].durationMs.get("triggerExecution", 0) / 1000.0,
        "warm_records": rows,
        "warm_trigger_s": trigger_ms / 1000.0,
        "warm_add_batch_s": add_ms / 1000.0,
        "warm_records_per_s": rows / (trigger_ms / 1000.0),
        "warm_add_batch_records_per_s": rows / (add_ms / 1000.0),
        "warm_other_ms_per_batch": (trigger_ms - add_ms) / len(warm),
        "warm_duration_ms_per_batch": {
            key: sum(p.durationMs.get(key, 0) for p in warm) / len(warm)
            for key in sorted({k for p in warm for k in p.durationMs})},
        "wall_s": wall,
        "wall_records_per_s": records / wall,
        "cpu": cpu,
    }


def run_batch_read(spark, fmt: str, options: dict[str, str], records: int,
                   meter: CpuMeter | None = None) -> dict:
    """``spark.read`` of the whole range into the noop sink; the session is already up."""
    reader = spark.read.format(fmt)
    for key, value in options.items():
        reader = reader.option(key, value)
    cpu = meter.snapshot() if meter else None
    started = time.perf_counter()
    reader.load().write.format("noop").mode("overwrite").save()
    seconds = time.perf_counter() - started
    result = {"seconds": seconds, "records_per_s": records / seconds}
    if meter:
        result["cpu"] = meter.since(cpu, seconds)
    return result


def warm_up(spark, bootstrap: str, topic: str, partitions: int, ws: Workspace) -> float:
    """Start Spark's Python workers and JIT the JVM paths on a small range (not measured)."""
    started = time.perf_counter()
    options = source_options(bootstrap, topic, ws)
    options["endingOffsets"] = json.dumps({topic: {str(p): 5_000 for p in range(partitions)}})
    run_batch_read(spark, "kwatermark", options, 0)
    run_batch_read(spark, common.CEILING_FORMAT, ceiling_options(20_000, partitions, 1), 0)
    return time.perf_counter() - started


def task_overhead(bootstrap: str, topic: str, end: int, runs: int) -> dict:
    """The executor loop's fixed cost per task: RangeReader over the last record of a
    partition (what a caught-up stream reads: one new record), as shipped and with
    librdkafka's fetch.queue.backoff.ms at 10 ms and at its 1 s default."""
    results = {}
    for label, extra in (("as shipped", {}),
                         ("fetch.queue.backoff.ms=10", {"kafka.fetch.queue.backoff.ms": "10"}),
                         ("fetch.queue.backoff.ms=1000",
                          {"kafka.fetch.queue.backoff.ms": "1000"})):
        times = []
        for i in range(runs):
            reader = common.range_reader(bootstrap, topic, i % 2, end - 1, end, extra)
            times.append(common.drain(reader)[1])
        stalls = sum(t > 0.5 for t in times)
        results[label] = {"median_ms": median(times) * 1000, "max_ms": max(times) * 1000,
                          "runs_over_500ms": stalls,
                          "runs_ms": [round(t * 1000, 1) for t in times]}
        log(f"  1-record task, {label:<28} median {median(times) * 1000:7.1f} ms, "
            f"max {max(times) * 1000:7.1f} ms, {stalls}/{runs} runs over 500 ms")
    return results


# -- planning --------------------------------------------------------------------------


class _Collect(logging.Handler):
    """Keeps the messages of librdkafka's debug log (routed through Python logging)."""

    def __init__(self, level: int):
        super().__init__(level)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


class ListOffsetsCounter:
    """Counts AdminClient.list_offsets calls and the partitions each asked for."""

    def __init__(self, admin):
        self.calls: list[int] = []
        self._inner = admin.list_offsets

        def counting(requests, **kwargs):
            self.calls.append(len(requests))
            return self._inner(requests, **kwargs)

        admin.list_offsets = counting


def measure_planning(spark, broker: common.Broker, counts: list[int], calls: int,
                     ws: Workspace) -> dict:
    """``latestOffset(start, ReadAllAvailable()) + partitions(start, end)`` on a stream reader
    built directly, with records in every partition; median over ``calls``."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from kwatermark.source import KWatermarkDataSource

    results = {}
    for n in counts:
        topic = broker.create_topic(n, f"bench-plan{n}")
        common.produce_sequence(broker, topic, n, 3, tail_flush_each=False)
        options = source_options(broker.bootstrap_servers, topic, ws)
        source = KWatermarkDataSource(options)
        schema = spark.createDataFrame([], source.schema()).schema
        reader = source.streamReader(schema)
        start = reader.initialOffset()  # creates the AdminClient: not timed
        counter = ListOffsetsCounter(reader.planner.metadata.admin)
        timings, latest_s = [], []
        for _ in range(calls):
            t0 = time.perf_counter()
            end = reader.latestOffset(start, ReadAllAvailable())
            t1 = time.perf_counter()
            tasks = reader.partitions(start, end)
            timings.append(time.perf_counter() - t0)
            latest_s.append(t1 - t0)
        ranges = [task for partition in tasks for task in partition.tasks]
        if len(ranges) != n:
            raise RuntimeError(f"planning {n} partitions gave {len(ranges)} ranges")
        after = planning_after_batch(source, schema, end, ranges, calls)

        # Wire-level check: librdkafka's protocol debug log, one fresh reader, one call.
        debug_options = dict(options, **{"kafka.debug": "protocol"})
        debug_source = KWatermarkDataSource(debug_options)
        debug_reader = debug_source.streamReader(schema)
        debug_start = debug_reader.initialOffset()
        handler = _Collect(level=logging.DEBUG)
        lines = handler.lines
        rdkafka_log = logging.getLogger("kwatermark.librdkafka")
        previous_level = rdkafka_log.level
        rdkafka_log.addHandler(handler)
        rdkafka_log.setLevel(logging.DEBUG)
        try:
            admin = debug_reader.planner.metadata.admin
            admin.poll(0.2)
            lines.clear()
            debug_reader.latestOffset(debug_start, ReadAllAvailable())
            admin.poll(0.5)
        finally:
            rdkafka_log.removeHandler(handler)
            rdkafka_log.setLevel(previous_level)
        sent = [line for line in lines if "Sent ListOffsetsRequest" in line]
        results[str(n)] = {
            "median_s": median(timings),
            "min_s": min(timings),
            "max_s": max(timings),
            "latest_offset_median_s": median(latest_s),
            "after_batch_median_s": after,
            "list_offsets_calls_per_plan": len(counter.calls) / calls,
            "partitions_per_list_offsets_call": sorted(set(counter.calls)),
            "list_offsets_requests_on_wire": len(sent) if lines else None,
        }
        log(f"  planning {n:>5} partitions: median {median(timings) * 1000:8.1f} ms, "
            f"{len(counter.calls) / calls:g} list_offsets call(s) per plan for "
            f"{sorted(set(counter.calls))} partitions, "
            f"{len(sent) if lines else '?'} ListOffsets request(s) on the wire")
    return results


def planning_after_batch(source, schema, end: dict, ranges: list, calls: int) -> float:
    """The first ``latestOffset`` after a batch ran: it folds every task's progress record
    from the ledger (DESIGN §4) before asking the broker. The records are published here as
    the tasks would have; each call uses a fresh reader, so nothing is cached."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from kwatermark.ledger import ProgressRecord
    from kwatermark.watermarks import make_generator

    publisher = source.streamReader(schema)
    for task in ranges:
        generator = make_generator(publisher.options.watermark)
        generator.on_event(common.BASE_TS_MS)
        record = ProgressRecord(generator=generator.snapshot(), count=task.end - task.start,
                                min_event_ms=common.BASE_TS_MS,
                                max_event_ms=common.BASE_TS_MS, max_row_watermark=None)
        publisher.planner.ledger.publish(task, publisher.planner.fingerprint, record)
    timings = []
    first = ranges[0]
    for _ in range(calls):
        reader = source.streamReader(schema)
        # A fresh AdminClient's first ListOffsets sometimes waits ~50 ms for the leader's
        # connection: warm it, so the figure is the fold plus one steady-state request.
        reader.planner.metadata.latest_offsets([(first.topic, first.partition)])
        t0 = time.perf_counter()
        reader.latestOffset(end, ReadAllAvailable())
        timings.append(time.perf_counter() - t0)
    return median(timings)


# -- memory ----------------------------------------------------------------------------


# The executor's consumer settings as first shipped (librdkafka's 1 s fetch-queue backoff
# and a 500k prefetch), probed alongside the current ones (bench/README.md).
FIRST_SHIPPED_CONSUMER = {"kafka.fetch.queue.backoff.ms": "1000",
                          "kafka.queued.min.messages": "500000"}


def memory_run(bootstrap: str, topic: str, records: int,
               extra: dict[str, str] | None = None) -> dict:
    code = (f"import json, sys; sys.path.insert(0, {BENCH_DIR!r}); import common; "
            f"print(json.dumps(common.memory_probe({bootstrap!r}, {topic!r}, 0, 0, "
            f"{records}, {extra!r})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=1200, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"memory probe failed: {done.stderr[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if result["records"] != records:
        raise RuntimeError(f"memory probe read {result['records']} of {records} records")
    return result


def measure_memory(broker: common.Broker, small: int, large: int) -> dict:
    topic = broker.create_topic(1, "bench-mem")
    log(f"producing {large:,} records into one partition for the memory probe")
    produce_s = common.produce_sequence(broker, topic, 1, large)
    log(f"  produced in {produce_s:.1f} s")
    result = {"small_records": small, "large_records": large}
    for label, extra in (("as shipped", None), ("first shipped", FIRST_SHIPPED_CONSUMER)):
        small_run = memory_run(broker.bootstrap_servers, topic, small, extra)
        large_run = memory_run(broker.bootstrap_servers, topic, large, extra)
        growth = large_run["peak_rss_mb"] - small_run["peak_rss_mb"]
        log(f"  {label:<11} worker peak RSS: {small:,} records "
            f"{small_run['peak_rss_mb']:.0f} MB, {large:,} records "
            f"{large_run['peak_rss_mb']:.0f} MB, growth {growth:.0f} MB; "
            f"{large_run['records_per_s']:,.0f} records/s over the large range")
        if extra is None:
            result.update(small=small_run, large=large_run, growth_mb=growth)
        else:
            result["first_shipped"] = {"options": extra, "small": small_run,
                                       "large": large_run, "growth_mb": growth}
    return result


# -- profile ---------------------------------------------------------------------------


class _TimedConsumer:
    """A Consumer whose consume() calls are timed (librdkafka + broker + Message objects)."""

    def __init__(self, consumer, spent: list):
        self._consumer = consumer
        self._spent = spent

    def consume(self, *args, **kwargs):
        t0 = time.perf_counter()
        messages = self._consumer.consume(*args, **kwargs)
        self._spent.append(time.perf_counter() - t0)
        return messages

    def __getattr__(self, name):
        return getattr(self._consumer, name)


def profile(args: argparse.Namespace, broker: common.Broker) -> int:
    """The executor loop alone, over one partition: plain figures, where the time goes
    (inside consume() vs. the Python side), then a pyinstrument profile."""
    from pyinstrument import Profiler

    import kwatermark.reader

    n = args.profile_records
    bootstrap = broker.bootstrap_servers
    topic = broker.create_topic(1, "bench-profile")
    log(f"producing {n:,} records into one partition")
    common.produce_sequence(broker, topic, 1, n)
    rows, seconds = common.floor_read(bootstrap, topic, {0: (0, n)})
    log(f"floor (one consumer, Kafka columns only):         {rows / seconds:>10,.0f} records/s")
    variants = (("as shipped", {}),
                ("fetch.queue.backoff.ms=10", {"kafka.fetch.queue.backoff.ms": "10"}),
                ("first shipped consumer settings", FIRST_SHIPPED_CONSUMER))
    for label, extra in variants:
        rows, seconds = common.drain(common.range_reader(bootstrap, topic, 0, 0, n, extra))
        log(f"RangeReader bounded, {label:<31} {rows / seconds:>10,.0f} records/s")

    spent: list[float] = []
    opener = kwatermark.reader.open_consumer
    kwatermark.reader.open_consumer = lambda *a: _TimedConsumer(opener(*a), spent)
    try:
        rows, seconds = common.drain(common.range_reader(bootstrap, topic, 0, 0, n))
    finally:
        kwatermark.reader.open_consumer = opener
    inside = sum(spent)
    log(f"RangeReader as shipped: {seconds:.2f} s = {inside:.2f} s inside consume() "
        f"({len(spent)} calls, longest {max(spent) * 1000:.0f} ms) + "
        f"{seconds - inside:.2f} s Python side ({(seconds - inside) / rows * 1e6:.2f} us/record)")

    profiler = Profiler(interval=0.001)
    reader = common.range_reader(bootstrap, topic, 0, 0, n)
    profiler.start()
    rows, seconds = common.drain(reader)
    profiler.stop()
    log(f"RangeReader as shipped, under pyinstrument: {rows / seconds:,.0f} records/s "
        f"(the profiler's per-call cost inflates the many small C calls of the loop)")
    print(profiler.output_text(unicode=True, color=False, show_all=False))
    return 0


# -- report ----------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def _rate_line(label: str, rate: float, floor: float | None, ceiling: float | None) -> str:
    by_floor = f"{rate / floor:>9.2f}" if floor else f"{'':>9}"
    by_ceiling = f"{rate / ceiling:>11.2f}" if ceiling else ""
    return f"{label:<46}{rate:>12,.0f}{by_floor}{by_ceiling}"


def summarise(results: dict) -> list[str]:
    lines = [""]
    tp = results.get("throughput", {})
    floor = tp.get("floor", {}).get("records_per_s")
    streaming = tp.get("streaming", {})
    ceiling = streaming.get("spark ceiling", {}).get("warm_records_per_s")
    if tp:
        lines.append(f"{'throughput (median of ' + str(results['sizes']['repeat']) + ')':<46}"
                     f"{'records/s':>12}{'x floor':>9}{'x ceiling':>11}")
    if floor:
        lines.append(_rate_line("floor: 1 process, tuned consumer + Arrow", floor, floor,
                                None))
    for label, data in streaming.items():
        lines.append(_rate_line(f"streaming warm, {label}", data["warm_records_per_s"],
                                floor, ceiling))
    for label, data in streaming.items():
        lines.append(_rate_line(f"  addBatch only, {label}",
                                data["warm_add_batch_records_per_s"], floor, None))
    for label, data in streaming.items():
        lines.append(_rate_line(f"  whole run incl. first batch, {label}",
                                data["wall_records_per_s"], floor, None))
    batch = tp.get("batch_read", {})
    batch_ceiling = batch.get("spark ceiling", {}).get("records_per_s")
    for label, data in batch.items():
        lines.append(_rate_line(f"batch read, {label}", data["records_per_s"], floor,
                                batch_ceiling))
    costed = ([("floor", tp["floor"])] if "floor" in tp else []) + \
        [(f"streaming {k}", v) for k, v in streaming.items()] + \
        [(f"batch read {k}", v) for k, v in batch.items()]
    if costed:
        records = results["sizes"]["records"]
        parties = sorted({p for _, v in costed for p in v["cpu_seconds"]})
        lines.append("")
        lines.append("CPU per record (us, whole run incl. first batch) and cores busy:")
        lines.append(f"  {'':<30}" + "".join(f"{p:>15}" for p in parties) + f"{'cores busy':>12}")
        for label, data in costed:
            lines.append(f"  {label:<30}" + "".join(
                f"{data['cpu_seconds'].get(p, 0.0) / records * 1e6:>15.2f}" for p in parties)
                + f"{data['cores_busy']:>12.2f}")
    overhead = results.get("task_overhead")
    if overhead:
        lines.append("")
        lines.append("executor loop, a task reading a partition's last record (median):")
        for label, data in overhead.items():
            lines.append(f"  {label:<28}{data['median_ms']:8.1f} ms  (max "
                         f"{data['max_ms']:.0f} ms; {data['runs_over_500ms']}/"
                         f"{len(data['runs_ms'])} runs over 500 ms)")
    planning = results.get("planning")
    if planning:
        lines.append("")
        lines.append("driver planning, latestOffset + partitions (median):")
        for n, data in planning.items():
            after = data.get("after_batch_median_s")
            after = f"{after * 1000:8.1f} ms" if after is not None else "     n/a"
            lines.append(f"  {n:>5} partitions: {data['median_s'] * 1000:8.1f} ms;  after a "
                         f"batch (fold + ledger): {after};  list_offsets calls/plan "
                         f"{data['list_offsets_calls_per_plan']:g}, ListOffsets requests on "
                         f"the wire {data['list_offsets_requests_on_wire']}")
    memory = results.get("memory")
    if memory:
        lines.append("")
        lines.append("executor loop alone (RangeReader, one partition, child process):")
        rows = [("as shipped", memory)]
        if "first_shipped" in memory:
            first = memory["first_shipped"]
            options = ", ".join(f"{k}={v}" for k, v in first["options"].items())
            rows.append((f"as first shipped ({options})", first))
        for label, data in rows:
            lines.append(f"  {label}:")
            lines.append(f"    peak RSS {memory['small_records']:,} records "
                         f"{data['small']['peak_rss_mb']:.0f} MB, {memory['large_records']:,} "
                         f"records {data['large']['peak_rss_mb']:.0f} MB (growth "
                         f"{data['growth_mb']:.0f} MB); {data['large']['records_per_s']:,.0f} "
                         f"records/s, {data['large']['cpu_s'] / memory['large_records'] * 1e6:.2f}"
                         f" us CPU/record over the large range")
    lines.append("")
    for name, target in results.get("targets", {}).items():
        lines.append(f"{target['status']}  {name}: {target['description']}")
    return lines


def evaluate_targets(results: dict) -> dict:
    targets = {}
    tp = results.get("throughput", {})
    floor = tp.get("floor", {}).get("records_per_s")
    streaming = tp.get("streaming", {})
    if floor and "bounded" in streaming:
        ratio = streaming["bounded"]["warm_records_per_s"] / floor
        goal = TARGETS["streaming_vs_floor"]
        targets["streaming_vs_floor"] = {
            "value": ratio, "target": f">= {goal}", "status": verdict(ratio >= goal),
            "description": f"warm streaming bounded / floor = {ratio:.2f} (target >= {goal})"}
    if "bounded" in streaming and "none" in streaming:
        ratio = streaming["none"]["warm_records_per_s"] / streaming["bounded"]["warm_records_per_s"]
        goal = TARGETS["watermark_overhead"]
        targets["watermark_overhead"] = {
            "value": ratio - 1, "target": f"< {goal:.0%}", "status": verdict(ratio - 1 < goal),
            "description": f"bounded vs none overhead = {ratio - 1:+.1%} (none/bounded "
                           f"records/s {ratio:.3f}; target < {goal:.0%})"}
    planning = results.get("planning", {})
    if "1000" in planning:
        seconds = planning["1000"]["median_s"]
        goal = TARGETS["planning_1000_s"]
        batched = (planning["1000"]["list_offsets_calls_per_plan"] == 1
                   and planning["1000"]["partitions_per_list_offsets_call"] == [1000])
        targets["planning_1000"] = {
            "value": seconds, "target": f"< {goal} s", "status": verdict(seconds < goal),
            "batched_list_offsets": batched,
            "description": f"planning 1,000 partitions = {seconds * 1000:.1f} ms (target < "
                           f"{goal * 1000:.0f} ms); end offsets in one batched list_offsets "
                           f"call: {'yes' if batched else 'NO'}"}
    memory = results.get("memory")
    if memory:
        growth = memory["growth_mb"]
        goal = TARGETS["memory_growth_mb"]
        targets["memory_growth"] = {
            "value": growth, "target": f"< {goal:.0f} MB", "status": verdict(growth < goal),
            "description": f"worker peak RSS growth {memory['small_records']:,} -> "
                           f"{memory['large_records']:,} records = {growth:.0f} MB (target < "
                           f"{goal:.0f} MB)"}
    return targets


def chart(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tp = results["throughput"]
    bars = []
    if "floor" in tp:
        bars.append(("floor\n1 process", tp["floor"]["records_per_s"], "#888888"))
    for label, data in tp.get("streaming", {}).items():
        colour = "#bbbbbb" if label == "spark ceiling" else "#1f77b4"
        bars.append((f"stream\n{label.replace(' ', chr(10))}", data["warm_records_per_s"],
                     colour))
    for label, data in tp.get("batch_read", {}).items():
        colour = "#bbbbbb" if label == "spark ceiling" else "#2ca02c"
        bars.append((f"batch\n{label.replace(' ', chr(10))}", data["records_per_s"], colour))
    if not bars:
        return
    fig, ax = plt.subplots(figsize=(9, 4.4))
    drawn = ax.bar([b[0] for b in bars], [b[1] / 1000 for b in bars],
                   color=[b[2] for b in bars])
    for bar, (_, value, _) in zip(drawn, bars):
        ax.annotate(f"{value / 1000:,.0f}k", (bar.get_x() + bar.get_width() / 2,
                                              bar.get_height()),
                    ha="center", va="bottom", fontsize=8)
    if "floor" in tp:
        goal = tp["floor"]["records_per_s"] * TARGETS["streaming_vs_floor"] / 1000
        ax.axhline(goal, color="#d62728", linestyle="--", linewidth=1)
        ax.annotate(f"target: streaming bounded >= {TARGETS['streaming_vs_floor']} x floor",
                    (-0.4, goal), ha="left", va="bottom", fontsize=8,
                    color="#d62728")
    sizes = results["sizes"]
    ax.set_ylabel("thousand records/s (median)")
    ax.tick_params(axis="x", labelsize=8)
    ax.set_title(f"kwatermark: {sizes['records']:,} records of {sizes['value_bytes']} B, "
                 f"{sizes['partitions']} partitions, Spark local[2], "
                 f"{os.cpu_count()} cores shared with the broker\n"
                 f"streaming: warm batches of {sizes['max_offsets_per_trigger']:,}; batch read: "
                 f"whole run; grey: Spark with a no-op Python source", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def git_revision() -> dict:
    root = os.path.dirname(BENCH_DIR)
    def git(*argv: str) -> str:
        return subprocess.run(["git", *argv], cwd=root, capture_output=True, text=True,
                              timeout=10, check=False).stdout.strip()

    try:
        return {"head": git("rev-parse", "--short", "HEAD"),
                "connector_modified": bool(git("status", "--porcelain", "connector"))}
    except (OSError, subprocess.SubprocessError):
        return {}


# -- main ------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    broker = common.Broker.open(args.bootstrap_servers)
    log(f"broker: {broker.kind} at {broker.bootstrap_servers}")
    try:
        if args.profile:
            return profile(args, broker)
        return measure(args, broker)
    finally:
        broker.stop()


def measure(args: argparse.Namespace, broker: common.Broker) -> int:
    bootstrap = broker.bootstrap_servers
    results: dict = {
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": common.machine_info(),
        "git": git_revision(),
        "broker": broker.kind,
        "sizes": {"records": args.records, "partitions": args.partitions,
                  "value_bytes": common.VALUE_SIZE, "batches": args.batches,
                  "max_offsets_per_trigger": -(-args.records // args.batches),
                  "repeat": args.repeat},
        "throughput": {},
    }
    per_partition = args.records // args.partitions
    wanted = {"floor", "streaming", "batch"} - args.skip
    ws = Workspace()
    spark = None
    try:
        if wanted:
            topic = broker.create_topic(args.partitions, "bench")
            log(f"producing {args.records:,} records of {common.VALUE_SIZE} B into "
                f"{args.partitions} partitions of {topic}")
            seconds = common.produce_sequence(broker, topic, args.partitions, per_partition)
            log(f"  produced in {seconds:.1f} s ({args.records / seconds:,.0f} records/s)")
            results["sizes"]["produce_s"] = seconds
        if wanted - {"floor"} or "planning" not in args.skip:
            spark, start_s = start_spark()
            results["session_start_s"] = start_s
            log(f"SparkSession local[2] started in {start_s:.1f} s")
        if wanted - {"floor"}:
            seconds = warm_up(spark, bootstrap, topic, args.partitions, ws)
            log(f"warm-up batch reads (not measured): {seconds:.1f} s")
        configs = [(label, extra) for label, extra in STREAMING_CONFIGS if label in args.configs]
        runs: dict[str, list] = {}
        ranges = {p: (0, per_partition) for p in range(args.partitions)}
        ceiling = ceiling_options(args.records, args.partitions, args.batches)
        meter = CpuMeter(broker.pid)
        # Rounds interleave every configuration, so drift in the machine's load hits all alike.
        for round_no in range(1, args.repeat + 1 if wanted else 1):
            if "floor" in wanted:
                cpu = meter.snapshot()
                rows, seconds = common.floor_read(bootstrap, topic, ranges)
                if rows != args.records:
                    raise RuntimeError(f"floor read {rows} records, expected {args.records}")
                runs.setdefault("floor", []).append(
                    {"seconds": seconds, "records_per_s": rows / seconds,
                     "cpu": meter.since(cpu, seconds)})
                log(f"round {round_no}: floor                       "
                    f"{rows / seconds:>10,.0f} records/s")
            if "streaming" in wanted:
                plan = [(label, "kwatermark", dict(
                    source_options(bootstrap, topic, ws),
                    maxOffsetsPerTrigger=str(-(-args.records // args.batches)), **extra))
                    for label, extra in configs]
                if "ceiling" not in args.skip:
                    plan.append(("spark ceiling", common.CEILING_FORMAT, ceiling))
                # Each round starts with another configuration: the first after the floor's
                # read would otherwise always be the same one.
                turn = (round_no - 1) % len(plan)
                for label, fmt, options in plan[turn:] + plan[:turn]:
                    run = run_streaming(spark, fmt, options, args.records, label, ws, meter)
                    runs.setdefault(f"streaming:{label}", []).append(run)
                    log(f"round {round_no}: streaming {label:<17} warm "
                        f"{run['warm_records_per_s']:>10,.0f} records/s (addBatch only "
                        f"{run['warm_add_batch_records_per_s']:,.0f}; first batch "
                        f"{run['first_batch_s']:.2f} s; wall {run['wall_s']:.1f} s)")
            if "batch" in wanted:
                plan = [("kwatermark", "kwatermark",
                         dict(source_options(bootstrap, topic, ws), endingOffsets="latest"))]
                if "ceiling" not in args.skip:
                    plan.append(("spark ceiling", common.CEILING_FORMAT, ceiling))
                for label, fmt, options in plan:
                    run = run_batch_read(spark, fmt, options, args.records, meter)
                    runs.setdefault(f"batch:{label}", []).append(run)
                    log(f"round {round_no}: batch read {label:<16} "
                        f"{run['records_per_s']:>10,.0f} records/s ({run['seconds']:.2f} s)")
        tp = results["throughput"]
        for key, measured in runs.items():
            summary = {name: median([r[name] for r in measured]) for name in measured[0]
                       if isinstance(measured[0][name], (int, float))}
            if "warm_duration_ms_per_batch" in measured[0]:
                summary["warm_duration_ms_per_batch"] = {
                    key: median([r["warm_duration_ms_per_batch"].get(key, 0) for r in measured])
                    for key in measured[0]["warm_duration_ms_per_batch"]}
            summary["cpu_seconds"] = {
                party: median([r["cpu"]["seconds"].get(party, 0.0) for r in measured])
                for party in measured[0]["cpu"]["seconds"]}
            summary["cores_busy"] = median([r["cpu"]["cores_busy"] for r in measured])
            summary["runs"] = measured
            if key == "floor":
                tp["floor"] = summary
            else:
                kind, label = key.split(":", 1)
                tp.setdefault("streaming" if kind == "streaming" else "batch_read",
                              {})[label] = summary
        if "overhead" not in args.skip and wanted:
            log("per-task fixed cost of the executor loop")
            results["task_overhead"] = task_overhead(bootstrap, topic, per_partition, 20)
        if "planning" not in args.skip:
            counts = [int(c) for c in args.planning_partitions.split(",") if c.strip()]
            log(f"driver planning for {counts} partitions")
            results["planning"] = measure_planning(spark, broker, counts, args.planning_calls,
                                                   ws)
        if "memory" not in args.skip:
            results["memory"] = measure_memory(broker, args.memory_small, args.memory_large)
    finally:
        if spark is not None:
            spark.stop()
        ws.remove()
    try:
        results["machine"]["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    results["targets"] = evaluate_targets(results)
    os.makedirs(args.results, exist_ok=True)
    with open(os.path.join(args.results, "results.json"), "w") as out:
        json.dump(results, out, indent=2, sort_keys=False)
        out.write("\n")
    if results["throughput"]:
        chart(results, os.path.join(args.results, "throughput.png"))
    for line in summarise(results):
        print(line)
    print(f"\nwrote {os.path.join(args.results, 'results.json')}"
          + (" and throughput.png" if results["throughput"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
