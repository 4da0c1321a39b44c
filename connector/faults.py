"""Fault injection for the tests (tests/conftest.py arms it): a task's first attempt fails
once, mid-range, so the tests can pin that Spark's retry gives the same rows. Inert unless
the environment variable ``KWATERMARK_TEST_FAIL_ONCE_DIR`` is set."""

from __future__ import annotations

import os

from kwatermark.offsets import RangeTask

# Set only by the fault-injection tests: fail a task's first attempt mid-range.
FAULT_ENV = "KWATERMARK_TEST_FAIL_ONCE_DIR"


def faults_armed() -> bool:
    """Whether any task may fail (``fault_point`` says which): asked once per task, not per
    range, where a task reads thousands."""
    return bool(os.environ.get(FAULT_ENV))


def fault_point(task: RangeTask) -> int | None:
    """Offset after which this task's first attempt fails (tests only): armed by a file
    ``<topic>.arm`` in the directory ``KWATERMARK_TEST_FAIL_ONCE_DIR`` names."""
    directory = os.environ.get(FAULT_ENV)
    if not directory or task.end - task.start < 2:
        return None
    if not os.path.exists(os.path.join(directory, f"{task.topic}.arm")):
        return None
    marker = os.path.join(directory, f"{task.topic}-{task.partition}-{task.start}")
    return None if os.path.exists(marker) else task.start + (task.end - task.start) // 2


def trip_fault(task: RangeTask) -> None:
    directory = os.environ[FAULT_ENV]
    with open(os.path.join(directory, f"{task.topic}-{task.partition}-{task.start}"), "w"):
        pass
    raise RuntimeError(f"injected test fault: topic {task.topic}, partition {task.partition}, "
                       f"range [{task.start}, {task.end})")
