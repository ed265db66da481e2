"""The Kafka log's transactional store: a batch's records and offsets in one Kafka transaction.

Owns the transactions of each group member's transactional producer
(KIP-447: the records, then the offsets through
``send_offsets_to_transaction`` with the member's group metadata, then the
commit; the broker refuses a member whose generation is stale), the wait
until ``read_committed`` readers see what a store wrote, and the two ways a
transaction ends without an answer:

- a commit that timed out (the broker went away under it) may have gone
  through: the store is *unsettled* (:class:`Unsettled`) and the next store
  of the member first learns its outcome (:meth:`Transactions.settle`), so
  a store sent again after its commit went through is not written twice;
- librdkafka's ``send_offsets_to_transaction`` can block past its timeout
  while the group coordinator is down: every transaction runs on a daemon
  thread of its own (:func:`in_daemon_thread`) and is waited for a bounded
  time; a wedged one is abandoned for a new producer (or, wedged in its
  commit, left unsettled until its call returns).

It changes a member's :attr:`~._member.Member.txn` and
:attr:`~._member.Member.unsettled` only.

May call: :mod:`._cluster` (settings, names, calls in threads, errors),
:func:`._append.to_message`, and the log for the fence owner
(``_fence_owner``) and the member's producer (``_transactional``: the log
makes its clients, and a test hands it a scripted one there). Called by
the log (:mod:`._log`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from confluent_kafka import IsolationLevel, KafkaError, KafkaException, Producer, TopicPartition

from ..._clock import BLOCKING_CALLS
from ..._errors import FencedError, LogError, LogUnavailableError
from .._base import BatchWrite, Lease, OutgoingRecord, check_commit, check_partition, check_record
from ._append import to_message
from ._cluster import FENCED_CODES, Cluster, OffsetSpec, code, unanswered
from ._member import Member

if TYPE_CHECKING:
    from ._log import KafkaLog

__all__ = (
    "TXN_CALLS",
    "Progress",
    "Transactions",
    "Unsettled",
    "in_daemon_thread",
    "transactional_producer",
)

logger = logging.getLogger("wakuwaku.logs.kafka")

_T = TypeVar("_T")

Batches = list[tuple[str, int, Sequence[OutgoingRecord]]]
"""A store's records: (topic, partition, records) per partition written."""
Commits = list[tuple[str, int, int]]
"""A store's offsets: (topic, partition, offset)."""

TXN_CALLS = 4
"""Blocking calls in one transactional store, each bounded by the log's
timeout (``init_transactions``, the settling ``commit_transaction``,
``send_offsets_to_transaction``, ``commit_transaction``): a store that has
not returned after that many timeouts (plus a second) is wedged."""


@dataclass(frozen=True)
class Unsettled:
    """A transactional store whose commit got no answer (see :meth:`Transactions.settle`).

    ``wedged`` is set when the commit call itself has not returned (its
    thread is still inside librdkafka): its outcome is known once it does.
    """

    batches: Batches
    commits: Commits
    results: list[list[int]]  # filled in by delivery reports, -1 until delivered
    wedged: concurrent.futures.Future[list[list[int]]] | None = None


@dataclass
class Progress:
    """How far one transaction got (written by its thread, read by the store
    that gave up waiting for it)."""

    producer: Any = None
    committing: bool = False
    results: list[list[int]] = field(default_factory=list)


def in_daemon_thread(name: str, fn: Callable[[], _T]) -> concurrent.futures.Future[_T]:
    """Run ``fn`` on a new daemon thread; its outcome lands in the future.

    For a client call that may outlive its own timeout: a wedged call on the
    event loop's default executor kept the executor's shutdown, and so the
    process's exit, waiting for ever; a daemon thread is left behind instead.
    """
    future: concurrent.futures.Future[_T] = concurrent.futures.Future()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the waiter, whatever it is
            future.set_exception(exc)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future


def transactional_producer(cluster: Cluster, member: Member) -> Any:
    """The member's transactional producer, made and initialised at its
    first use (in a thread; ``init_transactions`` bounded by ``timeout``).

    :raises KafkaException: when ``init_transactions`` fails.
    """
    if member.txn is None:
        producer = Producer(
            {
                **cluster.common,
                # One id per (group, member): a restarted member with the same
                # member id aborts its dead predecessor's open transaction at
                # init_transactions instead of every read_committed reader of
                # its partitions waiting for transaction.timeout.ms.
                "transactional.id": f"{cluster.name(member.group)}-{member.member}",
                "transaction.timeout.ms": max(20_000, int(cluster.timeout * 2000)),
                "message.max.bytes": 64 * 1024 * 1024,
                "linger.ms": 0,
            }
        )
        producer.init_transactions(cluster.timeout)
        member.txn = producer
    return member.txn


class Transactions:
    """The transactional stores of one log's members.

    :param log: the log, asked for the fence owner and a member's producer.
    :param cluster: the log's shared settings and calls.
    """

    def __init__(self, log: KafkaLog, cluster: Cluster) -> None:
        self.log = log
        self.cluster = cluster

    async def start(self, member: Member) -> None:
        """Make the member's producer now, not at its first store:
        ``init_transactions`` aborts the open transaction a killed
        predecessor with the same member id left, which otherwise holds
        ``read_committed`` readers back. A failure is left to the first store."""
        async with member.txn_lock:
            if member.txn is None and not member.closing:
                with contextlib.suppress(LogError):  # the first store tries again
                    await self.cluster.run(
                        "init transactions", lambda: self.log._transactional(member)
                    )

    async def store(self, write: BatchWrite, fence: Lease) -> list[list[int]]:
        """Write ``write`` (records to append, and offsets) in one transaction
        of the fence owner's producer; return once ``read_committed``
        readers see the records.

        :returns: the offsets of the records, per append of ``write``.
        :raises FencedError: when the fence's member no longer owns its
            partition, or the broker refuses its generation (nothing visible).
        :raises ConfigError: for a record over its topic's limit (nothing written).
        :raises LogUnavailableError: when the transaction or its visibility
            has no answer in time (see :meth:`transact`, :meth:`wait_visible`).
        """
        if fence.group != write.group:
            raise FencedError(fence.group, fence.topic, fence.partition, fence.generation)
        member = self.log._fence_owner(fence)
        batches: Batches = []
        for topic, partition, records in write.appends:
            check_partition(topic, partition, await self.cluster.partitions(topic))
            checked = [(check_record(h, b), b) for h, b in records]
            await self.cluster.check_size(topic, partition, checked)
            batches.append((topic, partition, checked))
        offsets = []
        for topic, partition, offset in write.commits:
            offset = check_commit(write.group, topic, partition, offset)
            check_partition(topic, partition, await self.cluster.partitions(topic))
            offsets.append(TopicPartition(self.cluster.name(topic), partition, offset))
        async with member.txn_lock:
            self.log._fence_owner(fence)
            try:
                results = await self.transact(member, batches, offsets, list(write.commits))
            except LogError as exc:
                if exc.__cause__ is not None and code(exc.__cause__) in FENCED_CODES:
                    raise FencedError(
                        fence.group, fence.topic, fence.partition, fence.generation
                    ) from exc
                raise
        ends: dict[tuple[str, int], int] = {}
        for (topic, partition, _), written in zip(batches, results, strict=True):
            if written:
                key = (topic, partition)
                ends[key] = max(ends.get(key, 0), max(written) + 1)
        await self.wait_visible(ends)
        return results

    async def wait_visible(self, ends: Mapping[tuple[str, int], int]) -> None:
        """Return once ``read_committed`` readers see every record below ``ends``
        (per topic and partition: the offset after the last record written).

        Kafka's ``commit_transaction`` returns once the transaction coordinator
        has logged the commit, *before* the commit markers reach the data
        partitions; until they do, the partitions' last stable offset stays
        below the transaction's records, and a ``read_committed`` read (or
        ``end_offsets``) does not see them. A store that returned then let
        the engine read its pending retry records back right after it, find
        nothing, and resolve the keys: their events were lost. So a store
        returns only after the last stable offset (``ListOffsets``,
        ``read_committed``) has passed what it wrote: one more round trip per
        transactional store, usually answered at once.

        :raises LogUnavailableError: when the records stay invisible for
            ``timeout`` seconds (the transaction committed: a caller that
            stores again writes its records twice, never loses them).
        """
        if not ends:
            return
        cluster = self.cluster
        request = {TopicPartition(cluster.name(t), p): OffsetSpec.latest() for t, p in ends}

        def ask() -> dict[tuple[str, int], int]:
            futures = cluster.admin().list_offsets(
                request, isolation_level=IsolationLevel.READ_COMMITTED
            )
            return {
                (cluster.plain(tp.topic), tp.partition): cluster.future("list offsets", f).offset
                for tp, f in futures.items()
            }

        deadline = time.monotonic() + cluster.timeout
        pause = 0.001
        while True:
            try:
                stable = await cluster.run("wait for the commit markers", ask)
                behind = {k: v for k, v in ends.items() if stable.get(k, -1) < v}
            except LogUnavailableError:
                behind = dict(ends)
            if not behind:
                return
            if time.monotonic() > deadline:
                where = ", ".join(
                    f"{t}/{p} (through offset {o - 1})" for (t, p), o in behind.items()
                )
                raise LogUnavailableError(
                    f"Kafka log {cluster.url} is unavailable (store): the transaction committed "
                    f"but its records in {where} are not visible to read_committed readers "
                    f"after {cluster.timeout} s (the commit markers are not written)"
                )
            await BLOCKING_CALLS.pause(pause)
            pause = min(pause * 2, 0.05)

    async def transact(
        self, member: Member, batches: Batches, offsets: list[Any], commits: Commits
    ) -> list[list[int]]:
        """:meth:`transaction` on a thread of its own, waited for at most
        :data:`TXN_CALLS` timeouts (plus a second).

        librdkafka's ``send_offsets_to_transaction`` can block past its
        timeout while the group coordinator is down (librdkafka issue 5456,
        open in 2.14): a store waited for ever, and with it the consumer's
        stop and the process's exit (the fault suite hung that way in CI).
        A wedged transaction that had not started its commit is abandoned:
        the member's next store makes a new producer with the same
        ``transactional.id``, which fences the wedged one and aborts its
        transaction. One wedged in its commit leaves the store *unsettled*:
        every later store fails until that call has returned and its outcome
        is known (see :meth:`settle`).

        :raises LogError: when the log is closed.
        :raises LogUnavailableError: when the transaction has not returned
            in time; what :meth:`Cluster.run <._cluster.Cluster.run>` raises
            for its errors otherwise.
        """
        cluster = self.cluster
        if cluster.closed:
            raise LogError(f"the Kafka log {cluster.url} is closed")
        progress = Progress()
        future = in_daemon_thread(
            f"wakuwaku-kafka-txn-{member.member}",
            lambda: self.transaction(member, batches, offsets, commits, progress),
        )
        bound = TXN_CALLS * cluster.timeout + 1.0
        waiter = asyncio.wrap_future(future)
        try:
            with BLOCKING_CALLS.track():
                await asyncio.wait({waiter}, timeout=bound)
        finally:
            if not waiter.done():  # its outcome, when it comes, is read by settle or no one
                waiter.add_done_callback(lambda w: w.cancelled() or w.exception())
        if not waiter.done():
            if progress.committing:
                member.unsettled = Unsettled(batches, commits, progress.results, future)
            elif progress.producer is not None and member.txn is progress.producer:
                member.txn = None
            logger.warning(
                "Kafka log %s: a transaction of group %s has not returned after %.1f s "
                "(librdkafka did not keep its timeout); %s",
                cluster.url,
                member.group,
                bound,
                "its commit's outcome is awaited before the next store"
                if progress.committing
                else "its producer is replaced",
            )
            raise LogUnavailableError(
                f"Kafka log {cluster.url} is unavailable (store): the transaction did not "
                f"answer within {bound:.1f} s"
            )
        try:
            return waiter.result()
        except KafkaException as exc:
            raise cluster.error("store", exc) from exc

    def transaction(
        self,
        member: Member,
        batches: Batches,
        offsets: list[Any],
        commits: Commits,
        progress: Progress | None = None,
    ) -> list[list[int]]:
        """One transaction (in a thread): produce, send offsets, commit; abort on failure.

        A commit that gets no answer (the broker went away under it) may
        still have gone through: its store is *unsettled*. The producer is
        kept and the next store first settles it (:meth:`settle`); when
        that next store is the same write sent again (the engine retries a
        failed store as it was), and the earlier commit went through, its
        offsets are returned and nothing is written twice. Without this, a
        dead letter whose commit answered late was stored again by the
        retry: a record with two dead letters.

        :raises KafkaException: for a refused or unanswered transaction.
        """
        progress = Progress() if progress is None else progress
        producer = progress.producer = self.log._transactional(member)
        settled = self.settle(member, producer, batches, commits)
        if settled is not None:
            return settled
        results: list[list[int]] = [[-1] * len(records) for _, _, records in batches]
        progress.results = results
        errors: list[Any] = []
        committing = False
        try:
            producer.begin_transaction()
            for n, (topic, partition, records) in enumerate(batches):
                for i, (headers, body) in enumerate(records):
                    key, rest = to_message(headers)

                    def report(err: Any, msg: Any, n: int = n, i: int = i) -> None:
                        if err is not None:
                            errors.append(err)
                        else:
                            results[n][i] = msg.offset()

                    producer.produce(
                        self.cluster.name(topic),
                        bytes(body),
                        key,
                        partition,
                        on_delivery=report,
                        headers=rest,
                    )
            if offsets:
                producer.send_offsets_to_transaction(offsets, member.metadata, self.cluster.timeout)
            committing = progress.committing = True
            producer.commit_transaction(self.cluster.timeout)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if member.txn is not producer:
                pass  # wedged and replaced meanwhile: the new producer fenced this one
            elif committing and unanswered(err):
                member.unsettled = Unsettled(batches, commits, results)
            else:
                self._abandon(member, producer, err)
            raise
        if errors:
            raise KafkaException(errors[0])
        return results

    def settle(
        self, member: Member, producer: Any, batches: Batches, commits: Commits
    ) -> list[list[int]] | None:
        """Learn how the member's unsettled store ended, before a new one.

        ``commit_transaction`` is asked again: librdkafka resumes the commit
        in flight and answers once its outcome is known. Committed: when
        ``batches`` and ``commits`` are that store's own (sent again), its
        offsets are returned and the caller writes nothing; otherwise None,
        and the caller's transaction goes ahead. Not committed (the broker
        wants it aborted): it is aborted, and None.

        :raises KafkaException: while the outcome is still unknown (no
            answer, or a wedged commit not returned yet), so the caller fails
            the same way and tries again later.
        """
        pending = member.unsettled
        if pending is None:
            return None
        if pending.wedged is not None:
            if not pending.wedged.done():
                raise KafkaException(
                    KafkaError(
                        KafkaError._TIMED_OUT,
                        "the previous store's commit_transaction has not returned",
                        retriable=True,
                    )
                )
            if member.unsettled is not pending:  # its thread settled it meanwhile
                return self.settle(member, producer, batches, commits)
            member.unsettled = None
            if pending.wedged.exception() is not None:
                # It failed: its thread aborted it, or dropped the producer
                # (then this store fails once and the next makes a new one).
                if member.txn is not producer:
                    raise KafkaException(
                        KafkaError(
                            KafkaError._TIMED_OUT, "the producer was replaced", retriable=True
                        )
                    )
                return None
            if pending.batches == batches and pending.commits == commits:
                return pending.wedged.result()
            return None
        try:
            producer.commit_transaction(self.cluster.timeout)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if unanswered(err):
                raise
            member.unsettled = None
            self._abandon(member, producer, err)
            return None
        member.unsettled = None
        done = all(offset >= 0 for offsets in pending.results for offset in offsets)
        if done and pending.batches == batches and pending.commits == commits:
            return pending.results
        return None

    def _abandon(self, member: Member, producer: Any, err: object) -> None:
        """End a transaction that did not commit: abort it, or drop the producer.

        After a fatal error the producer is unusable. An abort that did not
        finish (the broker went away under it) stays in progress inside
        librdkafka, and every later call of that producer failed with
        "Conflicting abort_transaction API call is already in progress": the
        member never stored again. In both cases a new producer with the same
        ``transactional.id`` takes over at the next store; its
        ``init_transactions`` fences this one and aborts the open transaction.
        """
        if isinstance(err, KafkaError) and err.fatal():
            if member.txn is producer:
                member.txn = None
            return
        try:
            producer.abort_transaction(self.cluster.timeout)
        except KafkaException:
            if member.txn is producer:
                member.txn = None
