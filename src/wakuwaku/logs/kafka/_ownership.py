"""Which partitions a Kafka group member owns, and how each one is given up.

Owns the ownership state machine of the Kafka log, one
:class:`Assignment` per group member. A partition the group coordinator
assigns to the member is :attr:`~OwnershipState.OWNED` under a generation
of this process's own (a new number at each assignment: the fence of every
lease handed out for it). A revoke makes a partition the engine holds
:attr:`~OwnershipState.REVOKING`; the engine's next acquire is told no and
the partition is :attr:`~OwnershipState.STOPPED`; once the engine releases
it (or acquires it again: its worker is done), the revoke goes on and the
partition is :attr:`~OwnershipState.GONE`. A partition the engine does not
hold, and every partition of a lost assignment, is gone at once.

:class:`Assignment` alone takes its lock and changes these states: the
member's rebalance callbacks (:mod:`._member`, in its poll thread) and the
log's ownership calls (:mod:`._log`, on the event loop) ask it to. The
engine sees the same values through ``ownership_state``
(:class:`~wakuwaku.engine._ownership.AssignmentLog`), as plain strings.

Calls nothing.
"""

from __future__ import annotations

import enum
import itertools
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ("Assignment", "OwnershipState", "PartitionKey")

PartitionKey = tuple[str, int]
"""A partition of the log: (topic, partition), the topic without the prefix."""

_generations = itertools.count(1)


class OwnershipState(enum.StrEnum):
    """Where one assigned partition stands; the values are the strings the
    engine compares ``ownership_state`` with."""

    OWNED = "owned"
    """Assigned to the member: its leases fence writes, the worker runs."""

    REVOKING = "revoking"
    """Being revoked: the engine is to stop the worker, store what is done and release."""

    STOPPED = "stopped"
    """Being revoked, and the engine was told (an acquire answered None);
    ``ownership_state`` says :attr:`REVOKING` for it."""

    GONE = "gone"
    """Revoked, lost or never assigned: nothing may be stored under it."""


@dataclass
class _Owned:
    """One partition as the member sees it."""

    generation: int
    state: OwnershipState = OwnershipState.OWNED
    done: threading.Event = field(default_factory=threading.Event)
    """Set once the engine let the partition go: a revoke waiting for it goes on."""


class Assignment:
    """One group member's partitions and their :class:`OwnershipState` (thread-safe).

    Also knows which partitions the engine *holds* (acquired and not
    released): a revoke waits only for those.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owned: dict[PartitionKey, _Owned] = {}
        self._held: set[PartitionKey] = set()

    # -- the member's rebalance callbacks (its poll thread) ---------------

    def assign(self, partitions: Iterable[PartitionKey]) -> None:
        """The coordinator assigned ``partitions``: each is owned, under a new generation."""
        with self._lock:
            for key in partitions:
                self._owned[key] = _Owned(next(_generations))

    def revoke(self, partitions: Iterable[PartitionKey], *, closing: bool) -> list[threading.Event]:
        """The coordinator revokes ``partitions``: those the engine holds are
        revoking (unless the member is ``closing``), the others gone.

        :returns: one event per revoking partition, set once the engine let it go.
        """
        waits: list[threading.Event] = []
        with self._lock:
            for key in partitions:
                owned = self._owned.get(key)
                if owned is not None and owned.state == OwnershipState.OWNED:
                    if closing or key not in self._held:
                        owned.state = OwnershipState.GONE
                    else:
                        owned.state = OwnershipState.REVOKING
                        waits.append(owned.done)
        return waits

    def drop(self, partitions: Iterable[PartitionKey]) -> None:
        """``partitions`` left the member (a revoke done, or lost): gone, not held."""
        with self._lock:
            for key in partitions:
                owned = self._owned.pop(key, None)
                if owned is not None:
                    owned.state = OwnershipState.GONE
                self._held.discard(key)

    def end(self) -> None:
        """The member is closing: no revoke waits for the engine any more."""
        with self._lock:
            for owned in self._owned.values():
                owned.done.set()

    # -- the log (event loop) ------------------------------------------------

    def generation(self, topic: str, partition: int) -> int | None:
        """The generation the partition is assigned under, None when it is gone."""
        with self._lock:
            owned = self._owned.get((topic, partition))
            if owned is None or owned.state == OwnershipState.GONE:
                return None
            return owned.generation

    def acquire(self, topic: str, partition: int) -> int | None:
        """The engine asks for the partition: its generation while it is
        owned (the engine holds it from now on), else None.

        A revoking partition answers None and becomes stopped (the engine
        stops its worker); a stopped one asked again means that worker is
        done, and lets the revoke go on.
        """
        with self._lock:
            owned = self._owned.get((topic, partition))
            if owned is None or owned.state == OwnershipState.GONE:
                return None
            if owned.state == OwnershipState.REVOKING:
                owned.state = OwnershipState.STOPPED
                return None
            if owned.state == OwnershipState.STOPPED:
                owned.done.set()
                return None
            self._held.add((topic, partition))
            return owned.generation

    def state(self, topic: str, partition: int, generation: int) -> OwnershipState:
        """:attr:`~OwnershipState.OWNED`, :attr:`~OwnershipState.REVOKING` (stopped
        included) or :attr:`~OwnershipState.GONE` (another generation too)."""
        with self._lock:
            owned = self._owned.get((topic, partition))
            if (
                owned is None
                or owned.state == OwnershipState.GONE
                or owned.generation != generation
            ):
                return OwnershipState.GONE
            if owned.state == OwnershipState.OWNED:
                return OwnershipState.OWNED
            return OwnershipState.REVOKING

    def release(self, topic: str, partition: int, generation: int) -> bool:
        """The engine lets the partition go (of ``generation``; another is ignored).

        A revoking (or stopped) partition's revoke goes on.

        :returns: True when the partition was not being revoked and the
            engine now holds nothing of this member: the member may leave
            its group.
        """
        with self._lock:
            owned = self._owned.get((topic, partition))
            if owned is None or owned.generation != generation:
                return False
            self._held.discard((topic, partition))
            if owned.state in (OwnershipState.REVOKING, OwnershipState.STOPPED):
                owned.done.set()
                return False
            return not self._held
