"""The Spark classes: a thin shell over options, planner and reader.

>>> df = (spark.readStream.format("kwatermark")        # doctest: +SKIP
...       .option("kafka.bootstrap.servers", "localhost:9092")
...       .option("subscribe", "events")
...       .option("watermark.strategy", "bounded")
...       .option("watermark.maxOutOfOrderness", "5 seconds")
...       .load())
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import logging
import os
import pickle
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.pandas.types import from_arrow_type, to_arrow_type
from pyspark.sql.types import StructType

from kwatermark.arrow import OutputLayout, heartbeat_batch
from kwatermark.errors import KWatermarkError, OptionError
from kwatermark.offsets import RangeTask, TaskColumns
from kwatermark.options import SourceOptions, parse_options
from kwatermark.pack import PackReader
from kwatermark.planner import BatchPlanner, ReadLimits
from kwatermark.reader import Decoders
from kwatermark.sparkapi import (
    ADMISSION_CONTROL_SINCE,
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from kwatermark.sparkapi import VERSION as SPARK_VERSION

Method = TypeVar("Method", bound=Callable)

log = logging.getLogger(__name__)

# Set (to anything) to see kwatermark's own frames and causes in the errors Spark shows.
FULL_TRACEBACK_ENV = "KWATERMARK_FULL_TRACEBACK"


def _cause_first(method: Method) -> Method:
    """Spark shows a Python source's error as its Python traceback, cause last: a misspelt
    option was line 13 of 13 under Spark's prefix, a wrong address line 35 of 47. A
    KWatermarkError's message names the option, topic, partition or address and what to do,
    so it is re-raised from this one frame: Spark's text then reads prefix, "Traceback",
    this frame, the cause (docs/operations.md, "Errors"). Anything else (a user plugin's own
    exception) keeps its whole traceback."""
    @functools.wraps(method)
    def call(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except KWatermarkError as exc:
            if os.environ.get(FULL_TRACEBACK_ENV):
                raise
            raise exc.with_traceback(None) from None
    return call  # type: ignore[return-value]


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused for the block, however it ends. Paused, the
    allocations are still counted: the collection they call for runs after the block, one
    where dozens ran during it; reference counting frees objects as before. A collector
    already paused (a call within a call, or by the application) is left so."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _gc_paused(method: Method, then: Callable[[], None] | None = None) -> Method:
    """Run a driver call (planning, committing) with the collector paused
    (``_collector_paused``), and ``then()``, if given, at its end, still paused. A planning
    at thousands of partitions makes and keeps tens of thousands of objects (each
    partition's state, range and lag, in the offsets the planner keeps), and every
    collection the allocations triggered walked them again: at 4,096 partitions a third of
    ``latestOffset``'s time (bench/README.md, "Planning with the collector paused")."""
    @functools.wraps(method)
    def call(*args, **kwargs):
        with _collector_paused():
            try:
                return method(*args, **kwargs)
            finally:
                if then is not None:
                    then()
    return call  # type: ignore[return-value]


# The streaming driver's process collects cyclic garbage at most this often (_planning_call).
PLANNING_COLLECT_EVERY_S = 60.0
_planning_collected_at: float | None = None


def _planning_call(method: Method) -> Method:
    """A streaming driver call (planning, committing) in Spark's planning process, which
    runs only this source's reader: the collector is paused during the call
    (``_collector_paused``), and what exists when it returns is frozen (``gc.freeze``), so
    no collection walks it again; a full collection (``gc.unfreeze``, ``gc.collect``) runs
    at most every ``PLANNING_COLLECT_EVERY_S``, at the end of a call. Paused only, the
    collections the call's allocations called for ran as soon as it returned, in Spark's
    code that writes its answer, and walked what the planner keeps (at 4,096 partitions
    the last offsets' states, ranges and lags: ~170,000 objects), 7 ms in the runner's
    JSON encoding alone per planning, and every few plannings a full one (bench/README.md,
    "Fewer objects, and none walked again"). Objects still go when nothing refers to them; only
    cyclic garbage waits for the next full collection, a minute's worth at most."""
    return _gc_paused(method, then=_freeze_collecting_rarely)


def _freeze_collecting_rarely() -> None:
    """``gc.freeze()``, after a full collection when the last was PLANNING_COLLECT_EVERY_S
    ago or more (or there was none)."""
    global _planning_collected_at
    now = time.monotonic()
    if _planning_collected_at is None or now - _planning_collected_at >= PLANNING_COLLECT_EVERY_S:
        gc.unfreeze()
        gc.collect()
        _planning_collected_at = now
    gc.freeze()


def _cause_first_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``_cause_first`` for ``read()``, whose errors come while Spark iterates the rows."""
    try:
        yield from batches
    except KWatermarkError as exc:
        if os.environ.get(FULL_TRACEBACK_ENV):
            raise
        raise exc.with_traceback(None) from None


def _simplify_planner_tracebacks() -> None:
    """Spark drops its own frames from a Python worker's traceback by default
    (``spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled``, passed to workers as
    SPARK_SIMPLIFIED_TRACEBACK) but not in the long-lived process that plans a Python stream
    (pyspark 4.3.0's python_streaming_source_runner): there a wrong address put two frames of
    Spark's runner before kwatermark's. Apply Spark's default in that process too."""
    if not os.environ.get(FULL_TRACEBACK_ENV):
        os.environ.setdefault("SPARK_SIMPLIFIED_TRACEBACK", "1")


_TASKS_TO_FREEZE_AT = 2   # a worker's first tasks freeze what it keeps (_freeze_imports)


def _freeze_imports() -> None:
    """Leave what a Python worker keeps out of its garbage collections (``gc.freeze``), at
    its first two tasks: PySpark's worker daemon runs a full ``gc.collect()`` after every
    task of a reused worker, and each walked the ~60,000 objects of pyspark, pyarrow, numpy,
    confluent-kafka and kwatermark again (bench/README.md, "The read path at steady state").
    The first task imports the read path and builds pyarrow's compute functions after its
    freeze: another ~29,000 objects, 6-12 ms of every later collection, until the second
    task freezes them. By then the daemon has collected the first task's garbage, so
    nothing is frozen that a collection would free; a task's own objects are collected as
    before."""
    global _TASKS_TO_FREEZE_AT
    if _TASKS_TO_FREEZE_AT:
        _TASKS_TO_FREEZE_AT -= 1
        gc.freeze()


class RangePartition(InputPartition):
    """One Spark task: one or more ranges read by one consumer (packing, DESIGN §12). A
    streaming task publishes its progress records (a batch read has no next batch to plan);
    ``ledger_mark`` is the driver's mark in the default progress location, ``ledger_key``
    the key of the pack's records (``BatchPlanner.pack_keys``). ``columns`` holds the ranges
    as columns (``offsets.TaskColumns``), what a task reads by; ``tasks`` as ``RangeTask``
    objects, which an unpickled partition builds only when asked."""

    def __init__(self, tasks: TaskColumns | tuple[RangeTask, ...], publish: bool = False,
                 ledger_mark: str | None = None, ledger_key: str | None = None):
        super().__init__(tasks)
        self.columns = tasks if isinstance(tasks, TaskColumns) else TaskColumns.of(tasks)
        self.publish = publish
        self.ledger_mark = ledger_mark
        self.ledger_key = ledger_key

    @property
    def tasks(self) -> tuple[RangeTask, ...]:
        return self.columns.tasks

    @property
    def value(self) -> tuple[RangeTask, ...]:
        """InputPartition's own field: the tasks (built when asked, as ``tasks``)."""
        return self.columns.tasks

    @value.setter
    def value(self, tasks: tuple[RangeTask, ...]) -> None:
        pass   # InputPartition.__init__'s; the tasks are in ``columns``

    def __reduce__(self) -> tuple:
        # Spark's runner pickles each partition with cloudpickle, whose Python-level
        # reducer_override runs for every RangeTask and PartitionState of the pack: 18 ms on
        # the driver for a 4,096-range batch, each batch, before any task starts. The C
        # pickler writes their fields as columns (offsets.task_columns) in a quarter of
        # that; the executor reads by those columns, without an object a range.
        values = dict(self.__dict__)
        columns = values.pop("columns")
        return _unpickled_partition, (pickle.dumps((values, columns.raw),
                                                   pickle.HIGHEST_PROTOCOL),)


def _unpickled_partition(data: bytes) -> RangePartition:
    # With the collector paused, as the task that reads it (_read): the columns' thousands
    # of generator snapshots otherwise set off collections; PySpark's worker collects after
    # the task.
    with _collector_paused():
        values, columns = pickle.loads(data)
    partition = RangePartition.__new__(RangePartition)
    partition.__dict__.update(values, columns=TaskColumns(columns))
    return partition


class HeartbeatPartition(InputPartition):
    """The one task of a heartbeat batch: no record, one row carrying the watermark."""

    def __init__(self, watermark_ms: int | None):
        super().__init__(watermark_ms)
        self.watermark_ms = watermark_ms


def _json_type_ddl(options: SourceOptions, role: str) -> str | None:
    """The user's ``{role}.json.schema`` as a Spark type string (DDL or Spark's JSON)."""
    schema = {k.lower(): v for k, v in options.serde_options}.get(f"{role}.json.schema")
    if schema is None:
        return None
    if schema.lstrip().startswith("{"):
        try:
            return StructType.fromJson(json.loads(schema)).simpleString()
        except (ValueError, KeyError) as exc:
            raise OptionError(f"option {role}.json.schema: not a Spark JSON schema: {exc}"
                              ) from None
    return f"struct<{schema}>"


def _single_topic(options: SourceOptions) -> str | None:
    """The one topic a query reads (``subscribe`` or ``assign`` naming exactly one), which
    gives the default Schema Registry subject; None with ``subscribePattern`` or several."""
    subscription = options.subscription
    topics = set(subscription.topics) | {t for t, _ in subscription.assigned}
    if subscription.kind != "subscribePattern" and len(topics) == 1:
        return topics.pop()
    return None


def _decoders(options: SourceOptions, spark_schema: StructType | None) -> tuple[Decoders, dict]:
    """Deserializers for key and value, and the Arrow type of each decoded column."""
    raw = dict(options.serde_options)
    raw["key.format"], raw["value.format"] = options.key_format, options.value_format
    made, types = {}, {}
    for role in ("key", "value"):
        if getattr(options, f"{role}_format") == "binary":
            made[role], types[role] = None, None
            continue
        from kwatermark import serde

        json_type = None
        column = f"{role}_decoded"
        if spark_schema is not None and column in spark_schema.fieldNames():
            json_type = to_arrow_type(spark_schema[column].dataType, timezone="UTC")
        if getattr(options, f"{role}_format") == "json" and json_type is None:
            json_type = pa.struct([])  # placeholder while Spark resolves the DDL
        try:
            made[role] = serde.make_deserializer(role, raw, json_arrow_type=json_type,
                                                 topic=_single_topic(options))
        except serde.SerdeError as exc:
            raise OptionError(str(exc)) from exc
        types[role] = made[role].arrow_type if made[role] is not None else None
    decoders = Decoders(made["key"], made["value"], options.key_on_error,
                        options.value_on_error)
    return decoders, types


def _layout(options: SourceOptions, types: dict) -> OutputLayout:
    return OutputLayout(
        include_headers=options.include_headers,
        heartbeat=options.heartbeat,
        flag_late=options.late_records == "flag",
        key_type=types["key"], value_type=types["value"],
        error_column=options.value_on_error == "null" and types["value"] is not None,
        key_error_column=options.key_on_error == "null" and types["key"] is not None)


class KWatermarkDataSource(DataSource):
    """``format("kwatermark")``: Spark's Kafka source with per-partition watermarks.

    Every row carries ``event_time`` and ``watermark``: the minimum over Kafka partitions of
    each partition's event-time watermark. See docs/options.md and docs/watermarks.md.
    """

    @classmethod
    def name(cls) -> str:
        return "kwatermark"

    def _options(self, streaming: bool | None) -> SourceOptions:
        return parse_options(dict(self.options), streaming=streaming)

    @_cause_first
    def schema(self) -> str:
        options = self._options(streaming=None)
        _, types = _decoders(options, None)
        layout = _layout(options, types)
        fields = []
        for field in layout.schema():
            ddl = _json_type_ddl(options, field.name[: -len("_decoded")]) \
                if field.name.endswith("_decoded") else None
            fields.append(f"`{field.name}` {ddl or from_arrow_type(field.type).simpleString()}")
        return ", ".join(fields)

    def _parts(self, schema: StructType, streaming: bool):
        options = self._options(streaming)
        decoders, types = _decoders(options, schema)
        layout = _layout(options, types)
        expected = [f.name for f in layout.schema()]
        if schema.fieldNames() != expected:
            raise OptionError("kwatermark does not accept a user-specified schema (as Spark's "
                              "Kafka source): remove .schema(...) from the reader; its "
                              "columns are " + ", ".join(expected) + ". (Spark does not show "
                              "the schema to the source before the query starts, so this is "
                              "reported at start() or the first action, not at load().)")
        return options, layout, decoders

    @_cause_first
    def streamReader(self, schema: StructType) -> KWatermarkStreamReader:
        return KWatermarkStreamReader(*self._parts(schema, streaming=True))

    @_cause_first
    def reader(self, schema: StructType) -> KWatermarkBatchReader:
        return KWatermarkBatchReader(*self._parts(schema, streaming=False))


def _read(options: SourceOptions, layout: OutputLayout, decoders: Decoders, planner: BatchPlanner,
          partition: RangePartition | HeartbeatPartition) -> Iterator[pa.RecordBatch]:
    """One Spark task's rows, then its progress records offered to the ledger. The cyclic
    garbage collector is paused while it runs, as for the driver's calls (``_gc_paused``):
    a task of 4,096 ranges makes some ten objects a range (its task, state, reader,
    generator, lane, progress record...), and the 60-odd collections they triggered walked
    them again and again, 23 of a 144 ms task in-process (bench/README.md, "A task's own
    work at 4,096 partitions"). PySpark's worker collects after every task. The pause lasts while Spark sends each batch too (the task
    is suspended at its ``yield``) and ends with the task, however it ends."""
    _freeze_imports()
    if isinstance(partition, HeartbeatPartition):
        yield heartbeat_batch(layout, partition.watermark_ms)
        return
    if type(partition) is InputPartition and partition.value is None:
        return  # Spark's stand-in when partitions() is empty (nothing to read): no rows
    if partition.publish:
        planner.ledger.require_shared(partition.ledger_mark)
    with _collector_paused():
        pack = PackReader(options, layout, decoders, partition.columns)
        yield from pack
        if partition.publish:
            planner.ledger.offer_pack(partition.columns, planner.fingerprint, pack.records,
                                      partition.ledger_key)
        # Freed while the collector is paused: the collection that resuming it calls for
        # then walks what the task keeps, not its thousands of readers and records.
        del pack


class KWatermarkStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader. Offsets carry every partition's watermark state (DESIGN §4)."""

    def __init__(self, options: SourceOptions, layout: OutputLayout, decoders: Decoders):
        self.options = options
        self.layout = layout
        self.decoders = decoders
        self.planner = BatchPlanner(options, layout, decoders)
        _simplify_planner_tracebacks()
        # pyspark < 4.2 calls latestOffset() with no start (kwatermark.sparkapi): the source
        # keeps it. A fresh query's first latestOffset comes before initialOffset, so the
        # initial offset is made once and kept; after that the next batch starts at the end
        # Spark last passed to partitions(start, end) — on a restart Spark passes the
        # checkpoint's last offset as partitions(last, last) before anything else
        # (AcceptsLatestSeenOffset, measured on 4.0.5 and 4.1.4).
        self._initial: dict | None = None
        self._next_start: dict | None = None
        self._warned_single_batch = False
        self._reported: tuple[dict, dict] | None = None   # reportLatestOffset's last answer

    @_cause_first
    @_planning_call
    def initialOffset(self) -> dict:
        if self._initial is None:
            self._initial = self.planner.offset_json(self.planner.initial_offset())
        return self._initial

    @_cause_first
    def prepareForTriggerAvailableNow(self) -> None:
        self.planner.prepare_available_now()

    @_cause_first
    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        if self.options.min_offsets_per_trigger is not None:
            return ReadMinRows(self.options.min_offsets_per_trigger)
        return ReadAllAvailable()

    @_cause_first
    @_planning_call
    def latestOffset(self, start: dict | None = None, limit: ReadLimit | None = None) -> dict:
        if start is None:  # pyspark < 4.2: neither start nor read limit (DESIGN §23)
            start = self._next_start if self._next_start is not None else self.initialOffset()
            limits = self._own_limits()
        elif isinstance(limit, ReadAllAvailable):
            limits = ReadLimits()
        else:
            limits = ReadLimits(max_rows=self.options.max_offsets_per_trigger,
                                respect_minimum=True)
            if isinstance(limit, ReadMaxRows):
                limits = ReadLimits(max_rows=limit.max_rows, respect_minimum=True)
        end = self.planner.latest_offset(self.planner.offset(start), limits)
        return start if end is None else self.planner.offset_json(end)

    def _own_limits(self) -> ReadLimits:
        """Spark < 4.2 passes no read limit: the source applies its own, as 4.2 does under a
        processing-time trigger. Those Spark versions run Trigger.AvailableNow and
        Trigger.Once on a Python source as one micro-batch (their fallback for sources
        without SupportsTriggerAvailableNow), and the source cannot tell which trigger runs,
        so a read limit caps that one batch too: said once, at the first trigger."""
        limited = (self.options.max_offsets_per_trigger is not None
                   or self.options.min_offsets_per_trigger is not None)
        if limited and not self._warned_single_batch:
            self._warned_single_batch = True
            log.warning(
                "pyspark %s: maxOffsetsPerTrigger/minOffsetsPerTrigger apply to every "
                "micro-batch; under Trigger.AvailableNow or Trigger.Once this Spark runs a "
                "Python source as one micro-batch, which then reads at most "
                "maxOffsetsPerTrigger records, or nothing while fewer than "
                "minOffsetsPerTrigger are there and maxTriggerDelay has not passed (Spark %s "
                "splits AvailableNow into several batches and lets Once read everything). "
                "Use a processing-time trigger, or upgrade Spark (docs/operations.md, "
                "\"Spark versions\")",
                SPARK_VERSION, ADMISSION_CONTROL_SINCE)
        return ReadLimits(max_rows=self.options.max_offsets_per_trigger,
                          respect_minimum=True)

    @_cause_first
    def reportLatestOffset(self) -> dict | None:
        """Each partition's end offset at the last trigger, in the shape of Spark's Kafka
        source (``{"topic": {"0": 42}}``): ``latestOffset`` in the query progress. Spark calls
        it right after ``latestOffset`` (pyspark >= 4.2; older ones never call it)."""
        seen = self.planner.latest_seen
        if not seen:
            return None
        if self._reported is not None and self._reported[0] is seen:
            return self._reported[1]   # an idle query asks every few ms: made once
        latest: dict[str, dict[str, int]] = {}
        for (topic, partition), end in sorted(seen.items()):
            latest.setdefault(topic, {})[str(partition)] = end
        self._reported = (seen, latest)
        return latest

    @_cause_first
    @_planning_call
    def partitions(self, start: dict, end: dict) -> list[RangePartition | HeartbeatPartition]:
        self._next_start = end  # pyspark < 4.2: where the next latestOffset() starts
        if start == end:
            return []  # Spark's AcceptsLatestSeenOffset call on a restart: no batch
        offset = self.planner.offset(end)
        if offset.heartbeat:
            return [HeartbeatPartition(offset.watermark)]
        mark = self.planner.ledger.driver_mark()
        packs = self.planner.packed_tasks(offset)
        keys = self.planner.pack_keys(offset)
        return [RangePartition(tasks, True, mark, key) for tasks, key in zip(packs, keys)]

    def read(self, partition: RangePartition) -> Iterator[pa.RecordBatch]:
        return _cause_first_rows(
            _read(self.options, self.layout, self.decoders, self.planner, partition))

    @_cause_first
    @_planning_call
    def commit(self, end: dict) -> None:
        self.planner.commit(self.planner.offset(end))


class KWatermarkBatchReader(DataSourceReader):
    """``spark.read.format("kwatermark")``: one micro-batch starting with no state, so with
    several partitions the ``watermark`` column is null (docs/watermarks.md)."""

    def __init__(self, options: SourceOptions, layout: OutputLayout, decoders: Decoders):
        self.options = options
        self.layout = layout
        self.decoders = decoders
        self.planner = BatchPlanner(options, layout, decoders)

    @_cause_first
    @_gc_paused
    def partitions(self) -> list[RangePartition]:
        offset = self.planner.batch_offset()
        return [RangePartition(tasks) for tasks in self.planner.packed_tasks(offset)]

    def read(self, partition: RangePartition) -> Iterator[pa.RecordBatch]:
        return _cause_first_rows(
            _read(self.options, self.layout, self.decoders, self.planner, partition))
