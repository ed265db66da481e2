"""``wakuwaku dlq purge``: take a group's dead letters out of view (design §8).

Built on :func:`wakuwaku.admin.purge_dead_letters`: the replayed dead
letters, those of one reason, or all of them, are recorded as purged in the
group's ledger topic, after which ``dlq list``, ``dlq replay`` and
``status`` leave them out. The records stay in the dead-letter topic (no log
deletes a record from the middle of a partition); ``docs/operations.md``
says why and what removes them. It joins the ``dlq`` command family
(:mod:`._dlq`).
"""

from __future__ import annotations

import click

from .._records import ReasonCode
from ..admin import PurgeReport, dead_letter_groups, purge_dead_letters
from ..logs import Log
from ._dlq import _line, _no_such_group
from ._exit import ExitCode
from ._status import log_option, namespace_option, printable, with_log


def _topic(argument: str | None, option: str | None) -> str:
    """TOPIC given as the argument (as ``dlq list`` takes it) or as ``--topic``."""
    if argument is not None and option is not None and argument != option:
        raise click.UsageError(f"two topics given: {argument!r} and --topic {option!r}")
    topic = argument if argument is not None else option
    if topic is None:
        raise click.UsageError("give the main topic: TOPIC or --topic TOPIC")
    return topic


def _summary(report: PurgeReport) -> str:
    count = len(report.purged)
    verb = "would purge" if report.dry_run else "purged"
    reasons = ", ".join(f"{r} {n}" for r, n in report.by_reason.items())
    text = (
        f"{verb} {count} dead letter{'s' * (count != 1)} of {printable(report.dead_letter_topic)!r}"
    )
    return f"{text} ({reasons})" if reasons else text


@click.command("purge")
@click.argument("topic_argument", metavar="[TOPIC]", required=False)
@click.option("--topic", "topic_option", default=None, help="The main topic (or give TOPIC).")
@click.option(
    "--group", "-g", required=True, help="The consumer group whose dead letters these are."
)
@click.option("--replayed", is_flag=True, help="The dead letters `dlq replay` replayed.")
@click.option(
    "--reason",
    type=click.Choice([r.value for r in ReasonCode]),
    default=None,
    help="The dead letters with this reason code (with --replayed: the replayed ones of it).",
)
@click.option("--all", "everything", is_flag=True, help="Every dead letter, broken ones included.")
@click.option("--dry-run", is_flag=True, help="Write nothing; list what would be purged.")
@namespace_option
@log_option
def purge_command(
    topic_argument: str | None,
    topic_option: str | None,
    group: str,
    replayed: bool,
    reason: str | None,
    everything: bool,
    dry_run: bool,
    namespace: str,
    log_url: str,
) -> int:
    """Purge GROUP's dead letters of TOPIC: --replayed, --reason R, or --all.

    Purged dead letters are recorded in the group's ledger topic and left out
    by `dlq list` (unless --include-purged), `dlq replay` and `status`; the
    records stay in the log until its retention or `topic delete` removes
    them. --dry-run lists what would be purged. Exit status 1 when GROUP
    never consumed TOPIC, 3 when TOPIC does not exist.
    """
    topic = _topic(topic_argument, topic_option)
    if everything and (replayed or reason is not None):
        raise click.UsageError("--all purges every dead letter: give it alone")
    if not everything and not replayed and reason is None:
        raise click.UsageError("say which dead letters: --replayed, --reason R (or both), or --all")

    async def work(log: Log) -> tuple[PurgeReport, list[str]]:
        report = await purge_dead_letters(
            log,
            topic,
            group=group,
            reason=reason,
            replayed=replayed,
            everything=everything,
            dry_run=dry_run,
            namespace=namespace,
        )
        return report, await dead_letter_groups(log, topic, namespace)

    report, groups = with_log(log_url, work)
    if group not in groups:
        _no_such_group(topic, group, groups)
        return ExitCode.FAILURE
    click.echo(_summary(report))
    if dry_run:
        for letter in report.purged:
            click.echo(f"  {_line(letter)}")
    elif report.purged:
        click.echo(
            "they are hidden from dlq list, dlq replay and status; the records stay in "
            "the log until its retention or `topic delete` removes them"
        )
    if report.already_purged:
        before = report.already_purged
        were = "dead letter was" if before == 1 else "dead letters were"
        click.echo(f"{before} matching {were} purged before")
    return ExitCode.OK


def register(root: click.Group) -> None:
    """Add ``purge`` to the ``dlq`` command family (registered before)."""
    family = root.commands.get("dlq")
    if not isinstance(family, click.Group):
        raise RuntimeError("the 'dlq' command family must be registered before _dlq_purge")
    family.add_command(purge_command)
