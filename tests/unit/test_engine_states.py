"""The engine's states and its one table of step moves, enumerated pair by pair."""

from __future__ import annotations

import itertools

import pytest

from govflow.engine.states import (
    TERMINAL_STATUSES,
    TOKEN_ACTIVE,
    TOKEN_TERMINAL,
    TOKEN_TRANSITIONS,
    DeliveryState,
    InstanceStatus,
    TimerState,
    TokenState,
    token_may_move,
)

# The documented table (docs/architecture.md, "Step states"), written out independently.
ALLOWED = {
    ("ready", "executing"),
    ("ready", "completed"),
    ("ready", "failed"),
    ("ready", "cancelled"),
    ("executing", "ready"),
    ("executing", "completed"),
    ("executing", "failed"),
    ("executing", "outcome_unknown"),
    ("executing", "cancelled"),
    ("waiting", "ready"),
    ("waiting", "completed"),
    ("waiting", "cancelled"),
    ("waiting", "failed"),
    ("outcome_unknown", "completed"),
    ("outcome_unknown", "failed"),
    ("outcome_unknown", "cancelled"),
    ("failed", "ready"),
    ("failed", "waiting"),
}
STATES = [
    "ready",
    "executing",
    "waiting",
    "outcome_unknown",
    "completed",
    "failed",
    "cancelled",
]


def test_persisted_state_names_are_exactly_the_documented_ones():
    assert list(TokenState.values) == STATES
    assert list(TimerState.values) == ["scheduled", "fired"]
    assert list(DeliveryState.values) == ["received", "consumed"]
    assert list(InstanceStatus.values) == [
        "running",
        "waiting",
        "blocked",
        "completed",
        "failed",
        "cancelled",
    ]


def test_the_table_has_a_row_for_every_state_and_names_only_known_states():
    assert set(TOKEN_TRANSITIONS) == set(STATES)
    for targets in TOKEN_TRANSITIONS.values():
        assert targets <= set(STATES)


@pytest.mark.parametrize(("current", "target"), list(itertools.product(STATES, STATES)))
def test_every_pair_of_states_is_allowed_exactly_as_documented(current, target):
    expected = (current, target) in ALLOWED
    assert token_may_move(current, target) is expected
    assert (target in TOKEN_TRANSITIONS[current]) is expected


def test_the_table_allows_nothing_beyond_the_documented_pairs():
    pairs = {(c, t) for c, targets in TOKEN_TRANSITIONS.items() for t in targets}
    assert pairs == ALLOWED


def test_completed_and_cancelled_steps_never_move_again():
    assert set(TOKEN_TERMINAL) == {"completed", "cancelled"}
    for state in TOKEN_TERMINAL:
        assert not any(token_may_move(state, target) for target in STATES)


def test_an_uncertain_step_is_closed_only_by_a_decision_never_retried_or_redispatched():
    # I3: outcome_unknown moves only to what an approved decision records (effect
    # confirmed: completed; effect absent: failed; cancel: cancelled).
    assert TOKEN_TRANSITIONS["outcome_unknown"] == {"completed", "failed", "cancelled"}
    assert not token_may_move("outcome_unknown", "ready")
    assert not token_may_move("outcome_unknown", "executing")


def test_only_a_ready_step_is_dispatched_and_a_failed_one_only_retried():
    assert [s for s in STATES if token_may_move(s, "executing")] == ["ready"]
    # Retried: an action runs again (ready); a dead-lettered external task waits for the
    # new task the operator's retry created (waiting). Nothing else leaves "failed".
    assert TOKEN_TRANSITIONS["failed"] == {"ready", "waiting"}


def test_every_state_is_reachable_from_ready_or_waiting():
    reached = {"ready", "waiting"}
    frontier = list(reached)
    while frontier:
        for target in TOKEN_TRANSITIONS[frontier.pop()]:
            if target not in reached:
                reached.add(target)
                frontier.append(target)
    assert reached == set(STATES)


def test_active_steps_are_the_ones_that_can_still_move_on_their_own():
    assert set(TOKEN_ACTIVE) == {"ready", "executing", "waiting", "outcome_unknown"}
    assert set(TERMINAL_STATUSES) == {"completed", "failed", "cancelled"}


@pytest.mark.parametrize(
    ("current", "target"),
    [("unknown", "ready"), ("ready", "unknown"), ("", ""), ("Ready", "executing")],
)
def test_unknown_state_names_never_move(current, target):
    assert token_may_move(current, target) is False
