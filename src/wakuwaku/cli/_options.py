"""Option values shared by several commands, parsed one way.

Every option in seconds, of every command, is read by :class:`Seconds`: a
float that is not finite (``nan``, ``inf``) or outside the option's bounds
is refused with the option's name, and a list of seconds
(``--retry-delays``) is read item by item with the same check, an empty
item refused.
"""

from __future__ import annotations

import math

import click

from .._errors import ConfigError
from ..engine import MAX_RETRY_DELAY, check_retry_delays


class Seconds(click.ParamType[float, object]):
    """A click type for a duration in float seconds: finite and within bounds.

    ``float("nan")`` passes every comparison click's ``FloatRange`` makes
    (``nan < 0.2`` is False), so ``--interval nan`` was taken; this type
    refuses it, and ``inf``, by name.

    :param minimum: the smallest value taken (seconds).
    :param maximum: the largest value taken (seconds).
    :param above_minimum: refuse ``minimum`` itself (a value must be larger).
    """

    name = "seconds"

    def __init__(self, minimum: float, maximum: float, *, above_minimum: bool = False) -> None:
        self.minimum = minimum
        self.maximum = maximum
        self.above_minimum = above_minimum

    def describe(self) -> str:
        """What a value must be, in words (for error messages and help)."""
        low = ">" if self.above_minimum else ">="
        return (
            f"finite seconds {low} {_number(self.minimum)}, at most {_number(self.maximum)} seconds"
        )

    def check(self, raw: object) -> float:
        """``raw`` (text or a number) as seconds.

        :raises ValueError: saying what ``raw`` is not (:meth:`describe`).
        """
        try:
            value = float(raw)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise ValueError(f"{raw!r} is not a number: give {self.describe()}") from None
        too_low = value <= self.minimum if self.above_minimum else value < self.minimum
        if not math.isfinite(value) or too_low or value > self.maximum:
            raise ValueError(f"{raw!r} is not {self.describe()}")
        return value

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        try:
            return self.check(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "SECONDS"


def _number(value: float) -> str:
    """``value`` as written by hand: ``2592000``, ``0.2`` (not ``2.592e+06``)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


RETRY_DELAY = Seconds(0.0, MAX_RETRY_DELAY)
"""One delay of a retry schedule: ``0`` to 30 days (the consumer's own bounds)."""


def parse_retry_delays(raw: str) -> tuple[float, ...]:
    """``--retry-delays``: comma-separated seconds, each checked by
    :data:`RETRY_DELAY`, then the whole as the consumer checks its schedule
    (:func:`wakuwaku.engine.check_retry_delays`).

    :raises click.BadParameter: naming the option, the value and the item
        that is wrong (an empty item, ``1,,2``, is one).
    """
    items = raw.split(",")
    delays = []
    for number, item in enumerate(items, start=1):
        where = f"item {number} of {raw!r}" if len(items) > 1 else repr(raw)
        if not item.strip():
            raise click.BadParameter(
                f"{where} is empty: give comma-separated {RETRY_DELAY.describe()} (e.g. 2,4,8,16)",
                param_hint="--retry-delays",
            )
        try:
            delays.append(RETRY_DELAY.check(item.strip()))
        except ValueError as exc:
            text = str(exc) if len(items) == 1 else f"{where}: {exc}"
            raise click.BadParameter(text, param_hint="--retry-delays") from None
    try:
        return check_retry_delays(delays)
    except ConfigError as exc:  # pragma: no cover - every item passed the same bounds
        raise click.BadParameter(f"{raw!r}: {exc}", param_hint="--retry-delays") from None
