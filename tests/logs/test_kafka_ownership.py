"""The Kafka log's ownership state machine, without a broker.

A member's :class:`Assignment` is told what the group coordinator decided
(assign, revoke, lose) and what the engine does (acquire, release); the
engine reads the outcome through ``ownership_state`` as plain strings.
"""

from __future__ import annotations

from wakuwaku.logs.kafka._ownership import Assignment, OwnershipState

P = ("orders", 0)


def owned() -> tuple[Assignment, int]:
    assignment = Assignment()
    assignment.assign([P])
    generation = assignment.acquire(*P)
    assert generation is not None
    return assignment, generation


def test_the_states_are_the_strings_the_engine_compares() -> None:
    for text in ("owned", "revoking", "gone"):
        state: str = OwnershipState(text)  # what the engine's AssignmentLog gets
        assert state == text and isinstance(state, str)


def test_each_assignment_gets_a_new_generation() -> None:
    assignment, first = owned()
    assignment.drop([P])
    assignment.assign([P])
    assert assignment.generation(*P) not in (None, first)
    assert assignment.state(*P, first) == "gone"


def test_a_held_partition_is_revoked_in_steps_the_engine_sees() -> None:
    assignment, generation = owned()
    (done,) = assignment.revoke([P], closing=False)
    assert assignment.state(*P, generation) == "revoking"
    assert assignment.acquire(*P) is None  # the engine is told: stop the worker
    assert assignment.state(*P, generation) == "revoking"  # stopped reads as revoking
    assert not done.is_set()
    assert assignment.acquire(*P) is None  # asked again: that worker is done
    assert done.is_set()
    assignment.drop([P])
    assert assignment.state(*P, generation) == "gone"
    assert assignment.generation(*P) is None


def test_releasing_a_revoking_partition_lets_the_revoke_go_on_without_leaving() -> None:
    assignment, generation = owned()
    (done,) = assignment.revoke([P], closing=False)
    assert assignment.release(*P, generation) is False
    assert done.is_set()


def test_a_partition_the_engine_does_not_hold_is_gone_at_once() -> None:
    assignment = Assignment()
    assignment.assign([P])
    generation = assignment.generation(*P)
    assert generation is not None
    assert assignment.revoke([P], closing=False) == []
    assert assignment.state(*P, generation) == "gone"
    assert assignment.acquire(*P) is None


def test_a_closing_member_waits_for_no_revoke() -> None:
    assignment, generation = owned()
    assert assignment.revoke([P], closing=True) == []
    assert assignment.state(*P, generation) == "gone"


def test_the_last_release_of_an_owned_partition_lets_the_member_leave() -> None:
    assignment, generation = owned()
    other = ("orders", 1)
    assignment.assign([other])
    second = assignment.acquire(*other)
    assert second is not None
    assert assignment.release(*P, generation + 1000) is False  # another generation: ignored
    assert assignment.release(*P, generation) is False  # still holds the other one
    assert assignment.release(*other, second) is True


def test_a_lost_partition_is_gone_and_no_longer_held() -> None:
    assignment, generation = owned()
    assignment.drop([P])
    assert assignment.state(*P, generation) == "gone"
    assert assignment.release(*P, generation) is False
