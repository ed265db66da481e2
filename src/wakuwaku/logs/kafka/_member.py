"""One Kafka consumer-group member: a consumer that joins its group and never fetches.

Owns the member's librdkafka consumer and the thread that polls it
(heartbeats and rebalance callbacks run there, and so does every other call
on that consumer: :meth:`Member.call`), the member's subscription, its
group metadata for KIP-447 transactions, and its transactional producer's
slot (:attr:`Member.txn`, :attr:`Member.unsettled`, changed by
:mod:`._transactions` only). Its partitions are paused as soon as they are
assigned: records are read by the log's own assign-only consumers
(:mod:`._read`).

The rebalance callbacks tell the member's :class:`~._ownership.Assignment`
what the coordinator decided; the ownership itself (owned, revoking,
stopped, gone) lives there. On a revoke the callback waits, at most
``revoke_timeout``, for the engine to let the revoking partitions go
before the coordinator is answered; on a lost assignment they are gone at
once and every write under them refused.

May call: :mod:`._cluster` (settings, names, calls in threads),
:mod:`._ownership`. Called by the log (:mod:`._log`), the commits made
through its consumer (:mod:`._offsets`) and the transactions
(:mod:`._transactions`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from confluent_kafka import Consumer, KafkaException, Producer

from ..._errors import LogError, LogUnavailableError
from ._cluster import Cluster
from ._ownership import Assignment

if TYPE_CHECKING:
    from ._transactions import Unsettled

__all__ = ("Member",)

logger = logging.getLogger("wakuwaku.logs.kafka")

_T = TypeVar("_T")

_METADATA_REFRESH_MS = 5000


class Member:
    """One consumer-group member of a :class:`~wakuwaku.logs.kafka.KafkaLog`.

    :param cluster: the log's shared settings and calls.
    :param group: the group (without the prefix).
    :param member: the member id (its client id is ``wakuwaku-<member>``).
    :param session_timeout: the group session timeout (seconds).
    :param revoke_timeout: how long a revoke waits for the engine (seconds).
    """

    def __init__(
        self,
        cluster: Cluster,
        group: str,
        member: str,
        *,
        session_timeout: float,
        revoke_timeout: float,
    ) -> None:
        self.cluster = cluster
        self.group = group
        self.member = member
        self.revoke_timeout = revoke_timeout
        self.topics: set[str] = set()
        self._subscribing = threading.Lock()
        self.assignment = Assignment()
        self.assigned_once = threading.Event()
        self.closing = False
        self.txn: Producer | None = None
        # A store whose commit_transaction gave no answer: its outcome is
        # known only once the producer's commit is resumed (Transactions.settle).
        self.unsettled: Unsettled | None = None
        # The group metadata (generation, member id) for KIP-447 transactions.
        # Read in the poll thread only: consumer_group_metadata() called from
        # another thread while poll() runs blocks (librdkafka serves it there).
        self.metadata: Any = None
        self.calls: list[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = []
        self.txn_lock = asyncio.Lock()
        self.joining = asyncio.Lock()
        self.loop = asyncio.get_running_loop()
        self.changed = asyncio.Event()  # replaced at each change: waiters keep theirs
        self.ready: set[str] = set()  # topics whose first assignment was waited for
        self.init_task: asyncio.Future[None] | None = None
        conf = {
            **cluster.common,
            "group.id": cluster.name(group),
            "client.id": f"wakuwaku-{member}",
            "partition.assignment.strategy": "cooperative-sticky",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "session.timeout.ms": int(session_timeout * 1000),
            "heartbeat.interval.ms": max(100, int(session_timeout * 1000 / 5)),
            "isolation.level": "read_committed",
            # A subscription that grows while librdkafka has no usable broker
            # connection (it reconnects) marks the new topic "not available"
            # and rejoins only at the next periodic metadata refresh, 300 s by
            # default: the flights demo stalled for 300 s that way.
            "topic.metadata.refresh.interval.ms": _METADATA_REFRESH_MS,
        }
        self.consumer = Consumer(conf)
        self.thread = threading.Thread(
            target=self._poll, name=f"wakuwaku-kafka-member-{member}", daemon=True
        )
        self.started = False

    # -- the poll thread --------------------------------------------------

    def _poll(self) -> None:
        while not self.closing:
            self._serve_calls()
            try:
                self.consumer.poll(0.01)
            except RuntimeError:  # closed under us
                return
            except KafkaException as exc:
                logger.warning("Kafka group %s member poll failed: %s", self.group, exc)
        self._serve_calls()

    def _serve_calls(self) -> None:
        """Run the consumer calls other threads asked for, here: a synchronous
        commit made from another thread while this one polls waits for a
        reply that this thread's poll() takes (and never delivers)."""
        while self.calls:
            fn, future = self.calls.pop(0)
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                future.set_exception(exc)

    def call(self, fn: Callable[[], _T]) -> concurrent.futures.Future[_T]:
        """Run ``fn`` (a call on :attr:`consumer`) in the poll thread.

        The future fails with :class:`LogError` when the member is not polling.
        """
        future: concurrent.futures.Future[_T] = concurrent.futures.Future()
        if self.closing or not self.started:
            future.set_exception(LogError(f"Kafka group {self.group} member is not polling"))
            return future
        self.calls.append((fn, future))
        return future

    def _bump(self) -> None:
        """Wake everything waiting for an assignment change (in the loop's thread)."""
        old, self.changed = self.changed, asyncio.Event()
        old.set()

    def _changed(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            self.loop.call_soon_threadsafe(self._bump)

    def _keys(self, partitions: list[Any]) -> list[tuple[str, int]]:
        return [(self.cluster.plain(tp.topic), tp.partition) for tp in partitions]

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        self.metadata = consumer.consumer_group_metadata()
        self.assignment.assign(self._keys(partitions))
        consumer.incremental_assign(partitions)
        if partitions:
            consumer.pause(partitions)
        self.assigned_once.set()
        self._changed()

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        self.metadata = consumer.consumer_group_metadata()
        waits = self.assignment.revoke(self._keys(partitions), closing=self.closing)
        self._changed()
        deadline = time.monotonic() + self.revoke_timeout
        for done in waits:
            while not done.is_set() and time.monotonic() < deadline:
                self._serve_calls()  # the worker's last stores need this thread
                done.wait(0.01)
        self.assignment.drop(self._keys(partitions))
        with contextlib.suppress(KafkaException, RuntimeError):
            consumer.incremental_unassign(partitions)

    def _on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        self.assignment.drop(self._keys(partitions))
        self._changed()
        logger.warning(
            "Kafka group %s: partitions lost (session timed out); nothing is stored for them",
            self.group,
        )
        with contextlib.suppress(KafkaException, RuntimeError):
            consumer.incremental_unassign(partitions)

    # -- called from the log -------------------------------------------------

    async def join(self, topic: str) -> bool:
        """Subscribe to ``topic`` (the first call for it) and wait, bounded by
        the log's ``timeout``, for the group's first assignment since.

        One subscription change at a time; the others wait for it.

        :returns: True when this call subscribed the member to ``topic``.
        :raises LogUnavailableError: when the group assigns nothing in time.
        """
        async with self.joining:
            if topic in self.ready:
                return False
            timeout = self.cluster.timeout
            await self.cluster.run("join group", lambda: self._subscribe(topic))
            assigned = await self.cluster.run(
                "join group", lambda: self.assigned_once.wait(timeout)
            )
            if not assigned:
                raise LogUnavailableError(
                    f"Kafka log {self.cluster.url}: group {self.group!r} gave member "
                    f"{self.member!r} no assignment for {topic!r} within {timeout} s"
                )
            self.ready.add(topic)
            return True

    def _subscribe(self, topic: str) -> None:
        """Add ``topic`` to the subscription (in a thread)."""
        with self._subscribing:
            if topic in self.topics:
                return
            self.topics.add(topic)
            names = [self.cluster.name(t) for t in sorted(self.topics)]
        self.assigned_once.clear()

        def subscribe() -> None:
            self.consumer.subscribe(
                names, on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
            )

        if not self.started:
            subscribe()
            self.started = True
            self.thread.start()
        else:  # the poll thread owns the consumer once it runs
            self.call(subscribe).result(self.cluster.timeout)

    def close(self) -> None:
        """Leave the group and stop polling (blocking: in a thread)."""
        self.closing = True
        self.assignment.end()
        if self.started:
            self.thread.join(5.0)
        with contextlib.suppress(KafkaException, RuntimeError):
            self.consumer.close()
        if self.txn is not None:
            with contextlib.suppress(KafkaException):
                self.txn.flush(1.0)
