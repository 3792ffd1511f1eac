"""Patterns in JSON Schemas are matched by RE2 (linear time), never by backtracking ``re``.

A published definition's ``"^(a+)+$"`` under Python's ``re`` takes time that doubles with
each character of a value like ``"aaaa…!"``: one start request could hold a process for
hours. These tests pin that the engine's validator runs RE2 for ``pattern``,
``patternProperties`` and ``additionalProperties``, and that publishing refuses what RE2
cannot run.
"""

from __future__ import annotations

import pytest

from recovery.api import schema_pattern_problem, schema_problems

BACKTRACKING = "^(a+)+$"
HOSTILE = "a" * 64 + "!"  # hours under re; a microsecond-sized scan under RE2


def test_a_backtracking_pattern_answers_at_once_on_the_value_that_would_hang_re():
    schema = {"type": "string", "pattern": BACKTRACKING}
    assert schema_problems(schema, "a" * 64) == []
    [problem] = schema_problems(schema, HOSTILE)
    assert "does not match" in problem


def test_property_names_are_matched_the_same_way():
    schema = {
        "type": "object",
        "patternProperties": {BACKTRACKING: {"type": "integer"}},
        "additionalProperties": False,
    }
    assert schema_problems(schema, {"aaa": 1}) == []
    assert schema_problems(schema, {"aaa": "x"}) != []
    [problem] = schema_problems(schema, {HOSTILE: 1})
    assert "do" in problem and repr(BACKTRACKING) in problem
    open_schema = {**schema, "additionalProperties": {"type": "string"}}
    assert schema_problems(open_schema, {HOSTILE: "fine"}) == []
    assert schema_problems(open_schema, {HOSTILE: 1}) != []


def test_the_matcher_is_re2_not_re():
    """``$`` before a final newline and non-ASCII digits for ``\\d`` match under ``re``, not
    under RE2 (nor under ECMA-262, the dialect JSON Schema names)."""
    assert schema_problems({"type": "string", "pattern": "^a$"}, "a\n") != []
    assert schema_problems({"type": "string", "pattern": r"^\d+$"}, "١٢") != []
    assert schema_problems({"type": "string", "pattern": r"^\d+$"}, "12") == []


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"type": "string", "pattern": "^(?=a)a$"}, "cannot be matched in linear time"),
        ({"properties": {"x": {"pattern": r"(a)\1"}}}, "cannot be matched in linear time"),
        ({"patternProperties": {"(?<=x)y": {}}}, "lookahead, lookbehind or backreferences"),
        (
            {"patternProperties": {"^a": {}}, "unevaluatedProperties": False},
            "'unevaluatedProperties' beside 'patternProperties' is not supported",
        ),
    ],
)
def test_a_schema_re2_cannot_run_is_refused_in_words(schema, words):
    assert words in schema_pattern_problem(schema)


def test_patterns_that_re2_runs_and_data_that_only_looks_like_one_pass():
    assert schema_pattern_problem({"type": "string", "pattern": "^BP-[0-9]{4}$"}) == ""
    assert schema_pattern_problem({"const": {"pattern": "(?=x)"}, "enum": ["(?=y)"]}) == ""
    assert schema_pattern_problem({"properties": {"pattern": {"type": "string"}}}) == ""


def test_a_stored_schema_with_a_pattern_re2_cannot_run_refuses_values_in_words():
    [problem] = schema_problems({"type": "string", "pattern": "^(?=a)a$"}, "a")
    assert "cannot be matched in linear time" in problem
    assert "publish the schema again" in problem
