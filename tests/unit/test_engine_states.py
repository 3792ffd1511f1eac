"""The engine's states and its one table of step moves, enumerated pair by pair."""

from __future__ import annotations

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
from tests.unit.documented_states import TOKEN_STATES as STATES


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


def test_active_steps_are_the_ones_that_can_still_move_on_their_own():
    assert set(TOKEN_ACTIVE) == {"ready", "executing", "waiting", "outcome_unknown"}
    assert set(TERMINAL_STATUSES) == {"completed", "failed", "cancelled"}
