"""Fixtures shared by every test: one broker and one SparkSession per test session."""

from __future__ import annotations

import os
import sys
import tempfile
import time
import uuid

import pytest

from tests.support.jvm import TEST_JVM_OPTIONS
from tests.support.kafka import (
    TestBroker,
    TopicWriter,
    describe_test_broker,
    start_test_broker,
)

# Collected timestamps are naive datetimes in the local zone: make that UTC.
os.environ["TZ"] = "UTC"
time.tzset()
# Spark's Python workers must run this interpreter, with the project importable, and import
# pyspark from its package rather than its zip (tests/worker_site/sitecustomize.py says why).
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (_ROOT, os.path.join(_ROOT, "tests", "plugins"),
              os.path.join(_ROOT, "tests", "worker_site"), os.environ.get("PYTHONPATH"))
    if p)
# Fault injection (kwatermark.reader reads it only when set): a test arms a topic by
# creating "<topic>.arm" here; the first attempt of each of its tasks then fails mid-range.
# Set before the SparkSession starts so Spark's Python workers inherit it.
FAULT_DIR = tempfile.mkdtemp(prefix="kwatermark-faults-")
os.environ["KWATERMARK_TEST_FAIL_ONCE_DIR"] = FAULT_DIR


# README's test command runs two pytest-xdist workers, whole files each (--dist loadfile), in
# collection order (--no-loadscope-reorder): a free worker takes the next file. The files
# that take minutes go first, so that none of them starts when the other worker is almost
# done. Longest first, serial seconds on the 2-core CI machine (2026-11-27): the older
# pyspark subsets 782, windows 415, the 3-node cluster 400, the killed joins 306, the demo
# 279, the Python engine's rerun 243, the drop-in baselines 167 and 128, joins 122, the docs'
# examples 110, restarts 109; the soak's 68 and everything else after.
LONGEST_FIRST = tuple(f"tests/{name}.py" for name in (
    "integration/test_spark_versions", "integration/test_windows",
    "integration/test_cluster_faults", "integration/test_joins_restart",
    "integration/test_demo", "integration/test_read_engines", "integration/test_dropin",
    "integration/test_joins_spark", "integration/test_joins", "integration/test_docs_examples",
    "integration/test_restart"))


def pytest_configure(config) -> None:
    """Under xdist (README's command), make the pyspark venvs the tests use before the
    workers start. Making or refreshing one rebuilds this checkout's editable link tree,
    through which a Spark worker of the other xdist worker may be importing kwatermark at
    that moment (tests.support.sparkkafka.baseline_python): a fresh clone's first run
    failed so. Once made, this is a check of a stamp file per venv."""
    if getattr(config, "workerinput", None) is not None or \
            not config.getoption("numprocesses", None):
        return
    from tests.support import sparkkafka

    versions = [v for v in (sparkkafka.BASELINE_PYSPARK, *sparkkafka.OLDER_PYSPARKS)
                if not sparkkafka.venv_ready(v)]
    for version in versions:
        print(f"making the pyspark {version} venv the tests use (about a minute, once per "
              f"checkout and again when a module is added)", file=sys.stderr, flush=True)
        try:
            sparkkafka.baseline_python(version)
        except Exception as exc:  # noqa: BLE001 - the tests that need it will say so again
            print(f"could not make it now ({str(exc)[:300]}); the tests that need it will "
                  f"try again", file=sys.stderr, flush=True)


def pytest_collection_modifyitems(config, items) -> None:
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


def pytest_report_header(config) -> str:
    """Say which broker the integration tests run against (issue 14)."""
    return describe_test_broker()


@pytest.fixture(scope="session")
def broker() -> TestBroker:
    started = start_test_broker()
    yield started
    started.stop()


@pytest.fixture(scope="session")
def schema_registry():
    """A real Confluent-compatible Schema Registry (Apicurio, kwatermark.schemaregistry),
    started once per session; its default compatibility is Apicurio's, NONE. Tests register
    under subjects of their own unique topics."""
    from kwatermark.schemaregistry import LocalSchemaRegistry

    registry = LocalSchemaRegistry.start()
    yield registry
    registry.stop()


@pytest.fixture(scope="session")
def spark():
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2,4]")  # 4 attempts per task
               .appName("kwatermark-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.streaming.stopTimeout", "30s")
               .config("spark.driver.memory", "2g")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.extraJavaOptions", TEST_JVM_OPTIONS)
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def topic_factory(broker):
    def make(partitions: int = 1) -> TopicWriter:
        return TopicWriter(broker, broker.create_topic(partitions))
    return make


@pytest.fixture
def fault_dir() -> str:
    return FAULT_DIR


@pytest.fixture
def checkpoint(tmp_path) -> str:
    return str(tmp_path / f"checkpoint-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def ledger_dir(tmp_path) -> str:
    return str(tmp_path / "ledger")


@pytest.fixture(params=["answered at once", "answered late"])
def brokers_answer(request, monkeypatch):
    """The planner's tests with a fake broker run twice: end offsets answered at once, and
    still on their way once the last batch is folded (as at thousands of partitions: the
    planner readies what needs no end offset meanwhile). Both plan the same batches."""
    from tests.unit.test_progress_model import FakeBroker

    monkeypatch.setattr(FakeBroker, "answers_late", request.param == "answered late")
