"""The error-text sanitizer (SPEC 13, seed 000: normalize and redact, then truncate)."""

from __future__ import annotations

import sys
import unicodedata
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wakuwaku import ConfigError
from wakuwaku._sanitize import (
    DEFAULT_LIMIT,
    PATH_MARKER,
    TRUNCATION_MARKER,
    URL_MARKER,
    sanitize,
)

BIDI_CONTROLS = [
    *range(0x202A, 0x202F),  # LRE RLE PDF LRO RLO
    *range(0x2066, 0x206A),  # LRI RLI FSI PDI
    0x200E,  # LRM
    0x200F,  # RLM
    0x061C,  # ALM
]
ZERO_WIDTH = [0x200B, 0x200C, 0x200D, 0x2060, 0xFEFF]
OTHER_FORMAT = [0x00AD, 0x2061, 0xFFF9, 0xE0001, 0xE0041, 0x110BD]
C0 = [c for c in range(0x20) if chr(c) not in "\t\n\v\f\r"]
C1 = [c for c in range(0x80, 0xA0) if c != 0x85]
BREAKS = ["\t", "\n", "\v", "\f", "\r", "\r\n", "\x85", "\u2028", "\u2029"]

REMOVED_CATEGORIES = {"Cc", "Cf", "Cs", "Zl", "Zp"}


def _removed(c: str) -> bool:
    return unicodedata.category(c) in REMOVED_CATEGORIES


# -- character classes -------------------------------------------------------


@pytest.mark.parametrize("code", C0, ids=hex)
def test_c0_controls_are_removed(code: int) -> None:
    assert sanitize(f"a{chr(code)}b") == "ab"


def test_del_is_removed() -> None:
    assert sanitize("a\x7fb") == "ab"


@pytest.mark.parametrize("code", C1, ids=hex)
def test_c1_controls_are_removed(code: int) -> None:
    assert sanitize(f"a{chr(code)}b") == "ab"


@pytest.mark.parametrize("code", BIDI_CONTROLS, ids=hex)
def test_bidi_controls_are_removed(code: int) -> None:
    # The classic "Trojan Source" shape: an override that reorders what a reader sees.
    assert sanitize(f"user{chr(code)}nimda") == "usernimda"


@pytest.mark.parametrize("code", ZERO_WIDTH, ids=hex)
def test_zero_width_characters_are_removed(code: int) -> None:
    assert sanitize(f"pay{chr(code)}pal") == "paypal"


@pytest.mark.parametrize("code", OTHER_FORMAT, ids=hex)
def test_other_format_characters_are_removed(code: int) -> None:
    assert sanitize(f"x{chr(code)}y") == "xy"


@pytest.mark.parametrize("brk", BREAKS, ids=repr)
def test_line_breaks_and_tabs_become_one_space(brk: str) -> None:
    assert sanitize(f"line one{brk}line two") == "line one line two"


def test_runs_of_whitespace_collapse_and_ends_are_stripped() -> None:
    assert sanitize("\n\n  first\t\t\n  second  \x00 third \n") == "first second third"


def test_ansi_sequences_are_removed_whole() -> None:
    assert sanitize("\x1b[1;31mERROR\x1b[0m: \x1b]0;title\x07boom") == "ERROR: boom"


def test_every_format_and_control_character_of_this_python_is_covered() -> None:
    # Guards the hard-coded class against a newer Unicode database.
    leftovers = [
        hex(code)
        for code in range(sys.maxunicode + 1)
        if unicodedata.category(chr(code)) in {"Cc", "Cf"} and sanitize(f"a{chr(code)}b") != "ab"
        and chr(code) not in "\t\n\v\f\r\x85"
    ]
    assert leftovers == []


# -- decoding ----------------------------------------------------------------


def test_invalid_utf8_is_replaced() -> None:
    assert sanitize(b"caf\xc3\xa9 \xff\xfe ok \xe2\x82") == "café \ufffd\ufffd ok \ufffd"


def test_valid_utf8_bytes_round_trip() -> None:
    assert sanitize("日本語のエラー".encode()) == "日本語のエラー"


def test_lone_surrogates_in_str_are_replaced() -> None:
    out = sanitize("a\udcff\ud800b")
    assert out == "a\ufffd\ufffdb"
    out.encode("utf-8")


def test_exceptions_become_type_and_message() -> None:
    assert sanitize(ValueError("bad\nvalue")) == "ValueError: bad value"
    assert sanitize(KeyError()) == "KeyError"


def test_an_exception_whose_str_fails_is_still_reported() -> None:
    class Broken(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert sanitize(Broken()) == "Broken: <unprintable>"


# -- redaction ---------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "https://example.com/a?b=c",
        "redis://user:s3cret@10.0.0.5:6379/0",
        "postgresql://app:hunter2@db.internal/prod",
        "amqp+ssl://guest:guest@mq/vhost",
        "file:///etc/shadow",
        "HTTP://EXAMPLE.COM",
    ],
)
def test_urls_are_redacted_with_their_credentials(url: str) -> None:
    assert sanitize(f"connect to {url} failed") == f"connect to {URL_MARKER} failed"


def test_a_url_hidden_by_a_zero_width_character_is_still_redacted() -> None:
    assert sanitize("see ht\u200btps://user:pw@host/x now") == f"see {URL_MARKER} now"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("open /home/alice/.ssh/id_rsa: denied", f"open {PATH_MARKER}: denied"),
        ('File "/usr/lib/python3.11/x.py", line 3', f'File "{PATH_MARKER}", line 3'),
        ("(see /etc/passwd)", f"(see {PATH_MARKER})"),
        ("path=/var/lib/app/data.db", f"path={PATH_MARKER}"),
        ("/tmp", PATH_MARKER),
        ("C:\\Users\\bob\\secrets.txt missing", f"{PATH_MARKER} missing"),
        ("d:/projects/app.ini missing", f"{PATH_MARKER} missing"),
        ("\\\\fileserver\\share\\hr\\salaries.xlsx locked", f"{PATH_MARKER} locked"),
        ("\\\\?\\C:\\very\\long\\path", PATH_MARKER),
    ],
)
def test_absolute_paths_are_redacted(text: str, expected: str) -> None:
    assert sanitize(text) == expected


@pytest.mark.parametrize(
    "text",
    ["and/or", "1/2 done", "10.0.0.0/24", "TCP/IP", "a / b", "ratio 3:/", "KeyError: 'x'"],
)
def test_text_that_is_not_a_path_is_kept(text: str) -> None:
    assert sanitize(text) == text


# -- truncation --------------------------------------------------------------


def test_short_text_is_not_truncated() -> None:
    assert sanitize("x" * DEFAULT_LIMIT) == "x" * DEFAULT_LIMIT


def test_long_text_is_cut_with_a_marker_within_the_limit() -> None:
    out = sanitize("x" * 5000, limit=100)
    assert len(out) == 100
    assert out.endswith(TRUNCATION_MARKER)


def test_truncation_counts_characters_not_bytes() -> None:
    out = sanitize("é" * 300, limit=50)
    assert out == "é" * (50 - len(TRUNCATION_MARKER)) + TRUNCATION_MARKER


@pytest.mark.parametrize("limit", [0, 1, 5, len(TRUNCATION_MARKER)])
def test_a_limit_too_small_for_the_marker_cuts_bare(limit: int) -> None:
    out = sanitize("abcdefghijklmnopqrstuvwxyz", limit=limit)
    assert out == "abcdefghijklmnopqrstuvwxyz"[:limit]


def test_a_negative_limit_is_refused() -> None:
    with pytest.raises(ConfigError):
        sanitize("x", limit=-1)


SECRET_URL = "https://admin:T0pS3cr3t@internal.example.net/api/v1/keys"
SECRET_PATH = "/srv/customers/acme-corp/invoices/2024.pdf"
WINDOWS_PATH = "C:\\Users\\jdoe\\AppData\\token.json"


def _fragments(secret: str) -> list[str]:
    """Every 4-character piece of the secret, except those of the markers."""
    return sorted({secret[i : i + 4] for i in range(len(secret) - 3)})


@pytest.mark.parametrize("secret", [SECRET_URL, SECRET_PATH, WINDOWS_PATH])
def test_redaction_before_truncation_leaves_nothing_of_a_straddling_secret(secret: str) -> None:
    prefix = "error while talking to backend: "
    text = f"{prefix}{secret} and then some more words to push it past the end"
    # Cut at every position inside the secret (and around it): nothing survives.
    for limit in range(len(prefix), len(prefix) + len(secret) + len(TRUNCATION_MARKER) + 5):
        out = sanitize(text, limit=limit)
        assert len(out) <= limit
        for piece in _fragments(secret):
            assert piece not in out, (limit, out)


def test_a_marker_torn_by_the_cut_is_dropped_whole() -> None:
    text = "x" * 40 + " " + SECRET_URL + " tail " * 20
    for limit in range(40, 60):
        out = sanitize(text, limit=limit)
        body = out.removesuffix(TRUNCATION_MARKER)
        assert "<" not in body or URL_MARKER in body, out


# -- properties --------------------------------------------------------------


@given(
    text=st.one_of(st.text(), st.binary(), st.text(st.characters(codec=None))),
    limit=st.integers(min_value=0, max_value=300),
)
def test_output_is_valid_short_and_clean(text: str | bytes, limit: int) -> None:
    out = sanitize(text, limit=limit)
    assert isinstance(out, str)
    out.encode("utf-8")  # never raises: no lone surrogates
    assert len(out) <= limit
    assert not any(_removed(c) for c in out)


@given(
    before=st.integers(min_value=0, max_value=120),
    limit=st.integers(min_value=0, max_value=200),
    secret=st.sampled_from([SECRET_URL, SECRET_PATH, WINDOWS_PATH]),
)
def test_no_fragment_of_a_secret_survives_any_limit(before: int, limit: int, secret: str) -> None:
    out = sanitize("w " * before + secret + " end" * 30, limit=limit)
    assert len(out) <= limit
    for piece in _fragments(secret):
        assert piece not in out


def test_a_huge_text_is_cut_before_redaction_without_leaking_a_split_url() -> None:
    limit = 100
    scan = 4 * limit + 4096
    # A URL with a secret straddles the point where the long text is first cut.
    text = "a " * ((scan - 10) // 2) + "https://user:hunter2@db.internal/x " + "b " * 10_000_000
    out = sanitize(text, limit=limit)
    assert len(out) <= limit and out.endswith("…[truncated]")
    assert "hunter2" not in out and "https" not in out


def test_a_huge_text_after_many_urls_never_shows_a_fragment_of_the_cut_one() -> None:
    # Redaction shrinks the head a lot, so text near the first cut reaches the output.
    limit = 1000
    scan = 4 * limit + 4096
    urls = "http://x.example/" + "p" * 60 + " "
    head = urls * (scan // len(urls))
    text = head[: scan - 12] + " /home/alice/.ssh/id_rsa_secret and more " * 50_000
    out = sanitize(text, limit=limit)
    assert "alice" not in out and "/ho" not in out
    assert out.endswith("…[truncated]") and len(out) <= limit


@pytest.mark.parametrize("make", [str, lambda t: t.encode(), ValueError])
def test_a_huge_message_keeps_its_head(make: Any) -> None:
    out = sanitize(make("start " + "x" * 30_000_000), limit=50)
    assert out.startswith(("start", "ValueError: start")) and out.endswith("…[truncated]")


@pytest.mark.parametrize(
    "text",
    ["\x1b[/home/alice/.ssh/id_rsa", "see \x1b[0 /home/alice/x", "open \x1b[ C:\\Users\\alice\\key",
     "\x1b[31mhttps://alice:pw@db/x\x1b[0m"],
)
def test_an_escape_sequence_that_swallows_the_start_of_a_path_hides_nothing(text: str) -> None:
    out = sanitize(text)
    assert "alice" not in out, out


@pytest.mark.parametrize("padding", [" " * 5000, "\x1b[0m" * 1200, "\n" * 4600, "\u200b" * 9000])
def test_padding_that_cleans_away_does_not_hide_the_message_behind_it(padding: str) -> None:
    assert sanitize(padding + "Error: disk full", 100) == "Error: disk full"


def test_an_integral_float_limit_is_accepted_and_other_limits_are_refused() -> None:
    assert sanitize("short", 10.0) == "short"  # type: ignore[arg-type]
    for bad in (1.5, "10", True, -1):
        with pytest.raises(ConfigError, match="limit"):
            sanitize("short", bad)  # type: ignore[arg-type]
