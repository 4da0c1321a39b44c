"""Spark's own Kafka source (``format("kafka")``) as a baseline beside ``format("kwatermark")``.

Spark's connector ``org.apache.spark:spark-sql-kafka-0-10_2.13`` must have Spark's own version,
and Maven Central serves it only up to 4.2.0 (4.2.1 and 4.3.0 are missing there), while the
project's venv runs PySpark 4.3. So the baseline runs in an interpreter of its own: a venv with
``pyspark==BASELINE_PYSPARK`` and kwatermark installed editable from this repository, created
on demand under ``~/.cache/kwatermark`` (pip's cache makes that about a minute once). Spark
Kafka's jars are handed to Spark with ``spark.jars``, as Spark's Kafka guide deploys them
without ``packages`` (the connector, its token provider, kafka-clients, commons-pool2): the
machine's ``mvn`` resolves them once into the same cache, with the user's Maven settings
(``kwatermark.sparkkafka``, product code the demo uses too).

Use from a test or a benchmark (any interpreter)::

    from tests.support.sparkkafka import run_baseline
    result = run_baseline("tests/integration/dropin_child.py", {"bootstrap": "..."})

and inside the child script (which runs under the baseline interpreter)::

    from tests.support.sparkkafka import baseline_session, child_io
    request, reply = child_io()          # the JSON request; reply(obj) writes the answer
    spark = baseline_session("my-comparison")
    ...
    reply({"rows": ...})

``python -m tests.support.sparkkafka`` prepares the venv and resolves the jars (``.ci/run``
does, so a failure says so before any test runs).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from kwatermark.maven import cache_root
from kwatermark.sparkkafka import SPARK_KAFKA_VERSION, kafka_jars, kafka_package

# The newest Spark whose spark-sql-kafka Maven Central serves (4.2.0 found, 4.2.1 and 4.3.0
# missing). PyPI has pyspark 4.2.0 too, so the baseline compares Spark's source and ours on
# one Spark version, as the issue requires.
BASELINE_PYSPARK = SPARK_KAFKA_VERSION
# The newest pyspark of each 4.x line below the default one (`pip index versions pyspark`):
# tests/integration/test_spark_versions.py runs a subset of the tests under each.
OLDER_PYSPARKS = ("4.0.5", "4.1.4", "4.2.1")

REPO_ROOT = Path(__file__).resolve().parents[2]

def spark_package(module: str, version: str = SPARK_KAFKA_VERSION) -> str:
    """The coordinate of another of Spark's external modules, e.g. ``spark-avro`` or
    ``spark-protobuf`` (for ``extra_packages``)."""
    return f"org.apache.spark:{module}_2.13:{version}"


def spark_kafka_conf(version: str = SPARK_KAFKA_VERSION,
                     extra_packages: tuple[str, ...] = ()) -> dict[str, str]:
    """Spark config that adds Spark's Kafka source: ``spark.jars``, the connector's jars
    resolved by the machine's ``mvn`` into :func:`cache_root` (``kwatermark.sparkkafka``;
    every run after the first is offline). ``extra_packages`` (Maven coordinates, e.g. the
    benchmarks' spark-avro) go to ``spark.jars.packages``, resolved by Spark's own default
    chain."""
    conf = {"spark.jars": ",".join(kafka_jars(version))}
    if extra_packages:
        conf["spark.jars.packages"] = ",".join(extra_packages)
    return conf


def baseline_venv(pyspark_version: str = BASELINE_PYSPARK) -> Path:
    # One venv per repository checkout: kwatermark is installed editable, so a venv shared
    # by two work trees would run whichever tree installed it last.
    tree = hashlib.sha256(str(REPO_ROOT).encode()).hexdigest()[:8]
    return cache_root() / f"venv-pyspark-{pyspark_version}-{tree}"


def _source_stamp() -> str:
    """What an editable install depends on: the project metadata and the set of modules
    (strict-mode editable installs link each module, so an added module needs a reinstall)."""
    digest = hashlib.sha256((REPO_ROOT / "pyproject.toml").read_bytes())
    for folder in ("connector", "serde", "discovery"):
        for path in sorted((REPO_ROOT / folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and \
                    not path.name.startswith("_fastread"):   # built by the install itself
                digest.update(str(path.relative_to(REPO_ROOT)).encode())
    # The compiled read engine is built by the install: its sources' contents count.
    for path in sorted([REPO_ROOT / "setup.py", *(REPO_ROOT / "csrc").glob("*"),
                        REPO_ROOT / "_build" / "fastread_ffi.py"]):
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test runs or benches may prepare at once
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run(cmd: list[str], what: str) -> None:
    done = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed ({' '.join(cmd)}):\n{done.stdout[-2000:]}"
                           f"{done.stderr[-4000:]}")


def venv_ready(pyspark_version: str = BASELINE_PYSPARK) -> bool:
    """Whether :func:`baseline_python` would find its venv made and current."""
    return _stamped(baseline_venv(pyspark_version) / "kwatermark-ready", _source_stamp())


def _stamped(ready: Path, stamp: str) -> bool:
    return ready.exists() and ready.read_text() == stamp


def baseline_python(pyspark_version: str = BASELINE_PYSPARK) -> str:
    """The interpreter of the baseline venv (pyspark ``pyspark_version`` + kwatermark from
    this checkout), created or refreshed if needed. Safe to call from several processes.

    Creating or refreshing one rebuilds the checkout's editable link tree
    (``build/__editable__.*``), through which every venv of this checkout, the tests' own
    included, imports kwatermark: a Spark worker that imports a kwatermark module meanwhile
    finds none (a CI run failed so, a query's tasks on ``No module named
    'kwatermark.arrow'``). So ``python -m tests.support.sparkkafka``, which ``.ci/run`` runs
    before the tests, makes every venv the tests use (:func:`prepare_all`), and so does
    README's test command before its xdist workers start (``tests/conftest.py``)."""
    venv = baseline_venv(pyspark_version)
    python = venv / "bin" / "python"
    ready = venv / "kwatermark-ready"
    stamp = _source_stamp()
    if _stamped(ready, stamp):
        return str(python)
    with _locked(venv.with_name(venv.name + ".lock")):
        if _stamped(ready, stamp):
            return str(python)
        if not ready.exists() and venv.exists():
            shutil.rmtree(venv)  # a creation that died half-way
        if not venv.exists():
            _run([sys.executable, "-m", "venv", str(venv)], "creating the baseline venv")
            _run([str(python), "-m", "pip", "install", "-q", f"pyspark=={pyspark_version}",
                  "-e", str(REPO_ROOT)], f"installing pyspark=={pyspark_version} + kwatermark")
        else:
            ready.unlink()
            _run([str(python), "-m", "pip", "install", "-q", "--no-deps", "-e",
                  str(REPO_ROOT)], "refreshing kwatermark in the baseline venv")
        ready.write_text(stamp)
    return str(python)


def child_env(python: str) -> dict[str, str]:
    """The environment a baseline child runs with: Spark's Python workers use the same
    interpreter, the repository is importable (``tests.support``), timestamps are UTC."""
    env = dict(os.environ)
    env["PYSPARK_PYTHON"] = python
    env["PYSPARK_DRIVER_PYTHON"] = python
    env["TZ"] = "UTC"
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    env.pop("SPARK_HOME", None)  # the child's pyspark must use its own jars
    return env


def run_baseline(script: str | os.PathLike, request: Mapping[str, Any] | None = None,
                 timeout: float = 1800, pyspark_version: str = BASELINE_PYSPARK,
                 log_path: str | os.PathLike | None = None) -> Any:
    """Run ``script`` under the baseline interpreter with ``request`` (JSON) and return the
    JSON it replied with (:func:`child_io`). A failing child raises with its stderr's tail;
    ``log_path`` keeps the child's stdout and stderr (else they are dropped on success)."""
    python = baseline_python(pyspark_version)
    with tempfile.TemporaryDirectory(prefix="kwatermark-baseline-") as tmp:
        request_path = Path(tmp) / "request.json"
        reply_path = Path(tmp) / "reply.json"
        request_path.write_text(json.dumps(dict(request or {})))
        log = Path(log_path) if log_path else Path(tmp) / "child.log"
        with open(log, "w") as out:
            done = subprocess.run([python, str(script), str(request_path), str(reply_path)],
                                  check=False, stdout=out, stderr=subprocess.STDOUT,
                                  env=child_env(python), cwd=str(REPO_ROOT), timeout=timeout)
        if done.returncode != 0 or not reply_path.exists():
            tail = log.read_text(errors="replace")[-6000:]
            raise RuntimeError(f"baseline child {script} exited {done.returncode} without a "
                               f"reply; its output ends:\n{tail}")
        return json.loads(reply_path.read_text())


def child_io() -> tuple[Any, Callable[[Any], None]]:
    """In a child started by :func:`run_baseline`: the request, and the function that
    writes the reply (call it once, with anything ``json.dumps`` takes)."""
    request_path, reply_path = sys.argv[1], sys.argv[2]
    with open(request_path) as f:
        request = json.load(f)

    def reply(obj: Any) -> None:
        tmp = reply_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(obj, f, default=str)
        os.replace(tmp, reply_path)  # a killed child leaves no half-written reply

    return request, reply


def baseline_session(app: str = "kwatermark-baseline", master: str = "local[2]",
                     conf: Mapping[str, str] | None = None,
                     extra_packages: tuple[str, ...] = ()):
    """A SparkSession with Spark's Kafka source on its classpath (``format("kafka")``) and
    kwatermark discovered (``format("kwatermark")``), UTC, no UI. Extra ``conf`` wins;
    ``extra_packages`` (e.g. :func:`spark_package` ``("spark-avro")``) join Kafka's."""
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName(app)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.memory", "2g"))
    for key, value in {**spark_kafka_conf(extra_packages=extra_packages),
                       **dict(conf or {})}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def prepare(pyspark_version: str = BASELINE_PYSPARK) -> str:
    """Create the baseline venv and resolve Spark Kafka's jars (a session that starts and
    stops); return a line saying what is ready. Raises with the reason when either fails."""
    python = baseline_python(pyspark_version)
    code = ("from tests.support.sparkkafka import baseline_session, kafka_package\n"
            "s = baseline_session('kwatermark-baseline-prepare')\n"
            "try:\n"
            "    s.read.format('kafka').load()  # no topic: Kafka's own option check fails\n"
            "except Exception as e:\n"
            "    assert 'subscribe' in str(e), e  # not 'Failed to find data source: kafka'\n"
            "print(s.version, kafka_package())\n"
            "s.stop()\n")
    done = subprocess.run([python, "-c", code], check=False, capture_output=True, text=True,
                          env=child_env(python), cwd=str(REPO_ROOT), timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"Spark's Kafka source could not be prepared "
                           f"({kafka_package()} through spark.jars):\n"
                           f"{done.stdout[-2000:]}{done.stderr[-4000:]}")
    spark_version, package = done.stdout.split()[-2:]
    return f"baseline: pyspark {spark_version} ({python}) with {package}"


def prepare_all() -> list[str]:
    """:func:`prepare`, then the venv of each of ``OLDER_PYSPARKS``."""
    return [prepare(), *(f"pyspark {version}: {baseline_python(version)}"
                         for version in OLDER_PYSPARKS)]


if __name__ == "__main__":
    print("\n".join(prepare_all()))
