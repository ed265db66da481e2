"""Strict JSON: a document with a duplicate object key is refused.

RFC 8259 leaves duplicate names undefined and decoders disagree: msgspec and
the standard library keep the last, others the first. A payload read at a
trust boundary (a producer's result, an operator's input line) that says
``{"status": "error", "status": "done"}`` means two things at once, so it is
refused rather than read as whichever value a decoder happens to keep.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

__all__ = ("DuplicateKeyError", "decode_strict")


class DuplicateKeyError(ValueError):
    """A JSON object names the same key twice.

    :param key: the repeated key (as decoded).
    """

    def __init__(self, key: str) -> None:
        super().__init__(f"duplicate key {key!r} in a JSON object")
        self.key = key


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKeyError(key)
        out[key] = value
    return out


def decode_strict(raw: bytes | str) -> Any:
    """Decode one JSON document, refusing duplicate keys at any depth.

    msgspec decides validity (strict RFC 8259, UTF-8); the standard library
    then walks the same text with an ``object_pairs_hook`` that sees every
    key, the only place a duplicate is still visible.

    :raises msgspec.DecodeError: when ``raw`` is not valid JSON.
    :raises UnicodeError: when ``raw`` is not valid UTF-8 (or a ``str`` with
        lone surrogates).
    :raises DuplicateKeyError: when an object repeats a key.
    """
    value = msgspec.json.decode(raw)
    if isinstance(value, dict | list):  # only containers can hide a duplicate
        try:
            json.loads(raw, object_pairs_hook=_refuse_duplicates)
        except RecursionError:
            raise msgspec.DecodeError("JSON is nested too deeply") from None
    return value
