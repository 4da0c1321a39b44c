"""Planning ahead of the trigger (docs/operations.md): the thread that prepares the planner's
next planning just before Spark's next tick, around the pure timing of kwatermark.cadence.

The planner hands it two calls: ``ask(start)``, which starts asking the brokers the next
planning's questions (``KafkaMetadata.ask_ahead``: None when nothing is asked ahead), and
``work(start)``, what the planner readies meanwhile (the fold of the batch that ran). Both
run under the planner's lock, which Spark's own calls into the planner take too.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from kwatermark import cadence
from kwatermark.broker import Ahead
from kwatermark.offsets import BatchOffset

log = logging.getLogger("kwatermark.planner")


@dataclass(frozen=True)
class Prepared:
    """A planning prepared ahead of the trigger: the start offset it is for, when the
    brokers were asked (its planning time) and their answers coming."""
    start: BatchOffset
    asked_ms: int
    ahead: Ahead


class PlanningAhead:
    """The last plannings' start times, the timer of the next preparation, what it prepared
    and how long it took (the next one's lead)."""

    def __init__(self, ask: Callable[[BatchOffset], Ahead | None],
                 work: Callable[[BatchOffset], None], lock: threading.RLock,
                 clock: Callable[[], int]):
        self._ask, self._work, self._lock, self._clock = ask, work, lock, clock
        self._calls: list[int] = []
        self._timer: threading.Timer | None = None
        self._prepared: Prepared | None = None
        self._took_ms: int | None = None

    def take(self, start: BatchOffset, called: int) -> Prepared | None:
        """The planning prepared for ``start`` ahead of a call at ``called``, if its answers
        are fresh enough (kwatermark.cadence); a preparation not begun yet is called off,
        one under way is waited for."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer.join()
            self._timer = None
        prepared, self._prepared = self._prepared, None
        if prepared is None or not cadence.fresh(prepared.asked_ms, called) or not (
                prepared.start is start or prepared.start == start):
            return None
        return prepared

    def planned(self, called: int) -> None:
        """A planning started at ``called``."""
        self._calls = self._calls[1 - cadence.SEEN:] + [called]

    def schedule(self, start: BatchOffset) -> None:
        """Prepare the next planning (from ``start``) just before Spark is expected to ask
        for it, when the plannings so far came at a regular cadence."""
        at = cadence.prepare_at(self._calls, cadence.lead(self._took_ms))
        if at is None:
            return
        delay = (at - self._clock()) / 1000
        if delay <= 0:
            return
        timer = threading.Timer(delay, self._prepare, args=(start,))
        timer.daemon = True
        timer.name = "kwatermark-prepare"
        self._timer = timer
        timer.start()

    def _prepare(self, start: BatchOffset) -> None:
        """Ask, then work while the brokers answer. A failure is left to the planning, which
        asks and folds again and says what went wrong."""
        with self._lock:
            try:
                asked = self._clock()
                ahead = self._ask(start)
                if ahead is None:
                    return
                self._prepared = Prepared(start, asked, ahead)
                self._work(start)
                # what the next preparation's lead is made of: this one's work and answers
                # (the end offsets are the slowest; a failed one is asked again anyway)
                concurrent.futures.wait([ahead.topics, ahead.ends],
                                        timeout=cadence.LEAD_MS / 1000)
                self._took_ms = self._clock() - asked
            except Exception as exc:  # noqa: BLE001 - the planning asks again, and raises
                log.debug("planning ahead of the trigger: %s", exc)
