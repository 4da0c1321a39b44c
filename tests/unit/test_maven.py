"""kwatermark.maven and kwatermark.sparkkafka with a stand-in ``mvn`` (a shell script): what
is asked of Maven, where the jars land, and what a user reads when Maven cannot help. The real
resolution runs in tests/integration/test_demo.py and every baseline test."""

from __future__ import annotations

import os
import stat

import pytest

from kwatermark.errors import KWatermarkError
from kwatermark.maven import pom_property, resolve, shipped_pom
from kwatermark.sparkkafka import SPARK_KAFKA_VERSION, jars_dir, kafka_jars, spark_kafka_conf


def fake_mvn(tmp_path, monkeypatch, script: str):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mvn = bin_dir / "mvn"
    mvn.write_text("#!/bin/sh\n" + script)
    mvn.chmod(mvn.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("KWATERMARK_CACHE", str(tmp_path / "cache"))
    return bin_dir


# Writes its arguments to args.txt and a jar per artifact into -DoutputDirectory=...
COPYING = """
echo "$@" > "$ARGS_FILE"
for a in "$@"; do case "$a" in -DoutputDirectory=*) out="${a#-DoutputDirectory=}";; esac; done
mkdir -p "$out"
for j in spark-sql-kafka-0-10_2.13-4.2.0 spark-token-provider-kafka-0-10_2.13-4.2.0 \
         kafka-clients-3.9.2 commons-pool2-2.13.1; do touch "$out/$j.jar"; done
"""


def test_the_connector_jars_are_handed_to_spark_as_spark_jars(tmp_path, monkeypatch):
    fake_mvn(tmp_path, monkeypatch, COPYING)
    monkeypatch.setenv("ARGS_FILE", str(tmp_path / "args.txt"))
    conf = spark_kafka_conf()
    assert list(conf) == ["spark.jars"]
    names = sorted(os.path.basename(p) for p in conf["spark.jars"].split(","))
    assert names == ["commons-pool2-2.13.1.jar", "kafka-clients-3.9.2.jar",
                     "spark-sql-kafka-0-10_2.13-4.2.0.jar",
                     "spark-token-provider-kafka-0-10_2.13-4.2.0.jar"]
    assert all(p.startswith(str(jars_dir())) for p in conf["spark.jars"].split(","))
    args = (tmp_path / "args.txt").read_text().split()
    assert "dependency:copy-dependencies" in args
    assert f"-Dspark.version={SPARK_KAFKA_VERSION}" in args
    # no staging directory left beside the jars; the second call does not run Maven
    assert [p.name for p in jars_dir().parent.iterdir()] == [jars_dir().name]
    (tmp_path / "args.txt").unlink()
    assert kafka_jars() == sorted(conf["spark.jars"].split(","))
    assert not (tmp_path / "args.txt").exists()


def test_the_shipped_poms_name_no_repository():
    """Maven looks artifacts up where the user's settings say (mirrors, proxies)."""
    for pom in ("spark-kafka.pom.xml", "kafka-broker.pom.xml"):
        text = shipped_pom(pom)
        assert "<repositor" not in text and "maven2" not in text and "https://" not in text
    assert pom_property("spark-kafka.pom.xml", "spark.version") == SPARK_KAFKA_VERSION == "4.2.0"


def test_a_maven_failure_says_why_in_its_first_line(tmp_path, monkeypatch):
    fake_mvn(tmp_path, monkeypatch,
             "echo '[ERROR] Failed to execute goal on project spark-kafka-connector: Could not "
             "resolve dependencies for project io.github.kwatermark:spark-kafka-connector:pom:1: "
             "Could not transfer artifact org.apache.spark:spark-sql-kafka-0-10_2.13:pom:4.2.0 "
             "from/to corporate (mirror.example): status code: 401 -> [Help 1]'\n"
             "exit 1\n")
    with pytest.raises(KWatermarkError) as failed:
        kafka_jars()
    first = str(failed.value).splitlines()[0]
    assert first == ("Maven could not resolve Spark's Kafka connector org.apache.spark:"
                     "spark-sql-kafka-0-10_2.13:4.2.0 (spark-kafka.pom.xml, mvn exit 1): Could "
                     "not transfer artifact org.apache.spark:spark-sql-kafka-0-10_2.13:pom:4.2.0"
                     " from/to corporate (mirror.example): status code: 401")
    assert not jars_dir().exists()
    assert list(jars_dir().parent.iterdir()) == []  # the staging directory is gone


def test_without_mvn_the_error_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("KWATERMARK_CACHE", str(tmp_path / "cache"))
    with pytest.raises(KWatermarkError, match=r"is fetched with `mvn`, which is not on PATH: "
                                              r"install Maven 3"):
        resolve("spark-kafka.pom.xml", tmp_path / "cache" / "lib", "Spark's Kafka connector")
