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
  holds it or the lease ran out while the log was unreachable; the
  members balance the partitions between them (:mod:`._balance`): a
  member takes no more than its share while another member wants one,
  and gives back what it holds beyond its share;
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
import asyncio
import logging
from typing import Protocol, runtime_checkable

from .._errors import SetupError
from ..logs import Lease, Log
from ._balance import WANTING_LOOK, Membership
from ._config import ConsumerConfig
from ._partition import PartitionWorker
from ._setup import setup_fault
from ._shared import raise_if_cancelled

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
        #: Partitions whose last :meth:`acquire` was not even asked: this
        #: member holds its share and another member wants them (balance).
        self.deferred: set[tuple[str, int]] = set()
        #: Partitions whose worker a look of the members stopped to give
        #: them back for balance (the supervisor releases and forgets them).
        self.handed_over: set[tuple[str, int]] = set()

    def balance(self, topic: str, partitions: int) -> None:  # noqa: B027 - optional hook
        """Take part in balancing ``topic``'s ``partitions`` between the
        group's members (logs whose coordinator balances: nothing to do)."""

    async def maintain(self, stopped: asyncio.Event) -> None:  # noqa: B027 - optional hook
        """Keep this member's place in the group until ``stopped`` is set or
        the task is cancelled (the first look comes before :meth:`acquire`
        answers). The flag, not only the cancel, ends it: a log client can
        swallow a cancel delivered during a call (redis-py was seen to)."""

    async def leave(self) -> None:  # noqa: B027 - optional hook
        """Give this member's place up (at a stop); errors are logged, not raised."""

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
    """Leases of ours, renewed every ``lease_ttl / 3``, balanced between the
    members (memory, SQLite, Redis, NATS)."""

    def __init__(self, log: Log, config: ConsumerConfig) -> None:
        super().__init__(log, config)
        self.memberships: dict[str, Membership] = {}
        # Partitions of each topic this member holds a lease on.
        self.held: dict[str, set[int]] = {}
        self._unseen = False  # the last look failed (logged once per outage)
        # Set once the first look is done (or given up): acquire waits for it.
        self._joined = asyncio.Event()
        # Set (and replaced) by a look that found a partition free: the
        # supervisors waiting to ask ask now, not at their next turn.
        self._free = asyncio.Event()
        # The workers running under our leases (watch registers them): a look
        # stops those given back for balance.
        self._running: dict[tuple[str, int], PartitionWorker] = {}

    def balance(self, topic: str, partitions: int) -> None:
        self.memberships[topic] = Membership(self.log, self.config, topic, partitions)

    async def maintain(self, stopped: asyncio.Event) -> None:
        try:
            await self._look()
        finally:
            self._joined.set()
        clock, every = self.config.clock, self.config.lease_ttl / 3
        # Fast looks during the first lease_ttl / 3: members started together
        # find each other at once (the first one to look took everything).
        joined = clock.monotonic()
        while not stopped.is_set():
            raise_if_cancelled()  # a look's cancel the log swallowed
            fast = clock.monotonic() - joined < every or any(
                m.wanting(self.held.get(topic, ())) for topic, m in self.memberships.items()
            )
            await clock.sleep(min(every, WANTING_LOOK) if fast else every)
            await self._look()

    async def _look(self) -> None:
        for membership in self.memberships.values():
            try:
                await membership.look()
            except Exception as exc:  # noqa: BLE001 - the view lapses; leases go on
                if not self._unseen:
                    logger.warning(
                        "cannot read the group's members; balancing waits for the log",
                        extra={"topic": membership.topic, "error": str(exc)},
                    )
                self._unseen = True
                continue
            if self._unseen:
                logger.info("group's members read again", extra={"topic": membership.topic})
                self._unseen = False
            self._rebalance(membership)

    def _rebalance(self, membership: Membership) -> None:
        """Give back what this member holds beyond its share (a graceful stop
        of those workers; the supervisor releases them), and wake the
        supervisors waiting to ask when a partition is free."""
        topic = membership.topic
        for partition in membership.excess(self.held.get(topic, set())):
            worker = self._running.get((topic, partition))
            if worker is None:
                continue
            if (topic, partition) in self.handed_over:
                # Still in the batch it had to finish, a look later: cut it.
                worker.stop()
                continue
            logger.info(
                "partition handed over to balance the group; its worker stops after its batch",
                extra={
                    "topic": topic,
                    "partition": partition,
                    "members": len(membership.members),
                    "share": membership.shares().get(self.config.member_id, 0),
                },
            )
            self.handed_over.add((topic, partition))
            worker.finish()
        if membership.active and len(membership.owners) < membership.partitions:
            self._free.set()
            self._free = asyncio.Event()

    async def leave(self) -> None:
        for membership in self.memberships.values():
            try:
                await membership.leave()
            except Exception as exc:  # noqa: BLE001 - the slot lapses by itself
                logger.warning(
                    "cannot leave the group's members; the place lapses with its lease",
                    extra={"topic": membership.topic, "error": str(exc)},
                )

    async def acquire(self, topic: str, partition: int) -> Lease | None:
        membership = self.memberships.get(topic)
        if membership is not None:
            await self._joined.wait()
        held = self.held.setdefault(topic, set())
        if (
            membership is not None
            and partition not in held
            and not membership.may_take(partition, held)
        ):
            self.deferred.add((topic, partition))
            return None
        self.deferred.discard((topic, partition))
        # Counted while asked: the other partitions' supervisors ask at the
        # same time, and each must see this one when it checks the share.
        already = partition in held
        held.add(partition)
        lease = await super().acquire(topic, partition)
        if lease is None and not already:
            held.discard(partition)
        return lease

    async def release(self, lease: Lease) -> None:
        self.held.get(lease.topic, set()).discard(lease.partition)
        await super().release(lease)

    async def wait(self, topic: str, partition: int) -> None:
        """``lease_ttl / 3``, or less: until a look of the group's members
        finds a partition free (one given back for balance is taken at once)."""
        sleeper = asyncio.ensure_future(self.config.clock.sleep(self.config.lease_ttl / 3))
        freed = asyncio.ensure_future(self._free.wait())
        try:
            await asyncio.wait({sleeper, freed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            freed.cancel()

    async def watch(self, lease: Lease, worker: PartitionWorker) -> None:
        where = (lease.topic, lease.partition)
        self._running[where] = worker
        try:
            await self._renew(lease, worker)
        finally:
            if self._running.get(where) is worker:
                del self._running[where]

    async def _renew(self, lease: Lease, worker: PartitionWorker) -> None:
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
