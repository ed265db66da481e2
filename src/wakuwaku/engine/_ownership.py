"""Partition ownership for the consumer: leases of ours, or assignments a log pushes (design §15).

The consumer runs one supervisor per partition (``_consumer.py``); it asks
an :class:`Ownership` three things:

- :meth:`Ownership.acquire`: do I own this partition now (a
  :class:`~wakuwaku.logs.Lease` whose generation fences every write), and
  :meth:`Ownership.wait` until it is worth asking again;
- :meth:`Ownership.watch`: runs beside the partition's worker and stops it
  (``worker.stop()``: no new chunk, running chunks finish, what is done is
  stored) once the partition is no longer ours;
- :meth:`Ownership.release`: the worker has ended; let the partition go.

Two implementations behind that one interface:

- :class:`LeaseOwnership` for logs whose ownership is a lease of ours
  (memory, SQLite, Redis, NATS): take the lease, renew it every
  ``lease_ttl / 3``, stop the worker when a renewal says another member
  holds it or the lease ran out while the log was unreachable;
- :class:`AssignedOwnership` for logs whose members are given partitions by
  a coordinator (Kafka's consumer group, cooperative-sticky): the log pushes
  each change (:meth:`AssignmentLog.ownership_changed`); a *revoked*
  partition's worker is stopped at once and the partition released when it
  is done (the log waits for that, within its own bound, before the
  partition moves); a *lost* one (the member's session timed out) has its
  writes refused by the log already, so nothing is stored.
"""

from __future__ import annotations

import abc
import logging
from typing import Protocol, runtime_checkable

from .._errors import SetupError
from ..logs import Lease, Log
from ._config import ConsumerConfig
from ._partition import PartitionWorker
from ._setup import setup_fault

logger = logging.getLogger("wakuwaku.consumer")

__all__ = (
    "AssignedOwnership",
    "AssignmentLog",
    "LeaseOwnership",
    "Ownership",
    "ownership_for",
)


@runtime_checkable
class AssignmentLog(Protocol):
    """What a log whose partitions are assigned by a coordinator offers (Kafka)."""

    async def ownership_changed(self, group: str, member: str, within: float) -> None:
        """Return when this member's assignment changed (assigned, revoked or
        lost), or after ``within`` seconds."""

    def ownership_state(self, lease: Lease) -> str:
        """``owned``, ``revoking`` (give it back: stop, store, release) or
        ``gone`` (lost or moved: nothing may be stored)."""


class Ownership(abc.ABC):
    """The engine-facing ownership of one consumer's partitions (see the module)."""

    def __init__(self, log: Log, config: ConsumerConfig) -> None:
        self.log = log
        self.config = config
        #: Partitions whose last :meth:`acquire` failed on the log (None for
        #: an unreachable log, not for another member's lease): the
        #: supervisor then does not say another member owns them.
        self.unreachable: set[tuple[str, int]] = set()

    async def acquire(self, topic: str, partition: int) -> Lease | None:
        """The lease when this member owns the partition now, else None
        (also when the log cannot be reached: asked again later).

        :raises SetupError: when the log refuses for a reason no retry fixes
            (a refused credential or permission).
        """
        try:
            lease = await self.log.acquire_partition(
                self.config.group, topic, partition, self.config.member_id, self.config.lease_ttl
            )
        except Exception as exc:
            self.unreachable.add((topic, partition))
            fault = setup_fault(exc)
            if fault is not None and fault.tries == 1:  # no retry fixes it (design §7)
                raise SetupError(
                    fault.what, fault.hint, operation="take lease", topic=topic, partition=partition
                ) from exc
            logger.warning(
                "cannot take partition lease; retrying",
                extra={"topic": topic, "partition": partition, "error": str(exc)},
            )
            return None
        self.unreachable.discard((topic, partition))
        return lease

    @abc.abstractmethod
    async def wait(self, topic: str, partition: int) -> None:
        """Wait until asking :meth:`acquire` again is worth it."""

    @abc.abstractmethod
    async def watch(self, lease: Lease, worker: PartitionWorker) -> None:
        """Run beside ``worker``; stop it once ``lease`` is no longer ours, then return."""

    async def release(self, lease: Lease) -> None:
        """Let the partition go (the worker has ended); errors are logged, not raised."""
        try:
            await self.log.release_partition(lease)
        except Exception as exc:  # noqa: BLE001 - the lease lapses by itself
            logger.warning(
                "cannot release partition; it moves when its lease or session ends",
                extra={"topic": lease.topic, "partition": lease.partition, "error": str(exc)},
            )


class LeaseOwnership(Ownership):
    """Leases of ours, renewed every ``lease_ttl / 3`` (memory, SQLite, Redis, NATS)."""

    async def wait(self, topic: str, partition: int) -> None:
        await self.config.clock.sleep(self.config.lease_ttl / 3)

    async def watch(self, lease: Lease, worker: PartitionWorker) -> None:
        """Renew ``lease``; stop ``worker`` once it is lost.

        Each renewal moves the worker's lease deadline to the time the
        renewal was *sent* plus ``lease_ttl`` (monotonic): a renewal that
        was answered before a long pause (SIGSTOP, a blocked event loop)
        cannot keep the worker starting chunks after the lease ran out. A
        renewal answered "another member holds it" stops the worker at
        once; an unreachable log only once the deadline has passed.
        """
        clock, ttl = self.config.clock, self.config.lease_ttl
        while not worker.ended:
            await clock.sleep(ttl / 3)
            if worker.ended:
                return
            sent = clock.monotonic()
            try:
                renewed = await self.log.acquire_partition(
                    lease.group, lease.topic, lease.partition, lease.member, ttl
                )
            except Exception as exc:  # noqa: BLE001 - the log is down: the lease may still hold
                logger.warning(
                    "cannot renew partition lease; retrying",
                    extra={"topic": lease.topic, "partition": lease.partition, "error": str(exc)},
                )
                if clock.monotonic() < worker.lease_deadline:
                    continue
                renewed = None
            if renewed is not None and renewed.generation == lease.generation:
                worker.lease_deadline = sent + ttl
                continue
            logger.warning(
                "partition lease lost; stopping its worker",
                extra={"topic": lease.topic, "partition": lease.partition},
            )
            worker.stop()
            return


class AssignedOwnership(Ownership):
    """Assignments pushed by the log's coordinator (Kafka's consumer group)."""

    def __init__(self, log: Log, config: ConsumerConfig, assignments: AssignmentLog) -> None:
        super().__init__(log, config)
        self.assignments = assignments

    async def wait(self, topic: str, partition: int) -> None:
        await self.assignments.ownership_changed(
            self.config.group, self.config.member_id, self.config.lease_ttl / 3
        )

    async def watch(self, lease: Lease, worker: PartitionWorker) -> None:
        """Wait for the log to say the partition is revoked or lost; stop the worker.

        Each look that finds the partition still owned moves the worker's
        lease deadline to the time of the look plus ``lease_ttl``, as a
        renewal does for a lease: the coordinator decides ownership, and a
        worker whose watcher has not looked for ``lease_ttl`` (a paused
        process, a blocked event loop) starts no chunk, while one that is
        looked after runs past the deadline its acquire set.
        """
        clock, ttl = self.config.clock, self.config.lease_ttl
        while not worker.ended:
            looked = clock.monotonic()
            state = self.assignments.ownership_state(lease)
            if state != "owned":
                logger.info(
                    "partition revoked; stopping its worker"
                    if state == "revoking"
                    else "partition lost; stopping its worker (nothing more is stored)",
                    extra={"topic": lease.topic, "partition": lease.partition},
                )
                worker.stop()
                return
            worker.lease_deadline = looked + ttl
            await self.assignments.ownership_changed(lease.group, lease.member, ttl / 3)


def ownership_for(log: Log, config: ConsumerConfig) -> Ownership:
    """:class:`AssignedOwnership` for a log that pushes assignments, else leases."""
    if isinstance(log, AssignmentLog):
        return AssignedOwnership(log, config, log)
    return LeaseOwnership(log, config)
