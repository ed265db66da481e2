"""Operator controls of a running consumer group: pause, resume, a quarantined key now (design §14).

Every control is a command record in the group's control topic
(:mod:`wakuwaku._control`), which every consumer of the group reads once
per poll interval, so a control reaches every process of the group, on
every log, and outlives their restarts:

- :func:`pause` / :func:`resume` a topic, one partition or one key. A paused
  topic or partition is neither polled nor retried; a paused key's records
  are held in the group's retry topic (in order, not counted as failures)
  while the partition's other keys go on. Work a batch had already started
  finishes; nothing new starts for the scope after the consumers read the
  command (within one poll interval once the batch in flight ends). A pause
  stays until resumed, across restarts.
- :func:`retry_key_now` skips a quarantined key's wait: its next attempt
  runs at once (it counts as an attempt, like any other).
- :func:`give_up_key` dead-letters a quarantined key's pending work with
  reason ``given_up_by_operator`` and the operator's name in
  ``wk-operator``; the key's later records go on as after any give-up.

The last two act on the key's work pending when asked (see
:mod:`wakuwaku._control`), applied by the consumer that owns the key's
partition: when none runs, the command waits in the control topic for the
next one.
"""

from __future__ import annotations

import getpass
import socket
from dataclasses import dataclass

from .._clock import SYSTEM_CLOCK, Clock
from .._control import (
    MAX_TEXT,
    Action,
    Command,
    Pause,
    Pauses,
    control_topic_name,
    decode_command,
    encode_command,
)
from .._errors import ConfigError, UnknownPartitionError, UnknownTopicError
from ..engine import ConsumerConfig, check_group_name, read_retry_partition
from ..logs import Log
from .dead_letters import resolve_group_topics

__all__ = (
    "ControlRecord",
    "KeyNotQuarantinedError",
    "give_up_key",
    "operator_name",
    "pause",
    "pauses",
    "read_commands",
    "resume",
    "retry_key_now",
)

_PAGE = 1000


class KeyNotQuarantinedError(ConfigError):
    """The key has no pending retry work in the group: nothing to retry or give up."""

    def __init__(self, group: str, topic: str, partition: int, key: str) -> None:
        super().__init__(
            f"key {key!r} of topic {topic!r} (partition {partition}) is not quarantined "
            f"in consumer group {group!r}: it has no pending retry work"
        )
        self.group, self.topic, self.partition, self.key = group, topic, partition, key


@dataclass(frozen=True, slots=True)
class ControlRecord:
    """One record of a control topic, read back: its offset and its command,
    or what is wrong with it (``problem``)."""

    offset: int
    command: Command | None
    problem: str | None = None


def operator_name() -> str:
    """Who is asking, by default: ``user@host``."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


async def _main_partitions(log: Log, topic: str) -> int:
    return (await log.describe_topic(topic)).partitions


async def _write(log: Log, group: str, command: Command, namespace: str) -> Command:
    for what, text in (("reason", command.reason), ("by", command.by)):
        if len(text) > MAX_TEXT:
            raise ConfigError(
                f"the {what} is {len(text):,} characters long; at most {MAX_TEXT} are kept "
                "(nothing written)"
            )
    name = control_topic_name(group, namespace)
    await log.create_topic(name, 1)
    headers, body = encode_command(command)
    await log.append(name, 0, [(headers, body)])
    return command


async def _scope(
    log: Log, group: str, topic: str, partition: int | None, key: str | None, namespace: str
) -> tuple[str, int | None]:
    """The qualified topic and the partition of a command's scope, checked."""
    check_group_name(group)
    if partition is not None and key is not None:
        raise ConfigError("pause or resume a partition or a key, not both")
    names = await resolve_group_topics(log, topic, group, namespace)
    main = names.topic
    partitions = await _main_partitions(log, main)
    if key is not None:
        if not isinstance(key, str) or not key:
            raise ConfigError(f"key {key!r}: a non-empty text")
        return main, log.partition_for(key, partitions)
    if partition is not None and not 0 <= partition < partitions:
        raise UnknownPartitionError(main, partition, partitions)
    return main, partition


async def _write_command(
    action: Action,
    log: Log,
    group: str,
    main: str,
    partition: int | None,
    key: str | None,
    by: str | None,
    reason: str,
    namespace: str,
    clock: Clock,
    *,
    through: int | None = None,
) -> Command:
    """Write one command for the checked scope (``main``, ``partition``, ``key``)."""
    command = Command(
        action=action,
        topic=main,
        partition=partition,
        key=key,
        by=by or operator_name(),
        at=clock.now(),
        reason=reason,
        through=through,
    )
    return await _write(log, group, command, namespace)


async def pause(
    log: Log,
    group: str,
    topic: str,
    *,
    partition: int | None = None,
    key: str | None = None,
    by: str | None = None,
    reason: str = "",
    namespace: str = "",
    clock: Clock = SYSTEM_CLOCK,
) -> Command:
    """Pause ``topic`` for ``group`` (all of it, one ``partition`` or one ``key``).

    :param by: who asks (default :func:`operator_name`).
    :param reason: why, shown by ``status``, the dashboard and the consumers' log.
    :returns: the command written.
    :raises UnknownTopicError: when ``topic`` does not exist.
    :raises UnknownPartitionError: for a partition outside the topic.
    :raises ConfigError: for a bad group name, a derived topic, an empty key,
        both a partition and a key, or a ``reason`` or ``by`` over 500
        characters.
    :raises LogError: what the log raises.
    """
    main, part = await _scope(log, group, topic, partition, key, namespace)
    return await _write_command(
        Action.PAUSE, log, group, main, part, key, by, reason, namespace, clock
    )


async def resume(
    log: Log,
    group: str,
    topic: str,
    *,
    partition: int | None = None,
    key: str | None = None,
    by: str | None = None,
    reason: str = "",
    namespace: str = "",
    clock: Clock = SYSTEM_CLOCK,
) -> Command:
    """End pauses of ``topic`` for ``group``: without ``partition`` and
    ``key`` every pause of the topic (its partitions' and keys' too); with
    one of them, that pause only. Resuming what is not paused writes the
    command all the same (it changes nothing).

    :returns: the command written.
    :raises: as :func:`pause`.
    """
    main, part = await _scope(log, group, topic, partition, key, namespace)
    return await _write_command(
        Action.RESUME, log, group, main, part, key, by, reason, namespace, clock
    )


async def read_commands(log: Log, group: str, namespace: str = "") -> list[ControlRecord]:
    """Every record of ``group``'s control topic, oldest first (empty when
    the topic does not exist yet).

    :raises LogError: what the log raises.
    """
    name = control_topic_name(group, namespace)
    out: list[ControlRecord] = []
    offset = 0
    try:
        starts = await log.start_offsets(name)
        offset = starts.get(0, 0)
        while page := await log.read(name, 0, offset, _PAGE):
            for record in page:
                found = decode_command(record)
                if isinstance(found, str):
                    out.append(ControlRecord(record.offset, None, found))
                else:
                    out.append(ControlRecord(record.offset, found))
            offset = page[-1].offset + 1
    except UnknownTopicError:
        return []
    return out


async def pauses(log: Log, group: str, namespace: str = "") -> list[Pause]:
    """The pauses in force for ``group``, oldest first.

    :raises LogError: what the log raises.
    """
    state = Pauses()
    for record in await read_commands(log, group, namespace):
        if record.command is not None:
            state.apply(record.command, record.offset)
    return state.all()


async def _key_command(
    action: Action,
    log: Log,
    group: str,
    topic: str,
    key: str,
    by: str | None,
    reason: str,
    namespace: str,
    clock: Clock,
) -> Command:
    main, partition = await _scope(log, group, topic, None, key, namespace)
    assert partition is not None
    names = await resolve_group_topics(log, topic, group, namespace)
    retry = names.retry
    try:
        config = ConsumerConfig(topic=topic, group=group, namespace=namespace)
        state = await read_retry_partition(log, group, retry, partition, config.delay)
    except UnknownTopicError:
        raise KeyNotQuarantinedError(group, main, partition, key) from None
    if not any(q.key == key and q.pending for q in state.quarantined):
        raise KeyNotQuarantinedError(group, main, partition, key)
    through = (await log.end_offsets(retry)).get(partition, 0)
    return await _write_command(
        action, log, group, main, partition, key, by, reason, namespace, clock, through=through
    )


async def retry_key_now(
    log: Log,
    group: str,
    topic: str,
    key: str,
    *,
    by: str | None = None,
    reason: str = "",
    namespace: str = "",
    clock: Clock = SYSTEM_CLOCK,
) -> Command:
    """Run quarantined ``key``'s next attempt now, skipping its wait.

    Applied by the consumer that owns the key's partition (at its next poll
    interval, or when one starts). The attempt counts like any other: when
    it fails, the key's next attempt follows the schedule, or it gives up.

    :returns: the command written.
    :raises KeyNotQuarantinedError: when the key has no pending retry work.
    :raises: as :func:`pause`.
    """
    return await _key_command(
        Action.RETRY_NOW, log, group, topic, key, by, reason, namespace, clock
    )


async def give_up_key(
    log: Log,
    group: str,
    topic: str,
    key: str,
    *,
    by: str | None = None,
    reason: str = "",
    namespace: str = "",
    clock: Clock = SYSTEM_CLOCK,
) -> Command:
    """Give quarantined ``key`` up now: its pending retry work is
    dead-lettered with reason ``given_up_by_operator`` (``wk-operator``
    names ``by``), and its later records are handled as after any give-up.

    :returns: the command written.
    :raises KeyNotQuarantinedError: when the key has no pending retry work.
    :raises: as :func:`pause`.
    """
    return await _key_command(Action.GIVE_UP, log, group, topic, key, by, reason, namespace, clock)
