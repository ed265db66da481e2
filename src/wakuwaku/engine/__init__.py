"""The consumer engine: the consumer and partition ownership, planning, handler execution,
the retry topic and quarantine, dead letters, the partition view (design §5-8, 14, 15)."""

from ._config import DEFAULT_RETRY_DELAYS as DEFAULT_RETRY_DELAYS
from ._config import MAX_RETRY_DELAY as MAX_RETRY_DELAY
from ._config import TOPIC_NAMES_TOPIC as TOPIC_NAMES_TOPIC
from ._config import ConsumerConfig as ConsumerConfig
from ._config import DeliveryMode as DeliveryMode
from ._config import GroupTopics as GroupTopics
from ._config import check_configured_topic_name as check_configured_topic_name
from ._config import check_group_name as check_group_name
from ._config import check_retry_delays as check_retry_delays
from ._config import dead_letter_topic_name as dead_letter_topic_name
from ._config import default_error_class as default_error_class
from ._config import replay_ledger_topic_name as replay_ledger_topic_name
from ._config import retry_topic_name as retry_topic_name
from ._config import split_internal_topic as split_internal_topic
from ._consumer import Consumer as Consumer
from ._context import ChunkContext as ChunkContext
from ._context import current_chunk as current_chunk
from ._handler import Handler as Handler
from ._handler import handler as handler
from ._ownership import AssignmentLog as AssignmentLog
from ._registry import group_topics as group_topics
from ._registry import read_topic_names as read_topic_names
from ._registry import registered_topics as registered_topics
from ._registry import topic_names_topic as topic_names_topic
from ._registry import topic_owner as topic_owner
from ._stats import ConsumerStats as ConsumerStats
from ._view import PartitionView as PartitionView
from ._view import QuarantinedKey as QuarantinedKey
from ._view import RetryPartitionState as RetryPartitionState
from ._view import read_retry_partition as read_retry_partition

__all__ = (
    "DEFAULT_RETRY_DELAYS",
    "MAX_RETRY_DELAY",
    "TOPIC_NAMES_TOPIC",
    "AssignmentLog",
    "ChunkContext",
    "Consumer",
    "ConsumerConfig",
    "ConsumerStats",
    "DeliveryMode",
    "GroupTopics",
    "Handler",
    "PartitionView",
    "QuarantinedKey",
    "RetryPartitionState",
    "check_configured_topic_name",
    "check_group_name",
    "check_retry_delays",
    "current_chunk",
    "dead_letter_topic_name",
    "default_error_class",
    "group_topics",
    "handler",
    "read_retry_partition",
    "read_topic_names",
    "registered_topics",
    "replay_ledger_topic_name",
    "retry_topic_name",
    "split_internal_topic",
    "topic_names_topic",
    "topic_owner",
)
