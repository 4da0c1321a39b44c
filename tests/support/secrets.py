"""Where a secret could leak after a run: files the query wrote, errors, and everything the
test process, Spark's JVM and its Python workers printed."""

from __future__ import annotations

from pathlib import Path


def spark_output(request) -> str | None:
    """What the Spark JVM and its Python workers (librdkafka's log lines among them) printed
    so far, or None when pytest does not capture (``-s``). They write to the file pytest's
    global capture gave the JVM when it started, which capfd cannot see."""
    capture = request.config.pluginmanager.getplugin("capturemanager")
    if capture is None or not capture.is_globally_capturing():
        return None
    captured = capture.read_global_capture()
    return captured.out + captured.err


def gather(roots: list[Path], texts: dict[str, str], capfd, request) -> dict[str, str]:
    """Every place to search, by name: each file under ``roots``, the given ``texts``, this
    process's stdout/stderr and Spark's output (when pytest captures it)."""
    places = dict(texts)
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file():
                places[str(path)] = path.read_bytes().decode("utf-8", "replace")
    captured = capfd.readouterr()
    places["stdout"], places["stderr"] = captured.out, captured.err
    output = spark_output(request)
    if output is not None:
        places["spark output"] = output
    return places


def leaks(secret: str, places: dict[str, str]) -> list[str]:
    return [where for where, text in places.items() if secret in text]
