"""Kafka's default partitioner: murmur2 and partition_for agree with the Java client (design §2)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wakuwaku import murmur2, partition_for


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        # Kafka's UtilsTest.testMurmur2 (org.apache.kafka.common.utils.Utils.murmur2).
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        (b"abc", 479470107),
    ],
)
def test_murmur2_matches_the_java_client(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected


@pytest.mark.parametrize(
    ("key", "partition"),
    # The Java producer's partitions of these keys over 1000 partitions, as
    # kafka-python checks them: every tail length (0-3 bytes past a block of 4)
    # and a NUL byte.
    [(b"", 681), (b"a", 524), (b"ab", 434), (b"abc", 107), (b"123456789", 566), (b"\x00 ", 742)],
)
def test_partition_for_matches_the_java_producer(key: bytes, partition: int) -> None:
    assert partition_for(key, 1000) == partition


@pytest.mark.parametrize("data", [b"21", b"foobar", b"abc"])
def test_partition_is_the_positive_hash_mod_n(data: bytes) -> None:
    for partitions in (1, 2, 3, 7, 16, 1000):
        assert partition_for(data, partitions) == (murmur2(data) & 0x7FFFFFFF) % partitions


@given(key=st.text(st.characters(codec="utf-8")), partitions=st.integers(1, 4096))
def test_str_keys_hash_as_utf8_and_land_in_range(key: str, partitions: int) -> None:
    partition = partition_for(key, partitions)
    assert partition == partition_for(key.encode("utf-8"), partitions)
    assert 0 <= partition < partitions


@given(data=st.binary(max_size=64))
def test_murmur2_is_a_signed_32_bit_int(data: bytes) -> None:
    assert -(2**31) <= murmur2(data) < 2**31
