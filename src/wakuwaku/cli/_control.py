"""``wakuwaku pause``, ``resume``, ``pauses`` and ``key retry-now|give-up``:
an operator steering a running consumer group (design §14).

Built on :mod:`wakuwaku.admin.control`: each command writes one command
record to the group's control topic ``[ns.]wk-control.<group>``, which
every consumer of the group reads once per poll interval; nothing here
talks to a consumer, so a command reaches every process of the group, on
every log, and waits there for one when none runs.

They are commands of their own, not of the ``group`` family: ``group
delete`` and ``group reset-offsets`` change a group's stored state and want
its consumers stopped, these steer consumers while they run. The names are
the ones the rest of the package uses (``wakuwaku key give-up`` is named
by the ``given_up_by_operator`` reason code).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, TypeVar

import click

from .._control import Command, Pause, control_topic_name
from .._errors import UnknownTopicError
from .._text import counted
from ..admin import (
    KeyNotQuarantinedError,
    give_up_key,
    pause,
    pauses,
    resolve_group_topics,
    resume,
    retry_key_now,
)
from ..logs import Log
from ._exit import ExitCode
from ._status import log_option, namespace_option, pause_line, printable, scope_text, with_log

F = TypeVar("F", bound=Callable[..., Any])


def _group_topic(fn: F) -> F:
    """``--group`` and ``--topic``."""
    fn = click.option("--topic", required=True, help="The topic (a main topic).")(fn)
    return click.option("--group", "-g", required=True, help="The consumer group.")(fn)


def _by_and_log(fn: F) -> F:
    """``--by``, ``--namespace`` and ``--log``."""
    fn = log_option(fn)
    fn = namespace_option(fn)
    return click.option(
        "--by", default=None, metavar="NAME", help="Who asks (default: user@host)."
    )(fn)


def _scope_options(fn: F) -> F:
    """``--partition P`` or ``--key K`` (at most one)."""
    fn = click.option(
        "--key", default=None, help="Only this key (the partition it is routed to is found)."
    )(fn)
    return click.option(
        "--partition", type=int, default=None, help="Only this partition of the topic."
    )(fn)


def _check_scope(partition: int | None, key: str | None) -> None:
    """Refuse both --partition and --key, and an empty key, before the log is opened."""
    if partition is not None and key is not None:
        raise click.UsageError(
            "give --partition or --key, not both (a key's partition is found from the key)"
        )
    if key is not None and not key:
        raise click.BadParameter("the key is empty: give the events' key", param_hint="--key")


def _written(command: Command, group: str) -> str:
    by = printable(command.by, 100)
    reason = f", reason: {printable(command.reason, 200)}" if command.reason else ""
    return (
        f"{command.action} {scope_text(command.topic, command.partition, command.key)} "
        f"for group {printable(group)!r} (by {by}{reason})"
    )


async def _started(log: Log, group: str, topic: str, namespace: str) -> bool:
    """A consumer of ``group`` has started on ``topic``: it creates the
    group's retry topic when it starts."""
    names = await resolve_group_topics(log, topic, group, namespace)
    try:
        await log.describe_topic(names.retry)
    except UnknownTopicError:
        return False
    return True


# -- pause, resume, pauses -------------------------------------------------------


@click.command("pause")
@_group_topic
@_scope_options
@click.option(
    "--reason", default="", help="Why (shown by `pauses`, `status`, the dashboard, the log)."
)
@_by_and_log
def pause_command(
    group: str,
    topic: str,
    partition: int | None,
    key: str | None,
    reason: str,
    by: str | None,
    namespace: str,
    log_url: str,
) -> int:
    """Pause TOPIC for GROUP (all of it, one --partition or one --key) until `resume`.

    Every consumer of the group, in every process, stops starting work for
    it within one poll interval; work already started finishes. A paused
    topic or partition is neither read nor retried; a paused key's records
    are held in the group's retry topic, in order and not counted as
    failures, while the partition's other keys go on. The pause stays,
    across restarts, until `wakuwaku resume`. Exit status 3 for an unknown
    topic or partition, 2 for both --partition and --key or an empty key;
    nothing is written then.
    """
    _check_scope(partition, key)

    async def work(log: Log) -> tuple[Command, bool]:
        command = await pause(
            log,
            group,
            topic,
            partition=partition,
            key=key,
            by=by,
            reason=reason,
            namespace=namespace,
        )
        return command, await _started(log, group, topic, namespace)

    command, started = with_log(log_url, work)
    click.echo(f"wrote: {_written(command, group)}")
    click.echo(
        "the group's consumers apply it within one poll interval: nothing new starts there "
        "(work in flight finishes) until `wakuwaku resume`"
    )
    if not started:
        click.echo(
            f"note: no consumer of group {printable(group)!r} has started on topic "
            f"{printable(command.topic)!r} yet (a mistyped group?): the pause applies "
            "when one starts",
            err=True,
        )
    return ExitCode.OK


@click.command("resume")
@_group_topic
@_scope_options
@click.option("--reason", default="", help="Why (kept with the command).")
@_by_and_log
def resume_command(
    group: str,
    topic: str,
    partition: int | None,
    key: str | None,
    reason: str,
    by: str | None,
    namespace: str,
    log_url: str,
) -> int:
    """End pauses of TOPIC for GROUP: without --partition and --key, every one.

    A topic's resume ends every pause of the topic: the topic's own, its
    partitions' and its keys'. With --partition or --key it ends that one
    only (a key paused with its topic stays paused until the topic
    resumes). The consumers go on from where they stopped within one poll
    interval. Resuming what is not paused writes the command all the same
    and says so. Exit statuses as `pause`.
    """
    _check_scope(partition, key)

    async def work(log: Log) -> tuple[Command, list[Pause], list[Pause]]:
        before = await pauses(log, group, namespace)
        command = await resume(
            log,
            group,
            topic,
            partition=partition,
            key=key,
            by=by,
            reason=reason,
            namespace=namespace,
        )
        after = await pauses(log, group, namespace)
        left = {p.offset for p in after}
        ended = [p for p in before if p.offset not in left]
        return command, ended, [p for p in after if p.topic == command.topic]

    command, ended, still = with_log(log_url, work)
    click.echo(f"wrote: {_written(command, group)}")
    if ended:
        click.echo(
            f"it ends {counted(len(ended), 'pause')} (the group's consumers go on from where "
            "they stopped within one poll interval):"
        )
        click.echo("\n".join(f"  {pause_line(p)}" for p in ended))
    else:
        click.echo("nothing was paused there: the command changes nothing")
    if still:
        click.echo(f"still in force on {printable(command.topic)}:")
        click.echo("\n".join(f"  {pause_line(p)}" for p in still))
    return ExitCode.OK


@click.command("pauses")
@click.option("--group", "-g", required=True, help="The consumer group.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@namespace_option
@log_option
def pauses_command(group: str, as_json: bool, namespace: str, log_url: str) -> int:
    """List the pauses in force for GROUP, oldest first: scope, who, since when (UTC), why.

    Read from the group's control topic ([NS.]wk-control.GROUP), folded as
    the consumers fold it. --json prints one object (times in seconds since
    the epoch; `offset` is the pause's command in the control topic).
    """
    found = with_log(log_url, lambda log: pauses(log, group, namespace))
    name = control_topic_name(group, namespace)
    if as_json:
        body = {"group": group, "control_topic": name, "pauses": [asdict(p) for p in found]}
        click.echo(json.dumps(body, ensure_ascii=False, sort_keys=True))
        return ExitCode.OK
    if not found:
        click.echo(f"group {printable(group)!r}: nothing paused")
        return ExitCode.OK
    click.echo(f"group {printable(group)!r}: {counted(len(found), 'pause')} in force")
    for p in found:
        click.echo(f"  {pause_line(p)}")
    return ExitCode.OK


# -- key retry-now, key give-up -------------------------------------------------


@click.group("key")
def key_group() -> None:
    """Act now on a key a consumer group quarantined: retry-now, give-up."""


def _key_options(fn: F) -> F:
    fn = _by_and_log(fn)
    fn = click.option("--reason", default="", help="Why (kept with the command).")(fn)
    fn = click.option("--key", required=True, help="The quarantined key.")(fn)
    return _group_topic(fn)


def _key_command(
    action: Callable[..., Any],
    group: str,
    topic: str,
    key: str,
    by: str | None,
    reason: str,
    namespace: str,
    log_url: str,
) -> Command | None:
    """Write ``action``'s command; None (said on stderr) when the key is not quarantined."""
    _check_scope(None, key)

    async def work(log: Log) -> Command:
        command: Command = await action(
            log, group, topic, key, by=by, reason=reason, namespace=namespace
        )
        return command

    try:
        return with_log(log_url, work)
    except KeyNotQuarantinedError as exc:
        click.echo(
            f"error: {exc}; nothing written (`wakuwaku status {printable(topic)} --group "
            f"{printable(group)}` lists the quarantined keys)",
            err=True,
        )
        return None


def _where(command: Command) -> str:
    return (
        f"the consumer owning partition {command.partition} applies it within one poll "
        "interval (when none runs, the next one to start does), to the key's work pending "
        f"when asked (below offset {command.through} of its retry partition)"
    )


@key_group.command("retry-now")
@_key_options
def retry_now_command(
    group: str, topic: str, key: str, reason: str, by: str | None, namespace: str, log_url: str
) -> int:
    """Run quarantined KEY's next attempt now, skipping its wait.

    The attempt counts like any other: if it fails, the key's next one
    follows the schedule, or it is given up. Exit status 3 when the key is
    not quarantined (nothing written), or for an unknown topic.
    """
    command = _key_command(retry_key_now, group, topic, key, by, reason, namespace, log_url)
    if command is None:
        return ExitCode.ERROR
    click.echo(f"wrote: {_written(command, group)}")
    click.echo(f"{_where(command)}: its next attempt runs at once")
    return ExitCode.OK


@key_group.command("give-up")
@_key_options
def give_up_command(
    group: str, topic: str, key: str, reason: str, by: str | None, namespace: str, log_url: str
) -> int:
    """Give quarantined KEY up now: dead-letter its pending work.

    The dead letters get reason given_up_by_operator and name who asked
    (--by) in the wk-operator header; the key's later records are handled as
    after any give-up. Exit status 3 when the key is not quarantined
    (nothing written), or for an unknown topic.
    """
    command = _key_command(give_up_key, group, topic, key, by, reason, namespace, log_url)
    if command is None:
        return ExitCode.ERROR
    click.echo(f"wrote: {_written(command, group)}")
    click.echo(
        f"{_where(command)}: it goes to the group's dead-letter topic with reason "
        "given_up_by_operator"
    )
    return ExitCode.OK


def register(root: click.Group) -> None:
    """Attach ``pause``, ``resume``, ``pauses`` and the ``key`` family."""
    root.add_command(pause_command)
    root.add_command(resume_command)
    root.add_command(pauses_command)
    root.add_command(key_group)
