"""The derived topic-name rule: the one place it is spelled and parsed.

A consumer group's engine-made topics of a main topic are named
``[ns.]wk-retry.<group>.<topic>`` (retry work), ``[ns.]wk-dlq.<group>.<topic>``
(dead letters) and ``[ns.]wk-replayed.<group>.<topic>`` (the replay ledger of
``wakuwaku dlq replay``), design §6. The engine builds these names; a log
reads them back to give such a topic its main topic's room (Kafka's message
size) or hash slot (Redis). All of them call :func:`split_derived_topic`, so
the rule cannot drift between layers. Calls nothing of the package.
"""

from __future__ import annotations

__all__ = (
    "CONTROL_PREFIX",
    "DEAD_LETTER_PREFIX",
    "DERIVED_PREFIXES",
    "REPLAY_LEDGER_PREFIX",
    "RETRY_PREFIX",
    "TOPIC_NAMES",
    "kept_forever",
    "split_derived_topic",
)

RETRY_PREFIX = "wk-retry."
DEAD_LETTER_PREFIX = "wk-dlq."
REPLAY_LEDGER_PREFIX = "wk-replayed."
CONTROL_PREFIX = "wk-control."
"""A consumer group's control topic is ``[ns.]wk-control.<group>`` (operator
commands: :mod:`wakuwaku._control`)."""
TOPIC_NAMES = "wk-topic-names"
"""Where consumers note their configured topic names (``[ns.]wk-topic-names``)."""
DERIVED_PREFIXES: tuple[tuple[str, str], ...] = (
    ("retry", RETRY_PREFIX),
    ("dlq", DEAD_LETTER_PREFIX),
    ("replayed", REPLAY_LEDGER_PREFIX),
)
"""``(kind, prefix)`` of each derived name."""


def split_derived_topic(name: str) -> tuple[str, str, str, str] | None:
    """``(namespace, kind, group, topic)`` of a derived topic name, else None.

    ``kind`` is ``retry``, ``dlq`` or ``replayed``; ``namespace`` is what
    stands before the prefix (empty, or ending in ``.``): the prefix counts
    only at the start of ``name`` or right after a ``.``. ``group`` and
    ``topic`` must both be non-empty (``topic`` may hold dots and be derived
    itself: the leftmost prefix that makes a derived name counts).
    Configured names are not derived: the topic-names topic knows those.
    """
    found: tuple[str, str, str, str] | None = None
    first = len(name)
    for kind, prefix in DERIVED_PREFIXES:
        at = name.find(prefix)
        while at >= 0 and at < first:
            if at == 0 or name[at - 1] == ".":
                group, dot, topic = name[at + len(prefix) :].partition(".")
                if group and dot and topic:
                    found, first = (name[:at], kind, group, topic), at
                    break
            at = name.find(prefix, at + 1)
    return found


def kept_forever(name: str) -> bool:
    """True for the engine's state topics, whose records must outlive any
    time- or size-based retention of the log: a group's control topic (a
    pause must hold until resumed) and the topic-names topic. ``name`` may
    carry a namespace (``ns.wk-control.g``)."""
    if name == TOPIC_NAMES or name.endswith("." + TOPIC_NAMES):
        return True
    return name.startswith(CONTROL_PREFIX) or f".{CONTROL_PREFIX}" in name
