"""Checking a value against a JSON Schema, with problems a person can act on.

A result an operator confirms and an output a provider returns are both checked against
the action's output schema; both are told the same way what is wrong.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import jsonschema

__all__ = ["schema_problems", "schema_validator"]

MESSAGE_MAX = 200
VALIDATORS_KEPT = 512
"""How many compiled validators :func:`schema_validator` keeps (least recently used go)."""

_compiled: OrderedDict[int, tuple[Any, jsonschema.protocols.Validator]] = OrderedDict()
_lock = threading.Lock()


def schema_validator(schema: Any) -> jsonschema.protocols.Validator:
    """The Draft 2020-12 validator of ``schema``, compiled once per schema object.

    A step checks its input (and a provider's output) against the same few schemas again
    and again: an action's, registered once, and a definition's, parsed once per
    fingerprint. Building the validator is about as costly as validating, so it is kept,
    keyed by the schema object itself (the entry holds the schema, so its id is not reused
    while cached). Schemas are treated as immutable once used, as the registry and the
    parsed definitions hold them.
    """
    key = id(schema)
    with _lock:
        entry = _compiled.get(key)
        if entry is not None and entry[0] is schema:
            _compiled.move_to_end(key)
            return entry[1]
    validator = jsonschema.Draft202012Validator(schema)
    with _lock:
        _compiled[key] = (schema, validator)
        while len(_compiled) > VALIDATORS_KEPT:
            _compiled.popitem(last=False)
    return validator


def schema_problems(schema: Mapping[str, Any] | None, value: Any) -> list[str]:
    """What is wrong with ``value`` under ``schema``; [] if nothing (or no schema).

    Missing fields come first, named together (with the schema's title where it gives
    one); every other problem names its field.
    """
    if schema is None:
        return []
    validator = schema_validator(schema)
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
