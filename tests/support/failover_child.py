"""Child of tests/support/failover.py, run under the baseline interpreter
(tests/support/sparkkafka.py): one stream of the request's topic in the request's format
(Spark's own ``format("kafka")`` by default) from the earliest offset with a 1 s trigger.
Each non-empty batch is appended to the ``out`` file as a JSON line; ``started`` is
written once the query has run its first batch; the query runs until the ``stop`` file
exists, and the reply says whether it failed meanwhile."""

from __future__ import annotations

import json
import os
import time

from kwatermark.kafkabroker import die_with_parent
from tests.support.jvm import TEST_SPARK_CONF
from tests.support.sparkkafka import baseline_session, child_io


def main() -> None:
    die_with_parent()  # a test killed mid-way leaves no stream behind
    request, reply = child_io()
    spark = baseline_session(f"kwatermark-failover-{request['fmt']}", conf=TEST_SPARK_CONF)
    out = open(request["out"], "a")  # noqa: SIM115 - closed below, written per batch

    def collect(frame, batch_id: int) -> None:
        rows = [[r["partition"], r["offset"], bytes(r["value"]).decode()]
                for r in frame.select("partition", "offset", "value").collect()]
        if rows:
            out.write(json.dumps({"batch": batch_id, "at": time.monotonic(), "rows": rows})
                      + "\n")
            out.flush()

    query = (spark.readStream.format(request["fmt"])
             .option("kafka.bootstrap.servers", request["bootstrap"])
             .option("subscribe", request["topic"]).option("startingOffsets", "earliest")
             .load().writeStream.foreachBatch(collect)
             .option("checkpointLocation", request["checkpoint"])
             .trigger(processingTime="1 second").start())
    error = None
    while not os.path.exists(request["stop"]):
        if query.lastProgress is not None and not os.path.exists(request["started"]):
            with open(request["started"], "w") as f:
                f.write("started")
        if not query.isActive:
            error = str(query.exception())
            break
        time.sleep(0.2)
    if query.isActive:
        query.stop()
    out.close()
    spark.stop()
    reply({"error": error})


if __name__ == "__main__":
    main()
