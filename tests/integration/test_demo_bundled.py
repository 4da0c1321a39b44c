"""The demo as a new user first runs it: no broker given, so it starts the bundled Tansu
broker itself (the pip-only path), while the rest of the suite runs on Apache Kafka."""

from __future__ import annotations

import os
import re
import subprocess
import sys

DEMO = os.path.join(os.path.dirname(sys.executable), "kwatermark-demo")


def test_the_demo_starts_its_bundled_broker_and_counts_every_record():
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS"}
    run = subprocess.run([DEMO, "--records", "40", "--lag", "20", "--batch", "60"], env=env,
                         check=False, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert re.search(r"^started the bundled Tansu broker on 127\.0\.0\.1:\d+$", run.stdout,
                     re.MULTILINE), run.stdout[:500]
    produced = int(re.search(r"^topic \S+: (\d+) records", run.stdout, re.MULTILINE).group(1))
    assert produced == 3 * 40 + 3
    counted = re.search(r"^kwatermark counted (\d+) of (\d+) records", run.stdout, re.MULTILINE)
    assert counted is not None, run.stdout[-2000:]
    # Every record of a complete window is counted; the windows the last records open stay
    # open, so the total is what the demo's own table says was complete.
    assert counted.group(1) == counted.group(2)
    assert int(counted.group(2)) > 0
