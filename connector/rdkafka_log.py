"""librdkafka's own log lines, routed through Python ``logging`` with a rate limit.

librdkafka retries an unreachable broker every second or so and logs each failure: left
alone that is thousands of ``Connect to ... failed: Connection refused`` lines on stderr
(issue 14). Every client kwatermark creates passes :func:`librdkafka_logger` as
confluent-kafka's ``logger`` setting; its filter lets the first line of each kind through,
then at most one per :data:`EVERY_S` seconds, saying how many were suppressed.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable

LOGGER_NAME = "kwatermark.librdkafka"
EVERY_S = 60.0
_NUMBERS = re.compile(r"\d+")


class RateLimit(logging.Filter):
    """Passes a log line unless one of the same kind (same level and text once digits are
    ignored) passed less than ``every_s`` seconds ago.

    >>> clock = iter([0.0, 1.0, 2.0, 61.0, 62.0]).__next__
    >>> limit = RateLimit(60.0, clock)
    >>> def line(text):
    ...     record = logging.LogRecord("x", logging.ERROR, "", 0, text, (), None)
    ...     return limit.filter(record) and record.getMessage()
    >>> line("Connect to 127.0.0.1:1 failed (after 0ms)")
    'Connect to 127.0.0.1:1 failed (after 0ms)'
    >>> line("Connect to 127.0.0.1:1 failed (after 1ms)"), line("Connect to 127.0.0.2:1 failed (after 9ms)")
    (False, False)
    >>> line("Connect to 127.0.0.1:1 failed (after 2ms)")
    'Connect to 127.0.0.1:1 failed (after 2ms) [2 similar line(s) suppressed in 61 s]'
    >>> line("Broker transport failure")
    'Broker transport failure'
    """

    MAX_KINDS = 1000

    def __init__(self, every_s: float = EVERY_S,
                 clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.every_s = every_s
        self.clock = clock
        self._seen: dict[tuple[int, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        key = (record.levelno, line_kind(message))
        now = self.clock()
        seen = self._seen.get(key)
        if seen is not None and now - seen[0] < self.every_s:
            self._seen[key] = (seen[0], seen[1] + 1)
            return False
        if len(self._seen) >= self.MAX_KINDS:
            self._seen.clear()
        self._seen[key] = (now, 0)
        if seen is not None and seen[1]:
            record.msg = (f"{message} [{seen[1]} similar line(s) suppressed in "
                          f"{now - seen[0]:.0f} s]")
            record.args = ()
        return True


def line_kind(text: str) -> str:
    """What makes librdkafka lines "the same kind": their text with every number as ``#``
    (ports, milliseconds, broker counts differ between repeats).

    >>> line_kind("Connect to ipv4#127.0.0.1:1 failed (after 3ms)")
    'Connect to ipv###.#.#.#:# failed (after #ms)'
    """
    return _NUMBERS.sub("#", text)


def librdkafka_logger() -> logging.Logger:
    """The logger for confluent-kafka's ``logger`` setting, rate-limited (once per process)."""
    logger = logging.getLogger(LOGGER_NAME)
    if not any(isinstance(f, RateLimit) for f in logger.filters):
        logger.addFilter(RateLimit())
    return logger
