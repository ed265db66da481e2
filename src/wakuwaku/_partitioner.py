"""Kafka's default partitioner: murmur2 of the key bytes, made positive, mod N (design §2).

Other producers that use Kafka's Java client agree with ours on where a key
lives, so a topic can be fed from both.
"""

from __future__ import annotations

import functools

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2``: a signed 32-bit hash of ``data``."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    tail = length & ~3
    for i in range(0, tail, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    rest = length & 3
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


@functools.lru_cache(maxsize=65_536)
def partition_for(key: str | bytes, partitions: int) -> int:
    """The partition of ``key`` in a topic of ``partitions`` partitions.

    Kafka's ``toPositive(murmur2(key)) % partitions``; a str key is UTF-8 encoded.
    Keys repeat (that is what keyed topics are for), so the last 65 536
    (key, partitions) pairs are remembered: murmur2 in Python costs about as
    much as encoding the event (measured in the flights demo's producer).
    """
    raw = key.encode("utf-8") if isinstance(key, str) else key
    return (murmur2(raw) & 0x7FFFFFFF) % partitions
