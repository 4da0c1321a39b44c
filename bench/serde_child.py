"""The measuring half of ``bench/bench_serde.py``: runs under the baseline interpreter
(PySpark 4.2.0 with Spark's own Kafka, Avro and Protobuf modules, ``tests/support/
sparkkafka.py``), in one SparkSession, each round running every format and reader in turn.

For each format, one batch query reads the whole topic and aggregates two fields of the
decoded value (so every record is decoded):

* spark: ``format("kafka")`` then Spark's own decoder on the body after Confluent's header:
  ``from_avro`` / ``from_protobuf`` (the descriptor set given as bytes) / ``from_json``;
* kwatermark: ``format("kwatermark")`` with ``value.format`` = the ``*-confluent`` format,
  the schema from the registry;
* raw: ``format("kafka")`` without decoding (count and total length of the values): the
  floor of reading the topic at all.

Spark's ``from_protobuf`` runs only when the request says spark-protobuf can be resolved
(``spark_protobuf``): Maven Central does not serve ``spark-protobuf_2.13`` here.

Reply: every run's seconds, the aggregates of both readers (which must agree), the Spark
version and the load average before and after.
"""

from __future__ import annotations

import base64
import os
import time

from child_run import fresh, log

from tests.support.sparkkafka import baseline_session, child_io, spark_package

AGGREGATES = ("sum(v.order_id) AS ids", "count(v.created_at) AS stamped",
              "sum(v.quantity) AS quantity")


def spark_read(spark, request: dict, fmt: str):
    from pyspark.sql.avro.functions import from_avro
    from pyspark.sql.functions import col, expr, from_json
    from pyspark.sql.protobuf.functions import from_protobuf

    frame = (spark.read.format("kafka")
             .option("kafka.bootstrap.servers", request["bootstrap"])
             .option("subscribe", request["topics"][fmt])
             .option("startingOffsets", "earliest").load())
    if fmt == "avro":  # magic byte and schema id: 5 bytes
        decoded = from_avro(expr("substring(value, 6)"), request["avro_schema"])
    elif fmt == "protobuf":  # ... and the message-index shortcut 0 for the first message
        decoded = from_protobuf(expr("substring(value, 7)"), request["protobuf_message"],
                                binaryDescriptorSet=base64.b64decode(
                                    request["protobuf_descriptor_set"]))
    else:
        decoded = from_json(expr("cast(substring(value, 6) AS string)"), request["json_ddl"])
    return frame.select(decoded.alias("v")).selectExpr(*AGGREGATES).select(
        col("ids"), col("stamped"), col("quantity"))


def raw_read(spark, request: dict, fmt: str):
    return (spark.read.format("kafka")
            .option("kafka.bootstrap.servers", request["bootstrap"])
            .option("subscribe", request["topics"][fmt])
            .option("startingOffsets", "earliest").load()
            .selectExpr("count(*) AS n", "sum(length(value)) AS bytes", "0 AS zero"))


def kwatermark_read(spark, request: dict, fmt: str):
    options = {"kafka.bootstrap.servers": request["bootstrap"],
               "subscribe": request["topics"][fmt], "startingOffsets": "earliest",
               "value.format": f"{'json-schema' if fmt == 'json' else fmt}-confluent",
               "value.schema.registry.url": request["registry"],
               "watermark.stateLocation": fresh(request["workspace"], "ledger")}
    return (spark.read.format("kwatermark").options(**options).load()
            .selectExpr("value_decoded AS v").selectExpr(*AGGREGATES))


def main() -> None:
    request, reply = child_io()
    packages = [spark_package("spark-avro")]
    if request["spark_protobuf"]:
        packages.append(spark_package("spark-protobuf"))
    spark = baseline_session("kwatermark-bench-serde", extra_packages=tuple(packages))
    load_before = os.getloadavg()
    runs: list[dict] = []
    formats = list(request["topics"])
    readers = {"raw": raw_read, "spark": spark_read, "kwatermark": kwatermark_read}
    for round_no in range(request["repeat"] + 1):  # round 0 warms the session up
        for fmt in formats:
            for reader, read in readers.items():
                if reader == "spark" and fmt == "protobuf" and not request["spark_protobuf"]:
                    continue
                started = time.perf_counter()
                row = read(spark, request, fmt).collect()[0]
                seconds = time.perf_counter() - started
                log(f"round {round_no} {fmt} {reader}: {seconds:.2f} s")
                runs.append({"round": round_no, "format": fmt, "reader": reader,
                             "seconds": seconds, "aggregates": [int(x or 0) for x in row]})
    reply({"runs": runs, "spark": spark.version, "load_before": load_before,
           "load_after": os.getloadavg()})
    spark.stop()


if __name__ == "__main__":
    main()
