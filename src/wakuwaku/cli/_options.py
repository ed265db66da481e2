"""Option values shared by several commands, parsed one way."""

from __future__ import annotations

import click

from .._errors import ConfigError
from ..engine import check_retry_delays


def parse_retry_delays(raw: str) -> tuple[float, ...]:
    """``--retry-delays``: comma-separated seconds, checked as the consumer
    checks its schedule (finite, ``>= 0``, at most 30 days each; see
    :func:`wakuwaku.engine.check_retry_delays`).

    :raises click.BadParameter: naming the value and what is wrong with it.
    """
    try:
        delays = [float(part) for part in raw.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(
            f"{raw!r} is not a comma-separated list of seconds (e.g. 2,4,8,16)",
            param_hint="--retry-delays",
        ) from None
    try:
        return check_retry_delays(delays)
    except ConfigError as exc:
        raise click.BadParameter(f"{raw!r}: {exc}", param_hint="--retry-delays") from None
