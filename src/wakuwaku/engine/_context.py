"""What a handler can learn about the chunk it is handling (a context variable).

The inbox (SPEC 9) needs the message ids of the chunk's events to claim them
inside the handler's own transaction; logs need topic, partition and key.
Sync handlers see the same context: worker threads get a copy of it.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass

from .._errors import WakuwakuError


@dataclass(frozen=True, slots=True)
class ChunkContext:
    """The chunk a handler is handling right now.

    :param topic: the main topic.
    :param partition: its partition.
    :param key: the chunk's key.
    :param type_tag: the events' type tag.
    :param message_ids: per event, the message ids (SPEC 9) of the records it
        stands for (several for a reduced event).
    :param offsets: per event, the main-topic offsets it stands for.
    :param props: per event, the ``wk-props`` of its first record.
    :param attempt: 0 when handling the main topic, N for the N-th retry
        attempt of a quarantined key.
    """

    topic: str
    partition: int
    key: str
    type_tag: str
    message_ids: tuple[tuple[str, ...], ...]
    offsets: tuple[tuple[int, ...], ...]
    props: tuple[dict[str, str], ...]
    attempt: int

    @property
    def all_message_ids(self) -> tuple[str, ...]:
        """Every message id of the chunk, in order."""
        return tuple(i for ids in self.message_ids for i in ids)


_current: contextvars.ContextVar[ChunkContext] = contextvars.ContextVar("wakuwaku_chunk")


def current_chunk() -> ChunkContext:
    """The :class:`ChunkContext` of the chunk being handled.

    :raises WakuwakuError: when called outside a handler call.
    """
    try:
        return _current.get()
    except LookupError:
        raise WakuwakuError("current_chunk() called outside a handler") from None
