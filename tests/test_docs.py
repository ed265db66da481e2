"""The docs' code blocks: what `--markdown-docs` does not run is an excerpt of a tested example."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```python[^\n]*\bnotest\b[^\n]*\n(.*?)^```", re.S | re.M)
EXAMPLES = [path.read_text("utf-8") for path in sorted((ROOT / "examples").rglob("*.py"))]


def notest_blocks() -> list[tuple[str, str]]:
    return [
        (f"{doc.name}:{doc.read_text('utf-8')[: m.start()].count(chr(10)) + 1}", m.group(1))
        for doc in DOCS
        for m in FENCE.finditer(doc.read_text("utf-8"))
    ]


def test_the_docs_have_notest_blocks_to_check() -> None:
    assert notest_blocks(), "no `python notest` block found: the pattern or the docs changed"


@pytest.mark.parametrize(("where", "block"), notest_blocks(), ids=lambda value: value[:40])
def test_a_block_not_run_is_a_verbatim_excerpt_of_an_example(where: str, block: str) -> None:
    assert any(block.rstrip() in example for example in EXAMPLES), (
        f"{where}: a `python notest` block must be copied from a file under examples/ "
        "(which the suite runs); make it runnable or copy it again"
    )
