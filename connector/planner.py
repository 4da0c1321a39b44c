"""The driver's side of the progress model (DESIGN §4): fold the progress of the batch that
just ran into each partition's state, ask the brokers what is new, apply read limits and
idle decisions, and write it all into the next offset."""

from __future__ import annotations

import functools
import heapq
import logging
import math
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from operator import attrgetter

import numpy as np

from kwatermark import idle
from kwatermark.arrow import OutputLayout
from kwatermark.broker import Ahead, KafkaMetadata
from kwatermark.errors import BrokerError, DataLossError, OptionError
from kwatermark.ledger import ProgressLedger, ProgressRecord, pack_keys
from kwatermark.offsets import (
    PACKING,
    BatchOffset,
    PartitionRange,
    PartitionState,
    RangeTask,
    TaskColumns,
    TopicPartition,
    fill_densities,
    held_by_alignment,
    pack_bounds,
    plan_splits,
    rate_limit_rows,
)
from kwatermark.options import EARLIEST, LATEST, OffsetBound, SourceOptions
from kwatermark.pack import PackReader
from kwatermark.partition_columns import (
    STATE_FIELDS,
    OffsetColumns,
    RangeMap,
    StateMap,
    columns_of,
    density_rows,
    observe_lags,
    read_densities,
    with_columns,
)
from kwatermark.planning_ahead import PlanningAhead, Prepared
from kwatermark.reader import Decoders
from kwatermark.watermarks import (
    NO_PARTITIONS,
    UNDEFINED,
    can_split,
    combined_watermark,
    current_ms,
    emitted,
    from_optional,
    holder,
    make_generator,
    plan_generator,
    restore_generator,
    row_bounds,
    snapshot_watermark,
    snapshot_watermarks,
    to_optional,
)

log = logging.getLogger("kwatermark.planner")


# A stream waiting for a missing topic says so at once, then at most this often.
MISSING_WARNING_EVERY_MS = 10 * 60_000
# A topic created a moment ago may not be known yet to the broker that answers the metadata
# request (a cluster spreads new topics' metadata within moments; Kafka's Java admin retries
# UNKNOWN_TOPIC_OR_PARTITION until default.api.timeout.ms): ask again this long before a
# missing topic fails a query's start.
MISSING_TOPIC_WAIT_S = 10.0
# How long a (re)started query asks again for an end offset below what it has read before
# taking it as a recreated topic (BatchPlanner._monotone).
BACKWARDS_RECHECK_S = 5.0


# What the fold takes of a range's ProgressRecord, in this order.
_FOLDED_FIELDS = ("generator", "min_event_ms", "max_event_ms", "max_row_watermark")
_folded_of = attrgetter(*_FOLDED_FIELDS)


def _folded_fields(record: ProgressRecord | None) -> tuple | None:
    return None if record is None else _folded_of(record)


def _exclusive(method):
    """A planner call that Spark makes, kept apart from a planning prepared on a timer
    thread (``kwatermark.planning_ahead``): the two share the planner's caches."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)
    return call


def now_ms() -> int:
    return int(time.time() * 1000)


def _within(ends: dict[TopicPartition, int], begins: dict[TopicPartition, int],
            target: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
    """``ends`` no further than an AvailableNow run's ``target`` (a partition it does not
    name: its begin) and never before ``begins``: asked every planning of the run, 4,096
    partitions a planning, so no call a partition."""
    within = {}
    for tp, end in ends.items():
        begin = begins[tp]
        cap = target.get(tp, begin)
        if end > cap:   # noqa: PLR1730 (no call a partition)
            end = cap
        within[tp] = end if end > begin else begin   # noqa: FURB136
    return within


def _column_or(values: dict[TopicPartition, int], order: list[TopicPartition],
               defaults: list[int]) -> list[int]:
    """``values`` of each of ``order`` as a list, ``defaults[i]`` where it has none."""
    if len(values) >= len(order):
        try:
            return list(map(values.__getitem__, order))
        except KeyError:
            pass
    return [values.get(tp, default) for tp, default in zip(order, defaults)]


def _column(values: dict[TopicPartition, int], order: list[TopicPartition]) -> np.ndarray:
    """``values`` of ``order`` as an int64 column."""
    return np.fromiter(map(values.__getitem__, order), dtype=np.int64, count=len(order))


def _utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(
        timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class ReadLimits:
    """What Spark's ReadLimit allows this trigger (None = everything available)."""

    max_rows: int | None = None
    respect_minimum: bool = False


class BatchPlanner:
    """Plans offsets and tasks. Lives in the driver's long-lived Python process."""

    def __init__(self, options: SourceOptions, layout: OutputLayout, decoders: Decoders):
        self.options = options
        self.layout = layout
        self.decoders = decoders
        self.metadata = KafkaMetadata(options)
        self.ledger = ProgressLedger(options.state_location,
                                     default=options.state_location_is_default)
        self.fingerprint = options.watermark.fingerprint()
        self._policy = None
        # The offset whose tasks were last planned, its tasks and their packs.
        self._tasks: tuple[BatchOffset, TaskColumns, list[TaskColumns]] | None \
            = None
        # The offset whose packs' ledger keys were last computed, and the keys.
        self._keys: tuple[BatchOffset, list[str]] | None = None
        # The batch last folded (its offset): the states, the highest row watermark and the
        # lowest event time each partition read.
        self._folded: tuple[BatchOffset, dict[TopicPartition, PartitionState], int,
                            dict[TopicPartition, int]] | None = None
        # The offsets last parsed or written, with their JSON: Spark hands back the offset
        # latestOffset returned (as start, end, commit), so it is parsed once, not per call.
        self._known: list[tuple[dict, BatchOffset]] = []
        # Partitions whose ledger directory may hold records (DESIGN §21: a commit looks
        # there, not in every partition's directory); None until the first commit's sweep.
        self._may_hold: set[TopicPartition] | None = None
        self._marks: dict[int, tuple[object, int]] = {}
        self._snapshot_mark = None   # partition_watermark's reader of a snapshot
        self._snapshot_marks = None   # column_watermarks': the same of a column of them
        # The last offset latest_offset planned, with each partition's watermark at its
        # start: partitions() plans that offset's tasks from the same marks.
        self._offset_marks: tuple[BatchOffset, dict[TopicPartition, int]] | None = None
        # A start offset, and each partition's watermark and whether it counts at it
        # (_state_marks).
        self._start_marks: tuple[BatchOffset, dict, dict] | None = None
        # The read limit's inputs for those marks: (marks, row order, priority and density
        # columns).
        self._start_limits: tuple | None = None
        self._plans_clock: bool | None = None   # the generator takes the planning time
        self._target: dict[TopicPartition, int] | None = None
        self._last_trigger_ms: int | None = None
        # Whether this run has planned a batch yet: see the heartbeat in latest_offset.
        self._planned = False
        self._checked = False  # latest_offset has checked the subscription once in this run
        self._warned: dict[str, float] = {}
        # Each partition's end offset as the broker reported it at the last planning, for
        # the query progress's "latestOffset" (DESIGN §15); observation only.
        self.latest_seen: dict[TopicPartition, int] = {}
        self._announced: set[TopicPartition] = set()
        # Each topic's id when first planned in this process, and since when a partition's
        # end offset has been below what was read (_monotone).
        self._topic_ids: dict[str, str] = {}
        self._behind_since: dict[TopicPartition, float] = {}
        # Planning ahead of the trigger (kwatermark.planning_ahead), under the lock that
        # keeps it off the planner while Spark's calls run.
        self._limits: ReadLimits | None = None   # the last planning's, for the next one's
        self._lock = threading.RLock()
        self._ahead = self._planning_ahead()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        # Driver-side observation stays on the driver: tasks never read it.
        state.update(_policy=None, _folded=None, _tasks=None, _keys=None, latest_seen={},
                     _announced=set(), _known=[], _may_hold=None, _marks={}, _topic_ids={},
                     _behind_since={}, _snapshot_mark=None, _snapshot_marks=None,
                     _offset_marks=None, _start_marks=None, _start_limits=None,
                     _limits=None, _lock=None, _ahead=None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()
        self._ahead = self._planning_ahead()

    def _planning_ahead(self) -> PlanningAhead:
        return PlanningAhead(lambda start: self.metadata.ask_ahead(list(start.partitions)),
                             self._ready_ahead, self._lock, lambda: now_ms())

    def offset(self, data: object) -> BatchOffset:
        """``BatchOffset.from_json``, once per offset: Spark passes the JSON of an offset
        this planner wrote back to it several times per batch."""
        for known_json, known in self._known:
            if data == known_json:
                return known
        offset = with_columns(BatchOffset.from_json(data))
        if isinstance(data, dict):
            self._remember(data, offset)
        return offset

    def offset_json(self, offset: BatchOffset) -> dict:
        """``offset.to_json()``, remembered for :meth:`offset`."""
        data = offset.to_json()
        self._remember(data, offset)
        return data

    def _remember(self, data: dict, offset: BatchOffset) -> None:
        self._known = [(data, offset)] + self._known[:3]

    @property
    def policy(self) -> object:
        if self._policy is None:
            self._policy = idle.make_policy(self.options.idle)
        return self._policy

    # -- positions -------------------------------------------------------------------

    def resolve(self, bound: OffsetBound, tps: list[TopicPartition], option: str
                ) -> dict[TopicPartition, int]:
        """Concrete offsets for ``startingOffsets``/``endingOffsets`` and their by-time
        forms."""
        if bound.kind == "earliest":
            return self.metadata.earliest_offsets(tps)
        if bound.kind == "latest":
            return self.metadata.latest_offsets(tps)
        if bound.kind == "timestamp":
            return self._by_time({tp: bound.timestamp for tp in tps},
                                 option.replace("Offsets", "Timestamp"))
        given = dict(bound.offsets)
        missing = sorted(set(tps) - set(given))
        unknown = sorted(set(given) - set(tps))
        if missing or unknown:
            raise OptionError(
                f"option {option}: specific offsets must name exactly the assigned partitions; "
                f"missing {[f'{t}:{p}' for t, p in missing]}, not assigned "
                f"{[f'{t}:{p}' for t, p in unknown]}")
        if bound.kind == "timestamps":
            return self._by_time(given, option + "ByTimestamp")
        earliest = self.metadata.earliest_offsets([tp for tp, o in given.items()
                                                   if o == EARLIEST])
        latest = self.metadata.latest_offsets([tp for tp, o in given.items() if o == LATEST])
        return {tp: earliest.get(tp, latest.get(tp, o)) for tp, o in given.items()}

    def _by_time(self, times: dict[TopicPartition, int], option: str
                 ) -> dict[TopicPartition, int]:
        found = self.metadata.offsets_for_times(times)
        absent = [tp for tp, offset in found.items() if offset < 0]
        # As in Spark: an ending time with no record after it means "the end".
        ending = option.startswith("ending")
        if absent and not ending and self.options.timestamp_strategy == "error":
            t, p = absent[0]
            raise OptionError(
                f"option {option}: topic {t} partition {p} has no record with timestamp >= "
                f"{times[absent[0]]}; set startingOffsetsByTimestampStrategy=latest to start "
                f"at the end instead")
        latest = self.metadata.latest_offsets(absent) if absent else {}
        return {tp: latest.get(tp, offset) for tp, offset in found.items()}

    def assigned(self, fail_if_missing: bool = False, read_before: Iterable[str] = (),
                 ahead: Ahead | None = None) -> list[TopicPartition]:
        """The partitions to read. With ``fail_if_missing`` (a batch read; a stream when it
        starts or restarts), a ``subscribe``/``assign`` topic that does not exist is an error,
        as in Spark's Kafka source, unless it is one of ``read_before`` (the checkpoint has
        its partitions: deleted since, which is data loss, see ``_begins``). An assigned
        partition past its topic's end is left out with a warning naming it, as Spark leaves
        it out (read from its earliest offset if it is created). A topic that disappeared,
        and a pattern matching nothing, are warned about at most every
        MISSING_WARNING_EVERY_MS."""
        subscription = self.options.subscription
        known = set(read_before)
        deadline = time.monotonic() + MISSING_TOPIC_WAIT_S
        while True:
            tps, missing = self.metadata.coverage(subscription, ahead)
            ahead = None   # asked again: fresh answers
            topics = [t for t, p in missing if p is None]
            never_read = [t for t in topics if t not in known]
            if not (never_read and fail_if_missing) or time.monotonic() >= deadline:
                break
            time.sleep(0.5)
        where = f"kafka.bootstrap.servers={self.options.bootstrap_servers!r}"
        if never_read and fail_if_missing:
            raise OptionError(
                f"option {subscription.kind}: {', '.join(f'topic {t}' for t in never_read)} "
                f"does not exist on {where}; create it first (subscribePattern reads topics "
                f"as they are created)")
        for t, p in missing:
            if p is not None:
                what = f"option assign: topic {t} has no partition {p}"
                self._warn_rarely(what, f"{what} on {where}; the assigned partitions that exist "
                                  f"are read, and partition {p} from its earliest offset if it "
                                  f"is created")
        if topics:
            what = f"option {subscription.kind}: {', '.join(f'topic {t}' for t in topics)} " \
                   f"does not exist"
            self._warn_rarely(what, f"{what} on {where}; nothing is read from it until it is "
                              f"created")
        elif subscription.kind == "subscribePattern" and not tps:
            what = f"option subscribePattern: {subscription.pattern!r} matches no topic"
            self._warn_rarely(what, f"{what} on {where}; nothing is read until a topic "
                              f"matching it is created")
        return tps

    def _warn_rarely(self, key: str, message: str) -> None:
        now = time.monotonic()
        last = self._warned.get(key)
        if last is None or (now - last) * 1000 >= MISSING_WARNING_EVERY_MS:
            self._warned[key] = now
            log.warning("%s", message)

    # -- streaming -------------------------------------------------------------------

    def initial_offset(self) -> BatchOffset:
        tps = self.assigned(fail_if_missing=True)
        positions = self.resolve(self.options.starting, tps, "startingOffsets")
        first_seen = now_ms()
        return BatchOffset(None, {tp: PartitionRange(o, o, PartitionState(last_read_ms=first_seen))
                                  for tp, o in positions.items()})

    @_exclusive
    def prepare_available_now(self) -> None:
        """Fix the end of an AvailableNow run: nothing produced later is read."""
        self._target = self.metadata.latest_offsets(self.assigned())

    def latest_offset(self, start: BatchOffset, limits: ReadLimits) -> BatchOffset | None:
        """The next batch's end offset, or None when there is nothing new to read."""
        called = now_ms()
        prepared = self._ahead.take(start, called)
        self._limits = limits
        with self._lock:
            try:
                end = self._latest_offset(start, limits, prepared)
            finally:
                self._ahead.planned(called)
        if self._target is None:   # an AvailableNow run asks no end offsets after its first
            self._ahead.schedule(start if end is None else end)
        return end

    def _ready_ahead(self, start: BatchOffset) -> None:
        """What a planning prepared ahead of the trigger readies while the brokers answer:
        the fold of the batch that ends at ``start`` when every range of it has published
        its progress (never recomputed here: the batch may still run), each partition's
        watermark and the read limit's inputs."""
        folded = self.fold(start, recompute=False)
        if folded is not None and self._limits is not None:
            # for the partitions read so far (the planning's own, unless they change)
            self._while_asked(start, folded[0], dict.fromkeys(start.partitions),
                              self._limits)

    def _latest_offset(self, start: BatchOffset, limits: ReadLimits,
                       prepared: Prepared | None) -> BatchOffset | None:
        self._marks = {}
        # After its first planning an AvailableNow run asks no end offsets: they are the
        # run's target, as Spark's source plans from allDataForTriggerAvailableNow (~30 ms of
        # a planning at 4,096 partitions). Its topics are still listed, so a partition
        # deleted during the run is data loss at once, not a task waiting for it.
        fixed = self._target is not None and self._checked
        if prepared is not None and not fixed:
            # Asked just before the trigger (kwatermark.planning_ahead): that is the planning time.
            ahead, now = prepared.ahead, prepared.asked_ms
        else:
            # The topics and the end offsets of the partitions read so far, asked on threads
            # while the last batch is folded: the brokers answer during Python's work.
            ahead = self.metadata.ask_ahead(list(start.partitions), ends=not fixed)
            # The planning time, taken as the brokers are asked: every record appended
            # before it is in their answer (the processing-time watermark, observe_lags).
            now = now_ms()
        states, emitted_max = self.fold(start)
        previous = max(from_optional(start.watermark), emitted_max)
        # A (re)started query's topics must exist, as when it first started, except those
        # it has read before: their loss is failOnDataLoss's to judge.
        current = self.assigned(fail_if_missing=not self._checked,
                                read_before={t for t, _ in start.partitions}, ahead=ahead)
        if fixed:
            # A partition created during the run is read by the next run (from its earliest
            # offset), as Spark's source does: it is not in the run's target.
            planned = columns_of(start)
            if current != planned.tps:
                current = [tp for tp in current if tp in planned.index]
        self._checked = True
        begins = self._begins(start, current, previous)
        if ahead is not None and not ahead.ends.done():
            self._while_asked(start, states, begins, limits)
        if fixed:
            # Never below where a partition's next batch begins: a run's end that a leader
            # not yet caught up gave below what was read is nothing to read, not data loss
            # (the run's first planning judged the brokers' own answer, _monotone).
            target = self._target
            latest = {tp: max(target.get(tp, begin), begin) for tp, begin in begins.items()}
        else:
            latest = self._monotone(self.metadata.latest_offsets(list(begins), ahead),
                                    begins)
        for tp in [tp for tp, begin in begins.items() if latest[tp] < begin]:
            self._loss(tp, f"its end offset went back from {begins[tp]} to {latest[tp]} "
                           f"(topic recreated or truncated)")
            begins[tp] = self.metadata.earliest_offsets([tp])[tp]
        if latest != self.latest_seen:   # else the same object: reportLatestOffset's cache
            self.latest_seen = dict(latest)
        ends = dict(latest)
        target = self._target
        if target is not None:
            ends = _within(ends, begins, target)
        if not self.options.heartbeat and ends == begins:
            # Nothing new anywhere (a read limit only takes records away): no batch, and no
            # per-partition work. Spark asks again every few ms while a query idles (10 ms
            # apart under the default trigger), thousands of partitions each time.
            return None
        ends, held, admitted_marks = self._admit(begins, ends, states, limits, start)
        available = sum(ends.values()) - sum(map(begins.__getitem__, ends))
        if available == 0 and not self.options.heartbeat:
            return None
        if available and self._held_back(limits, available, now):
            return None
        # Clock-driven generators (timelag) take the planning time into their state, hence
        # into the offset: a replay sees the same time (DESIGN §13). The clock alone never
        # plans a batch, so heartbeat batches do not tick it.
        clocked = available and self._clock_plans()
        # The default policy decides nothing per partition: asked once, not 4,096 times.
        never_idle = isinstance(self.policy, idle.NeverIdle)
        tps = sorted(ends)
        folded = states.columns if isinstance(states, StateMap) else None
        if never_idle and not clocked and not held and folded is not None \
                and folded.tps == tps:
            # Every partition plans its folded state as it is, read at ``now`` if it has
            # records to read, counted and not held: its watermark is the one _admit saw.
            # The loop below, a column at a time (4,096 partitions a planning).
            planned_state, marks = self._planned_columns(folded, begins, ends, admitted_marks,
                                                         now)
            counted = marks
        else:
            planned: dict[TopicPartition, PartitionState] = {}
            marks = {}
            for tp in tps:
                folded_state = states.get(tp)
                base = folded_state or PartitionState(last_read_ms=now)
                if clocked:
                    base = self._clocked(base, now)
                # A held partition is paused on purpose, not idle: it counts as read.
                is_held = tp in held
                last_read = now if ends[tp] > begins[tp] or is_held else base.last_read_ms
                if base.last_read_ms != last_read or base.held != is_held:
                    base = base.updated(last_read_ms=last_read, held=is_held)
                if never_idle:
                    state = base if base.idle == idle.COUNT else base.updated(idle=idle.COUNT)
                else:
                    state = self._decide(tp, base, unread=latest[tp] - begins[tp], now=now)
                planned[tp] = state
                # A partition's watermark is its generator's and its advance's: unchanged
                # since _admit asked it unless the clock or an idle decision changed either.
                if folded_state is not None and state.generator is folded_state.generator \
                        and state.advanced_ms == folded_state.advanced_ms:
                    marks[tp] = admitted_marks[tp]
                else:
                    marks[tp] = self.partition_watermark(state)
            planned_state = {name: [getattr(planned[tp], name) for tp in tps]
                             for name in STATE_FIELDS}
            counted = {tp: marks[tp] for tp, state in planned.items()
                       if state.idle != idle.EXCLUDE}
        percentile = self.options.watermark.percentile
        watermark = emitted(previous, combined_watermark(list(counted.values()), percentile))
        begin = list(map(begins.__getitem__, tps))
        has_lag, lags = observe_lags(columns_of(start), start.planned_ms, tps, begin,
                                     _column_or(latest, tps, begin),
                                     list(marks.values()), now)
        partitions = RangeMap(OffsetColumns(tps, begin, list(map(ends.__getitem__, tps)),
                                            planned_state, has_lag, lags))
        holds = holder(counted, percentile)
        if available == 0:
            # Nothing to read, but the watermark the last batch's rows carried is behind what
            # its records (or an idle decision since) reached: one batch carries it (§10).
            # After a (re)start, also the watermark the checkpoint holds, once: Spark's
            # watermark tracker starts a run knowing no input's watermark and counts an input
            # without rows in the run as 0 under multipleWatermarkPolicy=min, so a join or
            # dedup whose other input still reads would stay at the watermark of before the
            # restart (the lagging-partition join lost its last outer rows that way).
            restarted = not self._planned and to_optional(watermark) is not None
            if watermark <= previous and not restarted:
                return None
            self._planned = True
            return self._with_marks(BatchOffset(to_optional(watermark), partitions,
                                                heartbeat=True, planned_ms=now, holder=holds),
                                    marks)
        self._planned = True
        self._last_trigger_ms = now
        return self._with_marks(BatchOffset(to_optional(watermark), partitions, planned_ms=now,
                                            holder=holds), marks)

    def _with_marks(self, offset: BatchOffset, marks: dict[TopicPartition, int]
                    ) -> BatchOffset:
        self._offset_marks = (offset, marks)
        return offset

    def _marks_of(self, offset: BatchOffset) -> dict[TopicPartition, int]:
        """Each partition's watermark at the start of ``offset``'s ranges."""
        if self._offset_marks is not None and self._offset_marks[0] is offset:
            return self._offset_marks[1]
        columns = columns_of(offset)
        return dict(zip(columns.tps, self.column_watermarks(columns)))

    def _monotone(self, latest: dict[TopicPartition, int], begins: dict[TopicPartition, int]
                  ) -> dict[TopicPartition, int]:
        """End offsets never below where the next batch begins unless the topic was
        recreated (DESIGN §20): a stale leader's answer (or one that has not caught up) is a
        wait, not data loss. The topic's id tells a recreated topic (at once); a log that
        stays shorter for ``kafkaConsumer.pollTimeoutMs`` under the same id (an unclean
        leader election, or a topic recreated while the query was down) is data loss then.
        Every other end offset passes unchanged."""
        topics = {t for t, _ in begins}
        unseen = topics - set(self._topic_ids)
        if unseen:
            self._topic_ids.update(self._ids(unseen))
        behind = [tp for tp, begin in begins.items() if latest[tp] < begin]
        # A topic whose id this process learns only now (a query (re)started from its
        # checkpoint) cannot show that it was recreated: ask its end offsets again for a
        # few seconds, the time a new leader's high watermark takes to catch up, and take
        # a log still shorter than what was read as a recreated topic (data loss, which
        # failOnDataLoss judges), not as a wait that would hold the query for
        # kafkaConsumer.pollTimeoutMs.
        fresh = [tp for tp in behind if tp[0] in unseen]
        deadline = time.monotonic() + BACKWARDS_RECHECK_S
        asked_again = False
        while fresh and time.monotonic() < deadline:
            time.sleep(0.5)
            again = self.metadata.latest_offsets(fresh)
            latest.update(again)
            asked_again = True
            fresh = [tp for tp in fresh if latest[tp] < begins[tp]]
        if asked_again:
            behind = [tp for tp, begin in begins.items() if latest[tp] < begin]
        for tp in fresh:
            self._behind_since[tp] = time.monotonic() - self.options.poll_timeout_ms / 1000
        now = time.monotonic()
        for tp in set(self._behind_since) - set(behind):
            del self._behind_since[tp]
        if not behind:
            return latest
        ids = self._ids({t for t, _ in behind})
        held = dict(latest)
        for tp in behind:
            before, current = self._topic_ids.get(tp[0]), ids.get(tp[0])
            if current is not None and before is not None and current != before:
                self._topic_ids[tp[0]] = current
                continue  # recreated: data loss, at once
            since = self._behind_since.setdefault(tp, now)
            if (now - since) * 1000 >= self.options.poll_timeout_ms:
                continue  # shorter for too long: data loss
            self._warn_rarely(f"behind {tp}", (
                f"topic {tp[0]}, partition {tp[1]}: the broker reported end offset "
                f"{latest[tp]}, below {begins[tp]} already read, and the topic was not "
                f"recreated: a leader that has not caught up answered; waiting (data loss "
                f"only if it lasts kafkaConsumer.pollTimeoutMs="
                f"{self.options.poll_timeout_ms})"))
            held[tp] = begins[tp]
        return held

    def _ids(self, topics: set[str]) -> dict[str, str]:
        """Topic ids, or none where the brokers cannot tell (a broker without topic ids, a
        principal without DESCRIBE): then a backwards end is judged by time alone."""
        try:
            return self.metadata.topic_ids(topics)
        except BrokerError as exc:
            log.debug("no topic ids for %s: %s", sorted(topics), exc)
            return {}

    def _clock_plans(self) -> bool:
        """Whether the generator takes the planning time (most take none: then no state is
        restored per partition)."""
        if self._plans_clock is None:
            self._plans_clock = plan_generator(make_generator(self.options.watermark),
                                               now_ms())
        return self._plans_clock

    def _clocked(self, state: PartitionState, now: int) -> PartitionState:
        """``state`` with its generator told the planning time (only where
        ``_clock_plans()``)."""
        generator = restore_generator(self.options.watermark, state.generator)
        if not plan_generator(generator, now):
            return state
        return state.updated(generator=generator.snapshot())

    def _begins(self, start: BatchOffset, current: list[TopicPartition], previous: int
                ) -> dict[TopicPartition, int]:
        columns = columns_of(start)
        if columns.tps == current:   # the same partitions as before (one pass, no set)
            return dict(zip(columns.tps, columns.end))
        known = set(current)
        for tp in sorted(set(start.partitions) - known):
            self._loss(tp, "the partition is gone (topic deleted or unsubscribed)")
        begins = {tp: end for tp, end in zip(columns.tps, columns.end) if tp in known}
        rows = columns.index
        new = [tp for tp in current if tp not in rows]
        if new:
            firsts = self.metadata.earliest_offsets(new)
            begins.update(firsts)
            self._announce_joined(firsts, previous)
        return begins

    def _announce_joined(self, firsts: dict[TopicPartition, int], previous: int) -> None:
        """One line per join (a new partition, a new ``subscribePattern`` match): which, from
        where, and what happens to its rows. The combined watermark never goes back (§2), so
        a partition that joins behind it has its early records judged against it. Latest
        offset is asked every few ms until a batch takes the partitions in: say it once."""
        fresh = {tp: o for tp, o in sorted(firsts.items()) if tp not in self._announced}
        if not fresh:
            return
        self._announced.update(fresh)
        joined = ", ".join(f"topic {t} partition {p} from offset {o}"
                           for (t, p), o in fresh.items())
        mark = to_optional(previous)
        if mark is None:
            log.info("%s joined the query, read from the earliest offset; the combined "
                     "watermark is undefined, so none of its records can be late", joined)
            return
        lateness = self.options.allowed_lateness_ms
        treatment = {
            "keep": "kept as ordinary rows (lateRecords=keep: their watermark column is above "
                    "their event time)",
            "flag": "flagged is_late=true (lateRecords=flag)",
            "drop": "dropped (lateRecords=drop)",
        }[self.options.late_records]
        log.warning(
            "%s joined the running query, read from the earliest offset, while the combined "
            "watermark is %d (%s); the watermark never goes back, so its records with event "
            "time <= %d (watermark - allowedLateness %d ms) are late and %s",
            joined, mark, _utc(mark), mark - lateness, lateness, treatment)

    def _while_asked(self, start: BatchOffset, states: Mapping[TopicPartition, PartitionState],
                     begins: dict[TopicPartition, int], limits: ReadLimits) -> None:
        """The planning's work that needs no end offset, done while the brokers answer
        (the lookup takes ~30 ms at 4,096 partitions inside Spark's planning process):
        each partition's watermark and the read limit's inputs."""
        self._state_marks(start, states, begins)
        if limits.max_rows is not None:
            self._limit_inputs(start, states, begins)

    def _planned_columns(self, folded: OffsetColumns, begins: dict[TopicPartition, int],
                         ends: dict[TopicPartition, int], admitted: dict[TopicPartition, int],
                         now: int) -> tuple[dict[str, list], dict[TopicPartition, int]]:
        """The planned state columns and each partition's watermark where every partition
        of ``folded`` plans its folded state, read at ``now`` if it has records to read
        (``begins`` to ``ends``), counted and not held (the default idle policy, no clock,
        nothing held by alignment): its watermark is the one ``_admit`` saw."""
        tps = folded.tps
        n = len(tps)
        state = dict(folded.state)
        state["last_read_ms"] = [now if ends[tp] > begins[tp] else last for tp, last
                                 in zip(tps, folded.state["last_read_ms"])]
        state["idle"] = [idle.COUNT] * n
        state["held"] = [False] * n
        return state, dict(zip(tps, map(admitted.__getitem__, tps)))

    def _admit(self, begins: dict[TopicPartition, int], ends: dict[TopicPartition, int],
               states: dict[TopicPartition, PartitionState], limits: ReadLimits,
               start: BatchOffset
               ) -> tuple[dict[TopicPartition, int], set[TopicPartition], dict[TopicPartition, int]]:
        """What each partition may read this trigger (DESIGN §11): watermark alignment pauses
        the partitions too far ahead, then the read limit raises the lowest watermarks first,
        together, by each partition's pace in the batch that ended at ``start``, without
        starving anyone. Returns the ends, the paused partitions and each partition's
        watermark before this trigger."""
        marks, counted = self._state_marks(start, states, ends)
        held: set[TopicPartition] = set()
        drift = self.options.alignment_max_drift_ms
        if drift is not None:
            readable = {tp: ends[tp] - begins[tp] for tp in ends}
            held = held_by_alignment(marks, readable, counted, drift)
            if held:
                self._log_held(held, marks, readable, counted)
                ends = {tp: begins[tp] if tp in held else end for tp, end in ends.items()}
        if limits.max_rows is not None:
            # Excluded partitions hold nothing: after every counted one.
            order, priority, densities = self._limit_inputs(start, states, ends)
            limited = rate_limit_rows(_column(begins, order), _column(ends, order),
                                      limits.max_rows, priority, densities)
            ends = dict(zip(order, limited.tolist()))
        return ends, held, marks

    def _limit_inputs(self, start: BatchOffset, states: dict[TopicPartition, PartitionState],
                      tps: dict[TopicPartition, int]
                      ) -> tuple[list[TopicPartition], np.ndarray, np.ndarray | None]:
        """The read limit's rows (``tps`` in (topic, partition) order), their priority (each
        partition's watermark; excluded ones after every counted one) and each watermark
        holder's density, for ``_state_marks(start, states, tps)``: computed once for those
        marks, as columns (4,096 partitions a planning). Callers do not change them."""
        marks, counted = self._state_marks(start, states, tps)
        known = self._start_limits
        if known is not None and known[0] is marks:
            return known[1:]
        order = sorted(marks)
        mark_rows = _column(marks, order)
        counted_rows = np.fromiter(map(counted.__getitem__, order), dtype=bool, count=len(order))
        priority = np.where(counted_rows, mark_rows, NO_PARTITIONS)
        lowest = self.lowest_events(start)
        if columns_of(start).tps == order:
            found = np.array(density_rows(start, states, lowest), dtype=np.float64)
        else:   # partitions joined or left since
            known = read_densities(start, states, lowest)
            found = np.fromiter((known.get(tp, math.nan) for tp in order), dtype=np.float64,
                                count=len(order))
        densities = fill_densities(found, counted_rows & (mark_rows != UNDEFINED))
        self._start_limits = (marks, order, priority, densities)
        return order, priority, densities

    def _state_marks(self, start: BatchOffset, states: dict[TopicPartition, PartitionState],
                     tps: dict[TopicPartition, int]
                     ) -> tuple[dict[TopicPartition, int], dict[TopicPartition, bool]]:
        """Each of ``tps``' watermark and whether it counts, from its state folded from
        ``start`` (``states``; a partition new to the query has a fresh one): computed once
        per start and set of partitions (Spark asks again and again while nothing is new).
        Callers do not change them."""
        known = self._start_marks
        if known is not None and known[0] is start and known[1].keys() == tps.keys():
            return known[1], known[2]
        columns = states.columns if isinstance(states, StateMap) else None
        if columns is not None and tps.keys() == columns.index.keys():
            marks = dict(zip(columns.tps, self.column_watermarks(columns)))
            counted = dict(zip(columns.tps, [decision != idle.EXCLUDE
                                             for decision in columns.state["idle"]]))
        else:
            marks, counted = {}, {}
            fresh = PartitionState()
            for tp in tps:
                state = states.get(tp) or fresh
                marks[tp] = self.partition_watermark(state)
                counted[tp] = state.idle != idle.EXCLUDE
        self._start_marks = (start, marks, counted)
        return marks, counted

    def _log_held(self, held: set[TopicPartition], marks: dict[TopicPartition, int],
                  readable: dict[TopicPartition, int], counted: dict[TopicPartition, bool]
                  ) -> None:
        floor = min(marks[tp] for tp in readable if readable[tp] > 0 and counted[tp])
        log.info(
            "watermark alignment (watermark.alignment.maxDrift=%d ms): holding %s, more than "
            "maxDrift above the alignment floor %s; they read nothing this trigger",
            self.options.alignment_max_drift_ms,
            ", ".join(f"topic {t} partition {p} (watermark {to_optional(marks[(t, p)])}, "
                      f"{readable[(t, p)]} unread)" for t, p in sorted(held)),
            to_optional(floor))

    def _held_back(self, limits: ReadLimits, available: int, now: int) -> bool:
        """``minOffsetsPerTrigger``: wait for more records, at most ``maxTriggerDelay``."""
        minimum = self.options.min_offsets_per_trigger
        if not limits.respect_minimum or minimum is None or self._target is not None:
            return False
        if self._last_trigger_ms is None:
            self._last_trigger_ms = now
        waited = now - self._last_trigger_ms
        return available < minimum and waited < self.options.max_trigger_delay_ms

    def _decide(self, tp: TopicPartition, state: PartitionState, unread: int, now: int
                ) -> PartitionState:
        view = idle.PartitionView(
            topic=tp[0], partition=tp[1],
            watermark_ms=to_optional(self.partition_watermark(state)),
            max_event_time_ms=state.max_event_ms, unread=unread,
            last_read_ms=state.last_read_ms, idle=state.idle, held=state.held)
        decision = idle.decide(self.policy, view, now)
        if isinstance(decision, int):
            advanced = max(decision, from_optional(state.advanced_ms))
            return state.updated(idle=idle.ADVANCE, advanced_ms=advanced)
        return state.updated(idle=decision)

    def _loss(self, tp: TopicPartition, detail: str) -> None:
        message = f"topic {tp[0]}, partition {tp[1]}: {detail}"
        if self.options.fail_on_data_loss:
            raise DataLossError(f"{message}. Set failOnDataLoss=false to continue with a "
                                f"warning.")
        log.warning("data loss (failOnDataLoss=false): %s; the query continues", message)

    def partition_watermark(self, state: PartitionState) -> int:
        mark = self._mark_of_snapshot()(state.generator)
        advanced = state.advanced_ms
        return mark if advanced is None or advanced <= mark else advanced

    def column_watermarks(self, columns: OffsetColumns) -> list[int]:
        """``partition_watermark`` of each partition of ``columns``, in its order."""
        if self._snapshot_marks is None:
            self._snapshot_marks = (snapshot_watermarks(self.options.watermark)
                                    or (lambda snapshots: list(map(self._restored_mark,
                                                                   snapshots))))
        marks = self._snapshot_marks(columns.state["generator"])
        advanced_of = columns.state["advanced_ms"]
        if advanced_of.count(None) == len(advanced_of):   # no idle policy has advanced one
            return marks
        return [mark if advanced is None or advanced <= mark else advanced
                for mark, advanced in zip(marks, advanced_of)]

    def _mark_of_snapshot(self):
        if self._snapshot_mark is None:
            self._snapshot_mark = (snapshot_watermark(self.options.watermark)
                                   or self._restored_mark)
        return self._snapshot_mark

    def _restored_mark(self, snapshot: object) -> int:
        # A plug-in generator's watermark is a function of its snapshot, asked for several
        # times per partition and batch: restored once per snapshot (kept alive here, so its
        # id is not reused while cached; the cache is emptied at each planning).
        known = self._marks.get(id(snapshot))
        if known is None or known[0] is not snapshot:
            known = (snapshot, current_ms(restore_generator(self.options.watermark, snapshot)))
            self._marks[id(snapshot)] = known
        return known[1]

    # -- tasks and folding -----------------------------------------------------------

    def tasks(self, offset: BatchOffset) -> list[RangeTask]:
        """The Spark tasks of the batch that ends at ``offset``; a pure function of it."""
        return list(self._tasks_and_packs(offset)[0].tasks)

    def _tasks_and_packs(self, offset: BatchOffset) -> tuple[TaskColumns, list[TaskColumns]]:
        """``offset``'s ranges and their packs, as columns (``TaskColumns``: no RangeTask
        object a range unless one is asked for), computed once per offset: Spark planning
        the batch (``packed_tasks``) and the next planning folding it (``fold``) hand over
        the same offset object (``offset`` parses each JSON once). Callers do not change
        them."""
        if self._tasks is None or self._tasks[0] is not offset:
            tasks = self._plan_tasks(offset)
            self._tasks = (offset, tasks, self._packs(tasks))
        return self._tasks[1], self._tasks[2]

    def _plan_tasks(self, offset: BatchOffset) -> TaskColumns:
        marks = self._marks_of(offset)
        columns = columns_of(offset)
        tps, starts, ends = columns.tps, columns.start, columns.end
        counted = [decision != idle.EXCLUDE for decision in columns.state["idle"]]
        lowest = heapq.nsmallest(2, [(marks[tp], tp) for tp, is_counted in zip(tps, counted)
                                     if is_counted])
        percentile = self.options.watermark.percentile
        bounds = (row_bounds(marks, {tp for tp, c in zip(tps, counted) if c}, percentile)
                  if percentile != "100" else None)
        # The lowest counted partition's watermark caps every other partition's rows; its
        # own rows are capped by the second lowest (NO_PARTITIONS: none other counts).
        first_mark, first_owner = lowest[0] if lowest else (NO_PARTITIONS, None)
        second_mark = lowest[1][0] if len(lowest) > 1 else NO_PARTITIONS
        nonempty = [row for row, (start, end) in enumerate(zip(starts, ends)) if end > start]
        if self._may_split(starts, ends, nonempty):
            splits = plan_splits({tps[row]: (starts[row], ends[row]) for row in nonempty},
                                 self.options.min_partitions,
                                 self.options.max_records_per_partition, True)
            pieces = [(row, piece) for row in nonempty for piece in splits[tps[row]]]
            rows = [row for row, _ in pieces]
            task_starts = [start for _, (start, _) in pieces]
            task_ends = [end for _, (_, end) in pieces]
        else:   # a range a partition that reads (thousands of partitions: no dict of them)
            rows = nonempty
            task_starts = [starts[row] for row in rows]
            task_ends = [ends[row] for row in rows]
        if bounds is not None:
            floors = [to_optional(bounds[tps[row]][0]) for row in rows]
            ceilings = [bounds[tps[row]][1] for row in rows]
        else:
            floors = [None] * len(rows)
            owner = None if first_owner is None else columns.index[first_owner]
            ceilings = [second_mark if row == owner else first_mark for row in rows]
        task_tps = [tps[row] for row in rows]
        states = {name: list(map(column.__getitem__, rows))
                  for name, column in columns.state.items()}
        return TaskColumns.planned([tp[0] for tp in task_tps], [tp[1] for tp in task_tps],
                                   task_starts, task_ends, states,
                                   [counted[row] for row in rows], offset.watermark,
                                   ceilings, floors)

    def _may_split(self, starts: list[int], ends: list[int], nonempty: list[int]) -> bool:
        """Whether ``plan_splits`` could cut a range of the batch (``minPartitions``,
        ``maxRecordsPerPartition``, a generator that can merge sub-ranges' states)."""
        options = self.options
        if not nonempty or not can_split(make_generator(options.watermark)):
            return False
        most = options.max_records_per_partition
        if most and any(ends[row] - starts[row] > most for row in nonempty):
            return True
        return bool(options.min_partitions) and len(nonempty) < options.min_partitions

    @_exclusive
    def packed_tasks(self, offset: BatchOffset) -> list[TaskColumns]:
        """The ranges of ``tasks(offset)`` grouped into Spark tasks (``minRecordsPerPartition``,
        DESIGN §12). Packing changes which task reads a range, never the range's rows or
        progress record; a pack's records are stored together, which ``fold`` finds under the
        same packing (a pure function of the offset and the options)."""
        packs = self._tasks_and_packs(offset)[1]
        if self._may_hold is not None:
            # where a pack's file goes
            self._may_hold.update((pack.topic[0], pack.partition[0]) for pack in packs)
        return packs

    @_exclusive
    def pack_keys(self, offset: BatchOffset) -> list[str | None]:
        """The ledger key of each of ``packed_tasks(offset)`` (``ledger.pack_keys``): the
        tasks write their packs' records under them, the next planning's ``fold`` finds
        them there. All None when no pack holds more than one range (each range's record
        has its own key)."""
        if self._keys is None or self._keys[0] is not offset:
            self._keys = (offset, self._keys_of(offset, self._tasks_and_packs(offset)[1],
                                                PACKING))
        return self._keys[1]

    def _keys_of(self, offset: BatchOffset, packs: list[TaskColumns], packing: int
                 ) -> list[str | None]:
        """``packs``' ledger keys under the packing rule ``packing`` (``offsets.PACKING``);
        rule 1's are the keys kwatermark wrote before the rule was part of them."""
        if not any(len(pack) > 1 for pack in packs):
            return [None] * len(packs)
        options = (self.options.min_records_per_partition, self.options.min_partitions,
                   self.options.max_records_per_partition)
        if packing >= 2:
            options += (packing,)
        return pack_keys(self._json_of(offset), self.fingerprint, options, len(packs))

    def _json_of(self, offset: BatchOffset) -> dict:
        """The JSON Spark logged for ``offset`` (the dict it came from, or the one written
        for it), so the driver that planned a batch and one restarted from its checkpoint
        hash the same document."""
        for known_json, known in self._known:
            if known is offset:
                return known_json
        return offset.to_json()

    def _packs(self, tasks: TaskColumns, packing: int = PACKING) -> list[TaskColumns]:
        bounds = pack_bounds([end - start for start, end in zip(tasks.start, tasks.end)],
                             self.options.min_records_per_partition,
                             self.options.min_partitions,
                             self.options.max_records_per_partition, packing)
        return [tasks.rows(low, high) for low, high in bounds]

    def _records_of(self, packs: list[TaskColumns], keys: list[str | None],
                    wanted: set[int] | None = None) -> list[tuple | None]:
        """Each range's record as (generator, min event, max event, max row watermark), in
        offset order, read from its pack's file (``ledger.publish_pack``: columns, no record
        object a range) or, where that is not there, its own (a record recomputed here, or
        packed otherwise); None where neither is. With ``wanted`` (rows), only the packs
        holding one of those rows are looked up."""
        found: list[tuple | None] = []
        for pack, key in zip(packs, keys):
            row = len(found)
            if wanted is not None and not any(r in wanted for r in range(row, row + len(pack))):
                found += [None] * len(pack)
                continue
            columns = (self.ledger.lookup_pack_columns(pack, self.fingerprint, key)
                       if len(pack) > 1 else None)
            if columns is not None:
                found += zip(*map(columns.__getitem__, _FOLDED_FIELDS))
            else:
                found += [_folded_fields(self.ledger.lookup(task, self.fingerprint))
                          for task in pack]
        return found

    def fold(self, offset: BatchOffset, recompute: bool = True
             ) -> tuple[Mapping[TopicPartition, PartitionState], int] | None:
        """Each partition's state at ``to`` of the batch ending at ``offset``, and the highest
        watermark any row of that batch carried. Without ``recompute``, None (and nothing
        kept) when a range's progress is not published yet."""
        if self._folded is not None and (self._folded[0] is offset
                                         or self._folded[0] == offset):
            return self._folded[1], self._folded[2]
        tasks, packs = self._tasks_and_packs(offset)
        found = self._records_of(packs, self.pack_keys(offset))
        if None in found and not recompute:
            return None
        if None in found:
            # A batch planned by kwatermark's packing rule before (a query upgraded between
            # batches): its tasks wrote their packs' files under that rule's packs and keys.
            # (A pack lost otherwise is looked for there too, in vain, then recomputed.)
            wanted = {row for row, record in enumerate(found) if record is None}
            legacy = self._packs(tasks, packing=1)
            again = self._records_of(legacy, self._keys_of(offset, legacy, 1), wanted)
            found = [record if record is not None else other
                     for record, other in zip(found, again)]
        missing = [tasks[row] for row, record in enumerate(found) if record is None]
        if missing:
            recomputed = iter(self._recompute(missing))
            found = [record or _folded_fields(next(recomputed)) for record in found]
            log.warning("recomputed %d of %d ranges of the last batch on the driver: their "
                        "progress records were not in watermark.stateLocation=%s (on a "
                        "cluster, set it to a location every executor can write)",
                        len(missing), len(tasks), self.options.state_location)
        # A partition's record, or its sub-ranges' records in offset order (minPartitions,
        # maxRecordsPerPartition): one record alone is the common case, thousands of times
        # per batch, and no list.
        records: dict[TopicPartition, tuple | list[tuple]] = dict(
            zip(zip(tasks.topic, tasks.partition), found))
        if len(records) != len(found):
            records = {}
            for tp, record in zip(zip(tasks.topic, tasks.partition), found):
                before = records.get(tp)
                if before is None:
                    records[tp] = record
                elif type(before) is list:
                    before.append(record)
                else:
                    records[tp] = [before, record]
        columns = columns_of(offset)
        generators = list(columns.state["generator"])
        max_events = list(columns.state["max_event_ms"])
        rows = columns.index
        highest = UNDEFINED
        lowest = {}
        for tp, done in records.items():
            row = rows[tp]
            if type(done) is not list:
                snapshot, first, last, row_mark = done
            else:
                generator = restore_generator(self.options.watermark, generators[row])
                for record in done:
                    generator.merge(record[0])
                snapshot = generator.snapshot()
                first = min((d[1] for d in done if d[1] is not None), default=None)
                last = max((d[2] for d in done if d[2] is not None), default=None)
                row_mark = max((d[3] for d in done if d[3] is not None), default=None)
            if first is not None:
                lowest[tp] = first
            before = max_events[row]
            if last is None or (before is not None and before > last):
                last = before
            generators[row] = snapshot
            max_events[row] = last
            if row_mark is not None and row_mark > highest:
                highest = row_mark
        states = StateMap(OffsetColumns(
            columns.tps, columns.start, columns.end,
            {**columns.state, "generator": generators, "max_event_ms": max_events},
            columns.has_lag, columns.lag))
        if offset.heartbeat:
            highest = from_optional(offset.watermark)
        self._folded = (offset, states, highest, lowest)
        return states, highest

    def lowest_events(self, offset: BatchOffset) -> dict[TopicPartition, int]:
        """The lowest event time each partition read in the batch ending at ``offset``."""
        self.fold(offset)
        return self._folded[3]

    def _recompute(self, tasks: list[RangeTask]) -> list[ProgressRecord]:
        """The progress records of ranges whose records are missing, by reading them here,
        all with one consumer as a Spark task reads a pack (512 ranges one at a time would
        open 512 consumers)."""
        for task in tasks:
            log.info(
                "progress record for topic %s partition %s offsets [%d, %d) is missing from "
                "watermark.stateLocation=%s (task cut short, or no shared location); "
                "recomputing it by reading the range on the driver", task.topic,
                task.partition, task.start, task.end, self.options.state_location)
        pack = PackReader(self.options, self.layout, self.decoders, tasks)
        for _ in pack:
            pass
        for task, record in pack.progress:
            self.ledger.publish(task, self.fingerprint, record)
            if self._may_hold is not None:
                self._may_hold.add(task.tp)
        return [record for _, record in pack.progress]

    @_exclusive
    def commit(self, end: BatchOffset) -> None:
        """Delete the progress records no batch after ``end`` needs. The first commit of a
        run looks in every partition's directory (records of an earlier run); later ones only
        where this run's tasks or recomputes wrote since, not in thousands of directories
        that hold nothing."""
        columns = columns_of(end)
        rows = columns.index
        look = columns.tps if self._may_hold is None else [tp for tp in self._may_hold
                                                          if tp in rows]
        holding = set()
        for tp in look:
            if self.ledger.forget_before(tp[0], tp[1], columns.start[rows[tp]]):
                holding.add(tp)
        self._may_hold = holding

    # -- batch -----------------------------------------------------------------------

    def batch_offset(self) -> BatchOffset:
        """A batch read is one micro-batch that starts with no state (DESIGN §4)."""
        tps = self.assigned(fail_if_missing=True)
        starts = self.resolve(self.options.starting, tps, "startingOffsets")
        ends = self.resolve(self.options.ending, tps, "endingOffsets")
        for tp in tps:
            if ends[tp] < starts[tp]:
                raise OptionError(f"topic {tp[0]} partition {tp[1]}: endingOffsets {ends[tp]} "
                                  f"is before startingOffsets {starts[tp]}")
        return BatchOffset(None, {tp: PartitionRange(starts[tp], ends[tp]) for tp in tps})
