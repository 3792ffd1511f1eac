"""Checking a value against a JSON Schema, with problems a person can act on.

A result an operator confirms and an output a provider returns are both checked against
the action's output schema; both are told the same way what is wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jsonschema

__all__ = ["schema_problems"]

MESSAGE_MAX = 200


def schema_problems(schema: Mapping[str, Any] | None, value: Any) -> list[str]:
    """What is wrong with ``value`` under ``schema``; [] if nothing (or no schema).

    Missing fields come first, named together (with the schema's title where it gives
    one); every other problem names its field.
    """
    if schema is None:
        return []
    validator = jsonschema.Draft202012Validator(schema)
    missing: list[str] = []
    problems: list[str] = []
    for error in sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path)):
        where = ".".join(str(p) for p in error.absolute_path)
        if error.validator == "required" and isinstance(error.instance, Mapping):
            missing += [
                f"{where}.{name}" if where else _titled(schema, name)
                for name in error.validator_value
                if name not in error.instance
            ]
        else:
            problems.append(f"{where or 'the value'}: {error.message[:MESSAGE_MAX]}")
    if missing:
        problems.insert(0, f"missing {', '.join(dict.fromkeys(missing))}")
    return problems


def _titled(schema: Mapping[str, Any], name: str) -> str:
    prop = (schema.get("properties") or {}).get(name)
    title = prop.get("title") if isinstance(prop, Mapping) else None
    return f"{name} ({title})" if title else name
