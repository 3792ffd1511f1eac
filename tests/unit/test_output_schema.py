"""Output schemas: checked at registration, pinned when declared, and turned into the
fields an operator fills in to confirm an uncertain effect (no database)."""

from __future__ import annotations

import dataclasses

import pytest

from govflow.demo import actions as demo
from govflow.engine.contracts import action_contract, contract_changes
from govflow.engine.outputs import result_fields, result_schema
from govflow.engine.registry import RegistryError, validate_action
from govflow.handoffs.forms import HandoffRequestForm
from recovery.api import FingerprintKind, fingerprint_value
from tests.providers.alpha import actions as alpha

OUTPUT = {
    "type": "object",
    "properties": {
        "number": {"type": "string", "title": "Application number", "description": "BP-…"},
        "count": {"type": "integer", "minimum": 1},
        "share": {"type": "number", "maximum": 1},
        "final": {"type": "boolean", "title": "Final"},
        "kind": {"enum": ["new", 2]},
        "extra": {"type": "object"},
    },
    "required": ["number", "count"],
}


def typed(schema=OUTPUT):
    return dataclasses.replace(alpha.write, output_schema=schema)


# -- registration -----------------------------------------------------------------------


def test_an_action_declares_no_output_schema_by_default():
    assert alpha.write.output_schema is None
    validate_action(alpha.write)


def test_a_valid_output_schema_is_accepted():
    validate_action(typed())


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        ([], "output_schema must be a JSON Schema object"),
        ({"type": "object", "properties": {"a": {"type": "strung"}}}, "not a valid JSON Schema"),
        ({"type": "string"}, 'must describe an object ("type": "object")'),
        ({"properties": {}}, 'must describe an object ("type": "object")'),
        ({"type": "object", "default": float("nan")}, "not plain JSON"),
    ],
)
def test_a_malformed_output_schema_is_refused_at_registration(schema, says):
    with pytest.raises(RegistryError, match=r"Action 'alpha\.write'") as refused:
        validate_action(typed(schema))
    assert says in str(refused.value)


def test_every_demo_action_declares_an_output_schema_its_success_matches():
    for action in demo.ALL:
        assert action.output_schema is not None, action.name
        validate_action(action)
    register = demo.register_application.output_schema
    assert register["required"] == ["application_id", "registered_at"]


# -- pinning (ADR 0008) -----------------------------------------------------------------


def test_an_action_without_an_output_schema_keeps_the_contract_it_was_pinned_with():
    contract = action_contract(alpha.write)
    assert "output_fp" not in contract
    # The fingerprint as it was computed before output schemas existed.
    before = fingerprint_value(
        FingerprintKind.DEFINITION,
        ["action-contract", contract["mode"], contract["checks_fp"], contract["schema_fp"]],
    )
    assert contract["contract_fp"] == before


def test_declaring_or_changing_an_output_schema_is_a_contract_change():
    plain, declared = action_contract(alpha.write), action_contract(typed())
    assert declared["contract_fp"] != plain["contract_fp"]
    assert contract_changes("alpha.write", plain, declared) == "alpha.write: output schema added"
    assert contract_changes("alpha.write", declared, plain) == "alpha.write: output schema removed"
    changed = action_contract(typed({**OUTPUT, "required": ["number"]}))
    assert contract_changes("alpha.write", declared, changed) == (
        "alpha.write: output schema changed"
    )
    assert action_contract(typed()) == declared  # the same schema, the same pin


# -- the result an operator confirms ----------------------------------------------------


def test_the_result_schema_is_the_output_schema_or_the_mapped_fields_as_strings():
    assert result_schema(OUTPUT, {"x": "number"}) == OUTPUT
    assert result_schema(None, {"application.id": "id", "at": "meta.at"}) == {
        "type": "object",
        "properties": {
            "id": {"type": "string", "minLength": 1},
            "meta": {"type": "string", "minLength": 1},
        },
        "required": ["id", "meta"],
    }
    assert result_schema(None, None)["required"] == []


def test_result_fields_follow_the_schema():
    fields = {f.name: f for f in result_fields(OUTPUT)}
    assert [f.name for f in result_fields(OUTPUT)] == list(OUTPUT["properties"])
    assert fields["number"].label == "Application number" and fields["number"].required
    assert fields["number"].help == "BP-…"
    assert (fields["count"].type, fields["count"].minimum) == ("integer", 1)
    assert (fields["share"].type, fields["share"].maximum) == ("number", 1)
    assert fields["final"].type == "boolean" and not fields["final"].required
    assert (fields["kind"].type, fields["kind"].enum) == ("enum", ("new", 2))
    assert fields["extra"].type == "json"


def form(data=None, **kwargs):
    files = None if data is None else {}
    return HandoffRequestForm(data, files, result_fields=result_fields(OUTPUT), **kwargs)


def post(kind="effect_confirmed", **values):
    return {"kind": kind, "rationale": "Seen in the registry.", **values}


def test_the_form_asks_for_each_result_field_typed_and_labelled():
    page = form().as_div()
    assert "Application number" in page and "BP-…" in page
    assert "Required to record effect confirmed." in page
    assert 'type="number"' in page and 'name="result_count"' in page
    assert '<option value="true">Yes</option>' in page
    assert '<option value="&quot;new&quot;">new</option>' in page


def test_the_form_types_the_values_it_was_given():
    bound = form(
        post(
            result_number="BP-1",
            result_count="3",
            result_share="0.5",
            result_final="false",
            result_kind="2",
            result_extra='{"a": [1]}',
        )
    )
    assert bound.is_valid(), bound.errors
    assert bound.result() == {
        "number": "BP-1",
        "count": 3,
        "share": 0.5,
        "final": False,
        "kind": 2,
        "extra": {"a": [1]},
    }


def test_the_form_marks_missing_required_values_for_effect_confirmed_only():
    bound = form(post(result_number="BP-1"))
    assert not bound.is_valid()
    assert bound.errors["result_count"] == ["Required to record effect confirmed."]
    absent = form(post(kind="effect_absent"))
    assert absent.is_valid(), absent.errors
    assert absent.result() is None


def test_the_form_refuses_a_result_with_effect_absent():
    bound = form(post(kind="effect_absent", result_number="BP-1"))
    assert not bound.is_valid()
    assert "Only effect confirmed records a result" in bound.errors["kind"][0]


def test_the_form_is_pre_filled_with_an_initial_result():
    page = form(initial_result={"number": "BP-7", "final": True, "kind": "new"}).as_div()
    assert 'value="BP-7"' in page
    assert '<option value="true" selected>Yes</option>' in page
    assert '<option value="&quot;new&quot;" selected>new</option>' in page
