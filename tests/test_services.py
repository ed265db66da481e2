"""The services that ``make services`` starts answer as the tests expect.

Each test talks to one server through the client library the project uses
for it, so that a broken set-up fails here, with the service's name, rather
than somewhere deep in an adapter's suite.
"""

from __future__ import annotations

import uuid

import pytest

from tests.conftest import IGGY_URL, KAFKA_BOOTSTRAP, NATS_URL, POSTGRES_DSN, REDIS_URL


@pytest.mark.kafka
def test_kafka_broker_stores_and_returns_one_record_with_headers() -> None:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    topic = f"wk-smoke-{uuid.uuid4().hex[:12]}"
    admin = AdminClient({"bootstrap.servers": KAFKA_BOOTSTRAP})
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result(
        timeout=30
    )
    try:
        delivered: list[tuple[int | None, int | None]] = []
        producer = Producer({"bootstrap.servers": KAFKA_BOOTSTRAP, "enable.idempotence": True})
        producer.produce(
            topic,
            key=b"k1",
            value=b'{"n":1}',
            partition=1,
            headers=[("wk-type", b"smoke")],
            on_delivery=lambda err, msg: delivered.append(
                (msg.partition() or 0, msg.offset() or 0)
            ),
        )
        assert producer.flush(30) == 0
        assert delivered == [(1, 0)]

        consumer = Consumer(
            {
                "bootstrap.servers": KAFKA_BOOTSTRAP,
                "group.id": f"{topic}-group",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        try:
            consumer.subscribe([topic])
            message = None
            for _ in range(60):
                message = consumer.poll(0.5)
                if message is not None:
                    break
            assert message is not None, "no record came back within 30 s"
            assert message.error() is None
            assert (message.topic(), message.partition(), message.offset()) == (topic, 1, 0)
            assert (message.key(), message.value()) == (b"k1", b'{"n":1}')
            assert message.headers() == [("wk-type", b"smoke")]
        finally:
            consumer.close()
    finally:
        admin.delete_topics([topic])[topic].result(timeout=30)


@pytest.mark.redis
async def test_redis_answers() -> None:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        assert await client.ping() is True
    finally:
        await client.aclose()


@pytest.mark.nats
async def test_nats_answers_with_jetstream() -> None:
    import nats

    connection = await nats.connect(NATS_URL, connect_timeout=5, max_reconnect_attempts=0)
    try:
        info = await connection.jetstream().account_info()
        assert info.limits is not None
    finally:
        await connection.close()


@pytest.mark.postgres
async def test_postgres_answers_on_database_test() -> None:
    import psycopg

    async with await psycopg.AsyncConnection.connect(POSTGRES_DSN, connect_timeout=5) as conn:
        cursor = await conn.execute("SELECT current_database()")
        assert await cursor.fetchone() == ("test",)


@pytest.mark.iggy
async def test_iggy_server_stores_and_returns_one_message_with_headers() -> None:
    from apache_iggy import Consumer, IggyClient, PollingStrategy, SendMessage

    client = IggyClient.from_connection_string(IGGY_URL)
    await client.connect()
    stream = f"wkservices{uuid.uuid4().hex[:8]}"
    await client.create_stream(stream)
    try:
        await client.create_topic(stream, "t", 1)
        await client.send_messages(stream, "t", 0, [SendMessage(b"hello", {"wk-v": b"1"})])
        (message,) = await client.poll_messages(
            stream,
            "t",
            consumer=Consumer.Single("services"),
            polling_strategy=PollingStrategy.Offset(0),
            count=1,
            auto_commit=False,
            partition_id=0,
        )
        assert message.payload() == b"hello"
        assert message.user_headers() is not None
    finally:
        await client.delete_stream(stream)
