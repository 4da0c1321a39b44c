"""The compiled read engine (DESIGN §19): one planned range, or a pack of them, read by a small
C extension (``kwatermark._fastread``, built by cffi at install) that copies librdkafka's
messages straight into Arrow buffers, 10,000 records a call; no Python object per record.

The contract is ``kwatermark.reader``'s and ``kwatermark.pack``'s, whose ``RangeReader``s
keep every range's state, decoding, event times, watermarks and progress record: only the
consume loop is here. A range is done when its position reaches its end (``range_end``:
records past it, an end-of-partition event, or the consumer's position after a short call),
``kafkaConsumer.pollTimeoutMs`` bounds the time without progress, the librdkafka
configuration is ``consumer.task_conf``'s and errors read as the Python engine's.

librdkafka is the one the confluent-kafka wheel ships, found next to the package (its file
name carries a hash that changes every release) and opened with ``dlopen``; the extension
uses its legacy ``rd_kafka_consume_start_queue``/``rd_kafka_consume_batch_queue`` API, which
needs no ``group.id``.
"""

from __future__ import annotations

import atexit
import glob
import logging
import os
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTP

from kwatermark import arrow
from kwatermark.consumer import (
    MAX_CONSUME,
    learn_topics,
    partition_bounds,
    task_conf,
)
from kwatermark.errors import BrokerError, KWatermarkError, OptionError
from kwatermark.faults import fault_point, faults_armed
from kwatermark.ledger import record_columns
from kwatermark.offsets import TaskColumns
from kwatermark.options import SourceOptions
from kwatermark.range_end import Stall, advance, done
from kwatermark.rdkafka_log import librdkafka_logger
from kwatermark.reader import Computed, Decoders, RangeColumns, RangeReader, ranges_at_once
from kwatermark.records import RecordBlock
from kwatermark.retries import transient
from kwatermark.security import refusal_hint

log = logging.getLogger("kwatermark.compiled")

# A block is handed over at arrow.maxRecordsPerBatch records or this many bytes of keys,
# values and header values, whichever comes first: Arrow's binary columns have 32-bit offsets.
MAX_BLOCK_BYTES = 256 << 20
ERROR_TEXT = 512
# A task asks no offsets before it reads (CompiledReader._read). When nothing has come for
# this long, it asks the earliest and end offsets of its partitions not asked yet: an unknown
# partition, records gone, or brokers that do not answer then fail as before, with the
# offsets query's message and retries, not only after kafkaConsumer.pollTimeoutMs.
BOUNDS_AFTER_S = 1.0
MAX_PARTITIONS = 1 << 16   # leaders read per topic (a topic has at most some thousands)
# librdkafka pays for each partition started, and again for each stopped, a pass over every
# partition the consumer knows (bench/README.md, "What librdkafka does per partition at
# 4,096"): ~20 µs a stop at 512, 45-60 µs at 4,096. A task of more than MANY_PARTITIONS
# partitions stops none of them as its ranges end (if it still reads STOP_AFTER_S later, it
# pauses its finished partitions, which would go on fetching past their ranges and take the
# Fetch answers' room from the others; stopped, the next task had to start them again, and
# at 4,096 partitions that took it past STOP_AFTER_S too) and, at its end, pauses the rest
# where they stand with the records it polled past its ranges (kw_park; what librdkafka had
# fetched and it had not polled is fetched again: the pause outdates it); the worker keeps
# the consumer, its next task resumes each partition whose range begins where the last
# ended (kw_start).
MANY_PARTITIONS = 1024
# So does a task of more than PARK_PARTITIONS partitions whose ranges are all of at most
# PARK_RANGE records (parks()). A stop waits for the partition's broker thread
# (rd_kafka_consume_stop is synchronous), which parses the other partitions' Fetch answers
# meanwhile: a 256-partition task catching up 80 records a partition (a 512-partition
# topic's micro-batch is two such tasks) spent 13-36 ms stopping its partitions one by one,
# and the next task started them all again; it took 126-168 ms against 34-46 parked, and
# through Spark the micro-batch 712-730 ms against 364-427, 4 partitions' 374-415
# (bench/README.md, "Tasks of hundreds of partitions park too"). A parked partition may
# carry twice its range (KW_CARRY_MIN in csrc/fastread.c), held in memory between tasks:
# over long ranges, which make a stop's cost small beside the reading, that would be up to
# twice the task's records, so they stop as before. Tasks of up to 64 partitions (a
# 64-partition topic's two) stop theirs too: the micro-batch was already within 1.1x of 4
# partitions'.
PARK_PARTITIONS = 64
PARK_RANGE = 1024
# A task that parks (parks()) asks librdkafka to keep at least this many records a
# partition fetched ahead (its prefetch, kwatermark.consumer.prefetch, otherwise
# all of a range's records where they are few): successive micro-batches, whose longest
# range differs by a record or two, then share one configuration, so one kept consumer, and
# resume its parked partitions. With the prefetch following the longest range (2, 3 or 4
# records at 4,096 partitions and 8,192 records a batch), a worker's tasks took turns on
# four consumers whose partitions each stood batches behind, and none resumed. The same as
# the extension's KW_CARRY_MIN: what a partition keeps past its range.
MANY_PREFETCH = 64
# The longest a new consumer of a task that parks (parks()) waits for its topics'
# metadata before it starts reading (_Client.learn_topics; ~45 ms at 4,096
# partitions, librdkafka taking in every partition); a slower answer is not waited for.
LEARN_TOPIC_S = 1.0
# A parked consumer's partition leaders (which kw_start wakes, one seek a leader) are asked
# again once this old: leadership moves while a consumer is parked (a preferred leader
# election after a restart, a reassignment) and no paused partition says so; a node that
# came to lead only partitions no seek reaches left every task waiting up to a second for
# its broker thread (0.4-1.0 s against 7-22 ms, tests/integration/test_cluster_faults.py).
# One metadata request a topic: ~20-45 ms at 4,096 partitions, every LEADERS_FRESH_S of a
# steady stream. (A task's own lookups after a failure, list_topics, refresh them too.)
LEADERS_FRESH_S = 10.0
STOP_AFTER_S = 1.0


def parks(partitions: int, longest: int) -> bool:
    """Whether a task of ``partitions`` partitions, the longest of whose ranges has
    ``longest`` records, parks its partitions at its end rather than stopping them
    (``MANY_PARTITIONS``; ``PARK_PARTITIONS`` with ``PARK_RANGE``)."""
    return partitions > MANY_PARTITIONS or (partitions > PARK_PARTITIONS
                                            and longest <= PARK_RANGE)


try:
    from kwatermark._fastread import ffi, lib
except ImportError as exc:   # not built: no C compiler at install (docs/operations.md)
    ffi = lib = None
    _MISSING = f"kwatermark._fastread is not built ({exc})"
else:
    _MISSING = None

_state: dict[str, object] = {}

def librdkafka_path() -> str | None:
    """The librdkafka the installed confluent-kafka loads: beside its package (Linux wheels:
    ``confluent_kafka.libs/librdkafka-<hash>.so.1``; macOS: ``confluent_kafka/.dylibs``)."""
    import confluent_kafka
    package = os.path.dirname(confluent_kafka.__file__)
    for pattern in (os.path.join(package + ".libs", "librdkafka*.so*"),
                    os.path.join(package, ".dylibs", "librdkafka*.dylib"),
                    os.path.join(package, "librdkafka*")):
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None

def unavailable() -> str | None:
    """Why the compiled engine cannot run here (None: it can), loading librdkafka once."""
    if "reason" in _state:
        return _state["reason"]
    reason = _MISSING
    if reason is None:
        path = librdkafka_path()
        if path is None:
            reason = "no librdkafka found beside the confluent_kafka package"
        else:
            err = ffi.new("char[]", ERROR_TEXT)
            if lib.kw_load(path.encode(), err, ERROR_TEXT) != 0:
                reason = f"cannot load {path}: {ffi.string(err).decode(errors='replace')}"
    _state["reason"] = reason
    return reason

def use_compiled(options: SourceOptions) -> bool:
    """The engine that reads (DESIGN §19): ``readEngine``, else compiled where built. Says
    which at INFO once per process; ``readEngine=compiled`` where it is not built fails."""
    reason = unavailable()
    if options.read_engine == "compiled" and reason is not None:
        raise OptionError(f"option readEngine=compiled: the compiled read engine is not "
                          f"available in this installation: {reason}. Reinstall kwatermark "
                          f"where a C compiler exists, or set readEngine=python")
    compiled = reason is None and options.read_engine != "python"
    said = ("compiled" if compiled else "python", options.read_engine)
    if _state.get("said") != said:
        _state["said"] = said
        if compiled:
            log.info("kwatermark read engine: compiled (librdkafka %s into Arrow buffers)",
                     ffi.string(lib.kw_version()).decode())
        elif options.read_engine == "python":
            log.info("kwatermark read engine: python (readEngine=python)")
        else:
            log.info("kwatermark read engine: python (%s)", reason)
    return compiled

if ffi is not None:
    _LEVELS = {0: logging.CRITICAL, 1: logging.CRITICAL, 2: logging.CRITICAL,
               3: logging.ERROR, 4: logging.WARNING, 5: logging.INFO, 6: logging.INFO,
               7: logging.DEBUG}

    def _log_error(exception, exc_value, traceback) -> None:
        pass   # a log line that cannot be logged must not take librdkafka's thread down

    @ffi.def_extern(onerror=_log_error)
    def kw_log_py(level, fac, name, buf) -> None:
        # as confluent-kafka's `logger` setting formats them (kwatermark.rdkafka_log)
        librdkafka_logger().log(_LEVELS.get(level, logging.INFO), "%s [%s] %s",
                                ffi.string(fac).decode(errors="replace"),
                                ffi.string(name).decode(errors="replace"),
                                ffi.string(buf).decode(errors="replace"))

def _partition_arrays(tps: list[tuple[str, int]]) -> tuple[dict, object, object]:
    """``kw_offsets``' topic and partition arrays for ``tps``, and the topic names' C strings
    they point into (kept alive with them)."""
    names = {topic: ffi.new("char[]", topic.encode()) for topic in {t for t, _ in tps}}
    return (names, ffi.new("char *[]", [names[t] for t, _ in tps]),
            ffi.new("int32_t[]", [p for _, p in tps]))


class _Client:
    """One librdkafka consumer handle of the extension; ``offsets_for_times`` answers as
    confluent-kafka's ``Consumer`` does, so ``consumer.partition_bounds`` serves both."""

    def __init__(self, conf: dict, headers: bool, max_records: int, pool_key: tuple = ()):
        self.key = pool_key   # _Clients' key: the configuration it was made with
        # topics whose metadata it has, and when it was asked (learn_topics)
        self.described: dict[str, float] = {}
        self._asked: tuple | None = None   # clean_offsets' last partitions and C arrays
        self._topics_room = (1024, 65536)   # topic_counts' room: topics, bytes of names
        names, values = [], []
        for key, value in conf.items():
            if isinstance(value, bool):
                value = "true" if value else "false"
            names.append(ffi.new("char[]", str(key).encode()))
            values.append(ffi.new("char[]", str(value).encode()))
        err = ffi.new("char[]", ERROR_TEXT)
        self.handle = lib.kw_open(ffi.new("char *[]", names), ffi.new("char *[]", values),
                                  len(names), int(headers), max_records, MAX_BLOCK_BYTES, err,
                                  ERROR_TEXT)
        if self.handle == ffi.NULL:
            raise KWatermarkError(f"cannot create a Kafka consumer from the kafka.* options: "
                                  f"{ffi.string(err).decode(errors='replace')}")

    chunks = True   # consumer.chunked_offsets: offsets_for_times takes its chunk size

    def offsets_for_times(self, tps: list, timeout: float, chunk: int = 0) -> list:
        """As confluent-kafka's, asked ``chunk`` partitions a request (all at once: 0), in C
        (``kw_offsets``) without the GIL."""
        n = len(tps)
        # the names stay referenced (alive) until the call returns
        _names, topics, partitions = _partition_arrays([(tp.topic, tp.partition) for tp in tps])
        offsets = ffi.new("int64_t[]", [tp.offset for tp in tps])
        errors = ffi.new("int32_t[]", n)
        self._offsets(topics, partitions, offsets, errors, n, chunk, timeout)
        found = np.frombuffer(ffi.buffer(offsets), dtype=np.int64).tolist()
        failed = np.frombuffer(ffi.buffer(errors), dtype=np.int32)
        # confluent-kafka's TopicPartition where it answered (made in C), a stand-in with
        # the error where not: thousands per planning on the driver
        answer = [KafkaTP(tp.topic, tp.partition, offset) for tp, offset in zip(tps, found)]
        for i in np.flatnonzero(failed).tolist():
            answer[i] = SimpleNamespace(topic=tps[i].topic, partition=tps[i].partition,
                                        offset=found[i], error=KafkaError(int(failed[i])))
        return answer

    def clean_offsets(self, tps: list[tuple[str, int]], which: int, timeout: float,
                      chunk: int) -> dict[tuple[str, int], int]:
        """``which`` offset (``OFFSET_END``, ``OFFSET_BEGINNING``) of each of ``tps``, only
        where answered without an error and with an offset: :meth:`offsets_for_times` for
        the driver's lookups (``KafkaMetadata._quick``), without its object per partition
        either way. The C arrays of the last list asked are kept: the driver asks the same
        partitions every planning, on a thread of its own while the main thread folds the
        last batch, and Python work before the call waits for the GIL there."""
        known = self._asked
        if known is None or known[0] != tps:
            known = self._asked = (list(tps), *_partition_arrays(tps))
        n = len(tps)
        offsets = ffi.new("int64_t[]", n)
        asked = np.frombuffer(ffi.buffer(offsets), dtype=np.int64)
        asked[:] = which
        errors = ffi.new("int32_t[]", n)
        self._offsets(known[2], known[3], offsets, errors, n, chunk, timeout)
        clean = (np.frombuffer(ffi.buffer(errors), dtype=np.int32) == 0) & (asked >= 0)
        if clean.all():
            return dict(zip(known[0], asked.tolist()))
        return {tps[i]: int(asked[i]) for i in np.flatnonzero(clean).tolist()}

    def _offsets(self, topics, partitions, offsets, errors, n: int, chunk: int,
                 timeout: float) -> None:
        code = lib.kw_offsets(self.handle, topics, partitions, offsets, errors, n, chunk,
                              int(timeout * 1000))
        if code:
            raise KafkaException(KafkaError(code))

    def partition_count(self, topic: str, timeout: float) -> int:
        """How many partitions ``topic`` has, as the brokers say now; an error (a topic
        that does not exist or cannot be described, no answer) raises, as ``KafkaException``."""
        err = ffi.new("int *")
        count = lib.kw_metadata(self.handle, topic.encode(), int(timeout * 1000), ffi.NULL, 0,
                                ffi.NULL, 0, err)
        if count < 0:
            raise KafkaException(KafkaError(err[0]))
        if count == 0:
            raise KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART,
                                            f"no partitions of topic {topic} in the answer"))
        return count

    def topic_counts(self, timeout: float) -> dict[str, int]:
        """Every topic the brokers know and its partition count, from one metadata request
        for the whole cluster (a ``subscribePattern``'s topics, ``broker.KafkaMetadata``):
        one C call, where confluent-kafka's ``list_topics()`` makes a Python object per
        partition of the cluster. A topic whose metadata has an error is left out, as
        there; a request that fails raises, as ``KafkaException``."""
        while True:
            topics, size = self._topics_room
            names, counts = ffi.new("char[]", size), ffi.new("int32_t[]", topics)
            needed, err = ffi.new("size_t *"), ffi.new("int *")
            n = lib.kw_topic_counts(self.handle, int(timeout * 1000), names, size, needed,
                                    counts, topics, err)
            if n < 0:
                raise KafkaException(KafkaError(err[0]))
            if n <= topics and needed[0] <= size:
                break
            self._topics_room = (max(topics, 2 * n), max(size, 2 * needed[0]))
        listed = ffi.unpack(names, needed[0]).split(b"\0")[:n]
        return dict(zip((name.decode() for name in listed), ffi.unpack(counts, n)))

    def learn_topics(self, topics: Iterable[str]) -> None:
        """Learn ``topics`` before any of their partitions starts (``consumer.learn_topics``),
        one request a topic, by tasks that park (``parks``): once per consumer, and again
        once what it learned is ``LEADERS_FRESH_S`` old. The answer also
        gives the extension each partition's leader (``kw_start`` wakes each leader's
        fetching once)."""
        now = time.monotonic()
        stale = [topic for topic in topics if topic not in self.described
                 or now - self.described[topic] >= LEADERS_FRESH_S]
        for topic in learn_topics(lambda topic: self.partition_count(topic, LEARN_TOPIC_S),
                                  stale):
            self.described[topic] = now

    def leader(self, topic: str, partition: int) -> int:
        """The leader of ``topic``'s ``partition`` as the consumer last learned it (-1:
        unknown), which ``kw_start`` wakes."""
        return lib.kw_leader(self.handle, topic.encode(), partition)

    def list_topics(self, topic: str, timeout: float) -> SimpleNamespace:
        """``topic``'s metadata, shaped as confluent-kafka's ``ClusterMetadata`` where
        ``kwatermark.consumer`` and ``retries.leader_of`` read it (each partition's leader,
        the brokers' addresses). Asking refreshes librdkafka's cached leaders and epochs."""
        leaders = ffi.new("int32_t[]", [-1] * MAX_PARTITIONS)
        brokers = ffi.new("char[]", 8192)
        err = ffi.new("int *")
        count = lib.kw_metadata(self.handle, topic.encode(), int(timeout * 1000), leaders,
                                MAX_PARTITIONS, brokers, 8192, err)
        if count < 0:
            raise KafkaException(KafkaError(err[0]))
        nodes = {}
        for line in ffi.string(brokers).decode(errors="replace").splitlines():
            node, host, port = line.split(" ")
            nodes[int(node)] = SimpleNamespace(id=int(node), host=host, port=int(port))
        partitions = {p: SimpleNamespace(id=p, leader=leaders[p])
                      for p in range(min(count, MAX_PARTITIONS))}
        return SimpleNamespace(brokers=nodes, topics={
            topic: SimpleNamespace(topic=topic, partitions=partitions, error=None)})

    def close(self, stop: bool = True) -> None:
        """Destroy the consumer; with ``stop=False`` its partitions are not stopped one by
        one first (``kw_discard``). Once: a closed client does nothing."""
        if self.handle == ffi.NULL:
            return
        (lib.kw_close if stop else lib.kw_discard)(self.handle)
        self.handle = ffi.NULL


class _Clients:
    """The consumers a Python worker keeps between its tasks, as Spark's Kafka source keeps
    its consumers in a pool (``spark.kafka.consumer.cache.*``): a task otherwise spent
    ~10 ms before its first record creating a librdkafka handle, connecting and learning
    the topic's leaders (docs/operations.md, "Read engines").

    A consumer is shared only by tasks with the same librdkafka configuration (the same
    ``kafka.*`` options, prefetch and fetch size) and used by one task at a time: ``take``
    removes it, ``give_back`` returns it reset (``kw_reset``: every partition stopped,
    nothing the last task fetched left to read) or, after a task that parks (``parks``),
    parked (``kw_park``: every partition paused, what was polled past the task's ranges
    kept for the next). A task that fails, or that Spark
    stops early, closes its consumer instead. At most ``CAPACITY`` are kept; a
    thread closes one unused for ``IDLE_S`` (its connections otherwise stay open, and it
    reports a broker gone in the meantime as errors, in a worker no task uses), and so does
    the interpreter's exit (before librdkafka's threads could log into a finalizing
    Python)."""

    CAPACITY = 4
    IDLE_S = 60.0

    def __init__(self):
        self.kept: dict[tuple, tuple[_Client, float]] = {}
        self.lock = threading.Lock()
        self.evictor: threading.Thread | None = None
        self.shut = False   # the interpreter exits: nothing is kept any more

    def take(self, conf: dict, headers: bool, max_records: int) -> _Client:
        key = (tuple(sorted((str(k), str(v)) for k, v in conf.items())), headers,
               max_records)
        with self.lock:
            entry = self.kept.pop(key, None)
        if entry is not None:
            return entry[0]
        return _Client(conf, headers, max_records, key)

    def give_back(self, client: _Client, parked: bool = False) -> None:
        if (lib.kw_park if parked else lib.kw_reset)(client.handle) != 0:
            client.close()
            return
        with self.lock:
            # two were in use, or the interpreter exits
            surplus = [client] if client.key in self.kept or self.shut else []
            if not surplus:
                self.kept[client.key] = (client, time.monotonic())
            while len(self.kept) > self.CAPACITY:
                surplus.append(self.kept.pop(next(iter(self.kept)))[0])
            if self.evictor is None and not self.shut:
                self.evictor = threading.Thread(target=self._evict, daemon=True,
                                                name="kwatermark-consumers")
                self.evictor.start()
                atexit.register(self.shut_down)
        for extra in surplus:
            extra.close()

    def _evict(self) -> None:
        while True:
            time.sleep(self.IDLE_S / 4)
            self.close_all(idle_s=self.IDLE_S)

    def shut_down(self) -> None:
        with self.lock:
            self.shut = True
        self.close_all()

    def close_all(self, idle_s: float = 0.0) -> None:
        now = time.monotonic()
        with self.lock:
            idle = [key for key, (_, since) in self.kept.items() if now - since >= idle_s]
            closing = [self.kept.pop(key)[0] for key in idle]
        for client in closing:
            client.close()

_clients = _Clients()

def offsets_client(options: SourceOptions, conf: dict, owner: object) -> _Client | None:
    """A client of the extension for the driver's offsets lookups, or None where the
    compiled engine does not read (not built, or ``readEngine=python``). Closed when
    ``owner`` (its ``broker.KafkaMetadata``) is collected, or at the interpreter's exit."""
    if unavailable() is not None or options.read_engine == "python":
        return None
    conf = {k: v for k, v in conf.items() if k != "logger"}   # the extension logs itself
    client = _Client(conf, False, 1)
    weakref.finalize(owner, client.close)
    return client

class CompiledReader:
    """Read the ranges of a task (``tasks``, DESIGN §12: one or many) with one compiled
    consumer. Where ``reader.ranges_at_once`` holds, the ranges are computed together as
    columns (``RangeColumns``) from their first block to their last and ``records`` comes
    from those columns: no object a range; else each range's ``RangeReader`` computes its
    blocks and makes its progress record. A range's ``RangeReader`` is made where an error
    or a check names the range (``reader(row)``). ``records``, the ranges' progress records
    as columns (``ProgressLedger.publish_pack``), is set once every range is read.

    >>> for parts in CompiledReader(options, layout, decoders, tasks).read(): ...  # doctest: +SKIP
    """

    def __init__(self, options: SourceOptions, layout: arrow.OutputLayout, decoders: Decoders,
                 tasks: TaskColumns):
        self.options = options
        self.layout = layout
        self.decoders = decoders
        self.tasks = tasks
        self.records: dict[str, list] | None = None
        self._readers: dict[int, RangeReader] = {}
        self._columns = (RangeColumns(options, tasks) if ranges_at_once(options, decoders)
                         else None)
        self._client: _Client | None = None
        self._checked: set[tuple[str, int]] = set()   # partitions whose bounds were asked

    def reader(self, row: int) -> RangeReader:
        """The ``RangeReader`` of the task's ``row``-th range, made the first time."""
        made = self._readers.get(row)
        if made is None:
            made = self._readers[row] = RangeReader(self.options, self.layout, self.decoders,
                                                    self.tasks.task(row))
        return made

    def read(self) -> Iterator[list]:
        """Yields lists of ``(block, computed)`` parts, each ready to assemble."""
        tasks = self.tasks
        reading = [row for row, (start, end) in enumerate(zip(tasks.start, tasks.end))
                   if end > start]
        planned: dict[tuple[str, int], int] = {}
        for row in reading:
            tp = (tasks.topic[row], tasks.partition[row])
            planned[tp] = planned.get(tp, 0) + tasks.end[row] - tasks.start[row]
        if planned:
            longest = max(planned.values())
            many = parks(len(planned), longest)
            conf = task_conf(self.options, max(longest, MANY_PREFETCH) if many else longest,
                             len(planned))
            conf.pop("logger", None)   # the extension logs to the same logger itself
            if not self.options.group_id:
                conf.pop("group.id", None)   # the legacy API needs none; no commits, no group
            client = _clients.take(conf, self.layout.include_headers,
                                   self.options.records_per_batch(True))
            try:
                yield from self._read(client, reading, park=many)
            except BaseException:   # a failure, or Spark stopping early: a consumer of its own
                client.close(stop=not many)
                raise
            _clients.give_back(client, parked=many)
        if self._columns is not None:
            self.records = self._columns.records()
        else:
            self.records = record_columns([self.reader(row)._progress()
                                           for row in range(len(tasks))])

    def _read(self, client: _Client, reading: list[int], park: bool = False
              ) -> Iterator[list]:
        # No offsets asked before reading: a range starts fetching at its planned start, and
        # a partition's earliest and end offsets are asked only when its answers say records
        # are missing (_check_bounds). Asked up front, they held every task's first fetch
        # for a ListOffsets round trip; a 4,096-range task spent 0.2-0.5 s in them.
        self._client = client
        tasks = self.tasks
        by_tp: dict[tuple[str, int], list[int]] = {}
        for row in reading:   # a partition's lanes side by side (kw_start, lane_of)
            by_tp.setdefault((tasks.topic[row], tasks.partition[row]), []).append(row)
        handle = client.handle
        names = {topic: topic.encode() for topic, _ in by_tp}
        added: list[tuple[int, int, tuple[str, int]]] = []
        for tp, rows in by_tp.items():
            name, partition = names[tp[0]], tp[1]
            for row in rows:
                index = lib.kw_add_lane(handle, name, partition, tasks.start[row],
                                        tasks.end[row])
                if index < 0:
                    raise KWatermarkError(f"topic {tp[0]}: the compiled reader cannot open it")
                added.append((index, row, tp))
        # Each lane's address only once every lane is added: adding one may move them all
        # (kw_add_lane grows the array). Taken earlier, the first 8 lanes of a pack of more
        # than 8 ranges pointed into freed memory and their ranges ended unread.
        armed = faults_armed()
        lanes = [_Lane(index, row, tp, lib.kw_lane_at(handle, index), self,
                       fault_point(tasks.task(row)) if armed else None)
                 for index, row, tp in added]
        if park:
            client.learn_topics(set(names))
        err = ffi.new("char[]", ERROR_TEXT)
        if lib.kw_start(handle, int(park), err, ERROR_TEXT) != 0:
            first = lanes[0]
            raise BrokerError(f"topic {first.tp[0]}, partition {first.tp[1]}, offset "
                              f"{first.c.position}: "
                              f"{ffi.string(err).decode(errors='replace')}")
        by_index = {lane.index: lane for lane in lanes}
        # The open lanes' indexes, in lane order: the extension scans them after each poll
        # (kw_ready, kw_settle, kw_skip_gaps), so a poll costs no Python work per open range.
        n_open = len(lanes)
        open_ids = ffi.new("int32_t[]", [lane.index for lane in lanes])
        ready_ids = ffi.new("int32_t[]", n_open)
        left = ffi.new("int64_t *")
        # Where every range allows it, the ranges are computed together from the first block
        # to the last (RangeColumns, by the task's row; a lane's row from its index).
        columns = self._columns
        row_of = None
        if columns is not None:
            row_of = np.empty(max(index for index, _, _ in added) + 1, dtype=np.int64)
            row_of[[index for index, _, _ in added]] = [row for _, row, _ in added]
        faulty = [lane for lane in lanes if lane.fault is not None]
        size = self.options.records_per_batch(True)
        stall = Stall(self.options.poll_timeout_ms / 1000.0, time.monotonic())
        began = stall.last
        stop_done = not park
        ready: list = []
        ready_rows = 0
        was_short = False
        remaining = sum(tasks.end[row] - tasks.start[row] for row in reading)
        while n_open:
            asked = max(1, min(MAX_CONSUME, size, remaining))
            wait_ms = int(stall.wait_s(time.monotonic()) * 1000)
            status = lib.kw_poll(handle, asked, wait_ms)
            got = lib.kw_got(handle)
            if got >= 0:
                was_short = got < asked
            if status == lib.KW_EVENT:
                self._on_event(handle, lanes)
            elif status == lib.KW_FAILED:
                raise self._failed(handle, by_index[open_ids[0]])
            elif status == lib.KW_DRAINED and was_short:
                # every open range to its partition's position, past markers and filtered
                # records (range_end.advance)
                lib.kw_skip_gaps(handle, open_ids, n_open)
            full = lib.kw_event_lane(handle) if status == lib.KW_FULL else -1
            n_ready = lib.kw_ready(handle, open_ids, n_open, size, full, ready_ids)
            if n_ready:
                for block, computed in self._take(
                        handle, [by_index[i] for i in ffi.unpack(ready_ids, n_ready)],
                        columns, row_of, size):
                    ready.append((block, computed))
                    ready_rows += len(block)
            if time.monotonic() - stall.last >= BOUNDS_AFTER_S:
                unchecked = [lane for lane in _listed(by_index, open_ids, n_open)
                             if not done(lane.c.position, lane.c.end)
                             and lane.tp not in self._checked]
                if unchecked:   # a partition gone, its records gone, or every broker down?
                    self._check_bounds(handle, unchecked)
            if not stop_done and time.monotonic() - began >= STOP_AFTER_S:
                lib.kw_stop_done(handle)   # a long task: finished partitions stop fetching
                stop_done = True
            n_open = lib.kw_settle(handle, open_ids, n_open, left, stop_done)
            now = time.monotonic()
            if left[0] < remaining:
                stall.progressed(now)
            elif stall.expired(now):
                for lane in _listed(by_index, open_ids, n_open):
                    # as PackReader._expired: data loss or a BrokerError
                    lane.c.position = lane.reader._expired(lane.c.position, lane.c.end)
                stall.progressed(now)
                n_open = lib.kw_settle(handle, open_ids, n_open, left, stop_done)
            remaining = left[0]
            if ready and (ready_rows >= size or not n_open):
                yield ready
                ready, ready_rows = [], 0
            if faulty:
                self._trip_faults(faulty)

    def _take(self, handle, lanes: list[_Lane], columns: RangeColumns | None,
              row_of: np.ndarray | None, size: int) -> Iterator[tuple[RecordBlock, Computed]]:
        """The records of ``lanes`` (each holding some), computed: one block a range, or,
        where every range allows it (``columns``), blocks of many ranges at once, of up to
        ``size`` records and ``MAX_BLOCK_BYTES`` (Arrow's 32-bit offsets)."""
        headers = self.layout.include_headers
        if columns is None:
            for lane in lanes:
                block = lane.take(handle, headers)
                yield block, lane.reader._compute(block)
            return
        group: list[_Lane] = []
        rows = nbytes = 0
        for lane in lanes:
            c = lane.c
            n, used = c.n, c.key.len + c.value.len + c.hkey.len + c.hvalue.len
            if group and (rows + n > size or nbytes + used > MAX_BLOCK_BYTES):
                yield _take_ranges(handle, group, headers, columns, row_of)
                group, rows, nbytes = [], 0, 0
            group.append(lane)
            rows += n
            nbytes += used
        if group:
            yield _take_ranges(handle, group, headers, columns, row_of)

    def _on_event(self, handle, lanes: list[_Lane]) -> None:
        """An error message for a partition: as ``RangeReader._on_error`` and
        ``PackReader._on_error``, for every range of the partition still open."""
        code = lib.kw_event_err(handle)
        offset = lib.kw_event_offset(handle)
        text = ffi.string(lib.kw_event_text(handle)).decode(errors="replace")
        first = next(lane for lane in lanes if lane.index == lib.kw_event_lane(handle))
        task = first.reader.task
        if code not in (KafkaError._PARTITION_EOF, KafkaError._AUTO_OFFSET_RESET,
                        KafkaError.OFFSET_OUT_OF_RANGE):
            if transient(KafkaError(code, text)):
                return  # librdkafka moves to the new leader itself; the stall clock runs
            raise BrokerError(f"topic {task.topic}, partition {task.partition}, offset "
                              f"{first.c.position}: {text}"
                              f"{refusal_hint(KafkaError(code, text), self.options)}")
        if code != KafkaError._PARTITION_EOF:
            self._out_of_range(handle, lanes, first, text)
            return
        if offset < first.c.end and task.tp not in self._checked:
            # A partition that ends before its range: records lost, or a wait (below)?
            self._check_bounds(handle, self._open(lanes, first))
        for lane in self._open(lanes, first):
            # Every record before the log's end has been delivered: past `end`, the range's
            # last offsets were gaps (compaction, transaction markers). Before it: a new
            # leader catching up, a wait (RangeReader._on_error, _expired).
            lane.reader.ended_at = offset
            lane.c.position = (advance(lane.c.position, offset, lane.c.end)
                               if offset < lane.c.end else lane.c.end)

    @staticmethod
    def _open(lanes: list[_Lane], first: _Lane) -> list[_Lane]:
        """The ranges of ``first``'s partition not done, from ``first`` on."""
        return [lane for lane in lanes if lane.tp == first.tp
                and lane.index >= first.index and not done(lane.c.position, lane.c.end)]

    def _check_bounds(self, handle, lanes: list[_Lane]) -> None:
        """Ask the earliest and end offsets of the partitions of ``lanes`` (open ranges) and
        cut the ranges to them (``RangeReader._check_range``: data loss, or a warning and
        the rest read under ``failOnDataLoss=false``); a partition whose first open range
        now starts elsewhere is fetched again from there."""
        tasks = {lane.tp: lane.reader.task for lane in lanes}
        self._checked.update(tasks)
        bounds = partition_bounds(self._client, self.options, list(tasks.values()))
        before = _first_open(lanes)
        for lane in lanes:
            if not done(lane.c.position, lane.c.end):
                start, end = lane.reader._check_range(*bounds[lane.tp],
                                                      lane.c.position, lane.c.end)
                lane.c.end = end
                lane.c.position = min(start, end)
        for tp, lane in _first_open(lanes).items():
            if lane.c.position != before[tp].c.position and \
                    lib.kw_restart_lane(handle, lane.index, lane.c.position):
                raise BrokerError(f"topic {tp[0]}, partition {tp[1]}, offset "
                                  f"{lane.c.position}: cannot fetch it again")

    def _out_of_range(self, handle, lanes: list[_Lane], first: _Lane, text: str) -> None:
        """The broker no longer holds ``first``'s position, and librdkafka stops fetching
        the partition: records lost to retention or a recreated topic, which the partition's
        bounds tell (``_check_bounds``). A position the bounds still hold is reported as it
        came, and the partition's ranges end."""
        position = first.c.position
        self._check_bounds(handle, self._open(lanes, first))
        still = self._open(lanes, first)
        if still and still[0].c.position == position:
            for lane in still:
                lane.reader._data_loss(f"offset {lane.c.position} is out of range: {text}")
                lane.c.position = lane.c.end

    def _failed(self, handle, lane: _Lane) -> BrokerError:
        task = lane.reader.task
        return BrokerError(f"topic {task.topic}, partition {task.partition}, offset "
                           f"{lane.c.position}: "
                           f"{ffi.string(lib.kw_event_text(handle)).decode(errors='replace')}")

    def _trip_faults(self, faulty: list[_Lane]) -> None:
        """Tests only (kwatermark.faults): a task's first attempt fails once, mid-range."""
        from kwatermark.pack import trip_pack_fault
        for lane in faulty:
            if not done(lane.c.position, lane.c.end) and lane.c.position > lane.fault:
                trip_pack_fault(self.tasks.tasks, lane.reader.task)


def _listed(by_index: dict[int, _Lane], ids, n: int) -> list[_Lane]:
    """The lanes whose indexes are the first ``n`` of ``ids`` (an ``int32_t[]``)."""
    return [by_index[i] for i in ffi.unpack(ids, n)]


def _take_ranges(handle, lanes: list[_Lane], headers: bool, columns: RangeColumns,
                 row_of: np.ndarray) -> tuple[RecordBlock, Computed]:
    """The records of several lanes as one block of their ranges (``RecordBlock.placed``),
    computed at once (``columns``, the task's ranges by row)."""
    indexes = [lane.index for lane in lanes]
    counts = np.empty(len(lanes), dtype=np.int64)
    out = ffi.new("kw_lane *")
    if lib.kw_take_lanes(handle, ffi.new("int32_t[]", indexes), len(lanes), out,
                         ffi.cast("int64_t *", counts.ctypes.data)) != 0:
        raise MemoryError(f"the compiled reader cannot hold the records of {len(lanes)} "
                          f"ranges in one block")
    topic, partition = lanes[0].tp
    block = _block(out, topic, partition, headers)
    rows = row_of[indexes]
    block.placed = columns.placed(rows, counts)
    return block, columns.compute(rows, block, counts)


def _first_open(lanes: list[_Lane]) -> dict[tuple[str, int], _Lane]:
    """Each partition's first range not done (lanes of a partition are in offset order)."""
    first: dict[tuple[str, int], _Lane] = {}
    for lane in lanes:
        if not done(lane.c.position, lane.c.end):
            first.setdefault(lane.tp, lane)
    return first


class _Lane:
    """One range being read: the extension's lane (``kw_lane``) and the range's row in its
    task; its ``RangeReader`` is its reader's (``CompiledReader.reader``), made where it is
    needed."""

    __slots__ = ("_owner", "c", "fault", "index", "row", "tp")

    def __init__(self, index: int, row: int, tp: tuple[str, int], c, owner: CompiledReader,
                 fault: int | None = None):
        self.index = index
        self.row = row
        self.tp = tp
        self.c = c
        self.fault = fault
        self._owner = owner

    @property
    def reader(self) -> RangeReader:
        return self._owner.reader(self.row)

    def take(self, handle, headers: bool) -> RecordBlock:
        """The lane's records so far as a block, its buffers now owned by Arrow/numpy."""
        out = ffi.new("kw_lane *")
        lib.kw_take(handle, self.index, out)
        return _block(out, self.tp[0], self.tp[1], headers)


def _block(out, topic: str, partition: int, headers: bool) -> RecordBlock:
    """The records of a taken lane (``kw_take``, ``kw_take_lanes``) as a block whose buffers
    Arrow and numpy now own."""
    n = out.n
    return RecordBlock(
        topic, partition, _binary(out.key, n, pa.binary()), _binary(out.value, n, pa.binary()),
        np.frombuffer(_owned(out.offsets, n * 8), dtype=np.int64),
        np.frombuffer(_owned(out.timestamps, n * 8), dtype=np.int64),
        np.frombuffer(_owned(out.types, n * 4), dtype=np.int32),
        _headers(out, n) if headers else None)

def _owned(pointer, nbytes: int):
    """A buffer over memory the extension malloc'ed, freed when the buffer is dropped."""
    if pointer == ffi.NULL:
        return b""
    return ffi.buffer(ffi.gc(pointer, lib.kw_free), nbytes)

def _binary(col, n: int, kind: pa.DataType) -> pa.Array:
    if n == 0 or col.offsets == ffi.NULL:
        return pa.array([], type=kind)
    offsets = pa.py_buffer(_owned(col.offsets, (n + 1) * 4))
    data = pa.py_buffer(_owned(col.data, col.len))
    valid = _owned(col.valid, (n + 7) // 8)
    return pa.Array.from_buffers(kind, n, [pa.py_buffer(valid) if col.nulls else None,
                                           offsets, data], null_count=col.nulls)

def _headers(out, n: int) -> pa.Array:
    m = out.hkey.n
    struct = pa.Array.from_buffers(
        arrow.HEADERS.value_type, m, [None],
        children=[_binary(out.hkey, m, pa.string()), _binary(out.hvalue, m, pa.binary())])
    offsets = pa.py_buffer(_owned(out.hlist.offsets, (n + 1) * 4))
    valid = _owned(out.hlist.valid, (n + 7) // 8)
    return pa.Array.from_buffers(arrow.HEADERS, n, [pa.py_buffer(valid) if out.hlist.nulls
                                                    else None, offsets],
                                 null_count=out.hlist.nulls, children=[struct])
