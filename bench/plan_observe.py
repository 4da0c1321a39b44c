"""Driver planning time per micro-batch with the DESIGN §13 options, many partitions.

    .venv/bin/python bench/plan_observe.py [--partitions 512] [--rounds 5]

No broker: the broker's answers are faked (every partition gains one record per batch) and
progress records are published as tasks would, so what is timed is the driver's own work
(`latest_offset` + `tasks`: folding, idle decisions, combination, lags, offset JSON).
Configurations run in rotated order each round; printed: the median per configuration and
its ratio to `min` (the default) measured in the same run.
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

from kwatermark.arrow import OutputLayout
from kwatermark.ledger import ProgressRecord
from kwatermark.offsets import BatchOffset
from kwatermark.options import parse_options
from kwatermark.planner import BatchPlanner, ReadLimits
from kwatermark.reader import Decoders
from tests.unit.test_progress_model import FakeBroker

CONFIGS = {
    "min (default)": {},
    "percentile 50": {"watermark.combine": "percentile", "watermark.percentile": "50"},
    "percentile 99.5": {"watermark.combine": "percentile", "watermark.percentile": "99.5"},
    "timelag": {"watermark.strategy": "timelag", "watermark.maxTimeLag": "30 seconds"},
}


def planning_ms(partitions: int, batches: int, extra: dict) -> list[float]:
    tps = [("events", p) for p in range(partitions)]
    options = parse_options({
        "kafka.bootstrap.servers": "fake:9092", "startingOffsets": "earliest",
        "assign": json.dumps({"events": list(range(partitions))}),
        "watermark.stateLocation": tempfile.mkdtemp(prefix="kw-plan-"), **extra})
    planner = BatchPlanner(options, OutputLayout(), Decoders())
    broker = FakeBroker(tps)
    planner.metadata = broker
    offset, times = planner.initial_offset(), []
    for batch in range(batches):
        for tp in tps:
            broker.ends[tp] += 1
        started = time.perf_counter()
        # As Spark hands it back: through the offset log's JSON.
        end = planner.latest_offset(BatchOffset.from_json(offset.dumps()), ReadLimits())
        tasks = planner.tasks(end)
        times.append((time.perf_counter() - started) * 1000)
        for task in tasks:   # what each task would publish
            snapshot = dict(task.state.generator or {})
            if "planned" not in snapshot:
                snapshot = {"max_ts": 1_000 * batch + task.partition}
            planner.ledger.publish(task, planner.fingerprint, ProgressRecord(
                snapshot, 1, 1_000 * batch, 1_000 * batch, None))
        offset = end
    return times[2:]    # the first plannings warm caches


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=512)
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    names = list(CONFIGS)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(args.rounds):
        order = names[round_ % len(names):] + names[:round_ % len(names)]
        for name in order:
            samples[name] += planning_ms(args.partitions, args.batches, CONFIGS[name])
    base = statistics.median(samples[names[0]])
    print(f"driver planning per micro-batch, {args.partitions} partitions "
          f"(median of {len(samples[names[0]])})")
    for name in names:
        median = statistics.median(samples[name])
        print(f"  {name:<16} {median:8.1f} ms   x{median / base:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
