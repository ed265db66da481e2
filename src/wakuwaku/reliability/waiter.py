"""Waiting for an out-of-band job result in Redis (design §10, seed 000).

A job runs somewhere else; when it is done its producer writes a JSON result
under a key and publishes a *nudge* on a channel (:func:`publish_result` does
both in one round trip). The consumer calls :func:`wait_for_result`, which
subscribes to the nudge channel **before** its first read and also polls on a
ticker, because pub/sub delivery is not guaranteed.

Names (``prefix`` defaults to ``wk``; ``step`` may not contain ``:``)::

    result key      wk:result:<job_id>:<step>   a JSON object, with a TTL
    nudge channel   wk:nudge:<job_id>:<step>    message = the status (ignored)

Payload contract (a positive allow-list: only these two statuses exist)::

    {"status": "done", "content": <any JSON, optional>}
    {"status": "error", "message": "<text, optional>", "retryable": <bool, optional>}

Every outcome of every read, whether a nudge or the ticker caused it, goes
through the one function :func:`read_verdict`:

* **not ready** (the key is absent): keep waiting;
* **transient** (Redis unreachable, ``LOADING``, a socket timeout, a
  failover's ``READONLY``): keep waiting with exponential backoff; the
  connection pool reconnects and the subscription is made again;
* **terminal**: return the :class:`Result` (``done``) or raise
  :class:`~wakuwaku.StepError` (``error``, message sanitized) or
  :class:`~wakuwaku.ProtocolError` (anything else); every error that is
  neither transient nor a result is raised as it is, never waited on.

The seed's outage came from treating "the job said it failed" and "I could not
parse it" like "not there yet" while reading destructively: the result was
consumed, and the waiter waited for hours for a key that no longer existed.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

try:
    import redis.asyncio as aioredis
    from redis import exceptions as redis_errors
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "wakuwaku.reliability.waiter needs the Redis client: pip install 'wakuwaku[redis]'"
    ) from exc

import msgspec

from .._clock import SYSTEM_CLOCK, Clock
from .._errors import ConfigError, ProtocolError, ResultError, StepError
from .._json import DuplicateKeyError, decode_strict
from .._sanitize import sanitize
from ._names import DEFAULT_PREFIX, name

__all__ = (
    "Backoff",
    "ProtocolReason",
    "ReadMode",
    "Result",
    "ResultStatus",
    "ResultTimeoutError",
    "Verdict",
    "WaitObserver",
    "delete_result",
    "parse_result",
    "publish_result",
    "read_verdict",
    "result_channel",
    "result_key",
    "wait_for_result",
)

logger = logging.getLogger("wakuwaku.reliability.waiter")

_PUBLISH_LUA = resources.files(__package__).joinpath("result_publish.lua").read_text("utf-8")
_LISTEN_SLICE = 1.0
"""Seconds a pub/sub read waits before the listener looks at ``stopped`` again."""
_ACK_LUA = resources.files(__package__).joinpath("result_ack.lua").read_text("utf-8")

DEFAULT_RESULT_TTL = 86_400.0
"""How long a published result lives when nobody reads it (seconds): one day."""


class ReadMode(enum.StrEnum):
    """How :func:`wait_for_result` reads the result key (seed 000, "destructive read")."""

    NON_DESTRUCTIVE = "non_destructive"
    """``GET``; the key stays until the caller, after committing its own state,
    calls :meth:`Result.ack` (or :func:`delete_result` after an error).
    At-least-once: a crash before the ack lets a later wait see the result
    again, so the caller's commit must be idempotent."""

    DESTRUCTIVE = "destructive"
    """``GETDEL``: the read consumes the result. At-most-once: a crash between
    the read and the caller's commit loses it. Because the payload is gone
    once read, every failure after the read is terminal."""


class ResultStatus(enum.StrEnum):
    """The only statuses a result payload may carry (a positive allow-list)."""

    DONE = "done"
    """The step succeeded; ``content`` holds its output."""

    ERROR = "error"
    """The step failed; ``message`` says why, ``retryable`` whether to retry."""


class ProtocolReason(enum.StrEnum):
    """Stable reason codes of :class:`~wakuwaku.ProtocolError` raised by the waiter."""

    NOT_JSON = "not_json"
    """The payload is not valid UTF-8 JSON."""

    NOT_OBJECT = "not_object"
    """The payload is JSON but not an object."""

    NO_STATUS = "no_status"
    """The object has no ``status`` field (the seed read ``{}`` as success)."""

    STATUS_NOT_STRING = "status_not_string"
    """``status`` is a number, null, a list... (the seed ignored that error)."""

    UNKNOWN_STATUS = "unknown_status"
    """``status`` is a string other than ``done`` or ``error``."""

    MESSAGE_NOT_STRING = "message_not_string"
    """An ``error`` result whose ``message`` is present but not a string."""

    RETRYABLE_NOT_BOOL = "retryable_not_bool"
    """An ``error`` result whose ``retryable`` is present but not a boolean."""

    DUPLICATE_KEY = "duplicate_key"
    """An object in the payload names a key twice (``{"status": "error",
    "status": "done"}``): decoders disagree on which one wins."""

    RESULT_LOST = "result_lost"
    """Destructive mode: the key was seen, but the destructive read came back
    empty or its reply was lost; the result was consumed (by another reader,
    or by a read whose reply never arrived) and waiting would never end."""


class Verdict(enum.Enum):
    """What one read's outcome means for the wait (see :func:`read_verdict`)."""

    NOT_READY = "not_ready"
    """The key is absent: keep waiting for a nudge or the next tick."""

    TRANSIENT = "transient"
    """The store cannot answer now: keep waiting, with backoff."""

    TERMINAL = "terminal"
    """A result or a definite failure: return or raise at once."""


class ResultTimeoutError(ResultError, TimeoutError):
    """No result arrived within the wait's ``timeout``.

    It is both a :class:`~wakuwaku.ResultError` and a stdlib
    :class:`TimeoutError`, so either ``except`` catches it; a circuit
    breaker's default classification counts it as a breaker failure.

    :param timeout: the wait's overall timeout (seconds).
    :param last_error: sanitized text of the last transient error seen, if
        the store was failing when time ran out (else ``None``).
    """

    def __init__(
        self, job_id: str, step: str, timeout: float, last_error: str | None = None
    ) -> None:
        self.job_id = job_id
        self.step = step
        self.timeout = timeout
        self.last_error = last_error
        text = f"no result for job {job_id!r} step {step!r} within {timeout:g} s"
        if last_error is not None:
            text += f" (last transient error: {last_error})"
        super().__init__(text)


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff between reads that met a transient error.

    :param initial: the first delay (seconds).
    :param maximum: the largest delay (seconds); later delays repeat it.
    :param multiplier: how much each delay grows over the previous one.
    :raises ConfigError: when a delay is not positive or ``multiplier < 1``.
    """

    initial: float = 0.05
    maximum: float = 2.0
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        if not (self.initial > 0 and self.maximum >= self.initial and self.multiplier >= 1):
            raise ConfigError(
                f"invalid backoff {self!r}: need 0 < initial <= maximum and multiplier >= 1"
            )

    def delay(self, failures: int) -> float:
        """The delay after the ``failures``-th consecutive failure (1-based), seconds."""
        delay = self.initial
        for _ in range(failures - 1):
            if delay >= self.maximum:
                break
            delay *= self.multiplier
        return min(delay, self.maximum)


class WaitObserver:
    """Hooks into a wait, for metrics, logs and tests; every method here does nothing.

    Subclass it and pass an instance as ``observer=`` to :func:`wait_for_result`.
    The hooks must not raise; an exception from one ends the wait with it.
    """

    async def subscribed(self, job_id: str, step: str) -> None:
        """The nudge subscription is confirmed; the first read has not happened yet."""

    def transient(self, job_id: str, step: str, error: BaseException, delay: float) -> None:
        """A read or the subscription failed transiently; the next try is in ``delay`` seconds."""

    def read(self, job_id: str, step: str, verdict: Verdict) -> None:
        """A read finished with ``verdict``."""


@dataclass(frozen=True, eq=False)
class Result:
    """A ``done`` result, as :func:`wait_for_result` returns it.

    :param job_id: the job the result belongs to.
    :param step: the job's step.
    :param content: the payload's ``content`` (any JSON value; ``None`` when absent).
    :param mode: how it was read; in :attr:`ReadMode.NON_DESTRUCTIVE` the key
        still exists until :meth:`ack`.
    """

    job_id: str
    step: str
    content: Any
    mode: ReadMode
    _redis: aioredis.Redis = field(repr=False)
    _key: str = field(repr=False)
    _raw: bytes = field(repr=False)

    async def ack(self) -> bool:
        """Delete the result after the caller committed its own state (design §10).

        In non-destructive mode it deletes the key only if it still holds the
        payload that was read (one Lua script), so a newer result of the same
        job and step, written since, is kept for its own waiter.

        :returns: ``True`` when the key was deleted; ``False`` when there was
            nothing to delete (destructive mode, or the key changed or expired).
        :raises redis.exceptions.RedisError: when Redis cannot be reached;
            acking again later is safe.
        """
        if self.mode is ReadMode.DESTRUCTIVE:
            return False
        script = self._redis.register_script(_ACK_LUA)
        return bool(await script(keys=[self._key], args=[self._raw]))


def result_key(job_id: str, step: str, *, prefix: str = DEFAULT_PREFIX) -> str:
    """The Redis key holding the result of ``(job_id, step)``: ``<prefix>:result:<job_id>:<step>``.

    :raises ConfigError: for an empty id or step, or a step containing ``:``.
    """
    return name(prefix, "result", job_id, step)


def result_channel(job_id: str, step: str, *, prefix: str = DEFAULT_PREFIX) -> str:
    """The pub/sub channel nudged when the result is written: ``<prefix>:nudge:<job_id>:<step>``.

    :raises ConfigError: for an empty id or step, or a step containing ``:``.
    """
    return name(prefix, "nudge", job_id, step)


def _field_error(job_id: str, step: str, payload: dict[str, Any]) -> StepError:
    message = payload.get("message")
    if message is not None and not isinstance(message, str):
        raise ProtocolError(job_id, step, ProtocolReason.MESSAGE_NOT_STRING)
    retryable = payload.get("retryable")
    if retryable is not None and not isinstance(retryable, bool):
        raise ProtocolError(job_id, step, ProtocolReason.RETRYABLE_NOT_BOOL)
    text = sanitize(message) if message else "(no message)"
    return StepError(job_id, step, text, retryable)


def parse_result(raw: bytes | str, *, job_id: str, step: str) -> Any:
    """Check a result payload against the contract and return its ``content``.

    :param raw: the payload exactly as read from the key.
    :returns: the ``content`` of a ``done`` result (``None`` when absent).
    :raises StepError: for ``{"status": "error"}``; ``message`` is sanitized
        (design §13) and ``retryable`` is the payload's flag (``None`` when absent).
    :raises ProtocolError: for anything else, with a :class:`ProtocolReason`
        code: ``not_json``, ``duplicate_key``, ``not_object``, ``no_status``,
        ``status_not_string``, ``unknown_status``, ``message_not_string``,
        ``retryable_not_bool``. The raw payload is never put into the error.

    Status is a positive allow-list (seed 000): the seed checked only for
    ``"error"`` and reported ``{}``, ``{"status": 123}`` and
    ``{"status": "failed"}`` as success.
    """
    try:
        payload = decode_strict(raw)
    except (msgspec.DecodeError, UnicodeError):
        raise ProtocolError(job_id, step, ProtocolReason.NOT_JSON) from None
    except DuplicateKeyError:
        raise ProtocolError(job_id, step, ProtocolReason.DUPLICATE_KEY) from None
    if not isinstance(payload, dict):
        raise ProtocolError(job_id, step, ProtocolReason.NOT_OBJECT)
    if "status" not in payload:
        raise ProtocolError(job_id, step, ProtocolReason.NO_STATUS)
    status = payload["status"]
    if not isinstance(status, str):
        raise ProtocolError(job_id, step, ProtocolReason.STATUS_NOT_STRING)
    if status == ResultStatus.DONE:
        return payload.get("content")
    if status == ResultStatus.ERROR:
        raise _field_error(job_id, step, payload)
    raise ProtocolError(job_id, step, ProtocolReason.UNKNOWN_STATUS)


# Checked first: these are subclasses of redis' ConnectionError but waiting
# does not fix a wrong password or a missing ACL permission.
_TERMINAL: tuple[type[object], ...] = (
    Result,
    ResultError,
    redis_errors.AuthenticationError,
    redis_errors.AuthorizationError,
)
_TRANSIENT: tuple[type[BaseException], ...] = (
    redis_errors.ConnectionError,  # includes BusyLoadingError (LOADING)
    redis_errors.TimeoutError,
    redis_errors.ReadOnlyError,  # a failover made our node a replica
    redis_errors.TryAgainError,
    redis_errors.ClusterDownError,  # includes MasterDownError
    ConnectionError,
    TimeoutError,
    OSError,
)


def read_verdict(outcome: Result | BaseException | None) -> Verdict:
    """The one predicate every read outcome goes through (design §10, seed 000).

    :param outcome: what a read produced: ``None`` (key absent), a
        :class:`Result`, or the exception it raised.
    :returns: :attr:`Verdict.NOT_READY` for ``None``;
        :attr:`Verdict.TRANSIENT` for connection errors, ``LOADING``,
        timeouts, ``READONLY``/``TRYAGAIN``/``CLUSTERDOWN`` and ``OSError``;
        :attr:`Verdict.TERMINAL` for a result, :class:`~wakuwaku.StepError`,
        :class:`~wakuwaku.ProtocolError`, authentication errors and every
        other exception (an unknown error is raised, never waited on: waiting
        on what we do not understand is how the seed hung for hours).
    """
    if outcome is None:
        return Verdict.NOT_READY
    if isinstance(outcome, _TERMINAL):
        return Verdict.TERMINAL
    if isinstance(outcome, _TRANSIENT):
        return Verdict.TRANSIENT
    return Verdict.TERMINAL


async def publish_result(
    redis: aioredis.Redis,
    job_id: str,
    step: str,
    status: ResultStatus | str,
    *,
    content: Any = None,
    message: str | None = None,
    retryable: bool | None = None,
    ttl: float = DEFAULT_RESULT_TTL,
    prefix: str = DEFAULT_PREFIX,
) -> int:
    """Write a job result and nudge its waiters, in one round trip (one Lua script).

    :param status: ``done`` or ``error``.
    :param content: a ``done`` result's output; any value msgspec encodes as JSON.
    :param message: an ``error`` result's text (the reader sanitizes it).
    :param retryable: an ``error`` result's hint whether a retry can help
        (seed 000: the producer knows, the consumer can only guess).
    :param ttl: how long the result lives if nobody reads it (seconds, > 0).
    :returns: the number of subscribers that received the nudge (0 is fine:
        waiters also poll).
    :raises ConfigError: for an unknown status, ``content`` on an error or
        ``message``/``retryable`` on a success, a non-positive ``ttl``, or an
        invalid id or step.
    :raises TypeError: when ``content`` cannot be encoded as JSON.
    :raises redis.exceptions.RedisError: when Redis fails; the write is atomic,
        so either both the key and the nudge happened or neither did.
    """
    try:
        kind = ResultStatus(status)
    except ValueError:
        raise ConfigError(f"status must be 'done' or 'error', got {status!r}") from None
    if not ttl > 0:
        raise ConfigError(f"ttl must be > 0 seconds, got {ttl!r}")
    payload: dict[str, Any] = {"status": kind.value}
    if kind is ResultStatus.DONE:
        if message is not None or retryable is not None:
            raise ConfigError("a 'done' result takes content, not message or retryable")
        if content is not None:
            payload["content"] = content
    else:
        if content is not None:
            raise ConfigError("an 'error' result takes message and retryable, not content")
        if message is not None:
            payload["message"] = message
        if retryable is not None:
            payload["retryable"] = bool(retryable)
    key = result_key(job_id, step, prefix=prefix)
    channel = result_channel(job_id, step, prefix=prefix)
    body = msgspec.json.encode(payload)
    script = redis.register_script(_PUBLISH_LUA)
    ttl_ms = max(1, math.ceil(ttl * 1000))
    return int(await script(keys=[key], args=[body, ttl_ms, channel, kind.value]))


async def delete_result(
    redis: aioredis.Redis, job_id: str, step: str, *, prefix: str = DEFAULT_PREFIX
) -> bool:
    """Delete a result key unconditionally (non-destructive mode, after an error).

    A :class:`~wakuwaku.StepError` or :class:`~wakuwaku.ProtocolError` raised
    in :attr:`ReadMode.NON_DESTRUCTIVE` leaves the key in place (an operator
    may want to look at it); call this once the failure is recorded, or a
    later wait for the same job and step would see the old failure again.

    :returns: ``True`` when a key was deleted.
    :raises ConfigError: for an invalid id or step.
    :raises redis.exceptions.RedisError: when Redis fails.
    """
    return bool(await redis.delete(result_key(job_id, step, prefix=prefix)))


class _Wait:
    """One wait: a listener task (nudges) and a poller task (reads), raced against a timer."""

    def __init__(
        self,
        redis: aioredis.Redis,
        job_id: str,
        step: str,
        *,
        mode: ReadMode,
        poll_interval: float,
        backoff: Backoff,
        prefix: str,
        clock: Clock,
        observer: WaitObserver,
    ) -> None:
        self.redis = redis
        self.job_id = job_id
        self.step = step
        self.key = result_key(job_id, step, prefix=prefix)
        self.channel = result_channel(job_id, step, prefix=prefix)
        self.mode = mode
        self.poll_interval = poll_interval
        self.backoff = backoff
        self.clock = clock
        self.observer = observer
        self.nudge = asyncio.Event()
        self.ready = asyncio.Event()
        self.last_error: BaseException | None = None  # while the store is failing
        # Destructive mode: a GETDEL was sent on a key we saw, and we never got
        # its answer. If the key is then absent, that read consumed it.
        self.claim_in_doubt = False
        # Set when the wait ends: the loops below stop on it, not only on
        # their task's cancellation. redis-py (8.1 seen) can let a command
        # return normally although its task was cancelled during it; a loop
        # that relied on the cancel then polled on forever, and the wait
        # never returned (not even at its timeout) while its cleanup waited
        # for that loop.
        self.stopped = False

    async def run(self, limit: float) -> Result:
        listener = asyncio.create_task(self._listen(), name=f"wk-nudges:{self.key}")
        poller = asyncio.create_task(self._poll(), name=f"wk-poll:{self.key}")
        timer = asyncio.create_task(self.clock.sleep(limit), name=f"wk-timeout:{self.key}")
        tasks = {listener, poller, timer}
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            if poller in done:
                return poller.result()
            if listener in done:
                listener.result()  # the listener only ends by raising a terminal error
            last = sanitize(self.last_error) if self.last_error is not None else None
            raise ResultTimeoutError(self.job_id, self.step, limit, last)
        finally:
            self.stopped = True
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _listen(self) -> None:
        failures = 0
        while not self.stopped:
            pubsub = self.redis.pubsub()
            # Typed through a variable: older redis-py leaves aclose untyped.
            close: Callable[[], Awaitable[None]] = pubsub.aclose
            try:
                await pubsub.subscribe(self.channel)
                while not self.stopped:
                    # Bounded: a read whose cancellation the client swallowed
                    # must come back to look at ``stopped``.
                    message = await pubsub.get_message(timeout=_LISTEN_SLICE)
                    if message is None:
                        continue
                    if message["type"] == "subscribe":
                        # Confirmed (again, after a reconnect): a nudge may have
                        # been missed while we were not subscribed, so read now.
                        failures = 0
                        if not self.ready.is_set():
                            await self.observer.subscribed(self.job_id, self.step)
                            self.ready.set()
                        self.nudge.set()
                    elif message["type"] == "message":
                        self.nudge.set()
            except Exception as exc:
                if read_verdict(exc) is Verdict.TERMINAL:
                    raise
                failures += 1
                delay = self.backoff.delay(failures)
                self._transient(exc, delay)
                # Pub/sub is down: let the poller start anyway; it does not need us.
                self.ready.set()
                await self.clock.sleep(delay)
            finally:
                with contextlib.suppress(Exception):
                    await close()

    async def _poll(self) -> Result:
        # Normally the subscription is confirmed (or failed) within a round
        # trip; if it hangs, polling starts after one interval anyway.
        await self._sleep_or(self.ready, self.poll_interval)
        failures = 0
        while not self.stopped:
            self.nudge.clear()  # before the read: a nudge during the read wakes us again
            outcome: Result | BaseException | None
            try:
                outcome = await self._read()
            except Exception as exc:  # noqa: BLE001 - read_verdict() decides; unknown ones are raised
                outcome = exc
            verdict = read_verdict(outcome)
            self.observer.read(self.job_id, self.step, verdict)
            if verdict is Verdict.TERMINAL:
                if isinstance(outcome, BaseException):
                    raise outcome
                assert isinstance(outcome, Result)
                return outcome
            if verdict is Verdict.TRANSIENT:
                assert isinstance(outcome, BaseException)
                failures += 1
                delay = self.backoff.delay(failures)
                self._transient(outcome, delay)
                await self._sleep_or(self.nudge, delay)
            else:
                if self.last_error is not None:
                    logger.info("result store reachable again", extra=self._fields())
                    self.last_error = None
                failures = 0
                await self._sleep_or(self.nudge, self.poll_interval)
        raise asyncio.CancelledError  # the wait ended (``stopped``)

    async def _read(self) -> Result | None:
        if self.mode is ReadMode.NON_DESTRUCTIVE:
            raw = await self.redis.get(self.key)
            if raw is None:
                return None
        else:
            raw = await self._read_destructively()
            if raw is None:
                return None
        data = raw.encode("utf-8") if isinstance(raw, str) else raw
        content = parse_result(data, job_id=self.job_id, step=self.step)
        return Result(self.job_id, self.step, content, self.mode, self.redis, self.key, data)

    async def _read_destructively(self) -> bytes | str | None:
        # EXISTS first: a transport error on it loses nothing. Only a key we
        # saw is claimed with GETDEL, so an empty or unanswered GETDEL means
        # the result was consumed and waiting can never end (result_lost).
        if not await self.redis.exists(self.key):
            if self.claim_in_doubt:
                raise ProtocolError(self.job_id, self.step, ProtocolReason.RESULT_LOST)
            return None
        self.claim_in_doubt = True
        raw = await self.redis.getdel(self.key)
        self.claim_in_doubt = False
        if raw is None:
            raise ProtocolError(self.job_id, self.step, ProtocolReason.RESULT_LOST)
        return raw

    async def _sleep_or(self, event: asyncio.Event, seconds: float) -> None:
        """Sleep ``seconds`` on the clock, or less if ``event`` is (or gets) set."""
        if event.is_set():
            return
        sleeper = asyncio.ensure_future(self.clock.sleep(seconds))
        woken = asyncio.ensure_future(event.wait())
        try:
            await asyncio.wait({sleeper, woken}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            woken.cancel()

    def _transient(self, error: BaseException, delay: float) -> None:
        first = self.last_error is None
        self.last_error = error
        if first:
            logger.warning(
                "result store unavailable, waiting: %s",
                sanitize(error),
                extra={**self._fields(), "retry_in": delay},
            )
        self.observer.transient(self.job_id, self.step, error, delay)

    def _fields(self) -> dict[str, object]:
        return {"job_id": self.job_id, "step": self.step, "mode": self.mode.value}


async def wait_for_result(
    redis: aioredis.Redis,
    job_id: str,
    step: str,
    timeout: float,  # noqa: ASYNC109 - measured on the injected Clock, not the loop's time
    *,
    mode: ReadMode = ReadMode.NON_DESTRUCTIVE,
    poll_interval: float = 1.0,
    backoff: Backoff = Backoff(),
    prefix: str = DEFAULT_PREFIX,
    clock: Clock = SYSTEM_CLOCK,
    observer: WaitObserver | None = None,
) -> Result:
    """Wait until the result of ``(job_id, step)`` arrives and return it (design §10).

    Subscribes to the nudge channel, waits for the subscription to be
    confirmed, and only then reads the key, so a result written at any moment
    is either seen by that read or announced by a nudge we receive (a
    subscription that takes longer than ``poll_interval`` to confirm does not
    hold polling back). It reads
    again on every nudge, every ``poll_interval`` and after every
    (re)subscription. Every read outcome goes through :func:`read_verdict`.

    :param redis: a ``redis.asyncio.Redis`` client (``decode_responses``
        either way). Give it a ``socket_timeout``: a read that hangs is only
        cut by ``timeout``.
    :param timeout: the overall time to wait (seconds, > 0), measured on
        ``clock``.
    :param mode: :attr:`ReadMode.NON_DESTRUCTIVE` (default: ``GET``; call
        :meth:`Result.ack` after committing) or :attr:`ReadMode.DESTRUCTIVE`
        (``EXISTS`` then ``GETDEL``; the result is consumed by the read).
    :param poll_interval: time between reads when no nudge comes (seconds, > 0).
    :param backoff: delays between reads after transient errors.
    :param prefix: first segment of the key and channel names.
    :param clock: where time and sleeping come from.
    :param observer: hooks for metrics and tests (:class:`WaitObserver`).
    :returns: the ``done`` :class:`Result`.
    :raises StepError: at once, when the result says ``error`` (message
        sanitized, ``retryable`` from the payload).
    :raises ProtocolError: at once, when the payload breaks the contract
        (:class:`ProtocolReason`), or, in destructive mode, when a result we
        saw was consumed without reaching us (``result_lost``). In
        destructive mode the payload is gone: nothing is waited for after a
        failed parse (seed 000).
    :raises ResultTimeoutError: (a :class:`TimeoutError`) when ``timeout``
        passes first; a wait cut while a ``GETDEL`` is in flight may have
        consumed the result.
    :raises ConfigError: for an invalid id, step, timeout or poll interval.
    :raises redis.exceptions.RedisError: for errors that are not transient
        (authentication, ``WRONGTYPE``...), at once.
    """
    if not timeout > 0:
        raise ConfigError(f"timeout must be > 0 seconds, got {timeout!r}")
    if not poll_interval > 0:
        raise ConfigError(f"poll_interval must be > 0 seconds, got {poll_interval!r}")
    wait = _Wait(
        redis,
        job_id,
        step,
        mode=ReadMode(mode),
        poll_interval=poll_interval,
        backoff=backoff,
        prefix=prefix,
        clock=clock,
        observer=observer if observer is not None else WaitObserver(),
    )
    return await wait.run(timeout)
