"""StructuredFormatter: the engine's extra fields appear in plain log lines."""

from __future__ import annotations

import logging
from pathlib import Path

import wakuwaku

DOCS = (Path(__file__).parents[1] / "docs" / "operations.md").read_text()


def test_the_formatter_appends_the_extra_fields_after_the_message() -> None:
    formatter = wakuwaku.StructuredFormatter("%(levelname)s %(name)s: %(message)s")
    record = logging.LogRecord(
        "wakuwaku.consumer",
        logging.WARNING,
        __file__,
        1,
        "key quarantined after retryable failure",
        None,
        None,
    )
    record.__dict__.update({"topic": "t", "partition": 0, "key": "a", "offsets": [3, 4]})
    assert formatter.format(record) == (
        "WARNING wakuwaku.consumer: key quarantined after retryable failure "
        "topic='t' partition=0 key='a' offsets=[3, 4]"
    )


def test_the_operations_doc_shows_the_formatter_with_basic_config() -> None:
    snippets = [part.split("```", 1)[0] for part in DOCS.split("```python\n")[1:]]
    (snippet,) = [s for s in snippets if "StructuredFormatter" in s]
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    root.handlers.clear()  # basicConfig does nothing when the root has handlers
    try:
        exec(snippet, {"logging": logging, "wakuwaku": wakuwaku})  # the doc's own code
        (handler,) = root.handlers
        assert isinstance(handler.formatter, wakuwaku.StructuredFormatter)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def test_a_huge_field_is_cut_with_its_length() -> None:
    import logging

    from wakuwaku import StructuredFormatter

    record = logging.LogRecord(
        "wakuwaku.consumer", logging.ERROR, __file__, 1, "record dead-lettered", None, None
    )
    record.key = "k" * 1_048_576
    line = StructuredFormatter("%(message)s").format(record)
    assert len(line) < 700
    assert line.endswith("more characters)") and "1048078 more characters" in line
