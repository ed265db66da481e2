"""wakuwaku: reliable, key-ordered consumption of typed events from partitioned logs.

The root package re-exports the public names; it never imports an optional
dependency (Redis, NATS, PostgreSQL, Prometheus live in their own modules).
"""

from ._clock import SYSTEM_CLOCK as SYSTEM_CLOCK
from ._clock import Clock as Clock
from ._clock import SystemClock as SystemClock
from ._errors import CircuitOpenError as CircuitOpenError
from ._errors import ConfigError as ConfigError
from ._errors import CorruptLogError as CorruptLogError
from ._errors import DuplicateTypeTag as DuplicateTypeTag
from ._errors import ErrorClass as ErrorClass
from ._errors import FencedError as FencedError
from ._errors import GroupRunningError as GroupRunningError
from ._errors import HandleError as HandleError
from ._errors import LogError as LogError
from ._errors import LogUnavailableError as LogUnavailableError
from ._errors import MissingKeyError as MissingKeyError
from ._errors import PartitionCountMismatch as PartitionCountMismatch
from ._errors import ProtocolError as ProtocolError
from ._errors import ResultError as ResultError
from ._errors import Retryable as Retryable
from ._errors import SetupError as SetupError
from ._errors import StepError as StepError
from ._errors import Transient as Transient
from ._errors import UnknownGroupError as UnknownGroupError
from ._errors import UnknownPartitionError as UnknownPartitionError
from ._errors import UnknownTopicError as UnknownTopicError
from ._errors import Unrecoverable as Unrecoverable
from ._errors import UnsupportedLogURL as UnsupportedLogURL
from ._errors import WakuwakuError as WakuwakuError
from ._events import Algebra as Algebra
from ._events import Codec as Codec
from ._events import EventType as EventType
from ._events import JsonCodec as JsonCodec
from ._events import Registry as Registry
from ._events import default_registry as default_registry
from ._events import event as event
from ._events import event_type as event_type
from ._logging import StructuredFormatter as StructuredFormatter
from ._partitioner import murmur2 as murmur2
from ._partitioner import partition_for as partition_for
from ._producer import Producer as Producer
from ._producer import Published as Published
from ._producer import SyncProducer as SyncProducer
from ._records import InvalidHeaders as InvalidHeaders
from ._records import ReasonCode as ReasonCode
from ._records import Record as Record
from ._records import Source as Source
from ._records import ValidHeaders as ValidHeaders
from ._records import message_id as message_id
from ._records import validate_headers as validate_headers
from ._sanitize import redact_url as redact_url
from ._sanitize import sanitize as sanitize
from .engine import Consumer as Consumer
from .engine import ConsumerConfig as ConsumerConfig
from .engine import ConsumerStats as ConsumerStats
from .engine import DeliveryMode as DeliveryMode
from .engine import Handler as Handler
from .engine import current_chunk as current_chunk
from .engine import handler as handler
from .inbox import Inbox as Inbox
from .inbox import SQLiteInbox as SQLiteInbox
from .logs import Log as Log
from .logs import MemoryLog as MemoryLog
from .logs import SQLiteLog as SQLiteLog
from .logs import TopicInfo as TopicInfo
from .logs import open_log as open_log
from .reliability import AttemptLimit as AttemptLimit
from .reliability import CircuitBreaker as CircuitBreaker
from .reliability import RetryBudget as RetryBudget

__version__ = "0.1.0"

__all__ = (
    "SYSTEM_CLOCK",
    "Algebra",
    "AttemptLimit",
    "CircuitBreaker",
    "CircuitOpenError",
    "Clock",
    "Codec",
    "ConfigError",
    "Consumer",
    "ConsumerConfig",
    "ConsumerStats",
    "CorruptLogError",
    "DeliveryMode",
    "DuplicateTypeTag",
    "ErrorClass",
    "EventType",
    "FencedError",
    "GroupRunningError",
    "HandleError",
    "Handler",
    "Inbox",
    "InvalidHeaders",
    "JsonCodec",
    "Log",
    "LogError",
    "LogUnavailableError",
    "MemoryLog",
    "MissingKeyError",
    "PartitionCountMismatch",
    "Producer",
    "ProtocolError",
    "Published",
    "ReasonCode",
    "Record",
    "Registry",
    "ResultError",
    "RetryBudget",
    "Retryable",
    "SQLiteInbox",
    "SQLiteLog",
    "SetupError",
    "Source",
    "StepError",
    "StructuredFormatter",
    "SyncProducer",
    "SystemClock",
    "TopicInfo",
    "Transient",
    "UnknownGroupError",
    "UnknownPartitionError",
    "UnknownTopicError",
    "Unrecoverable",
    "UnsupportedLogURL",
    "ValidHeaders",
    "WakuwakuError",
    "current_chunk",
    "default_registry",
    "event",
    "event_type",
    "handler",
    "message_id",
    "murmur2",
    "open_log",
    "partition_for",
    "redact_url",
    "sanitize",
    "validate_headers",
)
