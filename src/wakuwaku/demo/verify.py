"""The end of a flights demo run: its report and its verification.

:func:`report` prints what the run did (the README explains each line);
:func:`verify` checks the projection and the dead letters against totals
computed from the CSV files without wakuwaku (:mod:`.data`). This module
only reads: the projection, the dead letters it is given, the producers'
counts and the chaos's record. It starts and stops no process and writes to
no log; the orchestration (:mod:`.run`) calls it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from .._events import event_type
from .._sanitize import redact_url
from .._text import plural
from ..admin import DeadLetter
from .data import Expected, Totals
from .flights import FlightFlown, Projection
from .options import DemoOptions
from .processes import Chaos
from .producers import Produced

Print = Callable[[str], None]
"""Where the report's lines go (``print``, ``click.echo``, ``list.append``)."""


@dataclass
class Verification:
    """The demo's proof, from the CSV files and the demo's own outputs."""

    lines: list[str] = field(default_factory=list)
    ok: bool = True

    def check(self, ok: bool, text: str) -> None:
        self.ok = self.ok and ok
        self.lines.append(f"  [{'ok' if ok else 'FAILED'}] {text}")


async def verify(
    dead: Sequence[DeadLetter],
    projection: Projection,
    expected: Expected,
    registered: set[str],
    refused: int,
    *,
    after_replay: bool,
) -> Verification:
    """Check the projection and the dead letters against the CSV totals."""
    result = Verification()
    zero = Totals().as_tuple()
    actual = projection.totals()
    tails = set(expected.totals)
    wrong = [t for t in tails & registered if actual.get(t, zero) != expected.totals[t].as_tuple()]
    result.check(
        not wrong,
        f"projection equals the CSV totals for all {len(registered):,} "
        f"registered tail numbers" + (f" (wrong: {sorted(wrong)[:5]})" if wrong else ""),
    )
    strays = sorted(set(actual) - registered)
    result.check(
        not strays,
        "no totals for unregistered tail numbers" + (f" (found {strays[:5]})" if strays else ""),
    )
    other = Counter(d.reason for d in dead if d.reason != "gave_up_retry")
    result.check(
        not other, "no dead letters but gave_up_retry" + (f" ({dict(other)})" if other else "")
    )
    dead_ids: set[str] = set()
    dead_totals: dict[str, Totals] = {}
    seen: set[tuple[str | None, tuple[str, ...]]] = set()
    for letter in dead:
        if letter.source is None:
            continue
        identity = (letter.type_tag, tuple(letter.source.ids))
        if identity in seen:
            continue  # written again after a crash (at-least-once): the same dead letter
        seen.add(identity)
        dead_ids.update(letter.source.ids)
        t = dead_totals.setdefault(letter.key or "", Totals())
        if letter.type_tag == event_type(FlightFlown).tag:
            flown = msgspec.json.decode(letter.body, type=FlightFlown)
            t.flights += flown.flights
            t.distance += flown.distance
            t.air_time += flown.air_time
            t.arr_delay += flown.arr_delay
        else:
            t.cancelled += 1
    applied = projection.applied_ids()
    if not after_replay:
        missing = tails - registered
        wrong_dead = [
            t
            for t in missing
            if dead_totals.get(t, Totals()).as_tuple() != expected.totals[t].as_tuple()
        ]
        # A registered plane's flight given up (its plane stored too late for
        # the retry schedule) is accounted for as a dead letter below; named
        # here, it cannot pass for an effect lost after its id was claimed.
        registered_dead = sorted(set(dead_totals) & registered)
        given_up = sum(dead_totals[t].flights + dead_totals[t].cancelled for t in registered_dead)
        result.check(
            not wrong_dead and not registered_dead,
            f"dead letters hold exactly the flights of the "
            f"{len(missing):,} unregistered tail {plural(len(missing), 'number')}"
            + (f" (wrong: {sorted(wrong_dead)[:5]})" if wrong_dead else "")
            + (
                f" (and {given_up:,} {plural(given_up, 'flight')} of registered ones: "
                f"{registered_dead[:5]})"
                if registered_dead
                else ""
            ),
        )
        overlap = applied & dead_ids
        result.check(not overlap, "no flight both applied and dead-lettered")
        total = len(applied) + len(dead_ids) + refused
        result.check(
            total == expected.rows,
            f"every row accounted for exactly once: {len(applied):,} applied + "
            f"{len(dead_ids):,} dead-lettered + {refused:,} refused = {total:,} "
            f"of {expected.rows:,}",
        )
    else:
        with_tail = expected.rows - expected.without_tail
        result.check(
            len(applied) == with_tail and refused == expected.without_tail,
            f"every flight with a tail number applied exactly once: {len(applied):,} "
            f"of {with_tail:,} (plus {refused:,} refused without one)",
        )
    return result


def report(
    out: Print,
    *,
    opts: DemoOptions,
    log_url: str,
    produced: Produced,
    stats: dict[str, Any],
    dead: Counter[str],
    chaos: Chaos,
    seconds: float,
    runs: int,
) -> None:
    """Print the demo's report (the README explains each line)."""
    events = produced.events
    attempts = stats.get("attempts", 0)
    out(
        f"log                      {redact_url(log_url)} "
        f"({opts.partitions} {plural(opts.partitions, 'partition')} per topic)"
    )
    out(
        f"produced                 {produced.planes:,} PlaneRegistered, {produced.registers} "
        f"RegisterPublished, {produced.flown:,} FlightFlown, {produced.cancelled:,} "
        f"FlightCancelled in {produced.seconds:.1f} s"
    )
    out(
        f"refused at publish       {produced.refused:,} {plural(produced.refused, 'flight')} "
        "without a tail number "
        f"(first: {produced.first_refusal or '-'})"
    )
    handled, calls = stats.get("handled", 0), stats.get("handler_calls", 0)
    out(
        f"handled                  {handled:,} {plural(handled, 'record')} in "
        f"{calls:,} handler {plural(calls, 'call')}"
    )
    reduced, skipped = stats.get("reduced_away", 0), stats.get("inbox_skipped", 0)
    out(f"reduced away by combine  {reduced:,} {plural(reduced, 'record')}")
    out(f"skipped by the inbox     {skipped:,} {plural(skipped, 'record')} already applied")
    keys, routed = stats.get("quarantined_keys", 0), stats.get("routed", 0)
    out(
        f"retryable                {keys:,} {plural(keys, 'key')} quarantined, "
        f"{attempts:,} {plural(attempts, 'attempt')} ({stats.get('attempts_failed', 0):,} "
        f"failed), {routed:,} {plural(routed, 'record')} routed during quarantine"
    )
    out(f"keys given up            {stats.get('gave_up_keys', 0):,}")
    out(
        "dead letters             "
        + (", ".join(f"{r}: {n:,}" for r, n in sorted(dead.items())) or "none")
    )
    pauses = stats.get("transient_pauses", 0)
    out(
        f"transient pauses         {pauses:,} failed {plural(pauses, 'call')} retried in place"
        + (
            f" (projection locked for {opts.lock_seconds:.1f} s at {chaos.lock_at:.1f} s)"
            if chaos.lock_at is not None
            else ""
        )
    )
    out(
        f"consumer runs            {runs}"
        + (f" (SIGKILL at {chaos.kill_at:.1f} s, restarted)" if chaos.kill_at is not None else "")
    )
    out(f"duration                 {seconds:.1f} s, {_rate(events, seconds)} events")


def _rate(count: int, seconds: float) -> str:
    return f"{count / seconds:,.0f}/s" if seconds > 0 else "-"
