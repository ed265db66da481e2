"""The NATS log's fence records: how the server itself refuses a stale lease holder's append.

Owns the fence record protocol of fenced appends (docs/logs.md, "Offsets,
leases and fencing"; :meth:`wakuwaku.logs.nats.NatsLog.append`):

- a **fence record** (member, generation) on ``<stream>.fence.<group>.<topic>.<n>``,
  which a new lease holder writes into every stream its lease ever wrote to
  before it reads anything (:meth:`Fences.fence_targets`), conditioned on
  that subject's last sequence so a lower generation never follows a higher;
- the **targets** of a lease, the streams it wrote to, a list in the bucket
  key ``f.<group>.<topic>.<n>``, to which a lease's first fenced append to a
  stream adds it with a fenced bucket write (:meth:`Fences.last`);
- the **fenced publish**: each record expects the stream's last sequence as
  the writer knows it; a refusal reads the lease's fence record and either
  raises :class:`~wakuwaku.FencedError` or sends again (:meth:`Fences.publish`);
- what this instance remembers of it: per lease and stream the last
  sequence it knows, the streams it registered, the leases whose targets it
  fenced. :meth:`Fences.drop` purges fence records and targets and forgets
  all of it.

May call: :mod:`._jetstream` (stream info and update, direct gets,
publishes, purges), :mod:`._nats_bucket` (the target lists), and the two
calls the log hands it: the record publish and the lease check
(``NatsLog._publish`` and ``NatsLog._check_fence``), which it looks up at
each call.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

import msgspec

from .._errors import FencedError, LogError, LogUnavailableError
from ._base import Lease
from ._jetstream import (
    CAS_ATTEMPTS,
    JetStream,
    NoResponders,
    Publish,
    StreamNotFound,
    WrongLastSequence,
    escape,
)
from ._nats_bucket import StateBucket, encode

__all__ = ("Fences", "fence_subjects")

_FENCE = "fence"  # subjects <partition stream>.fence.<group>.<topic>.<n> hold fence records


def fence_subjects(stream: str) -> str:
    """The subjects of every fence record in ``stream``: ``<stream>.fence.>``."""
    return f"{stream}.{_FENCE}.>"


class _Fence(msgspec.Struct, array_like=True, gc=False):
    """A fence record: from here on, only this generation of the lease may append."""

    member: str
    generation: int


class Fences:
    """The fence records of one NATS log instance, and what it remembers of them.

    :param js: the log's JetStream client.
    :param state: the log's state bucket (the target lists).
    :param publish: publishes one record message (the log's ``_publish``).
    :param check_lease: raises :class:`~wakuwaku.FencedError` when its lease
        is not its partition's current one (the log's ``_check_fence``).
    """

    def __init__(
        self,
        js: JetStream,
        state: StateBucket,
        *,
        publish: Publish,
        check_lease: Callable[[Lease], Awaitable[None]],
    ) -> None:
        self._js = js
        self._state = state
        self._publish = publish
        self._check_lease = check_lease
        # Per lease (group, topic, partition, generation) and target stream, the
        # stream's last sequence as this instance knows it; the targets it knows
        # are registered; the leases whose targets it fenced when it took them.
        self._last: dict[tuple[str, str, int, int, str], int] = {}
        self._registered: set[tuple[str, str, int, str]] = set()
        self._fenced: set[tuple[str, str, int, int]] = set()

    def subject(self, stream: str, lease: Lease) -> str:
        """The subject of ``lease``'s fence records in ``stream``."""
        return f"{stream}.{_FENCE}.{escape(lease.group)}.{escape(lease.topic)}.{lease.partition}"

    # -- fenced appends -----------------------------------------------------

    async def last(self, fence: Lease, stream: str) -> int:
        """``stream``'s last sequence for ``fence``'s next publish; registers the stream.

        Known from this instance's last fenced publish; otherwise the stream
        is registered under the lease, its last sequence read, and only then
        the lease's fence record checked (a takeover after that read moves
        the stream past it, so the publish is refused and checks again).

        :raises FencedError: when a newer generation fenced the stream or
            the lease is stale at registration.
        :raises NoResponders: when the stream is not there.
        :raises LogUnavailableError: when the bucket stays too busy to register it.
        """
        key = (fence.group, fence.topic, fence.partition, fence.generation, stream)
        last = self._last.get(key)
        if last is None:
            await self._register(fence, stream)
            last = await self._js.last_sequence(stream)
            await self._check_record(stream, fence)
            self._last[key] = last
        return last

    async def publish(
        self, stream: str, payload: bytes, fence: Lease, last: int, msg_id: str
    ) -> int:
        """Publish one record expecting ``last`` as the stream's last sequence; its sequence.

        On a "wrong last sequence" refusal the new last sequence comes from
        the refusal, then the lease's fence record is read (in that order, so
        a takeover between the two is caught by the next refusal). A publish
        whose answer was lost is sent again with the same ``Nats-Msg-Id``;
        servers from 2.10 check the expected sequence before deduplicating,
        so the refusal is checked for being this very message, stored.

        :raises FencedError: when a newer generation fenced the stream.
        :raises NoResponders: when the stream is not there.
        :raises LogUnavailableError: when no answer comes within the log's
            timeout, or the stream keeps moving for 64 attempts.
        :raises LogError: when the server refuses the publish for another reason.
        """
        key = (fence.group, fence.topic, fence.partition, fence.generation, stream)
        lost: list[int] = []  # expected sequences of publishes whose answer was lost
        deadline = time.monotonic() + self._js.timeout
        for _ in range(CAS_ATTEMPTS):
            headers = {"Nats-Msg-Id": msg_id, "Nats-Expected-Last-Sequence": str(last)}
            try:
                seq = await self._publish(stream, payload, headers)
            except NoResponders:
                raise
            except WrongLastSequence as refused:
                moved = refused.last
            except LogUnavailableError:
                if time.monotonic() >= deadline:
                    raise
                lost.append(last)
                await asyncio.sleep(0.05)
                continue
            else:
                self._last[key] = seq
                return seq
            for expected in lost:
                stored = await self._js.direct_get(stream, {"seq": expected + 1})
                if stored is not None and stored.headers.get("Nats-Msg-Id") == msg_id:
                    self._last[key] = expected + 1
                    return expected + 1
            last = moved if moved is not None else await self._js.last_sequence(stream)
            await self._check_record(stream, fence)
        raise LogUnavailableError(
            f"NATS log {self._js.url}: {stream} kept moving under a fenced append "
            f"({CAS_ATTEMPTS} attempts)"
        )

    async def _register(self, fence: Lease, stream: str) -> None:
        """Note ``stream`` as a target of ``fence``'s lease (key ``f.<group>.<topic>.<n>``).

        Written like a fenced commit (the bucket's last sequence expected,
        the lease checked in between), so a stream registered is known to
        every later owner, which fences it when it takes the lease.
        """
        mark = (fence.group, fence.topic, fence.partition, stream)
        if mark in self._registered:
            return
        subject = self._state.key("f", fence.group, fence.topic, fence.partition)
        await self._state.ensure()
        for _ in range(CAS_ATTEMPTS):
            last = await self._state.last_sequence()
            streams = await self._targets(fence)
            if stream in streams:
                break
            await self._check_lease(fence)
            if await self._state.put(subject, encode(sorted([*streams, stream])), stream_last=last):
                break
        else:
            raise LogUnavailableError(
                f"NATS log {self._js.url}: the bucket {self._state.name} stayed too busy to "
                f"register {stream} under {fence.group}/{fence.topic}/{fence.partition}"
            )
        self._registered.add(mark)

    async def _targets(self, lease: Lease) -> list[str]:
        """The streams registered under ``lease``'s partition."""
        found = await self._state.get(
            self._state.key("f", lease.group, lease.topic, lease.partition)
        )
        return [] if found is None else msgspec.msgpack.decode(found[0], type=list[str])

    async def _held(self, stream: str, lease: Lease) -> tuple[int, int] | None:
        """The generation in ``lease``'s last fence record in ``stream``, and its sequence."""
        found = await self._js.direct_get(stream, {"last_by_subj": self.subject(stream, lease)})
        if found is None:
            return None
        return msgspec.msgpack.decode(found.data, type=_Fence).generation, found.seq

    async def _check_record(self, stream: str, fence: Lease) -> None:
        """:raises FencedError: when a newer generation of the lease fenced ``stream``."""
        held = await self._held(stream, fence)
        if held is not None and held[0] > fence.generation:
            raise FencedError(fence.group, fence.topic, fence.partition, fence.generation)

    # -- taking a lease -----------------------------------------------------

    async def fence_targets(self, lease: Lease) -> bool:
        """Write ``lease``'s fence record into every stream registered under it.

        Run when a member takes a lease, before the engine reads anything:
        from then on a stale writer's publish to those streams is refused.
        Streams that are gone are skipped. False when a newer generation
        already fenced one of them (the lease was taken over meanwhile).
        """
        mark = (lease.group, lease.topic, lease.partition, lease.generation)
        if mark in self._fenced:
            return True
        for stream in await self._targets(lease):
            try:
                await self._write(stream, lease)
            except FencedError:
                return False
            except NoResponders:
                continue  # the stream was deleted: nothing to fence
        self._fenced.add(mark)
        return True

    async def _write(self, stream: str, lease: Lease) -> None:
        """Write ``lease``'s fence record into ``stream`` unless it is there.

        Conditioned with ``Nats-Expected-Last-Subject-Sequence`` on the
        lease's fence subject, so a lower generation never follows a higher.

        :raises FencedError: when a higher generation is there.
        """
        subject = self.subject(stream, lease)
        record = encode(_Fence(lease.member, lease.generation))
        for _ in range(CAS_ATTEMPTS):
            held = await self._held(stream, lease)
            revision = 0
            if held is not None:
                if held[0] > lease.generation:
                    raise FencedError(lease.group, lease.topic, lease.partition, lease.generation)
                if held[0] == lease.generation:
                    return
                revision = held[1]
            headers = {"Nats-Expected-Last-Subject-Sequence": str(revision)}
            try:
                await self._js.publish(subject, record, headers, what=f"fencing {stream} failed")
            except NoResponders:
                # A stream made before fence subjects existed: add them once.
                await self._add_subjects(stream)
                continue
            except WrongLastSequence:
                continue
            return
        raise LogUnavailableError(f"NATS log {self._js.url}: the fence of {stream} kept changing")

    async def _add_subjects(self, stream: str) -> None:
        """Add ``<stream>.fence.>`` to a stream made without it.

        :raises NoResponders: when the stream is not there.
        """
        info = await self._js.stream_info(stream)
        if info is None:
            raise NoResponders(f"NATS log {self._js.url}: stream {stream} is not there")
        config = info["config"]
        wanted = fence_subjects(stream)
        if wanted in config["subjects"]:
            raise LogError(f"NATS log {self._js.url}: nothing answered on {wanted}")
        config["subjects"] = [*config["subjects"], wanted]
        await self._js.update_stream(config, what=f"cannot add fence subjects to {stream}")

    # -- deleting -----------------------------------------------------------

    async def drop(self, *, group: str | None = None, topic: str | None = None) -> None:
        """Purge the fence records and target lists of ``group``'s leases on ``topic``.

        None stands for any group or topic. The leases go too (the caller
        purges them), and a lease made again starts from generation 1: the
        old generations' fence records would refuse it. Everything this
        instance remembers of fences is forgotten.

        :raises LogError: when the server refuses a purge.
        """
        subject = self._state.keys("f", group=group, topic=topic)
        head = f"$KV.{self._state.name}.f."
        for key, data in await self._state.scan(subject):
            lease = key.removeprefix(head)
            for stream in msgspec.msgpack.decode(data, type=list[str]):
                with contextlib.suppress(StreamNotFound):
                    await self._js.purge(stream, {"filter": f"{stream}.{_FENCE}.{lease}"})
        await self._state.purge(subject)
        self._last.clear()
        self._registered.clear()
        self._fenced.clear()
