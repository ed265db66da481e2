"""``wakuwaku group reset-offsets``: move a consumer group's committed offsets.

Built on :func:`wakuwaku.admin.reset_offsets`. The command prints the plan
first (per partition: the committed offset, the new one, and how many
records that skips or reads again), stops there with ``--dry-run``, and
otherwise stores the new offsets. It refuses while members of the group run
on the topic, naming them. It joins the ``group`` command family
(``group delete`` is in :mod:`._topics`).
"""

from __future__ import annotations

import datetime

import click

from .._errors import GroupRunningError, UnknownGroupError
from ..admin import (
    OffsetResetPlan,
    ResetPosition,
    ResetTarget,
    RunningMember,
    apply_offset_reset,
    plan_offset_reset,
    running_members,
)
from ..logs import Log
from ._exit import ExitCode
from ._status import log_option, namespace_option, printable, when, with_log


def _aware_time(ctx: click.Context, param: click.Parameter, value: str | None) -> object:
    """``--to-datetime``: an ISO 8601 time with its zone (``Z`` or ``+02:00``)."""
    if value is None:
        return None
    try:
        moment = datetime.datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not an ISO 8601 time (e.g. 2026-05-01T10:15:00Z)"
        ) from None
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise click.BadParameter(
            f"{value!r} has no zone: add one (Z for UTC, or +02:00), so that it means "
            "the same moment on every machine"
        )
    return moment


def _target(
    earliest: bool, latest: bool, offset: int | None, moment: datetime.datetime | None
) -> ResetTarget:
    given: list[ResetTarget] = []
    if earliest:
        given.append(ResetPosition.EARLIEST)
    if latest:
        given.append(ResetPosition.LATEST)
    if offset is not None:
        given.append(offset)
    if moment is not None:
        given.append(moment)
    if len(given) != 1:
        raise click.UsageError(
            "give exactly one of --to-earliest, --to-latest, --to-offset N, --to-datetime TIME"
        )
    return given[0]


def _change(records: int) -> str:
    if records > 0:
        return f"+{records} (skipped)"
    if records < 0:
        return f"{records} (replayed)"
    return "0"


def render_plan(plan: OffsetResetPlan) -> list[str]:
    """The lines ``group reset-offsets`` prints for ``plan``."""
    lines = [
        f"reset group {printable(plan.group)!r} on topic {printable(plan.topic)!r} "
        f"to {plan.target}",
        f"{'partition':>9}  {'from':>12}  {'to':>12}  records",
    ]
    for p in plan.partitions:
        committed = "-" if p.committed is None else str(p.committed)
        lines.append(f"{p.partition:>9}  {committed:>12}  {p.offset:>12}  {_change(p.change)}")
    lines.append(
        f"records skipped: {plan.skipped}, read again (replayed): {plan.replayed} "
        "(+N: skipped, -N: replayed)"
    )
    if any(p.committed is None for p in plan.partitions):
        lines.append("from '-': the group never committed there; it would read from the start")
    lines.extend(f"note: partition {p.partition}: {p.note}" for p in plan.partitions if p.note)
    return lines


def _who(members: tuple[RunningMember, ...]) -> str:
    parts = []
    for m in members:
        owned = ", ".join(str(p) for p in m.partitions)
        until = "" if m.expires_at is None else f", lease until {when(m.expires_at)}"
        parts.append(f"{printable(m.member)!r} (partitions {owned}{until})")
    return "; ".join(parts)


def _refuse(group: str, topic: str, running: tuple[RunningMember, ...]) -> None:
    click.echo(
        f"error: group {printable(group)!r} has running members on topic "
        f"{printable(topic)!r}: {_who(running)}; nothing stored. Stop them first (a "
        "member that was killed counts until its lease or session lapses)",
        err=True,
    )


@click.command("reset-offsets")
@click.option("--group", "-g", required=True, help="The consumer group.")
@click.option("--topic", required=True, help="The topic (a main topic).")
@click.option(
    "--partition", type=int, default=None, help="Only this partition (default: every one)."
)
@click.option("--to-earliest", is_flag=True, help="The start offset: read everything stored.")
@click.option("--to-latest", is_flag=True, help="The end offset: skip everything stored.")
@click.option(
    "--to-offset",
    type=click.IntRange(min=0),
    default=None,
    metavar="N",
    help="This offset (clamped to each partition's start and end offsets).",
)
@click.option(
    "--to-datetime",
    "to_datetime",
    callback=_aware_time,
    default=None,
    metavar="TIME",
    help="The first record stored at or after TIME (ISO 8601 with a zone: "
    "2026-05-01T10:15:00Z, 2026-05-01T12:15:00+02:00).",
)
@click.option("--dry-run", is_flag=True, help="Print the plan; store nothing.")
@namespace_option
@log_option
def reset_offsets_command(
    group: str,
    topic: str,
    partition: int | None,
    to_earliest: bool,
    to_latest: bool,
    to_offset: int | None,
    to_datetime: datetime.datetime | None,
    dry_run: bool,
    namespace: str,
    log_url: str,
) -> int:
    """Move GROUP's committed offsets on TOPIC (as kafka-consumer-groups --reset-offsets).

    Prints the plan first: per partition the committed offset, the new one,
    and the records that skips (+N) or reads again (-N). --dry-run stops
    there. Refused while members of the group run on the topic (they are
    named; exit status 1), and for a group that never committed on the topic
    (exit status 1). Exit status 3 for an unknown topic or partition.
    """
    target = _target(to_earliest, to_latest, to_offset, to_datetime)

    async def work(log: Log) -> int:
        try:
            plan = await plan_offset_reset(
                log, group, topic, target, partition=partition, namespace=namespace
            )
        except UnknownGroupError as exc:
            click.echo(f"error: {exc}", err=True)
            return ExitCode.FAILURE
        for line in render_plan(plan):
            click.echo(line)
        if plan.running:
            _refuse(plan.group, plan.topic, plan.running)
            return ExitCode.FAILURE
        if dry_run:
            click.echo("dry run: nothing stored")
            return ExitCode.OK
        try:
            done = await apply_offset_reset(log, plan)
        except GroupRunningError:
            _refuse(plan.group, plan.topic, await running_members(log, group, plan.topic) or ())
            return ExitCode.FAILURE
        moved = sum(p.moves for p in done.partitions)
        click.echo(f"stored the new offsets of {moved} partition{'s' * (moved != 1)}")
        zeros = [p.partition for p in done.partitions if p.moves and p.offset == 0]
        if zeros and not log.commits_zero:
            # Iggy stores "the last record consumed": an offset of 0 is stored
            # as none, which status then shows as never committed.
            click.echo(
                f"note: this log stores offset 0 as no offset: `status` shows the group as "
                f"not committed on partition{'s' * (len(zeros) != 1)} "
                f"{', '.join(map(str, zeros))} until it commits again; it reads from the start"
            )
        if done.running_after:
            click.echo(
                "warning: members started while the offsets were stored: "
                f"{_who(done.running_after)}; they may have read the old offsets: "
                "stop them and reset again",
                err=True,
            )
            return ExitCode.FAILURE
        return ExitCode.OK

    return with_log(log_url, work)


def register(root: click.Group) -> None:
    """Add ``reset-offsets`` to the ``group`` command family (registered before)."""
    family = root.commands.get("group")
    if not isinstance(family, click.Group):
        raise RuntimeError("the 'group' command family must be registered before _offsets")
    family.add_command(reset_offsets_command)
