"""The Kafka consumer a task reads with: its settings (prefetch capped at the task's ranges,
a pack's fetch size) and the one offset check of a task's partitions."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTP

from kwatermark import retries
from kwatermark.errors import BrokerError, KWatermarkError
from kwatermark.offsets import RangeTask
from kwatermark.options import SourceOptions
from kwatermark.range_end import Stall
from kwatermark.rdkafka_log import librdkafka_logger

log = logging.getLogger("kwatermark")

# librdkafka's prefetch doubles consume throughput (DESIGN §9), but past the range's end it
# only wastes memory, bandwidth and CPU: cap it by what the task still has to read
# (prefetch). Whenever the local queue holds queued.min.messages, or a fetch decision finds
# nothing to do yet, librdkafka waits fetch.queue.backoff.ms before fetching again (1 s by
# default since 2.4).
# 1 ms keeps a 100k queue at full speed, a worker's memory flat, and a task's first records
# arriving at once (bench/README.md: a 1-record task 1,005 ms -> 13 ms at 10 ms -> 3 ms at
# 1 ms; 5M-record range RSS growth 165 MB -> 3 MB; CPU per record not higher).
MAX_PREFETCH_MESSAGES = 100_000
# A task's prefetch: an eighth of its records per partition, at least 8,192 (prefetch).
PREFETCH_SHARE = 8
PREFETCH_FLOOR = 8192
# The most a pack's consumer fetches per request (pack_fetch_bytes).
PACK_FETCH_MAX_BYTES = 8 << 20
FETCH_QUEUE_BACKOFF_MS = 1
# How long the broker holds a Fetch that finds no new records (librdkafka: 500 ms). A task
# plans only records already in the log, so it never needs that wait; but as soon as a range
# is read up to the log's end librdkafka fetches past it, and a consumer has one Fetch in
# flight per broker: the next task on a worker's kept consumer (kwatermark.compiled) waited
# behind it, up to 500 ms unless a new record ended the wait (an AvailableNow run's last
# batch; four one-partition tasks in a row at the log's end: 10, 508, 508, 509 ms; 8, 10,
# 13, 10 at 5 ms; bench/bench_log_end.py). Empty Fetches come at most every 5 ms, and only
# while all of a consumer's started partitions sit at the log's end.
FETCH_WAIT_MAX_MS = 5
# Messages taken from librdkafka per call by either engine, whatever arrow.maxRecordsPerBatch:
# a larger batch is filled by several calls. The compiled engine read 100,000-record batches
# at 0.53 us a record of process CPU in calls of 10,000, 0.58 in calls of 100,000.
MAX_CONSUME = 10_000
# One offsets request's longest wait; a longer wait is spent in retries.
ATTEMPT_S = 5.0
# Partitions per offsets_for_times call. librdkafka's handling of a ListOffsets grows faster
# than its partitions: one call for 4,096 took 67-78 ms, eight calls of 512 one after
# another 29-44 ms; 2,048: 21 -> 13 ms; 512 alone 4 ms (the project's Apache Kafka). Calls
# of 256 against 512 (bench/offsets_chunks.py, 2026-11-28, medians of 15 rotated rounds):
# 4,096 partitions 15.2 ms wall and 9.7 ms of process CPU against 18.0 and 13.7; 2,048
# 6.9/4.7 against 8.9/7.0; 512 1.8/1.1 against 2.3/1.7. Calls of 128 took a little less
# CPU still (8.1 ms at 4,096) and the same wall on loopback, with twice the round trips a
# broker across a network makes each pay. The compiled engine's client makes up to four
# calls at once (kw_offsets): asked after a pause, as a planning asks, sixteen calls one
# after the other took 40-46 ms, four at once 27-31 (2026-12-02).
OFFSETS_CHUNK = 256


def open_consumer(options: SourceOptions, remaining: int, partitions: int = 1) -> Consumer:
    """A consumer for one task: ``remaining`` is the most records it reads from any one
    partition (librdkafka's prefetch, ``queued.min.messages``, is per partition), and
    ``partitions`` how many partitions it reads."""
    conf = task_conf(options, remaining, partitions)
    try:
        return Consumer(conf)
    except KafkaException as exc:
        raise KWatermarkError(f"cannot create a Kafka consumer from the kafka.* options: "
                              f"{exc.args[0] if exc.args else exc}") from exc


def learn_topics(ask: Callable[[str], object], topics: Iterable[str]) -> set[str]:
    """Ask each of ``topics``' metadata (``ask(topic)``) before a new consumer of thousands
    of partitions starts reading them; returns the topics it learned. A consumer that
    learns a 4,096-partition topic only as it starts reading it hands the partitions to its
    broker thread while that thread already works, and some joined it up to a second
    later: the compiled engine's tasks of 2,048 such partitions read two records each in
    over 400 ms (up to 1.3 s) in 8 of 132 tasks, none once the topic was learned first
    (``bench/bench_new_consumer.py``); the Python engine's first offsets request took up to
    0.77 s, at most 68 ms after this. An error is left to the read, which reports it as
    before."""
    learned = set()
    for topic in topics:
        try:
            ask(topic)
        except KafkaException as exc:
            log.debug("metadata of topic %s before reading: %s", topic, exc)
            continue
        learned.add(topic)
    return learned


_closing = threading.Lock()   # held while a task's consumer is destroyed on its own thread


def close_aside(close: Callable[[], None]) -> None:
    """Destroy a task's consumer of many partitions (``close``) on a thread, so the task ends
    without waiting: confluent-kafka's ``close`` of a consumer with 2,048 started partitions
    took ~170 ms (the Python engine's; the compiled engine parks its partitions instead). One
    runs at a time; a task that ends while one runs closes its own consumer itself, so
    unfinished destroys never pile up."""
    if not _closing.acquire(blocking=False):
        close()
        return

    def run() -> None:
        try:
            close()
        except (KafkaException, RuntimeError) as exc:   # nothing waits for it to say so
            log.warning("closing a task's Kafka consumer: %s", exc)
        finally:
            _closing.release()

    threading.Thread(target=run, daemon=True, name="kwatermark-close").start()


def closed_aside(timeout: float) -> bool:
    """Whether no consumer is being destroyed aside, waiting up to ``timeout`` s."""
    if not _closing.acquire(timeout=timeout):
        return False
    _closing.release()
    return True


def task_conf(options: SourceOptions, remaining: int, partitions: int = 1) -> dict:
    """The librdkafka configuration of a task's consumer, whichever engine reads
    (kwatermark.compiled passes it to librdkafka itself)."""
    conf = options.consumer_conf()
    conf.update({
        "group.id": options.group_id or f"{options.group_id_prefix}-{uuid.uuid4().hex[:12]}",
        "enable.auto.commit": False,
        # An end-of-partition event at the high watermark (or, under read_committed, the
        # last stable offset) says a range ending there is done (kwatermark.range_end).
        "enable.partition.eof": True,
        "auto.offset.reset": "error",
        "logger": librdkafka_logger(),
    })
    conf.setdefault("queued.min.messages", prefetch(remaining))
    conf.setdefault("fetch.queue.backoff.ms", FETCH_QUEUE_BACKOFF_MS)
    conf.setdefault("fetch.wait.max.ms", FETCH_WAIT_MAX_MS)
    # Kafka's Java consumer, so Spark's source, defaults to read_uncommitted, and the driver
    # plans to that isolation's end offsets; librdkafka's default is read_committed, which
    # hid aborted records that format("kafka") returns.
    conf.setdefault("isolation.level", "read_uncommitted")
    if partitions > 1 and "fetch.max.bytes" not in conf:
        conf["fetch.max.bytes"] = pack_fetch_bytes(conf, partitions)
    return conf


def _power_of_two(n: int) -> int:
    """The least power of two >= ``n`` (1 for n <= 1): settings counted this way stay the
    same from one micro-batch to the next, so a worker's kept consumer serves them."""
    return 1 << max(0, n - 1).bit_length()


def prefetch(remaining: int) -> int:
    """``queued.min.messages`` for a task with ``remaining`` records in a partition: an
    eighth of them (``PREFETCH_SHARE``), at least ``PREFETCH_FLOOR`` or all of them where
    they are fewer, counted up to the next power of two, so that successive micro-batches of
    a steady stream ask for the same configuration and a worker's kept consumer serves them
    (kwatermark.compiled._Clients); at most ``MAX_PREFETCH_MESSAGES``.

    librdkafka keeps the queue refilled to that many as the task consumes, so when the range
    ends before the log does, what is queued at its end was fetched, parsed and allocated
    for nothing (and the next micro-batch's task fetches it again): with the whole range as
    the prefetch, up to twice the records. 62,500-record ranges of a backlog
    (``bench/profile_pack.py --per-batch 250000``) took 0.16 s of task CPU per batch with
    65,536 and 0.12 with 8,192, the read as fast; ranges ending at the log's end, where
    nothing is wasted, were no slower (bench/README.md, "Where a stream's CPU goes, by process")."""
    ahead = max(min(remaining, PREFETCH_FLOOR), -(-remaining // PREFETCH_SHARE))
    return min(_power_of_two(ahead), MAX_PREFETCH_MESSAGES)


def pack_fetch_bytes(conf: dict, partitions: int) -> int:
    """A pack's Fetch size: what a task reading one partition fetches per request
    (``max.partition.fetch.bytes``) for each of its partitions, counted up to the next power
    of two (a steady stream's packs then share one configuration and a kept consumer), at
    most ``PACK_FETCH_MAX_BYTES``, never librdkafka's 50 MB.

    A pack's ranges are small, but the partitions usually go on past them: every byte a
    Fetch brings back past a range's end is parsed and thrown away (512 partitions of 40
    records with the 50 MB default: the broker's answers took 0.6 s where 20,000 records
    needed 0.1 s). One partition's worth per request, the earlier size, took a round trip
    per megabyte instead (512 ranges of 48 records: 135 ms, 95 ms at 8 MB; with 40 times as
    many records past the ranges, 8 MB still beat 1 MB and 32 MB; bench/README.md).
    librdkafka refuses a ``fetch.max.bytes`` below ``message.max.bytes``."""
    partition = int(conf.get("max.partition.fetch.bytes",
                             conf.get("fetch.message.max.bytes", 1_048_576)))
    wanted = min(partition * _power_of_two(partitions), PACK_FETCH_MAX_BYTES)
    return max(partition, wanted, int(conf.get("message.max.bytes", 1_000_000)))


def partition_bounds(consumer: Consumer, options: SourceOptions, tasks: list[RangeTask]
                     ) -> dict[tuple[str, int], tuple[int, int]]:
    """Every task's partition's earliest and end offsets, in one ListOffsets request per
    leader for each (``get_watermark_offsets`` asks once per partition). The consumer's
    ``isolation.level`` applies, as it does to ``get_watermark_offsets``.

    A partition answered with a transient error (its leader moving, DESIGN §20) is asked
    again alone, with backoff, until ``kafkaConsumer.pollTimeoutMs`` passes without an
    answer; any other error fails at once."""
    tps = list(dict.fromkeys(task.tp for task in tasks))
    # Both listings in flight together (librdkafka's calls release the GIL): a task waits
    # for one round trip before its first fetch, not two (~50 ms each at 2,048 partitions).
    with ThreadPoolExecutor(1, thread_name_prefix="kwatermark-offsets") as pool:
        asked_low = pool.submit(_offsets, consumer, options, tps, OFFSET_BEGINNING)
        high = _offsets(consumer, options, tps, OFFSET_END)
        low = asked_low.result()
    return {tp: (low[tp], high[tp]) for tp in tps}


def chunked_offsets(consumer, tps: list[KafkaTP], timeout: float) -> list:
    """``consumer.offsets_for_times(tps, timeout)`` (confluent-kafka's consumer or the compiled
    engine's) in calls of at most ``OFFSETS_CHUNK`` partitions, all within ``timeout``; a
    call that fails fails the whole. The compiled engine's client makes the calls itself, in
    C: one call from Python, which holds the GIL once, not once a chunk (on the planner's
    thread that asks ahead, each chunk waited out Python's switch interval while the driver
    folded the last batch)."""
    if getattr(consumer, "chunks", False):
        return consumer.offsets_for_times(tps, timeout, OFFSETS_CHUNK)
    deadline = time.monotonic() + timeout
    answer: list = []
    for i in range(0, len(tps), OFFSETS_CHUNK):
        answer += consumer.offsets_for_times(tps[i:i + OFFSETS_CHUNK],
                                             max(0.05, deadline - time.monotonic()))
    return answer


def _offsets(consumer: Consumer, options: SourceOptions, tps: list[tuple[str, int]],
             which: int) -> dict[tuple[str, int], int]:
    found: dict[tuple[str, int], int] = {}
    asked = list(tps)
    stall = Stall(options.poll_timeout_ms / 1000.0, time.monotonic())
    backoff = retries.Backoff()
    while asked:
        timeout = max(0.5, min(ATTEMPT_S, stall.last + stall.limit_s - time.monotonic()))
        try:
            answer = chunked_offsets(consumer, [KafkaTP(t, p, which) for t, p in asked],
                                     timeout)
            # No error and no offset (-1001): the leader is not ready yet (broker.py).
            failed = [(tp, tp.error if tp.error is not None else KafkaError(
                KafkaError.LEADER_NOT_AVAILABLE, f"no offset yet ({tp.offset})"))
                for tp in answer if tp.error is not None or tp.offset < 0]
        except KafkaException as exc:   # no answer at all (a broker down): none progressed
            error = exc.args[0] if exc.args else exc
            failed = [(KafkaTP(*tp), error) for tp in asked]
            answer = []
        for tp in answer:
            if tp.error is None and tp.offset >= 0:
                found[(tp.topic, tp.partition)] = tp.offset
        if not failed:
            return found
        first, error = failed[0]
        for topic in sorted({tp.topic for tp, _ in failed}):  # stale leader epochs: broker.py
            with contextlib.suppress(KafkaException):
                consumer.list_topics(topic, timeout=2.0)
        wait = backoff.next_s()
        if len(failed) < len(asked):
            stall.progressed(time.monotonic())
            backoff.reset()
        elif not retries.transient(error) or stall.expired(time.monotonic() + wait):
            raise _offsets_error(consumer, options, (first.topic, first.partition), error,
                                 stalled=retries.transient(error))
        time.sleep(wait)
        asked = [(tp.topic, tp.partition) for tp, _ in failed]
    return found


def _offsets_error(consumer: Consumer, options: SourceOptions, tp: tuple[str, int],
                   error: object, stalled: bool) -> BrokerError:
    budget = (f" (no answer for kafkaConsumer.pollTimeoutMs={options.poll_timeout_ms})"
              if stalled else "")
    return BrokerError(f"topic {tp[0]}, partition {tp[1]}: cannot fetch offsets from "
                       f"kafka.bootstrap.servers={options.bootstrap_servers!r} "
                       f"({retries.leader_of(consumer, *tp)}): {error}{budget}")
