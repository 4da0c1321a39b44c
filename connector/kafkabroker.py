"""A single-node Apache Kafka 4.x for tests, benchmarks and the demo (DESIGN §17).

KRaft mode, one process that is both broker and controller, on 127.0.0.1, with its data in a
temporary directory that :meth:`ApacheKafka.stop` removes. The jars are resolved once by the
machine's ``mvn`` (with the user's Maven settings) from the pom shipped beside this module, into
``$KWATERMARK_CACHE`` (default ``~/.cache/kwatermark``), never into the work tree
(:mod:`kwatermark.maven`).

>>> kafka = ApacheKafka.start()                   # doctest: +SKIP
>>> kafka.bootstrap_servers                       # doctest: +SKIP
'127.0.0.1:40123'
>>> kafka.stop()                                  # doctest: +SKIP

Configured for tests: every internal topic (offsets, transaction state, share state) has one
replica and a min ISR of 1, consumer groups start without the initial rebalance delay, records
are kept whatever their timestamps (no time-based retention unless a topic asks for it), and
the log cleaner wakes every second, so a topic created with ``segment.ms`` and
``min.cleanable.dirty.ratio`` small compacts within seconds. ``properties`` overrides or adds
any ``server.properties`` key (listeners, SASL, TLS, an authorizer); ``scram_users`` adds SCRAM
credentials at format time, before the broker takes its first request.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kwatermark import maven
from kwatermark.errors import KWatermarkError
from kwatermark.maven import MAVEN_HINT, cache_root, pom_property, resolve

POM = "kafka-broker.pom.xml"
PROBE_TOPIC = "__kwatermark_ready"


def kafka_version() -> str:
    """The Apache Kafka version the shipped pom resolves (its ``kafka.version``)."""
    return pom_property(POM, "kafka.version")


def require_tool(name: str, what: str) -> str:
    return maven.require_tool(name, what, "the local Apache Kafka",
                              "use the bundled broker (--kind tansu) or your own "
                              "(KAFKA_BOOTSTRAP_SERVERS)")


def runtime_classpath() -> str:
    """The broker's classpath (``<cache>/kafka-<version>/lib/*``), resolved on first use
    (:func:`kwatermark.maven.resolve`)."""
    lib = cache_root() / f"kafka-{kafka_version()}" / "lib"
    if not lib.is_dir():
        require_tool("mvn", MAVEN_HINT)
        require_tool("java", "a Java 17 JDK (apt-get install openjdk-17-jdk-headless)")
        resolve(POM, lib, f"Apache Kafka {kafka_version()}")
    return str(lib / "*")


def cluster_id() -> str:
    """A KRaft cluster id: a random UUID, URL-safe base64 without padding (22 chars), never
    starting with "-" (the storage tool would read it as an option: "--cluster-id expected
    one argument", one start in 64; Kafka's own Uuid.randomUuid() redraws those too)."""
    while True:
        found = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not found.startswith("-"):
            return found


def server_properties(port: int, controller_port: int, data_dir: str,
                      overrides: Mapping[str, str] | None = None,
                      listeners: Mapping[str, tuple[str, int]] | None = None, *,
                      node_id: int = 1, voters: Mapping[int, int] | None = None
                      ) -> dict[str, str]:
    """``server.properties`` of a combined broker and controller, tuned for tests.
    ``listeners``: more listeners beside PLAINTEXT, name -> (security protocol, port).
    ``voters``: node id -> controller port of every node of a cluster (default: this one
    alone); internal topics then get min(3, nodes) replicas and a min ISR of min(2, nodes)."""
    extra = listeners or {}
    voters = voters or {node_id: controller_port}
    replicas = str(min(3, len(voters)))
    min_isr = str(min(2, len(voters)))
    properties = {
        "node.id": str(node_id),
        "process.roles": "broker,controller",
        "controller.quorum.voters": ",".join(f"{n}@127.0.0.1:{p}"
                                             for n, p in sorted(voters.items())),
        "listeners": ",".join([f"PLAINTEXT://127.0.0.1:{port}",
                               f"CONTROLLER://127.0.0.1:{controller_port}"]
                              + [f"{name}://127.0.0.1:{p}" for name, (_, p) in extra.items()]),
        "advertised.listeners": ",".join([f"PLAINTEXT://127.0.0.1:{port}"] + [
            f"{name}://127.0.0.1:{p}" for name, (_, p) in extra.items()]),
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": ",".join(
            ["PLAINTEXT:PLAINTEXT", "CONTROLLER:PLAINTEXT"]
            + [f"{name}:{protocol}" for name, (protocol, _) in extra.items()]),
        "log.dirs": os.path.join(data_dir, "logs"),
        "num.partitions": "1",
        "offsets.topic.replication.factor": replicas,
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": min_isr,
        "transaction.state.log.num.partitions": "4",
        "share.coordinator.state.topic.replication.factor": replicas,
        "share.coordinator.state.topic.min.isr": min_isr,
        "group.initial.rebalance.delay.ms": "0",
        "log.cleaner.backoff.ms": "1000",
        # Tests write records with event times near 1970: time-based retention would delete
        # them at once. A topic that wants retention sets retention.ms itself.
        "log.retention.ms": "-1",
        "log.retention.check.interval.ms": "1000",
        "auto.create.topics.enable": "true",
        # Each partition's offset and time indexes are preallocated at this size (Kafka's
        # default 10 MB) and, on this project's machines, came into the page cache whole
        # as the partitions were written (fincore): a 4,096-partition topic's 80 GB of them
        # filled the 24 GB machine's cache, which stalled in reclaim 8-17 % of the time, and
        # the broker answered no produce request for 60 s. 256 KB indexes 128 MB of log a
        # segment before it rolls.
        "log.index.size.max.bytes": "262144",
    }
    properties.update(overrides or {})
    return properties


def _log4j_properties(log_file: str) -> str:
    return "\n".join([
        "status = error",
        "appender.file.type = File",
        "appender.file.name = file",
        f"appender.file.fileName = {log_file}",
        "appender.file.layout.type = PatternLayout",
        "appender.file.layout.pattern = [%d] %p %m (%c)%n",
        "rootLogger.level = INFO",
        "rootLogger.appenderRef.file.ref = file",
        "logger.kafka.name = kafka",
        "logger.kafka.level = INFO",
        "logger.apache.name = org.apache.kafka",
        "logger.apache.level = INFO",
        ""])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _load_prctl():
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: no parent-death signal
        return None


# Resolved in the parent: between fork and exec the child must not import or take locks
# that another thread of the parent (Spark's, py4j's) may have held at fork time.
_PRCTL = _load_prctl()
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """``preexec_fn``: the child gets SIGKILL when the process that started it dies, so a
    broker never outlives a Python session that forgot to stop it (Linux only)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class ApacheKafka:
    process: subprocess.Popen
    port: int
    data_dir: str
    properties: dict[str, str] = field(default_factory=dict)
    listener_ports: dict[str, int] = field(default_factory=dict)

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_file(self) -> str:
        return os.path.join(self.data_dir, "server.log")

    def address(self, listener: str) -> str:
        """``127.0.0.1:PORT`` of a listener given to :meth:`start` (``PLAINTEXT`` too)."""
        if listener == "PLAINTEXT":
            return self.bootstrap_servers
        return f"127.0.0.1:{self.listener_ports[listener]}"

    @classmethod
    def start(cls, port: int | None = None, timeout_s: float = 60.0, *,
              properties: Mapping[str, str] | None = None,
              scram_users: Iterable[tuple[str, str, str]] = (),
              listeners: Mapping[str, str] | None = None) -> ApacheKafka:
        """Start a broker on ``port`` (a free one if None) and return once a client can
        create a topic on it. ``scram_users``: (mechanism, user, password) triples, e.g.
        ``("SCRAM-SHA-512", "alice", "alice-secret")``. ``listeners``: more listeners, each
        on a free port, name -> security protocol, e.g. ``{"SECURE": "SASL_SSL"}`` (configure
        them through ``properties``, e.g. ``listener.name.secure.*``; see :meth:`address`).
        Readiness is checked over PLAINTEXT, which stays the inter-broker listener."""
        classpath = runtime_classpath()
        java = require_tool("java", "a Java 17 JDK (apt-get install openjdk-17-jdk-headless)")
        port = port or free_port()
        data_dir = tempfile.mkdtemp(prefix="kwatermark-kafka-")
        try:
            ports = {name: (protocol, free_port())
                     for name, protocol in (listeners or {}).items()}
            config = server_properties(port, free_port(), data_dir, properties, ports)
            config_file = os.path.join(data_dir, "server.properties")
            Path(config_file).write_text("".join(f"{k}={v}\n" for k, v in config.items()))
            log4j = os.path.join(data_dir, "log4j2.properties")
            Path(log4j).write_text(_log4j_properties(os.path.join(data_dir, "server.log")))
            jvm = [java, "-Xms256m", "-Xmx1g", "-XX:+UseG1GC", "-Djava.awt.headless=true",
                   f"-Dlog4j2.configurationFile={log4j}", "-cp", classpath]
            scram = [arg for mechanism, user, password in scram_users
                     for arg in ("--add-scram", f"{mechanism}=[name={user},password={password}]")]
            formatted = subprocess.run(
                jvm + ["kafka.tools.StorageTool", "format", "-t", cluster_id(), "-c",
                       config_file, "--ignore-formatted", *scram],
                check=False, capture_output=True, text=True, timeout=120)
            if formatted.returncode != 0:
                raise KWatermarkError(f"formatting the Kafka storage failed: "
                                      f"{(formatted.stderr or formatted.stdout).strip()[-2000:]}")
            with open(os.path.join(data_dir, "stdout.log"), "wb") as out:
                process = subprocess.Popen(jvm + ["kafka.Kafka", config_file], stdout=out,
                                           stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           preexec_fn=die_with_parent)  # noqa: PLW1509 - see _PRCTL
        except BaseException:
            shutil.rmtree(data_dir, ignore_errors=True)
            raise
        broker = cls(process, port, data_dir, config,
                     {name: p for name, (_, p) in ports.items()})
        # A session that exits without stop() still stops the broker and removes its data;
        # die_with_parent covers the exits that skip atexit (a kill).
        atexit.register(broker.stop)
        try:
            broker._await_ready(timeout_s)
        except BaseException:
            broker.stop()
            raise
        return broker

    def _await_ready(self, timeout_s: float) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic

        deadline = time.monotonic() + timeout_s
        while not _listening(self.port):
            self._check_alive()
            if time.monotonic() > deadline:
                raise KWatermarkError(f"Apache Kafka did not listen on 127.0.0.1:{self.port} "
                                      f"in {timeout_s:g} s; its log: {self.log_file}")
            time.sleep(0.1)
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
        while True:
            self._check_alive()
            try:
                admin.create_topics([NewTopic(PROBE_TOPIC, 1, 1)])[PROBE_TOPIC].result(5)
                break
            except Exception as exc:  # retried until the deadline
                if "TOPIC_ALREADY_EXISTS" in str(exc):
                    break
                if time.monotonic() > deadline:
                    raise KWatermarkError(
                        f"Apache Kafka on {self.bootstrap_servers} could not create a topic in "
                        f"{timeout_s:g} s ({exc}); its log: {self.log_file}") from exc
                time.sleep(0.2)
        admin.delete_topics([PROBE_TOPIC])[PROBE_TOPIC].result(30)

    def _check_alive(self) -> None:
        if self.process.poll() is not None:
            tail = _tail(os.path.join(self.data_dir, "stdout.log")) or _tail(self.log_file)
            raise KWatermarkError(f"Apache Kafka exited with code {self.process.returncode} "
                                  f"while starting:\n{tail}")

    def stop(self) -> None:
        """Stop the broker (SIGTERM, then SIGKILL after 20 s) and remove its data."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        shutil.rmtree(self.data_dir, ignore_errors=True)


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _tail(path: str, lines: int = 20) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# --- several nodes (DESIGN §20) ---------------------------------------------------------------

@dataclass
class KafkaNode:
    """One node of a :class:`KafkaCluster`: a combined broker and controller. ``stop``,
    ``kill`` and ``restart`` act on this node alone; its data survives them (a restart is
    the same broker coming back, as in a rolling restart)."""

    node_id: int
    port: int
    data_dir: str
    command: list[str]
    process: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_file(self) -> str:
        return os.path.join(self.data_dir, "server.log")

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def launch(self) -> None:
        with open(os.path.join(self.data_dir, "stdout.log"), "ab") as out:
            self.process = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL,
                                            preexec_fn=die_with_parent)  # noqa: PLW1509

    def stop(self, timeout_s: float = 60.0) -> None:
        """A clean shutdown (SIGTERM: leadership moves away first), waited for."""
        if self.running:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    def kill(self) -> None:
        """SIGKILL: the node vanishes mid-request, as a crashed machine does."""
        if self.running:
            self.process.kill()
            self.process.wait(10)

    def restart(self) -> None:
        """Start the node again on its ports with its data (stopped or killed first)."""
        if self.running:
            raise KWatermarkError(f"node {self.node_id} is running: stop or kill it first")
        self.launch()


@dataclass
class KafkaCluster:
    """N combined broker+controller nodes on loopback, a controller quorum of all of them,
    each on a free port with its own data directory under one temporary directory.

    >>> cluster = KafkaCluster.start(3)               # doctest: +SKIP
    >>> cluster.bootstrap_servers                     # doctest: +SKIP
    '127.0.0.1:40123,127.0.0.1:40125,127.0.0.1:40127'
    >>> cluster.node(2).kill(); cluster.node(2).restart()   # doctest: +SKIP
    >>> cluster.wait_in_sync(2)                       # doctest: +SKIP
    >>> cluster.stop()                                # doctest: +SKIP

    Internal topics get min(3, N) replicas and a min ISR of min(2, N); topics a test creates
    choose their own replication.
    """

    nodes: list[KafkaNode]
    data_dir: str
    properties: dict[str, str] = field(default_factory=dict)

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(node.address for node in self.nodes)

    @property
    def port(self) -> int:
        return self.nodes[0].port

    @property
    def process(self) -> subprocess.Popen:
        return self.nodes[0].process

    def node(self, node_id: int) -> KafkaNode:
        """The node with this ``node.id`` (1..N)."""
        return self.nodes[node_id - 1]

    @classmethod
    def start(cls, brokers: int, timeout_s: float = 120.0, *,
              properties: Mapping[str, str] | None = None) -> KafkaCluster:
        if brokers < 1:
            raise KWatermarkError(f"brokers={brokers}: a cluster needs at least one node")
        classpath = runtime_classpath()
        java = require_tool("java", "a Java 17 JDK (apt-get install openjdk-17-jdk-headless)")
        root = tempfile.mkdtemp(prefix=f"kwatermark-kafka{brokers}-")
        try:
            ids = range(1, brokers + 1)
            ports = {n: free_port() for n in ids}
            voters = {n: free_port() for n in ids}
            cluster_uuid = cluster_id()
            nodes, formats = [], []
            for n in ids:
                data_dir = os.path.join(root, f"node-{n}")
                os.makedirs(data_dir)
                config = server_properties(ports[n], voters[n], data_dir, properties,
                                           node_id=n, voters=voters)
                config_file = os.path.join(data_dir, "server.properties")
                Path(config_file).write_text("".join(f"{k}={v}\n" for k, v in config.items()))
                log4j = os.path.join(data_dir, "log4j2.properties")
                Path(log4j).write_text(_log4j_properties(os.path.join(data_dir, "server.log")))
                # Three JVMs on a laptop's (or a CI runner's) cores: the client compiler
                # only and a serial collector halve what the nodes take to start (36 -> 19
                # CPU s on 2 cores) and idle (17 -> 10 CPU s a minute); a test cluster
                # carries hundreds of records a second, not a benchmark's load.
                jvm = [java, "-Xms128m", "-Xmx512m", "-XX:+UseSerialGC",
                       "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true",
                       f"-Dlog4j2.configurationFile={log4j}", "-cp", classpath]
                formats.append(subprocess.Popen(
                    jvm + ["kafka.tools.StorageTool", "format", "-t", cluster_uuid, "-c",
                           config_file, "--ignore-formatted"],
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                    preexec_fn=die_with_parent))  # noqa: PLW1509
                nodes.append(KafkaNode(n, ports[n], data_dir,
                                       jvm + ["kafka.Kafka", config_file]))
            for n, formatting in zip(ids, formats):
                output, _ = formatting.communicate(timeout=120)
                if formatting.returncode != 0:
                    raise KWatermarkError(f"formatting node {n}'s Kafka storage failed: "
                                          f"{output.strip()[-2000:]}")
            for node in nodes:
                node.launch()
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        cluster = cls(nodes, root, dict(properties or {}))
        atexit.register(cluster.stop)
        try:
            cluster._await_ready(timeout_s)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _await_ready(self, timeout_s: float) -> None:
        from confluent_kafka.admin import NewTopic

        deadline = time.monotonic() + timeout_s
        admin = self.admin()
        replicas = len(self.nodes)
        while True:
            self._check_alive()
            try:
                admin.create_topics([NewTopic(PROBE_TOPIC, 1, replicas)]
                                    )[PROBE_TOPIC].result(5)
                break
            except Exception as exc:  # retried until the deadline
                if "TOPIC_ALREADY_EXISTS" in str(exc):
                    break
                if time.monotonic() > deadline:
                    raise KWatermarkError(
                        f"the {replicas}-node Apache Kafka on {self.bootstrap_servers} could "
                        f"not create a topic in {timeout_s:g} s ({exc}); logs in "
                        f"{self.data_dir}") from exc
                time.sleep(0.5)
        # The probe's name starts with "__": no subscription matches it, so a deletion that
        # is slow (a loaded machine) is not a failed start.
        with contextlib.suppress(Exception):
            admin.delete_topics([PROBE_TOPIC])[PROBE_TOPIC].result(max(
                30.0, deadline - time.monotonic()))

    def _check_alive(self) -> None:
        for node in self.nodes:
            if node.process is not None and node.process.poll() is not None:
                tail = _tail(os.path.join(node.data_dir, "stdout.log")) or _tail(node.log_file)
                raise KWatermarkError(f"Apache Kafka node {node.node_id} exited with code "
                                      f"{node.process.returncode}:\n{tail}")

    def exited(self) -> KafkaNode | None:
        """A node that was started and has exited on its own (None if every one runs)."""
        return next((n for n in self.nodes if n.process is not None and not n.running), None)

    def admin(self, servers: str | None = None):
        """An AdminClient on the cluster (or on ``servers``) that keeps librdkafka's
        connection-refused lines of nodes that are down off stderr."""
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": servers or self.bootstrap_servers,
                            "log_level": 0})

    def out_of_sync(self, node_id: int, timeout_s: float = 10.0) -> list[str]:
        """What keeps ``node_id`` from serving: ``"down"`` while the node itself does not
        answer, else the partitions (``topic-p``, internal topics included) that have it as
        a replica but not in their ISR, or have no leader."""
        node = self.node(node_id)
        if not node.running:
            return ["down"]
        try:
            self.admin(node.address).list_topics(timeout=min(timeout_s, 5.0))
        except Exception:  # noqa: BLE001 - not answering yet
            return ["not answering"]
        metadata = self.admin().list_topics(timeout=timeout_s)
        if node_id not in metadata.brokers:
            return ["not registered"]
        lagging = []
        for name, topic in metadata.topics.items():
            for p, partition in topic.partitions.items():
                if node_id in partition.replicas and (
                        node_id not in partition.isrs or partition.leader < 0):
                    lagging.append(f"{name}-{p}")
        return sorted(lagging)

    def wait_in_sync(self, node_id: int, timeout_s: float = 300.0) -> None:
        """Return once ``node_id`` answers and is in the ISR of every partition it
        replicates (a node restarted at once after a kill may still be listed in the ISRs:
        it must answer too)."""
        deadline = time.monotonic() + timeout_s
        lagging: list[str] | str = "no answer"
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                lagging = self.out_of_sync(node_id)
                if not lagging:
                    return
            except Exception as exc:  # noqa: BLE001 - a restarting cluster; retried
                lagging = str(exc)
            time.sleep(0.5)
        node = self.node(node_id)
        raise KWatermarkError(f"node {node_id} was not back in every ISR within {timeout_s:g} "
                              f"s: {lagging if isinstance(lagging, str) else lagging[:10]}; "
                              f"its log ends:\n{_tail(node.log_file, 30)}")

    def stop(self) -> None:
        """Stop every node and remove the data: SIGTERM to all at once, SIGKILL to what is
        left after 5 s (a controlled shutdown waits for a quorum that is going away too, and
        the data is not kept)."""
        for node in self.nodes:
            if node.running:
                node.process.terminate()
        for node in self.nodes:
            if node.process is not None:
                try:
                    node.process.wait(5)
                except subprocess.TimeoutExpired:
                    node.process.kill()
                    node.process.wait(10)
        shutil.rmtree(self.data_dir, ignore_errors=True)
