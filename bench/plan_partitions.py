"""The driver's planning per micro-batch at many partitions, without a broker (issue 36).

    .venv/bin/python bench/plan_partitions.py [--partitions 4,512,4096] [--batches 16]
        [--topics 16]

Each partition count runs a stream through the source's own driver calls, as Spark makes
them: ``latestOffset(start, ReadMaxRows(--per-batch))`` then ``partitions(start, end)``,
every offset through its JSON, then each pack's progress file published as its task would
(``ledger.publish_pack`` under the key the driver handed it) and ``commit``. The broker's
answers are faked (every partition has a backlog, so the read limit binds each batch), so
what is timed is the driver's own Python work: folding the last batch's progress file, the
read limit, the per-partition state of the next offset and its JSON. The counts run in
rotated order each round. Printed: the median wall and CPU ms of ``latestOffset`` and
``partitions`` over every batch after a run's first two, and each count's ratio to the
first count. ``--topics N`` spreads each count's partitions over N topics (``t00``, ``t01``,
...), subscribed by pattern as a ``subscribePattern`` job would be.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.streaming.datasource import ReadMaxRows

from kwatermark import source
from kwatermark.arrow import OutputLayout
from kwatermark.ledger import ProgressRecord, record_columns
from tests.unit.test_progress_model import FakeBroker

SKIPPED = 2   # a run's first plannings warm caches


def planning(partitions: int, batches: int, per_batch: int, topics: int = 1) -> dict:
    if topics == 1:
        tps, subscription = [("events", p) for p in range(partitions)], {"subscribe": "events"}
    else:
        tps = [(f"t{t:02d}", p) for t in range(topics) for p in range(partitions // topics)]
        subscription = {"subscribePattern": "t[0-9]+"}
    with tempfile.TemporaryDirectory(prefix="kw-plan-") as ledger:
        reader = source.KWatermarkDataSource({
            "kafka.bootstrap.servers": "fake:9092", **subscription,
            "startingOffsets": "earliest", "maxOffsetsPerTrigger": str(per_batch),
            "watermark.strategy": "bounded", "watermark.maxOutOfOrderness": "5 seconds",
            "watermark.stateLocation": ledger,
        }).streamReader(from_arrow_schema(OutputLayout().schema()))
        broker = FakeBroker(tps)
        reader.planner.metadata = broker
        backlog = per_batch * (batches + 1) // partitions + 2
        for tp in tps:
            broker.ends[tp] = backlog
        start = reader.initialOffset()
        latest, parts, cpu = [], [], []
        for batch in range(batches):
            started, cpu_started = time.perf_counter(), time.process_time()
            end = _as_logged(reader.latestOffset(_as_logged(start), ReadMaxRows(per_batch)))
            planned = time.perf_counter()
            cpu.append((time.process_time() - cpu_started) * 1000)
            splits = reader.partitions(_as_logged(start), end)
            latest.append((planned - started) * 1000)
            parts.append((time.perf_counter() - planned) * 1000)
            for split in splits:   # each task's progress file, as source._read offers it
                records = [ProgressRecord({"max_ts": 1_000 * batch + t.partition},
                                          t.end - t.start, 1_000 * batch,
                                          1_000 * batch + t.partition, 1_000 * batch - 5_001)
                           for t in split.tasks]
                # (kwatermark before pack_keys had no ledger_key, and before the ranges'
                # columns offered a pack as its tasks and records: A/B against old code)
                key = getattr(split, "ledger_key", None)
                columns = getattr(split, "columns", None)
                pack, offered = ((split.tasks, records) if columns is None
                                 else (columns, record_columns(records)))
                reader.planner.ledger.offer_pack(pack, reader.planner.fingerprint,
                                                 offered, *([key] if key else []))
            reader.commit(end)
            start = end
    return {"latestOffset": latest[SKIPPED:], "cpu": cpu[SKIPPED:],
            "partitions": parts[SKIPPED:], "tasks": len(splits)}


def _as_logged(offset: dict) -> dict:
    """What Spark hands back: the offset through its JSON."""
    return json.loads(json.dumps(offset))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", default="4,512,4096")
    parser.add_argument("--per-batch", type=int, default=8192, help="maxOffsetsPerTrigger")
    parser.add_argument("--batches", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--topics", type=int, default=1,
                        help="spread each count's partitions over this many topics")
    args = parser.parse_args()
    counts = [int(n) for n in args.partitions.split(",")]
    samples: dict[int, dict[str, list[float]]] = {
        n: {"latestOffset": [], "cpu": [], "partitions": []} for n in counts}
    for round_ in range(args.rounds):
        for n in counts[round_ % len(counts):] + counts[:round_ % len(counts)]:
            got = planning(n, args.batches, args.per_batch, args.topics)
            for key in samples[n]:
                samples[n][key] += got[key]
    print(f"driver planning per micro-batch of {args.per_batch:,} records, "
          f"{args.topics} topic(s), no broker "
          f"(median of {args.rounds} x {args.batches - SKIPPED} batches, ms)")
    print(f"{'partitions':>10} {'latestOffset':>13} {'cpu':>7} {'partitions()':>13} "
          f"{'x first':>8}")
    base = None
    for n in counts:
        got = {k: statistics.median(v) for k, v in samples[n].items()}
        base = base or got["latestOffset"]
        print(f"{n:>10} {got['latestOffset']:>13.1f} {got['cpu']:>7.1f} "
              f"{got['partitions']:>13.1f} {got['latestOffset'] / base:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
