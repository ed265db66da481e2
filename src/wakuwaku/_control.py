"""The control topic: what an operator asked a consumer group to do (design §6, §13).

Each consumer group has one control topic, ``[ns.]wk-control.<group>`` (one
partition, created on first use by the operator's tools or the group's
consumers). Every record is one *command*, written by :mod:`wakuwaku.admin`
(the CLI and the dashboard call it) and read by every consumer of the group,
so a command reaches every process of the group without a side channel, on
every log, and survives their restarts.

A command record has the headers ``wk-v`` and ``wk-marker: control`` and a
JSON body (:class:`Command`)::

    {"action": "pause", "topic": "shop", "partition": null, "key": "k1",
     "by": "ana@ops-1", "at": 1764700000.5, "reason": "bad deploy",
     "through": null}

Actions:

=============  ==============================================================
``pause``      stop starting work for a topic, one of its partitions or one
               key (``partition`` / ``key`` narrow the scope; a key's
               command also names its partition)
``resume``     end the pauses inside the scope: a topic's resume ends every
               pause of the topic (partitions and keys too); a partition's
               or a key's ends that one
``retry-now``  a quarantined key's next attempt runs now (skip the wait)
``give-up``    dead-letter a quarantined key's pending work, reason
               ``given_up_by_operator``, naming ``by`` in ``wk-operator``
=============  ==============================================================

Pauses are *state*: the latest commands win, so the whole topic read from
its start gives the pauses in force (:class:`Pauses`). ``retry-now`` and
``give-up`` are one-shot, bounded by ``through``: the end offset of the key's
retry partition when the operator asked. They apply to the key's pending work
below it only, so reading them again (every consumer reads the topic from its
start) does nothing twice: work given up is gone from the retry partition,
and an attempt made after the command writes its marker at or past
``through``.

Calls nothing of the package but its record helpers.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from ._records import H_MARKER, H_VERSION, WIRE_VERSION, Record
from ._topics import CONTROL_PREFIX

__all__ = (
    "CONTROL_PREFIX",
    "MARKER_CONTROL",
    "Action",
    "Command",
    "Pause",
    "Pauses",
    "control_topic_name",
    "decode_command",
    "encode_command",
)


MARKER_CONTROL = b"control"

MAX_TEXT = 500
"""The longest ``by`` and ``reason`` kept (characters); longer text is cut."""


class Action(enum.StrEnum):
    """What a command asks for."""

    PAUSE = "pause"
    RESUME = "resume"
    RETRY_NOW = "retry-now"
    GIVE_UP = "give-up"


class Command(msgspec.Struct, frozen=True, kw_only=True):
    """One operator command (the body of a control record).

    :param action: what to do.
    :param topic: the (qualified) main topic.
    :param partition: the partition, for a partition's command and for every
        key's command (the key's partition); None: the whole topic.
    :param key: the key (``pause``, ``resume``, ``retry-now``, ``give-up``
        of one key); None otherwise.
    :param by: who asked (free text: ``user@host`` by default).
    :param at: when, seconds since the epoch.
    :param reason: why (free text, may be empty).
    :param through: ``retry-now`` and ``give-up`` only: the end offset of the
        key's retry partition when asked; only pending work below it is
        touched.
    """

    action: Action
    topic: str
    partition: int | None = None
    key: str | None = None
    by: str = ""
    at: float = 0.0
    reason: str = ""
    through: int | None = None

    @property
    def one_shot(self) -> bool:
        """True for ``retry-now`` and ``give-up`` (the others are state)."""
        return self.action in (Action.RETRY_NOW, Action.GIVE_UP)

    def scope(self) -> str:
        """The scope in words (:func:`scope_text`)."""
        return scope_text(self.topic, self.partition, self.key)


def scope_text(
    topic: str,
    partition: int | None,
    key: str | None,
    *,
    show_topic: Callable[[str], str] = str,
    show_key: Callable[[str], str] = repr,
) -> str:
    """A pause's or a command's scope in words: ``topic shop``, ``partition 3
    of shop``, ``key 'k1' of shop (partition 1)``. ``show_topic`` and
    ``show_key`` render the names (the CLI passes its terminal-safe ones)."""
    if key is not None:
        return f"key {show_key(key)} of {show_topic(topic)} (partition {partition})"
    if partition is not None:
        return f"partition {partition} of {show_topic(topic)}"
    return f"topic {show_topic(topic)}"


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(Command)


def control_topic_name(group: str, namespace: str = "") -> str:
    """The control topic of ``group``: ``[<namespace>.]wk-control.<group>``."""
    return f"{namespace}.{CONTROL_PREFIX}{group}" if namespace else f"{CONTROL_PREFIX}{group}"


def check_command(command: Command) -> str | None:
    """What is wrong with ``command``, in words, or None when it is usable."""
    if not command.topic:
        return "no topic"
    if command.partition is not None and command.partition < 0:
        return f"partition {command.partition} is below 0"
    if command.key is not None and command.partition is None:
        return "a key's command names no partition"
    if command.one_shot and (command.key is None or command.through is None):
        return f"{command.action} needs a key and a through offset"
    if not math.isfinite(command.at):
        return "its time is not a finite number"
    return None


def encode_command(command: Command) -> tuple[dict[str, bytes], bytes]:
    """The control record of ``command``: ``(headers, body)``.

    :raises ValueError: when :func:`check_command` finds it unusable.
    """
    problem = check_command(command)
    if problem is not None:
        raise ValueError(f"control command {command!r}: {problem}")
    command = msgspec.structs.replace(
        command, by=command.by[:MAX_TEXT], reason=command.reason[:MAX_TEXT]
    )
    return {H_VERSION: WIRE_VERSION, H_MARKER: MARKER_CONTROL}, _ENCODER.encode(command)


def decode_command(record: Record) -> Command | str:
    """The command a control record holds, or what is wrong with it (a
    record of a newer release, or not written by the tools, is skipped by
    its readers, who log the text)."""
    if record.headers.get(H_MARKER) != MARKER_CONTROL:
        return "not a control record (no wk-marker: control)"
    try:
        command = _DECODER.decode(record.body)
    except (msgspec.DecodeError, ValueError) as exc:
        return f"unreadable command: {exc}"
    return check_command(command) or command


@dataclass(frozen=True, slots=True)
class Pause:
    """One pause in force.

    :param topic: / :param partition: / :param key: its scope (see :class:`Command`).
    :param by: / :param at: / :param reason: who asked, when (seconds since
        the epoch) and why.
    :param offset: the control record's offset.
    """

    topic: str
    partition: int | None
    key: str | None
    by: str
    at: float
    reason: str
    offset: int

    def scope(self) -> str:
        """The scope in words (:func:`scope_text`)."""
        return scope_text(self.topic, self.partition, self.key)


class Pauses:
    """The pauses in force, folded from a group's control records in order.

    ``version`` grows with every change, so a reader can tell cheaply that
    something changed since it last looked.
    """

    __slots__ = ("_keys", "_partitions", "_topics", "version")

    def __init__(self) -> None:
        self._topics: dict[str, Pause] = {}
        self._partitions: dict[tuple[str, int], Pause] = {}
        self._keys: dict[tuple[str, str], Pause] = {}
        self.version = 0

    def apply(self, command: Command, offset: int) -> bool:
        """Fold in one command (one-shot commands change nothing here);
        True when the pauses changed."""
        topic, partition, key = command.topic, command.partition, command.key
        if command.action is Action.PAUSE:
            pause = Pause(topic, partition, key, command.by, command.at, command.reason, offset)
            if key is not None:
                self._keys[(topic, key)] = pause
            elif partition is not None:
                self._partitions[(topic, partition)] = pause
            else:
                self._topics[topic] = pause
        elif command.action is Action.RESUME:
            before = len(self._topics) + len(self._partitions) + len(self._keys)
            if key is not None:
                self._keys.pop((topic, key), None)
            elif partition is not None:
                self._partitions.pop((topic, partition), None)
            else:
                self._topics.pop(topic, None)
                self._partitions = {k: v for k, v in self._partitions.items() if k[0] != topic}
                self._keys = {k: v for k, v in self._keys.items() if k[0] != topic}
            if before == len(self._topics) + len(self._partitions) + len(self._keys):
                return False
        else:
            return False
        self.version += 1
        return True

    def partition_pause(self, topic: str, partition: int) -> Pause | None:
        """The pause that stops all of ``topic``'s ``partition`` (its topic's
        or its own), or None."""
        return self._topics.get(topic) or self._partitions.get((topic, partition))

    def key_pause(self, topic: str, key: str) -> Pause | None:
        """The pause of one ``key`` of ``topic``, or None."""
        return self._keys.get((topic, key)) if self._keys else None

    def paused_keys(self, topic: str, partition: int) -> dict[str, Pause]:
        """The paused keys of one partition, by key."""
        return {
            key: pause
            for (t, key), pause in self._keys.items()
            if t == topic and pause.partition == partition
        }

    def all(self) -> list[Pause]:
        """Every pause in force, oldest command first."""
        found = [*self._topics.values(), *self._partitions.values(), *self._keys.values()]
        return sorted(found, key=lambda p: p.offset)

    def __len__(self) -> int:
        return len(self._topics) + len(self._partitions) + len(self._keys)
