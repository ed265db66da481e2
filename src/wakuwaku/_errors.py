"""The one exception tree of wakuwaku.

::

    WakuwakuError
    ├── ConfigError (also ValueError)           bad settings or declarations
    │   ├── DuplicateTypeTag                    two event types, one tag
    │   ├── MissingKeyError                     an event without a usable key
    │   └── UnsupportedLogURL                   a log URL with an unknown scheme
    ├── LogError                                the log (broker) failed or refused
    │   ├── UnknownTopicError
    │   ├── UnknownPartitionError
    │   ├── PartitionCountMismatch              (design §6)
    │   ├── CorruptLogError                     a damaged or foreign log file
    │   ├── FencedError                         a stale partition owner (design §15)
    │   └── LogUnavailableError                 the log cannot be reached now
    ├── SetupError                              a fault no retry fixes stopped the consumer
    ├── GroupRunningError                       a tool refused: members of the group run
    ├── UnknownGroupError (also LookupError)    a group with no committed offset on a topic
    ├── HandleError                             a handler's classified failure
    │   ├── Transient                           (design §1, §5.6)
    │   │   └── CircuitOpenError                an open circuit breaker (design §12)
    │   ├── Retryable                           (design §1, §5.5, §6)
    │   └── Unrecoverable                       (design §1, §5.7)
    └── ResultError                             an out-of-band job result (design §10)
        ├── StepError                           the job said it failed
        └── ProtocolError                       the result cannot be understood

Code classifies failures by reading :attr:`HandleError.error_class`, not by
long ``isinstance`` chains (the ``retriable`` flag of aiokafka's errors).
"""

from __future__ import annotations

import enum


class ErrorClass(enum.StrEnum):
    """What kind of failure a handler met, which decides what the consumer does."""

    TRANSIENT = "transient"
    """Nothing can succeed right now: retry the same chunk in place, pause the
    partition (design §5.6)."""

    RETRYABLE = "retryable"
    """This key failed, others are fine: quarantine the key and retry it from
    the retry topic on the schedule (design §5.5, §6)."""

    UNRECOVERABLE = "unrecoverable"
    """Retrying will never help: dead-letter the chunk and go on (design §5.7)."""


class WakuwakuError(Exception):
    """Root of every exception wakuwaku raises on purpose."""


class ConfigError(WakuwakuError, ValueError):
    """A setting, a declaration or an argument is wrong; fix the code or config."""


class DuplicateTypeTag(ConfigError):
    """Two different event types were registered under one type tag."""

    def __init__(self, tag: str, existing: type, new: type) -> None:
        self.tag = tag
        self.existing = existing
        self.new = new
        super().__init__(
            f"type tag {tag!r} is already registered to {existing.__module__}."
            f"{existing.__qualname__}; cannot register {new.__module__}.{new.__qualname__}"
        )


class MissingKeyError(ConfigError):
    """An event has no usable key (None, empty or only whitespace), so it has
    no partition or order."""

    def __init__(self, type_tag: str, field: str, value: object) -> None:
        self.type_tag = type_tag
        self.field = field
        self.value = value
        super().__init__(
            f"event of type {type_tag!r} has no usable key: field {field!r} is {value!r}"
        )


class UnsupportedLogURL(ConfigError):
    """A log URL names a scheme no adapter handles."""

    def __init__(self, url: str, supported: tuple[str, ...]) -> None:
        self.url = url
        self.supported = supported
        super().__init__(
            f"unsupported log URL {url!r}: supported schemes are "
            + ", ".join(f"{s}://" for s in supported)
        )


class LogError(WakuwakuError):
    """The log (broker) failed or refused an operation."""


class UnknownTopicError(LogError):
    """A topic that does not exist was used."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        super().__init__(f"topic {topic!r} does not exist (create it with `wakuwaku topic create`)")


class UnknownPartitionError(LogError):
    """A partition outside ``0 .. partitions-1`` of a topic was used."""

    def __init__(self, topic: str, partition: int, partitions: int) -> None:
        self.topic = topic
        self.partition = partition
        self.partitions = partitions
        super().__init__(
            f"topic {topic!r} has {partitions} partitions; partition {partition} does not exist"
        )


class PartitionCountMismatch(LogError):
    """A topic exists with another partition count than the one asked for (design §6)."""

    def __init__(self, topic: str, existing: int, requested: int) -> None:
        self.topic = topic
        self.existing = existing
        self.requested = requested
        super().__init__(
            f"topic {topic!r} exists with {existing} partitions, but {requested} were requested"
        )


class CorruptLogError(LogError):
    """A log's storage is damaged or belongs to something else."""


class FencedError(LogError):
    """A partition owner whose lease was taken over tried to write (design §15)."""

    def __init__(self, group: str, topic: str, partition: int, generation: int) -> None:
        self.group = group
        self.topic = topic
        self.partition = partition
        self.generation = generation
        super().__init__(
            f"group {group!r} lost ownership of {topic!r} partition {partition} "
            f"(generation {generation} is stale)"
        )


class LogUnavailableError(LogError):
    """The log cannot be reached right now; the consumer treats this as Transient."""


class SetupError(WakuwakuError):
    """A fault no retry can fix stopped the consumer: a missing table or
    topic, a refused credential or permission (design §7).

    Raised by :meth:`Consumer.run <wakuwaku.Consumer.run>` (and ``drain``)
    when one of the consumer's own log or inbox calls meets one, instead of
    retrying it forever as Transient. An adapter or inbox may raise it
    itself for a fault it knows to be permanent.

    :param what: the fault in a few words.
    :param hint: what fixes it.
    :param operation: the consumer's call that met it ("inbox lookup",
        "poll", "store"...), or None.
    :param topic: the topic whose partition worker met it, or None.
    :param partition: that partition, or None.
    """

    def __init__(
        self,
        what: str,
        hint: str = "",
        *,
        operation: str | None = None,
        topic: str | None = None,
        partition: int | None = None,
    ) -> None:
        self.what = what
        self.hint = hint
        self.operation = operation
        self.topic = topic
        self.partition = partition
        where = "" if topic is None else f" on {topic}/{partition}"
        during = "" if operation is None else f" during {operation!r}"
        advice = f"; {hint}" if hint else ""
        super().__init__(f"setup error{during}{where}: {what}{advice}")


class GroupRunningError(WakuwakuError):
    """A tool that changes a consumer group's state was refused because members
    of the group are running (``wakuwaku group reset-offsets``).

    A running member keeps its own position in memory and commits it, so an
    offset stored beside it would be overwritten (or, on Kafka, is refused by
    the broker).

    :param group: the consumer group.
    :param topic: the topic.
    :param partitions: partition -> the member running it.
    :ivar members: the running members' names, sorted.
    """

    def __init__(self, group: str, topic: str, partitions: dict[int, str]) -> None:
        self.group = group
        self.topic = topic
        self.partitions = dict(sorted(partitions.items()))
        self.members = tuple(sorted(set(partitions.values())))
        names = ", ".join(
            f"{member!r} (partition{'s' * (len(owned) != 1)} {', '.join(map(str, owned))})"
            for member in self.members
            for owned in [[p for p, m in self.partitions.items() if m == member]]
        )
        super().__init__(
            f"group {group!r} has running members on topic {topic!r}: {names}; stop them first"
        )


class UnknownGroupError(WakuwakuError, LookupError):
    """A consumer group has no committed offset on a topic: a mistyped name, or
    a consumer that never committed there.

    :param group: the group asked for.
    :param topic: the topic.
    :param groups: the groups that did commit on the topic, sorted; None when
        the log cannot list them.
    """

    def __init__(self, group: str, topic: str, groups: tuple[str, ...] | None) -> None:
        self.group = group
        self.topic = topic
        self.groups = groups
        if groups is None:
            others = "this log cannot list the groups that did"
        elif groups:
            others = "groups that did: " + ", ".join(repr(g) for g in groups)
        else:
            others = "no group has committed on it"
        super().__init__(
            f"group {group!r} has never committed on topic {topic!r} "
            f"(a mistyped group, or a consumer that has not committed yet); {others}"
        )


class HandleError(WakuwakuError):
    """A handler's failure, with the class that tells the consumer what to do.

    :param error_class: the class of the failure (:class:`ErrorClass`).
    :param cause: the underlying exception (chained as ``__cause__``) or a message.
    """

    error_class: ErrorClass

    def __init__(self, error_class: ErrorClass, cause: BaseException | str | None = None) -> None:
        self.error_class = ErrorClass(error_class)
        self.cause = cause
        if isinstance(cause, BaseException):
            self.__cause__ = cause
            try:
                detail = str(cause)
            except Exception:  # noqa: BLE001 - a cause whose __str__ fails keeps its class
                detail = "<unprintable>"
            text = f"{type(cause).__name__}: {detail}"
        else:
            text = cause or self.error_class.value
        super().__init__(text)


class Transient(HandleError):
    """Nothing can succeed right now; retry the same chunk in place (design §5.6)."""

    error_class = ErrorClass.TRANSIENT  # also when a subclass's __init__ skips ours

    def __init__(self, cause: BaseException | str | None = None) -> None:
        super().__init__(ErrorClass.TRANSIENT, cause)


class Retryable(HandleError):
    """This key failed but may succeed later; quarantine and retry it (design §6)."""

    error_class = ErrorClass.RETRYABLE  # also when a subclass's __init__ skips ours

    def __init__(self, cause: BaseException | str | None = None) -> None:
        super().__init__(ErrorClass.RETRYABLE, cause)


class Unrecoverable(HandleError):
    """Retrying will never help; dead-letter the chunk and go on (design §5.7)."""

    error_class = ErrorClass.UNRECOVERABLE  # also when a subclass's __init__ skips ours

    def __init__(self, cause: BaseException | str | None = None) -> None:
        super().__init__(ErrorClass.UNRECOVERABLE, cause)


class CircuitOpenError(Transient):
    """A circuit breaker is open; the consumer pauses instead of burning retries (design §12)."""

    def __init__(self, name: str, retry_in: float) -> None:
        self.name = name
        self.retry_in = retry_in
        super().__init__(f"circuit {name!r} is open; next probe in {retry_in:.3f} s")


class ResultError(WakuwakuError):
    """An out-of-band job result is a failure or cannot be understood (design §10)."""


class StepError(ResultError):
    """The job reported that its step failed; ``message`` is sanitized (design §10, §13)."""

    def __init__(self, job_id: str, step: str, message: str, retryable: bool | None = None) -> None:
        self.job_id = job_id
        self.step = step
        self.message = message
        self.retryable = retryable
        super().__init__(f"job {job_id!r} step {step!r} failed: {message}")


class ProtocolError(ResultError):
    """A job result broke the contract (not JSON, no status, unknown status...).

    ``reason`` is a stable code such as ``not_json``, ``no_status``,
    ``status_not_string`` or ``unknown_status``.
    """

    def __init__(self, job_id: str, step: str, reason: str) -> None:
        self.job_id = job_id
        self.step = step
        self.reason = reason
        super().__init__(f"job {job_id!r} step {step!r}: protocol error {reason}")
