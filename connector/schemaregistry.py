"""A local Confluent-compatible Schema Registry for tests, benchmarks and experiments (§22).

Apicurio Registry, served built by Maven Central as ``io.apicurio:apicurio-registry-app:
<version>:tar.gz:all``: fetched once through the machine's ``mvn`` (the tarball alone: its
parent POM is not served, so no transitive POM is read) and unpacked into
``$KWATERMARK_CACHE`` (default ``~/.cache/kwatermark``), like the local Apache Kafka's jars
(:mod:`kwatermark.kafkabroker`). It runs on Java 17 with in-memory storage, on 127.0.0.1, and
answers Confluent's REST API under ``/apis/ccompat/v7``: that URL is what
``value.schema.registry.url`` and confluent-kafka's ``SchemaRegistryClient`` take.

>>> registry = LocalSchemaRegistry.start()      # doctest: +SKIP
>>> registry.url                                # doctest: +SKIP
'http://127.0.0.1:40321/apis/ccompat/v7'
>>> registry.stop()                             # doctest: +SKIP

Differences from Confluent's own registry that users meet: the default compatibility is NONE
(Confluent's: BACKWARD; :meth:`LocalSchemaRegistry.set_compatibility` sets it), error texts
differ (codes match), and a Protobuf schema is served as registered (``?format=serialized`` is
ignored).
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from kwatermark import maven
from kwatermark.errors import KWatermarkError
from kwatermark.kafkabroker import _tail, cache_root, die_with_parent, free_port

APICURIO_VERSION = "3.0.9"
ARTIFACT = f"io.apicurio:apicurio-registry-app:{APICURIO_VERSION}:tar.gz:all"
# The dependency plugin's `get` from before 3.x resolves one artifact with transitive=false
# without reading its POM's parent (which Maven Central does not serve for this artifact).
_GET = "org.apache.maven.plugins:maven-dependency-plugin:2.8:get"
CCOMPAT_PATH = "/apis/ccompat/v7"


def require_tool(name: str, what: str) -> str:
    return maven.require_tool(name, what, "the local Schema Registry",
                              "point value.schema.registry.url at a registry of your own")


def runtime_dir() -> Path:
    """``<cache>/apicurio-registry-<version>``, holding the runner jar, fetched on first use.

    Like the Kafka runtime, it is unpacked into a fresh directory renamed into place, so
    processes starting registries at the same time never see half of it.
    """
    home = cache_root() / f"apicurio-registry-{APICURIO_VERSION}"
    if not (home / runner_jar_name()).is_file():
        mvn = require_tool("mvn", "Maven 3 (apt-get install maven)")
        home.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix="apicurio-", dir=home.parent))
        try:
            tarball = staging / "app.tar.gz"
            result = subprocess.run(
                [mvn, "-q", "-B", _GET, f"-Dartifact={ARTIFACT}", "-Dtransitive=false",
                 f"-Ddest={tarball}"],
                check=False, capture_output=True, text=True, timeout=900)
            if result.returncode != 0 or not tarball.is_file():
                tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
                raise KWatermarkError(f"Maven could not fetch Apicurio Registry ({ARTIFACT}) "
                                      f"from Maven Central (mvn exit {result.returncode}):\n{tail}")
            unpacked = staging / "app"
            unpacked.mkdir()
            shutil.unpack_archive(str(tarball), str(unpacked), format="gztar")
            if not (unpacked / runner_jar_name()).is_file():
                raise KWatermarkError(f"{ARTIFACT} holds no {runner_jar_name()}")
            try:
                unpacked.rename(home)
            except OSError:
                if not (home / runner_jar_name()).is_file():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return home


def runner_jar_name() -> str:
    return f"apicurio-registry-app-{APICURIO_VERSION}-runner.jar"


@dataclass
class LocalSchemaRegistry:
    """A running Apicurio Registry; :attr:`url` is its Confluent-compatible API."""

    process: subprocess.Popen
    port: int
    log_file: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{CCOMPAT_PATH}"

    @classmethod
    def start(cls, port: int | None = None, timeout_s: float = 120.0) -> LocalSchemaRegistry:
        """Start a registry on ``port`` (a free one if None); return once it lists subjects."""
        home = runtime_dir()
        java = require_tool("java", "a Java 17 JDK (apt-get install openjdk-17-jdk-headless)")
        port = port or free_port()
        log_fd, log_file = tempfile.mkstemp(prefix="kwatermark-registry-", suffix=".log")
        with os.fdopen(log_fd, "wb") as out:
            process = subprocess.Popen(
                [java, "-Xmx256m", "-Dquarkus.http.host=127.0.0.1",
                 f"-Dquarkus.http.port={port}", "-Dquarkus.log.console.color=false",
                 "-jar", str(home / runner_jar_name())],
                cwd=str(home), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                preexec_fn=die_with_parent)  # noqa: PLW1509 - see kafkabroker._PRCTL
        registry = cls(process, port, log_file)
        atexit.register(registry.stop)
        try:
            registry._await_ready(timeout_s)
        except BaseException:
            registry.stop()
            raise
        return registry

    def _await_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise KWatermarkError(f"Apicurio Registry exited with code "
                                      f"{self.process.returncode} while starting:\n"
                                      f"{_tail(self.log_file)}")
            try:
                self.request("GET", "/subjects")
                return
            except (OSError, urllib.error.URLError):
                if time.monotonic() > deadline:
                    raise KWatermarkError(
                        f"Apicurio Registry did not answer {self.url}/subjects in {timeout_s:g} "
                        f"s; its log: {self.log_file}") from None
                time.sleep(0.3)

    def request(self, method: str, path: str, body: dict | None = None):
        """One call of the Confluent API (``path`` under :attr:`url`); the decoded JSON."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method, headers={
            "Content-Type": "application/vnd.schemaregistry.v1+json"})
        with urllib.request.urlopen(req, timeout=10) as answer:
            return json.loads(answer.read() or b"null")

    def set_compatibility(self, level: str, subject: str | None = None) -> None:
        """``PUT /config`` (or ``/config/<subject>``): e.g. ``BACKWARD``, Confluent's default."""
        self.request("PUT", "/config" + (f"/{subject}" if subject else ""),
                     {"compatibility": level})

    def stop(self) -> None:
        """Stop the registry (SIGTERM, then SIGKILL after 20 s) and remove its log."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        Path(self.log_file).unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    """``kwatermark-registry``: run a local Schema Registry until SIGTERM or SIGINT.

    Prints exactly one line on stdout, ``schema.registry.url=http://127.0.0.1:PORT/apis/
    ccompat/v7``, once it answers; its log is named on stderr.
    """
    parser = argparse.ArgumentParser(prog="kwatermark-registry",
                                     description=main.__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=None, help="default: a free port")
    parser.add_argument("--compatibility", default=None,
                        help="set this default compatibility (e.g. BACKWARD, Confluent's "
                             "default; Apicurio's is NONE)")
    args = parser.parse_args(argv)
    stop_requested: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: stop_requested.append(signum))
    try:
        registry = LocalSchemaRegistry.start(port=args.port)
    except KWatermarkError as exc:
        print(f"kwatermark-registry: {exc}", file=sys.stderr)
        return 1
    try:
        if args.compatibility:
            registry.set_compatibility(args.compatibility.upper())
        print(f"kwatermark-registry: Apicurio Registry {APICURIO_VERSION}, log in "
              f"{registry.log_file}", file=sys.stderr)
        print(f"schema.registry.url={registry.url}", flush=True)
        while not stop_requested:
            if registry.process.poll() is not None:
                print(f"kwatermark-registry: the registry exited with code "
                      f"{registry.process.returncode}", file=sys.stderr)
                return 1
            time.sleep(0.2)
        return 0
    finally:
        registry.stop()


if __name__ == "__main__":
    sys.exit(main())
