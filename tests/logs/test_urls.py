"""One rule for a log's call bound, in every URL and every constructor.

``timeout`` bounds every server call of the Redis, NATS, Kafka and Iggy logs. It
was checked three ways: ``nats://...?timeout=nan`` passed (NaN compares false
with every deadline, so no call would ever time out), Kafka's ``?timeout=0``
silently became 10 s, and each log parsed its own query string. Now every
URL goes through ``parse_log_url`` and every bound through ``check_timeout``.
Opening a log connects to nothing, so no server is needed here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import pytest

from wakuwaku import ConfigError
from wakuwaku.logs import Log, open_log
from wakuwaku.logs.iggy import IggyLog
from wakuwaku.logs.kafka import KafkaLog
from wakuwaku.logs.nats import NatsLog
from wakuwaku.logs.redis import RedisLog

URLS = {
    "redis": "redis://:s3cret@127.0.0.1:6379/0",
    "nats": "nats://user:s3cret@127.0.0.1:4222",
    "kafka": "kafka://user:s3cret@127.0.0.1:9092",
    "iggy": "iggy://iggy:s3cret@127.0.0.1:8090",
}
BUILD: dict[str, Callable[[float], Log]] = {
    "redis": lambda t: RedisLog("redis://127.0.0.1:6379/0", timeout=t),
    "nats": lambda t: NatsLog("nats://127.0.0.1:4222", timeout=t),
    "kafka": lambda t: KafkaLog("127.0.0.1:9092", timeout=t),
    "iggy": lambda t: IggyLog("127.0.0.1:8090", timeout=t),
}
BAD = ["0", "-1", "nan", "inf", "-inf", "3601", "1e9", "x", "", "1_0", " 1"]


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("scheme", list(URLS))
def test_a_bad_timeout_in_a_url_is_refused_naming_it(scheme: str, bad: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"got {bad!r}")) as caught:
        open_log(f"{URLS[scheme]}?timeout={bad}")
    assert "timeout must be seconds above 0 and at most 3600" in str(caught.value)
    assert "s3cret" not in str(caught.value)


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, 3601, True, "5"])
@pytest.mark.parametrize("scheme", list(BUILD))
def test_a_bad_timeout_given_to_a_constructor_is_refused(scheme: str, bad: object) -> None:
    with pytest.raises(ConfigError, match="timeout must be seconds above 0"):
        BUILD[scheme](bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("scheme", list(URLS))
@pytest.mark.parametrize(("given", "expected"), [("0.5", 0.5), ("3600", 3600.0), ("2", 2.0)])
async def test_a_good_timeout_is_taken_as_given(scheme: str, given: str, expected: float) -> None:
    log = open_log(f"{URLS[scheme]}?timeout={given}")
    try:
        assert log.timeout == expected  # type: ignore[attr-defined]
    finally:
        await log.close()


@pytest.mark.parametrize("scheme", list(URLS))
def test_an_unknown_or_repeated_option_is_refused_the_same_way(scheme: str) -> None:
    with pytest.raises(ConfigError, match=f"unknown option 'tiemout' for {scheme}://"):
        open_log(f"{URLS[scheme]}?tiemout=1")
    with pytest.raises(ConfigError, match="option 'timeout' is given twice"):
        open_log(f"{URLS[scheme]}?timeout=1&timeout=2")


@pytest.mark.parametrize("scheme", ["nats", "kafka", "iggy"])
def test_a_broken_ipv6_host_is_refused_before_any_connection(scheme: str) -> None:
    # nats://u:pw@[::1?timeout=1 reached the NATS client and ended in a traceback.
    with pytest.raises(ConfigError, match=r"broken \[IPv6\] host") as caught:
        open_log(f"{scheme}://u:s3cret@[::1:4222?timeout=1")
    assert "s3cret" not in str(caught.value)


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:///some/where.db?fsync=0&busy_timeout=2.5",
        "redis://127.0.0.1:6390/3?prefix=app1&timeout=0.5",
        "nats://127.0.0.1:4222?prefix=abc&timeout=7",
        "iggy://127.0.0.1:8090?stream=s&timeout=3",
        "iggy://127.0.0.1:8090?stream=s&timeout=3&tls=1&tls_domain=iggy.example",
        "kafka://h1:9092,h2:9092?prefix=p.&timeout=3&transactions=0",
    ],
)
def test_a_log_url_names_every_option_it_was_opened_with(url: str) -> None:
    """``url`` is what another process opens the same log with (the demo's
    consumer, a command shown it): every option that is not its default."""
    log = open_log(url)
    assert log.url == url
    assert open_log(log.url).url == url


@pytest.mark.parametrize("scheme", ["nats", "kafka", "iggy"])
def test_a_path_after_the_servers_is_refused_as_a_path(scheme: str) -> None:
    # iggy://u:pw@127.0.0.1:8090/somepath said the port was not a number.
    with pytest.raises(ConfigError, match=r"is followed by a path \('/somepath'\)") as caught:
        open_log(f"{scheme}://u:s3cret@127.0.0.1:8090/somepath?timeout=1")
    assert "takes none" in str(caught.value)
    assert "s3cret" not in str(caught.value)
