"""``kwatermark-broker`` and ``LocalBroker`` as a user runs them (DESIGN §17): one stdout line
once a client can create a topic, a clean stop on SIGTERM, and no broker outliving the Python
process that started it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

BROKER = os.path.join(os.path.dirname(sys.executable), "kwatermark-broker")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) is not a running broker.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(") ", 1)[1][0] != "Z"


def _wait_gone(pid: int, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.2)
    return False


def _round_trip(bootstrap: str) -> list[bytes]:
    """Create a topic, write two records, read them back with a plain consumer."""
    topic = f"probe-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": bootstrap})
    for value in (b"a", b"b"):
        producer.produce(topic, value)
    producer.flush(30)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": topic})
    consumer.assign([TopicPartition(topic, 0, 0)])
    values = []
    deadline = time.monotonic() + 30
    while len(values) < 2 and time.monotonic() < deadline:
        message = consumer.poll(1)
        if message is not None and message.error() is None:
            values.append(message.value())
    consumer.close()
    return values


def test_kwatermark_broker_kafka_prints_one_line_serves_clients_and_stops_on_sigterm():
    process = subprocess.Popen([BROKER, "--kind", "kafka"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline().strip()
        assert line.startswith("bootstrap.servers=127.0.0.1:"), line
        bootstrap = line.split("=", 1)[1]
        assert _round_trip(bootstrap) == [b"a", b"b"]
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
        rest = process.stdout.read()
        assert rest == ""                                   # exactly one stdout line
        stderr = process.stderr.read()
        data_dir = stderr.split("data and log in ", 1)[1].split()[0]
        assert not os.path.exists(data_dir)                 # data removed at stop
    finally:
        if process.poll() is None:
            process.kill()


@pytest.mark.parametrize("kind", ["kafka", "tansu"])
def test_a_broker_never_outlives_the_python_process_that_started_it(kind, tmp_path):
    # A user's session that starts a broker and exits without stopping it (as the docs'
    # snippets do) must not leave the broker running.
    script = textwrap.dedent(f"""
        from kwatermark.localbroker import LocalBroker
        broker = LocalBroker.start(kind={kind!r})
        print(broker.process.pid, broker.bootstrap_servers, flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    pid = int(done.stdout.split()[0])
    assert _wait_gone(pid), f"the {kind} broker (pid {pid}) outlived its Python process"


def test_without_maven_a_fresh_cache_fails_with_one_line_saying_what_to_install(tmp_path):
    env = {**os.environ, "KWATERMARK_CACHE": str(tmp_path / "cache"),
           "PATH": os.path.dirname(sys.executable)}  # no mvn, no java
    done = subprocess.run([BROKER, "--kind", "kafka"], capture_output=True, text=True,
                          timeout=60, env=env, check=False)
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "needs `mvn` on PATH: install Maven" in lines[0]
