"""The demo actions' schemas: what each takes (input) and what its success returns (output).

Output schemas title and describe every field: an operator who confirms an uncertain
effect types these values from the other system's record, and the form is made from them.
"""

from __future__ import annotations

from typing import Any

TEXT = {"type": "string", "minLength": 1, "maxLength": 200}
WHEN = "As the system shows it (ISO 8601, for example 2026-12-01T09:30:00+00:00)."
NOTE_KINDS = ["neighbour_notice", "rejection", "correction", "remark"]


def object_schema(properties: dict[str, Any]) -> dict[str, Any]:
    """An object with exactly these properties, all required."""
    return {
        "type": "object",
        "properties": properties,
        "required": sorted(properties),
        "additionalProperties": False,
    }


def _text(title: str, description: str, **extra: Any) -> dict[str, Any]:
    return {**TEXT, "title": title, "description": description, **extra}


REGISTERED = object_schema(
    {
        "application_id": _text(
            "Application number",
            "The number the municipal registry gave the application (BP-year-number).",
            pattern="^BP-[0-9]{4}-[0-9]{5}$",
        ),
        "registered_at": _text("Registered at", f"When it was registered. {WHEN}"),
    }
)

PAID = object_schema(
    {
        "payment_reference": _text(
            "Payment reference", "The provider's reference of the payment (PAY-year-number)."
        ),
        "amount_cents": {
            "type": "integer",
            "minimum": 0,
            "maximum": 10_000_000,
            "title": "Amount paid (cents)",
        },
        "currency": {"enum": ["EUR"], "title": "Currency"},
        "paid_at": _text("Paid at", f"When the payment came in. {WHEN}"),
    }
)

NOTED = object_schema(
    {
        "note_id": {"type": "integer", "minimum": 1, "title": "Note number"},
        "kind": {"enum": NOTE_KINDS, "title": "Kind of note"},
    }
)

RESTORED = object_schema(
    {
        "parcel_id": _text("Parcel", "The parcel whose record was restored."),
        "restored_from": _text("Restored from", "The snapshot the record was restored from."),
        "restored_at": _text("Restored at", f"When it was restored. {WHEN}"),
    }
)

ISSUED = object_schema(
    {
        "permit_number": _text("Permit number", "The permit's number (PERMIT-year-number)."),
        "issued_at": _text("Issued at", f"When the permit was issued. {WHEN}"),
    }
)

REFUNDED = object_schema(
    {
        "refund_reference": _text("Refund reference", "The provider's refund (REF-year-number)."),
        "refunded_at": _text("Refunded at", f"When the fee was refunded. {WHEN}"),
    }
)
