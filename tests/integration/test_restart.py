"""Issue 7: the query *process* killed mid-batch and between batches, then restarted from its
checkpoint. The query runs in a child process (tests/support/killable_query.py) that is
SIGKILLed with its JVM and Python workers, as a crashed driver would be."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.kafka import Record
from tests.support.streams import lagging_three_partitions

BOUND_MS = 2_000
PARTITIONS = 3
PER_PARTITION = 30


def data() -> list[Record]:
    return lagging_three_partitions(PER_PARTITION)


def partition_wm(timestamps: list[int]) -> int | None:
    """DESIGN §2, bounded out-of-orderness: max event time - B - 1; null before a record."""
    return max(timestamps) - BOUND_MS - 1 if timestamps else None


def expected_watermarks(batches: list[list[list]], timestamps: dict[int, list[int]]) -> list:
    """What DESIGN §2 gives for the batches actually run: each row sees its own partition up
    to the record before it and every other partition as far as the earlier batches read it;
    null while any partition is undefined. (Policy none, one task per partition.)"""
    read = {p: 0 for p in timestamps}
    expected = []
    for rows in batches:
        at_start = {p: partition_wm(ts[:read[p]]) for p, ts in timestamps.items()}
        for partition, offset, *_ in rows:
            marks = [partition_wm(timestamps[partition][:offset])] + [
                at_start[q] for q in timestamps if q != partition]
            expected.append(None if None in marks else min(marks))
        for partition, offset, *_ in rows:
            read[partition] = max(read[partition], offset + 1)
    return expected


class KillableQuery:
    """Starts tests/support/killable_query.py in a process group of its own."""

    def __init__(self, tmp_path: Path, broker, topic: str):
        self.tmp = tmp_path
        self.out = tmp_path / "out"
        self.out.mkdir()
        self.checkpoint = tmp_path / "checkpoint"
        self.options = {"kafka.bootstrap.servers": broker.bootstrap_servers,
                        "subscribe": topic, "startingOffsets": "earliest",
                        "maxOffsetsPerTrigger": "15", "watermark.strategy": "bounded",
                        "watermark.maxOutOfOrderness": f"{BOUND_MS} ms",
                        "watermark.stateLocation": str(tmp_path / "ledger")}
        self.runs = 0

    def start(self, trigger: str, kill_in_batch: int | None = None,
              windows: str | None = None, **operator) -> subprocess.Popen:
        """``operator``: ``join={...}`` or ``dedup={...}`` (tests/support/killable_query.py)."""
        self.runs += 1
        spec = self.tmp / f"spec-{self.runs}.json"
        spec.write_text(json.dumps({"out": str(self.out), "checkpoint": str(self.checkpoint),
                                    "options": self.options, "trigger": trigger,
                                    "kill_in_batch": kill_in_batch,
                                    "windows": windows, **operator}))
        self.log = self.tmp / f"run-{self.runs}.log"
        root = Path(__file__).resolve().parents[2]
        env = dict(os.environ, TZ="UTC", PYSPARK_PYTHON=sys.executable,
                   PYSPARK_DRIVER_PYTHON=sys.executable)
        with open(self.log, "w") as log:
            return subprocess.Popen([sys.executable, "-m", "tests.support.killable_query",
                                     str(spec)], cwd=root, env=env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)

    def wait(self, process: subprocess.Popen, timeout_s: float = 240) -> int:
        try:
            return process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            raise AssertionError(f"run {self.runs} hung:\n{self.log.read_text()[-3000:]}")

    def kill_after_commit(self, process: subprocess.Popen, batch_id: int,
                          timeout_s: float = 240) -> None:
        commit = self.checkpoint / "commits" / str(batch_id)
        deadline = time.monotonic() + timeout_s
        while not commit.exists():
            assert process.poll() is None, self.log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"batch {batch_id} never committed"
            time.sleep(0.02)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)

    def batch(self, batch_id: int, kind: str = "batch") -> list[list]:
        return json.loads((self.out / f"{kind}-{batch_id}.json").read_text())


def test_query_process_killed_mid_batch_and_between_batches_then_restarted(
        broker, topic_factory, tmp_path):
    writer = topic_factory(PARTITIONS)
    records = data()
    writer.send(records)
    timestamps = {p: [r.timestamp for r in records if r.partition == p]
                  for p in range(PARTITIONS)}
    query = KillableQuery(tmp_path, broker, writer.topic)

    # Run 1 dies inside batch 1: planned (offset log written), rows computed, not committed.
    first = query.start("2 seconds", kill_in_batch=1)
    assert query.wait(first) == -signal.SIGKILL, query.log.read_text()[-3000:]
    assert (query.checkpoint / "offsets" / "1").exists()
    assert not (query.checkpoint / "commits" / "1").exists()

    # Run 2 replays batch 1 and is killed between batches, after batch 3's commit.
    second = query.start("3 seconds")
    query.kill_after_commit(second, 3)
    assert not (query.checkpoint / "offsets" / "4").exists()  # killed before planning 4

    # Run 3 finishes the backlog.
    third = query.start("availableNow")
    assert query.wait(third) == 0, query.log.read_text()[-3000:]

    ids = sorted(int(p.stem.split("-")[1]) for p in query.out.glob("batch-*.json"))
    assert ids == list(range(len(ids))) and len(ids) == 6   # 90 records, 15 per batch
    batches = [query.batch(i) for i in ids]
    # The batch that was planned but not committed is replayed with identical rows.
    assert query.batch(1) == query.batch(1, "attempt")
    # Every record exactly once.
    read = sorted((p, o, v) for rows in batches for p, o, v, _, _ in rows)
    produced = sorted((p, o, f"{p}:{o}") for p in range(PARTITIONS)
                      for o in range(PER_PARTITION))
    assert read == produced
    # Every partition's state continued where it stopped: each row's watermark is DESIGN
    # §2's for the batches actually run.
    assert [wm for rows in batches for *_, wm in rows] == expected_watermarks(batches,
                                                                             timestamps)
    assert batches[-1][-1][-1] is not None   # the watermark did advance


def test_a_checkpoint_of_offset_layout_1_restores_and_continues_exactly(
        spark, broker, topic_factory, tmp_path):
    """Issue 36: a query whose checkpoint kwatermark 0.1 wrote (offset layout 1) goes on
    under layout 2: every record once, every partition's watermark state continued."""
    from tests.support.layout_one_offsets import rewrite_checkpoint
    from tests.support.streams import Batches, kwatermark_stream, run_available_now, wm_ms

    writer = topic_factory(PARTITIONS)
    records = lagging_three_partitions(20)
    writer.send(records[:30])                     # ten records per partition
    checkpoint = tmp_path / "checkpoint"
    options = {"maxOffsetsPerTrigger": 12, "watermark.strategy": "bounded",
               "watermark.maxOutOfOrderness": f"{BOUND_MS} ms",
               "watermark.stateLocation": str(tmp_path / "ledger")}
    before, _ = run_available_now(kwatermark_stream(spark, broker, writer.topic, **options),
                                  str(checkpoint))
    written = rewrite_checkpoint(checkpoint)
    assert written == len(before.by_id) >= 3
    last = max(int(p.name) for p in (checkpoint / "offsets").iterdir() if p.name.isdigit())
    logged = (checkpoint / "offsets" / str(last)).read_text().splitlines()[2]
    assert json.loads(logged)["v"] == 1 and "partitions" in json.loads(logged)

    writer.send(records[30:])
    after, query = run_available_now(kwatermark_stream(spark, broker, writer.topic, **options),
                                     str(checkpoint), Batches())
    assert min(after.by_id) == last + 1
    assert "@kwatermark" in json.loads(query.lastProgress["sources"][0]["endOffset"])

    batches = [[[r["partition"], r["offset"], r["value"].decode(), wm_ms(r)] for r in rows]
               for rows in before.batches() + after.batches()]
    read = sorted((p, o, v) for rows in batches for p, o, v, _ in rows)
    assert read == sorted((p, o, f"{p}:{o}") for p in range(PARTITIONS) for o in range(20))
    timestamps = {p: [r.timestamp for r in records if r.partition == p]
                  for p in range(PARTITIONS)}
    # Each row's watermark is DESIGN §2's for the batches run, so no partition restarted
    # from an undefined watermark: the first rows after the restart are not null.
    assert [wm for rows in batches for *_, wm in rows] == expected_watermarks(
        [[row[:2] for row in rows] for rows in batches], timestamps)
    assert batches[len(before.by_id)][0][-1] is not None
