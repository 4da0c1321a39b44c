"""What the measuring children (``dropin_child.py``, ``joins_child.py``, ``windows_child.py``)
share: they run under the baseline interpreter (PySpark 4.2.0 with Spark's own Kafka source,
``tests/support/sparkkafka.py``), start AvailableNow queries and read their progress the same
way (bench/run.py's rule for warm throughput)."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

WORKER_DID_NOT_CONNECT = "Python worker failed to connect back"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def fresh(workspace: str, kind: str) -> str:
    return os.path.join(workspace, f"{kind}-{uuid.uuid4().hex[:8]}")


@dataclass
class Run:
    """A finished AvailableNow run: its progress, wall time, records read and the warm part
    (the batches after the first that read data: their records and triggerExecution)."""

    progress: list
    wall_s: float
    read: int
    warm_records: int
    warm_s: float

    @property
    def warm_records_per_s(self) -> float | None:
        return self.warm_records / self.warm_s if self.warm_s else None

    @property
    def data(self) -> list:
        return [p for p in self.progress if p.numInputRows > 0]


def available_now(writer, label: str, timeout_s: int = 1800) -> Run:
    """Start ``writer`` (a DataStreamWriter, sink and checkpoint set) with
    ``Trigger.AvailableNow``, wait for it, and measure it; a clear error if it fails or does
    not finish in ``timeout_s``."""
    started = time.perf_counter()
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination(timeout_s)
    wall = time.perf_counter() - started
    if query.isActive:
        query.stop()
        raise RuntimeError(f"{label}: the AvailableNow run did not finish in {timeout_s} s")
    if query.exception() is not None:
        raise RuntimeError(f"{label} failed: {query.exception()}")
    progress = list(query.recentProgress)
    data = [p for p in progress if p.numInputRows > 0]
    later = progress[progress.index(data[0]) + 1:] if data else []
    return Run(progress, wall, sum(p.numInputRows for p in progress),
               sum(p.numInputRows for p in later),
               sum(p.durationMs.get("triggerExecution", 0) for p in later) / 1000.0)


def measure_and_reply(spark, reply, session_s: float, load_before: tuple,
                      measure: Callable[[list], None]) -> None:
    """Run ``measure(runs)`` (it appends each run's figures to ``runs``), then reply with what
    was measured, even when it stopped on an error, and stop the session."""
    runs: list[dict] = []
    error = None
    try:
        measure(runs)
    except Exception as exc:  # noqa: BLE001 - what was measured is still reported
        error = f"{type(exc).__name__}: {str(exc)[:2000]}"
        log(f"stopped: {error}")
    reply({"spark_version": spark.version, "session_s": session_s, "runs": runs,
           "error": error, "load_avg_before": load_before, "load_avg_after": os.getloadavg()})
    spark.stop()
