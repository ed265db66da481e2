"""``wakuwaku status TOPIC --group G``: lag, quarantined keys, retry backlog,
dead letters and pauses of one consumer group (design §14).

Also home of what the operations commands share (``dlq``, ``status``,
``run``, ``pause``): the ``--log`` option (env ``WAKUWAKU_LOG``, default
``sqlite:///wakuwaku.db``), opening a log that must already exist, and how
a time, a text and a pause are printed.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import click

from .._control import Pause
from .._control import scope_text as _scope_text
from .._errors import ConfigError, UnknownGroupError
from .._text import counted, shown_key
from ..admin import Status, consumer_status
from ..engine import DEFAULT_RETRY_DELAYS
from ..logs import DEFAULT_LOG_URL, Log, open_log, sqlite_log_path
from ._exit import ExitCode
from ._options import parse_retry_delays

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

LOG_ENV = "WAKUWAKU_LOG"
"""The environment variable every command reads its log URL from."""


def check_lasting_log(url: str, source: str = "--log") -> None:
    """Refuse a log that ends with the command: ``memory://``.

    A memory log lives in this process only: a topic ``topic create`` made
    in it is gone when the command ends, and the next command (another
    process) would say it does not exist. Every command that takes
    ``--log`` refuses it (the demo refuses it too: its consumer runs in
    another process); in Python, :class:`~wakuwaku.logs.MemoryLog` shared
    by the code that uses it is what it is for.

    :param source: where the URL came from, for the message.
    :raises ConfigError: for a ``memory://`` URL, suggesting a SQLite file.
    """
    if url.partition("://")[0].strip().lower() == "memory":
        raise ConfigError(
            f"{source} {url!r}: a memory log lives only as long as this command, so "
            "nothing it holds is there for the next command (or for a consumer in "
            "another process); give a log that outlasts it, such as sqlite:///wakuwaku.db"
        )


def _lasting_log(ctx: click.Context, param: click.Parameter, value: str) -> str:
    source = "--log"
    if ctx.get_parameter_source(param.name or "") is click.core.ParameterSource.ENVIRONMENT:
        source = LOG_ENV
    check_lasting_log(value, source)
    return value


def log_option(fn: F) -> F:
    """``--log URL`` (env ``WAKUWAKU_LOG``, default ``sqlite:///wakuwaku.db``);
    ``memory://`` is refused (:func:`check_lasting_log`)."""
    return click.option(
        "--log",
        "log_url",
        envvar=LOG_ENV,
        default=DEFAULT_LOG_URL,
        show_default=True,
        metavar="URL",
        callback=_lasting_log,
        help=(
            f"The log (sqlite:///file.db[?fsync=0&busy_timeout=S], redis://host:port/db, "
            f"nats://host:port, kafka://host:port[,host:port], iggy://user:password@host:port); "
            f"env {LOG_ENV}."
        ),
    )(fn)


def namespace_option(fn: F) -> F:
    """``--namespace NS``: the consumer's ``ConsumerConfig.namespace``."""
    return click.option(
        "--namespace",
        default="",
        metavar="NS",
        help="The consumer's namespace prefix (ConsumerConfig.namespace), if any.",
    )(fn)


def open_existing_log(url: str, *, create: bool = False) -> Log:
    """Open the log ``url`` names, refusing to create a new SQLite file.

    An operations command on a mistyped path must say so, not report an
    empty log (and leave a new file behind). Every command opens its log
    here, so every command reads a URL the same way (one parser:
    :func:`~wakuwaku.logs.open_log`) and says the same thing about it.

    :param create: allow a new SQLite file (``topic create``).
    :raises ConfigError: when the SQLite file does not exist (unless
        ``create``), or the URL is bad (an unknown option is named).
    :raises UnsupportedLogURL: for an unknown scheme.
    """
    path = sqlite_log_path(url)
    if not create and path and not os.path.exists(path):
        raise ConfigError(
            f"no log at {path!r} (from --log {url!r}); pass --log or set {LOG_ENV}, "
            "or create a topic first"
        )
    return open_log(url)


def with_log(url: str, work: Callable[[Log], Awaitable[T]], *, create: bool = False) -> T:
    """Open the log (:func:`open_existing_log`), run ``work(log)`` on a new event
    loop, close the log.

    :param create: allow a new SQLite file; otherwise a missing one is refused.
    """

    async def main() -> T:
        log = open_existing_log(url, create=create)
        try:
            return await work(log)
        finally:
            await log.close()

    return asyncio.run(main())


def when(seconds: float | None) -> str:
    """A UTC ISO 8601 time (to the second), ``-`` for None.

    A stored time outside the dates :mod:`datetime` can show (before year 1
    or after 9999, up to the 2**53 ms a header may hold) prints as ``<n> s
    since the epoch``: status never dies on a time it read (it did, with
    ``year 33715 is out of range``).
    """
    if seconds is None:
        return "-"
    try:
        moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    except (ValueError, OverflowError, OSError):
        return f"{seconds:.0f} s since the epoch"
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def printable(text: str, limit: int | None = None) -> str:
    """``text`` with every non-printable character escaped (keys are shown
    exactly), cut after ``limit`` characters with the count of what was cut
    (a key may be 1 MiB; ``--json`` output keeps it whole)."""
    if limit is not None and len(text) > limit:
        return f"{printable(text[:limit])}...({len(text) - limit} more characters)"
    return "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in text)


KEY_LIMIT = 200
"""The most characters of a key a text line shows (``--json`` shows it whole)."""


def scope_text(topic: str, partition: int | None, key: str | None) -> str:
    """A pause's or a command's scope as every command prints it
    (:func:`wakuwaku._control.scope_text` with terminal-safe names)."""
    return _scope_text(
        topic, partition, key, show_topic=printable, show_key=lambda k: shown_key(k, KEY_LIMIT)
    )


def pause_line(pause: Pause) -> str:
    """One pause in force, on one line: scope, who, since when (UTC), why."""
    return (
        f"{scope_text(pause.topic, pause.partition, pause.key)}  "
        f"by {printable(pause.by or '-', 100)}  since {when(pause.at)}  "
        f"reason: {printable(pause.reason or '-', 200)}"
    )


def _relative(at: float, now: float) -> str:
    delta = at - now
    if delta <= 0:
        return "due now"
    return f"in {delta:.1f}s"


def _per_reason(counts: Mapping[str, int]) -> str:
    return " (" + ", ".join(f"{r} {n}" for r, n in counts.items()) + ")" if counts else ""


def never_committed(status: Status) -> str:
    """What ``status`` says about a group without a commit on the topic."""
    return str(UnknownGroupError(status.group, status.topic, status.groups))


def render_status(status: Status, now: float) -> list[str]:
    """The human-readable lines of ``wakuwaku status``."""
    lines = [f"topic {status.topic!r}, group {status.group!r}"]
    if status.retry_topic:
        lines.append(
            f"retry topic {status.retry_topic!r}, dead-letter topic {status.dead_letter_topic!r}"
        )
    lines.append(
        f"{'partition':>9}  {'end':>10}  {'committed':>10}  {'lag':>8}  "
        f"{'backlog':>8}  {'quarantined':>11}  owner"
    )
    for p in status.partitions:
        committed = "-" if p.committed is None else str(p.committed)
        owner = "-" if p.owner is None else printable(p.owner, 60)
        lines.append(
            f"{p.partition:>9}  {p.end_offset:>10}  {committed:>10}  {p.lag:>8}  "
            f"{p.retry_pending:>8}  {p.quarantined:>11}  {owner}"
        )
    lines.append(f"lag: {counted(status.lag, 'record')}")
    lines.append(f"retry backlog: {counted(status.backlog, 'record')} pending")
    if status.pauses:
        lines.append(f"paused: {counted(len(status.pauses), 'pause')} in force")
        lines.extend(f"  {pause_line(pause)}" for pause in status.pauses)
    else:
        lines.append("paused: nothing")
    if status.quarantined:
        lines.append(f"quarantined keys: {len(status.quarantined)}")
        held = {p.key for p in status.pauses if p.key is not None}
        stopped = {p.partition for p in status.pauses if p.key is None}
        for q in status.quarantined:
            if q.key in held or None in stopped or q.partition in stopped:
                # Its attempts wait for a resume, whatever the stored time says.
                nxt = "next attempt: paused by an operator (after resume)"
            else:
                nxt = (
                    f"next attempt (stored) {when(q.next_attempt_at)} "
                    f"({_relative(q.next_attempt_at, now)})"
                )
            lines.append(
                f"  partition {q.partition}  key {shown_key(q.key, KEY_LIMIT)}  "
                f"pending {q.pending}  failures {q.failures}  {nxt}"
            )
    else:
        lines.append("quarantined keys: none")
    if status.dead_letters:
        waiting = status.not_replayed
        lines.append(f"dead letters not replayed: {sum(waiting.values())}{_per_reason(waiting)}")
        lines.append(
            f"dead letters replayed: {sum(status.replayed.values())}{_per_reason(status.replayed)}"
        )
    else:
        lines.append("dead letters: none")
    if status.purged:
        lines.append(
            f"dead letters purged (hidden): {sum(status.purged.values())}"
            f"{_per_reason(status.purged)}"
        )
    lines.extend(f"problem: {problem}" for problem in status.problems)
    return lines


@click.command("status")
@click.argument("topic")
@click.option("--group", "-g", required=True, help="The consumer group.")
@click.option(
    "--retry-delays",
    default=",".join(f"{d:g}" for d in DEFAULT_RETRY_DELAYS),
    show_default=True,
    metavar="S,S,...",
    help="Only for retry records written before the consumer stored next attempt "
    "times (wk-due-at): the schedule, in seconds, to derive them.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@namespace_option
@log_option
def status_command(
    topic: str, group: str, retry_delays: str, as_json: bool, namespace: str, log_url: str
) -> int:
    """Show a group's lag, quarantined keys (next attempt time), backlog, dead letters, pauses.

    Next attempt times are the ones the consumer stored. Dead letters are
    counted apart: not replayed yet, and replayed by `dlq replay`. Exit
    status 3 when TOPIC does not exist or is a dead-letter/retry topic; 1
    when a broken retry record was met, or when GROUP never committed on
    TOPIC (the groups that did are named).
    """
    delays = parse_retry_delays(retry_delays)
    status = with_log(
        log_url,
        lambda log: consumer_status(log, topic, group, retry_delays=delays, namespace=namespace),
    )
    if as_json:
        click.echo(json.dumps(status.as_dict(), ensure_ascii=False, sort_keys=True))
    elif status.never_committed:
        click.echo(f"error: {never_committed(status)}", err=True)
    else:
        for line in render_status(status, datetime.datetime.now(datetime.UTC).timestamp()):
            click.echo(line)
    return ExitCode.FAILURE if status.problems or status.never_committed else ExitCode.OK


def register(group: click.Group) -> None:
    """Attach ``status`` to the ``wakuwaku`` group."""
    group.add_command(status_command)
