"""Child of tests/integration/test_spark_versions.py, run under another pyspark's venv
(tests/support/sparkkafka.run_baseline). Modes:

* ``stream``: run a ``format("kwatermark")`` stream on a checkpoint until it has caught up,
  reply its rows ``[partition, offset, event ms, watermark ms]`` and pyspark's version;
* ``refusals``: try ``kwatermark.joins`` and ``kwatermark.dedup`` and reply what each raised.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.getcwd())  # the repository (tests.support)

from tests.support.sparkkafka import child_io
from tests.support.streams import ev_ms, run_until_caught_up, wm_ms


def session():
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("kwatermark-spark-versions")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.session.timeZone", "UTC")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def stream(spark, request):
    reader = (spark.readStream.format("kwatermark")
              .option("kafka.bootstrap.servers", request["bootstrap"])
              .option("subscribe", request["topic"])
              .option("startingOffsets", "earliest"))
    for key, value in request.get("options", {}).items():
        reader = reader.option(key, value)
    return reader.load()


def main() -> None:
    import pyspark

    request, reply = child_io()
    spark = session()
    try:
        if request["mode"] == "stream":
            batches, _ = run_until_caught_up(stream(spark, request), request["checkpoint"])
            reply({"pyspark": pyspark.__version__,
                   "rows": [[r["partition"], r["offset"], ev_ms(r), wm_ms(r)]
                            for r in batches.rows]})
        else:
            from kwatermark.dedup import drop_duplicates
            from kwatermark.joins import interval_join

            options = {"watermark.heartbeat": "true"}
            left = stream(spark, {**request, "options": options})
            right = stream(spark, {**request, "options": options})
            raised = {}
            for name, call in {
                "joins": lambda: interval_join(left, right, ["key"], "-1 second", "1 second"),
                "dedup": lambda: drop_duplicates(left, ["key"], "1 minute"),
            }.items():
                try:
                    call()
                    raised[name] = None
                except Exception as exc:  # noqa: BLE001 - the test reads what was raised
                    raised[name] = f"{type(exc).__name__}: {exc}"
            reply({"pyspark": pyspark.__version__, "raised": raised})
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
