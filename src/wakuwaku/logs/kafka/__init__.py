"""The Apache Kafka log: topics are Kafka topics (URL ``kafka://host:port[,host:port]``).

Mapping (``docs/logs.md``, "The Kafka log"):

- a topic is a Kafka topic named ``<prefix><topic>`` (no prefix by default,
  so other Kafka clients see the same names); a group is the Kafka consumer
  group ``<prefix><group>``;
- a record's ``wk-key`` header is the Kafka message key (not repeated as a
  header); every other header is a Kafka header; records written by any
  Kafka producer are read with their key as ``wk-key``;
- offsets are Kafka offsets: not dense (transaction markers and compaction
  leave gaps); reads are ``read_committed``;
- ownership is the consumer group's: :meth:`KafkaLog.acquire_partition`
  answers from the assignment the group coordinator gave this member
  (``cooperative-sticky``), not from a lease of ours (see the class);
- :meth:`KafkaLog.store` of a batch with retry or dead-letter records is one
  Kafka transaction with the offsets sent through
  ``send_offsets_to_transaction`` and the member's group metadata (KIP-447):
  a member that lost the partition has its transaction refused by the
  broker.

confluent-kafka (librdkafka) is imported by this package only (extra
``kafka``); its blocking calls run in threads, each bounded by the log's
``timeout``.

The package's modules, each owning one part (their docstrings say what
they may call):

- ``_log``: :class:`KafkaLog`, the facade that implements the contract;
- ``_cluster``: settings, names, calls in threads and their errors, the
  admin client, the topic cache;
- ``_append``: plain appends through the idempotent producer;
- ``_read``: reads (one assign-only consumer per partition) and start/end
  offsets;
- ``_offsets``: the groups' committed offsets, commits, group deletion;
- ``_member``: one consumer-group member and its poll thread;
- ``_ownership``: which partitions a member owns, and how each is given up;
- ``_transactions``: the transactional store (KIP-447).
"""

from __future__ import annotations

try:
    import confluent_kafka  # noqa: F401 - only to say which extra is missing
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the Kafka log needs confluent-kafka: pip install 'wakuwaku[kafka]'") from exc

from ._cluster import FENCED_CODES
from ._log import DEFAULT_MAX_MESSAGE_BYTES as DEFAULT_MAX_MESSAGE_BYTES
from ._log import HEADER_ROOM as HEADER_ROOM
from ._log import PASSWORD_ENV as PASSWORD_ENV
from ._log import USERNAME_ENV as USERNAME_ENV
from ._log import KafkaLog as KafkaLog
from ._log import derived_main_topic as derived_main_topic

__all__ = ("PASSWORD_ENV", "USERNAME_ENV", "KafkaLog", "derived_main_topic")

_FENCED_CODES = FENCED_CODES
"""The librdkafka codes of a fenced write (tests classify errors by them)."""
