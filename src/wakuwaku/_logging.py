"""A log formatter that shows the structured fields the engine logs.

The engine logs stable messages with their context (topic, partition, key,
type, offsets, error class) in ``extra`` fields (design §12); a plain
``logging.Formatter`` drops them. :class:`StructuredFormatter` appends them.
"""

from __future__ import annotations

import logging

FIELD_LIMIT = 500
"""The most characters of one field's value a line shows: a key may be 1 MiB
(a record's header holds anything), and a log line is read by a person."""

_STANDARD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}


class StructuredFormatter(logging.Formatter):
    """``<format> key=value ...``: the ``extra`` fields the engine logs
    (topic, partition, key, type, offsets, error class) appended to the
    formatted line, strings quoted.

    Use it like any formatter::

        handler = logging.StreamHandler()
        handler.setFormatter(StructuredFormatter("%(levelname)s %(name)s: %(message)s"))
        logging.basicConfig(level=logging.INFO, handlers=[handler])
    """

    def format(self, record: logging.LogRecord) -> str:
        record.message = record.getMessage()
        if self.usesTime():
            record.asctime = self.formatTime(record, self.datefmt)
        text = self.formatMessage(record)
        fields = [
            f"{name}={_shown(value)}"
            for name, value in record.__dict__.items()
            if name not in _STANDARD_ATTRS and not name.startswith("_")
        ]
        if fields:
            text = f"{text} {' '.join(fields)}"
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            text = f"{text}\n{record.exc_text}"
        if record.stack_info:
            text = f"{text}\n{self.formatStack(record.stack_info)}"
        return text


def _shown(value: object) -> str:
    """A field's value as shown: strings quoted, at most :data:`FIELD_LIMIT`
    characters, with the length of what was cut."""
    text = repr(value) if isinstance(value, str) else str(value)
    if len(text) <= FIELD_LIMIT:
        return text
    return f"{text[:FIELD_LIMIT]}...({len(text) - FIELD_LIMIT} more characters)"
