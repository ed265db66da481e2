"""What a handler can learn about the chunk it is handling (a context variable).

The inbox (design §9) needs the message ids of the chunk's events to claim them
inside the handler's own transaction; logs need topic, partition and key.
Sync handlers see the same context: worker threads get a copy of it.
"""

from __future__ import annotations

import contextvars
from collections.abc import Collection

import msgspec

from .._errors import WakuwakuError
from ._plan import Item


class ChunkContext(msgspec.Struct, frozen=True, gc=False):
    """The chunk a handler is handling right now.

    :param topic: the main topic.
    :param partition: its partition.
    :param key: the chunk's key.
    :param type_tag: the events' type tag.
    :param items: the planned items behind the chunk's events (internal).
    :param attempt: 0 when handling the main topic, N for the N-th retry
        attempt of a quarantined key (the failures so far in its cycle).

    Per-event details (:attr:`message_ids`, :attr:`offsets`, :attr:`props`)
    are computed when asked for, so handlers that never look cost nothing.
    """

    topic: str
    partition: int
    key: str
    type_tag: str
    items: Collection[Item]
    attempt: int

    @property
    def message_ids(self) -> tuple[tuple[str, ...], ...]:
        """Per event, the message ids (design §9) of the records it stands for
        (several for a reduced event)."""
        return tuple(item.ids for item in self.items)

    @property
    def offsets(self) -> tuple[tuple[int, ...], ...]:
        """Per event, the main-topic offsets it stands for."""
        return tuple(item.main_offsets for item in self.items)

    @property
    def props(self) -> tuple[dict[str, str], ...]:
        """Per event, the ``wk-props`` of its first record (copies: changing
        one changes nothing else)."""
        return tuple(dict(item.props) for item in self.items)

    @property
    def all_message_ids(self) -> tuple[str, ...]:
        """Every message id of the chunk, in order."""
        return tuple(i for item in self.items for i in item.ids)

    def __repr__(self) -> str:
        return (
            f"ChunkContext(topic={self.topic!r}, partition={self.partition}, "
            f"key={self.key!r}, type_tag={self.type_tag!r}, events={len(self.items)}, "
            f"attempt={self.attempt})"
        )


_current: contextvars.ContextVar[ChunkContext] = contextvars.ContextVar("wakuwaku_chunk")


def current_chunk() -> ChunkContext:
    """The :class:`ChunkContext` of the chunk being handled.

    :raises WakuwakuError: when called outside a handler call.
    """
    try:
        return _current.get()
    except LookupError:
        raise WakuwakuError("current_chunk() called outside a handler") from None
