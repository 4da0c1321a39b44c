"""A packed task (DESIGN §12): several ranges, of many partitions, read by one Spark task
with one consumer, each range keeping its own ``RangeReader`` state, rows and progress."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
from confluent_kafka import Consumer, KafkaError
from confluent_kafka import TopicPartition as KafkaTP

from kwatermark import arrow, compiled
from kwatermark.compiled import CompiledReader, use_compiled
from kwatermark.consumer import (
    MAX_CONSUME,
    close_aside,
    learn_topics,
    open_consumer,
    partition_bounds,
)
from kwatermark.errors import BrokerError
from kwatermark.faults import FAULT_ENV, fault_point, trip_fault
from kwatermark.ledger import ProgressRecord, record_columns, records_of_columns
from kwatermark.offsets import RangeTask, TaskColumns
from kwatermark.options import SourceOptions
from kwatermark.range_end import Stall, advance, done, short
from kwatermark.reader import Computed, Decoders, RangeReader, assemble, header_pairs
from kwatermark.records import RecordBlock
from kwatermark.retries import transient
from kwatermark.security import refusal_hint


class _Pending:
    """One range of a pack while it is being read: its reader and the messages not yet
    turned into a block."""

    def __init__(self, reader: RangeReader, start: int, end: int, with_headers: bool):
        self.reader = reader
        self.position = start
        self.end = end
        self.fault = fault_point(reader.task)
        self.with_headers = with_headers
        self.messages: list = []

    @property
    def done(self) -> bool:
        return done(self.position, self.end)

    def block(self) -> RecordBlock:
        task = self.reader.task
        messages, self.messages = self.messages, []
        stamps = np.array([m.timestamp() for m in messages], dtype=np.int64).reshape(-1, 2)
        return RecordBlock(
            task.topic, task.partition, [m.key() for m in messages],
            [m.value() for m in messages],
            np.array([m.offset() for m in messages], dtype=np.int64), stamps[:, 1].copy(),
            # librdkafka's timestamp types 1/2 -> Kafka's Java ids 0/1
            (stamps[:, 0] - 1).astype(np.int32),
            [header_pairs(m.headers()) for m in messages] if self.with_headers else None)


class PackReader:
    """Iterate the Arrow batches of several ranges (one Spark task, DESIGN §12) with one
    consumer assigned to all of their partitions, so one fetch serves them all.

    The compiled engine reads the ranges as columns (``CompiledReader``). The Python engine
    gives each range its own ``RangeReader``: its own start state, rows and progress record,
    exactly as if it were a task of its own; a single range is read by its ``RangeReader``
    alone. ``records`` holds the ranges' progress records as columns (a list per
    ``ProgressRecord`` field, in the ranges' order) once every range is done, ``progress``
    the same as ``(task, record)`` pairs.

    >>> reader = PackReader(options, layout, decoders, tasks)   # doctest: +SKIP
    >>> for batch in reader: ...
    >>> ledger.offer_pack(reader.tasks, fingerprint, reader.records, key)
    """

    def __init__(self, options: SourceOptions, layout: arrow.OutputLayout, decoders: Decoders,
                 tasks: Sequence[RangeTask] | TaskColumns):
        self.options = options
        self.layout = layout
        self.decoders = decoders
        self.tasks = tasks if isinstance(tasks, TaskColumns) else TaskColumns.of(tuple(tasks))
        self.schema = arrow.schema_of(layout)
        self.readers: list[RangeReader] = []
        self.records: dict[str, list] | None = None
        self._ready: list[tuple[RecordBlock, Computed]] = []
        self._ready_rows = 0

    @property
    def progress(self) -> list[tuple[RangeTask, ProgressRecord]] | None:
        if self.records is None:
            return None
        return list(zip(self.tasks.tasks, records_of_columns(self.records)))

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        if use_compiled(self.options):
            compiled_reader = CompiledReader(self.options, self.layout, self.decoders,
                                             self.tasks)
            for parts in compiled_reader.read():
                batch = assemble(self.layout, self.schema, self.options.late_records, parts)
                if batch.num_rows:
                    yield batch
            self.records = compiled_reader.records
            return
        self.readers = [RangeReader(self.options, self.layout, self.decoders, task)
                        for task in self.tasks.tasks]
        if len(self.readers) == 1:
            reader = self.readers[0]
            yield from reader
            self.records = record_columns([reader.progress])
            return
        planned: dict[tuple[str, int], int] = {}
        for r in self.readers:
            if r.task.end > r.task.start:
                planned[r.task.tp] = planned.get(r.task.tp, 0) + r.task.end - r.task.start
        if planned:
            consumer = open_consumer(self.options, max(planned.values()), len(planned))
            # A consumer of thousands of partitions learns its topics before it asks their
            # offsets, as the compiled engine's does, and is destroyed aside
            # (kwatermark.consumer.close_aside).
            many = len(planned) > compiled.MANY_PARTITIONS
            try:
                if many:
                    learn_topics(lambda topic: consumer.list_topics(topic, compiled.LEARN_TOPIC_S),
                                 sorted({t for t, _ in planned}))
                yield from self._read(consumer)
            except BaseException:
                consumer.close()
                raise
            if many:
                close_aside(consumer.close)
            else:
                consumer.close()
        self.records = record_columns([r._progress() for r in self.readers])

    def _read(self, consumer: Consumer) -> Iterator[pa.RecordBatch]:
        # A partition's sub-ranges (minPartitions) in one pack are contiguous and in offset
        # order: the partition is assigned once, at the first one's start.
        lanes: dict[tuple[str, int], list[_Pending]] = {}
        reading = [r for r in self.readers if r.task.end > r.task.start]
        bounds = partition_bounds(consumer, self.options, [r.task for r in reading])
        for reader in reading:
            start, end = reader._check_range(*bounds[reader.task.tp])
            lanes.setdefault(reader.task.tp, []).append(
                _Pending(reader, start, end, self.layout.include_headers))
        for lane in lanes.values():
            lane[:] = [p for p in lane if not p.done]
        lanes = {tp: lane for tp, lane in lanes.items() if lane}
        if not lanes:
            return
        consumer.assign([KafkaTP(t, p, lane[0].position) for (t, p), lane in lanes.items()])
        size = self.options.records_per_batch(False)
        stall = Stall(self.options.poll_timeout_ms / 1000.0, time.monotonic())
        remaining = sum(p.end - p.position for lane in lanes.values() for p in lane)
        while lanes:
            # Ask for no more than the offsets left: consume() waits for as many messages as
            # it is asked for, or its slice.
            asked = max(1, min(MAX_CONSUME, size, remaining))
            messages = consumer.consume(asked, stall.wait_s(time.monotonic()))
            before = remaining
            for message in messages:
                tp = (message.topic(), message.partition())
                lane = lanes.get(tp)
                if not lane:
                    continue  # a partition done (in this call, or paused) or not ours
                error = message.error()
                if error is not None:
                    remaining -= self._on_error(error, message, lane)
                else:
                    remaining -= self._take(message, lane)
                self._settle_lane(lane)
            if short(asked, len(messages)) and any(lanes.values()):
                remaining -= self._skip_gaps(consumer, lanes)
            finished = [KafkaTP(*tp) for tp, lane in lanes.items() if not lane]
            for tp in finished:
                del lanes[(tp.topic, tp.partition)]
            if finished:
                consumer.pause(finished)
            now = time.monotonic()
            if remaining < before:
                stall.progressed(now)
            elif stall.expired(now):
                remaining -= self._expired(lanes)
                stall.progressed(now)
            if self._ready_rows >= size or not lanes:
                batch = self._assemble()
                if batch is not None:
                    yield batch
            self._trip_faults(lanes)

    def _settle_lane(self, lane: list[_Pending]) -> None:
        """Turn the lane's head range's records into a block when it is full or done, and
        drop the ranges that are done. Records go to the first range of the lane not done:
        the ranges before it are done, and only it can be full."""
        size = self.options.records_per_batch(False)
        while lane:
            head = lane[0]
            if head.messages and (head.done or len(head.messages) >= size):
                self._compute(head)
            if not head.done:
                break
            lane.pop(0)

    def _skip_gaps(self, consumer: Consumer, lanes: dict[tuple[str, int], list[_Pending]]
                   ) -> int:
        """After a short consume: move every open range to its partition's position, past
        markers and filtered records; returns the offsets that covers."""
        open_tps = [tp for tp, lane in lanes.items() if lane]
        covered = 0
        for reported in consumer.position([KafkaTP(t, p) for t, p in open_tps]):
            lane = lanes[(reported.topic, reported.partition)]
            for pending in lane:
                moved = advance(pending.position, reported.offset, pending.end)
                covered += moved - pending.position
                pending.position = moved
            self._settle_lane(lane)
        return covered

    def _expired(self, lanes: dict[tuple[str, int], list[_Pending]]) -> int:
        """As ``RangeReader._expired`` for every open range; returns the offsets covered."""
        covered = 0
        for lane in lanes.values():
            for pending in lane:
                if not pending.done:
                    moved = pending.reader._expired(pending.position, pending.end)
                    covered += moved - pending.position
                    pending.position = moved
            self._settle_lane(lane)
        return covered

    def _compute(self, pending: _Pending) -> None:
        block = pending.block()
        self._ready.append((block, pending.reader._compute(block)))
        self._ready_rows += len(block)

    def _assemble(self) -> pa.RecordBatch | None:
        """The rows computed so far as one batch (None when there are none to yield)."""
        ready, self._ready, self._ready_rows = self._ready, [], 0
        if not ready:
            return None
        batch = assemble(self.layout, self.schema, self.options.late_records, ready)
        return batch if batch.num_rows else None

    @staticmethod
    def _take(message, lane: list[_Pending]) -> int:
        """File one record under the range it belongs to; returns the offsets it covers."""
        offset = message.offset()
        covered = 0
        for pending in lane:
            if pending.done:
                continue
            if offset >= pending.end:
                covered += pending.end - pending.position
                pending.position = pending.end
                continue
            if offset < pending.position:
                return covered   # before this range (a gap left by data loss)
            pending.messages.append(message)
            covered += offset + 1 - pending.position
            pending.position = offset + 1
            return covered
        return covered

    @staticmethod
    def _on_error(error: KafkaError, message, lane: list[_Pending]) -> int:
        """As ``RangeReader._on_error``, for every range of the partition still open."""
        code = error.code()
        if code not in (KafkaError._PARTITION_EOF, KafkaError._AUTO_OFFSET_RESET,
                        KafkaError.OFFSET_OUT_OF_RANGE) and transient(error):
            return 0  # librdkafka moves to the new leader itself; the stall clock runs
        if code not in (KafkaError._PARTITION_EOF, KafkaError._AUTO_OFFSET_RESET,
                        KafkaError.OFFSET_OUT_OF_RANGE):
            first = lane[0]
            task = first.reader.task
            raise BrokerError(f"topic {task.topic}, partition {task.partition}, offset "
                              f"{first.position}: {error.str()}"
                              f"{refusal_hint(error, first.reader.options)}")
        covered = 0
        for pending in lane:
            if pending.done:
                continue
            if code == KafkaError._PARTITION_EOF:
                # Every record before the log's end has been delivered: past `end`, the
                # range's last offsets were gaps (compaction, transaction markers). Before
                # it: a wait (RangeReader._on_error).
                pending.reader.ended_at = message.offset()
                if message.offset() < pending.end:
                    moved = advance(pending.position, message.offset(), pending.end)
                    covered += moved - pending.position
                    pending.position = moved
                    continue
            else:
                pending.reader._data_loss(f"offset {pending.position} is out of range: "
                                          f"{error.str()}")
            covered += pending.end - pending.position
            pending.position = pending.end
        return covered

    def _trip_faults(self, lanes: dict[tuple[str, int], list[_Pending]]) -> None:
        """Tests only: a pack's first attempt fails once, mid-range, like a task's."""
        for lane in lanes.values():
            for pending in lane:
                if pending.fault is not None and pending.position > pending.fault:
                    trip_pack_fault(self.tasks.tasks, pending.reader.task)


def trip_pack_fault(tasks: Sequence[RangeTask], task: RangeTask) -> None:
    """Tests only: fail the task's first attempt, marking every range of it as failed once
    (kwatermark.faults), so that the retry reads them all through."""
    directory = os.environ[FAULT_ENV]
    for t in tasks:
        with open(os.path.join(directory, f"{t.topic}-{t.partition}-{t.start}"), "w"):
            pass
    trip_fault(task)
