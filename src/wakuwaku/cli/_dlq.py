"""``wakuwaku dlq list`` and ``wakuwaku dlq replay``: a topic's dead letters (design §8).

Dead letters belong to one consumer group (``--group``, design §6). ``list``
only reads the group's dead-letter topic: ``wk-dlq.<group>.<topic>``, or the
name its consumer was configured with (``ConsumerConfig.dead_letter_topics``),
which the consumer noted in the log at start.
``replay`` writes matching dead letters back into the main topic (keeping
``wk-src``, the message identity), addressed to that group only
(``wk-for-group``), and notes each one in the ledger topic
``wk-replayed.<group>.<topic>`` (``<dead-letter topic>.replayed`` for a
configured one) so that running it again does not replay it
twice; ``--all`` ignores the ledger. See
:func:`wakuwaku.admin.replay_dead_letters` and ``docs/operations.md``.
``purge`` is in :mod:`._dlq_purge`.
"""

from __future__ import annotations

import json
from typing import Any

import click

from .._records import ReasonCode, Source
from .._sanitize import sanitize
from .._text import counted, plural, shown_key
from ..admin import (
    DeadLetter,
    DeadLetterOrder,
    ReplayReport,
    dead_letter_groups,
    list_dead_letters,
    replay_dead_letters,
    resolve_group_topics,
)
from ..logs import Log
from ._exit import ExitCode
from ._status import log_option, namespace_option, printable, when, with_log

KEY_LIMIT = 200
"""The most characters of a key a text line shows (``--json`` shows it whole)."""

_REASON = click.Choice([r.value for r in ReasonCode])


def _filters(fn: Any) -> Any:
    fn = click.option(
        "--group", "-g", required=True, help="The consumer group whose dead letters these are."
    )(fn)
    fn = click.option(
        "--limit", type=click.IntRange(min=1), default=None, help="At most this many dead letters."
    )(fn)
    fn = click.option("--key", default=None, help="Only dead letters of this key.")(fn)
    fn = click.option(
        "--reason", type=_REASON, default=None, help="Only dead letters with this reason code."
    )(fn)
    return fn


@click.group("dlq")
def dlq_group() -> None:
    """List and replay a group's dead letters of a topic (wk-dlq.<group>.<topic>, or configured)."""


def _source(source: Source | None) -> str:
    if source is None:
        return "-"
    offsets = ",".join(str(o) for o in source.offsets)
    return f"{printable(source.topic)}/{source.partition}@{offsets}"


def _line(letter: DeadLetter) -> str:
    key = "-" if letter.key is None else shown_key(letter.key, KEY_LIMIT)
    fields = [
        f"{letter.partition}@{letter.offset}",
        f"reason={printable(letter.reason or '-')}",
        f"key={key}",
        f"type={printable(letter.type_tag or '-')}",
        f"src={_source(letter.source)}",
        f"at={when(letter.timestamp) if letter.timestamp else '-'}",
        f"error={sanitize(letter.error or '-', 200)}",
    ]
    if letter.problems:
        fields.append("problems=" + "; ".join(letter.problems))
    if letter.purged:
        fields.append("purged")
    return "\t".join(fields)


@dlq_group.command("list")
@click.argument("topic")
@_filters
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print a JSON array (headers as text, body as text or body_hex).",
)
@click.option(
    "--oldest-first",
    is_flag=True,
    help="Oldest dead letters first (default: newest first, by the time the log stored them).",
)
@click.option(
    "--include-purged", is_flag=True, help="List purged dead letters too, marked 'purged'."
)
@namespace_option
@log_option
def list_command(
    topic: str,
    group: str,
    reason: str | None,
    key: str | None,
    limit: int | None,
    as_json: bool,
    oldest_first: bool,
    include_purged: bool,
    namespace: str,
    log_url: str,
) -> int:
    """List TOPIC's dead letters, newest first: dlq partition@offset, reason, key,
    type, source, time, error text.

    Dead letters with broken headers are listed with what is broken; purged
    ones are left out unless --include-purged. --limit keeps the first ones
    in the order shown. Exit status 3 when TOPIC does not exist.
    """
    order = DeadLetterOrder.OLDEST_FIRST if oldest_first else DeadLetterOrder.NEWEST_FIRST

    async def work(log: Log) -> tuple[list[DeadLetter], list[str], str]:
        found = await list_dead_letters(
            log,
            topic,
            group=group,
            reason=reason,
            key=key,
            limit=limit,
            namespace=namespace,
            order=order,
            include_purged=include_purged,
        )
        names = await resolve_group_topics(log, topic, group, namespace)
        groups = [] if found else await dead_letter_groups(log, topic, namespace)
        return found, groups, names.dead_letter

    letters, groups, dlq = with_log(log_url, work)
    if not letters and group not in groups:
        _no_such_group(topic, group, groups)
        return ExitCode.FAILURE
    if as_json:
        click.echo(json.dumps([x.as_dict() for x in letters], ensure_ascii=False, indent=1))
        return ExitCode.OK
    if not letters:
        click.echo(f"no dead letters in {dlq!r} matching the filters")
        return ExitCode.OK
    for letter in letters:
        click.echo(_line(letter))
    broken = sum(1 for x in letters if x.problems)
    summary = f"{counted(len(letters), 'dead letter')} in {dlq!r}"
    if broken:
        summary += f" ({broken} with broken headers)"
    click.echo(summary)
    return ExitCode.OK


def _no_such_group(topic: str, group: str, groups: list[str]) -> None:
    others = ", ".join(repr(g) for g in groups) or "none"
    click.echo(
        f"error: group {group!r} has no dead-letter topic for {topic!r}: it never "
        f"consumed {topic!r} (a mistyped --group?); groups that did: {others}",
        err=True,
    )


def _describe(report: ReplayReport, topic: str) -> str:
    parts = ", ".join(f"partition {p}: {n}" for p, n in report.by_partition.items())
    count = len(report.replayed)
    verb = "would replay" if report.dry_run else "replayed"
    text = f"{verb} {counted(count, 'dead letter')} into {topic!r}"
    return f"{text} ({parts})" if parts else text


@dlq_group.command("replay")
@click.argument("topic")
@_filters
@click.option("--dry-run", is_flag=True, help="Write nothing; say what would be replayed.")
@click.option(
    "--all",
    "everything",
    is_flag=True,
    help="Replay again what an earlier replay already replayed.",
)
@namespace_option
@log_option
def replay_command(
    topic: str,
    group: str,
    reason: str | None,
    key: str | None,
    limit: int | None,
    dry_run: bool,
    everything: bool,
    namespace: str,
    log_url: str,
) -> int:
    """Write TOPIC's matching dead letters back into TOPIC (keeping their identity).

    Prints how many were replayed per partition. Dead letters already
    replayed by an earlier run are left alone unless --all. Dead letters
    that cannot be replayed (no key to route by, broken wk-src) are named on
    stderr and make the exit status 1; exit status 3 when TOPIC does not exist.
    """

    async def work(log: Log) -> tuple[ReplayReport, list[str], str]:
        done = await replay_dead_letters(
            log,
            topic,
            group=group,
            reason=reason,
            key=key,
            limit=limit,
            dry_run=dry_run,
            everything=everything,
            namespace=namespace,
        )
        names = await resolve_group_topics(log, topic, group, namespace)
        return done, await dead_letter_groups(log, topic, namespace), names.dead_letter

    report, groups, dlq = with_log(log_url, work)
    if group not in groups:
        _no_such_group(topic, group, groups)
        return ExitCode.FAILURE
    click.echo(_describe(report, topic))
    if report.purged:
        click.echo(f"{report.purged} matching dead letters were purged: not replayed")
    if dry_run:
        for entry in report.replayed:
            click.echo(
                f"  {entry.dlq_partition}@{entry.dlq_offset}\tkey="
                f"{shown_key(entry.key, KEY_LIMIT)}\t-> partition {entry.partition}"
            )
    if report.already_replayed:
        before = report.already_replayed
        click.echo(
            f"{before} matching {plural(before, 'dead letter was', 'dead letters were')} "
            f"replayed before (use --all to replay {plural(before, 'it', 'them')} again)"
        )
    for skip in report.skipped:
        key_text = "-" if skip.key is None else shown_key(skip.key, KEY_LIMIT)
        click.echo(
            f"skipped {dlq!r} partition {skip.dlq_partition} offset "
            f"{skip.dlq_offset} (key {key_text}): {skip.reason}",
            err=True,
        )
    if report.skipped:
        click.echo(f"{counted(len(report.skipped), 'dead letter')} could not be replayed", err=True)
        return ExitCode.FAILURE
    return ExitCode.OK


def register(group: click.Group) -> None:
    """Attach the ``dlq`` commands to the ``wakuwaku`` group."""
    group.add_command(dlq_group)
