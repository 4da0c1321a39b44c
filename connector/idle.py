"""Idle-partition policies, evaluated on the driver when a batch is planned (DESIGN §5).

A policy answers, per partition, ``"count"``, ``"exclude"``, or an int: advance this
partition's watermark to that epoch ms. Decisions are written into the offset, so a replayed
batch sees the same ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from kwatermark.errors import PluginError
from kwatermark.options import IdleConfig
from kwatermark.plugins import PluginOptions, load_object

COUNT = "count"
EXCLUDE = "exclude"
ADVANCE = "advance"


@dataclass(frozen=True)
class PartitionView:
    """What a policy sees of one partition at planning time."""

    topic: str
    partition: int
    watermark_ms: int | None
    max_event_time_ms: int | None
    unread: int          # records between the next offset to read and the broker's end
    last_read_ms: int    # processing time its records were last read (or first assigned)
    idle: str            # the previous decision: "count", "exclude" or "advance"
    # Watermark alignment (watermark.alignment.maxDrift, DESIGN §11) holds it in the
    # trigger being planned: it reads nothing on purpose, so silence is not idleness. Decided
    # before the policy is asked, and recorded in the offset state as "held".
    held: bool = False


@runtime_checkable
class IdlePolicy(Protocol):
    """``idle.policy = "package.module:ClassName"``; gets every ``idle.*`` option.

    >>> class QuietAfterMinute:
    ...     def __init__(self, options): pass
    ...     def decide(self, partition, now_ms):
    ...         silent = now_ms - partition.last_read_ms
    ...         return "exclude" if partition.unread == 0 and silent > 60_000 else "count"
    """

    def decide(self, partition: PartitionView, now_ms: int) -> str | int: ...


class NeverIdle:
    """``none``: a silent partition holds the watermark (Flink's default)."""

    def decide(self, partition: PartitionView, now_ms: int) -> str | int:
        return COUNT


class ProcessingTimeout:
    """``timeout``: excluded once none of its records was read for ``idle.timeout``, backlog
    or not (Flink's ``withIdleness``, flaw included: a starved partition becomes idle)."""

    def __init__(self, timeout_ms: int):
        self.timeout_ms = timeout_ms

    def decide(self, partition: PartitionView, now_ms: int) -> str | int:
        return EXCLUDE if now_ms - partition.last_read_ms >= self.timeout_ms else COUNT


class CaughtUp:
    """``caught-up``: excluded only with no unread records *and* silent for ``idle.timeout``;
    never while it has backlog."""

    def __init__(self, timeout_ms: int):
        self.timeout_ms = timeout_ms

    def decide(self, partition: PartitionView, now_ms: int) -> str | int:
        silent = now_ms - partition.last_read_ms >= self.timeout_ms
        return EXCLUDE if partition.unread == 0 and silent else COUNT


class AdvanceWhenCaughtUp:
    """``advance``: caught up and silent for ``idle.timeout``, its watermark moves to
    ``now - idle.maxDelay`` (Beam's ``withCreateTime(maxDelay)``)."""

    def __init__(self, timeout_ms: int, max_delay_ms: int):
        self.timeout_ms = timeout_ms
        self.max_delay_ms = max_delay_ms

    def decide(self, partition: PartitionView, now_ms: int) -> str | int:
        silent = now_ms - partition.last_read_ms >= self.timeout_ms
        if partition.unread == 0 and silent:
            return now_ms - self.max_delay_ms
        return COUNT


def make_policy(config: IdleConfig) -> object:
    if config.policy == "none":
        return NeverIdle()
    if config.policy == "timeout":
        return ProcessingTimeout(config.timeout_ms)
    if config.policy == "caught-up":
        return CaughtUp(config.timeout_ms)
    if config.policy == "advance":
        return AdvanceWhenCaughtUp(config.timeout_ms, config.max_delay_ms)
    cls = load_object(config.policy, "idle.policy")
    try:
        policy = cls(PluginOptions(config.plugin_options))
    except Exception as exc:
        raise PluginError(f"option idle.policy: {config.policy!r} failed to construct: "
                          f"{type(exc).__name__}: {exc}") from exc
    if not callable(getattr(policy, "decide", None)):
        raise PluginError(f"option idle.policy: {config.policy!r} has no decide() method")
    return policy


def decide(policy: object, view: PartitionView, now_ms: int) -> str | int:
    """Ask the policy; anything but "count", "exclude" or an int fails with its class name."""
    name = type(policy).__qualname__
    try:
        answer = policy.decide(view, now_ms)
    except Exception as exc:
        raise PluginError(f"idle policy {name} raised on topic {view.topic} partition "
                          f"{view.partition}: {type(exc).__name__}: {exc}") from exc
    if answer in (COUNT, EXCLUDE):
        return answer
    if isinstance(answer, int) and not isinstance(answer, bool):
        return answer
    raise PluginError(f"idle policy {name} answered {answer!r} for topic {view.topic} "
                      f"partition {view.partition}; expected 'count', 'exclude' or epoch ms")
