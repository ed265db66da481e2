"""Kafka test helpers: a fresh prefix per test, and dropping its topics afterwards."""

from __future__ import annotations

import contextlib
import uuid

from confluent_kafka.admin import AdminClient

from wakuwaku.logs.kafka import KafkaLog

from .conftest import KAFKA_BOOTSTRAP


def fresh_prefix() -> str:
    """A topic and group prefix no other test uses (the broker is shared)."""
    return f"wkt{uuid.uuid4().hex[:12]}."


def kafka_log(prefix: str, **options: object) -> KafkaLog:
    return KafkaLog(KAFKA_BOOTSTRAP, prefix=prefix, timeout=10.0, **options)  # type: ignore[arg-type]


def drop_prefix(prefix: str) -> None:
    """Delete every topic and consumer group whose name starts with ``prefix``."""
    admin = AdminClient({"bootstrap.servers": KAFKA_BOOTSTRAP})
    topics = [t for t in admin.list_topics(timeout=10).topics if t.startswith(prefix)]
    if topics:
        for future in admin.delete_topics(topics).values():
            future.result(30)
    groups = [g.group_id for g in admin.list_consumer_groups().result(10).valid]
    mine = [g for g in groups if g.startswith(prefix)]
    if mine:
        for future in admin.delete_consumer_groups(mine).values():
            # A group whose member is still leaving: the broker expires it.
            with contextlib.suppress(Exception):
                future.result(10)
