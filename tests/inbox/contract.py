"""The inbox contract suite: written once, subclassed per backend (design §9, seed 004).

A *harness* wraps one backend: an inbox plus an "effects" table in the same
database whose counter per key is a non-idempotent effect (``n = n + 1``).
:meth:`Harness.apply` runs one handler transaction: claim the keys, add 1 to
the counter of every key the claim says is new, commit (or raise and roll
back). A counter above 1 is a double effect.

The core checks are module-level functions so ``test_broken_key.py`` can run
them against deliberately broken inboxes and assert that they fail.
"""

from __future__ import annotations

import abc
import asyncio
import random
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import pytest

from wakuwaku import event
from wakuwaku._events import EventType, Registry, event_type
from wakuwaku._records import H_SRC, Record, Source, build_headers, encode_source
from wakuwaku.inbox import Claim, EntryStatus, Inbox, InboxEntry, InboxKey, record_keys
from wakuwaku.testing import FakeClock

MAX_ATTEMPTS = 3
GROUP = "billing"

_registry = Registry()


@event("test.inbox.charged", key="account", registry=_registry)
class Charged(msgspec.Struct, frozen=True):
    account: str
    cents: int


@event("test.inbox.mailed", key="account", id="mail_id", registry=_registry)
class Mailed(msgspec.Struct, frozen=True):
    account: str
    mail_id: str


CHARGED: EventType[Charged] = event_type(Charged)
MAILED: EventType[Mailed] = event_type(Mailed)


def charged_record(offset: int, tenant: str | None = None, cents: int = 100) -> Record:
    """A main-topic record as the producer writes it, with or without a tenant property."""
    props = {"tenant": tenant} if tenant is not None else None
    value = Charged("acct-1", cents)
    return Record(offset, build_headers(CHARGED, value.account, props), CHARGED.encode(value))


def retry_copy(offset: int, source: Source) -> Record:
    """A retry-topic copy: its own offset, the ``wk-src`` header naming the originals."""
    value = Charged("acct-1", 100)
    headers = build_headers(
        CHARGED, value.account, {"tenant": "acme"}, extra=[(H_SRC, encode_source(source))]
    )
    return Record(offset, headers, CHARGED.encode(value))


KeyFunction = Callable[..., list[InboxKey]]


class Boom(Exception):
    """The handler's failure after it claimed (its transaction rolls back)."""


class Harness(abc.ABC):
    """One backend under test: an inbox and an effects table in one database."""

    inbox: Inbox
    clock: FakeClock

    @abc.abstractmethod
    async def apply(self, keys: Sequence[str | InboxKey], *, fail: bool = False) -> Claim:
        """One handler transaction: claim, count the new keys' effects, commit.

        :raises Boom: when ``fail`` (after the claim and the effects), rolled back.
        """

    @abc.abstractmethod
    async def applied(self, key: str) -> int:
        """How many times ``key``'s effect was applied (committed)."""

    @abc.abstractmethod
    async def apply_concurrently(self, key_sets: Sequence[Sequence[str]]) -> list[Claim]:
        """Run one :meth:`apply` per key set, each on its own connection, at once."""


# -- the core checks (also run against broken inboxes) ---------------------------------


async def entry_of(h: Harness, key: str) -> InboxEntry:
    """The row of ``key``; a missing row fails the check (AssertionError, not KeyError)."""
    found = (await h.inbox.entries([key])).get(key)
    assert found is not None, f"no inbox row for {key!r}"
    return found


async def check_claim_then_lookup(h: Harness, key_fn: KeyFunction = record_keys) -> None:
    """A claim followed by a lookup with the same inputs finds the row (design §9)."""
    keys = key_fn("charges", 2, charged_record(41, tenant="acme"))
    claim = await h.apply(keys)
    text = [k.message_key for k in keys]
    assert claim.new == text
    assert await h.inbox.claimed(text) == set(text)
    entries = await h.inbox.entries(text)
    assert set(entries) == set(text)
    assert all(e.status is EntryStatus.DONE for e in entries.values())
    # The engine's lookup, recomputed from the same record: still found.
    again = [k.message_key for k in key_fn("charges", 2, charged_record(41, tenant="acme"))]
    assert await h.inbox.claimed(again) == set(text)


async def check_tenant_never_in_key(h: Harness, key_fn: KeyFunction = record_keys) -> None:
    """A record with and without a tenant property is one message (seed 004)."""
    with_tenant = key_fn("charges", 0, charged_record(7, tenant="acme"))
    without = key_fn("charges", 0, charged_record(7))
    other_tenant = key_fn("charges", 0, charged_record(7, tenant="globex"))
    first = await h.apply(with_tenant)
    assert first.new == [with_tenant[0].message_key]
    for keys in (without, other_tenant):
        claim = await h.apply(keys)
        assert claim.new == [], "a tenant property changed the message identity"
        assert claim.duplicate == [keys[0].message_key]
        assert await h.inbox.claimed([keys[0].message_key]) == {keys[0].message_key}
    assert await h.applied(with_tenant[0].message_key) == 1


async def check_duplicate_says_duplicate(h: Harness) -> None:
    """A second claim says duplicate, never new, and raises nothing swallowed."""
    key = InboxKey.for_message("charges", 1, 100)
    assert (await h.apply([key])).new == [key.message_key]
    for _ in range(3):
        claim = await h.apply([key, "charges/1/101"])
        assert key.message_key in claim.duplicate
        assert key.message_key not in claim.new
        assert not claim.is_new(key)
    assert await h.applied(key.message_key) == 1
    assert await h.applied("charges/1/101") == 1
    # A claim whose transaction rolled back left nothing: the next one is new.
    with pytest.raises(Boom):
        await h.apply(["charges/1/102"], fail=True)
    assert await h.inbox.claimed(["charges/1/102"]) == set()
    assert (await h.apply(["charges/1/102"])).new == ["charges/1/102"]
    assert await h.applied("charges/1/102") == 1


async def check_failure_path(h: Harness) -> None:
    """The failure path advances attempts on the claim's row and dead-letters at the limit."""
    key = InboxKey.for_message("charges", 3, 9)
    for attempt in range(1, MAX_ATTEMPTS):
        with pytest.raises(Boom):
            await h.apply([key], fail=True)
        outcome = await h.inbox.record_failure(key, Boom(f"attempt {attempt}"))
        assert (outcome.attempts, outcome.dead_lettered) == (attempt, False)
        entry = await entry_of(h, key.message_key)
        assert (entry.status, entry.attempts) == (EntryStatus.FAILING, attempt)
        assert entry.last_error == f"Boom: attempt {attempt}"
        assert (entry.source_topic, entry.source_partition, entry.source_offset) == (
            "charges",
            3,
            9,
        )
        assert await h.inbox.claimed([key.message_key]) == set()
    outcome = await h.inbox.record_failure(key, "attempt 3 at /srv/app/handler.py")
    assert (outcome.attempts, outcome.dead_lettered) == (MAX_ATTEMPTS, True)
    entry = await entry_of(h, key.message_key)
    assert (entry.status, entry.attempts) == (EntryStatus.DEAD, MAX_ATTEMPTS)
    assert entry.last_error is not None and "/srv/app" not in entry.last_error
    stats = await h.inbox.stats()
    assert (stats.failing, stats.dead) == (0, 1)
    dead = await h.inbox.dead()
    assert [(d.message_key, d.attempts) for d in dead] == [(key.message_key, MAX_ATTEMPTS)]
    assert await h.applied(key.message_key) == 0
    # Failing again later (a redelivery) continues the count, never restarts it.
    again = await h.inbox.record_failure(key, "still broken")
    assert (again.attempts, again.dead_lettered) == (MAX_ATTEMPTS + 1, True)


async def check_claim_and_failure_share_the_row(h: Harness) -> None:
    """The claim's row is the failure path's row, both ways."""
    failing = InboxKey.for_message("charges", 4, 1)
    await h.inbox.record_failure(failing, "first try failed")
    # A failing key is not applied: the next claim of it is new.
    assert (await h.apply([failing])).new == [failing.message_key]
    entry = await entry_of(h, failing.message_key)
    assert (entry.status, entry.attempts) == (EntryStatus.DONE, 1)
    # A failure recorded for an applied key finds its row and changes nothing.
    outcome = await h.inbox.record_failure(failing, "late failure")
    assert outcome.already_claimed and not outcome.dead_lettered
    assert outcome.attempts == 1
    assert await h.inbox.claimed([failing.message_key]) == {failing.message_key}
    assert await h.applied(failing.message_key) == 1


CORE_CHECKS = (
    check_claim_then_lookup,
    check_tenant_never_in_key,
    check_duplicate_says_duplicate,
    check_failure_path,
    check_claim_and_failure_share_the_row,
)


class InboxContract:
    """Every backend's tests; a subclass provides the ``harness`` fixture."""

    @pytest.fixture
    def harness(self) -> Harness:  # pragma: no cover - overridden
        raise NotImplementedError

    async def test_claim_then_lookup_finds_the_row(self, harness: Harness) -> None:
        await check_claim_then_lookup(harness)

    async def test_tenant_property_never_takes_part_in_the_key(self, harness: Harness) -> None:
        await check_tenant_never_in_key(harness)

    async def test_duplicate_claim_says_duplicate(self, harness: Harness) -> None:
        await check_duplicate_says_duplicate(harness)

    async def test_failure_path_advances_attempts_and_dead_letters(self, harness: Harness) -> None:
        await check_failure_path(harness)

    async def test_claim_and_failure_paths_find_the_same_row(self, harness: Harness) -> None:
        await check_claim_and_failure_share_the_row(harness)

    async def test_own_id_and_retry_copies_dedupe_with_the_original(self, harness: Harness) -> None:
        original = record_keys("charges", 0, charged_record(5))
        copy = record_keys(
            "retry_charges",
            0,
            retry_copy(77, Source("charges", 0, (5,), (original[0].message_key,))),
        )
        assert copy == original
        assert (await harness.apply(original)).new == [original[0].message_key]
        assert (await harness.apply(copy)).duplicate == [original[0].message_key]
        # An event with its own id: republished at another offset, still one message.
        mail = Mailed("acct-1", "m-1")
        body = MAILED.encode(mail)
        first = Record(10, build_headers(MAILED, "acct-1"), body)
        republished = Record(11, build_headers(MAILED, "acct-1", {"tenant": "x"}), body)
        keys = record_keys("mails", 0, first, MAILED)
        assert keys == [InboxKey("id:test.inbox.mailed:m-1", "mails", 0, 10)]
        assert (await harness.apply(keys)).new == ["id:test.inbox.mailed:m-1"]
        claim = await harness.apply(record_keys("mails", 0, republished, MAILED, mail))
        assert claim.duplicate == ["id:test.inbox.mailed:m-1"]
        assert await harness.applied("id:test.inbox.mailed:m-1") == 1

    async def test_keys_repeated_in_one_claim_are_new_once(self, harness: Harness) -> None:
        claim = await harness.apply(["t/0/1", "t/0/2", "t/0/1"])
        assert claim.new == ["t/0/1", "t/0/2"]
        assert claim.duplicate == ["t/0/1"]
        assert await harness.applied("t/0/1") == 1

    async def test_large_claims_span_chunks(self, harness: Harness) -> None:
        keys = [f"big/0/{i}" for i in range(2500)]
        assert (await harness.apply(keys[:1200])).new == keys[:1200]
        claim = await harness.apply(keys)
        assert claim.new == keys[1200:]
        assert claim.duplicate == keys[:1200]
        assert await harness.inbox.claimed(keys) == set(keys)
        assert (await harness.inbox.stats()).claims == 2500

    async def test_claim_refuses_empty_keys(self, harness: Harness) -> None:
        from wakuwaku import ConfigError

        with pytest.raises(ConfigError):
            await harness.apply([""])
        with pytest.raises(ConfigError):
            await harness.apply("t/0/1")
        assert (await harness.apply([])).new == []

    async def test_ensure_schema_is_idempotent(self, harness: Harness) -> None:
        await harness.apply(["t/0/1"])
        await harness.inbox.ensure_schema()
        assert await harness.inbox.claimed(["t/0/1"]) == {"t/0/1"}

    async def test_concurrent_claims_apply_each_key_once(self, harness: Harness) -> None:
        keys = [f"c/0/{i}" for i in range(60)]
        rng = random.Random(4)
        key_sets = []
        for _ in range(6):
            chosen = rng.sample(keys, 40)
            key_sets.append(chosen)
        claims = await harness.apply_concurrently(key_sets)
        new = [k for c in claims for k in c.new]
        assert sorted(new) == sorted(set(new)), "a key was new in two transactions"
        covered = {k for s in key_sets for k in s}
        assert set(new) == covered
        counts = await asyncio.gather(*(harness.applied(k) for k in sorted(covered)))
        assert set(counts) == {1}

    async def test_purge_keeps_what_may_be_delivered_again(self, harness: Harness) -> None:
        inbox, clock = harness.inbox, harness.clock
        old = [InboxKey.for_message("charges", 0, o) for o in (1, 5, 9)]
        old += [InboxKey.for_message("charges", 1, 3), InboxKey("plain-old")]
        old += [InboxKey.for_message("refunds", 0, 1)]
        await harness.apply(old)
        await inbox.record_failure(InboxKey.for_message("charges", 0, 2), "failing, old")
        clock.advance(3600.0)
        young = [InboxKey.for_message("charges", 0, 0), InboxKey("plain-young")]
        await harness.apply(young)
        clock.advance(10.0)
        committed = {("charges", 0): 6, ("charges", 1): 3}
        deleted = await inbox.purge(60.0, committed)
        # Older than 60 s and below the committed offset (or without a source): gone.
        gone = {"charges/0/1", "charges/0/5", "plain-old"}
        assert deleted == len(gone)
        every = [k.message_key for k in old + young] + ["charges/0/2"]
        left = await inbox.entries(every)
        assert set(every) - set(left) == gone
        # charges/0/9 >= 6, charges/1/3 >= 3, refunds has no committed offset,
        # the young ones are inside the window, the failing row is never purged.
        assert left["charges/0/2"].status is EntryStatus.FAILING
        assert await inbox.purge(0.0, {}) == 1  # plain-young, by age alone
        from wakuwaku import ConfigError

        with pytest.raises(ConfigError):
            await inbox.purge(-1.0, {})

    async def test_failure_error_text_is_sanitized_and_limited(self, harness: Harness) -> None:
        raw = (
            b"bad \xff\xfe bytes \x1b[31m https://user:pw@db.internal/x "
            + "\u202e".encode()
            + b"y" * 5000
        )
        outcome = await harness.inbox.record_failure("t/0/66", raw)
        entry = (await harness.inbox.entries(["t/0/66"]))["t/0/66"]
        assert outcome.attempts == 1
        text = entry.last_error or ""
        assert len(text) <= harness.inbox.error_limit
        assert "pw@" not in text and "\x1b" not in text and "\u202e" not in text
        assert "\ufffd" in text


def effects_sql_counter() -> str:
    """The non-idempotent effect: one more application of a key (both backends)."""
    return (
        "INSERT INTO {fx} (message_key, n) VALUES ({p}, 1) "
        "ON CONFLICT (message_key) DO UPDATE SET n = {fx}.n + 1"
    )


def shuffle(items: Sequence[Any], seed: int) -> list[Any]:
    out = list(items)
    random.Random(seed).shuffle(out)
    return out
