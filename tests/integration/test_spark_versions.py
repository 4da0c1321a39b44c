"""DESIGN §23: kwatermark on every Spark 4.x, not only the default pyspark.

Each older pyspark gets a venv of its own under ~/.cache/kwatermark (pyspark at that version
+ kwatermark editable from this checkout, tests/support/sparkkafka.baseline_python) with
pytest added; the chosen tests of the read path, watermarks, idle policies, admission control,
restarts and one window run there as a pytest subprocess against this session's broker. A
checkpoint crosses versions both ways, and what Spark 4.0 lacks is refused by name.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from tests.support.kafka import Record
from tests.support.sparkkafka import (
    OLDER_PYSPARKS,
    REPO_ROOT,
    baseline_python,
    child_env,
    run_baseline,
)
from tests.support.streams import ev_ms, kwatermark_stream, run_available_now, wm_ms

CHILD = REPO_ROOT / "tests" / "integration" / "spark_versions_child.py"

# One test per feature, chosen to run each once: the read path (batch with offsets JSON,
# a stream from latest), watermarks (DESIGN §2's worked example, state across a restart),
# an idle policy, admission control (watermark first under maxOffsetsPerTrigger; alignment;
# minOffsetsPerTrigger with maxTriggerDelay), a restart without loss or duplicates under a
# read limit, and one window that comes out on a processing-time trigger.
CHOSEN = {
    "test_source.py": ["test_batch_read_with_starting_and_ending_offsets_json",
                       "test_starting_offsets_latest_reads_only_new_records",
                       "test_stop_and_restart_from_checkpoint_no_loss_no_duplicates",
                       "test_min_offsets_per_trigger_waits_until_max_trigger_delay"],
    "test_watermarks.py": ["test_worked_example_of_design_section_2",
                           "test_restart_keeps_every_partitions_state"],
    "test_idle.py": ["test_timeout_and_caught_up_release_a_silent_partition_after_the_timeout"],
    "test_admission.py": [
        "test_backlog_far_ahead_does_not_starve_the_partition_holding_the_watermark",
        "test_alignment_keeps_the_partition_ahead_within_max_drift"],
    "test_windows.py": [
        "test_last_windows_come_out_without_a_further_record_on_a_processing_time_trigger"],
}
SUBSET = [f"tests/integration/{module}::{name}"
          for module, names in CHOSEN.items() for name in names]


def version_python(version: str) -> str:
    """The venv of pyspark ``version`` with kwatermark, and pytest to run the subset."""
    python = baseline_python(version)
    done = subprocess.run([python, "-c", "import pytest, hypothesis"], check=False,
                          capture_output=True)
    if done.returncode != 0:
        subprocess.run([python, "-m", "pip", "install", "-q", "pytest>=8",
                        "hypothesis>=6.100"], check=True, capture_output=True)
    return python


@pytest.mark.parametrize("version", OLDER_PYSPARKS)   # venvs made by .ci/run first
def test_read_watermark_idle_admission_restart_and_window_tests_pass_on(version, broker):
    python = version_python(version)
    env = child_env(python)
    env["KAFKA_BOOTSTRAP_SERVERS"] = broker.bootstrap_servers
    done = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SUBSET],
                          check=False, capture_output=True, text=True, env=env,
                          cwd=str(REPO_ROOT), timeout=900)
    output = done.stdout + done.stderr
    tail = "\n".join(line for line in output.splitlines() if not line.startswith("%"))[-6000:]
    assert done.returncode == 0, tail
    # pyspark's own version in that venv, and every chosen test ran and passed.
    version_seen = subprocess.run([python, "-c", "import pyspark; print(pyspark.__version__)"],
                                  check=True, capture_output=True, text=True).stdout.strip()
    assert version_seen == version
    passed = re.search(r"(\d+) passed", output)
    assert passed and int(passed.group(1)) == len(SUBSET), tail


def records(first: int, count: int) -> list[Record]:
    """Two partitions; partition 1 five seconds behind partition 0 in event time."""
    return [Record(p, 10_000 + (first + i) * 1_000 - 5_000 * p, value=f"{p}:{first + i}".encode())
            for i in range(count) for p in range(2)]


def read_on(version: str, broker, topic: str, checkpoint: str) -> list[list]:
    reply = run_baseline(CHILD, {"mode": "stream", "bootstrap": broker.bootstrap_servers,
                                 "topic": topic, "checkpoint": checkpoint},
                         timeout=600, pyspark_version=version)
    assert reply["pyspark"] == version
    return reply["rows"]


def test_a_checkpoint_written_on_4_1_goes_on_on_the_default_spark_and_back(
        spark, broker, topic_factory, checkpoint):
    """4.1.4 -> default (4.3) -> 4.1.4 on one checkpoint: every record exactly once, and each
    run's first rows carry the watermark the previous run's state gives (monotonous: the
    lower partition's max event time - 1), never null again."""
    version_python("4.1.4")
    writer = topic_factory(2)
    writer.send(records(0, 5))
    first = read_on("4.1.4", broker, writer.topic, checkpoint)
    writer.send(records(5, 5))
    second, _ = run_available_now(kwatermark_stream(spark, broker, writer.topic), checkpoint)
    middle = [[r["partition"], r["offset"], ev_ms(r), wm_ms(r)] for r in second.rows]
    writer.send(records(10, 5))
    third = read_on("4.1.4", broker, writer.topic, checkpoint)

    read = sorted((p, o) for p, o, _, _ in first + middle + third)
    assert read == [(p, o) for p in range(2) for o in range(15)]
    # Partition 1 holds the minimum: after run 1 its max event time is 10 s + 4 s - 5 s.
    assert {wm for *_, wm in middle[:1]} == {10_000 + 4_000 - 5_000 - 1}
    assert all(wm is not None for *_, wm in middle + third)
    assert min(wm for *_, wm in third) >= max(wm for *_, wm in middle)


def test_joins_and_dedup_are_refused_by_name_on_spark_4_0(broker, topic_factory):
    """pyspark 4.0 has transformWithStateInPandas but not transformWithState (4.1), which
    kwatermark.joins and kwatermark.dedup run on: both say so at once."""
    version_python("4.0.5")
    writer = topic_factory(1)
    reply = run_baseline(CHILD, {"mode": "refusals", "bootstrap": broker.bootstrap_servers,
                                 "topic": writer.topic}, timeout=600, pyspark_version="4.0.5")
    assert reply["pyspark"] == "4.0.5"
    for name in ("joins", "dedup"):
        raised = reply["raised"][name]
        assert raised is not None and raised.startswith("JoinError"), raised
        assert f"kwatermark.{name}" in raised and "transformWithState" in raised
        assert "Spark 4.1.0 or later" in raised and "pyspark 4.0.5" in raised


def test_pip_keeps_the_users_pyspark(tmp_path):
    """Installing kwatermark beside pyspark 4.1.4 leaves 4.1.4 in place (pyspark>=4.0,<5):
    pip's resolver with the user's environment, without installing anything."""
    python = version_python("4.1.4")
    report = tmp_path / "report.json"
    subprocess.run([python, "-m", "pip", "install", "--dry-run", "-q", "--report",
                    str(report), str(REPO_ROOT)], check=True, capture_output=True,
                   env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    import json

    installs = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())
                ["install"]}
    assert "kwatermark" in installs
    assert "pyspark" not in installs
