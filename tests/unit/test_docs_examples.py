"""The docs show docs/examples/*.py verbatim: the code a reader pastes is the code
tests/integration/test_docs_examples.py runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHOWN_IN = {"setup": "windows.md", "tumbling": "windows.md", "sliding": "windows.md",
            "session": "windows.md", "sink": "windows.md", "late": "windows.md",
            "custom_timers": "watermarks.md", "joins": "joins.md", "dedup": "dedup.md"}


def python_blocks(doc: str) -> list[str]:
    text = (ROOT / "docs" / doc).read_text()
    return [block.strip("\n") for block in re.findall(r"```python\n(.*?)```", text, re.DOTALL)]


@pytest.mark.parametrize("example", sorted(SHOWN_IN))
def test_example_is_shown_verbatim(example):
    code = (ROOT / "docs" / "examples" / f"{example}.py").read_text().strip("\n")
    assert code in python_blocks(SHOWN_IN[example])


def test_every_example_is_shown_somewhere():
    assert {p.stem for p in (ROOT / "docs" / "examples").glob("*.py")} == set(SHOWN_IN)
