"""Child of test_security's drop-in test, run under the baseline interpreter
(tests/support/sparkkafka.py): the same options read with Spark's own ``format("kafka")``
and with ``format("kwatermark")``, each case's rows as JSON (bytes as hex)."""

from __future__ import annotations

from tests.support.jvm import TEST_SPARK_CONF
from tests.support.sparkkafka import baseline_session, child_io


def read(spark, fmt: str, bootstrap: str, topic: str, options: dict[str, str]) -> list:
    reader = (spark.read.format(fmt).option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", topic).option("startingOffsets", "earliest"))
    for key, value in options.items():
        reader = reader.option(key, value)
    return sorted([r["topic"], r["partition"], r["offset"], r["key"].hex(), r["value"].hex(),
                   r["timestamp"].isoformat()]
                  for r in reader.load().select("topic", "partition", "offset", "key", "value",
                                                "timestamp").collect())


def main() -> None:
    request, reply = child_io()
    spark = baseline_session("kwatermark-security-dropin", conf=TEST_SPARK_CONF)
    answer = {}
    for case in request["cases"]:
        answer[case["name"]] = {fmt: read(spark, fmt, case["bootstrap"], request["topic"],
                                          case["options"])
                                for fmt in ("kafka", "kwatermark")}
    spark.stop()
    reply(answer)


if __name__ == "__main__":
    main()
