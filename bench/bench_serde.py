"""Decode throughput of the Confluent wire formats.

Default: ``python bench/bench_serde.py [--records 100000] [--repeat 3]``: avro-confluent,
protobuf-confluent and json-schema-confluent values, written by confluent-kafka's own
serializers with a real Schema Registry (``kwatermark.schemaregistry``), read by batch
queries in one Spark session (PySpark 4.2.0, ``bench/serde_child.py``): ``format("kafka")``
followed by Spark's own ``from_avro`` / ``from_protobuf`` / ``from_json`` on the body after
Confluent's header, against ``format("kwatermark")`` with ``value.format``, and beside both
``format("kafka")`` reading the values without decoding (raw: the floor). Figures are
records/s (median of ``--repeat`` rounds after a warm-up round) and kwatermark / Spark;
results go to ``bench/results/serde-spark.json``. Maven Central does not serve
``spark-protobuf_2.13`` (checked for 4.2.0 and 4.1.1: 404), so Spark's ``from_protobuf`` is
measured only with ``--spark-protobuf`` (a Spark whose Ivy can resolve it); without it,
protobuf-confluent is compared with the raw floor only. ``--bootstrap-servers`` uses an existing
Kafka (else one is started).

``--decoder-only [--records 200000] [--repeat 5]``: kwatermark.serde's Avro decoder alone
(no Spark, no broker) against a plain fastavro loop; results in ``bench/results/serde.json``:

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
import base64
import gc
import io
import json
import os
import platform
import statistics
import struct
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone

import fastavro
import pyarrow as pa

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH_DIR = os.path.join(ROOT, "bench")
sys.path.insert(0, ROOT)  # tests.support.registry
sys.path.insert(0, BENCH_DIR)  # common

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


def decoder_only(args) -> dict:
    args.records = args.records or 200_000
    args.repeat = args.repeat or 5
    args.output = args.output or os.path.join(ROOT, "bench", "results", "serde.json")

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


# -- kwatermark against Spark's own decoders, on format("kafka") input ----------------------

ORDER_PROTO = """
name: "bench/order.proto" package: "bench.shop" syntax: "proto3"
dependency: "google/protobuf/timestamp.proto"
message_type {
  name: "Order"
  field { name: "order_id" number: 1 label: LABEL_OPTIONAL type: TYPE_INT64 }
  field { name: "customer" number: 2 label: LABEL_OPTIONAL type: TYPE_STRING }
  field { name: "amount" number: 3 label: LABEL_OPTIONAL type: TYPE_DOUBLE }
  field { name: "quantity" number: 4 label: LABEL_OPTIONAL type: TYPE_INT32 }
  field { name: "status" number: 5 label: LABEL_OPTIONAL type: TYPE_ENUM
          type_name: ".bench.shop.Status" }
  field { name: "created_at" number: 6 label: LABEL_OPTIONAL type: TYPE_MESSAGE
          type_name: ".google.protobuf.Timestamp" }
  field { name: "address" number: 7 label: LABEL_OPTIONAL type: TYPE_MESSAGE
          type_name: ".bench.shop.Address" }
  field { name: "note" number: 8 label: LABEL_OPTIONAL type: TYPE_STRING }
}
message_type {
  name: "Address"
  field { name: "city" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING }
  field { name: "postcode" number: 2 label: LABEL_OPTIONAL type: TYPE_STRING }
}
enum_type {
  name: "Status"
  value { name: "NEW" number: 0 } value { name: "PAID" number: 1 }
  value { name: "SHIPPED" number: 2 }
}
"""

ORDER_JSON_SCHEMA = {
    "title": "Order", "type": "object",
    "properties": {
        "order_id": {"type": "integer"}, "customer": {"type": "string"},
        "amount": {"type": "number"}, "quantity": {"type": "integer"},
        "status": {"type": "string"},
        "created_at": {"type": "string", "format": "date-time"},
        "address": {"type": "object", "properties": {
            "city": {"type": "string"}, "postcode": {"type": ["null", "string"]}}},
        "note": {"type": ["null", "string"]}},
}
# The same fields as Spark DDL, for from_json.
ORDER_DDL = ("order_id BIGINT, customer STRING, amount DOUBLE, quantity BIGINT, status STRING, "
             "created_at TIMESTAMP, address STRUCT<city: STRING, postcode: STRING>, "
             "note STRING")


def order_dict(i: int) -> dict:
    start = datetime(2024, 1, 1, tzinfo=timezone.utc)
    return {"order_id": 10_000_000 + i, "customer": f"customer-{i % 5000:05d}",
            "amount": (i % 10_000) / 100, "quantity": i % 12,
            "status": ("NEW", "PAID", "SHIPPED")[i % 3],
            "created_at": start + timedelta(milliseconds=37 * i),
            "address": {"city": "Lyon", "postcode": None if i % 4 else "69001"},
            "note": "gift" if i % 10 == 0 else None}


def produce_formats(bootstrap: str, topics: dict[str, str], url: str, records: int) -> None:
    """``records`` orders into each topic, framed by confluent-kafka's own serializers."""
    import common
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from tests.support.protos import file_messages

    client = SchemaRegistryClient({"url": url})
    order_class = file_messages(ORDER_PROTO)["Order"]

    def as_proto(order: dict):
        message = order_class(**{k: v for k, v in order.items()
                                 if k not in ("created_at", "address", "status") and v is not None})
        message.status = ("NEW", "PAID", "SHIPPED").index(order["status"])
        message.created_at.FromDatetime(order["created_at"])
        message.address.city = order["address"]["city"]
        if order["address"]["postcode"]:
            message.address.postcode = order["address"]["postcode"]
        return message

    def as_json(order: dict) -> dict:
        return {**order, "created_at": order["created_at"].isoformat().replace("+00:00", "Z")}

    serializers = {
        "avro": (AvroSerializer(client, json.dumps(ORDER_SCHEMA)), lambda o: o),
        "protobuf": (ProtobufSerializer(order_class, client, {"use.deprecated.format": False}),
                     as_proto),
        # The bench measures reading: the writer skips jsonschema's validation of each value.
        "json": (JSONSerializer(json.dumps(ORDER_JSON_SCHEMA), client, conf={"validate": False}),
                 as_json),
    }
    producer = common.fast_producer(bootstrap)
    for fmt, topic in topics.items():
        serialize, shape = serializers[fmt]
        ctx = SerializationContext(topic, MessageField.VALUE)
        started = time.perf_counter()
        for i in range(records):
            common._produce(producer, topic, 0, serialize(shape(order_dict(i)), ctx), 1_000 + i)
        producer.flush(120)
        print(f"produced {records:,} {fmt} records into {topic} in "
              f"{time.perf_counter() - started:.1f} s", file=sys.stderr)


def descriptor_set() -> bytes:
    """The FileDescriptorSet Spark's from_protobuf takes: the order file and its import."""
    from google.protobuf import descriptor_pb2, text_format, timestamp_pb2

    files = descriptor_pb2.FileDescriptorSet()
    files.file.add().ParseFromString(timestamp_pb2.DESCRIPTOR.serialized_pb)
    files.file.add().CopyFrom(text_format.Parse(ORDER_PROTO, descriptor_pb2.FileDescriptorProto()))
    return files.SerializeToString()


def against_spark(args) -> dict:
    import common

    from kwatermark.schemaregistry import LocalSchemaRegistry
    from tests.support.sparkkafka import BASELINE_PYSPARK, run_baseline, spark_package

    records = args.records or 100_000
    repeat = args.repeat or 3
    output = args.output or os.path.join(ROOT, "bench", "results", "serde-spark.json")
    broker = common.Broker.open(args.bootstrap_servers, kind="kafka")
    registry = LocalSchemaRegistry.start()
    workspace = tempfile.mkdtemp(prefix="kwatermark-bench-serde-")
    try:
        topics = {fmt: broker.create_topic(1, f"bench-serde-{fmt}")
                  for fmt in ("avro", "protobuf", "json")}
        produce_formats(broker.bootstrap_servers, topics, registry.url, records)
        request = {"bootstrap": broker.bootstrap_servers, "registry": registry.url,
                   "topics": topics, "repeat": repeat, "workspace": workspace,
                   "avro_schema": json.dumps(ORDER_SCHEMA),
                   "protobuf_message": "bench.shop.Order",
                   "protobuf_descriptor_set": base64.b64encode(descriptor_set()).decode(),
                   "json_ddl": ORDER_DDL, "spark_protobuf": args.spark_protobuf}
        reply = run_baseline(os.path.join(BENCH_DIR, "serde_child.py"), request,
                             timeout=3600, log_path=os.path.join(workspace, "child.log"))
    finally:
        registry.stop()
        broker.stop()
    summary: dict = {}
    for fmt in topics:
        entry: dict = {}
        for reader in ("raw", "spark", "kwatermark"):
            runs = [r for r in reply["runs"] if r["format"] == fmt and r["reader"] == reader]
            measured = [r["seconds"] for r in runs if r["round"] > 0]
            if not measured:
                continue
            entry[reader] = round(records / statistics.median(measured))
            entry[f"{reader}_aggregates"] = runs[-1]["aggregates"]
        if "spark" in entry:
            entry["ratio"] = round(entry["kwatermark"] / entry["spark"], 3)
            entry["same_aggregates"] = (entry["spark_aggregates"]
                                        == entry["kwatermark_aggregates"])
        entry["ratio_to_raw"] = round(entry["kwatermark"] / entry["raw"], 3)
        summary[fmt] = entry
    result = {"when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "records": records, "repeat": repeat, "spark": reply["spark"],
              "baseline_pyspark": BASELINE_PYSPARK,
              "spark_packages": [spark_package("spark-avro")] + (
                  [spark_package("spark-protobuf")] if args.spark_protobuf else []),
              "load_before": reply["load_before"], "load_after": reply["load_after"],
              "cpus": os.cpu_count(), "records_per_second": summary, "runs": reply["runs"]}
    for fmt, entry in summary.items():
        spark = (f"Spark {entry['spark']:>9,} records/s, " if "spark" in entry
                 else "Spark (not measured),           ")
        ratio = (f", kwatermark/Spark {entry['ratio']:.2f}"
                 f"{'' if entry['same_aggregates'] else ' (AGGREGATES DIFFER)'}"
                 if "spark" in entry else "")
        print(f"{fmt:>9}: raw {entry['raw']:>9,}, {spark}kwatermark "
              f"{entry['kwatermark']:>9,} records/s{ratio}")
    print(f"load average before {reply['load_before']}, after {reply['load_after']}")
    os.makedirs(os.path.dirname(output), exist_ok=True)
    with open(output, "w") as out:
        json.dump(result, out, indent=2)
        out.write("\n")
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--decoder-only", action="store_true",
                        help="kwatermark.serde's Avro decoder against fastavro, no Spark")
    parser.add_argument("--records", type=int, default=None,
                        help="default: 100000 (200000 with --decoder-only)")
    parser.add_argument("--repeat", type=int, default=None,
                        help="default: 3 (5 with --decoder-only)")
    parser.add_argument("--bootstrap-servers", help="existing Kafka; default: start one")
    parser.add_argument("--spark-protobuf", action="store_true",
                        help="also run Spark's from_protobuf (needs spark-protobuf_2.13 "
                             "resolvable by Spark's Ivy; Maven Central does not serve it)")
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    return decoder_only(args) if args.decoder_only else against_spark(args)


if __name__ == "__main__":
    main()
