"""Flink's interval join and first-row deduplication as pure values (DESIGN §16): the match
decision, when a held row can be forgotten, and lateness. Nothing here imports Spark or
Kafka; the ``transformWithState`` processors in :mod:`kwatermark.joins` and
:mod:`kwatermark.dedup` only keep a :class:`KeyJoin` / :class:`KeyFirsts` per key in Spark's
state store and wake it with Spark's event-time timers.

Watermarks follow DESIGN §2: ``W`` means no on-time record with event time ``<= W`` is still
to come. ``W`` below is Spark's watermark, the minimum of the inputs' watermarks
(kwatermark.clock), never above any row's own watermark. A row is late when its event time
is at or below the operator's watermark, as in Flink: ``W`` for a join (the lower of its two
streams', not the row's own stream's), and for deduplication the row's own watermark with
one input (its stream's is the operator's; fresher than ``W``), ``W`` with several
(:func:`operator_watermark`). That is what makes
forgetting at ``expiry`` safe: an on-time row arriving later has ``t > W``, and a row held
until ``W >= expiry`` can match no such ``t``.

>>> spec = JoinSpec(lower_ms=0, upper_ms=5_000, how="left")
>>> key = KeyJoin()
>>> [(e.kind, e.left, e.right) for e in key.apply(spec, [Side(LEFT, 1_000, None, "l")], 0)]
[]
>>> [(e.kind, e.left, e.right) for e in key.apply(spec, [Side(RIGHT, 4_000, 900, "r")], 0)]
[('match', 'l', 'r')]
>>> key.wake_up(spec)        # the left row can match rights up to 6 s; the right, lefts >= 4 s
4000
>>> [e.kind for e in key.expire(spec, 6_000)], key.rows
([], [])
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from kwatermark.errors import KWatermarkError

LEFT, RIGHT = 0, 1
MATCH, LEFT_ONLY, RIGHT_ONLY, LATE, FIRST = "match", "left_only", "right_only", "late", "first"
HOWS = ("inner", "left", "right", "full")
# Spark's join type names (JoinType.apply: lower-cased, every "_" removed) of the four joins
# an interval join has, each to its HOWS value; the names as Spark lists them, for messages.
JOIN_TYPES = {"inner": "inner", "leftouter": "left", "left": "left",
              "rightouter": "right", "right": "right",
              "fullouter": "full", "full": "full", "outer": "full"}
JOIN_TYPE_NAMES = ("inner", "left_outer", "leftouter", "left", "right_outer", "rightouter",
                   "right", "full_outer", "fullouter", "full", "outer")


class JoinError(KWatermarkError):
    """An interval join or a deduplication that cannot be built."""


@dataclass(frozen=True)
class JoinSpec:
    """``right.t`` in ``[left.t + lower_ms, left.t + upper_ms]``; ``how`` which unmatched rows
    come out: any of Spark's names for an inner, left, right or full outer join
    (:data:`JOIN_TYPES`), kept as ``inner``, ``left``, ``right`` or ``full``.

    >>> JoinSpec(0, 5_000, "LEFT_OUTER").how
    'left'
    """

    lower_ms: int
    upper_ms: int
    how: str = "inner"

    def __post_init__(self):
        if self.lower_ms > self.upper_ms:
            raise JoinError(f"interval_join: lower ({self.lower_ms} ms) must not be above "
                            f"upper ({self.upper_ms} ms)")
        how = JOIN_TYPES.get(str(self.how).lower().replace("_", ""))
        if how is None:
            raise JoinError(f"interval_join: how must be one of Spark's join types "
                            f"{', '.join(JOIN_TYPE_NAMES)} (case-insensitive), got "
                            f"{self.how!r}")
        object.__setattr__(self, "how", how)  # frozen: its one canonical spelling

    def matches(self, left_ms: int, right_ms: int) -> bool:
        return left_ms + self.lower_ms <= right_ms <= left_ms + self.upper_ms

    def expiry(self, side: int, t: int) -> int:
        """The watermark from which a row of ``side`` at ``t`` can match no on-time row of the
        other side: a right row at ``r > W`` can meet a left row at ``t`` only while
        ``t + upper >= r > W``; a left row at ``l > W`` a right row at ``t`` only while
        ``t - lower >= l > W``."""
        return t + self.upper_ms if side == LEFT else t - self.lower_ms

    def keeps_unmatched(self, side: int) -> bool:
        return self.how == "full" or self.how == ("left" if side == LEFT else "right")


def is_late(t: int | None, row_watermark: int | None) -> bool:
    """Late by its own row's watermark (undefined: nothing is late); no event time: late.
    Deduplication's rule: with one input, the row's watermark is the operator's."""
    if t is None:
        return True
    return row_watermark is not None and t <= row_watermark


def operator_watermark(row_watermark: int | None, watermark: int, inputs: int) -> int | None:
    """The watermark a row of a deduplication is judged by, as Flink judges by its operator's:
    with one input, the row's own (that stream's watermark as the row arrives, fresher than
    Spark's ``W``); with several, ``W``, the lowest of them (a stream ahead of the others does
    not make its rows late: the firsts they may duplicate are held until ``W`` releases
    them). Undefined (None) while the row's own stream has none.

    >>> operator_watermark(8, 2, inputs=1), operator_watermark(8, 2, inputs=2)
    (8, 2)
    """
    if row_watermark is None or inputs == 1:
        return row_watermark
    return min(row_watermark, watermark)


def late_in_join(row: Side, watermark: int) -> bool:
    """Late by the join's watermark ``W``, the lower of the two streams' (Spark's at the batch
    start), as Flink's interval join judges a row: not by the row's own stream's watermark,
    which may be far above ``W``. A row at ``t > W`` still meets every partner: each is held
    until ``W`` reaches its expiry, which is at or above ``t`` when the two match. ``W`` is
    never above a row's own watermark, so a row whose own stream has none yet is not late."""
    return row.t is None or (row.watermark is not None and row.t <= watermark)


@dataclass
class Side:
    """One input row: its side, event time, its row's watermark and what to emit (opaque)."""

    side: int
    t: int | None
    watermark: int | None
    payload: object


@dataclass
class Held:
    side: int
    t: int
    payload: object
    matched: bool = False

    def __reduce__(self):
        return (Held, (self.side, self.t, self.payload, self.matched))


@dataclass(frozen=True)
class Joined:
    kind: str
    left: object = None      # payload, None on the missing side
    right: object = None


@dataclass
class KeyJoin:
    """One key's held rows. ``apply`` takes a micro-batch's rows with Spark's watermark at the
    batch start; ``expire`` emits the unmatched rows the watermark made final and forgets
    every row that can no longer match."""

    rows: list[Held] = field(default_factory=list)

    def apply(self, spec: JoinSpec, batch: Iterable[Side], watermark: int) -> list[Joined]:
        out = self.expire(spec, watermark)
        for row in batch:
            if late_in_join(row, watermark):
                out.append(Joined(LATE, *((row.payload, None) if row.side == LEFT
                                          else (None, row.payload))))
                continue
            held = Held(row.side, row.t, row.payload)
            for other in self.rows:
                if other.side == row.side:
                    continue
                left, right = (held, other) if row.side == LEFT else (other, held)
                if spec.matches(left.t, right.t):
                    left.matched = right.matched = True
                    out.append(Joined(MATCH, left.payload, right.payload))
            self.rows.append(held)
        return out + self.expire(spec, watermark)

    def expire(self, spec: JoinSpec, watermark: int) -> list[Joined]:
        out, kept = [], []
        for held in self.rows:
            if spec.expiry(held.side, held.t) > watermark:
                kept.append(held)
            elif not held.matched and spec.keeps_unmatched(held.side):
                out.append(Joined(LEFT_ONLY, held.payload) if held.side == LEFT
                           else Joined(RIGHT_ONLY, None, held.payload))
        self.rows = kept
        return out

    def wake_up(self, spec: JoinSpec) -> int | None:
        """The lowest watermark at which ``expire`` has something to do (None: nothing held)."""
        return min((spec.expiry(h.side, h.t) for h in self.rows), default=None)


def unmatchable(spec: JoinSpec, batch: Iterable[Side], watermark: int) -> list[Joined]:
    """Rows that can match nothing (a null key, as in SQL): late ones ``late``, the others
    their outer row at once when ``how`` keeps them."""
    out = []
    for row in batch:
        if late_in_join(row, watermark):
            kind = LATE
        elif spec.keeps_unmatched(row.side):
            kind = LEFT_ONLY if row.side == LEFT else RIGHT_ONLY
        else:
            continue
        out.append(Joined(kind, row.payload) if row.side == LEFT
                   else Joined(kind, None, row.payload))
    return out


# -- deduplication ----------------------------------------------------------------------------


@dataclass
class KeyFirsts:
    """One key's first rows still held: a row within ``within_ms`` of a held first's event
    time is a duplicate; a first is forgotten once the watermark reaches its time +
    ``within_ms`` (no on-time row, ``t > W``, can then be within reach of it).

    >>> key = KeyFirsts()
    >>> key.apply(5_000, [(1_000, None), (3_000, 900), (9_000, 900)], watermark=0)
    ['first', None, 'first']
    >>> key.expire(5_000, 6_000), key.firsts, key.wake_up(5_000)
    (None, [9000], 14000)
    """

    firsts: list[int] = field(default_factory=list)

    def apply(self, within_ms: int, rows: Iterable[tuple[int | None, int | None]],
              watermark: int) -> list[str | None]:
        """Per row (event time, row watermark), in arrival order: ``first``, ``late`` or None
        (a duplicate, dropped)."""
        self.expire(within_ms, watermark)
        kinds: list[str | None] = []
        for t, row_watermark in rows:
            if is_late(t, row_watermark):
                kinds.append(LATE)
            elif any(abs(t - f) <= within_ms for f in self.firsts):
                kinds.append(None)
            else:
                self.firsts.append(t)
                kinds.append(FIRST)
        return kinds

    def expire(self, within_ms: int, watermark: int) -> None:
        self.firsts = [f for f in self.firsts if f + within_ms > watermark]

    def wake_up(self, within_ms: int) -> int | None:
        return min((f + within_ms for f in self.firsts), default=None)
