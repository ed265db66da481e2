"""The contract's checks fail on deliberately broken inboxes (design §9, seed 004).

A test that cannot fail proves nothing. Each variant below reintroduces one
way seed 004's inbox was broken (or a close cousin), and the table says which
core checks of ``contract.py`` must fail on it. Each expected failure is run
inside ``pytest.raises(AssertionError)``; each check not listed must still
pass, so the table is exact, not "something failed somewhere".
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from wakuwaku._records import H_PROPS, Record, message_id
from wakuwaku.inbox import (
    Claim,
    FailureOutcome,
    InboxEntry,
    InboxKey,
    SQLiteInbox,
    record_keys,
)
from wakuwaku.inbox._base import normalize_keys, split_claim

from .contract import (
    CORE_CHECKS,
    Harness,
    check_claim_and_failure_share_the_row,
    check_claim_then_lookup,
    check_duplicate_says_duplicate,
    check_failure_path,
    check_tenant_never_in_key,
)
from .test_sqlite import make_harness

TENANT = "acme"


def _text(key: str | InboxKey) -> str:
    return key.message_key if isinstance(key, InboxKey) else key


class TenantLookupInbox(SQLiteInbox):
    """Seed 004 itself: the claim writes (group, key); lookup and failure path look
    for (group, tenant + key), a key half the index never stored."""

    def _looked_up(self, key: str) -> str:
        return f"{TENANT}|{key}"

    async def claimed(self, keys: Sequence[str]) -> set[str]:
        found = await super().claimed([self._looked_up(k) for k in keys])
        return {k for k in keys if self._looked_up(k) in found}

    async def entries(self, keys: Sequence[str]) -> dict[str, InboxEntry]:
        found = await super().entries([self._looked_up(k) for k in keys])
        return {k: found[self._looked_up(k)] for k in keys if self._looked_up(k) in found}

    async def record_failure(
        self, key: str | InboxKey, error: BaseException | str | bytes
    ) -> FailureOutcome:
        return await super().record_failure(self._looked_up(_text(key)), error)


class FailurePathLookupInbox(TenantLookupInbox):
    """Only the failure path's lookup is broken (the half nobody watched in seed 004)."""

    async def claimed(self, keys: Sequence[str]) -> set[str]:
        return await SQLiteInbox.claimed(self, keys)

    async def entries(self, keys: Sequence[str]) -> dict[str, InboxEntry]:
        return await SQLiteInbox.entries(self, keys)


class IntegrityErrorMeansDoneInbox(SQLiteInbox):
    """A plain INSERT whose unique violation a fallback reads as "someone else has it"."""

    def claim(self, conn: sqlite3.Connection, keys: Sequence[str | InboxKey]) -> Claim:
        order, distinct = normalize_keys(keys)
        returned: set[str] = set()
        for key in distinct:
            try:
                conn.execute(
                    f"INSERT INTO {self.table} (consumer_group, message_key, status, "
                    "claimed_at) VALUES (?, ?, 'done', 0)",
                    (self.group, key.message_key),
                )
                returned.add(key.message_key)
            except sqlite3.IntegrityError:
                pass  # the bug: "already claimed by another delivery"
        return split_claim(order, returned)


class IntegrityErrorMeansNewInbox(SQLiteInbox):
    """A plain INSERT whose unique violation is swallowed as success."""

    def claim(self, conn: sqlite3.Connection, keys: Sequence[str | InboxKey]) -> Claim:
        order, distinct = normalize_keys(keys)
        for key in distinct:
            # The bug: the error is dropped and the key reported new.
            with contextlib.suppress(sqlite3.IntegrityError):
                conn.execute(
                    f"INSERT INTO {self.table} (consumer_group, message_key, status, "
                    "claimed_at) VALUES (?, ?, 'done', 0)",
                    (self.group, key.message_key),
                )
        return split_claim(order, {k.message_key for k in distinct})


class DoNothingInbox(SQLiteInbox):
    """``ON CONFLICT DO NOTHING``: a row that only recorded failures blocks the claim."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        claim = self._q["claim"]
        self._q["claim"] = claim[: claim.index("DO UPDATE")] + "DO NOTHING RETURNING message_key"


def tenant_record_keys(topic: str, partition: int, record: Record, *args: Any) -> list[InboxKey]:
    """A key function that lets the tenant property into the identity."""
    import json

    props = json.loads(record.headers.get(H_PROPS, b"{}"))
    key = message_id(topic, partition, record.offset)
    return [InboxKey(f"{props.get('tenant', '')}|{key}", topic, partition, record.offset)]


Check = Callable[[Harness], Awaitable[None]]

VARIANTS: dict[str, tuple[type[SQLiteInbox], Callable[..., list[InboxKey]], set[Check]]] = {
    "lookup keyed by tenant + key (seed 004)": (
        TenantLookupInbox,
        record_keys,
        {
            check_claim_then_lookup,
            check_tenant_never_in_key,
            check_failure_path,
            check_claim_and_failure_share_the_row,
        },
    ),
    "failure path keyed by tenant + key": (
        FailurePathLookupInbox,
        record_keys,
        {check_failure_path, check_claim_and_failure_share_the_row},
    ),
    "key function includes the tenant": (
        SQLiteInbox,
        tenant_record_keys,
        {check_tenant_never_in_key},
    ),
    "unique violation read as done": (
        IntegrityErrorMeansDoneInbox,
        record_keys,
        {check_claim_and_failure_share_the_row},
    ),
    "unique violation read as new": (
        IntegrityErrorMeansNewInbox,
        record_keys,
        {
            check_tenant_never_in_key,
            check_duplicate_says_duplicate,
            check_claim_and_failure_share_the_row,
        },
    ),
    "ON CONFLICT DO NOTHING": (
        DoNothingInbox,
        record_keys,
        {check_claim_and_failure_share_the_row},
    ),
}


async def _run(check: Check, harness: Harness, key_fn: Callable[..., list[InboxKey]]) -> None:
    if check in (check_claim_then_lookup, check_tenant_never_in_key):
        await check(harness, key_fn)
    else:
        await check(harness)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("check", CORE_CHECKS, ids=lambda c: c.__name__)
async def test_core_checks_fail_exactly_where_the_key_is_broken(
    tmp_path: Path, variant: str, check: Check
) -> None:
    inbox_cls, key_fn, failing = VARIANTS[variant]
    harness = await make_harness(tmp_path / "projection.db", inbox_cls)
    if check in failing:
        with pytest.raises(AssertionError):
            await _run(check, harness, key_fn)
    else:
        await _run(check, harness, key_fn)


async def test_the_sound_inbox_passes_every_core_check(tmp_path: Path) -> None:
    for number, check in enumerate(CORE_CHECKS):
        harness = await make_harness(tmp_path / f"p{number}.db")
        await _run(check, harness, record_keys)
