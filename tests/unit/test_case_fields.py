"""Case fields: checked at publish with a clear message, and read from the variables."""

from __future__ import annotations

import pytest

from govflow.engine.definitions import DefinitionInvalid, case_text, case_values, parse_definition
from tests.flows import linear

FIELDS = {
    "applicant": {"title": "Applicant", "path": "applicant.name"},
    "outcome": {
        "title": "Outcome",
        "path": "decision.approved",
        "labels": {"true": "Approved", "false": "Refused"},
    },
}


def document(case_fields):
    return {**linear(key="tests.case", version=1), "case_fields": case_fields}


def test_declared_case_fields_publish_and_are_read_from_the_variables():
    spec = parse_definition(document(FIELDS))
    values = case_values(spec.document, {"applicant": {"name": "T. Nowak"}})
    assert values == [["applicant", "T. Nowak"]]  # not decided yet: no outcome
    decided = {"applicant": {"name": "T. Nowak"}, "decision": {"approved": False}}
    both = [["applicant", "T. Nowak"], ["outcome", "Refused"]]
    assert case_values(spec.document, decided) == both
    assert case_text(case_values(spec.document, decided)) == "t. nowak\nrefused"
    number = {"n": {"title": "Number", "path": "application.count"}}
    assert case_values(document(number), {"application": {"count": 7}}) == [["n", "7"]]


@pytest.mark.parametrize(
    ("case_fields", "says"),
    [
        ([], "'case_fields' must be an object naming each field"),
        ({"applicant": {"title": "Applicant"}}, "case field 'applicant': must be"),
        ({"applicant": {"title": "A", "path": "applicant..name"}}, "is not a dotted variable"),
        ({"applicant": {"title": "A", "path": 3}}, "is not a dotted variable path"),
        ({"applicant": {"title": "", "path": "a"}}, "'title' must be a non-empty string"),
        ({"Applicant Name": {"title": "A", "path": "a"}}, "a name is lowercase letters"),
        ({"a": {"title": "A", "path": "a", "colour": "red"}}, "'colour' is not a field"),
        ({"a": {"title": "A", "path": "a", "labels": {"true": 1}}}, "'labels' must map"),
        ({f"f{i}": {"title": "F", "path": "a"} for i in range(9)}, "at most 8"),
    ],
)
def test_a_bad_declaration_is_refused_naming_the_field_and_the_fix(case_fields, says):
    with pytest.raises(DefinitionInvalid) as caught:
        parse_definition(document(case_fields))
    assert any(says in problem for problem in caught.value.problems), caught.value.problems
