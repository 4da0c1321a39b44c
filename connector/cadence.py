"""When Spark plans next, from when it planned before (docs/operations.md, "Planning ahead
of the trigger").

Under a processing-time trigger Spark asks ``latestOffset`` at each tick (multiples of the
interval), whether or not the last batch found anything, as long as a batch takes less than
the interval. The planner can then ask the brokers, and fold the batch that ran, just before
the tick, while the query waits, instead of during the planning the batch then waits for
(at 4,096 partitions the end offsets take ~35 ms inside Spark's planning process).

A planning so prepared reads the end offsets the brokers gave at most ``FRESH_MS`` before
it: records appended after them wait for the next trigger, as records appended during
the lookup do in Spark's own source. Its planning time (``plannedAt``, the processing-time
lags) is when they were asked, so every record appended before it is in the answer.

The default trigger (the next planning as soon as a batch ends, every 10 ms while idle) and
a batch longer than the interval give no regular cadence: nothing is prepared there.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

# How long before the tick the brokers are asked: as long as the last preparation took
# (its answers and its fold, whichever came last) and MARGIN_MS, within these bounds; the
# most until one has been timed. A batch's cut-off moves earlier by the lead and its
# planning at the tick gets shorter by up to as much (at 4,096 partitions a preparation
# takes ~35 ms): a longer lead only delays records, a shorter one leaves part of the
# preparation for the planning to wait for.
LEAD_MS = 100
MIN_LEAD_MS = 10
MARGIN_MS = 5
# A prepared planning is used only when Spark plans within this long after it was asked.
FRESH_MS = 250
# Cadences shorter than this are not prepared for (the default trigger, an idle query).
MIN_INTERVAL_MS = 350
# How far a gap between plannings may be from their mean for a cadence (a tick's planning
# starts a few ms after the tick: measured 2-48 ms on a busy 2-core machine).
JITTER_MS = 150
# How many plannings, the last ones, show the cadence.
SEEN = 4


def lead(took_ms: int | None) -> int:
    """How long before the tick to prepare, after a preparation that took ``took_ms``
    (None: none timed yet).

    >>> lead(None), lead(31), lead(2), lead(400)
    (100, 36, 10, 100)
    """
    if took_ms is None:
        return LEAD_MS
    return min(LEAD_MS, max(MIN_LEAD_MS, took_ms + MARGIN_MS))


def prepare_at(calls: Sequence[int], lead_ms: int = LEAD_MS) -> int | None:
    """When to prepare the next planning (wall-clock ms), from the start times of the
    plannings so far (ascending), or None: ``lead_ms`` before the next tick, when each of the
    last SEEN plannings' gaps is within JITTER_MS of their mean, the interval, and that is
    at least MIN_INTERVAL_MS. A planning comes a little after its tick, never before it, so
    the tick is where the planning that came soonest after its own puts it. A batch longer
    than the interval (the next one starts at once) or the default trigger has no cadence;
    one found by chance costs a lookup, whose answer is used only if fresh.

    >>> prepare_at([0, 1_031, 2_002, 3_048])
    3934
    >>> prepare_at([0, 1_031, 2_002, 2_700]) is None
    True
    """
    if len(calls) < SEEN:
        return None
    last = calls[-SEEN:]
    interval = (last[-1] - last[0]) / (SEEN - 1)
    if interval < MIN_INTERVAL_MS or any(abs(b - a - interval) > JITTER_MS
                                         for a, b in pairwise(last)):
        return None
    tick = min(call + (SEEN - row) * interval for row, call in enumerate(last))
    return int(tick) - lead_ms


def fresh(asked_ms: int, now_ms: int) -> bool:
    """Whether an answer asked at ``asked_ms`` may plan a call at ``now_ms``."""
    return 0 <= now_ms - asked_ms <= FRESH_MS
