"""Spark's own Kafka connector (``format("kafka")``) for a SparkSession, as ``spark.jars``.

The jars are the ones Spark's Kafka guide lists for deploying without ``packages``: the
connector ``org.apache.spark:spark-sql-kafka-0-10_2.13``, its token provider, kafka-clients and
commons-pool2, in the versions the connector's pom asks for. The machine's ``mvn`` resolves
them from the pom shipped beside this module (``spark-kafka.pom.xml``) once, into
``$KWATERMARK_CACHE`` (:mod:`kwatermark.maven`), honouring the user's Maven settings (mirrors,
proxies, credentials). ``kwatermark-demo`` runs Spark's route with it; the tests' baseline does
too.

>>> spark = (SparkSession.builder.config(map=spark_kafka_conf())    # doctest: +SKIP
...          .getOrCreate())
>>> spark.read.format("kafka")...                                    # doctest: +SKIP

Maven Central serves the connector up to 4.2.0 only (4.2.1 and 4.3.0 are missing there), so
:data:`SPARK_KAFKA_VERSION` is 4.2.0 whatever PySpark runs; it reads, batch and streaming, in
PySpark 4.3.0 too.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from kwatermark.errors import KWatermarkError
from kwatermark.maven import cache_root, pom_property, resolve, shipped_pom

POM = "spark-kafka.pom.xml"
SPARK_KAFKA_VERSION = pom_property(POM, "spark.version")


def kafka_package(version: str = SPARK_KAFKA_VERSION) -> str:
    """The connector's Maven coordinate (what ``spark.jars.packages`` would name)."""
    return f"org.apache.spark:spark-sql-kafka-0-10_2.13:{version}"


def jars_dir(version: str = SPARK_KAFKA_VERSION) -> Path:
    """Where :func:`kafka_jars` keeps the jars (it exists once they are resolved)."""
    # Named by the pom's text too: a pom that asks for more jars (another connector)
    # resolves afresh instead of reusing a directory without them.
    digest = hashlib.sha256(shipped_pom(POM).encode()).hexdigest()[:8]
    return cache_root() / f"spark-kafka-{version}-{digest}"


def kafka_jars(version: str = SPARK_KAFKA_VERSION) -> list[str]:
    """The connector's jars (absolute paths), resolved with ``mvn`` on first use. Raises
    :class:`~kwatermark.errors.KWatermarkError` without ``mvn`` or when Maven fails (the
    first line says why)."""
    lib = resolve(POM, jars_dir(version), f"Spark's Kafka connector {kafka_package(version)}",
                  properties={"spark.version": version})
    jars = sorted(str(p) for p in lib.glob("*.jar"))
    if not any("spark-sql-kafka" in p for p in jars):
        raise KWatermarkError(f"{lib} holds no spark-sql-kafka jar (only {jars}): remove "
                              f"the directory, and the next use resolves it again")
    return jars


def spark_kafka_conf(version: str = SPARK_KAFKA_VERSION) -> dict[str, str]:
    """SparkSession config that adds ``format("kafka")``: ``spark.jars`` (set it before the
    session starts; a running session keeps its classpath)."""
    return {"spark.jars": ",".join(kafka_jars(version))}
