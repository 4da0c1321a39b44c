"""When a planned range ``[start, end)`` of a partition is done (DESIGN §14), and how long a
read may go without progress.

Offsets are not dense: transaction markers, aborted records under ``read_committed`` and
compacted-away records are never delivered. A range is done when the partition's read
position reaches ``end`` -- the offset after the last record delivered, or the consumer's
position, which librdkafka moves past markers and filtered records -- not when a record at
``end - 1`` arrives. ``kafkaConsumer.pollTimeoutMs`` bounds the time *without progress*, as
in Spark's Kafka source, never the time a range takes.

Both readers (``RangeReader`` for one range, ``PackReader`` for a task's many) decide with
these functions; they import nothing from Kafka or Spark.

>>> advance(5, reported=9, end=8)    # a marker at 7 was the range's last offset
8
>>> done(8, 8)
True
>>> clock = Stall(limit_s=120.0, last=0.0)
>>> clock.wait_s(0.0), clock.expired(119.9)
(0.01, False)
"""

from __future__ import annotations

from dataclasses import dataclass

# librdkafka's "no position yet" (RD_KAFKA_OFFSET_INVALID): nothing consumed since assign.
OFFSET_INVALID = -1001

# How long one consume() call may wait. consume(n, timeout) returns only when it has n
# messages or the timeout passed, and a range ending on a gap can never give it the n it
# asks for: the read checks the position after a call that came back short, so a range
# whose last offsets are gaps costs at most this once, not kafkaConsumer.pollTimeoutMs.
# Short calls while records are still on their way cost one C call each, nothing per
# record.
CONSUME_SLICE_S = 0.01


def advance(position: int, reported: int, end: int) -> int:
    """The range's read position once the consumer reports ``reported`` (its position, or
    the offset of an end-of-partition event): never backwards, never past ``end``.

    ``position`` is the offset after the last record the range has taken; ``reported``
    counts the offsets the consumer skipped (markers, aborted or compacted records) too."""
    if reported < 0:
        return position
    return min(end, max(position, reported))


def done(position: int, end: int) -> bool:
    """A range is done once its read position reaches its end, whatever it delivered."""
    return position >= end


def short(asked: int, got: int) -> bool:
    """A consume call came back with fewer messages than asked: it waited its whole slice,
    so the queue is drained and the consumer's position says where the partition stands
    (asked again only then: nothing per message, nothing per full call)."""
    return got < asked


@dataclass
class Stall:
    """The no-progress clock: ``limit_s`` (``kafkaConsumer.pollTimeoutMs``) is the longest a
    read may go without its position advancing while offsets remain to be read. Times are
    ``time.monotonic()`` seconds, passed in."""

    limit_s: float
    last: float

    def progressed(self, now: float) -> None:
        self.last = now

    def expired(self, now: float) -> bool:
        return now - self.last >= self.limit_s

    def wait_s(self, now: float) -> float:
        """The next consume call's timeout: a slice, never past the no-progress limit."""
        return max(0.0, min(CONSUME_SLICE_S, self.last + self.limit_s - now))
