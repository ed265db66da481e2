"""``wakuwaku dashboard``: the web dashboard over a log (docs/dashboard.md)."""

from __future__ import annotations

import os

import click

from .._errors import ConfigError
from ._options import Seconds
from ._status import log_option, namespace_option, open_existing_log


@click.command("dashboard")
@click.option("--group", "-g", default=None, help="Show only this consumer group.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME",
    help="Also answer requests for this host name (repeatable); localhost, 127.0.0.1, "
    "[::1] and --host are always answered, any other name gets 400.",
)
@click.option(
    "--allow-replay",
    is_flag=True,
    help="Allow the operator controls, each after a confirmation page: replay and purge "
    "dead letters, pause and resume a topic, partition or key, retry or give up a "
    "quarantined key, reset the group's offsets (otherwise read-only).",
)
@click.option(
    "--interval",
    default=5.0,
    show_default=True,
    type=Seconds(0.2, 3600),
    help="Seconds between reads of the log (and page updates).",
)
@click.option(
    "--metrics-url",
    default=None,
    metavar="URL",
    help="A consumer's Prometheus endpoint to link and show "
    "(wakuwaku run --metrics-port 9100: http://127.0.0.1:9100/metrics).",
)
@namespace_option
@log_option
def dashboard_command(
    group: str | None,
    host: str,
    port: int,
    allowed_hosts: tuple[str, ...],
    allow_replay: bool,
    interval: float,
    metrics_url: str | None,
    namespace: str,
    log_url: str,
) -> None:
    """Serve a web page of each topic's partitions, lag, quarantined keys, pauses, dead letters.

    Read-only unless --allow-replay (replay, purge, pause, resume, retry-now,
    give-up, reset offsets). Only the host names it was started for
    are answered (loopback names, --host, --allowed-host). Listening beyond
    loopback needs a token in WAKUWAKU_DASHBOARD_TOKEN (the HTTP Basic
    password; any user name).
    Needs the `dashboard` extra: pip install 'wakuwaku[dashboard]'.
    """
    if metrics_url is not None and not metrics_url.startswith(("http://", "https://")):
        raise click.BadParameter(
            f"{metrics_url!r} is not an http(s) URL", param_hint="--metrics-url"
        )
    try:
        from ..dashboard import TOKEN_ENV, DashboardSettings, check_exposure, serve
    except ImportError as exc:
        raise ConfigError(str(exc)) from None
    token = os.environ.get(TOKEN_ENV) or None
    settings = DashboardSettings(
        log_url,
        group=group,
        namespace=namespace,
        host=host,
        port=port,
        allowed_hosts=allowed_hosts,
        allow_replay=allow_replay,
        token=token,
        interval=interval,
        metrics_url=metrics_url,
    )
    check_exposure(host, token)
    open_existing_log(log_url)  # a mistyped SQLite path fails now, with its message
    serve(settings, lambda: open_existing_log(log_url))


def register(group: click.Group) -> None:
    """Attach ``dashboard`` to the ``wakuwaku`` group."""
    group.add_command(dashboard_command)
