"""DESIGN §23: kwatermark says why it cannot run, instead of Spark's DATA_SOURCE_NOT_FOUND."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kwatermark import sparkversion


@pytest.mark.parametrize("version", ["4.0.0", "4.0.5", "4.1.4", "4.2.1", "4.3.0", "4.2.0.dev1"])
def test_every_pyspark_4_is_supported(version):
    assert sparkversion.unsupported_reason(version) is None


@pytest.mark.parametrize("version, why", [
    ("3.5.3", " (Python streaming data sources came with Spark 4.0)"),
    ("5.0.0", ""),
])
def test_others_are_told_the_installed_version_and_the_supported_range(version, why):
    reason = sparkversion.unsupported_reason(version)
    assert reason == (f"kwatermark does not run on the installed pyspark {version}{why}; it "
                      "supports pyspark 4.0 or later, below 5 (pyspark>=4.0,<5)")


def run(code: str, path_first: str | None = None) -> subprocess.CompletedProcess:
    env = None
    if path_first is not None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (path_first, os.environ.get("PYTHONPATH")) if p)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False, env=env, timeout=120)


def test_import_kwatermark_beside_pyspark_3_names_both_versions(tmp_path):
    # What importlib.metadata finds first on sys.path is the installed pyspark's version.
    info = tmp_path / "pyspark-3.5.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pyspark\nVersion: 3.5.3\n")
    done = run("import kwatermark", path_first=str(tmp_path))
    assert done.returncode != 0
    assert ("ImportError: kwatermark does not run on the installed pyspark 3.5.3 (Python "
            "streaming data sources came with Spark 4.0); it supports pyspark 4.0 or later, "
            "below 5 (pyspark>=4.0,<5)") in done.stderr


def test_the_running_pyspark_wins_over_the_package_metadata(tmp_path):
    # Spark's Python workers and its stream planner import pyspark from Spark's own
    # pyspark.zip, which carries no package metadata; what metadata finds (here a stale
    # pyspark 3.5.3 first on the path) is not the pyspark that runs.
    import pyspark

    info = tmp_path / "pyspark-3.5.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pyspark\nVersion: 3.5.3\n")
    spark_zip = os.path.join(os.path.dirname(pyspark.__file__), "python", "lib", "pyspark.zip")
    done = run(f"import sys\n"
               f"sys.path.insert(0, {spark_zip!r})\n"
               f"import pyspark\n"
               f"assert pyspark.__file__.startswith({spark_zip!r}), pyspark.__file__\n"
               f"import kwatermark.sparkversion as v\n"
               f"print(v.installed())\n", path_first=str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == pyspark.__version__


def test_a_source_that_cannot_load_is_still_discovered_and_says_why():
    # Spark's discovery imports pyspark_kwatermark; a failing import would make it answer
    # only DATA_SOURCE_NOT_FOUND. Here the source module cannot be imported.
    done = run("import sys, pyspark\n"
               "sys.modules['kwatermark.source'] = None\n"
               "import pyspark_kwatermark as m\n"
               "assert m.DefaultSource.name() == 'kwatermark'\n"
               "try:\n"
               "    m.DefaultSource({}).schema()\n"
               "except ImportError as e:\n"
               "    print(e)\n")
    assert done.returncode == 0, done.stderr
    import pyspark

    message = done.stdout.strip()
    assert message.startswith(f"kwatermark could not load its Spark source on pyspark "
                              f"{pyspark.__version__} (Python ")
    assert "import of kwatermark.source halted" in message
    assert "kwatermark supports pyspark 4.0 or later, below 5 (pyspark>=4.0,<5)" in message
