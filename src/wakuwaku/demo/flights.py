"""The flights demo's events, projection and handlers.

Two topics keyed by tail number: ``planes`` (the aircraft register) and
``flights``. One consumer projects them into a SQLite database:

- ``planes``: one row per registered aircraft (:class:`PlaneRegistered`,
  idempotent: registering twice is registering once);
- ``totals``: per plane, flights flown, cancellations, distance, air time and
  arrival-delay sums, fed by :class:`FlightFlown` (associative: ``combine``
  sums the figures) and :class:`FlightCancelled` (plain).

The register's producer ends with :class:`RegisterPublished` ("the register
lists N planes"). What happens to a flight whose plane is not in the
projection is decided by the data, never by how fast the planes arrived:

- while the register is not complete (no ``RegisterPublished`` stored yet, or
  fewer planes stored than it lists) the plane may still come: the handler
  raises ``Transient`` and the partition waits, in place, for the register;
- once it is complete, a plane missing from it will not come by itself: the
  handler raises ``Retryable`` (an operator may amend the register), and after
  the schedule the flights are dead-lettered ``gave_up_retry``.

So exactly the flights of unregistered tail numbers are dead-lettered, under
any load and across a SIGKILL (the planes table and the register markers are
durable; registering is idempotent). The totals accumulate, so their handlers
claim each message id in the inbox inside the same transaction as the update,
and stay exact under redelivery (design §9).

SQLite has one writer at a time, so the handlers are async and hand their
writes to one writer thread, which commits the chunks waiting for it
together (group commit: one transaction, one savepoint per chunk, so one
chunk's failure rolls back only its own writes). Each handler call still
returns only once its chunk is committed, and a failed commit fails every
chunk in it (a lock held by another process is Transient for each).
"""

from __future__ import annotations

import asyncio
import queue
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec

from .._errors import Retryable, Transient, Unrecoverable
from .._events import event
from ..engine import ChunkContext, Handler, current_chunk
from ..inbox import SQLiteInbox

PLANES_TOPIC = "planes"
FLIGHTS_TOPIC = "flights"
GROUP = "flights-projection"
BUSY_TIMEOUT = 0.05
"""How long a handler waits on a locked projection (seconds) before the
classifier turns "database is locked" into Transient."""

SETUP_TIMEOUT = 60.0
"""How long the consumer's start waits on a locked projection (seconds).
Nothing retries the setup as the engine retries a Transient handler: a
consumer the chaos restarted while the lock was held failed its start
("database is locked" at ``PRAGMA journal_mode``) and exited."""


@event("demo.plane-registered", key="tailnum", algebra="idempotent")
class PlaneRegistered(msgspec.Struct, frozen=True):
    """An aircraft in the register."""

    tailnum: str
    year: int | None
    manufacturer: str
    model: str
    seats: int | None


@event("demo.register-published", key="register")
class RegisterPublished(msgspec.Struct, frozen=True):
    """The register's producer is done: the register lists ``planes`` tail numbers.

    :param register: the register's name (the key).
    :param planes: distinct tail numbers the register lists, amendments included.
    """

    register: str
    planes: int


@event("demo.flight-flown", key="tailnum", algebra="associative")
class FlightFlown(msgspec.Struct, frozen=True):
    """One or more flights of one plane; ``combine`` adds the figures up.

    :param flights: how many flights this event stands for.
    :param distance: miles flown.
    :param air_time: minutes in the air (diverted flights count 0).
    :param arr_delay: arrival delay minutes, summed (diverted flights count 0).
    """

    tailnum: str
    flights: int
    distance: int
    air_time: int
    arr_delay: int

    def combine(self, other: FlightFlown) -> FlightFlown:
        return FlightFlown(
            self.tailnum,
            self.flights + other.flights,
            self.distance + other.distance,
            self.air_time + other.air_time,
            self.arr_delay + other.arr_delay,
        )


@event("demo.flight-cancelled", key="tailnum")
class FlightCancelled(msgspec.Struct, frozen=True):
    """A flight that never left."""

    tailnum: str


SCHEMA = """
CREATE TABLE IF NOT EXISTS planes (
    tailnum TEXT PRIMARY KEY,
    year INTEGER,
    manufacturer TEXT NOT NULL,
    model TEXT NOT NULL,
    seats INTEGER
);
CREATE TABLE IF NOT EXISTS registers (
    register TEXT PRIMARY KEY,
    planes INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS totals (
    tailnum TEXT PRIMARY KEY,
    flights INTEGER NOT NULL DEFAULT 0,
    cancelled INTEGER NOT NULL DEFAULT 0,
    distance INTEGER NOT NULL DEFAULT 0,
    air_time INTEGER NOT NULL DEFAULT 0,
    arr_delay INTEGER NOT NULL DEFAULT 0
);
"""


class PlaneNotRegistered(LookupError):
    """A flight refers to a plane the complete register does not list."""


class RegisterLoading(LookupError):
    """A flight refers to a plane not stored while the register is still loading."""


class Projection:
    """The projection database: one SQLite file and one writer connection.

    SQLite has one writer at a time: the handlers hand their writes to one
    writer thread, which commits them in groups on one connection (see the
    module docstring), so the only "database is locked" they ever see comes
    from another process (the demo's chaos).

    :param path: the database file.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.inbox = SQLiteInbox(self.path, GROUP)
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._readers = threading.local()
        self._known: set[str] = set()
        self._complete = False
        self._writer = _GroupCommit(self)
        conn = self._open(SETUP_TIMEOUT)
        try:
            conn.executescript(SCHEMA)
        finally:
            conn.close()

    def close(self) -> None:
        """Stop the writer thread (after the writes handed to it)."""
        self._writer.close()

    def _open(self, timeout: float = BUSY_TIMEOUT) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, timeout=timeout, isolation_level=None, check_same_thread=False
        )
        conn.execute("PRAGMA journal_mode=WAL")
        # OFF is still safe against a killed process (the OS keeps the writes);
        # only a power loss could lose the last transactions of this demo file.
        conn.execute("PRAGMA synchronous=OFF")
        return conn

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction on the writer connection (BEGIN IMMEDIATE ... COMMIT)."""
        with self._lock:
            if self._conn is None:
                self._conn = self._open()
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def _register(self, conn: sqlite3.Connection, run: Sequence[PlaneRegistered]) -> None:
        """Upsert planes (idempotent: the same row twice is one row)."""
        conn.executemany(
            "INSERT INTO planes VALUES (?, ?, ?, ?, ?) ON CONFLICT (tailnum) DO UPDATE SET "
            "year = excluded.year, manufacturer = excluded.manufacturer, "
            "model = excluded.model, seats = excluded.seats",
            [(p.tailnum, p.year, p.manufacturer, p.model, p.seats) for p in run],
        )

    def _publish_register(self, conn: sqlite3.Connection, run: Sequence[RegisterPublished]) -> None:
        """Store how many planes a register lists (the largest count wins)."""
        conn.executemany(
            "INSERT INTO registers VALUES (?, ?) ON CONFLICT (register) DO UPDATE SET "
            "planes = max(planes, excluded.planes)",
            [(r.register, r.planes) for r in run],
        )
        self._complete = False  # an amendment may list planes not stored yet

    def register_size(self) -> int:
        """How many planes the projection holds while its register is complete, else 0."""
        conn = sqlite3.connect(self.path)
        try:
            if not self.register_complete(conn):
                return 0
            return int(conn.execute("SELECT count(*) FROM planes").fetchone()[0])
        finally:
            conn.close()

    def register_complete(self, conn: sqlite3.Connection | None = None) -> bool:
        """Whether a register was published and all the planes it lists are stored."""
        own = conn is None
        conn = conn or sqlite3.connect(self.path)
        try:
            listed = conn.execute("SELECT max(planes) FROM registers").fetchone()[0]
            stored = conn.execute("SELECT count(*) FROM planes").fetchone()[0]
        finally:
            if own:
                conn.close()
        return listed is not None and stored >= listed

    def _new_events(self, conn: sqlite3.Connection, chunk: ChunkContext, count: int) -> list[bool]:
        """Claim the chunk's message ids; per event, whether it is new.

        :raises Unrecoverable: when an event stands for ids of which some were
            applied and others not (it cannot be split: never guess).
        """
        if len(chunk.message_ids) != count:
            # Claiming ids of events this call does not apply would lose them.
            raise Unrecoverable(
                f"chunk of plane {chunk.key!r} has {len(chunk.message_ids)} events but the "
                f"handler got {count}"
            )
        claim = self.inbox.claim(conn, chunk.all_message_ids)
        unclaimed = set(claim.new)  # a repeated id is new at most once
        flags = []
        for ids in chunk.message_ids[:count]:
            new = [i in unclaimed for i in ids]
            unclaimed.difference_update(ids)
            if any(new) and not all(new):
                raise Unrecoverable(
                    f"event of plane {chunk.key!r} stands for ids of which only some are "
                    "new; it cannot be split"
                )
            flags.append(all(new))
        return flags

    def _require_plane(self, tailnum: str) -> None:
        """Return when the plane is stored (read outside the write lock), else raise.

        :raises Transient: the register is still loading (the plane may come).
        :raises Retryable: the register is complete and does not list the plane.
        """
        if tailnum in self._known:
            return
        reader = getattr(self._readers, "conn", None)
        if reader is None:
            reader = self._readers.conn = self._open()
        if reader.execute("SELECT 1 FROM planes WHERE tailnum = ?", (tailnum,)).fetchone() is None:
            if not self._complete:
                # Read in one snapshot, so a plane stored in between cannot be missed.
                reader.execute("BEGIN")
                try:
                    stored = reader.execute(
                        "SELECT 1 FROM planes WHERE tailnum = ?", (tailnum,)
                    ).fetchone()
                    complete = self.register_complete(reader)
                finally:
                    reader.execute("COMMIT")
                if stored is not None:
                    self._known.add(tailnum)
                    return
                if not complete:
                    raise Transient(
                        RegisterLoading(f"plane {tailnum} is not stored; the register is loading")
                    )
                self._complete = True
            raise Retryable(PlaneNotRegistered(f"plane {tailnum} is not in the register"))
        self._known.add(tailnum)  # registrations are never removed

    async def register(self, run: Sequence[PlaneRegistered]) -> None:
        """Handler: upsert planes."""
        await self._writer.write(self._register, run)

    async def publish_register(self, run: Sequence[RegisterPublished]) -> None:
        """Handler: store a register's size."""
        await self._writer.write(self._publish_register, run)

    async def fly(self, run: Sequence[FlightFlown]) -> None:
        """Handler: add flown flights to their plane's totals, each message id once."""
        self._require_plane(run[0].tailnum)
        await self._writer.write(self._fly, run, current_chunk())

    async def cancel(self, run: Sequence[FlightCancelled]) -> None:
        """Handler: count cancelled flights on their plane's totals, each message id once."""
        self._require_plane(run[0].tailnum)
        await self._writer.write(self._cancel, run, current_chunk())

    def _fly(
        self, conn: sqlite3.Connection, run: Sequence[FlightFlown], chunk: ChunkContext
    ) -> None:
        rows = [
            (f.flights, f.distance, f.air_time, f.arr_delay, f.tailnum)
            for f, new in zip(run, self._new_events(conn, chunk, len(run)), strict=True)
            if new
        ]
        conn.executemany(
            "INSERT INTO totals (tailnum) VALUES (?) ON CONFLICT DO NOTHING",
            [(r[-1],) for r in rows[:1]],
        )
        conn.executemany(
            "UPDATE totals SET flights = flights + ?, distance = distance + ?, "
            "air_time = air_time + ?, arr_delay = arr_delay + ? WHERE tailnum = ?",
            rows,
        )

    def _cancel(
        self, conn: sqlite3.Connection, run: Sequence[FlightCancelled], chunk: ChunkContext
    ) -> None:
        count = sum(self._new_events(conn, chunk, len(run)))
        if count:
            conn.execute(
                "INSERT INTO totals (tailnum) VALUES (?) ON CONFLICT DO NOTHING",
                (run[0].tailnum,),
            )
            conn.execute(
                "UPDATE totals SET cancelled = cancelled + ? WHERE tailnum = ?",
                (count, run[0].tailnum),
            )

    def totals(self) -> dict[str, tuple[int, int, int, int, int]]:
        """Every plane's (flights, cancelled, distance, air_time, arr_delay)."""
        conn = sqlite3.connect(self.path)
        try:
            return {
                row[0]: tuple(row[1:])
                for row in conn.execute(
                    "SELECT tailnum, flights, cancelled, distance, air_time, arr_delay FROM totals"
                )
            }
        finally:
            conn.close()

    def applied_ids(self) -> set[str]:
        """The message ids the inbox holds as applied."""
        conn = sqlite3.connect(self.path)
        try:
            return {
                row[0]
                for row in conn.execute(
                    f"SELECT message_key FROM {self.inbox.table} WHERE consumer_group = ? "
                    "AND status = 'done'",
                    (GROUP,),
                )
            }
        finally:
            conn.close()

    def handlers(self) -> list[Handler[Any]]:
        """The consumer's handlers (async: their writes go to the writer thread)."""
        return [
            Handler(PlaneRegistered, self.register, max_batch=500),
            Handler(RegisterPublished, self.publish_register),
            Handler(FlightFlown, self.fly, max_batch=100, inbox=self.inbox),
            Handler(FlightCancelled, self.cancel, max_batch=100, inbox=self.inbox),
        ]


_Write = tuple[
    Callable[..., None], tuple[Any, ...], asyncio.AbstractEventLoop, "asyncio.Future[None]"
]

GROUP_COMMIT_MAX = 256
"""At most this many chunks are committed in one transaction."""


class _GroupCommit:
    """One writer thread; the chunks waiting for it are committed together.

    Each write runs inside a savepoint, so a write that raises rolls back
    only its own changes and fails only its own handler call; the rest of
    the group commits. A failed BEGIN or COMMIT (the projection locked by
    another process) fails every write of the group.
    """

    def __init__(self, projection: Projection) -> None:
        self._projection = projection
        self._queue: queue.SimpleQueue[_Write | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start = threading.Lock()

    async def write(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(conn, *args)`` in the next group's transaction; return once
        it is committed, raising what ``fn``, BEGIN or COMMIT raised."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        with self._start:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="projection-writer", daemon=True
                )
                self._thread.start()
        self._queue.put((fn, args, loop, done))
        await done

    def close(self) -> None:
        with self._start:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join()

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            group = [first]
            while len(group) < GROUP_COMMIT_MAX:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._queue.put(None)  # stop after this group
                    break
                group.append(more)
            errors = self._commit(group)
            for (_, _, loop, done), error in zip(group, errors, strict=True):
                loop.call_soon_threadsafe(_settle, done, error)

    def _commit(self, group: list[_Write]) -> list[BaseException | None]:
        errors: list[BaseException | None] = [None] * len(group)
        try:
            with self._projection.transaction() as conn:
                for index, (fn, args, _, _) in enumerate(group):
                    conn.execute("SAVEPOINT chunk")
                    try:
                        fn(conn, *args)
                    except Exception as exc:  # noqa: BLE001 - handed to its handler call
                        conn.execute("ROLLBACK TO chunk")
                        errors[index] = exc
                    conn.execute("RELEASE chunk")
        except Exception as exc:  # noqa: BLE001 - BEGIN or COMMIT: every write failed
            return [error or exc for error in errors]
        return errors


def _settle(done: asyncio.Future[None], error: BaseException | None) -> None:
    if done.cancelled():
        return
    if error is None:
        done.set_result(None)
    else:
        done.set_exception(error)
