"""Issue 23: errors as Spark shows them. The cause (kwatermark's message naming the option,
address, topic, partition or offset) is within the first lines of ``str(exception)``, right
after Spark's own prefix, not at the end of kwatermark's internal traceback."""

from __future__ import annotations

import pytest
from pyspark.errors import AnalysisException, StreamingQueryException

from tests.support.kafka import Record, TestBroker
from tests.support.streams import kwatermark_batch, kwatermark_stream

FIRST_LINES = 5


def cause_line(error: BaseException, needle: str) -> int:
    """The 1-based line of ``str(error)`` that holds ``needle``."""
    lines = str(error).splitlines()
    found = [i for i, line in enumerate(lines, start=1) if needle in line]
    assert found, str(error)
    return found[0]


def test_a_misspelt_option_is_the_first_thing_after_sparks_prefix(spark, broker):
    with pytest.raises(AnalysisException) as info:
        kwatermark_stream(spark, broker, "events", **{"watermark.maxOutOfOrdernes": "5 s"})
    assert "PYTHON_DATA_SOURCE_ERROR" in str(info.value)
    assert cause_line(info.value, "OptionError: unknown option "
                                  "'watermark.maxoutofordernes'") <= FIRST_LINES


def test_a_wrong_address_in_a_stream_shows_the_cause_first(spark, checkpoint):
    wrong = TestBroker("127.0.0.1:1", "external")
    query = (kwatermark_stream(spark, wrong, "events").writeStream.format("noop")
             .option("checkpointLocation", checkpoint).start())
    # The design bounds this at 30 s; the timeout here only keeps a regression from hanging.
    with pytest.raises(StreamingQueryException) as info:
        query.awaitTermination(300)
    assert cause_line(info.value, "BrokerError: listing topics failed against "
                                  "kafka.bootstrap.servers='127.0.0.1:1'") <= FIRST_LINES


def test_an_error_in_a_reading_task_shows_the_cause_first(spark, broker, topic_factory,
                                                         checkpoint):
    writer = topic_factory(1)
    writer.send([Record(0, 1_000, b"{not json")])
    frame = kwatermark_stream(spark, broker, writer.topic,
                              **{"value.format": "json", "value.json.schema": "id INT"})
    query = (frame.writeStream.format("noop").option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    with pytest.raises(StreamingQueryException) as info:
        query.awaitTermination(300)
    assert cause_line(info.value, f"DecodeError: topic {writer.topic}, partition 0, offset 0"
                      ) <= FIRST_LINES
    with pytest.raises(Exception) as info:
        kwatermark_batch(spark, broker, writer.topic,
                         **{"value.format": "json", "value.json.schema": "id INT"}).collect()
    assert cause_line(info.value, f"DecodeError: topic {writer.topic}, partition 0, offset 0"
                      ) <= FIRST_LINES
