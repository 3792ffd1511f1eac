"""JSON Schemas inside a definition: the start variables, an external task's output."""

from __future__ import annotations

from typing import Any

import jsonschema
from referencing.exceptions import Unresolvable

from recovery.api import schema_pattern_problem, schema_validator


def schema_errors(schema: Any, value: Any) -> list[jsonschema.ValidationError]:
    """Every way ``value`` breaks the JSON Schema ``schema`` (an empty list when none).

    Raises :class:`ValueError` saying why when the schema cannot be applied at all: a
    reference that does not resolve, or references that loop without end.
    """
    try:
        return list(schema_validator(schema).iter_errors(value))
    except RecursionError:
        raise ValueError("its references loop without end") from None
    except Unresolvable as exc:
        raise ValueError(f"a reference does not resolve ({exc})") from None


def _outside_reference(schema: Any) -> str:
    """The first ``$ref`` of ``schema`` that points outside it, or ''."""
    pending = [schema]
    while pending:  # the guard has bounded its depth; no recursion all the same
        item = pending.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                if key in ("$ref", "$dynamicRef") and isinstance(value, str):
                    if not value.startswith("#"):
                        return value
                else:
                    pending.append(value)
        elif isinstance(item, list):
            pending.extend(item)
    return ""


def schema_problem(schema: Any) -> str:
    """Why ``schema`` cannot check a JSON value (variables, a task's result), or ''."""
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        return exc.message
    patterns = schema_pattern_problem(schema)
    if patterns:
        return patterns
    outside = _outside_reference(schema)
    if outside:
        return (
            f"the reference {outside!r} points outside the schema; only "
            "references within it ('#/$defs/…') are supported."
        )
    try:
        schema_errors(schema, {})
    except ValueError as exc:
        return f"it cannot be applied: {exc}."
    return ""


def schema_error_text(errors: list[jsonschema.ValidationError], *, whole: str) -> str:
    """The first five ``errors`` in words, each with the path of the value it is about."""
    return "; ".join(f"{'.'.join(map(str, e.path)) or whole}: {e.message}" for e in errors[:5])
