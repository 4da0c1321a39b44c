"""How a wrong ``kafka.bootstrap.servers`` fails: seconds from the query's start to its error,
and how many lines reach stderr meanwhile (issue 14, DESIGN §3).

    python bench/wrong_address.py [--address 127.0.0.1:1] [--mode batch|stream|both]

Each run is a fresh interpreter (a new SparkSession) so stderr is the query's own; only
lines between the query's start and its end are counted. The same run also times the same
query against a reachable local broker (an empty topic, read to its end) as the baseline:
what Spark itself takes on this machine, now. ``wrong - reachable`` is what the failing
requests cost. Runs alternate (wrong, reachable, reachable, wrong, ...); medians are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import os, sys, time, tempfile
os.environ["PYSPARK_PYTHON"] = sys.executable
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
mode, address = sys.argv[1], sys.argv[2]
sys.stderr.write("=== QUERY STARTS ===\n"); sys.stderr.flush()
started = time.monotonic()
error = ""
try:
    topic = sys.argv[3]
    if mode == "batch":
        (spark.read.format("kwatermark").option("kafka.bootstrap.servers", address)
         .option("subscribe", topic).load().collect())
    else:
        query = (spark.readStream.format("kwatermark")
                 .option("kafka.bootstrap.servers", address).option("subscribe", topic)
                 .load().writeStream.format("noop").trigger(availableNow=True)
                 .option("checkpointLocation", tempfile.mkdtemp()).start())
        query.awaitTermination(600)
        error = str(query.exception() or "")
except Exception as exc:  # noqa: BLE001
    error = str(exc)
elapsed = time.monotonic() - started
sys.stderr.write("=== QUERY ENDS ===\n"); sys.stderr.flush()
import json
print("RESULT " + json.dumps({"seconds": round(elapsed, 1),
                              "names_address": address in error,
                              "error": error.splitlines()[0][:300] if error else ""}))
"""


def run(mode: str, address: str, topic: str = "events") -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(CHILD)
    done = subprocess.run([sys.executable, f.name, mode, address, topic], check=False,
                          capture_output=True,
                          text=True, timeout=900, env=dict(os.environ))
    os.unlink(f.name)
    result = next((json.loads(line[7:]) for line in done.stdout.splitlines()
                   if line.startswith("RESULT ")), {"error": done.stderr[-2000:]})
    lines = done.stderr.splitlines()
    try:
        begin, end = lines.index("=== QUERY STARTS ==="), lines.index("=== QUERY ENDS ===")
        during = lines[begin + 1:end]
    except ValueError:
        during = lines
    result["stderr_lines"] = len(during)
    result["librdkafka_lines"] = sum("Connect to" in line or "rdkafka" in line.lower()
                                     for line in during)
    result["mode"] = mode
    result["stderr_sample"] = [line[:160] for line in during[:3]]
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", default="127.0.0.1:1")
    parser.add_argument("--mode", default="both", choices=("batch", "stream", "both"))
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    from confluent_kafka.admin import AdminClient, NewTopic

    from kwatermark.localbroker import LocalBroker

    with LocalBroker.start() as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        admin.create_topics([NewTopic("empty", 1, 1)])["empty"].result(30)
        for mode in (("batch", "stream") if args.mode == "both" else (args.mode,)):
            wrong, reachable = [], []
            for i in range(args.repeats):
                order = ("wrong", "reachable") if i % 2 == 0 else ("reachable", "wrong")
                for which in order:
                    if which == "wrong":
                        wrong.append(run(mode, args.address))
                        print(json.dumps(wrong[-1]), flush=True)
                    else:
                        reachable.append(run(mode, broker.bootstrap_servers, "empty"))
                        print(json.dumps(reachable[-1]), flush=True)
            w = statistics.median(r["seconds"] for r in wrong)
            ok = statistics.median(r["seconds"] for r in reachable)
            lines = statistics.median(r["stderr_lines"] for r in wrong)
            print(f"{mode}: wrong address fails after {w:.1f} s (median of {len(wrong)}); "
                  f"the same query against a reachable broker takes {ok:.1f} s; difference "
                  f"{w - ok:.1f} s; {lines:.0f} stderr lines while failing", flush=True)


if __name__ == "__main__":
    main()
