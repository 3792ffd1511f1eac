"""Case fields: the few values from an instance's variables that name the case.

A definition may declare ``case_fields``, for example::

    "case_fields": {
        "applicant": {"title": "Applicant", "path": "applicant.name"},
        "outcome": {"title": "Outcome", "path": "decision.approved",
                    "labels": {"true": "Approved", "false": "Refused"}}
    }

The instance list shows them as columns and the admin's search finds instances by them:
they are stored on the instance (``Instance.case``, ``[name, text]`` pairs in the declared
order — a JSON array, since PostgreSQL's ``jsonb`` keeps no key order — and the lowercase
``case_text``) when it starts and whenever the engine writes its variables, in the same
statement.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from .limits import MAX_TITLE, VAR_PATH

NAME = re.compile(r"^[a-z][a-z0-9_]{0,39}\Z")
MAX_CASE_FIELDS = 8
MAX_VALUE = 200
FIELD_KEYS = {"title", "path", "labels"}


def check_case_fields(value: Any, problems: list[str]) -> None:
    """Append what is wrong with a ``case_fields`` declaration to ``problems``."""
    if not isinstance(value, dict) or not value:
        problems.append(
            "'case_fields' must be an object naming each field, e.g. "
            '{"applicant": {"title": "Applicant", "path": "applicant.name"}}.'
        )
        return
    if len(value) > MAX_CASE_FIELDS:
        problems.append(f"'case_fields' declares {len(value)} fields; at most {MAX_CASE_FIELDS}.")
    for name, field in value.items():
        where = f"case field {name[:40]!r}"
        if not NAME.match(name):
            problems.append(
                f"{where}: a name is lowercase letters, digits and '_' (at most 40), "
                "starting with a letter."
            )
        if not isinstance(field, dict) or not {"title", "path"} <= set(field):
            problems.append(f'{where}: must be {{"title": ..., "path": ...}}.')
            continue
        for extra in sorted(set(field) - FIELD_KEYS):
            problems.append(f"{where}: {extra[:40]!r} is not a field of a case field.")
        title = field["title"]
        if not isinstance(title, str) or not title.strip() or len(title) > MAX_TITLE:
            problems.append(f"{where}: 'title' must be a non-empty string (at most {MAX_TITLE}).")
        path = field["path"]
        if not isinstance(path, str) or not VAR_PATH.match(path):
            problems.append(
                f"{where}: 'path' {str(path)[:80]!r} is not a dotted variable path "
                "such as 'applicant.name'."
            )
        labels = field.get("labels", {})
        if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
            problems.append(
                f"{where}: 'labels' must map values (as JSON text, e.g. \"true\") to words."
            )


def case_values(document: Mapping[str, Any], variables: Mapping[str, Any]) -> list[list[str]]:
    """The case fields of ``document`` set in ``variables``: ``[name, text]`` pairs in the
    declared order ([] if none)."""
    declared = document.get("case_fields") or {}
    values = []
    for name, field in declared.items():
        value = _lookup(variables, field["path"])
        if value is None:
            continue
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        values.append([name, str(field.get("labels", {}).get(text, text))[:MAX_VALUE]])
    return values


def case_text(values: list[list[str]]) -> str:
    """What the admin's search looks in: the values, lowercased, one per line."""
    return "\n".join(text for _, text in values).lower()


def _lookup(variables: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(variables, Mapping) or part not in variables:
            return None
        variables = variables[part]
    return variables
