"""Issue 23: Spark Connect is a supported client (DESIGN §15). A Connect session and the
tests' classic session cannot share a process, so the job runs in a child process
(tests/support/connect_job.py): one child, one local Connect server, three queries."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.support.kafka import Record

T0 = 1_700_000_000_000   # a multiple of the 10 s windows
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_batch_stream_and_windows_through_spark_connect(broker, topic_factory, tmp_path):
    writer = topic_factory(2)
    # Ten records 3 s apart, alternating partitions: offsets 0-4 in each.
    writer.send([Record(i % 2, T0 + 3_000 * i, value=b"x") for i in range(10)])
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, TZ="UTC")
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.connect_job", broker.bootstrap_servers,
         writer.topic, str(tmp_path)], capture_output=True, text=True, cwd=ROOT, env=env,
        timeout=600, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    got = json.loads(lines[-1][len("RESULT "):])
    every = [[p, o] for p in (0, 1) for o in range(5)]
    assert got["batch"] == every
    assert got["stream"] == every
    # Event times 0, 3, ..., 27 s: [0, 10) holds 4 records, [10, 20) 3. The last record
    # (27 s) leaves the watermark at 26.999 s, so [20, 30) is not final yet.
    assert got["windows"] == [[T0, 4, "final"], [T0 + 10_000, 3, "final"]]
