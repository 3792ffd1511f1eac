"""Both state tables — ledger operations and the engine's steps — checked the same way:
a row for every persisted state, exactly the documented moves, every state reachable, and
unknown names never move."""

from __future__ import annotations

import itertools

import pytest

from govflow.engine.states import TOKEN_TRANSITIONS
from recovery.api import TRANSITIONS, TransitionTable
from recovery.states import INITIAL
from tests.unit.documented_states import (
    OPERATION_MOVES,
    OPERATION_STATES,
    TOKEN_MOVES,
    TOKEN_STATES,
)

TABLES = {
    "operation": (TRANSITIONS, OPERATION_STATES, OPERATION_MOVES, set(INITIAL)),
    "token": (TOKEN_TRANSITIONS, TOKEN_STATES, TOKEN_MOVES, {"ready", "waiting"}),
}
PAIRS = [
    (name, current, target)
    for name, (_, states, _, _) in TABLES.items()
    for current, target in itertools.product(states, states)
]


@pytest.mark.parametrize("name", TABLES)
def test_the_table_has_a_row_for_every_state_and_names_only_known_states(name):
    table, states, _, _ = TABLES[name]
    assert set(table) == set(states)
    for targets in table.values():
        assert targets <= set(states)


@pytest.mark.parametrize(("name", "current", "target"), PAIRS)
def test_every_pair_of_states_is_allowed_exactly_as_documented(name, current, target):
    table, _, documented, _ = TABLES[name]
    expected = (current, target) in documented
    assert table.allows(current, target) is expected
    assert (target in table[current]) is expected


@pytest.mark.parametrize("name", TABLES)
def test_the_table_allows_nothing_beyond_the_documented_pairs(name):
    table, _, documented, _ = TABLES[name]
    assert {(c, t) for c, targets in table.items() for t in targets} == documented


@pytest.mark.parametrize("name", TABLES)
def test_every_state_is_reachable_from_where_it_starts(name):
    table, states, _, starts = TABLES[name]
    reached, frontier = set(starts), list(starts)
    while frontier:
        for target in table[frontier.pop()]:
            if target not in reached:
                reached.add(target)
                frontier.append(target)
    assert reached == set(states)


@pytest.mark.parametrize("name", TABLES)
@pytest.mark.parametrize(
    ("current", "target"),
    [("unknown", "ready"), ("dispatched", "unknown"), ("", ""), ("Dispatched", "failed")],
)
def test_unknown_state_names_never_move(name, current, target):
    assert TABLES[name][0].allows(current, target) is False


def test_a_table_naming_a_target_without_a_row_is_refused_where_it_is_written():
    with pytest.raises(ValueError, match=r"Targets without a row of their own: \['done'\]"):
        TransitionTable({"open": {"done"}})
