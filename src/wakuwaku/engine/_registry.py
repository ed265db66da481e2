"""The topic-names topic: where consumers note their configured retry and dead-letter topics.

Derived names are a function of (topic, group) (design §6), so any tool can
compute them. A configured name (``ConsumerConfig.retry_topics``,
``dead_letter_topics``) is not: a consumer that has one notes its names at
start in ``[ns.]wk-topic-names`` (:data:`TOPIC_NAMES_TOPIC`, one partition,
created on first use), and ``wakuwaku status``, ``dlq``, ``topic`` and the
dashboard read them from there (:func:`group_topics`,
:func:`registered_topics`).

One record per (main topic, group) whose names changed: headers ``wk-v`` and
``wk-marker: topic-names``, a JSON body ``{"topic", "group", "retry",
"dead_letter", "replay_ledger", "configured"}`` with the qualified names. The latest
record of a (topic, group) wins. A group that goes back to derived names
notes them too, so no tool keeps reading an old configured name.

At start, before any topic is created (:func:`check_and_note`):

- A name that another (topic, group) noted, and that exists in the log, may
  not take another role: a retry topic belongs to one (topic, group), a main
  topic is never another group's retry or dead-letter topic. A dead-letter
  topic (with its replay ledger) may be shared on purpose, one dead-letter
  topic for many groups: every dead letter carries ``wk-group`` and
  ``wk-src``, and each group lists, counts and replays only its own. A
  conflict is a :class:`~wakuwaku.ConfigError`; deleting the topic (after
  the other group stopped using it) frees the name. Two consumers starting
  at the same instant can both pass the check: records the engine writes
  carry ``wk-group``, and readers skip another group's records (design §6).
- A group whose retry or dead-letter topic for a main topic changed (from
  the derived name, or from another configured one) while the old topic
  still exists is warned about at start: pending retry work and dead
  letters in the old topic are no longer read there.

May call: the log, :mod:`._config`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import msgspec

from .._errors import ConfigError, UnknownTopicError
from .._records import H_MARKER, H_VERSION, WIRE_VERSION
from ..logs import Log
from ._config import TOPIC_NAMES_TOPIC, ConsumerConfig, GroupTopics

logger = logging.getLogger("wakuwaku.consumer")

MARKER_TOPIC_NAMES = b"topic-names"
_PAGE = 1000
# Roles (indexes in GroupTopics.roles()) two (topic, group)s may share: a main
# topic read by several groups, a dead-letter topic (and its ledger) shared on purpose.
_SHAREABLE = frozenset({(0, 0), (2, 2), (3, 3)})


class _Entry(msgspec.Struct, frozen=True):
    topic: str
    group: str
    retry: str
    dead_letter: str
    replay_ledger: str
    configured: bool = True


def _entry(names: GroupTopics) -> bytes:
    return msgspec.json.encode(
        _Entry(
            names.topic,
            names.group,
            names.retry,
            names.dead_letter,
            names.replay_ledger,
            names.configured,
        )
    )


def _names(entry: _Entry) -> GroupTopics:
    return GroupTopics(
        entry.topic,
        entry.group,
        entry.retry,
        entry.dead_letter,
        entry.replay_ledger,
        entry.configured,
    )


def topic_names_topic(namespace: str = "") -> str:
    """``[ns.]wk-topic-names``: the topic-names topic of a namespace."""
    return f"{namespace}.{TOPIC_NAMES_TOPIC}" if namespace else TOPIC_NAMES_TOPIC


async def _read(log: Log, topic: str) -> dict[tuple[str, str], GroupTopics]:
    try:
        await log.describe_topic(topic)
    except UnknownTopicError:
        return {}
    found: dict[tuple[str, str], GroupTopics] = {}
    offset = (await log.start_offsets(topic)).get(0, 0)
    while page := await log.read(topic, 0, offset, _PAGE):
        for record in page:
            try:
                entry = msgspec.json.decode(record.body, type=_Entry)
            except msgspec.DecodeError as exc:
                logger.warning(
                    "broken topic-names record ignored",
                    extra={
                        "topic": topic,
                        "partition": 0,
                        "offset": record.offset,
                        "error": str(exc),
                    },
                )
                continue
            found[(entry.topic, entry.group)] = _names(entry)
        offset = page[-1].offset + 1
    return found


async def read_topic_names(log: Log, namespace: str = "") -> dict[tuple[str, str], GroupTopics]:
    """The names noted in ``[ns.]wk-topic-names``, latest per (qualified main topic,
    group); empty when no consumer of the namespace noted any.

    :raises LogError: what the log raises.
    """
    return await _read(log, topic_names_topic(namespace))


async def registered_topics(log: Log) -> list[GroupTopics]:
    """The names noted in every namespace's topic-names topic (for tools that
    are given full topic names and no namespace, such as ``wakuwaku topic``).

    :raises LogError: what the log raises.
    """
    found: list[GroupTopics] = []
    for info in await log.list_topics():
        if info.name == TOPIC_NAMES_TOPIC or info.name.endswith("." + TOPIC_NAMES_TOPIC):
            found.extend((await _read(log, info.name)).values())
    return found


async def group_topics(log: Log, topic: str, group: str, *, namespace: str = "") -> GroupTopics:
    """The retry, dead-letter and replay-ledger topics ``group`` uses for main topic ``topic``.

    The names its consumer noted in the topic-names topic when it has
    configured ones, else the derived names (design §6).

    :param topic: the main topic, without the namespace.
    :param namespace: the consumer's namespace prefix, if it had one.
    :raises ConfigError: for a group name that cannot exist.
    :raises LogError: what the log raises.
    """
    config = ConsumerConfig(topic=topic, group=group, namespace=namespace)
    main = config.topics[0]
    noted = (await read_topic_names(log, namespace)).get((main, group))
    return noted if noted is not None else config.group_topics(main)


def topic_owner(name: str, noted: Iterable[GroupTopics]) -> tuple[str, GroupTopics] | None:
    """``(role word, names)`` when ``name`` is a retry, dead-letter or
    replay-ledger topic among ``noted`` ("retry", "dead-letter", "replay
    ledger"), else None."""
    words = {1: "retry", 2: "dead-letter", 3: "replay ledger"}
    for names in noted:
        for index, (other, _) in enumerate(names.roles()):
            if index and other == name:
                return words[index], names
    return None


async def check_and_note(log: Log, config: ConsumerConfig) -> None:
    """Check the consumer's names against the noted ones, then note them (see the module docstring).

    :raises ConfigError: when a name of the consumer is a topic another
        (topic, group) noted in a role it may not share, and that topic exists.
    :raises LogError: what the log raises.
    """
    registry = topic_names_topic(config.namespace)
    noted = await _read(log, registry)
    ours = [config.group_topics(topic) for topic in config.topics]
    if not noted and not any(names.configured for names in ours):
        return
    existing = {info.name for info in await log.list_topics()}
    for names in ours:
        _check_conflicts(names, noted, existing, registry)
    changed = []
    for names in ours:
        before = noted.get((names.topic, names.group))
        if before is None and names.configured:
            derived = ConsumerConfig(
                topic=config.topic, group=config.group, namespace=config.namespace
            ).group_topics(names.topic)
            _warn_changed(derived, names, existing)
        elif before is not None:
            _warn_changed(before, names, existing)
        if (before is None and names.configured) or (
            before is not None and _key(before) != _key(names)
        ):
            changed.append(names)
    if changed:
        await log.create_topic(registry, 1)
        headers = {H_VERSION: WIRE_VERSION, H_MARKER: MARKER_TOPIC_NAMES}
        await log.append(registry, 0, [(headers, _entry(names)) for names in changed])


def _key(names: GroupTopics) -> tuple[str, str, str]:
    return names.retry, names.dead_letter, names.replay_ledger


def _check_conflicts(
    names: GroupTopics,
    noted: dict[tuple[str, str], GroupTopics],
    existing: set[str],
    registry: str,
) -> None:
    for other in noted.values():
        if (other.topic, other.group) == (names.topic, names.group):
            continue
        for mine, (name, role) in enumerate(names.roles()):
            for theirs, (other_name, other_role) in enumerate(other.roles()):
                if name != other_name or name not in existing or (mine, theirs) in _SHAREABLE:
                    continue
                if theirs == 0:
                    # Another group's main topic holds its data: never advise deleting it.
                    other_role = f"{other_role} read by group {other.group!r}"
                    remedy = "configure another name"
                else:
                    remedy = (
                        "configure another name, or delete "
                        f"topic {name!r} once group {other.group!r} no longer uses it"
                    )
                raise ConfigError(
                    f"topic {name!r} cannot be the {role}: it is the {other_role} "
                    f"(noted in {registry!r}). The retry and "
                    "dead-letter topics of a group and main topic are its own (design "
                    f"§6): {remedy}"
                )


def _warn_changed(before: GroupTopics, now: GroupTopics, existing: set[str]) -> None:
    for what, old, new in (
        ("retry", before.retry, now.retry),
        ("dead-letter", before.dead_letter, now.dead_letter),
    ):
        if old != new and old in existing:
            logger.warning(
                "%s topic changed; the old one is no longer read",
                what,
                extra={
                    "topic": now.topic,
                    "group": now.group,
                    "old": old,
                    "new": new,
                    "hint": f"pending work or dead letters in {old!r} stay there "
                    "(drain the group before changing its names)",
                },
            )
