"""Print an ASCII timeline of the four built-in idle policies on one real run.

    .venv/bin/python bench/idle_timeline.py [--bootstrap-servers HOST:PORT]
                                            [--plot docs/idle-timeline.png]

Scenario (two partitions): both speak at first; then partition 1 falls silent while
partition 0 keeps producing, one micro-batch every ~1.5 s; idle.timeout = 1 second,
idle.maxDelay = 20 seconds for `advance`. Output: the watermark each batch's rows carry, per
policy, as event-time offsets from the scenario start; with --plot, the same as a PNG. Used
for docs/idle-policies.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.support.kafka import Record, TestBroker, TopicWriter
from tests.support.streams import Batches, kwatermark_stream, run_available_now, wm_ms

POLICIES = ("none", "timeout", "caught-up", "advance")


def session_and_broker(bootstrap_servers: str | None):
    """A local[2] SparkSession in UTC, the broker at ``bootstrap_servers`` or a local Tansu
    started here, and that local broker (None for an external one; the caller stops it)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    local = None
    if bootstrap_servers:
        broker = TestBroker(bootstrap_servers, "external")
    else:
        from kwatermark.localbroker import LocalBroker

        local = LocalBroker.start()
        broker = TestBroker(local.bootstrap_servers, "tansu")
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark, broker, local


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers")
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--plot", metavar="FILE.png", help="also draw the timeline")
    parser.add_argument("--step-seconds", type=int, default=60,
                        help="event time between partition 0's records (default 60: well "
                             "ahead of processing time, so advance's clock is visible)")
    args = parser.parse_args()
    spark, broker, local = session_and_broker(args.bootstrap_servers)
    marks: dict[str, list] = {}
    for policy in POLICIES:
        start = int(time.time() * 1000) - 30_000  # event times from 30 s ago
        writer = TopicWriter(broker, broker.create_topic(2))
        frame = kwatermark_stream(spark, broker, writer.topic, **{
            "idle.policy": policy, "idle.timeout": "1 second", "idle.maxDelay": "20 seconds"})
        checkpoint = tempfile.mkdtemp(prefix="kw-timeline-")
        seen = Batches()
        for n in range(args.batches):
            step = [Record(0, start + n * args.step_seconds * 1_000)]
            if n == 0:
                step.append(Record(1, start + 2_000))
            else:
                time.sleep(1.5)
            writer.send(step)
            run_available_now(frame, checkpoint, seen)
        marks[policy] = [(wm_ms(rows[0]), start) for rows in seen.batches()]
    spark.stop()
    if local:
        local.stop()

    def cell(value, base):
        return "null" if value is None else f"{(value - base) / 1000:+.3f} s"

    step = args.step_seconds
    print(f"partition 0 event times: +0 s, +{step} s, +{2 * step} s, ... (one record per batch)")
    print("partition 1: one record at +2 s in batch 0, then silent\n")
    print("batch | " + " | ".join(f"{p:>12}" for p in POLICIES))
    print("----- | " + " | ".join("-" * 12 for _ in POLICIES))
    for n in range(args.batches):
        print(f"{n:>5} | " + " | ".join(f"{cell(*marks[p][n]):>12}" for p in POLICIES))
    print("\n(advance: once silent, partition 1's watermark follows processing time minus"
          "\n 20 s, which rises slower than partition 0's event times here)")
    print("(rows carry the watermark before them: partition 0's record of batch n shows in"
          "\n batch n + 1)")
    if args.plot:
        plot(marks, args.batches, args.step_seconds, args.plot)
        print(f"\nplot: {args.plot}")
    return 0


def plot(marks: dict[str, list], batches: int, step: int, path: str) -> None:
    """Each policy's watermark per batch, beside the two partitions' event times."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    x = list(range(batches))
    ax.plot(x, [n * step for n in x], color="lightgrey", linewidth=8, solid_capstyle="round",
            label="event time of partition 0's record in the batch", zorder=1)
    ax.scatter([0], [2], s=120, color="darkgrey", marker="s", zorder=2,
               label="partition 1's only record (then silent)")
    styles = {"none": ("tab:red", "o", 0.0), "timeout": ("tab:blue", "s", 0.0),
              "caught-up": ("tab:green", "^", 0.0), "advance": ("tab:purple", "D", 0.0)}
    for policy in POLICIES:
        colour, marker, _ = styles[policy]
        values = [None if v is None else (v - base) / 1000 for v, base in marks[policy]]
        ax.plot(x, [float("nan") if v is None else v for v in values], marker=marker,
                color=colour, linewidth=2.2 if policy != "caught-up" else 1.2,
                linestyle="-" if policy != "caught-up" else "--", markersize=7,
                label=f"idle.policy={policy}", zorder=3)
    ax.set_xlabel("micro-batch (1.5 s of silence before each; idle.timeout = 1 s, idle.maxDelay = 20 s)")
    ax.set_ylabel("watermark on the batch's rows\n(s of event time after the first record)")
    ax.set_xticks(x)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize=9)
    ax.set_title("Idle policies on one real run: partition 1 falls silent after batch 0",
                 loc="left")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
