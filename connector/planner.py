"""The driver's side of the progress model (DESIGN §4): fold the progress of the batch that
just ran into each partition's state, ask the brokers what is new, apply read limits and
idle decisions, and write it all into the next offset."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

from kwatermark import idle
from kwatermark.arrow import OutputLayout
from kwatermark.broker import KafkaMetadata
from kwatermark.errors import DataLossError, OptionError
from kwatermark.ledger import ProgressLedger, ProgressRecord
from kwatermark.offsets import (
    BatchOffset,
    PartitionRange,
    PartitionState,
    RangeTask,
    TopicPartition,
    plan_splits,
    rate_limit,
)
from kwatermark.options import EARLIEST, LATEST, OffsetBound, SourceOptions
from kwatermark.reader import Decoders, RangeReader
from kwatermark.watermarks import (
    NO_PARTITIONS,
    UNDEFINED,
    can_split,
    combined_watermark,
    current_ms,
    emitted,
    from_optional,
    make_generator,
    restore_generator,
    to_optional,
)

log = logging.getLogger("kwatermark.planner")


# A stream waiting for a missing topic says so at once, then at most this often.
MISSING_WARNING_EVERY_MS = 10 * 60_000


def now_ms() -> int:
    return int(time.time() * 1000)


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
        self._folded: dict[str, tuple[dict[TopicPartition, PartitionState], int]] = {}
        self._target: dict[TopicPartition, int] | None = None
        self._last_trigger_ms: int | None = None
        self._warned: dict[str, float] = {}

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.update(_policy=None, _folded={})
        return state

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

    def assigned(self, fail_if_missing: bool = False) -> list[TopicPartition]:
        """The partitions to read. A ``subscribe``/``assign`` topic (or assigned partition)
        that does not exist is an error with ``fail_if_missing`` (a batch read; a stream's
        first offsets under ``assign``). Otherwise a subscribed topic that does not exist yet,
        or a pattern matching nothing, is a warning logged at most every
        MISSING_WARNING_EVERY_MS while the stream waits for it (Spark's semantics), and an
        assigned partition that disappeared is data loss (``_begins``)."""
        subscription = self.options.subscription
        tps, missing = self.metadata.coverage(subscription)
        if missing and fail_if_missing:
            raise OptionError(
                f"option {subscription.kind}: {', '.join(missing)} does not exist on "
                f"kafka.bootstrap.servers={self.options.bootstrap_servers!r}")
        if subscription.kind != "assign" and (missing or not tps):
            what = (f"option subscribe: {', '.join(missing)} does not exist (yet)" if missing
                    else f"option subscribePattern: {subscription.pattern!r} matches no topic")
            self._warn_rarely(what, f"{what} on kafka.bootstrap.servers="
                              f"{self.options.bootstrap_servers!r}; nothing is read from it "
                              f"until it is created")
        return tps

    def _warn_rarely(self, key: str, message: str) -> None:
        now = time.monotonic()
        last = self._warned.get(key)
        if last is None or (now - last) * 1000 >= MISSING_WARNING_EVERY_MS:
            self._warned[key] = now
            log.warning("%s", message)

    # -- streaming -------------------------------------------------------------------

    def initial_offset(self) -> BatchOffset:
        tps = self.assigned(fail_if_missing=self.options.subscription.kind == "assign")
        positions = self.resolve(self.options.starting, tps, "startingOffsets")
        first_seen = now_ms()
        return BatchOffset(None, {tp: PartitionRange(o, o, PartitionState(last_read_ms=first_seen))
                                  for tp, o in positions.items()})

    def prepare_available_now(self) -> None:
        """Fix the end of an AvailableNow run: nothing produced later is read."""
        self._target = self.metadata.latest_offsets(self.assigned())

    def latest_offset(self, start: BatchOffset, limits: ReadLimits) -> BatchOffset | None:
        """The next batch's end offset, or None when there is nothing new to read."""
        states, emitted_max = self.fold(start)
        current = self.assigned()
        begins = self._begins(start, current)
        latest = self.metadata.latest_offsets(list(begins))
        for tp, begin in list(begins.items()):
            if latest[tp] < begin:
                self._loss(tp, f"its end offset went back from {begin} to {latest[tp]} "
                               f"(topic recreated or truncated)")
                begins[tp] = self.metadata.earliest_offsets([tp])[tp]
        ends = dict(latest)
        if self._target is not None:
            ends = {tp: min(end, self._target.get(tp, begins[tp])) for tp, end in ends.items()}
            ends = {tp: max(end, begins[tp]) for tp, end in ends.items()}
        if limits.max_rows is not None:
            ends = rate_limit(begins, ends, limits.max_rows)
        available = sum(ends[tp] - begins[tp] for tp in ends)
        if available == 0 and not self.options.heartbeat:
            return None
        now = now_ms()
        if available and self._held_back(limits, available, now):
            return None
        partitions = {}
        for tp in sorted(ends):
            base = states.get(tp) or PartitionState(last_read_ms=now)
            planned = ends[tp] > begins[tp]
            state = self._decide(tp, replace(base, last_read_ms=now if planned
                                             else base.last_read_ms),
                                 unread=latest[tp] - begins[tp], now=now)
            partitions[tp] = PartitionRange(begins[tp], ends[tp], state)
        counted = [self.partition_watermark(r.state) for r in partitions.values()
                   if r.state.idle != idle.EXCLUDE]
        previous = max(from_optional(start.watermark), emitted_max)
        watermark = emitted(previous, combined_watermark(counted))
        if available == 0:
            # Nothing to read, but the watermark the last batch's rows carried is behind what
            # its records (or an idle decision since) reached: one batch carries it (§10).
            return (BatchOffset(to_optional(watermark), partitions, heartbeat=True)
                    if watermark > previous else None)
        self._last_trigger_ms = now
        return BatchOffset(to_optional(watermark), partitions)

    def _begins(self, start: BatchOffset, current: list[TopicPartition]
                ) -> dict[TopicPartition, int]:
        known = set(current)
        for tp in sorted(set(start.partitions) - known):
            self._loss(tp, "the partition is gone (topic deleted or unsubscribed)")
        begins = {tp: r.end for tp, r in start.partitions.items() if tp in known}
        new = [tp for tp in current if tp not in start.partitions]
        if new:
            log.info("new partitions %s are read from their earliest offsets", new)
            begins.update(self.metadata.earliest_offsets(new))
        return begins

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
            last_read_ms=state.last_read_ms, idle=state.idle)
        decision = idle.decide(self.policy, view, now)
        if isinstance(decision, int):
            advanced = max(decision, from_optional(state.advanced_ms))
            return replace(state, idle=idle.ADVANCE, advanced_ms=advanced)
        return replace(state, idle=decision)

    def _loss(self, tp: TopicPartition, detail: str) -> None:
        message = (f"topic {tp[0]}, partition {tp[1]}: {detail}. Set failOnDataLoss=false to "
                   f"continue with a warning.")
        if self.options.fail_on_data_loss:
            raise DataLossError(message)
        log.warning("data loss (failOnDataLoss=false): %s", message)

    def partition_watermark(self, state: PartitionState) -> int:
        generator = restore_generator(self.options.watermark, state.generator)
        return max(current_ms(generator), from_optional(state.advanced_ms))

    # -- tasks and folding -----------------------------------------------------------

    def tasks(self, offset: BatchOffset) -> list[RangeTask]:
        """The Spark tasks of the batch that ends at ``offset``; a pure function of it."""
        marks = {tp: self.partition_watermark(r.state) for tp, r in offset.partitions.items()}
        counted = {tp: r.state.idle != idle.EXCLUDE for tp, r in offset.partitions.items()}
        lowest = sorted((marks[tp], tp) for tp in marks if counted[tp])[:2]
        splits = plan_splits({tp: (r.start, r.end) for tp, r in offset.partitions.items()},
                             self.options.min_partitions,
                             self.options.max_records_per_partition,
                             can_split(make_generator(self.options.watermark)))
        tasks = []
        for tp, pieces in sorted(splits.items()):
            others = [m for m, owner in lowest if owner != tp][:1]
            for start, end in pieces:
                tasks.append(RangeTask(
                    tp[0], tp[1], start, end, offset.partitions[tp].state, counted[tp],
                    offset.watermark, others[0] if others else NO_PARTITIONS))
        return tasks

    def fold(self, offset: BatchOffset) -> tuple[dict[TopicPartition, PartitionState], int]:
        """Each partition's state at ``to`` of the batch ending at ``offset``, and the highest
        watermark any row of that batch carried."""
        key = offset.dumps()
        if key in self._folded:
            return self._folded[key]
        records: dict[TopicPartition, list[ProgressRecord]] = {}
        tasks = self.tasks(offset)
        recomputed = 0
        for task in tasks:
            record = self.ledger.lookup(task, self.fingerprint)
            if record is None:
                record = self._recompute(task)
                recomputed += 1
            records.setdefault(task.tp, []).append(record)
        if recomputed:
            log.warning("recomputed %d of %d ranges of the last batch on the driver: their "
                        "progress records were not in watermark.stateLocation=%s (on a "
                        "cluster, set it to a location every executor can write)", recomputed,
                        len(tasks), self.options.state_location)
        states = {}
        highest = UNDEFINED
        for tp, r in offset.partitions.items():
            done = records.get(tp)
            if not done:
                states[tp] = r.state
                continue
            if len(done) == 1:
                snapshot = done[0].generator
            else:
                generator = restore_generator(self.options.watermark, r.state.generator)
                for record in done:
                    generator.merge(record.generator)
                snapshot = generator.snapshot()
            events = [e for e in [r.state.max_event_ms] + [d.max_event_ms for d in done]
                      if e is not None]
            states[tp] = replace(r.state, generator=snapshot,
                                 max_event_ms=max(events) if events else None)
            highest = max([highest] + [from_optional(d.max_row_watermark) for d in done])
        if offset.heartbeat:
            highest = from_optional(offset.watermark)
        self._folded = {key: (states, highest)}
        return states, highest

    def _recompute(self, task: RangeTask) -> ProgressRecord:
        log.info(
            "progress record for topic %s partition %s offsets [%d, %d) is missing from "
            "watermark.stateLocation=%s (task cut short, or no shared location); recomputing "
            "it by reading the range on the driver", task.topic, task.partition, task.start,
            task.end, self.options.state_location)
        reader = RangeReader(self.options, self.layout, self.decoders, task)
        for _ in reader:
            pass
        self.ledger.publish(task, self.fingerprint, reader.progress)
        return reader.progress

    def commit(self, end: BatchOffset) -> None:
        for (topic, partition), r in end.partitions.items():
            self.ledger.forget_before(topic, partition, r.start)

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
