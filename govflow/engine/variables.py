"""Reading and writing instance variables by dotted path; conditions written as data."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

_MISSING = object()
_ABSENT = object()


class MissingVariable(LookupError):
    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(f"variable '{path}' is not set")


def lookup(variables: Mapping[str, Any], path: str, default: Any = _MISSING) -> Any:
    value: Any = variables
    for part in path.split("."):
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        elif (
            isinstance(value, list) and part.isascii() and part.isdigit() and int(part) < len(value)
        ):
            value = value[int(part)]
        else:
            if default is _MISSING:
                raise MissingVariable(path)
            return default
    return value


def assign(variables: dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    target = variables
    for part in parts[:-1]:
        nxt = target.get(part)
        if not isinstance(nxt, dict):
            nxt = {}
            target[part] = nxt
        target = nxt
    target[parts[-1]] = copy.deepcopy(value)


def build_input(mapping: Mapping[str, Any], variables: Mapping[str, Any]) -> dict[str, Any]:
    """Build an action's input from its node's mapping (variable paths or literals)."""
    result: dict[str, Any] = {}
    for name, source in mapping.items():
        result[name] = copy.deepcopy(
            source["value"] if isinstance(source, dict) else lookup(variables, source)
        )
    return result


def apply_output(
    variables: dict[str, Any], node_id: str, mapping: Mapping[str, str] | None, data: Any
) -> None:
    """Merge ``data`` into ``variables``: by the node's output mapping, else under its id."""
    if not mapping:
        assign(variables, node_id, data if data is not None else {})
        return
    for var, field in mapping.items():
        value = lookup(data if isinstance(data, Mapping) else {}, field, None)
        assign(variables, var, value)


def _compare(op: str, left: Any, right: Any) -> bool:
    try:
        if op == "eq":
            return left == right
        if op == "ne":
            return left != right
        if op == "in":
            return left in right
        if op == "not_in":
            return left not in right
        if left is None:
            return False
        return {"gt": left > right, "ge": left >= right, "lt": left < right, "le": left <= right}[
            op
        ]
    except TypeError:
        return False


def evaluate(condition: Mapping[str, Any], variables: Mapping[str, Any]) -> bool:
    """Evaluate a condition written as data. No ``eval``: only these operators exist."""
    if "all" in condition:
        return all(evaluate(c, variables) for c in condition["all"])
    if "any" in condition:
        return any(evaluate(c, variables) for c in condition["any"])
    if "not" in condition:
        return not evaluate(condition["not"], variables)
    # A sentinel of its own: passing _MISSING as the default would mean "no default" and
    # raise, but a missing variable compares as null.
    value = lookup(variables, condition["var"], _ABSENT)
    op = condition["op"]
    if op == "exists":
        return value is not _ABSENT
    if value is _ABSENT:
        value = None
    if op == "truthy":
        return bool(value)
    return _compare(op, value, condition.get("value"))
