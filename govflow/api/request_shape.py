"""The base of every request body's shape: a field it does not have is refused (ADR 0064).

DRF drops the keys of a body that its serializer has no field for. A misspelt optional
field (``{"reasn": "Withdrawn"}``, ``{"payloadd": {...}}``) was then lost without a word
and the request done without it. Here each such key is a 422 ``validation-failed`` error
of its own, beside the body's other errors, naming the fields the request takes; nothing
is done. The OpenAPI document says the same: every request body's component has
``additionalProperties: false`` (``schema.refuse_unknown_request_fields``).
"""

from __future__ import annotations

from collections.abc import Mapping

from rest_framework import serializers


class RequestShape(serializers.Serializer):
    """A request body (a JSON object): its fields, and no others."""

    def to_internal_value(self, data):
        unknown = self._unknown(data)
        try:
            value = super().to_internal_value(data)
        except serializers.ValidationError as exc:
            if unknown and isinstance(exc.detail, dict):
                exc.detail.update(unknown)
            raise
        if unknown:
            raise serializers.ValidationError(unknown)
        return value

    def _unknown(self, data) -> dict:
        if not isinstance(data, Mapping):
            return {}  # DRF's own error says what a body must be
        takes = [name for name, field in self.fields.items() if not field.read_only]
        listed = ", ".join(takes) if takes else "no fields"
        why = (
            f"Not a field of this request, which takes {listed}. Check the spelling (names "
            "are case-sensitive); nothing was done."
        )
        return {
            name: [why] for name in data if name not in self.fields or self.fields[name].read_only
        }
