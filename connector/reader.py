"""The executor loop: read ``[start, end)`` of one partition into Arrow batches, computing
every row's event time and watermark, and leave a progress record behind.

    open consumer -> check the range still exists -> seek -> consume blocks ->
    decode -> assign event times -> watermark rows -> Arrow batch -> progress record
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTP

from kwatermark import arrow
from kwatermark.errors import BrokerError, DataLossError, DecodeError, KWatermarkError
from kwatermark.ledger import ProgressRecord
from kwatermark.offsets import RangeTask
from kwatermark.options import SourceOptions
from kwatermark.rdkafka_log import librdkafka_logger
from kwatermark.records import RecordBlock
from kwatermark.security import refusal_hint
from kwatermark.watermarks import (
    UNDEFINED,
    from_optional,
    make_assigner,
    needs_records,
    restore_generator,
    row_watermarks,
    to_optional,
    watermarks_before,
)

log = logging.getLogger("kwatermark.reader")

# librdkafka's prefetch doubles consume throughput (DESIGN §9), but past the range's end it
# only wastes memory and bandwidth: cap it at what the task still has to read. Whenever the
# local queue holds queued.min.messages, or a fetch decision finds nothing to do yet,
# librdkafka waits fetch.queue.backoff.ms before fetching again (1 s by default since 2.4).
# 1 ms keeps a 100k queue at full speed, a worker's memory flat, and a task's first records
# arriving at once (bench/README.md: a 1-record task 1,005 ms -> 13 ms at 10 ms -> 3 ms at
# 1 ms; 5M-record range RSS growth 165 MB -> 3 MB; CPU per record not higher).
MAX_PREFETCH_MESSAGES = 100_000
FETCH_QUEUE_BACKOFF_MS = 1

# Set only by the fault-injection tests: fail a task's first attempt mid-range.
FAULT_ENV = "KWATERMARK_TEST_FAIL_ONCE_DIR"


@dataclass
class Decoders:
    """The key/value deserializers and what to do when they fail (from kwatermark.serde)."""

    key: object | None = None
    value: object | None = None
    key_on_error: str = "fail"
    value_on_error: str = "fail"


def open_consumer(options: SourceOptions, remaining: int, partitions: int = 1) -> Consumer:
    """A consumer for one task: ``remaining`` is the most records it reads from any one
    partition (librdkafka's prefetch, ``queued.min.messages``, is per partition), and
    ``partitions`` how many partitions it reads."""
    conf = options.consumer_conf()
    conf.update({
        "group.id": options.group_id or f"{options.group_id_prefix}-{uuid.uuid4().hex[:12]}",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "error",
        "logger": librdkafka_logger(),
    })
    conf.setdefault("queued.min.messages", max(1, min(remaining, MAX_PREFETCH_MESSAGES)))
    conf.setdefault("fetch.queue.backoff.ms", FETCH_QUEUE_BACKOFF_MS)
    if partitions > 1 and "fetch.max.bytes" not in conf:
        conf["fetch.max.bytes"] = pack_fetch_bytes(conf)
    try:
        return Consumer(conf)
    except KafkaException as exc:
        raise KWatermarkError(f"cannot create a Kafka consumer from the kafka.* options: "
                              f"{exc.args[0] if exc.args else exc}") from exc


def pack_fetch_bytes(conf: dict) -> int:
    """A pack's Fetch size: what a task reading one partition fetches per request
    (``max.partition.fetch.bytes``), not librdkafka's 50 MB total.

    A pack's ranges are small, but the partitions usually go on past them: with the default,
    every Fetch brings back up to 1 MB of every partition of the pack, nearly all of it past
    the ranges' ends, to be parsed and thrown away (512 partitions of 40 records: the
    broker's answers took 0.6 s where 20,000 records needed 0.1 s; bench/README.md).
    librdkafka refuses a ``fetch.max.bytes`` below ``message.max.bytes``."""
    partition = int(conf.get("max.partition.fetch.bytes",
                             conf.get("fetch.message.max.bytes", 1_048_576)))
    return max(partition, int(conf.get("message.max.bytes", 1_000_000)))


def partition_bounds(consumer: Consumer, options: SourceOptions, tasks: list[RangeTask]
                     ) -> dict[tuple[str, int], tuple[int, int]]:
    """Every task's partition's earliest and end offsets, in one ListOffsets request per
    leader for each (``get_watermark_offsets`` asks once per partition). The consumer's
    ``isolation.level`` applies, as it does to ``get_watermark_offsets``."""
    tps = list(dict.fromkeys(task.tp for task in tasks))
    timeout = options.poll_timeout_ms / 1000.0
    found: dict[str, dict[tuple[str, int], int]] = {}
    for name, which in (("low", OFFSET_BEGINNING), ("high", OFFSET_END)):
        try:
            answer = consumer.offsets_for_times([KafkaTP(t, p, which) for t, p in tps],
                                                timeout)
        except KafkaException as exc:
            raise _offsets_error(options, tps[0], exc.args[0] if exc.args else exc) from exc
        for tp in answer:
            if tp.error is not None:
                raise _offsets_error(options, (tp.topic, tp.partition), tp.error)
        found[name] = {(tp.topic, tp.partition): tp.offset for tp in answer}
    return {tp: (found["low"][tp], found["high"][tp]) for tp in tps}


def _offsets_error(options: SourceOptions, tp: tuple[str, int], error: object) -> BrokerError:
    return BrokerError(f"topic {tp[0]}, partition {tp[1]}: cannot fetch offsets from "
                       f"kafka.bootstrap.servers={options.bootstrap_servers!r}: {error}")


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
        self.schema = layout.schema()
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

    def _check_range(self, low: int, high: int) -> tuple[int, int]:
        """The part of the range still in the partition, whose offsets are now
        ``[low, high)``: records planned earlier may be gone (retention, a deleted or
        recreated topic)."""
        task = self.task
        start, end = task.start, task.end
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
        message = (f"topic {self.task.topic}, partition {self.task.partition}: {detail}. "
                   f"Set failOnDataLoss=false to skip lost records with a warning.")
        if self.options.fail_on_data_loss:
            raise DataLossError(message)
        log.warning("data loss (failOnDataLoss=false): %s", message)

    def _blocks(self, consumer: Consumer, start: int, end: int) -> Iterator[RecordBlock]:
        task = self.task
        size = self.options.max_records_per_batch
        timeout = self.options.poll_timeout_ms / 1000.0
        headers = [] if self.layout.include_headers else None
        keys, values, offsets, ts, types = [], [], [], [], []
        position = start
        fault = _fault_point(task)
        while position < end:
            messages = consumer.consume(min(size - len(offsets), end - position), timeout)
            if not messages:
                raise BrokerError(
                    f"topic {task.topic}, partition {task.partition}: no records at offset "
                    f"{position} (range ends at {end}) within kafkaConsumer.pollTimeoutMs="
                    f"{self.options.poll_timeout_ms} from kafka.bootstrap.servers="
                    f"{self.options.bootstrap_servers!r}")
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
            if fault is not None and position > fault:
                _trip_fault(task)
                fault = None
            if len(offsets) >= size or (position >= end and offsets):
                yield RecordBlock(
                    task.topic, task.partition, keys, values,
                    np.asarray(offsets, dtype=np.int64), np.asarray(ts, dtype=np.int64),
                    np.asarray(types, dtype=np.int32),
                    [_header_pairs(h) for h in headers] if headers is not None else None)
                keys, values, offsets, ts, types = [], [], [], [], []
                headers = [] if headers is not None else None

    def _on_error(self, error: KafkaError, message, position: int, end: int) -> int:
        task = self.task
        if error.code() == KafkaError._PARTITION_EOF:
            # Gaps (compaction, transaction markers) can end the log before `end`.
            if message.offset() < end:
                self._data_loss(f"the partition ended at offset {message.offset()} while "
                                f"offsets up to {end} were planned")
            return end
        if error.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
            self._data_loss(f"offset {position} is out of range: {error.str()}")
            return end
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
        late = None
        if self.options.late_records != "keep":
            late = ((event_times != UNDEFINED) & (rows != UNDEFINED)
                    & (event_times + self.options.allowed_lateness_ms <= rows))
        return Computed(event_times, rows, late, key_array, value_array, errors, key_errors)

    def _decode(self, block: RecordBlock, role: str) -> tuple[pa.Array | None, list | None]:
        decoder = getattr(self.decoders, role)
        if decoder is None:
            return None, None
        decoded = decoder.decode(block.keys if role == "key" else block.values)
        errors = decoded.errors if any(decoded.errors) else None
        if errors is not None and getattr(self.decoders, f"{role}_on_error") == "fail":
            first = next(i for i, e in enumerate(errors) if e)
            raise DecodeError(f"topic {block.topic}, partition {block.partition}, offset "
                              f"{int(block.offsets[first])}: cannot decode {role}: "
                              f"{errors[first]}")
        return decoded.array, errors

    def _account(self, event_times: np.ndarray, rows: np.ndarray, n: int) -> None:
        self.count += n
        known = event_times[event_times != UNDEFINED]
        if known.size:
            low, high = int(known.min()), int(known.max())
            self.min_event = low if self.min_event is None else min(self.min_event, low)
            self.max_event = high if self.max_event is None else max(self.max_event, high)
        if rows.size:
            self.max_row_watermark = max(self.max_row_watermark, int(rows.max()))

    def _progress(self) -> ProgressRecord:
        return ProgressRecord(
            generator=self.generator.snapshot(), count=self.count,
            min_event_ms=self.min_event, max_event_ms=self.max_event,
            max_row_watermark=to_optional(self.max_row_watermark))


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


def _header_pairs(headers: list | None) -> list | None:
    if headers is None:
        return None
    return [{"key": k, "value": v} for k, v in headers]


def _fault_point(task: RangeTask) -> int | None:
    """Offset after which this task's first attempt fails (tests only): armed by a file
    ``<topic>.arm`` in the directory ``KWATERMARK_TEST_FAIL_ONCE_DIR`` names."""
    directory = os.environ.get(FAULT_ENV)
    if not directory or task.end - task.start < 2:
        return None
    if not os.path.exists(os.path.join(directory, f"{task.topic}.arm")):
        return None
    marker = os.path.join(directory, f"{task.topic}-{task.partition}-{task.start}")
    return None if os.path.exists(marker) else task.start + (task.end - task.start) // 2


def _trip_fault(task: RangeTask) -> None:
    directory = os.environ[FAULT_ENV]
    with open(os.path.join(directory, f"{task.topic}-{task.partition}-{task.start}"), "w"):
        pass
    raise RuntimeError(f"injected test fault: topic {task.topic}, partition {task.partition}, "
                       f"range [{task.start}, {task.end})")


class _Pending:
    """One range of a pack while it is being read: its reader and the messages not yet
    turned into a block."""

    def __init__(self, reader: RangeReader, start: int, end: int, with_headers: bool):
        self.reader = reader
        self.position = start
        self.end = end
        self.fault = _fault_point(reader.task)
        self.with_headers = with_headers
        self.messages: list = []

    @property
    def done(self) -> bool:
        return self.position >= self.end

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
            [_header_pairs(m.headers()) for m in messages] if self.with_headers else None)


class PackReader:
    """Iterate the Arrow batches of several ranges (one Spark task, DESIGN §12) with one
    consumer assigned to all of their partitions, so one fetch serves them all.

    Each range keeps its own ``RangeReader``: its own start state, rows and progress record,
    exactly as if it were a task of its own; a single range is read by its ``RangeReader``
    alone. ``progress`` lists ``(task, record)`` pairs once every range is done.

    >>> reader = PackReader(options, layout, decoders, tasks)   # doctest: +SKIP
    >>> for batch in reader: ...
    >>> for task, record in reader.progress: ledger.publish(task, fingerprint, record)
    """

    def __init__(self, options: SourceOptions, layout: arrow.OutputLayout, decoders: Decoders,
                 tasks: list[RangeTask]):
        self.options = options
        self.layout = layout
        self.readers = [RangeReader(options, layout, decoders, task) for task in tasks]
        self.progress: list[tuple[RangeTask, ProgressRecord]] | None = None
        self._ready: list[tuple[RecordBlock, Computed]] = []
        self._ready_rows = 0

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        if len(self.readers) == 1:
            reader = self.readers[0]
            yield from reader
            self.progress = [(reader.task, reader.progress)]
            return
        planned: dict[tuple[str, int], int] = {}
        for r in self.readers:
            if r.task.end > r.task.start:
                planned[r.task.tp] = planned.get(r.task.tp, 0) + r.task.end - r.task.start
        if planned:
            consumer = open_consumer(self.options, max(planned.values()), len(planned))
            try:
                yield from self._read(consumer)
            finally:
                consumer.close()
        self.progress = [(r.task, r._progress()) for r in self.readers]

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
        size = self.options.max_records_per_batch
        timeout = self.options.poll_timeout_ms / 1000.0
        remaining = sum(p.end - p.position for lane in lanes.values() for p in lane)
        while lanes:
            # Exactly what is left: consume() waits for as many messages as it is asked for.
            messages = consumer.consume(max(1, min(size, remaining)), timeout)
            if not messages:
                waiting = next(iter(lanes.values()))[0]
                task = waiting.reader.task
                raise BrokerError(
                    f"topic {task.topic}, partition {task.partition}: no records at offset "
                    f"{waiting.position} (range ends at {waiting.end}) within "
                    f"kafkaConsumer.pollTimeoutMs={self.options.poll_timeout_ms} from "
                    f"kafka.bootstrap.servers={self.options.bootstrap_servers!r}")
            finished = []
            for message in messages:
                tp = (message.topic(), message.partition())
                lane = lanes.get(tp)
                if lane is None:
                    continue  # a partition already done (paused) or not ours
                error = message.error()
                if error is not None:
                    remaining -= self._on_error(error, message, lane)
                else:
                    remaining -= self._take(message, lane)
                # Records go to the first range of the lane not done: the ranges before it
                # are done, and only it can be full.
                while lane:
                    head = lane[0]
                    if head.messages and (head.done or len(head.messages) >= size):
                        self._compute(head)
                    if not head.done:
                        break
                    lane.pop(0)
                if not lane:
                    del lanes[tp]
                    finished.append(KafkaTP(*tp))
            if finished:
                consumer.pause(finished)
            if self._ready_rows >= size or not lanes:
                batch = self._assemble()
                if batch is not None:
                    yield batch
            self._trip_faults(lanes)

    def _compute(self, pending: _Pending) -> None:
        block = pending.block()
        self._ready.append((block, pending.reader._compute(block)))
        self._ready_rows += len(block)

    def _assemble(self) -> pa.RecordBatch | None:
        """The rows computed so far as one batch (None when there are none to yield)."""
        ready, self._ready, self._ready_rows = self._ready, [], 0
        if not ready:
            return None
        batch = assemble(self.layout, self.readers[0].schema, self.options.late_records,
                         ready)
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
                # range's last offsets were gaps (compaction, transaction markers).
                if message.offset() < pending.end:
                    pending.reader._data_loss(
                        f"the partition ended at offset {message.offset()} while offsets up "
                        f"to {pending.end} were planned")
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
                    directory = os.environ[FAULT_ENV]
                    for other in self.readers:
                        task = other.task
                        with open(os.path.join(directory, f"{task.topic}-{task.partition}-"
                                                          f"{task.start}"), "w"):
                            pass
                    _trip_fault(pending.reader.task)
