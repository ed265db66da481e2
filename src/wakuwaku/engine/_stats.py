"""In-process counters of a consumer (design §14), always on; Prometheus reads them.

Every count is of *records* unless its name says otherwise.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class ConsumerStats:
    """What one :class:`~wakuwaku.Consumer` did since it started.

    :param polled: main-topic records read.
    :param handled: records whose events a handler completed (a reduced event
        counts every record it stands for).
    :param handler_calls: successful ``handle`` calls.
    :param reduced_away: records merged into another event by reduction.
    :param inbox_skipped: records dropped because the inbox already held their id.
    :param other_group_skipped: main-topic records addressed to another
        consumer group (``wk-for-group``: a dead letter that group replayed).
    :param offset_gaps: records skipped because retention deleted them
        before this group read them (its committed offset was below the
        partition's start).
    :param routed: records routed to the retry topic because their key was quarantined.
    :param retry_written: work records written to the retry topic after a Retryable failure.
    :param quarantined_keys: keys that entered quarantine.
    :param attempts: retry attempts run (one per due key).
    :param attempts_failed: retry attempts that failed Retryable.
    :param gave_up_keys: give-ups (design §6).
    :param transient_pauses: Transient failures that paused a partition (one
        per failed call, in-place retries included).
    :param log_call_retries: failed log calls of the consumer itself that were retried.
    :param stalls: partition workers restarted because their partition made
        no progress for ``stall_timeout`` seconds while the log answered.
    :param failed_by_class: handler failures by error class.
    :param dead_letters: dead-lettered records by reason code.
    :param handler_seconds: total time spent in handlers (seconds).

    ``handled``, ``handler_calls`` and ``handler_seconds`` are added up per
    worker and reach these fields when the worker has run its share of a
    batch (a hot-path saving): a reader sees them at most one batch late.
    """

    polled: int = 0
    handled: int = 0
    handler_calls: int = 0
    reduced_away: int = 0
    inbox_skipped: int = 0
    other_group_skipped: int = 0
    offset_gaps: int = 0
    routed: int = 0
    retry_written: int = 0
    quarantined_keys: int = 0
    attempts: int = 0
    attempts_failed: int = 0
    gave_up_keys: int = 0
    transient_pauses: int = 0
    log_call_retries: int = 0
    stalls: int = 0
    failed_by_class: Counter[str] = field(default_factory=Counter)
    dead_letters: Counter[str] = field(default_factory=Counter)
    handler_seconds: float = 0.0

    def dead_lettered(self) -> int:
        """All dead-lettered records."""
        return sum(self.dead_letters.values())

    def as_dict(self) -> dict[str, object]:
        """A JSON-ready copy."""
        out: dict[str, object] = {
            name: getattr(self, name)
            for name in self.__dataclass_fields__
            if name not in ("failed_by_class", "dead_letters")
        }
        out["failed_by_class"] = dict(self.failed_by_class)
        out["dead_letters"] = dict(self.dead_letters)
        return out
