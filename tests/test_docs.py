"""The python examples in docs/ run as written (executed in order, one namespace per file)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def runnable_blocks(text: str) -> list[str]:
    """Python blocks, except one-line-per-method protocol signatures (`def ...: ...`)."""
    blocks = BLOCK.findall(text)
    return [b for b in blocks if not all(ln.startswith("def ") and ln.endswith("...") for ln in b.strip().splitlines())]


def test_architecture_examples_run():
    text = (DOCS / "architecture.md").read_text(encoding="utf-8")
    blocks = runnable_blocks(text)
    assert len(blocks) >= 4, "one example per extension point"
    namespace: dict = {"__name__": "architecture_md"}
    for number, block in enumerate(blocks, start=1):
        try:
            exec(compile(block, f"docs/architecture.md block {number}", "exec"), namespace)
        except Exception as err:  # name the block, not only the line
            pytest.fail(f"docs/architecture.md python block {number} failed: {type(err).__name__}: {err}")
