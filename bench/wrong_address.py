"""How a wrong ``kafka.bootstrap.servers`` fails: seconds from the query's start to its error,
and how many lines reach stderr meanwhile (issue 14, DESIGN §3).

    python bench/wrong_address.py [--address 127.0.0.1:1] [--mode batch|stream|both]

Each run is a fresh interpreter (a new SparkSession) so stderr is the query's own; the
SparkSession's start-up lines are counted separately (before the query) and subtracted.
"""

from __future__ import annotations

import argparse
import json
import os
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
    if mode == "batch":
        (spark.read.format("kwatermark").option("kafka.bootstrap.servers", address)
         .option("subscribe", "events").load().collect())
    else:
        query = (spark.readStream.format("kwatermark")
                 .option("kafka.bootstrap.servers", address).option("subscribe", "events")
                 .load().writeStream.format("noop")
                 .option("checkpointLocation", tempfile.mkdtemp()).start())
        query.awaitTermination(600)
        error = str(query.exception())
except Exception as exc:  # noqa: BLE001
    error = str(exc)
elapsed = time.monotonic() - started
sys.stderr.write("=== QUERY ENDS ===\n"); sys.stderr.flush()
import json
print("RESULT " + json.dumps({"seconds": round(elapsed, 1),
                              "names_address": address in error,
                              "error": error.splitlines()[0][:300] if error else ""}))
"""


def run(mode: str, address: str) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(CHILD)
    done = subprocess.run([sys.executable, f.name, mode, address], check=False,
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
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", default="127.0.0.1:1")
    parser.add_argument("--mode", default="both", choices=("batch", "stream", "both"))
    args = parser.parse_args()
    for mode in (("batch", "stream") if args.mode == "both" else (args.mode,)):
        print(json.dumps(run(mode, args.address)), flush=True)


if __name__ == "__main__":
    main()
