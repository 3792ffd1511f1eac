"""The one table of ledger operation transitions, enumerated pair by pair."""

from __future__ import annotations

from recovery.api import TERMINAL, TRANSITIONS, OperationState, can_transition
from recovery.states import INITIAL
from tests.unit.documented_states import OPERATION_STATES as STATES


def test_persisted_state_names_are_exactly_the_documented_ones():
    assert list(OperationState.values) == STATES


def test_terminal_states_are_those_with_no_way_out():
    assert set(TERMINAL) == {"succeeded", "failed", "pending", "effect_confirmed", "effect_absent"}
    for state in TERMINAL:
        assert not any(can_transition(state, target) for target in STATES)


def test_no_state_transitions_to_itself_and_nothing_returns_to_prepared():
    for state in STATES:
        assert not can_transition(state, state)
        assert not can_transition(state, "prepared")
    assert set(INITIAL) == {"prepared", "dispatched"}


def test_outcome_unknown_can_only_be_closed_by_an_operator_fact():
    # I3: a late provider answer cannot turn an uncertain outcome into success or failure.
    assert not can_transition("outcome_unknown", "succeeded")
    assert not can_transition("outcome_unknown", "failed")
    assert TRANSITIONS["outcome_unknown"] == {"effect_confirmed", "effect_absent"}
