"""Form fields generated from a JSON Schema: one field per value, typed as the schema
types it (text, whole number, number, yes/no, a choice, or JSON text for the rest).

Used by the confirmed-result form (a step's output schema) and the start form (a
definition's variables schema). The fields come from
:func:`govflow.engine.outputs.schema_fields`; values are put back into a nested object
by :func:`nest`.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.utils.translation import gettext_lazy as _

from govflow.engine.limits import payload_max_bytes
from govflow.engine.outputs import ResultField
from recovery.api import CanonicalError, parse_json


def schema_form_field(spec: ResultField, *, required: bool, help_text: str = "") -> forms.Field:
    """A form field for one value ``spec`` describes; the schema's example is its placeholder."""
    common: dict[str, Any] = {"label": spec.label, "required": required, "help_text": help_text}
    if spec.type == "string":
        field: forms.Field = forms.CharField(max_length=spec.max_length or 2000, **common)
    elif spec.type in ("integer", "number"):
        bounds = {"min_value": spec.minimum, "max_value": spec.maximum}
        kind = forms.IntegerField if spec.type == "integer" else forms.FloatField
        field = kind(**bounds, **common)
    elif spec.type == "boolean":
        choices = [("", "—"), ("true", _("Yes")), ("false", _("No"))]
        field = forms.TypedChoiceField(
            choices=choices, coerce=lambda v: v == "true", empty_value=None, **common
        )
    elif spec.type == "enum":
        choices = [("", "—")] + [(json.dumps(v), str(v)) for v in spec.enum]
        field = forms.TypedChoiceField(
            choices=choices, coerce=json.loads, empty_value=None, **common
        )
    else:
        field = JsonValueField(
            widget=forms.Textarea(attrs={"rows": 3, "cols": 60, "spellcheck": "false"}),
            **common,
        )
    if spec.example is not None and spec.type not in ("boolean", "enum"):
        example = spec.example if isinstance(spec.example, str) else json.dumps(spec.example)
        field.widget.attrs["placeholder"] = example
    return field


def initial_value(spec: ResultField, value: Any) -> Any:
    """How a field shows ``value`` before anyone types."""
    if spec.type == "boolean":
        return "true" if value is True else "false" if value is False else ""
    if spec.type in ("enum", "json"):
        return json.dumps(value, ensure_ascii=False)
    return value


class JsonValueField(forms.CharField):
    """A JSON value typed as text (a value the form has no field type for)."""

    def to_python(self, value):
        text = (super().to_python(value) or "").strip()
        if not text:
            return None
        try:
            return parse_json(text, max_bytes=payload_max_bytes())
        except CanonicalError as exc:
            raise forms.ValidationError(_("Not valid JSON: %(error)s") % {"error": exc}) from None


def nest(values: dict[str, Any]) -> dict[str, Any]:
    """``{"applicant.name": "A"}`` → ``{"applicant": {"name": "A"}}`` (empty values left out)."""
    result: dict[str, Any] = {}
    for dotted, value in values.items():
        if value is None or value == "":
            continue
        *parents, last = dotted.split(".")
        target = result
        for part in parents:
            target = target.setdefault(part, {})
        target[last] = value
    return result
