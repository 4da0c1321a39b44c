"""Jars resolved by the machine's ``mvn`` from a pom shipped with kwatermark, into a cache
outside every work tree (``$KWATERMARK_CACHE``, default ``~/.cache/kwatermark``).

The local Apache Kafka's runtime (:mod:`kwatermark.kafkabroker`, ``kafka-broker.pom.xml``) and
Spark's own Kafka connector (:mod:`kwatermark.sparkkafka`, ``spark-kafka.pom.xml``) come this
way. ``mvn`` reads the user's own Maven settings (``~/.m2/settings.xml``: mirrors, proxies,
credentials), and no repository address is written into the project: the poms name artifacts
only, and Maven fetches them from wherever those settings say (Maven Central by default).

>>> lib = resolve("kafka-broker.pom.xml", cache_root() / "kafka-4.1.1" / "lib",
...               "Apache Kafka 4.1.1")                             # doctest: +SKIP
>>> sorted(p.name for p in lib.iterdir())[:1]                       # doctest: +SKIP
['commons-beanutils-1.9.4.jar']
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from importlib import resources
from pathlib import Path

from kwatermark.errors import KWatermarkError

MAVEN_HINT = "Maven 3 (apt-get install maven)"
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Maven colours its output even with -B at times


def require_tool(name: str, what: str, needed_by: str, otherwise: str) -> str:
    """The path of ``name``, or an error saying who needs it, what to install, and what
    else the user can do (``otherwise``)."""
    found = shutil.which(name)
    if not found:
        raise KWatermarkError(f"{needed_by} needs `{name}` on PATH: install {what}, or "
                              f"{otherwise}")
    return found


def cache_root() -> Path:
    """Where resolved jars live: ``$KWATERMARK_CACHE``, else ``$XDG_CACHE_HOME/kwatermark``,
    else ``~/.cache/kwatermark``."""
    explicit = os.environ.get("KWATERMARK_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kwatermark"


def shipped_pom(name: str) -> str:
    """The text of a pom shipped in the kwatermark package (``name``: its file name)."""
    return resources.files("kwatermark").joinpath(name).read_text(encoding="utf-8")


def pom_property(name: str, key: str) -> str:
    """A ``<properties>`` value of the shipped pom ``name``."""
    found = re.search(rf"<{re.escape(key)}>([^<]+)</{re.escape(key)}>", shipped_pom(name))
    if not found:
        raise KWatermarkError(f"{name} names no {key}")
    return found.group(1).strip()


def resolve(pom: str, lib: Path, what: str, properties: Mapping[str, str] | None = None,
            timeout_s: float = 900) -> Path:
    """The directory ``lib`` holding the runtime jars of the shipped pom ``pom``, resolved
    with ``mvn dependency:copy-dependencies`` on first use (``properties``: ``-D`` values,
    which override the pom's own). ``what`` names the jars in errors.

    Resolution writes to a fresh directory beside ``lib`` and renames it into place, so
    processes resolving at the same time never see half a directory. Raises
    :class:`KWatermarkError` without ``mvn`` on PATH, or with Maven's own last lines when it
    fails (offline, a mirror that lacks an artifact, credentials refused).
    """
    if lib.is_dir():
        return lib
    mvn = shutil.which("mvn")
    if not mvn:
        raise KWatermarkError(f"{what} is fetched with `mvn`, which is not on PATH: "
                              f"install {MAVEN_HINT}")
    lib.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{lib.name}-", dir=lib.parent))
    try:
        (staging / "pom.xml").write_text(shipped_pom(pom), encoding="utf-8")
        defines = [f"-D{k}={v}" for k, v in (properties or {}).items()]
        try:
            result = subprocess.run(
                [mvn, "-q", "-B", "-Dstyle.color=never", "-f", str(staging / "pom.xml"), *defines,
                 "dependency:copy-dependencies", f"-DoutputDirectory={staging / 'jars'}",
                 "-DincludeScope=runtime"],
                check=False, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise KWatermarkError(f"Maven did not resolve {what} ({pom}) within "
                                  f"{timeout_s:g} s") from exc
        if result.returncode != 0:
            lines = [line for line in ANSI.sub("", result.stdout + result.stderr).splitlines()
                     if line.strip() not in ("", "[ERROR]")]
            tail = "\n".join(lines[-15:])
            raise KWatermarkError(f"Maven could not resolve {what} ({pom}, mvn exit "
                                  f"{result.returncode}): {_reason(lines)}\n{tail}")
        try:
            (staging / "jars").rename(lib)
        except OSError:
            if not lib.is_dir():  # not another process winning the race: a real failure
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return lib


def _reason(lines: list[str]) -> str:
    """Maven's first error line, without its ``[ERROR]`` prefix and the goal's boilerplate."""
    for line in lines:
        text = re.sub(r"^\s*\[ERROR\]\s*", "", line)
        if text != line and text.strip():
            text = re.sub(r"^Failed to execute goal( .*?)? on project [^:]+: ", "", text)
            text = re.sub(r"^Could not resolve dependencies for project [^ ]+: ", "", text)
            return re.sub(r"\s*-> \[Help \d+\]\s*$", "", text).strip()
    return "see Maven's output below"
