"""End offsets asked on a thread while Python works on the main one (issue 36).

    .venv/bin/python bench/offsets_beside_python.py [--bootstrap-servers HOST:PORT]
        [--partitions 4096] [--busy-ms 0,30] [--rounds 9]

The driver asks the end offsets of every partition already read on a thread of its own
(``KafkaMetadata.ask_ahead``) while it folds the last batch in Python. confluent-kafka's
consumer answers ``consumer.OFFSETS_CHUNK`` partitions a call, and its thread takes the GIL
back after each call: behind a main thread running Python, each waits up to Python's switch
interval (5 ms). The compiled engine's client asks every chunk in one C call, without the
GIL. For each ``--busy-ms`` (how long the main thread runs pure Python), both clients ask
every end offset on a thread, in rotated order each round. Printed: the median ms until the
answer was there (from the thread's start), per client, and the compiled client's ratio to
confluent-kafka's (the baseline).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import common
from confluent_kafka import OFFSET_END, Consumer
from confluent_kafka import TopicPartition as KafkaTP
from offsets_chunks import ready

from kwatermark import compiled
from kwatermark.consumer import chunked_offsets


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap-servers", help="an existing Kafka (default: started here)")
    parser.add_argument("--partitions", type=int, default=4096)
    parser.add_argument("--busy-ms", default="0,30", help="the main thread's Python, ms")
    parser.add_argument("--rounds", type=int, default=9)
    return parser.parse_args()


def busy(ms: float) -> None:
    """Pure Python on this thread for ``ms`` (as the fold of the last batch)."""
    until = time.perf_counter() + ms / 1000
    total = 0
    while time.perf_counter() < until:
        for i in range(1_000):
            total += i


def answered_after(client, tps: list[KafkaTP], busy_ms: float) -> float:
    """ms from asking on a thread until the answer was there, the main thread busy."""
    started = time.perf_counter()
    done: list[float] = []

    def ask() -> None:
        chunked_offsets(client, tps, 30)
        done.append(time.perf_counter() - started)

    thread = threading.Thread(target=ask)
    thread.start()
    busy(busy_ms)
    thread.join()
    return done[0] * 1000


def main() -> None:
    args = parse_args()
    reason = compiled.unavailable()
    if reason is not None:
        raise SystemExit(f"the compiled engine is needed: {reason}")
    broker = common.Broker.open(args.bootstrap_servers, kind="kafka")
    try:
        topic = broker.create_topic(args.partitions, "bench-offsets-beside")
        clients = {
            "confluent-kafka": Consumer({"bootstrap.servers": broker.bootstrap_servers,
                                         "group.id": "kwatermark-bench-offsets",
                                         "enable.auto.commit": False}),
            "compiled": compiled._Client({"bootstrap.servers": broker.bootstrap_servers},
                                         False, 1),
        }
        tps = [KafkaTP(topic, p, OFFSET_END) for p in range(args.partitions)]
        for client in clients.values():
            ready(client, tps)
        names = list(clients)
        for busy_ms in (float(b) for b in args.busy_ms.split(",")):
            took: dict[str, list[float]] = {name: [] for name in names}
            for round_no in range(args.rounds):
                turn = round_no % len(names)
                for name in names[turn:] + names[:turn]:
                    took[name].append(answered_after(clients[name], tps, busy_ms))
            base = statistics.median(took[names[0]])
            for name in names:
                median = statistics.median(took[name])
                print(f"{args.partitions} partitions, main thread busy {busy_ms:4.0f} ms: "
                      f"{name:<16} answered after {median:6.1f} ms ({median / base:.2f}x)",
                      flush=True)
        clients["confluent-kafka"].close()
        clients["compiled"].close()
        broker.delete_topic(topic)
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
