"""Issue 23: SQL over kwatermark — catalog tables, temporary views and streaming SQL."""

from __future__ import annotations

import pytest
from pyspark.errors import AnalysisException

from tests.support.kafka import Record


def sql_options(broker, topic: str, sep: str = " ") -> str:
    """The OPTIONS body (``sep`` " ") or the WITH body (``sep`` "=") for one topic."""
    pairs = {"kafka.bootstrap.servers": broker.bootstrap_servers, "subscribe": topic,
             "startingOffsets": "earliest"}
    return ", ".join(f"'{k}'{sep}'{v}'" for k, v in pairs.items())


def produce(topic_factory) -> tuple[str, set[tuple[int, int]]]:
    writer = topic_factory(2)
    writer.send([Record(i % 2, 1_000 + 1_000 * i, value=f"v{i}".encode()) for i in range(8)])
    # Offsets per partition follow the order the records were produced in.
    expected = {(p, o) for p in (0, 1) for o in range(4)}
    return writer.topic, expected


def streamed(spark, sql: str, name: str, checkpoint: str) -> list:
    query = (spark.sql(sql).writeStream.format("memory").queryName(name)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    query.awaitTermination(180)
    assert not query.isActive and query.exception() is None, query.exception()
    return spark.sql(f"SELECT * FROM {name}").collect()


def test_create_table_accepts_the_options_and_a_misspelled_one_fails_naming_it(
        spark, broker, topic_factory, tmp_path):
    topic, _ = produce(topic_factory)
    table = f"kw_{topic.replace('-', '_')}"
    location = tmp_path / "table"
    try:
        # LOCATION makes Spark add 'path' and 'location' too; none is a user option.
        spark.sql(f"CREATE TABLE {table} USING kwatermark OPTIONS ({sql_options(broker, topic)},"
                  f" 'watermark.maxOutOfOrderness' '5 seconds') LOCATION '{location}'")
        columns = [f.name for f in spark.table(table).schema.fields]
        assert columns[-2:] == ["event_time", "watermark"]
        with pytest.raises(AnalysisException) as info:
            spark.sql(f"CREATE TABLE {table}_bad USING kwatermark OPTIONS "
                      f"({sql_options(broker, topic)}, 'watermark.maxOutOfOrdernes' '5 s')")
        assert "unknown option 'watermark.maxoutofordernes'" in str(info.value)
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {table}")


def test_reading_a_catalog_table_gets_no_options_from_spark_and_says_what_to_do(
        spark, broker, topic_factory, tmp_path):
    topic, _ = produce(topic_factory)
    table = f"kw_{topic.replace('-', '_')}"
    try:
        spark.sql(f"CREATE TABLE {table} USING kwatermark OPTIONS ({sql_options(broker, topic)})"
                  f" LOCATION '{tmp_path / 'table'}'")
        with pytest.raises(AnalysisException) as info:
            spark.sql(f"SELECT * FROM {table}").collect()
        assert "got no options at all" in str(info.value)
        assert "docs/sql.md" in str(info.value)
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {table}")


def test_a_catalog_table_reads_in_batch_and_streaming_sql_with_the_options_given_in_with(
        spark, broker, topic_factory, tmp_path, checkpoint):
    topic, expected = produce(topic_factory)
    table = f"kw_{topic.replace('-', '_')}"
    options = sql_options(broker, topic, sep="=")
    try:
        spark.sql(f"CREATE TABLE {table} USING kwatermark OPTIONS ({sql_options(broker, topic)})"
                  f" LOCATION '{tmp_path / 'table'}'")
        rows = spark.sql(f"SELECT partition, offset FROM {table} WITH ({options})").collect()
        assert {(r["partition"], r["offset"]) for r in rows} == expected
        rows = streamed(spark, f"SELECT partition, offset, event_time FROM STREAM {table} WITH "
                               f"({options}) WATERMARK event_time DELAY OF INTERVAL 5 SECONDS",
                        f"{table}_stream", checkpoint)
        assert {(r["partition"], r["offset"]) for r in rows} == expected
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {table}")


def test_temporary_views_serve_batch_sql_and_streaming_sql_with_a_watermark_clause(
        spark, broker, topic_factory, checkpoint):
    topic, expected = produce(topic_factory)
    view = f"kw_{topic.replace('-', '_')}"
    spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW {view} USING kwatermark OPTIONS "
              f"({sql_options(broker, topic)})")
    rows = spark.sql(f"SELECT partition, offset FROM {view}").collect()
    assert {(r["partition"], r["offset"]) for r in rows} == expected

    (spark.readStream.format("kwatermark")
     .option("kafka.bootstrap.servers", broker.bootstrap_servers)
     .option("subscribe", topic).option("startingOffsets", "earliest")
     .load().createOrReplaceTempView(f"{view}_s"))
    rows = streamed(spark, f"SELECT window.start AS start, count(*) AS n FROM STREAM {view}_s "
                           f"WATERMARK event_time DELAY OF INTERVAL 0 SECONDS "
                           f"GROUP BY window(event_time, '4 seconds')",
                    f"{view}_windows", checkpoint)
    # Records at 1..8 s: windows [0, 4), [4, 8) are closed by the last record at 8 s under
    # append mode; [8, 12) is still open, so append mode leaves it out.
    assert sorted((r["start"].second, r["n"]) for r in rows) == [(0, 3), (4, 4)]
