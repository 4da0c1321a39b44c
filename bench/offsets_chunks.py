"""End offsets of many partitions asked in calls of different sizes (issue 36).

    .venv/bin/python bench/offsets_chunks.py [--bootstrap-servers HOST:PORT]
        [--partitions 512,2048,4096] [--chunks 512,256,128] [--rounds 15]

The driver asks every partition's end offset at each trigger, and a task its partitions'
bounds, through one consumer's ``offsets_for_times`` in calls of ``consumer.OFFSETS_CHUNK``
partitions (``consumer.chunked_offsets``). librdkafka's handling of one ListOffsets grows
faster than its partitions, so the call size matters. For each partition count (a topic of
that many partitions on the project's Apache Kafka, or ``--bootstrap-servers``), every
chunk size asks all the end offsets, in rotated order each round. Printed: the median wall
and process CPU ms (this process: Python and librdkafka's threads) per size, and each
size's ratio to the first.
"""

from __future__ import annotations

import argparse
import statistics
import time

import common
from confluent_kafka import OFFSET_END, Consumer, KafkaException
from confluent_kafka import TopicPartition as KafkaTP

from kwatermark.consumer import chunked_offsets


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap-servers", help="an existing Kafka (default: started here)")
    parser.add_argument("--partitions", default="512,2048,4096")
    parser.add_argument("--chunks", default="512,256,128", help="the first is the baseline")
    parser.add_argument("--rounds", type=int, default=15)
    return parser.parse_args()


def ready(consumer: Consumer, tps: list[KafkaTP]) -> None:
    """Wait until every partition has a leader that answers (a new topic's do not yet)."""
    deadline = time.monotonic() + 120
    while True:
        try:
            chunked_offsets(consumer, tps, 30)
            return
        except KafkaException:   # leaders still being elected
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def timed(consumer: Consumer, tps: list[KafkaTP], chunk: int) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(0, len(tps), chunk):
        consumer.offsets_for_times(tps[i:i + chunk], 30)
    return (time.perf_counter() - wall) * 1e3, (time.process_time() - cpu) * 1e3


def main() -> None:
    args = parse_args()
    chunks = [int(c) for c in args.chunks.split(",")]
    broker = common.Broker.open(args.bootstrap_servers, kind="kafka")
    try:
        for count in (int(p) for p in args.partitions.split(",")):
            topic = broker.create_topic(count, "bench-offsets")
            # A consumer made after the topic: librdkafka keeps a topic it found unknown
            # so until its next metadata refresh.
            consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers,
                                 "group.id": "kwatermark-bench-offsets",
                                 "enable.auto.commit": False})
            tps = [KafkaTP(topic, p, OFFSET_END) for p in range(count)]
            ready(consumer, tps)
            took: dict[int, list[tuple[float, float]]] = {c: [] for c in chunks}
            for round_no in range(args.rounds):
                turn = round_no % len(chunks)
                for chunk in chunks[turn:] + chunks[:turn]:
                    took[chunk].append(timed(consumer, tps, chunk))
            base_wall = statistics.median(w for w, _ in took[chunks[0]])
            base_cpu = statistics.median(c for _, c in took[chunks[0]])
            for chunk in chunks:
                wall = statistics.median(w for w, _ in took[chunk])
                cpu = statistics.median(c for _, c in took[chunk])
                print(f"{count:>5} partitions, calls of {chunk:>4}: {wall:6.1f} ms wall "
                      f"({wall / base_wall:.2f}x), {cpu:6.1f} ms CPU ({cpu / base_cpu:.2f}x)",
                      flush=True)
            consumer.close()
            broker.delete_topic(topic)
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
