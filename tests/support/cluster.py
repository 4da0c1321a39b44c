"""A Spark standalone cluster on loopback, and a kwatermark query driven against it.

``StandaloneCluster`` starts a master and workers from the pip-installed pyspark
(``$SPARK_HOME/bin/spark-class``). Each worker runs in a private mount namespace where a
fresh tmpfs hides ``hidden_dir`` (the driver's default progress location), and with a temp
directory of its own, so its executors do not share the driver's temp directory, as on a
real cluster. Every daemon runs in a process group of its own (its executors and their
Python workers included), killed by ``stop()``; logs stay in ``root`` for failure messages.

``python -m tests.support.cluster SPEC.json`` is the driver: it connects to the spec's
master, runs the stream and writes every micro-batch to ``<out>/batch-<id>.json``
(batch-id keyed: a replayed batch overwrites its earlier attempt). ``pause_before_batch`` =
K makes batch K's sink write ``<out>/paused-K`` and wait for ``<out>/resume`` before it
reads its rows, so a test can act between batches. The query's exception, if any, goes to
``<out>/error.txt``; the duration of every batch to ``<out>/progress.json``.
"""

from __future__ import annotations

import glob
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


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
                   SPARK_DAEMON_MEMORY="256m", PYSPARK_PYTHON=sys.executable)
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

    def start(self, timeout_s: float = 90) -> StandaloneCluster:
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
        deadline = time.monotonic() + timeout_s
        while self.alive_workers() < self.workers:
            for process in self.processes:
                if process.poll() is not None:
                    raise AssertionError(f"a cluster daemon exited:\n{self.log_tails()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"the workers never registered:\n{self.log_tails()}")
            time.sleep(0.5)
        return self

    def alive_workers(self) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json", timeout=2) as r:
                state = json.load(r)
        except OSError:
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


class ClusterQuery:
    """Runs ``python -m tests.support.cluster`` as the driver, in a process group of its own."""

    def __init__(self, root: Path, master: str, options: dict):
        self.root = root
        self.master = master
        self.options = options
        self.out = root / "out"
        self.out.mkdir(parents=True)
        self.log = root / "driver.log"

    def start(self, pause_before_batch: int | None = None) -> subprocess.Popen:
        spec = self.root / "spec.json"
        spec.write_text(json.dumps({"master": self.master, "out": str(self.out),
                                    "checkpoint": str(self.root / "checkpoint"),
                                    "options": self.options,
                                    "pause_before_batch": pause_before_batch}))
        repo = Path(__file__).resolve().parents[2]
        env = dict(os.environ, TZ="UTC", PYSPARK_PYTHON=sys.executable,
                   PYSPARK_DRIVER_PYTHON=sys.executable)
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.support.cluster", str(spec)], cwd=repo,
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        return self.process

    def wait_for(self, path: Path, timeout_s: float, cluster: StandaloneCluster) -> None:
        deadline = time.monotonic() + timeout_s
        while not path.exists():
            if self.process.poll() is not None:
                raise AssertionError(f"the driver exited ({self.process.returncode}) before "
                                     f"{path.name}:\n{self.failure(cluster)}")
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"no {path.name} in {timeout_s} s:\n"
                                     f"{self.failure(cluster)}")
            time.sleep(0.1)

    def wait(self, cluster: StandaloneCluster, timeout_s: float = 120) -> int:
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the driver hung:\n{self.failure(cluster)}") from None

    def kill(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(30)

    def driver_output(self) -> str:
        return self.log.read_text(errors="replace")

    def failure(self, cluster: StandaloneCluster) -> str:
        return f"{_tail(self.log, 6000)}\n{cluster.log_tails()}"

    def batches(self) -> dict[int, list[list]]:
        return {int(p.stem.split("-")[1]): json.loads(p.read_text())
                for p in self.out.glob("batch-*.json")}

    def error(self) -> str | None:
        path = self.out / "error.txt"
        return path.read_text() if path.exists() else None


def rows(frame) -> list[list]:
    """partition, offset, value, event time and watermark (epoch ms) of every row, sorted."""
    def ms(t):
        return None if t is None else round(t.timestamp() * 1000)

    collected = frame.select("partition", "offset", "value", "event_time", "watermark"
                             ).collect()
    return sorted([r["partition"], r["offset"], r["value"].decode(), ms(r["event_time"]),
                   ms(r["watermark"])] for r in collected)


def _write(path: str, payload) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(payload, f)
    os.replace(path + ".tmp", path)


def main(spec_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    out = spec["out"]
    pause = spec.get("pause_before_batch")

    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(spec["master"]).appName("kwatermark-cluster-test")
             .config("spark.executor.cores", "1")
             .config("spark.cores.max", "2")
             .config("spark.executor.memory", "512m")
             .config("spark.driver.memory", "512m")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.session.timeZone", "UTC")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")

    def sink(frame, batch_id: int) -> None:
        if batch_id == pause:
            _write(os.path.join(out, f"paused-{batch_id}"), True)
            deadline = time.monotonic() + 120
            while not os.path.exists(os.path.join(out, "resume")):
                if time.monotonic() > deadline:
                    raise RuntimeError("the test never resumed the query")
                time.sleep(0.05)
        _write(os.path.join(out, f"batch-{batch_id}.json"), rows(frame))

    reader = spark.readStream.format("kwatermark")
    for key, value in spec["options"].items():
        reader = reader.option(key, value)
    query = (reader.load().writeStream.foreachBatch(sink)
             .option("checkpointLocation", spec["checkpoint"])
             .trigger(availableNow=True).start())
    failed = None
    try:
        query.awaitTermination()
    except Exception as exc:  # noqa: BLE001 - reported to the test through error.txt
        failed = exc
    failed = failed or query.exception()
    _write(os.path.join(out, "progress.json"),
           [{"batchId": p["batchId"], "durationMs": p["durationMs"]}
            for p in query.recentProgress])
    if failed is not None:
        with open(os.path.join(out, "error.txt"), "w") as f:
            f.write(f"{type(failed).__name__}: {failed}")
        spark.stop()
        raise SystemExit(3)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])
