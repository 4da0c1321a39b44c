"""A Python worker's imports stay out of PySpark's per-task garbage collection
(``source._freeze_imports``, docs/operations.md): frozen at the worker's first two tasks,
never later, so a later task's own objects are collected as before."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap


def test_a_worker_freezes_what_it_keeps_at_its_first_two_tasks_and_never_again():
    # A fresh interpreter stands for the worker: freezing is once per process.
    script = textwrap.dedent("""
        import gc, json
        from kwatermark.source import _freeze_imports
        counts, kept = [], []
        for task in range(4):
            kept.append([[task] for _ in range(5000)])   # what each task leaves behind
            _freeze_imports()
            counts.append(gc.get_freeze_count())
        print(json.dumps(counts))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True).stdout
    first, second, third, fourth = json.loads(out.splitlines()[-1])
    assert first > 5000                  # the imports and the first task's objects
    assert second >= first + 5000        # what the first task made after its freeze
    assert third == fourth == second     # later tasks' objects stay collectable
