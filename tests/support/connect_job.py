"""Runs in a child process (a Spark Connect session and the tests' classic session do not
share a process): a batch read, a stream and kwatermark.windows.aggregate through
``SparkSession.builder.remote("local[2]")``. Prints one JSON line of what each returned.

Usage: python -m tests.support.connect_job BOOTSTRAP TOPIC WORKDIR
"""

from __future__ import annotations

import json
import os
import sys


def main(bootstrap: str, topic: str, workdir: str) -> None:
    from pyspark.sql import SparkSession

    from kwatermark.windows import aggregate, tumbling

    spark = (SparkSession.builder.remote("local[2]")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.session.timeZone", "UTC")
             .getOrCreate())
    assert type(spark).__module__.startswith("pyspark.sql.connect"), type(spark)
    options = {"kafka.bootstrap.servers": bootstrap, "subscribe": topic,
               "startingOffsets": "earliest"}
    out: dict[str, object] = {}

    batch = spark.read.format("kwatermark").options(**options).load()
    out["batch"] = sorted([r["partition"], r["offset"]]
                          for r in batch.select("partition", "offset").collect())

    stream = spark.readStream.format("kwatermark").options(**options).load()
    query = (stream.select("partition", "offset").writeStream.format("memory")
             .queryName("connect_rows")
             .option("checkpointLocation", os.path.join(workdir, "rows"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    out["stream"] = sorted([r["partition"], r["offset"]]
                           for r in spark.sql("SELECT * FROM connect_rows").collect())

    beating = (spark.readStream.format("kwatermark").options(**options)
               .option("watermark.heartbeat", "true").load())
    windows = aggregate(beating, tumbling("10 seconds"), aggs={"n": ("count", None)})
    query = (windows.writeStream.outputMode("append").format("memory")
             .queryName("connect_windows")
             .option("checkpointLocation", os.path.join(workdir, "windows"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    out["windows"] = sorted(
        [int(r["window_start"].timestamp() * 1000), r["n"], r["kind"]]
        for r in spark.sql("SELECT * FROM connect_windows").collect())
    print("RESULT " + json.dumps(out), flush=True)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:4])
