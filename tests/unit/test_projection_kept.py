"""A run's projection fingerprint, its instance's part kept between changes (ADR 0044).

``Projector`` must give exactly :func:`projection_of`'s fingerprint for every view: the
bytes it puts together are the canonical bytes of the whole value, and its kept part is
made again whenever the variables change. No database: the models are not saved.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from govflow.engine import projection
from govflow.engine.models import Instance, Token, TokenState
from govflow.engine.projection import Projector, projection_of

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=12,
)
states = st.sampled_from([str(state) for state in TokenState])


def _instance(variables, access, tenant="t") -> Instance:
    return Instance(
        pk=7,
        definition_id=3,
        definition_fp="f" * 64,
        tenant=tenant,
        access=access,
        variables=variables,
    )


def _token(pk: int, state: str, node_id: str = "n", attempt: int = 1) -> Token:
    return Token(
        pk=pk,
        ordinal=pk,
        node_id=node_id,
        state=state,
        attempt=attempt,
        poll=0,
        operation_key=f"op-{pk}",
        idempotency_key="",
    )


@settings(max_examples=150, deadline=None)
@given(
    variables=st.dictionaries(st.text(max_size=6), json_values, max_size=4),
    access=st.none() | st.dictionaries(st.text(max_size=4), json_values, max_size=2),
    tenant=st.text(max_size=6),
    steps=st.lists(st.tuples(states, st.text(max_size=4), st.integers(0, 5)), max_size=4),
)
def test_the_kept_fingerprint_is_the_whole_values(variables, access, tenant, steps):
    instance = _instance(variables, access, tenant)
    tokens = [_token(i, state, node, attempt) for i, (state, node, attempt) in enumerate(steps)]
    projector = Projector()
    assert projector.fingerprint(instance, tokens) == projection_of(instance, tokens)
    # Asked again with nothing changed: the same fingerprint.
    assert projector.fingerprint(instance, tokens) == projection_of(instance, tokens)


def test_an_output_applied_by_the_run_changes_the_fingerprint():
    instance = _instance({"value": "v1"}, {})
    tokens = [_token(1, TokenState.EXECUTING)]
    projector = Projector()
    before = projector.fingerprint(instance, tokens)
    instance.variables["s1"] = {"stored": "v1"}  # what Run.apply_output does, then:
    projector.variables_changed()
    after = projector.fingerprint(instance, tokens)
    assert after != before and after == projection_of(instance, tokens)


def test_steps_variables_and_instances_replaced_are_seen_without_a_signal():
    instance = _instance({"value": "v1"}, {})
    token = _token(1, TokenState.READY)
    projector = Projector()
    first = projector.fingerprint(instance, [token])
    token.state = TokenState.EXECUTING  # a step moved
    moved = projector.fingerprint(instance, [token])
    assert moved != first and moved == projection_of(instance, [token])
    assert projector.fingerprint(instance, []) == projection_of(instance, [])  # it left
    instance.variables = {"value": "v2"}  # other variables (a reload, a new dict)
    assert projector.fingerprint(instance, [token]) == projection_of(instance, [token])
    other = _instance({"value": "v3"}, {"role": "clerk"})  # another instance object
    assert projector.fingerprint(other, [token]) == projection_of(other, [token])


def test_an_edit_in_place_without_the_signal_fails_under_the_tests(monkeypatch):
    """The net under every test: a path that forgot the signal is caught where it runs."""
    monkeypatch.setattr(projection, "CHECKED", True)
    instance = _instance({"value": "v1"}, {})
    projector = Projector()
    projector.fingerprint(instance, [])
    instance.variables["value"] = "edited"  # in place, nobody told the projector
    with pytest.raises(AssertionError, match=r"edited without Run\.apply_output"):
        projector.fingerprint(instance, [])
