"""Fair shares of a topic's partitions between the members of one group, on lease logs (design §15).

Kafka's and Iggy's consumer groups balance their members' partitions on the
server. On the logs whose ownership is a lease of ours (memory, SQLite,
Redis, NATS) the members balance themselves, with nothing but leases:

- **Membership.** Each member holds a *slot*: a lease, under the group
  name ``<group>.members`` (no group name holds a ``.``), on one partition
  number of the topic, renewed every ``lease_ttl / 3`` like a partition's.
  The members are the live holders of those slots; a member that stops
  releases its slot, a dead one's slot runs out with its partitions'
  leases. There are as many slots as partitions: a member beyond that
  count would get no partition anyway.
- **Shares** (:func:`fair_shares`): ``partitions // members`` each, and the
  remainder to the members that own the most now (then by name), so that
  a balanced group moves nothing and each member, reading the same
  leases, works out the same shares.
- **Taking**: a member takes a free partition while it owns fewer than its
  share (it does not ask for one a live member holds, as seen at its last
  look); above it, only a partition that has stayed free for ``lease_ttl``
  (at least 1.5 s)
  (its taker never came: a member gone, or members that see the group
  differently); then nothing more is given back until the members change,
  so that a partition does not go back and forth. A partition is never
  taken from a live owner: leases run out or are given back.
- **Giving back**: a member that owns more than its share, while another
  member owns fewer than its own, lets the workers of its highest
  partitions beyond the share finish the batch they run (nothing is
  delivered twice) and releases them; a batch still running at the next
  look is cut as a graceful stop cuts it (what is done is stored). A
  member below its share looks every :data:`WANTING_LOOK` seconds while
  a partition is free or another member holds more than its share, and
  takes what was given back at that look. Every member also looks that
  often during its first ``lease_ttl / 3``: members started together
  find each other at once, not a ``lease_ttl / 3`` later.

A member started with ``ConsumerConfig.partitions`` consumes those
partitions, first come, first served, and takes no part (as Kafka's
``assign()`` next to ``subscribe()``). A member that cannot see the group
(the log unreachable, a log without :meth:`~wakuwaku.logs.Log.partition_owners`)
takes what is free and gives nothing back, as before balancing.

May call: the log, :mod:`._config`. Called by :mod:`._ownership`.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable, Mapping

from ..logs import Lease, Log
from ._config import ConsumerConfig

logger = logging.getLogger("wakuwaku.consumer")

MEMBERS_SUFFIX = ".members"
"""Appended to the group's name for its members' slot leases."""

WANTING_LOOK = 0.5
"""Seconds between the looks of a member waiting for a partition to be given
back (at most ``lease_ttl / 3``, the look of a member that wants nothing)."""


def fair_shares(
    partitions: int, members: Iterable[str], owned: Mapping[str, int]
) -> dict[str, int]:
    """Each member's share of ``partitions``: the partitions divided evenly,
    the remainder going to the members that own the most now (then by
    name), so that a group already balanced moves nothing.

    :param members: the members' names (repeats count once).
    :param owned: partitions each member owns now (a member missing owns 0).
    :returns: member -> share; the shares add up to ``partitions`` (empty
        when there is no member).
    """
    ordered = sorted(set(members), key=lambda member: (-owned.get(member, 0), member))
    if not ordered:
        return {}
    base, extra = divmod(partitions, len(ordered))
    return {member: base + (index < extra) for index, member in enumerate(ordered)}


class Membership:
    """This member's place in the group on one topic, as of its last look.

    :param log: the log (a lease log).
    :param config: the consumer's configuration (group, member id, lease ttl, clock).
    :param topic: the (qualified) main topic.
    :param partitions: its partition count.

    :ivar slot: the slot this member holds (None: none yet, or lost).
    :ivar members: the live members seen at the last look, this one included
        when it holds a slot.
    :ivar owners: partition -> its live owner, at the last look.
    """

    def __init__(self, log: Log, config: ConsumerConfig, topic: str, partitions: int) -> None:
        self.log = log
        self.config = config
        self.topic = topic
        self.partitions = partitions
        self.slot: int | None = None
        self._slot_lease: Lease | None = None
        self.members: frozenset[str] = frozenset()
        self.owners: dict[int, str] = {}
        # When (clock monotonic) each partition was first seen free, while it stays so.
        self._free_since: dict[int, float] = {}
        # When the last look succeeded (clock monotonic); None: never.
        self._looked_at: float | None = None
        # The members seen when a partition given back was taken again after
        # lease_ttl (its taker never came): nothing more is given back while
        # they stay the same, or the partition would go back and forth.
        self._unbalanced_with: frozenset[str] | None = None

    @property
    def _slots_group(self) -> str:
        return self.config.group + MEMBERS_SUFFIX

    async def look(self) -> None:
        """Hold (or find) a slot, then read the members and the partitions' owners.

        :raises LogError: what the log raises (the caller logs it; the last
            view stays, and lapses after ``lease_ttl``).
        """
        log, config, topic = self.log, self.config, self.topic
        me, ttl, group = config.member_id, config.lease_ttl, self._slots_group
        if self.slot is not None:
            renewed = await log.acquire_partition(group, topic, self.slot, me, ttl)
            self._slot_lease = renewed
            if renewed is None:
                self.slot = None  # it ran out and another member took it
        slots = await log.partition_owners(group, topic)
        if slots is None:
            return  # this log cannot list leases: no balancing
        now = time.time()
        if self.slot is None:
            for slot in range(self.partitions):
                held = slots.get(slot)
                if held is not None and held.member != me and held.expires_at > now:
                    continue
                taken = await log.acquire_partition(group, topic, slot, me, ttl)
                if taken is not None:
                    self.slot, self._slot_lease = slot, taken
                    break
        owners = await log.partition_owners(config.group, topic)
        if owners is None:
            return
        now = time.time()
        members = {lease.member for lease in slots.values() if lease.expires_at > now}
        members.discard(me)
        if self.slot is not None:
            members.add(me)
        self.members = frozenset(members)
        self.owners = {p: lease.member for p, lease in owners.items() if lease.expires_at > now}
        looked = config.clock.monotonic()
        free_since = self._free_since
        for p in range(self.partitions):
            if p in self.owners:
                free_since.pop(p, None)
            else:
                free_since.setdefault(p, looked)
        self._looked_at = looked

    @property
    def active(self) -> bool:
        """True while the last look is recent (within ``lease_ttl``) and
        this member holds a slot: only then does it balance."""
        looked = self._looked_at
        return (
            looked is not None
            and self.slot is not None
            and self.config.clock.monotonic() - looked < self.config.lease_ttl
        )

    def shares(self) -> dict[str, int]:
        """Every member's share, from the last look (see :func:`fair_shares`)."""
        return fair_shares(self.partitions, self.members, self._owned())

    def _owned(self) -> Counter[str]:
        """Partitions each member owns, at the last look."""
        return Counter(self.owners.values())

    def may_take(self, partition: int, held: Iterable[int]) -> bool:
        """Whether to ask for ``partition``, holding ``held`` now: always when
        not balancing; else below this member's share, or once the
        partition has stayed free for ``lease_ttl``."""
        if not self.active:
            return True
        me = self.config.member_id
        owner = self.owners.get(partition)
        if owner is not None and owner != me:
            # A live member holds it: asking is refused, and while asked it
            # would count as held and hold back a free one.
            return False
        others = sum(1 for p in held if p != partition)
        if others < self.shares().get(me, 0):
            return True
        since = self._free_since.get(partition)
        if since is None or self.config.clock.monotonic() - since < self.free_window:
            return False
        self._unbalanced_with = self.members
        return True

    @property
    def free_window(self) -> float:
        """Seconds a partition stays free before a member at its share takes
        it: ``lease_ttl``, and at least three looks of a member waiting for
        it (members with a shorter ``lease_ttl`` than the taker's must not
        take back what they gave before it looked)."""
        return max(self.config.lease_ttl, 3 * WANTING_LOOK)

    def excess(self, held: Iterable[int]) -> list[int]:
        """The partitions of ``held`` to give back: the highest ones beyond
        this member's share, when another member owns fewer than its own
        (someone will take them); else none."""
        if not self.active or self.members == self._unbalanced_with:
            return []
        shares = self.shares()
        owned = sorted(held)
        over = len(owned) - shares.get(self.config.member_id, 0)
        if over <= 0:
            return []
        counts = self._owned()
        me = self.config.member_id
        if not any(counts[m] < share for m, share in shares.items() if m != me):
            return []
        return owned[-over:]

    def wanting(self, held: Iterable[int]) -> bool:
        """Whether this member, holding ``held``, is below its share while a
        partition is free or another member holds more than its own: a
        partition is about to come its way, and it looks more often."""
        if not self.active:
            return False
        shares = self.shares()
        me = self.config.member_id
        if len(set(held)) >= shares.get(me, 0):
            return False
        if len(self.owners) < self.partitions:
            return True
        counts = self._owned()
        return any(counts[m] > share for m, share in shares.items() if m != me)

    async def leave(self) -> None:
        """Release the slot (at a stop): the others' shares grow at once."""
        lease, self._slot_lease, self.slot = self._slot_lease, None, None
        if lease is not None:
            await self.log.release_partition(lease)
