"""Throughput of Confluent-framed Avro decoding: kwatermark.serde against a plain fastavro loop.

Run: ``python bench/bench_serde.py [--records 200000] [--repeat 5]``. Figures are records/s,
the median (and the best) of ``--repeat`` runs; results go to ``bench/results/serde.json``.

* floor: ``fastavro.schemaless_reader(io.BytesIO(payload[5:]), parsed_schema)`` per record,
  appended to a list (what a hand-written consumer loop does, schema already known);
* decode: ``make_deserializer("value", {...avro-confluent...}).decode(payloads)``, schema id
  lookup and the Arrow array included;
* decode_values: the same without building Arrow (``ConfluentAvroDeserializer.decode_values``);
* floor_gc_paused: the floor loop with Python's cycle collector paused, as serde pauses it
  while decoding (decoded values cannot form cycles, but a large batch triggers several full
  collections that traverse it). The fair comparison for serde's own loop.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import platform
import statistics
import struct
import sys
import time
from datetime import datetime, timedelta, timezone

import fastavro
import pyarrow as pa

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # tests.support.registry

from kwatermark.serde import make_deserializer
from tests.support.registry import FakeSchemaRegistry

ORDER_SCHEMA = {
    "type": "record",
    "name": "Order",
    "namespace": "bench.shop",
    "fields": [
        {"name": "order_id", "type": "long"},
        {"name": "customer", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "quantity", "type": "int"},
        {
            "name": "status",
            "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED"]},
        },
        {"name": "created_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {
            "name": "address",
            "type": {
                "type": "record",
                "name": "Address",
                "fields": [
                    {"name": "city", "type": "string"},
                    {"name": "postcode", "type": ["null", "string"], "default": None},
                ],
            },
        },
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}


def build_payloads(count: int, schema_id: int) -> list[bytes]:
    parsed = fastavro.parse_schema(ORDER_SCHEMA)
    header = b"\x00" + struct.pack(">I", schema_id)
    start = datetime(2024, 1, 1, tzinfo=timezone.utc)
    statuses = ("NEW", "PAID", "SHIPPED")
    payloads = []
    for i in range(count):
        body = io.BytesIO()
        fastavro.schemaless_writer(body, parsed, {
            "order_id": 10_000_000 + i,
            "customer": f"customer-{i % 5000:05d}",
            "amount": (i % 10_000) / 100,
            "quantity": i % 12,
            "status": statuses[i % 3],
            "created_at": start + timedelta(milliseconds=37 * i),
            "address": {"city": "Lyon", "postcode": None if i % 4 else "69001"},
            "note": "gift" if i % 10 == 0 else None,
        })
        payloads.append(header + body.getvalue())
    return payloads


def floor(payloads: list[bytes], parsed_schema) -> list:
    decoded = []
    for payload in payloads:
        decoded.append(fastavro.schemaless_reader(io.BytesIO(payload[5:]), parsed_schema))
    return decoded


def floor_gc_paused(payloads: list[bytes], parsed_schema) -> list:
    gc.disable()
    try:
        return floor(payloads, parsed_schema)
    finally:
        gc.enable()


def measure(runs: dict, repeat: int) -> dict[str, list[float]]:
    """Seconds of each run, ``repeat`` times; runs alternate so that load from other processes
    on the machine affects them alike."""
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeat):
        for name, run in runs.items():
            started = time.perf_counter()
            run()
            seconds[name].append(time.perf_counter() - started)
    return seconds


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--output", default=os.path.join(ROOT, "bench", "results", "serde.json"))
    args = parser.parse_args(argv)

    with FakeSchemaRegistry() as registry:
        schema_id = registry.register(json.dumps(ORDER_SCHEMA), subject="orders-value")
        payloads = build_payloads(args.records, schema_id)
        deserializer = make_deserializer("value", {
            "value.format": "avro-confluent",
            "value.schema.registry.url": registry.url,
            "value.schema.registry.subject": "orders-value",
        })
        batch = deserializer.decode(payloads)  # warm: the schema is fetched once, here
        assert not any(batch.errors) and len(batch.array) == args.records
        assert isinstance(batch.array, pa.StructArray)
        parsed = fastavro.parse_schema(ORDER_SCHEMA)
        seconds = measure({
            "floor": lambda: floor(payloads, parsed),
            "decode": lambda: deserializer.decode(payloads),
            "decode_values": lambda: deserializer.decode_values(payloads),
            "floor_gc_paused": lambda: floor_gc_paused(payloads, parsed),
        }, args.repeat)
        schema_fetches = len(registry.paths_for(schema_id))

    rates = {name: args.records / statistics.median(t) for name, t in seconds.items()}
    best = {name: args.records / min(t) for name, t in seconds.items()}
    result = {
        "records": args.records,
        "repeat": args.repeat,
        "records_per_second": {name: round(rate) for name, rate in rates.items()},
        # The fastest run of each: less sensitive to other processes than the median.
        "best_records_per_second": {name: round(rate) for name, rate in best.items()},
        "ratio_best_decode_to_floor": round(best["decode"] / best["floor"], 3),
        "ratio_decode_to_floor": round(rates["decode"] / rates["floor"], 3),
        "ratio_decode_values_to_floor": round(rates["decode_values"] / rates["floor"], 3),
        "ratio_decode_values_to_floor_gc_paused": round(
            rates["decode_values"] / rates["floor_gc_paused"], 3),
        "schema_fetches": schema_fetches,
        "python": platform.python_version(),
        "fastavro": fastavro.__version__,
        "pyarrow": pa.__version__,
        "cpus": os.cpu_count(),
    }
    for name, rate in rates.items():
        print(f"{name:>15}: {rate:>10,.0f} records/s (median), {best[name]:>10,.0f} (best)")
    print(f"decode / floor: {result['ratio_decode_to_floor']:.2f}  "
          f"decode_values / floor: {result['ratio_decode_values_to_floor']:.2f}  "
          f"decode_values / floor_gc_paused: "
          f"{result['ratio_decode_values_to_floor_gc_paused']:.2f}")
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w") as out:
        json.dump(result, out, indent=2)
        out.write("\n")
    return result


if __name__ == "__main__":
    main()
