"""The executor loop: read ``[start, end)`` of one partition into Arrow batches, computing
every row's event time and watermark, and leave a progress record behind.

    open consumer -> check the range still exists -> seek -> consume blocks ->
    decode -> assign event times -> watermark rows -> Arrow batch -> progress record

The consumer's settings are ``kwatermark.consumer``'s, when a range is done is
``kwatermark.range_end``'s (shared with ``kwatermark.pack``, many ranges in one task).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from confluent_kafka import Consumer, KafkaError
from confluent_kafka import TopicPartition as KafkaTP

from kwatermark import arrow
from kwatermark.consumer import MAX_CONSUME, open_consumer, partition_bounds
from kwatermark.errors import BrokerError, DataLossError, DecodeError
from kwatermark.faults import fault_point, trip_fault
from kwatermark.ledger import ProgressRecord, new_record
from kwatermark.offsets import RangeTask, TaskColumns
from kwatermark.options import SourceOptions
from kwatermark.range_end import Stall, advance, done, short
from kwatermark.records import RecordBlock
from kwatermark.retries import transient
from kwatermark.security import refusal_hint
from kwatermark.watermarks import (
    NO_PARTITIONS,
    UNDEFINED,
    BoundedOutOfOrderness,
    at_once,
    current_ms,
    from_optional,
    make_assigner,
    make_generator,
    needs_records,
    restore_generator,
    row_watermarks,
    segmented_running_max,
    to_optional,
    watermarks_before,
)

log = logging.getLogger("kwatermark.reader")


@dataclass
class Decoders:
    """The key/value deserializers and what to do when they fail (from kwatermark.serde)."""

    key: object | None = None
    value: object | None = None
    key_on_error: str = "fail"
    value_on_error: str = "fail"


class RangeReader:
    """Iterate the Arrow batches of one task; ``progress`` is set once the range is done.

    >>> reader = RangeReader(options, layout, decoders, task)   # doctest: +SKIP
    >>> for batch in reader: ...
    >>> reader.progress.generator
    """

    def __init__(self, options: SourceOptions, layout: arrow.OutputLayout, decoders: Decoders,
                 task: RangeTask):
        self.options = options
        self.layout = layout
        self.decoders = decoders
        self.task = task
        self.schema = arrow.schema_of(layout)
        self.generator = restore_generator(options.watermark, task.state.generator)
        self.assigner = make_assigner(options.watermark)
        self.per_record = needs_records(self.generator, self.assigner)
        self.advanced = from_optional(task.state.advanced_ms)
        self.previous = from_optional(task.previous_ms)
        self.count = 0
        self.min_event = None
        self.max_event = None
        self.max_row_watermark = UNDEFINED
        self.progress: ProgressRecord | None = None
        self.ended_at: int | None = None  # the last end-of-partition offset seen

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        task = self.task
        if task.end <= task.start:
            self.progress = self._progress()
            return
        consumer = open_consumer(self.options, task.end - task.start)
        try:
            start, end = self._check_range(
                *partition_bounds(consumer, self.options, [task])[task.tp])
            if end > start:
                consumer.assign([KafkaTP(task.topic, task.partition, start)])
                for block in self._blocks(consumer, start, end):
                    batch = self._process(block)
                    if batch.num_rows:
                        yield batch
        finally:
            consumer.close()
        self.progress = self._progress()

    def _check_range(self, low: int, high: int, start: int | None = None,
                     end: int | None = None) -> tuple[int, int]:
        """The part of the range (by default the task's, else ``[start, end)``, what is left
        of it) still in the partition, whose offsets are now ``[low, high)``: records
        planned earlier may be gone (retention, a deleted or recreated topic)."""
        task = self.task
        start = task.start if start is None else start
        end = task.end if end is None else end
        if low > start:
            self._data_loss(f"offsets [{start}, {min(low, end)}) are no longer available "
                            f"(earliest is {low}; retention or deletion)")
            start = min(low, end)
        if high < end:
            self._data_loss(f"offsets [{max(high, start)}, {end}) were planned but the "
                            f"partition now ends at {high} (topic recreated or truncated)")
            end = max(high, start)
        return start, end

    def _data_loss(self, detail: str) -> None:
        message = f"topic {self.task.topic}, partition {self.task.partition}: {detail}"
        if self.options.fail_on_data_loss:
            raise DataLossError(f"{message}. Set failOnDataLoss=false to skip lost records "
                                f"with a warning.")
        # The warning names the option as set, not the advice to set it.
        log.warning("data loss (failOnDataLoss=false): %s; the lost records are skipped",
                    message)

    def _blocks(self, consumer: Consumer, start: int, end: int) -> Iterator[RecordBlock]:
        task = self.task
        size = self.options.records_per_batch(False)
        headers = [] if self.layout.include_headers else None
        keys, values, offsets, ts, types = [], [], [], [], []
        position = start
        fault = fault_point(task)
        stall = Stall(self.options.poll_timeout_ms / 1000.0, time.monotonic())
        where = [KafkaTP(task.topic, task.partition)]
        while not done(position, end):
            asked = min(MAX_CONSUME, size - len(offsets), end - position)
            messages = consumer.consume(asked, stall.wait_s(time.monotonic()))
            before = position
            for message in messages:
                error = message.error()
                if error is not None:
                    position = self._on_error(error, message, position, end)
                    continue
                offset = message.offset()
                if offset >= end:
                    position = end
                    break
                keys.append(message.key())
                values.append(message.value())
                offsets.append(offset)
                kind, stamp = message.timestamp()
                types.append(kind - 1)  # librdkafka 1/2 -> Kafka's Java ids 0/1
                ts.append(stamp)
                if headers is not None:
                    headers.append(message.headers())
                position = offset + 1
            if short(asked, len(messages)) and not done(position, end):
                position = advance(position, consumer.position(where)[0].offset, end)
            now = time.monotonic()
            if position > before:
                stall.progressed(now)
            elif stall.expired(now):
                position = self._expired(position, end)
            if fault is not None and position > fault:
                trip_fault(task)
                fault = None
            if len(offsets) >= size or (done(position, end) and offsets):
                yield RecordBlock(
                    task.topic, task.partition, keys, values,
                    np.asarray(offsets, dtype=np.int64), np.asarray(ts, dtype=np.int64),
                    np.asarray(types, dtype=np.int32),
                    [header_pairs(h) for h in headers] if headers is not None else None)
                keys, values, offsets, ts, types = [], [], [], [], []
                headers = [] if headers is not None else None

    def _expired(self, position: int, end: int) -> int:
        """No progress for ``kafkaConsumer.pollTimeoutMs``: the partition ended before the
        range did all along (data loss, then the range is done), or a BrokerError."""
        if self.ended_at is None or self.ended_at >= end or position > self.ended_at:
            raise self._stalled(position, end)
        self._data_loss(f"the partition ended at offset {self.ended_at} while offsets up to "
                        f"{end} were planned, for kafkaConsumer.pollTimeoutMs="
                        f"{self.options.poll_timeout_ms}")
        return end

    def _stalled(self, position: int, end: int) -> BrokerError:
        task = self.task
        return BrokerError(
            f"topic {task.topic}, partition {task.partition}: no records at offset {position} "
            f"(range ends at {end}) and no progress for kafkaConsumer.pollTimeoutMs="
            f"{self.options.poll_timeout_ms} from kafka.bootstrap.servers="
            f"{self.options.bootstrap_servers!r}")

    def _on_error(self, error: KafkaError, message, position: int, end: int) -> int:
        task = self.task
        if error.code() == KafkaError._PARTITION_EOF:
            # Gaps (compaction, transaction markers) can end the log before `end`. A log
            # that ends before `end` may be a new leader whose high watermark has not caught
            # up yet (DESIGN §20): a wait, data loss only if it lasts (_expired).
            self.ended_at = message.offset()
            return advance(position, message.offset(), end) if message.offset() < end else end
        if error.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
            self._data_loss(f"offset {position} is out of range: {error.str()}")
            return end
        if transient(error):
            return position  # librdkafka moves to the new leader itself; the stall clock runs
        raise BrokerError(f"topic {task.topic}, partition {task.partition}, offset "
                          f"{position}: {error.str()}{refusal_hint(error, self.options)}")

    def _process(self, block: RecordBlock) -> pa.RecordBatch:
        return assemble(self.layout, self.schema, self.options.late_records,
                        [(block, self._compute(block))])

    def _compute(self, block: RecordBlock) -> Computed:
        """Decode, assign event times and watermark the rows of the range's next block,
        advancing the range's state; the Arrow batch is built by ``assemble``."""
        key_array, key_errors = self._decode(block, "key")
        value_array, value_errors = self._decode(block, "value")
        block.value_decoded = value_array
        event_times, assign_errors = self.assigner.assign(block)
        errors = _merge_errors(value_errors, assign_errors)
        if errors is not None and self.decoders.value_on_error == "fail":
            first = next(i for i, e in enumerate(errors) if e)
            raise DecodeError(f"topic {block.topic}, partition {block.partition}, offset "
                              f"{int(block.offsets[first])}: {errors[first]}")
        own_before = watermarks_before(self.generator, event_times, block)
        own_before = np.maximum(own_before, self.advanced)
        rows = row_watermarks(own_before, self.task.others_ms, self.previous,
                              self.task.counted, from_optional(self.task.floor_ms))
        self._account(event_times, rows, len(block))
        return Computed(event_times, rows, _late(self.options, event_times, rows), key_array,
                        value_array, errors, key_errors)

    def _decode(self, block: RecordBlock, role: str) -> tuple[pa.Array | None, list | None]:
        decoder = getattr(self.decoders, role)
        if decoder is None:
            return None, None
        block.python_lists()
        decoded = decoder.decode(block.keys if role == "key" else block.values)
        errors = decoded.errors if any(decoded.errors) else None
        if errors is not None and getattr(self.decoders, f"{role}_on_error") == "fail":
            first = next(i for i, e in enumerate(errors) if e)
            raise DecodeError(f"topic {block.topic}, partition {block.partition}, offset "
                              f"{int(block.offsets[first])}: cannot decode {role}: "
                              f"{errors[first]}")
        return decoded.array, errors

    def _account(self, event_times: np.ndarray, rows: np.ndarray, n: int) -> None:
        known = event_times[event_times != UNDEFINED]
        self._count(n, int(known.min()) if known.size else None,
                    int(known.max()) if known.size else None,
                    int(rows.max()) if rows.size else UNDEFINED)

    def _count(self, n: int, low: int | None, high: int | None, top_row: int) -> None:
        """``n`` more records, their event times within ``[low, high]`` (None: none had
        one), their rows' watermarks up to ``top_row``."""
        self.count += n
        if high is not None:
            self.min_event = low if self.min_event is None else min(self.min_event, low)
            self.max_event = high if self.max_event is None else max(self.max_event, high)
        self.max_row_watermark = max(self.max_row_watermark, top_row)

    def _progress(self) -> ProgressRecord:
        return new_record(self.generator.snapshot(), self.count, self.min_event,
                          self.max_event, to_optional(self.max_row_watermark))


def ranges_at_once(options: SourceOptions, decoders: Decoders) -> bool:
    """Whether a task's ranges may be computed together (``RangeColumns``): the watermark
    options' generator and assigner allow it (``watermarks.at_once``, one configuration for
    every range of a task) and nothing is decoded."""
    config = options.watermark
    return (at_once(make_generator(config), make_assigner(config)) and decoders.key is None
            and decoders.value is None)


def compute_ranges(options: SourceOptions, tasks: TaskColumns, block: RecordBlock,
                   counts: np.ndarray) -> tuple[Computed, dict[str, list]]:
    """``RangeReader._compute`` for the next blocks of many ranges at once, where
    ``ranges_at_once`` holds: ``block`` holds ``counts[i]`` (> 0) records of the ``i``-th
    range of ``tasks``, one range after another. Rows, and the ranges' progress records as
    columns, come out as if each range's block were computed alone (``RangeColumns``)."""
    columns = RangeColumns(options, tasks)
    computed = columns.compute(np.arange(len(tasks)), block, counts)
    return computed, columns.records()


class RangeColumns:
    """The ranges of a task computed together (kwatermark.compiled: a pack of thousands of
    small ranges, each a few records a block), as columns: each range's inputs and its state
    so far, by row (the ``TaskColumns`` row). ``compute`` takes any rows' next records at
    once, with numpy work per block and none per range; ``records`` gives each range's
    progress record, as columns, once the ranges are read: the one a ``RangeReader`` of the
    range would have made alone. No object is made per range, but a generator for the
    strategies whose watermark is one value a range (none, timelag).

    Only where ``ranges_at_once`` holds (built-in generators that need no record, on Kafka's
    timestamps, nothing decoded), for the ranges of one pack (one ``options``)."""

    def __init__(self, options: SourceOptions, tasks: TaskColumns):
        config = options.watermark
        generator = make_generator(config)
        self.options = options
        self.assigner = make_assigner(config)
        self.bounded = type(generator) is BoundedOutOfOrderness
        snapshots = tasks.state["generator"]
        self.generators = None
        if self.bounded:
            # BoundedOutOfOrderness.restore of each snapshot (None: a fresh generator)
            self.max_ts = np.array([UNDEFINED if s is None or s.get("max_ts") is None
                                    else s["max_ts"] for s in snapshots], dtype=np.int64)
            self.bound = generator.bound_ms + 1   # one configuration per pack
        else:   # NoWatermarks, TimeLag: one watermark a range, whatever it reads
            self.generators = [restore_generator(config, s) for s in snapshots]
            self.constant = np.array([current_ms(g) for g in self.generators],
                                     dtype=np.int64)
        self.advanced = _optional_ms(tasks.state["advanced_ms"])
        self.previous = _optional_ms(tasks.previous_ms)
        self.others = np.array(tasks.others_ms, dtype=np.int64)
        self.counted = np.array(tasks.counted, dtype=bool)
        self.floor = _optional_ms(tasks.floor_ms)
        self.topics = sorted(set(tasks.topic))
        index = {topic: i for i, topic in enumerate(self.topics)}
        self.topic_index = np.array([index[t] for t in tasks.topic], dtype=np.int32)
        self.partition = np.array(tasks.partition, dtype=np.int32)
        n = len(tasks)
        self.count = np.zeros(n, dtype=np.int64)
        self.low = np.full(n, NO_PARTITIONS, dtype=np.int64)   # none yet
        self.high = np.full(n, UNDEFINED, dtype=np.int64)
        self.top = np.full(n, UNDEFINED, dtype=np.int64)
    def compute(self, rows: np.ndarray, block: RecordBlock, counts: np.ndarray) -> Computed:
        """The next records of the ranges ``rows`` (distinct), ``counts[i]`` (> 0) of
        ``rows[i]``'s, one range after another in ``block``; advances their states."""
        def per_row(column: np.ndarray) -> np.ndarray:
            return np.repeat(column[rows], counts)

        event_times, _ = self.assigner.assign(block)
        if self.bounded:
            before, last = segmented_running_max(self.max_ts[rows], event_times, counts)
            self.max_ts[rows] = last
            own_before = np.where(before == UNDEFINED, UNDEFINED, before - self.bound)
        else:
            own_before = per_row(self.constant)
        own_before = np.maximum(own_before, per_row(self.advanced))
        marks = row_watermarks(own_before, per_row(self.others), per_row(self.previous),
                               per_row(self.counted), per_row(self.floor))
        heads = np.cumsum(counts) - counts
        known = event_times != UNDEFINED
        self.count[rows] += counts
        self.low[rows] = np.minimum(self.low[rows], np.minimum.reduceat(
            np.where(known, event_times, NO_PARTITIONS), heads))
        self.high[rows] = np.maximum(self.high[rows], np.maximum.reduceat(
            np.where(known, event_times, UNDEFINED), heads))
        self.top[rows] = np.maximum(self.top[rows], np.maximum.reduceat(marks, heads))
        return Computed(event_times, marks, _late(self.options, event_times, marks), None,
                        None, None, None)

    def placed(self, rows: np.ndarray, counts: np.ndarray
               ) -> tuple[list[str], np.ndarray, np.ndarray]:
        """``RecordBlock.placed`` of a block holding ``counts[i]`` records of ``rows[i]``."""
        return (self.topics, np.repeat(self.topic_index[rows], counts),
                np.repeat(self.partition[rows], counts))

    def records(self) -> dict[str, list]:
        """Each range's progress record (``ProgressRecord`` field by field, a list a field),
        as ``RangeReader._progress`` would have made it after reading its records alone."""
        high = self.high.tolist()
        found = self.high != UNDEFINED
        if self.bounded:
            generator = [{"max_ts": None if m == UNDEFINED else m}
                         for m in self.max_ts.tolist()]
        else:
            generator = [g.snapshot() for g in self.generators]
        top = self.top.tolist()
        return {"generator": generator, "count": self.count.tolist(),
                "min_event_ms": [low if f else None
                                 for low, f in zip(self.low.tolist(), found.tolist())],
                "max_event_ms": [h if h != UNDEFINED else None for h in high],
                "max_row_watermark": [None if t == UNDEFINED or t == NO_PARTITIONS else t
                                      for t in top]}


def _optional_ms(values: list) -> np.ndarray:
    """``from_optional`` of each value, as an int64 column."""
    return np.array([UNDEFINED if v is None else v for v in values], dtype=np.int64)


def _late(options: SourceOptions, event_times: np.ndarray, rows: np.ndarray
          ) -> np.ndarray | None:
    """Which rows are late: an event time at or below their watermark less
    ``allowedLateness`` (None with lateRecords=keep, which flags nothing)."""
    if options.late_records == "keep":
        return None
    return ((event_times != UNDEFINED) & (rows != UNDEFINED)
            & (event_times + options.allowed_lateness_ms <= rows))


@dataclass
class Computed:
    """What ``RangeReader._compute`` derived for one block, besides its Kafka columns."""

    event_times: np.ndarray
    rows: np.ndarray                 # each row's watermark
    late: np.ndarray | None          # None with lateRecords=keep
    key_array: pa.Array | None
    value_array: pa.Array | None
    errors: list | None
    key_errors: list | None


def assemble(layout: arrow.OutputLayout, schema: pa.Schema, late_records: str,
             parts: list[tuple[RecordBlock, Computed]]) -> pa.RecordBatch:
    """One Arrow batch of the rows of one or more blocks (of one or more ranges), in order:
    a pack builds one batch for many small ranges instead of one each."""
    blocks = [block for block, _ in parts]
    computed = [c for _, c in parts]
    n = sum(len(block) for block in blocks)
    columns = arrow.kafka_columns_of(layout, blocks)

    def joined(arrays: list[np.ndarray]) -> np.ndarray:
        return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)

    def texts(lists: list[list | None]) -> pa.Array:
        return pa.array([e for errors, block in zip(lists, blocks)
                         for e in (errors if errors is not None else [None] * len(block))],
                        type=pa.string())

    event_times = joined([c.event_times for c in computed])
    columns += [arrow.timestamps(event_times), arrow.timestamps(joined([c.rows
                                                                       for c in computed]))]
    if layout.heartbeat:
        columns.append(pa.array(np.zeros(n, dtype=bool)))
    late = None if late_records == "keep" else joined([c.late for c in computed])
    if layout.flag_late:
        columns.append(pa.array(late, type=pa.bool_()))
    if layout.key_type is not None:
        columns.append(_concat([c.key_array for c in computed]))
    if layout.value_type is not None:
        columns.append(_concat([c.value_array for c in computed]))
    if layout.error_column:
        columns.append(texts([c.errors for c in computed]))
    if layout.key_error_column:
        columns.append(texts([c.key_errors for c in computed]))
    batch = pa.RecordBatch.from_arrays(columns, schema=schema)
    if late_records == "drop":
        batch = batch.filter(pa.array(~late))
    return batch


def _concat(arrays: list[pa.Array]) -> pa.Array:
    return arrays[0] if len(arrays) == 1 else pa.concat_arrays(arrays)


def _merge_errors(first: list | None, second: list | None) -> list | None:
    if first is None:
        return second if second is not None and any(second) else None
    if second is None:
        return first
    merged = [a or b for a, b in zip(first, second)]
    return merged if any(merged) else None


def header_pairs(headers: list | None) -> list | None:
    if headers is None:
        return None
    return [{"key": k, "value": v} for k, v in headers]
