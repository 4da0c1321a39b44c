"""A Spark standalone cluster on loopback, and kwatermark queries driven against it.

``StandaloneCluster`` starts a master and workers from the pip-installed pyspark
(``$SPARK_HOME/bin/spark-class``). Each worker runs in a private mount namespace where a
fresh tmpfs hides ``hidden_dir`` (the driver's default progress location), and with a temp
directory of its own, so its executors do not share the driver's temp directory, as on a
real cluster. Every daemon runs in a process group of its own (its executors and their
Python workers included), killed by ``stop()``; logs stay in ``root`` for failure messages.

``python -m tests.support.cluster SPEC.json`` is the driver (a process of its own: the test
session's SparkContext is a local one). It connects to the spec's master and runs the spec's
queries one after the other, each with ``Trigger.AvailableNow``, each writing every
micro-batch to ``<out>/<name>/batch-<id>.json`` (batch-id keyed: a replayed batch overwrites
its earlier attempt; ``count_only`` writes the row count instead). ``pause_before_batch`` =
K makes batch K's sink write ``paused-K`` and wait for ``resume`` (in the query's
directory) before it reads its rows, so a test can act between batches. When a query ends, ``done.json`` holds its exception (or null) and the
duration of every batch. One driver for every query: executors start once.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.support.jvm import TEST_JVM_OPTIONS


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spark_home() -> str:
    import pyspark

    return os.path.dirname(pyspark.__file__)


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return f"--- {path}\n{path.read_text(errors='replace')[-chars:]}"
    except OSError:
        return f"--- {path}: none"


class StandaloneCluster:
    """A master and ``workers`` workers of one core each, on 127.0.0.1."""

    def __init__(self, root: Path, hidden_dir: str, workers: int = 2):
        self.root = root
        self.hidden_dir = hidden_dir
        self.workers = workers
        self.port = free_port()
        self.ui_port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.processes: list[subprocess.Popen] = []
        self.logs: list[Path] = []

    def _env(self, tmp: Path | None = None) -> dict:
        env = dict(os.environ, SPARK_HOME=spark_home(), SPARK_LOCAL_IP="127.0.0.1",
                   SPARK_DAEMON_MEMORY="256m", SPARK_DAEMON_JAVA_OPTS=TEST_JVM_OPTIONS,
                   PYSPARK_PYTHON=sys.executable)
        env.pop("SPARK_CONF_DIR", None)
        if tmp is not None:
            env["TMPDIR"] = str(tmp)
        return env

    def _spawn(self, name: str, command: list[str], env: dict) -> subprocess.Popen:
        log = self.root / f"{name}.log"
        self.logs.append(log)
        with open(log, "w") as out:
            process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        self.processes.append(process)
        return process

    def start(self) -> StandaloneCluster:
        """Spawns the daemons; ``wait_ready`` waits for the workers to register."""
        spark_class = os.path.join(spark_home(), "bin", "spark-class")
        self._spawn("master", [spark_class, "org.apache.spark.deploy.master.Master",
                               "--host", "127.0.0.1", "--port", str(self.port),
                               "--webui-port", str(self.ui_port)], self._env())
        self.worker_pids = []
        for n in range(self.workers):
            tmp = self.root / f"worker-{n}-tmp"
            work = self.root / f"worker-{n}-work"
            tmp.mkdir()
            work.mkdir()
            worker = shlex.join([spark_class, "org.apache.spark.deploy.worker.Worker",
                                 "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
                                 "--webui-port", str(free_port()), "--work-dir", str(work),
                                 self.url])
            hidden = shlex.quote(self.hidden_dir)
            script = (f"mkdir -p {hidden} && mount -t tmpfs tmpfs {hidden} && "
                      f"exec {worker}")
            process = self._spawn(f"worker-{n}", ["unshare", "--mount", "--propagation",
                                                  "private", "sh", "-c", script],
                                  self._env(tmp))
            self.worker_pids.append(process.pid)
        return self

    def wait_ready(self, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while self.alive_workers() < self.workers:
            for process in self.processes:
                if process.poll() is not None:
                    raise AssertionError(f"a cluster daemon exited:\n{self.log_tails()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"the workers never registered:\n{self.log_tails()}")
            time.sleep(0.2)

    def _ui_url(self) -> str | None:
        """The master's web UI, where its log says it is bound; None before it says so. The
        port asked (a free one when chosen) may be taken before the master binds it (a
        driver's or worker's UI on an ephemeral port took it once, 2026-12-08): Spark then
        binds the next port, and the port asked answers with another UI's HTML."""
        try:
            text = (self.root / "master.log").read_text(errors="replace")
        except OSError:
            return None
        found = re.search(r"Bound MasterWebUI to \S+, and started at http://[^:/\s]+:(\d+)",
                          text)
        return f"http://127.0.0.1:{found.group(1)}" if found else None

    def alive_workers(self) -> int:
        url = self._ui_url()
        if url is None:
            return 0
        try:
            with urllib.request.urlopen(f"{url}/json", timeout=2) as r:
                state = json.load(r)
        except (OSError, ValueError):   # not up yet, or not JSON yet
            return 0
        return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")

    def executors(self) -> list[int]:
        """Process ids of the executor JVMs our workers launched."""
        found = []
        for stat in glob.glob("/proc/[0-9]*/stat"):
            try:
                pid = int(stat.split("/")[2])
                parent = int(Path(stat).read_text().rsplit(")", 1)[1].split()[1])
                if parent not in self.worker_pids:
                    continue
                command = Path(f"/proc/{pid}/cmdline").read_bytes()
            except (OSError, ValueError, IndexError):
                continue
            if b"CoarseGrainedExecutorBackend" in command:
                found.append(pid)
        return sorted(found)

    def log_tails(self) -> str:
        executor_logs = sorted(self.root.glob("worker-*-work/app-*/*/stderr"))
        return "\n".join(_tail(p) for p in self.logs + executor_logs)

    def stop(self) -> None:
        for process in self.processes:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for process in self.processes:
            process.wait(30)




class ClusterDriver:
    """Runs ``python -m tests.support.cluster`` in a process group of its own."""

    def __init__(self, root: Path, master: str, queries: list[dict]):
        self.root = root
        self.master = master
        self.queries = queries
        self.out = root / "out"
        for query in queries:
            (self.out / query["name"]).mkdir(parents=True)
        self.log = root / "driver.log"

    def start(self) -> ClusterDriver:
        spec = self.root / "spec.json"
        spec.write_text(json.dumps({"master": self.master, "out": str(self.out),
                                    "checkpoints": str(self.root / "checkpoints"),
                                    "queries": self.queries}))
        repo = Path(__file__).resolve().parents[2]
        env = dict(os.environ, TZ="UTC", PYSPARK_PYTHON=sys.executable,
                   PYSPARK_DRIVER_PYTHON=sys.executable)
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.support.cluster", str(spec)], cwd=repo,
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def path(self, query: str, name: str) -> Path:
        return self.out / query / name

    def wait_for(self, path: Path, cluster: StandaloneCluster, timeout_s: float = 150) -> None:
        deadline = time.monotonic() + timeout_s
        while not path.exists():
            if self.process.poll() is not None and not path.exists():
                raise AssertionError(f"the driver exited ({self.process.returncode}) before "
                                     f"{path}:\n{self.failure(cluster)}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {path} in {timeout_s} s:\n"
                                     f"{self.failure(cluster)}")
            time.sleep(0.1)

    def done(self, query: str, cluster: StandaloneCluster) -> dict:
        """Waits for the query to end: its exception text (or None) and batch durations."""
        self.wait_for(self.path(query, "done.json"), cluster)
        return json.loads(self.path(query, "done.json").read_text())

    def stop(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(30)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def section(self, query: str) -> str:
        """The driver's output while ``query`` ran."""
        text = self.output()
        start = text.find(f"kwatermark-test: query {query} starts")
        end = text.find(f"kwatermark-test: query {query} ended")
        assert start >= 0, text[-3000:]
        return text[start:] if end < 0 else text[start:end]

    def failure(self, cluster: StandaloneCluster) -> str:
        return f"{_tail(self.log, 6000)}\n{cluster.log_tails()}"

    def batches(self, query: str) -> dict[int, list[list]]:
        return {int(p.stem.split("-")[1]): json.loads(p.read_text())
                for p in (self.out / query).glob("batch-*.json")}


def rows(frame) -> list[list]:
    """partition, offset, value, event time and watermark (epoch ms) of every row, sorted."""
    def ms(t):
        return None if t is None else round(t.timestamp() * 1000)

    collected = frame.select("partition", "offset", "value", "event_time", "watermark"
                             ).collect()
    return sorted([r["partition"], r["offset"], r["value"].decode(), ms(r["event_time"]),
                   ms(r["watermark"])] for r in collected)


def durations(query) -> list[dict]:
    """Each batch's ``durationMs`` (addBatch, triggerExecution, ...) from Spark's progress."""
    return [dict(p["durationMs"]) for p in query.recentProgress]


def _write(path: str, payload) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(payload, f)
    os.replace(path + ".tmp", path)


def _run(spark, spec: dict, query_spec: dict) -> None:
    out = os.path.join(spec["out"], query_spec["name"])
    pause = query_spec.get("pause_before_batch")

    def sink(frame, batch_id: int) -> None:
        if batch_id == pause:
            _write(os.path.join(out, f"paused-{batch_id}"), True)
            deadline = time.monotonic() + 120
            while not os.path.exists(os.path.join(out, "resume")):
                if time.monotonic() > deadline:
                    raise RuntimeError("the test never resumed the query")
                time.sleep(0.05)
        _write(os.path.join(out, f"batch-{batch_id}.json"),
               [[frame.count()]] if query_spec.get("count_only") else rows(frame))

    reader = spark.readStream.format("kwatermark")
    for key, value in query_spec["options"].items():
        reader = reader.option(key, value)
    print(f"kwatermark-test: query {query_spec['name']} starts", flush=True)
    started = time.time()
    query = (reader.load().writeStream.foreachBatch(sink)
             .option("checkpointLocation",
                     os.path.join(spec["checkpoints"], query_spec["name"]))
             .trigger(availableNow=True).start())
    failed = None
    try:
        query.awaitTermination()
    except Exception as exc:  # noqa: BLE001 - reported to the test in done.json
        failed = exc
    print(f"kwatermark-test: query {query_spec['name']} ended after "
          f"{time.time() - started:.1f} s", flush=True)
    _write(os.path.join(out, "done.json"), {
        "error": None if failed is None else f"{type(failed).__name__}: {failed}",
        "seconds": time.time() - started, "durations": durations(query)})


def main(spec_path: str) -> None:
    launched = time.time()
    with open(spec_path) as f:
        spec = json.load(f)

    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(spec["master"]).appName("kwatermark-cluster-test")
             .config("spark.executor.cores", "1")
             .config("spark.cores.max", "2")
             .config("spark.executor.memory", "512m")
             .config("spark.driver.memory", "512m")
             .config("spark.driver.extraJavaOptions", TEST_JVM_OPTIONS)
             .config("spark.executor.extraJavaOptions", TEST_JVM_OPTIONS)
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.session.timeZone", "UTC")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    print(f"kwatermark-test: session up after {time.time() - launched:.1f} s", flush=True)
    for query_spec in spec["queries"]:
        _run(spark, spec, query_spec)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])
