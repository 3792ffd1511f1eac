"""The one table of ledger operation transitions, enumerated pair by pair."""

from __future__ import annotations

import itertools

import pytest

from recovery.api import TERMINAL, TRANSITIONS, OperationState, can_transition
from recovery.states import INITIAL

# The documented table (DESIGN.md §6, docs/recovery.md), written out independently.
ALLOWED = {
    ("prepared", "dispatched"),
    ("prepared", "failed"),
    ("dispatched", "succeeded"),
    ("dispatched", "failed"),
    ("dispatched", "pending"),
    ("dispatched", "outcome_unknown"),
    ("outcome_unknown", "effect_confirmed"),
    ("outcome_unknown", "effect_absent"),
}
STATES = [
    "prepared",
    "dispatched",
    "succeeded",
    "failed",
    "pending",
    "outcome_unknown",
    "effect_confirmed",
    "effect_absent",
]


def test_persisted_state_names_are_exactly_the_documented_ones():
    assert list(OperationState.values) == STATES


def test_the_table_has_a_row_for_every_state_and_names_only_known_states():
    assert set(TRANSITIONS) == set(STATES)
    for targets in TRANSITIONS.values():
        assert targets <= set(STATES)


@pytest.mark.parametrize(("current", "target"), list(itertools.product(STATES, STATES)))
def test_every_pair_of_states_is_allowed_exactly_as_documented(current, target):
    expected = (current, target) in ALLOWED
    assert can_transition(current, target) is expected
    assert (target in TRANSITIONS[current]) is expected


def test_the_table_allows_nothing_beyond_the_documented_pairs():
    pairs = {(current, target) for current, targets in TRANSITIONS.items() for target in targets}
    assert pairs == ALLOWED


def test_terminal_states_are_those_with_no_way_out():
    assert set(TERMINAL) == {"succeeded", "failed", "pending", "effect_confirmed", "effect_absent"}
    for state in TERMINAL:
        assert not any(can_transition(state, target) for target in STATES)


def test_no_state_transitions_to_itself_and_nothing_returns_to_prepared():
    for state in STATES:
        assert not can_transition(state, state)
        assert not can_transition(state, "prepared")
    assert set(INITIAL) == {"prepared", "dispatched"}


def test_every_state_is_reachable_from_an_initial_state():
    reached = set(INITIAL)
    frontier = list(INITIAL)
    while frontier:
        for target in TRANSITIONS[frontier.pop()]:
            if target not in reached:
                reached.add(target)
                frontier.append(target)
    assert reached == set(STATES)


@pytest.mark.parametrize(
    ("current", "target"),
    [
        ("unknown", "dispatched"),
        ("dispatched", "unknown"),
        ("", ""),
        ("Dispatched", "failed"),
    ],
)
def test_unknown_state_names_never_transition(current, target):
    assert can_transition(current, target) is False


def test_outcome_unknown_can_only_be_closed_by_an_operator_fact():
    # I3: a late provider answer cannot turn an uncertain outcome into success or failure.
    assert not can_transition("outcome_unknown", "succeeded")
    assert not can_transition("outcome_unknown", "failed")
    assert TRANSITIONS["outcome_unknown"] == {"effect_confirmed", "effect_absent"}
