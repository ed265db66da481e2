"""A circuit breaker that tells a sick endpoint from a failed job (design §12, seed 000).

States::

    CLOSED --(failure_threshold consecutive breaker failures)--> OPEN
    OPEN --(open_for seconds)--> HALF_OPEN
    HALF_OPEN --(a probe succeeds, or fails in the domain)--> CLOSED
    HALF_OPEN --(a probe has a breaker failure)--> OPEN

A breaker answers one question: "is this endpoint sick?". An explicit failure
*answer* (the job failed, the data is bad) proves the endpoint is healthy: it
took the request, did the work and replied. So every call ends in one of four
outcomes (:class:`CallOutcome`):

* **success**: closes a half-open breaker; resets the failure count;
* **failure** (transport, protocol, timeout): counts toward opening; reopens a
  half-open breaker;
* **domain failure** (``StepError``, a handler's own ``Retryable`` or
  ``Unrecoverable``): not a breaker failure. A half-open probe that ends this
  way is released *as a success* (:meth:`CircuitBreaker.release_probe_as_success`);
  in the closed state it changes nothing. The seed skipped both the failure
  and the success call, so the probe slot was never freed and the breaker
  stayed half-open, rejecting every call, until the process restarted;
* **cancellation**: proves nothing about the endpoint; it touches no state
  and frees the call's probe slot.

Every call takes a :class:`Permit` that remembers the breaker's *generation*
(a number that grows at every state change). An outcome whose permit comes
from an earlier generation is ignored: a slow call started while the breaker
was closed cannot reopen or close a later half-open period, and it never
releases a probe it does not own.

Half-open allows ``half_open_probes`` calls at a time; a probe that has not
finished ``probe_deadline`` seconds after it started loses its slot (so a hung
probe cannot keep the gate shut forever) and its late outcome is ignored.

An open breaker raises :class:`~wakuwaku.CircuitOpenError`, a
:class:`~wakuwaku.Transient`: a consumer pauses the partition and retries the
same chunk later instead of burning a key's retries (design §1, §5.6).

The breaker lives on one event loop; it is not thread-safe. All state changes
are synchronous, so concurrent tasks never interleave inside one.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType

from .._clock import SYSTEM_CLOCK, Clock
from .._errors import (
    CircuitOpenError,
    ConfigError,
    LogUnavailableError,
    ProtocolError,
    Retryable,
    StepError,
    Unrecoverable,
)

__all__ = (
    "BreakerConfig",
    "BreakerState",
    "CallOutcome",
    "CircuitBreaker",
    "Permit",
    "default_call_outcome",
)

logger = logging.getLogger("wakuwaku.reliability.breaker")


class BreakerState(enum.StrEnum):
    """Where a circuit breaker stands."""

    CLOSED = "closed"
    """Calls go through; breaker failures are counted."""

    OPEN = "open"
    """Calls are refused with :class:`~wakuwaku.CircuitOpenError` for ``open_for`` seconds."""

    HALF_OPEN = "half_open"
    """A bounded number of probe calls may go through to test the endpoint."""


class CallOutcome(enum.StrEnum):
    """How a call protected by a breaker ended, in breaker terms."""

    SUCCESS = "success"
    """The endpoint answered and the call succeeded."""

    FAILURE = "failure"
    """The endpoint looks sick: transport error, timeout, protocol error."""

    DOMAIN_FAILURE = "domain_failure"
    """The endpoint answered that the job or data failed: not a breaker failure."""

    CANCELLED = "cancelled"
    """The call was cancelled: says nothing about the endpoint."""


_DOMAIN: tuple[type[BaseException], ...] = (StepError, Retryable, Unrecoverable)
_FAILURE: tuple[type[BaseException], ...] = (
    ProtocolError,
    ConnectionError,
    OSError,  # includes TimeoutError
    TimeoutError,
    LogUnavailableError,
)


def default_call_outcome(exc: BaseException) -> CallOutcome:
    """Classify an exception that ended a protected call (design §12).

    * :class:`asyncio.CancelledError`, :class:`KeyboardInterrupt`,
      :class:`SystemExit` (any ``BaseException`` that is not an
      ``Exception``): :attr:`CallOutcome.CANCELLED`;
    * :class:`~wakuwaku.StepError`, :class:`~wakuwaku.Retryable`,
      :class:`~wakuwaku.Unrecoverable`: :attr:`CallOutcome.DOMAIN_FAILURE`;
    * :class:`~wakuwaku.ProtocolError`, :class:`ConnectionError`,
      :class:`OSError`, :class:`TimeoutError`,
      :class:`~wakuwaku.LogUnavailableError`: :attr:`CallOutcome.FAILURE`;
    * anything else (a driver's own connection error that is not an
      ``OSError``, a ``Transient``, a bug): :attr:`CallOutcome.FAILURE`, because
      only an *explicit* domain answer proves the endpoint healthy.
    """
    if not isinstance(exc, Exception):
        return CallOutcome.CANCELLED
    if isinstance(exc, _DOMAIN):
        return CallOutcome.DOMAIN_FAILURE
    if isinstance(exc, _FAILURE):
        return CallOutcome.FAILURE
    return CallOutcome.FAILURE


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    """Thresholds and times of a :class:`CircuitBreaker`.

    :param failure_threshold: consecutive breaker failures (closed state)
        that open the breaker (>= 1).
    :param open_for: how long the breaker stays open before it lets probes
        through (seconds, > 0).
    :param half_open_probes: how many probe calls may run at once while half
        open (>= 1).
    :param probe_deadline: how long a probe may run before its slot is freed
        for another probe (seconds, > 0); its late outcome is then ignored.
    :raises ConfigError: when a value is out of range.
    """

    failure_threshold: int = 5
    open_for: float = 30.0
    half_open_probes: int = 1
    probe_deadline: float = 30.0

    def __post_init__(self) -> None:
        if self.failure_threshold < 1:
            raise ConfigError(f"failure_threshold must be >= 1, got {self.failure_threshold}")
        if not self.open_for > 0:
            raise ConfigError(f"open_for must be > 0 seconds, got {self.open_for}")
        if self.half_open_probes < 1:
            raise ConfigError(f"half_open_probes must be >= 1, got {self.half_open_probes}")
        if not self.probe_deadline > 0:
            raise ConfigError(f"probe_deadline must be > 0 seconds, got {self.probe_deadline}")


@dataclass(eq=False)
class Permit:
    """The right to make one call, as :meth:`CircuitBreaker.acquire` grants it.

    :param generation: the breaker's generation when the call started.
    :param probe: whether the call is a half-open probe holding a slot.
    :param started_at: when it started (the clock's ``monotonic()``, seconds).
    """

    generation: int
    probe: bool
    started_at: float
    settled: bool = field(default=False)


class CircuitBreaker:
    """Closed / open / half-open breaker with generations and bounded probes (design §12).

    :param name: names the protected endpoint in errors and logs.
    :param config: thresholds and times (:class:`BreakerConfig`).
    :param clock: time source; only ``monotonic()`` is used.
    :param classify: maps an exception that ended a call to a
        :class:`CallOutcome` (default :func:`default_call_outcome`).

    Use it around a call::

        async with breaker.call():
            await client.submit(job)

    or, by hand, :meth:`acquire` then exactly one of :meth:`record_success`,
    :meth:`record_failure`, :meth:`release_probe_as_success`,
    :meth:`record_cancelled` (in a ``finally``).
    """

    def __init__(
        self,
        name: str,
        config: BreakerConfig | None = None,
        *,
        clock: Clock = SYSTEM_CLOCK,
        classify: Callable[[BaseException], CallOutcome] = default_call_outcome,
    ) -> None:
        self.name = name
        self.config = config if config is not None else BreakerConfig()
        self._clock = clock
        self._classify = classify
        self._state = BreakerState.CLOSED
        self._generation = 0
        self._failures = 0
        self._opened_at = 0.0
        self._probes: list[Permit] = []

    # -- observation -------------------------------------------------------

    @property
    def state(self) -> BreakerState:
        """The current state (an elapsed open period reads as half open)."""
        self._refresh(self._clock.monotonic())
        return self._state

    @property
    def generation(self) -> int:
        """A number that grows at every state change."""
        self._refresh(self._clock.monotonic())
        return self._generation

    @property
    def failures(self) -> int:
        """Consecutive breaker failures counted in the closed state."""
        return self._failures

    @property
    def probes_in_flight(self) -> int:
        """Half-open probes that hold a slot now."""
        self._refresh(self._clock.monotonic())
        return len(self._probes)

    # -- calls -------------------------------------------------------------

    def acquire(self) -> Permit:
        """Ask to make one call now.

        :returns: a :class:`Permit`; settle it with exactly one outcome.
        :raises CircuitOpenError: when the breaker is open, or half open with
            every probe slot taken; ``retry_in`` says when to try again
            (seconds).
        """
        now = self._clock.monotonic()
        self._refresh(now)
        if self._state is BreakerState.CLOSED:
            return Permit(self._generation, probe=False, started_at=now)
        if self._state is BreakerState.OPEN:
            raise CircuitOpenError(self.name, self._opened_at + self.config.open_for - now)
        if len(self._probes) >= self.config.half_open_probes:
            earliest = min(p.started_at for p in self._probes) + self.config.probe_deadline
            raise CircuitOpenError(self.name, max(0.0, earliest - now))
        permit = Permit(self._generation, probe=True, started_at=now)
        self._probes.append(permit)
        return permit

    def call(self) -> BreakerCall:
        """An async context manager that acquires a permit and records the outcome.

        Entering raises :class:`~wakuwaku.CircuitOpenError` like
        :meth:`acquire`. Leaving records success, or passes the exception to
        ``classify`` and records what it says; the exception always
        propagates.
        """
        return BreakerCall(self)

    def record(self, permit: Permit, outcome: CallOutcome) -> None:
        """Settle ``permit`` with ``outcome``; a permit is settled once, later calls are ignored."""
        if permit.settled:
            return
        permit.settled = True
        now = self._clock.monotonic()
        self._refresh(now)
        if permit.generation != self._generation:
            # Started in an earlier period: it cannot speak for this one.
            logger.debug(
                "breaker %r: ignoring %s from generation %d", self.name, outcome, permit.generation
            )
            return
        if permit.probe:
            self._settle_probe(permit, outcome, now)
        elif outcome is CallOutcome.SUCCESS:
            self._failures = 0
        elif outcome is CallOutcome.FAILURE:
            self._failures += 1
            if self._failures >= self.config.failure_threshold:
                self._open(now, f"{self._failures} consecutive failures")

    def record_success(self, permit: Permit) -> None:
        """The call succeeded: reset the failure count; a probe closes the breaker."""
        self.record(permit, CallOutcome.SUCCESS)

    def record_failure(self, permit: Permit) -> None:
        """The endpoint looks sick: count it; a probe reopens the breaker."""
        self.record(permit, CallOutcome.FAILURE)

    def release_probe_as_success(self, permit: Permit) -> None:
        """The call failed in the domain, so the endpoint answered (design §12, seed 000).

        A half-open probe of the current period closes the breaker: the
        endpoint is reachable. A call started while the breaker was closed (or
        in an earlier period) changes nothing: it must not close someone
        else's probe period without a real probe.
        """
        self.record(permit, CallOutcome.DOMAIN_FAILURE)

    def record_cancelled(self, permit: Permit) -> None:
        """The call was cancelled: free its probe slot, change nothing else."""
        self.record(permit, CallOutcome.CANCELLED)

    def outcome_of(self, exc: BaseException) -> CallOutcome:
        """Classify ``exc`` with this breaker's ``classify``; a classifier that raises
        counts as :attr:`CallOutcome.FAILURE` (and is logged)."""
        try:
            return CallOutcome(self._classify(exc))
        except Exception:
            logger.exception("breaker %r: classify failed; counting a failure", self.name)
            return CallOutcome.FAILURE

    # -- internals ---------------------------------------------------------

    def _settle_probe(self, permit: Permit, outcome: CallOutcome, now: float) -> None:
        if permit not in self._probes:
            return  # its slot was freed by the deadline; the late outcome is void
        self._probes.remove(permit)
        if outcome is CallOutcome.FAILURE:
            self._open(now, "a half-open probe failed")
        elif outcome is not CallOutcome.CANCELLED:
            self._transition(BreakerState.CLOSED)
            logger.info("breaker %r closed: a probe got an answer (%s)", self.name, outcome)

    def _refresh(self, now: float) -> None:
        if self._state is BreakerState.OPEN and now >= self._opened_at + self.config.open_for:
            self._transition(BreakerState.HALF_OPEN)
            logger.info("breaker %r half open: letting probes through", self.name)
        if self._state is BreakerState.HALF_OPEN and self._probes:
            deadline = self.config.probe_deadline
            expired = [p for p in self._probes if now - p.started_at >= deadline]
            for probe in expired:
                self._probes.remove(probe)
                logger.warning(
                    "breaker %r: a probe ran past its %g s deadline; its slot is freed",
                    self.name,
                    deadline,
                )

    def _open(self, now: float, why: str) -> None:
        self._transition(BreakerState.OPEN)
        self._opened_at = now
        logger.warning("breaker %r opened for %g s: %s", self.name, self.config.open_for, why)

    def _transition(self, state: BreakerState) -> None:
        self._state = state
        self._generation += 1
        self._failures = 0
        self._probes = []


class BreakerCall:
    """``async with breaker.call():`` — see :meth:`CircuitBreaker.call`."""

    __slots__ = ("_breaker", "permit")

    def __init__(self, breaker: CircuitBreaker) -> None:
        self._breaker = breaker
        self.permit: Permit | None = None

    async def __aenter__(self) -> Permit:
        self.permit = self._breaker.acquire()
        return self.permit

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        permit = self.permit
        if permit is None:  # pragma: no cover - __aenter__ raised, so no exit
            return
        outcome = CallOutcome.SUCCESS if exc is None else CallOutcome.CANCELLED
        try:
            if exc is not None:
                outcome = self._breaker.outcome_of(exc)
        finally:
            self._breaker.record(permit, outcome)
