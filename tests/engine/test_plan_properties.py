"""Property tests of the planner (design §2, §4, §5.1-5.3) and of execution (design §5-7).

The first half drives the pure functions of ``engine/_plan.py`` with random
batches: several keys, a plain, an idempotent and an associative type (whose
``combine`` sometimes returns None and sometimes raises), records with
broken headers, undecodable bodies and replayed ``wk-src`` identities.

The second half runs the real :class:`Consumer` on a :class:`MemoryLog`
with a :class:`FakeClock` against a random failure pattern and checks the
at-least-once contract and per-key order.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wakuwaku as wk
from wakuwaku._records import (
    H_ALG,
    H_KEY,
    H_PROPS,
    H_SRC,
    H_TYPE,
    H_VERSION,
    ReasonCode,
    Record,
    Source,
    build_headers,
    encode_source,
    message_id,
)
from wakuwaku.engine import Consumer, ConsumerConfig, Handler
from wakuwaku.engine._plan import (
    Item,
    Reject,
    Run,
    Segment,
    Where,
    _decode_one,
    chunks,
    decode_batch,
    decode_records,
    plan,
    plan_groups,
    runs_by_key,
)
from wakuwaku.testing import FakeClock

REGISTRY = wk.Registry()
TOPIC = "props"
PARTITION = 3
KEYS = ("a", "b", "c")


@wk.event("props.plain", key="key", registry=REGISTRY)
class Plain(msgspec.Struct, frozen=True):
    key: str
    n: int


@wk.event("props.idem", key="key", algebra="idempotent", registry=REGISTRY)
class Idem(msgspec.Struct, frozen=True):
    """Values come from a tiny range, so equal neighbours are common."""

    key: str
    value: int


def _assoc_combine(a: Assoc, b: Assoc) -> Assoc | None:
    if b.total == 7:
        raise ArithmeticError("seven does not combine")  # the planner keeps them apart
    if b.total % 3 == 0:
        return None
    return Assoc(a.key, a.total + b.total, a.parts + b.parts)


@wk.event(
    "props.assoc", key="key", algebra="associative", combine=_assoc_combine, registry=REGISTRY
)
class Assoc(msgspec.Struct, frozen=True):
    """``parts`` remembers every addend, so a wrong fold order is visible."""

    key: str
    total: int
    parts: tuple[int, ...]


@wk.event("props.unregistered", key="key", registry=wk.Registry())
class Stranger(msgspec.Struct, frozen=True):
    key: str


TYPES = {t.tag: t for t in REGISTRY}
TYPE_OF = {"plain": Plain, "idem": Idem, "assoc": Assoc}


# ---------------------------------------------------------------- generation


@dataclass(frozen=True)
class Spec:
    """One generated record: what it is and what the planner must do with it."""

    kind: str  # plain | idem | assoc | replayed | broken kinds below
    key: str
    value: int
    expect: ReasonCode | None = None


BROKEN: dict[str, ReasonCode] = {
    "no_key": ReasonCode.MALFORMED_HEADER,
    "bad_version": ReasonCode.MALFORMED_HEADER,
    "bad_props": ReasonCode.MALFORMED_HEADER,
    "bad_src": ReasonCode.MALFORMED_HEADER,
    "unknown_type": ReasonCode.UNKNOWN_TYPE,
    "algebra_mismatch": ReasonCode.ALGEBRA_MISMATCH,
    "bad_body": ReasonCode.UNDECODABLE_BODY,
}

_valid = st.builds(
    Spec,
    kind=st.sampled_from(["plain", "idem", "assoc", "assoc", "replayed"]),
    key=st.sampled_from(KEYS),
    value=st.integers(0, 9),
)
_broken = st.sampled_from(sorted(BROKEN)).flatmap(
    lambda kind: st.builds(
        Spec,
        kind=st.just(kind),
        key=st.sampled_from(KEYS),
        value=st.integers(0, 9),
        expect=st.just(BROKEN[kind]),
    )
)
specs = st.lists(st.one_of(_valid, _valid, _valid, _broken), max_size=40)
gaps = st.lists(st.integers(1, 3), min_size=40, max_size=40)


def _event_of(spec: Spec) -> Any:
    if spec.kind in ("plain", "replayed"):
        return Plain(spec.key, spec.value)
    if spec.kind == "idem":
        return Idem(spec.key, spec.value % 2)
    return Assoc(spec.key, spec.value, (spec.value,))


def _encode(spec: Spec) -> tuple[dict[str, bytes], bytes]:
    if spec.kind in BROKEN:
        return _broken_record(spec)
    value = _event_of(spec)
    etype = wk.event_type(value)
    headers = build_headers(etype, spec.key)
    if spec.kind == "replayed":
        headers[H_SRC] = encode_source(
            Source(TOPIC, 0, (1000 + spec.value,), (f"id:replayed:{spec.value}",))
        )
    return headers, etype.encode(value)


def _broken_record(spec: Spec) -> tuple[dict[str, bytes], bytes]:
    etype = wk.event_type(Plain)
    headers = build_headers(etype, spec.key)
    body = etype.encode(Plain(spec.key, spec.value))
    if spec.kind == "no_key":
        del headers[H_KEY]
    elif spec.kind == "bad_version":
        headers[H_VERSION] = b"2"
    elif spec.kind == "bad_props":
        headers[H_PROPS] = b"{not json"
    elif spec.kind == "bad_src":
        headers[H_SRC] = b"[1, 2"
    elif spec.kind == "unknown_type":
        headers = build_headers(wk.event_type(Stranger), spec.key)
    elif spec.kind == "algebra_mismatch":
        headers = build_headers(wk.event_type(Idem), spec.key)
        headers[H_ALG] = b"plain"
    elif spec.kind == "bad_body":
        body = b'{"key": "' + spec.key.encode() + b'", "n": "nope"}'
    return headers, body


def build_batch(batch: Sequence[Spec], steps: Sequence[int]) -> list[Record]:
    records = []
    offset = 10
    for spec, step in zip(batch, steps, strict=False):
        headers, body = _encode(spec)
        records.append(Record(offset, headers, body))
        offset += step
    return records


def decoded(record: Record) -> Any:
    return TYPES[record.headers[H_TYPE].decode()].decode(record.body)


# ---------------------------------------------------------------- properties


def check_accounting(
    records: list[Record], items: list[Item], rejects: list[Any], batch: Sequence[Spec]
) -> None:
    """Every input offset is in exactly one item's sources or one reject."""
    seen = [r.offset for item in items for r in item.sources] + [x.record.offset for x in rejects]
    assert sorted(seen) == [r.offset for r in records]
    expected = {r.offset: spec.expect for r, spec in zip(records, batch, strict=False)}
    for reject in rejects:
        assert reject.reason is expected[reject.record.offset], reject
    assert {r.offset for item in items for r in item.sources} == {
        off for off, why in expected.items() if why is None
    }


def check_identities(items: list[Item]) -> None:
    for item in items:
        assert len(item.origins) == len(item.sources)
        for record, origin in zip(item.sources, item.origins, strict=True):
            assert origin.offsets == (record.offset,)
            if H_SRC in record.headers:
                assert origin.ids == (f"id:replayed:{decoded(record).n}",)
            else:
                assert origin.ids == (message_id(TOPIC, PARTITION, record.offset),)


def check_segments(segments: list[Segment], items: list[Item]) -> None:
    keys = [seg.key for seg in segments]
    assert len(keys) == len(set(keys)), "one segment per key"
    before: dict[str, list[int]] = defaultdict(list)  # a key's decoded items, by offset
    for item in items:
        before[item.key].append(item.sources[0].offset)
    for seg in segments:
        position = {off: i for i, off in enumerate(before[seg.key])}
        offsets = [r.offset for item in seg.items() for r in item.sources]
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets), (
            f"key {seg.key!r}: order lost: {offsets}"
        )
        for index, run in enumerate(seg.runs):
            assert run, "a run is never empty"
            etype = run[0].event_type
            if index:
                assert etype is not seg.runs[index - 1][0].event_type, "runs are maximal"
            for item in run:
                assert item.key == seg.key and item.event_type is etype
                for record in item.sources:
                    assert record.headers[H_KEY].decode() == seg.key, "merged across keys"
                    assert record.headers[H_TYPE].decode() == etype.tag, "merged across types"
                places = [position[r.offset] for r in item.sources]
                assert places == list(range(places[0], places[0] + len(places))), (
                    "merged events that were not adjacent"
                )
            check_reduction(list(run))


def check_reduction(run: list[Item]) -> None:
    """A combined event is the left fold of its sources; the fold stops only where it must."""
    etype = run[0].event_type
    for item in run:
        events = [decoded(r) for r in item.sources]
        if etype.algebra is wk.Algebra.PLAIN:
            assert len(events) == 1 and item.event == events[0] and not item.reduced
        elif etype.algebra is wk.Algebra.IDEMPOTENT:
            assert all(e == item.event for e in events)
        else:
            folded = functools.reduce(_assoc_combine_strict, events)
            assert folded == item.event
        assert item.reduced == (len(item.sources) > 1)
    for left, right in itertools.pairwise(run):
        first = decoded(right.sources[0])
        if etype.algebra is wk.Algebra.IDEMPOTENT:
            assert left.event != first, "equal neighbours left apart"
        elif etype.algebra is wk.Algebra.ASSOCIATIVE:
            try:
                merged = _assoc_combine(left.event, first)
            except ArithmeticError:
                merged = None
            assert merged is None, "combinable neighbours left apart"


def _assoc_combine_strict(a: Assoc, b: Assoc) -> Assoc:
    merged = _assoc_combine(a, b)
    assert merged is not None, "an item folds events that do not combine"
    return merged


def check_chunks(segments: list[Segment], max_batch: int) -> None:
    for seg in segments:
        for run in seg.runs:
            cut = chunks(run, max_batch)
            assert all(1 <= len(c) <= max_batch for c in cut)
            assert [i for c in cut for i in c] == list(run)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=specs, steps=gaps, max_batch=st.integers(1, 4))
def test_planner_keeps_order_accounts_for_every_record_and_reduces_only_neighbours(
    batch: list[Spec], steps: list[int], max_batch: int
) -> None:
    records = build_batch(batch, steps)
    items, rejects = decode_records(records, TOPIC, PARTITION, TYPES)
    check_accounting(records, items, rejects, batch)
    check_identities(items)
    segments = plan(items)
    planned = [i for seg in segments for i in seg.items()]
    assert sorted(r.offset for i in planned for r in i.sources) == sorted(
        r.offset for i in items for r in i.sources
    ), "reduction lost or duplicated a record"
    check_segments(segments, items)
    check_chunks(segments, max_batch)


def careful_decode(records: Sequence[Record]) -> tuple[list[Item], list[Reject]]:
    """Every record through the planner's careful path alone, one at a time:
    the reference the short path of :func:`decode_batch` must agree with."""
    items: list[Item] = []
    rejects: list[Reject] = []
    for record in records:
        item = _decode_one(record, Where(TOPIC, PARTITION), TYPES, False, rejects, None)
        if item is not None:
            items.append(item)
    return items, rejects


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=specs, steps=gaps)
def test_decode_batch_groups_exactly_as_runs_by_key_does(
    batch: list[Spec], steps: list[int]
) -> None:
    """The engine's one-pass decode-and-group equals decoding each record the
    careful way (every header checked), then grouping."""
    records = build_batch(batch, steps)
    items, groups, rejects = decode_batch(records, TOPIC, PARTITION, TYPES)
    assert (items, rejects) == careful_decode(records), "the short path agrees with the careful one"
    assert (items, rejects) == decode_records(records, TOPIC, PARTITION, TYPES)
    expected = runs_by_key(items)
    assert list(groups) == list(expected), "keys in first-seen order"
    for key, runs in expected.items():
        assert [[id(i) for i in run] for run in groups[key]] == [
            [id(i) for i in run] for run in runs
        ]
        assert [run.events for run in groups[key]] == [[i.event for i in run] for run in runs], (
            "a run's events are its items' events"
        )
    # Compact runs keep bare records where an item would be the plain one of
    # its record: read back, they are the same items.
    nothing, compacted, compact_rejects = decode_batch(
        records, TOPIC, PARTITION, TYPES, compact=True
    )
    assert nothing == [] and compact_rejects == rejects
    assert list(compacted) == list(expected)
    for key, runs in expected.items():
        assert [list(run) for run in compacted[key]] == [list(run) for run in runs]
        assert [run.events for run in compacted[key]] == [run.events for run in runs]
        assert [list(chunk) for run in compacted[key] for chunk in chunks(run, 2)] == [
            list(chunk) for run in runs for chunk in chunks(run, 2)
        ]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=specs, steps=gaps)
def test_records_sharing_one_headers_dict_decode_as_if_each_had_its_own(
    batch: list[Spec], steps: list[int]
) -> None:
    """SQLiteLog hands out one dict for equal headers; the planner's per-dict
    memo must not change what any record decodes to or why it is rejected."""
    records = build_batch(batch, steps)
    shared: dict[tuple[tuple[str, bytes], ...], dict[str, bytes]] = {}
    interned = [
        Record(
            r.offset,
            shared.setdefault(tuple(sorted(r.headers.items())), r.headers),
            r.body,
            r.timestamp,
        )
        for r in records
    ]
    assert (
        decode_batch(interned, TOPIC, PARTITION, TYPES)[2]
        == decode_batch(records, TOPIC, PARTITION, TYPES)[2]
    )
    got, _, _ = decode_batch(interned, TOPIC, PARTITION, TYPES)
    want, _, _ = decode_batch(records, TOPIC, PARTITION, TYPES)
    assert [(i.key, i.tag, i.event, i.record.offset, i.ids) for i in got] == [
        (i.key, i.tag, i.event, i.record.offset, i.ids) for i in want
    ]


def test_a_run_of_bare_records_reads_as_the_items_of_those_records() -> None:
    batch = [Spec("plain", "a", n) for n in (1, 2, 3)] + [Spec("replayed", "a", 4)]
    records = build_batch(batch, [1] * len(batch))
    items, _ = decode_records(records, TOPIC, PARTITION, TYPES)
    _, groups, _ = decode_batch(records, TOPIC, PARTITION, TYPES, compact=True)
    (run,) = groups["a"]
    # Three bare records, and the replayed one's item (its identity is its wk-src).
    assert [type(e).__name__ for e in run.entries] == ["Record"] * 3 + ["Item"]
    assert run.entries[3] == items[3]
    assert len(run) == 4 and list(run) == items
    assert run[0] == items[0] and run[-1] == items[-1]
    assert isinstance(run[1:3], Run) and list(run[1:3]) == items[1:3]
    assert items[1] in run and items[0] not in run[1:]
    assert run.events == [i.event for i in items]
    assert [i.ids for i in run] == [i.ids for i in items]
    assert Run.of(items).entries == items and list(Run.of(items)) == items
    # With plain types only, planning without the reduction check is the same.
    assert plan_groups(groups, reduces=False) == plan_groups(groups)


def test_the_generator_reaches_every_case(caplog: pytest.LogCaptureFixture) -> None:
    """Guard against a vacuous property: these batches hit reduction and every reject."""
    batch = [
        Spec("assoc", "a", 1),
        Spec("assoc", "a", 2),
        Spec("assoc", "a", 3),
        Spec("idem", "b", 2),
        Spec("bad_body", "b", 0, ReasonCode.UNDECODABLE_BODY),
        Spec("idem", "b", 4),
        Spec("assoc", "a", 7),
        Spec("replayed", "c", 5),
    ]
    batch += [Spec(kind, "c", 0, why) for kind, why in BROKEN.items()]
    records = build_batch(batch, [1] * len(batch))
    items, rejects = decode_records(records, TOPIC, PARTITION, TYPES)
    check_accounting(records, items, rejects, batch)
    with caplog.at_level(logging.ERROR, logger="wakuwaku.consumer"):
        segments = plan(items)
    check_segments(segments, items)
    a, b, c = (next(s for s in segments if s.key == k) for k in KEYS)
    # 1+2 combine; 3 starts anew (3 % 3 == 0); 7 raises in combine and stays apart.
    assert [i.event.parts for i in a.items()] == [(1, 2), (3,), (7,)]
    (failed,) = [r for r in caplog.records if r.getMessage() == "combine failed; events kept apart"]
    assert (failed.topic, failed.partition, failed.key) == (TOPIC, PARTITION, "a")  # type: ignore[attr-defined]
    assert failed.offsets == [records[2].offset, records[6].offset]  # type: ignore[attr-defined]
    assert "seven does not combine" in failed.error  # type: ignore[attr-defined]
    # The undecodable record between two equal Idem events does not stop the collapse.
    assert [len(i.sources) for i in b.items()] == [2]
    assert c.items()[0].ids == ("id:replayed:5",)
    assert sorted(x.reason.value for x in rejects if x.reason is not None) == sorted(
        [ReasonCode.UNDECODABLE_BODY.value] + [r.value for r in BROKEN.values()]
    )


# ----------------------------------------------------------------- execution


@wk.event("props.job", key="key")
class Job(msgspec.Struct, frozen=True):
    key: str
    id: int


OUTCOMES = ("ok", "unrecoverable", "retryable", "transient")
_outcome = st.one_of(
    st.just(("ok", 0)),
    st.just(("ok", 0)),
    st.just(("unrecoverable", 1)),
    st.tuples(st.just("retryable"), st.integers(1, 2)),
    st.just(("transient", 1)),
)
scenarios = st.lists(st.tuples(st.sampled_from(KEYS), _outcome), min_size=1, max_size=12)


class Scripted:
    """Fails each event as scripted: Unrecoverable always; Retryable/Transient N times."""

    def __init__(self, plan: dict[int, tuple[str, int]]) -> None:
        self.left = {i: n for i, (_, n) in plan.items()}
        self.plan = plan
        self.handled: list[Job] = []

    async def __call__(self, chunk: Sequence[Job]) -> None:
        for job in chunk:
            outcome, _ = self.plan[job.id]
            if outcome == "unrecoverable":
                raise wk.Unrecoverable(f"job {job.id} is poison")
            if outcome in ("retryable", "transient") and self.left[job.id] > 0:
                self.left[job.id] -= 1
                raise (wk.Retryable if outcome == "retryable" else wk.Transient)(
                    f"job {job.id} not yet"
                )
        self.handled.extend(chunk)


async def _execute(
    jobs: list[tuple[str, tuple[str, int]]], max_batch: int, poll: int
) -> tuple[Scripted, set[int]]:
    log = wk.MemoryLog()
    await log.create_topic("jobs", 2)
    await wk.Producer(log, "jobs").publish_many(Job(key, i) for i, (key, _) in enumerate(jobs))
    script = Scripted({i: outcome for i, (_, outcome) in enumerate(jobs)})
    clock = FakeClock()
    config = ConsumerConfig(
        topic="jobs",
        group="g",
        clock=clock,
        retry_delays=(1.0, 2.0, 4.0),
        max_poll_records=poll,
        lease_ttl=3600.0,
    )
    await Consumer(config, [Handler(Job, script, max_batch=max_batch)], log).drain()
    dead: set[int] = set()
    for partition in range(2):
        for record in await log.read("wk-dlq.g.jobs", partition, 0, 10_000):
            dead.add(msgspec.json.decode(record.body, type=Job).id)
    return script, dead


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs=scenarios, max_batch=st.integers(1, 3), poll=st.integers(1, 5))
def test_every_event_is_handled_or_dead_lettered_and_each_key_keeps_its_order(
    jobs: list[tuple[str, tuple[str, int]]], max_batch: int, poll: int
) -> None:
    script, dead = asyncio.run(_execute(jobs, max_batch, poll))
    handled = [job.id for job in script.handled]
    everything = set(range(len(jobs)))
    assert set(handled) | dead == everything, f"lost: {everything - set(handled) - dead}"
    assert not set(handled) & dead, "handled and dead-lettered"
    assert len(handled) == len(set(handled)), "handled twice without a crash"
    for key in KEYS:
        mine = [job.id for job in script.handled if job.key == key]
        assert mine == sorted(mine), f"key {key!r} handled out of order: {mine}"
        outcomes = {outcome for k, (outcome, _) in jobs if k == key}
        if outcomes <= {"ok", "transient"}:
            assert set(mine) == {i for i, (k, _) in enumerate(jobs) if k == key}
    for i, (_, (outcome, _)) in enumerate(jobs):
        if outcome == "unrecoverable":
            assert i in dead
