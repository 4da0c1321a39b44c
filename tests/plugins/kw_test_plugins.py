"""Tiny user plug-ins for the tests, loaded by ``"kw_test_plugins:Name"``.

This directory is on PYTHONPATH for Spark's workers (tests/conftest.py); unit tests put it on
``sys.path`` themselves.
"""

from __future__ import annotations


class LaggingGenerator:
    """Custom generator: ``wm = max_ts - watermark.lagMs`` (no ``merge``: never split)."""

    def __init__(self, options: dict[str, str]):
        self.options = options
        self.lag_ms = int(options.get("watermark.lagMs", "100"))
        self.max_ts: int | None = None

    def on_event(self, ts_ms: int, record: dict) -> None:
        if self.max_ts is None or ts_ms > self.max_ts:
            self.max_ts = ts_ms

    def current(self) -> int | None:
        return None if self.max_ts is None else self.max_ts - self.lag_ms

    def snapshot(self) -> object:
        return {"max_ts": self.max_ts}

    def restore(self, snapshot: object) -> None:
        self.max_ts = snapshot["max_ts"]


class IncompleteGenerator:
    """Lacks ``snapshot`` and ``restore``: loading it must fail."""

    def __init__(self, options: dict[str, str]):
        pass

    def on_event(self, ts_ms: int, record: dict) -> None:
        pass

    def current(self) -> int | None:
        return None


def is_marker(record: dict) -> bool:
    """Punctuation predicate: a record whose key is ``b"marker"`` carries the watermark."""
    return record["key"] == b"marker"


def value_as_ms(record: dict) -> int | None:
    """Timestamp assigner: the value is the event time in ASCII digits; empty = none."""
    return int(record["value"]) if record["value"] else None


class QuietPolicy:
    """Idle policy: excluded when caught up and silent for ``idle.quietMs``."""

    def __init__(self, options: dict[str, str]):
        self.options = options
        self.quiet_ms = int(options["idle.quietMs"])

    def decide(self, partition, now_ms: int) -> str | int:
        silent = now_ms - partition.last_read_ms >= self.quiet_ms
        return "exclude" if partition.unread == 0 and silent else "count"


class NoDecidePolicy:
    """Has no ``decide``: loading it must fail."""

    def __init__(self, options: dict[str, str]):
        pass


class BrokerFreezingGenerator(LaggingGenerator):
    """``LaggingGenerator`` that, at the first record a task reads, stops the broker process
    ``watermark.freezePid`` (SIGSTOP) once, creating the file ``watermark.freezeMarker``: a
    broker that stops answering in the middle of a read. The next task attempt to start
    (Spark's retry) lets it go on (SIGCONT) and creates the marker's ``.resumed`` twin."""

    def __init__(self, options: dict[str, str]):
        import os
        import signal

        super().__init__(options)
        marker = options["watermark.freezeMarker"]
        self.frozen = os.path.exists(marker)
        if self.frozen and not os.path.exists(marker + ".resumed"):
            os.kill(int(options["watermark.freezePid"]), signal.SIGCONT)
            with open(marker + ".resumed", "w"):
                pass

    def on_event(self, ts_ms: int, record: dict) -> None:
        if not self.frozen:
            import os
            import signal

            self.frozen = True
            try:
                fd = os.open(self.options["watermark.freezeMarker"],
                             os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                pass
            else:
                os.close(fd)
                os.kill(int(self.options["watermark.freezePid"]), signal.SIGSTOP)
        super().on_event(ts_ms, record)
