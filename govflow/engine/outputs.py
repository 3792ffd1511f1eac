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
from dataclasses import dataclass, replace
from typing import Any

import jsonschema

from recovery.api import CanonicalError, canonical_bytes, schema_pattern_problem, schema_problems

__all__ = [
    "ResultField",
    "check_output_schema",
    "output_problems",
    "result_fields",
    "result_schema",
    "schema_expressible",
    "schema_fields",
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
    patterns = schema_pattern_problem(schema)
    if patterns:
        return f"output_schema: {patterns}"
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
    example: Any = None
    """The schema's first example (shown as a placeholder), or None."""


def result_fields(schema: Mapping[str, Any]) -> list[ResultField]:
    """The fields of a result schema's top-level properties, in the schema's order."""
    return schema_fields(schema, depth=0, humanize=False)


# What a generated form cannot express: the schema is then entered as JSON text.
COMBINATORS = ("oneOf", "anyOf", "allOf", "not", "if", "$ref", "patternProperties")


def schema_fields(
    schema: Mapping[str, Any],
    *,
    depth: int = 2,
    prefix: str = "",
    parent: str = "",
    humanize: bool = True,
) -> list[ResultField]:
    """The fields of an object schema, in the schema's order; a property that is itself an
    object with properties becomes its own fields (dotted names, up to ``depth`` levels
    down), required when it and all its parents are. ``result_fields`` is depth 0."""
    required = set(schema.get("required") or ())
    fields = []
    for name, prop in (schema.get("properties") or {}).items():
        prop = prop if isinstance(prop, Mapping) else {}
        words = name.replace("_", " ").capitalize() if humanize else name
        label = str(prop.get("title") or words)
        label = f"{parent}: {label}" if parent else label
        if depth > 0 and _nested(prop):
            fields += [
                replace(f, required=f.required and name in required)
                for f in schema_fields(
                    prop, depth=depth - 1, prefix=f"{prefix}{name}.", parent=label
                )
            ]
            continue
        kind = prop.get("type")
        if "enum" in prop:
            kind = "enum"
        elif kind not in SCALARS:
            kind = "json"
        examples = prop.get("examples")
        fields.append(
            ResultField(
                name=prefix + name,
                type=kind,
                required=name in required,
                label=label,
                help=str(prop.get("description") or ""),
                enum=tuple(prop.get("enum") or ()),
                minimum=prop.get("minimum"),
                maximum=prop.get("maximum"),
                max_length=prop.get("maxLength"),
                example=examples[0] if isinstance(examples, list) and examples else None,
            )
        )
    return fields


def _nested(prop: Mapping[str, Any]) -> bool:
    return (
        prop.get("type") == "object"
        and isinstance(prop.get("properties"), Mapping)
        and not any(word in prop for word in COMBINATORS)
    )


def schema_expressible(schema: Any) -> bool:
    """Whether a form generated by :func:`schema_fields` can ask for every value of
    ``schema`` (an object of named properties with no combinators); else JSON text."""
    return isinstance(schema, Mapping) and _nested(schema) and bool(schema["properties"])
