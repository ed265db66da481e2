"""Handlers: one per event type, each with a ``max_batch`` (design §2, §5).

Either subclass :class:`Handler` or decorate a function with :func:`handler`.
``handle`` receives one chunk: at most ``max_batch`` events of one run (one
key, one type, in order, already reduced). An async ``handle`` runs on the
event loop; a plain function runs in a worker thread of the consumer's own
pool (``max_concurrency`` threads per partition).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .._clock import BLOCKING_CALLS
from .._errors import ConfigError
from .._events import EventType, event_type

if TYPE_CHECKING:
    from ..inbox import Inbox

T = TypeVar("T")


class Handler(Generic[T]):
    """Handles the events of one type.

    :param event: the event class (declared with :func:`wakuwaku.event`).
    :param fn: ``handle(run) -> None``, async or sync; subclasses may
        override :meth:`handle` instead.
    :param max_batch: the most events one call gets (default 1).
    :param inbox: an optional :class:`wakuwaku.inbox.Inbox`; records whose
        message id it already holds are dropped before reduction (design §9).
    :raises ConfigError: when ``event`` is not an event type or
        ``max_batch`` < 1.
    """

    def __init__(
        self,
        event: type[T],
        fn: Callable[[Sequence[T]], Awaitable[None] | None] | None = None,
        *,
        max_batch: int = 1,
        inbox: Inbox | None = None,
    ) -> None:
        self.event_type: EventType[T] = event_type(event)
        if not isinstance(max_batch, int) or max_batch < 1:
            raise ConfigError(
                f"handler for {self.event_type.tag!r}: max_batch must be an int >= 1, "
                f"got {max_batch!r}"
            )
        self.max_batch = max_batch
        self.inbox = inbox
        self._fn = fn
        target = fn if fn is not None else self.handle
        self.is_async = inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(
            getattr(target, "__call__", None)  # noqa: B004 - async callable objects
        )
        self.name = getattr(fn, "__qualname__", type(self).__qualname__)
        if fn is not None and type(self).handle is Handler.handle:
            self.handle = fn  # type: ignore[method-assign,assignment] # a frame less

    def handle(self, run: Sequence[T]) -> Awaitable[None] | None:
        """Handle one chunk; raise ``Transient``, ``Retryable`` or ``Unrecoverable``.

        Override this in a subclass, or pass ``fn`` to the constructor.
        """
        if self._fn is None:
            raise NotImplementedError(f"{type(self).__qualname__} must override handle()")
        return self._fn(run)

    async def __call__(self, run: Sequence[T], thread_pool: Executor | None = None) -> None:
        """Run the handler: on the loop if async, in a worker thread if sync.

        :param thread_pool: where a sync handler runs (the consumer passes its
            own pool); None: asyncio's default executor. The thread sees the
            caller's context variables (``wakuwaku.context()``).
        """
        if self.is_async:
            result = self.handle(run)
            if result is not None:
                await result
            return
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()
        with BLOCKING_CALLS.track():
            outcome = await loop.run_in_executor(thread_pool, context.run, self.handle, run)
        if inspect.isawaitable(outcome):
            await outcome

    def __repr__(self) -> str:
        return f"<Handler {self.name} for {self.event_type.tag!r} max_batch={self.max_batch}>"


def handler(
    event: type[T], *, max_batch: int = 1, inbox: Inbox | None = None
) -> Callable[[Callable[[Sequence[T]], Any]], Handler[T]]:
    """Decorate ``handle(run)`` (async or sync) into a :class:`Handler` for ``event``.

    :raises ConfigError: as :class:`Handler`.
    """

    def wrap(fn: Callable[[Sequence[T]], Any]) -> Handler[T]:
        return Handler(event, fn, max_batch=max_batch, inbox=inbox)

    return wrap
