"""Checking a value against a JSON Schema, with problems a person can act on.

A result an operator confirms and an output a provider returns are both checked against
the action's output schema; both are told the same way what is wrong.

Patterns (``pattern``, the keys of ``patternProperties`` and the property names
``additionalProperties`` checks against them) are matched by RE2, in time linear in the
value, not by Python's backtracking ``re``: a definition's ``"^(a+)+$"`` would otherwise
let one request to start an instance keep a process busy for minutes. RE2 has no
lookaround and no backreferences; :func:`schema_pattern_problem` refuses a schema that uses
them (or ``unevaluatedProperties`` beside ``patternProperties``, whose checks jsonschema
makes with ``re`` itself) when it is published or registered, in words.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import jsonschema
import re2
from jsonschema import validators
from jsonschema.exceptions import ValidationError

__all__ = ["schema_pattern_problem", "schema_problems", "schema_validator"]

PATTERNS_KEPT = 1024

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a refused pattern is told in words, not logged by RE2


@functools.lru_cache(maxsize=PATTERNS_KEPT)
def _compiled_pattern(pattern: str):
    return re2.compile(pattern, _OPTIONS)


class _Unusable(Exception):
    """A pattern RE2 cannot run (a schema stored before patterns were checked)."""


def _matches(pattern: str, text: str) -> bool:
    try:
        compiled = _compiled_pattern(pattern)
    except re2.error:
        raise _Unusable(pattern) from None
    return compiled.search(text) is not None


def _unusable(pattern: str) -> ValidationError:
    return ValidationError(
        f"the schema's pattern {pattern!r} cannot be matched in linear time (RE2), so no "
        "value is accepted against it; publish the schema again without lookaround or "
        "backreferences"
    )


def _pattern(validator, pattern, instance, schema):
    if not validator.is_type(instance, "string"):
        return
    try:
        if not _matches(pattern, instance):
            yield ValidationError(f"{instance!r} does not match {pattern!r}")
    except _Unusable:
        yield _unusable(pattern)


def _pattern_properties(validator, pattern_properties, instance, schema):
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in pattern_properties.items():
        try:
            keys = [key for key in instance if _matches(pattern, key)]
        except _Unusable:
            yield _unusable(pattern)
            continue
        for key in keys:
            yield from validator.descend(instance[key], subschema, path=key, schema_path=pattern)


def _additional_properties(validator, additional, instance, schema):
    if not validator.is_type(instance, "object"):
        return
    named = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    try:
        extras = [
            k for k in instance if k not in named and not any(_matches(p, k) for p in patterns)
        ]
    except _Unusable as exc:
        yield _unusable(exc.args[0])
        return
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        listed = ", ".join(repr(each) for each in sorted(extras))
        if patterns:
            verb = "does" if len(extras) == 1 else "do"
            regexes = ", ".join(repr(each) for each in sorted(patterns))
            yield ValidationError(f"{listed} {verb} not match any of the regexes: {regexes}")
        else:
            were = "was" if len(extras) == 1 else "were"
            yield ValidationError(
                f"Additional properties are not allowed ({listed} {were} unexpected)"
            )


Validator = validators.extend(
    jsonschema.Draft202012Validator,
    validators={
        "pattern": _pattern,
        "patternProperties": _pattern_properties,
        "additionalProperties": _additional_properties,
    },
)
"""Draft 2020-12, its patterns matched by RE2."""

_DATA = frozenset({"const", "enum", "default", "examples"})
"""Keywords whose values are data, not schemas: a "pattern" inside them is not one."""


def schema_pattern_problem(schema: Any) -> str:
    """Why ``schema``'s patterns cannot be matched in linear time, or ''."""
    found: list[str] = []
    uses: set[str] = set()
    pending = [schema]
    while pending:  # iterative: the callers' guards bound the depth, no recursion here
        item = pending.pop()
        if isinstance(item, list):
            pending.extend(item)
            continue
        if not isinstance(item, Mapping):
            continue
        for key, value in item.items():
            if key in _DATA:
                continue
            if key == "pattern" and isinstance(value, str):
                found.append(value)
            elif key == "patternProperties" and isinstance(value, Mapping):
                uses.add(key)
                found.extend(k for k in value if isinstance(k, str))
            if key == "unevaluatedProperties":
                uses.add(key)
            pending.append(value)
    for pattern in found:
        try:
            _compiled_pattern(pattern)
        except re2.error as exc:
            why = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
            return (
                f"the pattern {pattern!r} cannot be matched in linear time ({why}): GovFlow "
                "matches patterns with RE2, which has no lookahead, lookbehind or "
                "backreferences, so that no value can make a match take exponential time. "
                "Write it without them."
            )
    if uses == {"patternProperties", "unevaluatedProperties"}:
        return (
            "'unevaluatedProperties' beside 'patternProperties' is not supported: its "
            "property-name checks would use a backtracking matcher. Use "
            "'additionalProperties' next to the 'patternProperties' instead."
        )
    return ""


MESSAGE_MAX = 200
VALIDATORS_KEPT = 512
"""How many compiled validators :func:`schema_validator` keeps (least recently used go)."""

_compiled: OrderedDict[int, tuple[Any, jsonschema.protocols.Validator]] = OrderedDict()
_lock = threading.Lock()


def schema_validator(schema: Any) -> jsonschema.protocols.Validator:
    """The Draft 2020-12 validator of ``schema`` (patterns by RE2), compiled once per
    schema object.

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
    validator = Validator(schema)
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
