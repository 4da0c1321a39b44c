"""``kwatermark-registry`` as a user runs it (issue 37): one stdout line once Confluent's API
answers, the compatibility it was asked for, a clean stop on SIGTERM, and a one-line reason
when Maven is missing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request

REGISTRY = os.path.join(os.path.dirname(sys.executable), "kwatermark-registry")


def test_kwatermark_registry_prints_one_line_serves_confluents_api_and_stops_on_sigterm():
    process = subprocess.Popen([REGISTRY, "--compatibility", "backward"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline().strip()
        assert line.startswith("schema.registry.url=http://127.0.0.1:"), line
        url = line.split("=", 1)[1]
        assert url.endswith("/apis/ccompat/v7")
        with urllib.request.urlopen(f"{url}/config", timeout=10) as answer:
            assert json.loads(answer.read())["compatibilityLevel"] == "BACKWARD"
        with urllib.request.urlopen(f"{url}/subjects", timeout=10) as answer:
            assert json.loads(answer.read()) == []
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
        assert process.stdout.read() == ""                   # exactly one stdout line
        log = process.stderr.read().split("log in ", 1)[1].split()[0]
        assert not os.path.exists(log)                       # removed at stop
    finally:
        if process.poll() is None:
            process.kill()


def test_without_maven_a_fresh_cache_fails_with_one_line_saying_what_to_install(tmp_path):
    env = {**os.environ, "KWATERMARK_CACHE": str(tmp_path / "cache"),
           "PATH": os.path.dirname(sys.executable)}  # no mvn, no java
    done = subprocess.run([REGISTRY], capture_output=True, text=True, timeout=60, env=env,
                          check=False)
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "needs `mvn` on PATH: install Maven" in lines[0]
