"""Plain words for the desk: case field labels, node titles and permission names.

A person reads "Permits officer decides" and "Can approve building permits", not
``approval`` and ``govflow_demo.approve_permit``; codes stay available in small print.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.auth.models import Permission

from govflow.engine.models import Definition, Instance
from govflow.engine.services.definitions import trusted_spec


def case_labels(definition: Definition) -> dict[str, str]:
    """The case fields ``definition`` declares: name → title, in the declared order."""
    declared = trusted_spec(definition).document.get("case_fields") or {}
    return {name: str(field.get("title", name)) for name, field in declared.items()}


def case_column(name: str, label: str):
    """A list column showing one case field."""

    @admin.display(description=label)
    def column(obj: Instance) -> str:
        return obj.case_map.get(name, "—")

    column.__name__ = f"case_{name}"
    return column


def node_title(node: dict[str, Any], node_id: str) -> str:
    """What the definition calls a node ('Permits officer decides'), else its id."""
    return str(node.get("title") or node_id)


_NAMES: dict[str, str] = {}


def permission_name(code: str) -> str:
    """A permission's name ("Can approve building permits") for its ``app.codename``."""
    if code not in _NAMES:
        app_label, _, codename = code.partition(".")
        found = Permission.objects.filter(
            content_type__app_label=app_label, codename=codename
        ).values_list("name", flat=True)
        name = next(iter(found), "")
        if not name:
            return code
        _NAMES[code] = name
    return _NAMES[code]
