"""``wakuwaku topic create|describe|list|delete``, ``group delete``, ``tail``.

design §14.

Every command takes ``--log URL`` (env ``WAKUWAKU_LOG``, default
``sqlite:///wakuwaku.db``). Only ``topic create`` may create a new SQLite
file; the others refuse a path that does not exist, so a typo is reported
instead of showing an empty log.

``tail`` prints one JSON object per record (``produce``, which writes them,
is in :mod:`._produce`).
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import click
import msgspec

from .._errors import ConfigError, LogUnavailableError, UnknownTopicError
from .._events import Algebra
from .._records import Record
from .._text import counted
from .._topics import CONTROL_PREFIX
from ..engine import (
    TOPIC_NAMES_TOPIC,
    GroupTopics,
    check_group_name,
    registered_topics,
    replay_ledger_topic_name,
    split_internal_topic,
    topic_owner,
)
from ..logs import Log
from ._exit import ExitCode
from ._status import LOG_ENV, log_option, with_log

__all__ = ("LOG_ENV", "log_option", "record_json", "register", "run_on_log")

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

_PRODUCE_BATCH = 500
_TAIL_DEFAULT = 10
_FOLLOW_POLL = 0.2
_FOLLOW_RETRY = 1.0
"""Seconds between reads while ``tail --follow`` finds the log unavailable."""
_ALGEBRAS = click.Choice([a.value for a in Algebra])


run_on_log = with_log
"""Open the log, run ``work(log)``, close it (:func:`~wakuwaku.cli._status.with_log`)."""


# -- topic ---------------------------------------------------------------------


@click.group("topic")
def topic_group() -> None:
    """Create, describe and list topics."""


def refuse_engine_topic(name: str, why: str, instead: str) -> None:
    """Refuse a group's derived retry, dead-letter or replay-ledger topic and
    the topic-names topic: only the consumer writes and creates them.

    :raises ConfigError: naming the topic, its group and main topic.
    """
    internal = split_internal_topic(name)
    if internal is not None:
        kind, group, main = internal
        raise ConfigError(
            f"{name!r} is the {kind} topic of group {group!r} for topic {main!r}: {why}; {instead}"
        )
    if name == TOPIC_NAMES_TOPIC or name.endswith("." + TOPIC_NAMES_TOPIC):
        raise ConfigError(f"{name!r} is where consumers note their configured topic names: {why}")
    if name.startswith(CONTROL_PREFIX) or f".{CONTROL_PREFIX}" in name:
        raise ConfigError(f"{name!r} is a consumer group's control topic: {why}")


async def refuse_configured_topic(log: Log, name: str, why: str, instead: str) -> None:
    """:func:`refuse_engine_topic` for a configured name a consumer noted."""
    owner = topic_owner(name, await registered_topics(log))
    if owner is not None:
        word, names = owner
        raise ConfigError(
            f"{name!r} is the {word} topic of group {names.group!r} for topic "
            f"{names.topic!r} (configured): {why}; {instead}"
        )


@topic_group.command("create")
@click.argument("name")
@click.option(
    "--partitions",
    "-p",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Partition count (fixed once created).",
)
@log_option
def create_command(name: str, partitions: int, log_url: str) -> None:
    """Create topic NAME; nothing happens when it exists with the same count.

    A different count fails with PartitionCountMismatch (exit 3). A group's
    retry, dead-letter or replay-ledger topic (``wk-retry.G.T``..., or a
    configured name a consumer noted) and the topic-names topic are refused
    (exit 3): the consumer creates those itself, with the main topic's count.
    """
    refuse_engine_topic(name, "the consumer creates it", "create the main topic instead")

    async def work(log: Log) -> bool:
        await refuse_configured_topic(
            log, name, "the consumer creates it", "create the main topic instead"
        )
        existed = name in {t.name for t in await log.list_topics()}
        await log.create_topic(name, partitions)
        return existed

    existed = run_on_log(log_url, work, create=True)
    verb = "exists" if existed else "created"
    click.echo(f"topic {name} {verb} with {counted(partitions, 'partition')}")


async def _delete(log: Log, name: str) -> tuple[bool, list[GroupTopics]]:
    """Delete ``name``; also the names noted for it (before the deletion)."""
    noted = await registered_topics(log)
    return await log.delete_topic(name), noted


def _ledger_of(name: str, noted: list[GroupTopics]) -> str | None:
    """The replay ledger that goes with dead-letter topic ``name``, None when
    ``name`` is no dead-letter topic."""
    internal = split_internal_topic(name)
    if internal is not None:
        return replay_ledger_topic_name(internal[2], internal[1]) if internal[0] == "dlq" else None
    owner = topic_owner(name, noted)
    if owner is not None and owner[0] == "dead-letter":
        return owner[1].replay_ledger
    return None


def _kept(name: str, noted: list[GroupTopics]) -> str:
    """What deleting main topic ``name`` keeps: its groups' topics."""
    configured = sorted(
        {t for names in noted if names.topic == name for t in (names.retry, names.dead_letter)}
    )
    text = "its groups' wk-retry.*, wk-dlq.* and wk-replayed.* topics"
    if configured:
        text += " and configured " + ", ".join(configured)
    return f"{text} are kept: delete them by name when they are no longer needed"


@topic_group.command("delete")
@click.argument("name")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@log_option
def delete_command(name: str, yes: bool, log_url: str) -> int:
    """Delete topic NAME: its records and every group's offsets and leases on it.

    Stop the topic's consumers first. A dead-letter topic goes with its replay
    ledger. A main topic's retry and dead-letter topics are kept (configured
    names are found where the consumers noted them, and named). Exit 3 when
    there is no such topic (checked before asking), as every command says.
    """
    run_on_log(log_url, lambda log: log.describe_topic(name))  # UnknownTopicError: exit 3
    if not yes and not _confirmed(f"delete topic {name} with its records and offsets?"):
        return ExitCode.FAILURE
    deleted, noted = run_on_log(log_url, lambda log: _delete(log, name))
    if not deleted:  # deleted by someone else since the check
        raise UnknownTopicError(name)
    ledger = _ledger_of(name, noted)
    if ledger is not None:
        # The ledger of replayed dead letters goes with them: kept, it would
        # mark the next dead letters at the same offsets as replayed already.
        if run_on_log(log_url, lambda log: log.delete_topic(ledger)):
            click.echo(f"topic {name} deleted, with its replay ledger {ledger}")
        else:
            click.echo(f"topic {name} deleted")
    elif split_internal_topic(name) is not None or topic_owner(name, noted) is not None:
        click.echo(f"topic {name} deleted")  # itself a group's retry topic or replay ledger
    else:
        click.echo(f"topic {name} deleted ({_kept(name, noted)})")
    return ExitCode.OK


def _confirmed(question: str) -> bool:
    """Ask ``question``; a "no", or no answer (end of input), is False and
    says that nothing was deleted."""
    try:
        if click.confirm(question, default=False):
            return True
    except click.exceptions.Abort:
        click.echo("", err=True)
    click.echo("not confirmed: nothing deleted", err=True)
    return False


@click.group("group")
def group_group() -> None:
    """Clean up consumer groups."""


@group_group.command("delete")
@click.argument("group")
@click.option("--topic", default=None, help="Only the group's offsets on this topic.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@log_option
def group_delete_command(group: str, topic: str | None, yes: bool, log_url: str) -> int:
    """Delete GROUP's committed offsets and partition leases (on every topic, or --topic).

    Stop the group's consumers first: a restarted member starts from the
    topic's start. The group's retry and dead-letter topics (derived or
    configured) are kept. An
    unknown --topic or a name that is no group name fails (exit 3); a group
    with no committed offset there fails (exit 1).
    """
    check_group_name(group)
    where = f" on topic {topic}" if topic is not None else ""
    if not yes and not _confirmed(f"delete the offsets and leases of group {group}{where}?"):
        return ExitCode.FAILURE
    removed = run_on_log(log_url, lambda log: log.delete_group(group, topic))
    if not removed:
        click.echo(
            f"group {group} has no committed offset{where} (a mistyped name?): nothing deleted",
            err=True,
        )
        return ExitCode.FAILURE
    click.echo(
        f"group {group}: {counted(removed, 'committed offset')} "
        f"deleted{where} (its wk-retry.{group}.* and wk-dlq.{group}.* topics, and "
        "configured ones, are kept)"
    )
    return ExitCode.OK


@dataclass(frozen=True)
class _Description:
    partitions: int
    start: dict[int, int]
    end: dict[int, int]
    groups: dict[str, dict[int, int]] | None


async def _describe(log: Log, name: str) -> _Description:
    info = await log.describe_topic(name)
    start, end = await log.start_offsets(name), await log.end_offsets(name)
    groups = await log.group_offsets(name)
    return _Description(info.partitions, start, end, groups)


@topic_group.command("describe")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@log_option
def describe_command(name: str, as_json: bool, log_url: str) -> None:
    """Partitions of topic NAME with their start/end offsets, and committed groups.

    Per group: its lag (records not consumed yet, all partitions) and its
    committed offsets (the next offset it reads, per partition).
    """
    found = run_on_log(log_url, lambda log: _describe(log, name))
    if as_json:
        click.echo(
            json.dumps(
                {
                    "topic": name,
                    "partitions": found.partitions,
                    "offsets": [
                        {"partition": p, "start": found.start[p], "end": found.end[p]}
                        for p in range(found.partitions)
                    ],
                    "groups": {
                        g: {str(p): o for p, o in parts.items()}
                        for g, parts in (found.groups or {}).items()
                    },
                },
                ensure_ascii=False,
            )
        )
        return
    click.echo(f"topic {name}: {counted(found.partitions, 'partition')}")
    click.echo(f"{'partition':>9}  {'start':>12}  {'end':>12}  {'records':>12}")
    for p in range(found.partitions):
        click.echo(
            f"{p:>9}  {found.start[p]:>12}  {found.end[p]:>12}  {found.end[p] - found.start[p]:>12}"
        )
    if found.groups is None:
        return
    if not found.groups:
        click.echo("no consumer group has committed on this topic")
    for group, parts in found.groups.items():
        # A partition the group never committed on counts whole as lag.
        lag = sum(found.end[p] - parts.get(p, found.start[p]) for p in range(found.partitions))
        where = ", ".join(f"p{p}={o}" for p, o in sorted(parts.items()))
        click.echo(
            f"group {group}: lag {counted(max(0, lag), 'record')}; committed offsets {where}"
        )


@topic_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per topic.")
@log_option
def list_command(as_json: bool, log_url: str) -> None:
    """Every topic with its partition count, sorted by name."""
    topics = run_on_log(log_url, lambda log: log.list_topics())
    for info in topics:
        if as_json:
            click.echo(
                json.dumps({"topic": info.name, "partitions": info.partitions}, ensure_ascii=False)
            )
        else:
            click.echo(f"{info.name}\t{info.partitions}")


# -- tail ----------------------------------------------------------------------


def _header_value(raw: bytes) -> str | dict[str, str]:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(raw).decode("ascii")}


def record_json(topic: str, partition: int, record: Record) -> str:
    """One record as a JSON line: headers as text (``{"base64": ...}`` when not
    UTF-8); exactly one of ``body`` (the body parsed as JSON), ``body_text``
    (UTF-8 that is not JSON) or ``body_base64``."""
    out: dict[str, Any] = {
        "topic": topic,
        "partition": partition,
        "offset": record.offset,
        "timestamp": record.timestamp,
        "headers": {name: _header_value(value) for name, value in record.headers.items()},
    }
    try:
        out["body"] = msgspec.json.decode(record.body)
    except msgspec.DecodeError:
        try:
            out["body_text"] = record.body.decode("utf-8")
        except UnicodeDecodeError:
            out["body_base64"] = base64.b64encode(record.body).decode("ascii")
    return json.dumps(out, ensure_ascii=False)


class _Outage:
    """``tail --follow`` riding out an unreachable log, as a consumer does:
    said once when reads begin to fail, every partition read again every
    :data:`_FOLLOW_RETRY` seconds (the ones that answer keep printing), and
    said when a round reads every partition again."""

    def __init__(self) -> None:
        self.since: float | None = None  # when reads began to fail

    async def after_round(self, failed: LogUnavailableError | None, done: bool) -> bool:
        """After reading every chosen partition once: True when a read failed
        (said, and waited for), so the caller reads again; a round that
        reached ``--max`` (``done``) ends the command instead."""
        if failed is not None and not done:
            if self.since is None:
                self.since = time.monotonic()
                click.echo(
                    f"warning: {failed}; reading again every {_FOLLOW_RETRY:g} s (Ctrl-C stops)",
                    err=True,
                )
            await asyncio.sleep(_FOLLOW_RETRY)
            return True
        if failed is None and self.since is not None:
            click.echo(
                f"the log answers again after {time.monotonic() - self.since:.1f} s; "
                f"going on from the next record of each partition",
                err=True,
            )
            self.since = None
        return False


async def _start_positions(
    log: Log, topic: str, partition: int | None, start: str | int
) -> dict[int, int]:
    """The offset ``tail`` starts at in each chosen partition (all, or ``partition``).

    :raises ConfigError: when ``partition`` is not one of the topic's.
    """
    info = await log.describe_topic(topic)
    if partition is not None and not 0 <= partition < info.partitions:
        raise ConfigError(
            f"topic {topic!r} has {counted(info.partitions, 'partition')}; "
            f"--partition {partition} does not exist"
        )
    chosen = [partition] if partition is not None else list(range(info.partitions))
    firsts, ends = await log.start_offsets(topic), await log.end_offsets(topic)
    position: dict[int, int] = {}
    for p in chosen:
        if start == "beginning":
            position[p] = firsts[p]
        elif start == "end":
            position[p] = max(firsts[p], ends[p] - _TAIL_DEFAULT)
        else:
            assert isinstance(start, int)
            position[p] = start
    return position


async def _tail(
    log: Log, topic: str, partition: int | None, start: str | int, follow: bool, limit: int | None
) -> None:
    position = await _start_positions(log, topic, partition, start)
    chosen = list(position)
    printed = 0
    outage = _Outage()
    while True:
        got_any = False
        failed: LogUnavailableError | None = None
        for p in chosen:
            want = 500 if limit is None else min(500, limit - printed)
            try:
                records = await log.read(topic, p, position[p], max_records=want)
            except LogUnavailableError as exc:
                if not follow:
                    raise
                failed = failed or exc  # the other partitions are still read
                continue
            for record in records:
                click.echo(record_json(topic, p, record))
            if records:
                got_any = True
                printed += len(records)
                position[p] = records[-1].offset + 1
            if limit is not None and printed >= limit:
                break
        done = limit is not None and printed >= limit
        if await outage.after_round(failed, done):
            continue  # a read failed: every partition is read again
        if done:
            return
        if not got_any:
            if not follow:
                return
            await asyncio.sleep(_FOLLOW_POLL)


@click.command("tail")
@click.argument("topic")
@click.option(
    "--partition",
    "-p",
    type=click.IntRange(min=0),
    default=None,
    help="Only this partition (default: all).",
)
@click.option("--from-beginning", is_flag=True, help="Start at the oldest stored record.")
@click.option(
    "--offset",
    type=click.IntRange(min=0, max=2**63 - 1),
    default=None,
    help="Start at this offset in each chosen partition.",
)
@click.option(
    "--follow",
    "-f",
    is_flag=True,
    help="Keep printing new records until Ctrl-C (an unreachable log is read again every second).",
)
@click.option(
    "--max", "limit", type=click.IntRange(min=1), default=None, help="Stop after this many records."
)
@log_option
def tail_command(
    topic: str,
    partition: int | None,
    from_beginning: bool,
    offset: int | None,
    follow: bool,
    limit: int | None,
    log_url: str,
) -> None:
    """Print records of TOPIC as JSON lines (default: the last 10 of each partition).

    Each line has topic, partition, offset, timestamp (seconds since the
    epoch), headers (UTF-8 text, or {"base64": ...}) and the body as "body"
    (parsed JSON), "body_text" or "body_base64".
    """
    if from_beginning and offset is not None:
        raise click.UsageError("--from-beginning and --offset exclude each other")
    start: str | int = "beginning" if from_beginning else offset if offset is not None else "end"
    run_on_log(log_url, lambda log: _tail(log, topic, partition, start, follow, limit))


def register(group: click.Group) -> None:
    """Add ``topic``, ``group`` and ``tail`` to the ``wakuwaku`` group."""
    group.add_command(topic_group)
    group.add_command(group_group)
    group.add_command(tail_command)
