"""A log formatter that shows the structured fields the engine logs.

The engine logs stable messages with their context (topic, partition, key,
type, offsets, error class) in ``extra`` fields (SPEC 12); a plain
``logging.Formatter`` drops them. :class:`StructuredFormatter` appends them.
"""

from __future__ import annotations

import logging

_STANDARD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message", "asctime", "taskName"}


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
        fields = [f"{name}={value!r}" if isinstance(value, str) else f"{name}={value}"
                  for name, value in record.__dict__.items()
                  if name not in _STANDARD_ATTRS and not name.startswith("_")]
        if fields:
            text = f"{text} {' '.join(fields)}"
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            text = f"{text}\n{record.exc_text}"
        if record.stack_info:
            text = f"{text}\n{self.formatStack(record.stack_info)}"
        return text
