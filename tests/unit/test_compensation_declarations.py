"""Declaring compensation: refused at registration and at definition parse, clearly."""

from __future__ import annotations

import dataclasses

import pytest

from govflow.engine.checks import check_compensations
from govflow.engine.definitions import DefinitionInvalid, parse_definition
from govflow.engine.provider import Compensate, RegistryError
from govflow.engine.registry import registry, validate_action
from tests.flows import action, linear
from tests.providers.alpha import actions as alpha


def charge(**compensate):
    spec = {"action": "alpha.undo", "input": {"value": "output.stored"}, **compensate}
    return dataclasses.replace(alpha.write, name="alpha.x_charge", compensate=Compensate(**spec))


@pytest.mark.parametrize(
    ("compensate", "says"),
    [
        ({"action": "Undo"}, "must name another action"),
        ({"action": "alpha.x_charge"}, "cannot compensate itself"),
        ({"approval": "sometimes"}, "'automatic' or 'operator'"),
        ({"input": {}}, "maps the compensating action's input"),
        ({"input": {"value": "stored"}}, "'input.<field>' or 'output.<field>'"),
        ({"input": {"value": {"val": 1}}}, "'input.<field>' or 'output.<field>'"),
    ],
)
def test_a_malformed_declaration_is_refused_at_registration(compensate, says):
    with pytest.raises(RegistryError, match=says):
        validate_action(charge(**compensate))


def test_a_well_formed_declaration_registers():
    validate_action(charge(input={"value": "output.stored", "note": {"value": "refund"}}))
    validate_action(charge(approval="operator", input={"value": "input.value"}))


def test_the_check_names_a_missing_or_atomic_compensating_action():
    missing = charge(action="alpha.nowhere")
    atomic = charge(action="alpha.note")
    with registry.override(missing):
        [error] = check_compensations(None)
        assert error.id == "engine.E005" and "no installed provider registers" in error.msg
    with registry.override(atomic):
        [error] = check_compensations(None)
        assert "must be non_atomic" in error.msg
    assert check_compensations(None) == []


def parse(*nodes):
    return parse_definition(linear(*nodes), registry=registry)


@pytest.mark.parametrize(
    ("node", "says"),
    [
        (action("a", "alpha.write", compensate_on=["cancel"]), "declares no compensating action"),
        (action("a", "alpha.charge", compensate_on="cancel"), "must be a list"),
        (action("a", "alpha.charge", compensate_on=["later"]), "must be a list"),
        (action("a", "alpha.charge", compensate_on=["operator", "cancel"]), "must be a list"),
        (action("a", "alpha.charge", compensate_on=["cancel", "cancel"]), "must be a list"),
        (action("a", "alpha.charge", compensate_on=[]), "must be a list"),
    ],
)
def test_a_definition_with_a_bad_compensate_on_is_refused(node, says):
    with pytest.raises(DefinitionInvalid, match=says):
        parse(node)


def test_a_definition_naming_an_unregistered_compensating_action_is_refused():
    with (
        registry.override(charge(action="alpha.nowhere")),
        pytest.raises(DefinitionInvalid, match="which no installed provider registers"),
    ):
        parse(action("a", "alpha.x_charge", compensate_on=["cancel"]))


@pytest.mark.parametrize("when", [["cancel"], ["failure"], ["cancel", "failure"], ["operator"]])
def test_compensate_on_accepts_cancel_failure_or_operator(when):
    assert parse(action("a", "alpha.charge", compensate_on=when))
