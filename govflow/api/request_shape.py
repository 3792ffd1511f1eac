"""The base of every request body's shape: a field it does not have, or a value of another
JSON type than its field's, is refused (ADR 0064).

DRF drops the keys of a body that its serializer has no field for. A misspelt optional
field (``{"reasn": "Withdrawn"}``, ``{"payloadd": {...}}``) was then lost without a word
and the request done without it. Here each such key is a 422 ``validation-failed`` error
of its own, beside the body's other errors, naming the fields the request takes; nothing
is done. The OpenAPI document says the same: every request body's component has
``additionalProperties: false`` (``schema.refuse_unknown_request_fields``).

DRF also converts a value of another JSON type than the field's: a number where text is
expected (``{"reason": 7}`` became ``"7"``), text where a number is (``"5"`` became 5), text
or a number where a boolean is. The OpenAPI document gives each field its one type; a
value of another type is an error of its field here ("must be a JSON string, not a
number"), so what a client sends is what it meant, and what the document says is what is
taken.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rest_framework import serializers


class RequestShape(serializers.Serializer):
    """A request body (a JSON object): its fields, each of its JSON type, and no others."""

    def to_internal_value(self, data):
        refused = {**self._mistyped(data), **self._unknown(data)}
        try:
            value = super().to_internal_value(data)
        except serializers.ValidationError as exc:
            if refused and isinstance(exc.detail, dict):
                exc.detail.update(refused)
            raise
        if refused:
            raise serializers.ValidationError(refused)
        return value

    def _mistyped(self, data) -> dict:
        if not isinstance(data, Mapping):
            return {}
        refused = {}
        for name, field in self.fields.items():
            if field.read_only or data.get(name) is None:
                continue  # absent or null: the field's own rules say whether it may be
            problem = mistyped(field, data[name])
            if problem:
                refused[name] = [problem]
        return refused

    def _unknown(self, data) -> dict:
        if not isinstance(data, Mapping):
            return {}  # DRF's own error says what a body must be
        takes = [name for name, field in self.fields.items() if not field.read_only]
        listed = ", ".join(takes) if takes else "no fields"
        why = (
            f"Not a field of this request, which takes {listed}. Check the spelling (names "
            "are case-sensitive); nothing was done."
        )
        return {
            name: [why] for name in data if name not in self.fields or self.fields[name].read_only
        }


# The JSON type a field takes, by its DRF class (the first that matches); a field of a
# class not listed (objects, dates, a nested body) is left to its own checks.
_TAKES: tuple[tuple[type, str], ...] = (
    (serializers.BooleanField, "boolean"),
    (serializers.IntegerField, "integer"),
    (serializers.FloatField, "number"),
    (serializers.DecimalField, "number"),
    (serializers.CharField, "string"),
)


def json_type(value: Any) -> str:
    """The JSON type of a value ``json.loads`` made."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, Mapping) else type(value).__name__


def mistyped(field: serializers.Field, value: Any) -> str:
    """Why ``value`` is not of ``field``'s JSON type, or '' (also each item of a list of
    such fields, and a choice among strings)."""
    if isinstance(field, serializers.ListField) and isinstance(value, list):
        for index, item in enumerate(value):
            problem = "" if item is None else mistyped(field.child, item)
            if problem:
                return f"Item {index}: {problem}"
        return ""
    takes = _takes(field)
    if not takes:
        return ""
    got = json_type(value)
    if got == takes or (takes == "number" and got == "integer"):
        return ""
    if takes == "string":
        return f"Must be a JSON string, not {_a(got)}: write it in quotes."
    return f"Must be {_a(takes)}, not {_a(got)}."


def _takes(field: serializers.Field) -> str:
    if isinstance(field, serializers.ChoiceField):
        # A choice among strings is a string; DRF would look a number up by its text.
        choices = list(field.choices)
        return "string" if choices and all(isinstance(c, str) for c in choices) else ""
    return next((kind for cls, kind in _TAKES if isinstance(field, cls)), "")


def _a(kind: str) -> str:
    return {"array": "an array", "object": "an object", "integer": "an integer"}.get(
        kind, f"a {kind}"
    )
