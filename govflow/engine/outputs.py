"""What a step's success carries: an action's output schema, and the result an operator
confirms for it (no database here).

An action may declare ``output_schema``: the JSON Schema of the output its success
returns. The registry checks the schema when the action is registered, a provider's
success is checked against it before it becomes variables (``settle``), and an operator
who records *effect confirmed* supplies the same values, typed by the same schema
(:func:`result_schema`), so that the node's output mapping gets what a provider success
would have given it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema

from recovery.api import CanonicalError, canonical_bytes, schema_problems

__all__ = [
    "ResultField",
    "check_output_schema",
    "output_problems",
    "result_fields",
    "result_schema",
]

# The scalar types a form field can be made from; anything else is entered as JSON.
SCALARS = ("string", "integer", "number", "boolean")


def check_output_schema(schema: Any) -> str:
    """Why ``schema`` cannot be an action's output schema, or '' (registration time)."""
    if not isinstance(schema, Mapping):
        return "output_schema must be a JSON Schema object (or None)."
    try:
        canonical_bytes(dict(schema))
    except (CanonicalError, TypeError, ValueError) as exc:
        return f"output_schema is not plain JSON: {exc}"
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        return f"output_schema is not a valid JSON Schema: {exc.message}"
    if schema.get("type") != "object":
        return (
            'output_schema must describe an object ("type": "object"): a success returns '
            "named values that the node's output mapping reads."
        )
    return ""


def output_problems(schema: Mapping[str, Any] | None, output: Any) -> list[str]:
    """What is wrong with ``output`` under ``schema``, for a person; [] if nothing."""
    return schema_problems(schema, output)


def result_schema(output_schema: Mapping[str, Any] | None, mapping: Any) -> dict[str, Any]:
    """The schema an *effect confirmed* result must satisfy for a node.

    The action's output schema when it declares one: the result is what its success would
    return. Without one, the fields the node's output mapping reads, each a required
    string (nothing else is known about them); a node without a mapping takes any object.
    """
    if output_schema is not None:
        return dict(output_schema)
    fields = sorted({str(source).split(".")[0] for source in (mapping or {}).values()})
    return {
        "type": "object",
        "properties": {name: {"type": "string", "minLength": 1} for name in fields},
        "required": fields,
    }


@dataclass(frozen=True)
class ResultField:
    """One top-level value of a result, as a form asks for it."""

    name: str
    type: str
    """``string``, ``integer``, ``number``, ``boolean``, ``enum`` or ``json``."""
    required: bool
    label: str
    help: str = ""
    enum: tuple[Any, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    max_length: int | None = None


def result_fields(schema: Mapping[str, Any]) -> list[ResultField]:
    """The fields of a result schema's top-level properties, in the schema's order."""
    required = set(schema.get("required") or ())
    fields = []
    for name, prop in (schema.get("properties") or {}).items():
        prop = prop if isinstance(prop, Mapping) else {}
        kind = prop.get("type")
        if "enum" in prop:
            kind = "enum"
        elif kind not in SCALARS:
            kind = "json"
        fields.append(
            ResultField(
                name=name,
                type=kind,
                required=name in required,
                label=str(prop.get("title") or name),
                help=str(prop.get("description") or ""),
                enum=tuple(prop.get("enum") or ()),
                minimum=prop.get("minimum"),
                maximum=prop.get("maximum"),
                max_length=prop.get("maxLength"),
            )
        )
    return fields
