"""A JSON Schema is compiled into a validator once, not at every step (ADR 0030)."""

from __future__ import annotations

from recovery import schemas
from recovery.api import schema_problems, schema_validator

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def test_the_same_schema_object_reuses_its_compiled_validator():
    schema = dict(SCHEMA)
    first = schema_validator(schema)
    assert schema_validator(schema) is first
    assert list(first.iter_errors({"n": 1})) == []
    assert [e.message for e in first.iter_errors({})] == ["'n' is a required property"]


def test_another_schema_object_gets_its_own_validator_even_when_equal():
    one, other = dict(SCHEMA), {"type": "object", "required": ["x"]}
    assert schema_validator(one) is not schema_validator(dict(SCHEMA))
    assert list(schema_validator(other).iter_errors({"n": 1}))
    assert schema_problems(one, {"n": "1"}) == ["n: '1' is not of type 'integer'"]


def test_the_kept_validators_are_bounded(monkeypatch):
    monkeypatch.setattr(schemas, "VALIDATORS_KEPT", 3)
    kept = [{"type": "integer", "minimum": i} for i in range(5)]
    for schema in kept:
        schema_validator(schema)
    assert len(schemas._compiled) <= 3
    assert schema_validator(kept[-1]).is_valid(7) and not schema_validator(kept[-1]).is_valid(3)
