"""A new consumer's late partitions at thousands of partitions (issue 36): librdkafka, not
kwatermark, measured with a bare confluent-kafka consumer.

A 4,096-partition micro-batch is two Spark tasks of 2,048 ranges; a task of more than
1,024 partitions destroyed its consumer at the end then (kwatermark.compiled.MANY_PARTITIONS;
it parks its partitions for the next task since), so each such task read on a consumer new
to the topic, as a worker's first still does. Such a consumer learns the topic's
4,096 partitions only once its first partitions start, hands them all to its broker thread
while that thread already fetches, and some of them (the last of the list) joined it up to
a second later: the task waited for their two records. Through Spark, one 4,096-partition
batch in three took ~1.6 s instead of ~0.75.

This bench reproduces it without kwatermark or Spark, on the project's Apache Kafka: a
topic of ``--partitions`` partitions holding ``2 x --tasks`` records a partition; each task
is a new consumer that assigns half of the partitions at the task's offsets and reads two
records from each, then closes. ``cold``: the consumer asks nothing first (as kwatermark's
read did); ``learned``: it asks the topic's metadata before assigning (``list_topics``, as
``kwatermark.compiled._Client.learn_topics`` does); the metadata request is timed with the
task. The two ways alternate, ``--rounds`` times each. Prints each way's tasks over 400 ms,
median and longest.

Run: ``python bench/bench_new_consumer.py`` (about 3 minutes).
"""

from __future__ import annotations

import argparse
import statistics
import time

from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient, NewTopic

from kwatermark.consumer import (
    FETCH_QUEUE_BACKOFF_MS,
    FETCH_WAIT_MAX_MS,
    pack_fetch_bytes,
    prefetch,
)
from kwatermark.localbroker import LocalBroker

SLOW_MS = 400


def fill(bootstrap: str, topic: str, partitions: int, per_partition: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result()
    time.sleep(2)   # the new partitions' leaders
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "log_level": 0})
    for i in range(partitions * per_partition):
        producer.produce(topic, b"x" * 100, partition=i % partitions)
        if i % 20_000 == 0:
            producer.flush()
    producer.flush()


def task(bootstrap: str, topic: str, partitions: range, offset: int, learned: bool) -> float:
    """One task's ms: a new consumer reads records ``offset`` and ``offset + 1`` of each of
    ``partitions`` (kwatermark's task settings: prefetch, fetch size, wait and backoff)."""
    started = time.perf_counter()
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-new-consumer",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "auto.offset.reset": "error", "queued.min.messages": prefetch(2),
                         "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
                         "fetch.wait.max.ms": FETCH_WAIT_MAX_MS,
                         "fetch.max.bytes": pack_fetch_bytes({}, len(partitions)),
                         "log_level": 0})
    try:
        if learned:
            consumer.list_topics(topic, timeout=5)
        consumer.assign([KafkaTP(topic, p, offset) for p in partitions])
        need = {p: 2 for p in partitions}
        while need:
            for message in consumer.consume(10_000, 0.01):
                p = message.partition()
                if message.error() is None and p in need and message.offset() < offset + 2:
                    need[p] -= 1
                    if not need[p]:
                        del need[p]
        return (time.perf_counter() - started) * 1000
    finally:
        consumer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=4096)
    parser.add_argument("--tasks", type=int, default=12, help="task pairs per round")
    parser.add_argument("--rounds", type=int, default=6, help="rounds of each way")
    args = parser.parse_args()
    broker = LocalBroker.start(kind="kafka")
    try:
        bootstrap, topic = broker.bootstrap_servers, "new-consumer"
        fill(bootstrap, topic, args.partitions, 2 * args.tasks)
        halves = [range(args.partitions // 2), range(args.partitions // 2, args.partitions)]
        found: dict[str, list[float]] = {"cold": [], "learned": []}
        for round_ in range(args.rounds):
            ways = ["cold", "learned"] if round_ % 2 == 0 else ["learned", "cold"]
            for way in ways:
                times = [task(bootstrap, topic, half, 2 * t, way == "learned")
                         for t in range(args.tasks) for half in halves]
                found[way] += times[2:]   # the first pair warms the broker's caches
                print(f"round {round_} {way:8s}: " + " ".join(f"{t:.0f}" for t in times),
                      flush=True)
        for way, times in found.items():
            print(f"{way:8s}: {sum(t > SLOW_MS for t in times)} of {len(times)} tasks over "
                  f"{SLOW_MS} ms; median {statistics.median(times):.0f} ms, longest "
                  f"{max(times):.0f} ms")
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
