"""Small readings of engine values for a person: titles for node ids, variables as rows."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

MAX_ROWS = 500  # a variables table longer than this is cut, and says so


def node_titles(spec) -> dict[str, str]:
    """Each node's title from the definition, falling back to its id."""
    return {
        node_id: str(node.get("title") or node_id) if isinstance(node, Mapping) else node_id
        for node_id, node in spec.nodes.items()
    }


def flatten(value: Any, path: str = "") -> list[tuple[str, str]]:
    """``value`` as (path, shown value) rows: nested objects and lists by their path
    (``applicant.name``, ``parcels[0]``); an empty object or list is a row of its own."""
    rows: list[tuple[str, str]] = []
    _flatten(value, path, rows)
    return rows


def _flatten(value: Any, path: str, rows: list) -> None:
    if len(rows) >= MAX_ROWS:
        return
    if isinstance(value, Mapping) and value:
        for key in sorted(value, key=str):
            _flatten(value[key], f"{path}.{key}" if path else str(key), rows)
    elif isinstance(value, list) and value:
        for index, item in enumerate(value):
            _flatten(item, f"{path}[{index}]", rows)
    else:
        rows.append((path or "—", shown(value)))


def shown(value: Any) -> str:
    """A scalar as a person reads it (strings without quotes, the rest as JSON)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)
