"""``demo.refund_fee``: the compensation of ``demo.collect_fee`` (a refund of the fee).

Cancelling a building permit after its fee was collected refunds the fee: the fee step's
node declares ``compensate_on: ["cancel"]`` and ``demo.collect_fee`` declares this action
as its compensation (docs/compensation.md). The refund is an effect in the demo's payment
provider (the demo registry), keyed by the idempotency key the engine hands over, so a
repeated dispatch finds the refund it already made.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from govflow.engine.provider import (
    ActionContext,
    ActionDefinition,
    Compensate,
    Result,
    Succeeded,
    Unknown,
    VerificationCheck,
)

from . import store
from .schemas import REFUNDED, TEXT, object_schema

REFUND_OF_FEE = Compensate(
    action="demo.refund_fee",
    input={
        "payment_reference": "output.payment_reference",
        "application_id": "input.application_id",
        "amount_cents": "output.amount_cents",
        "currency": "output.currency",
    },
)


def _preview(data: Mapping[str, Any]) -> dict[str, Any]:
    amount = store.money(data["amount_cents"], data["currency"])
    return {
        "summary": (
            f"Refund the permit fee of {amount} paid under {data['payment_reference']} "
            f"for application {data['application_id']}."
        ),
        "system": "payment provider (demo)",
        "writes": {"table": "refunds", "payment_reference": data["payment_reference"]},
        "if_repeated": "the existing refund is found; the citizen is refunded once",
    }


def _refunded(record: Mapping[str, Any]) -> Succeeded:
    return Succeeded(
        {"refund_reference": record["refund_reference"], "refunded_at": record["refunded_at"]}
    )


def _execute(context: ActionContext) -> Result:
    data = context.input
    return _refunded(
        store.refund_make(
            key=context.idempotency_key,
            payment_reference=data["payment_reference"],
            application_id=data["application_id"],
            amount_cents=data["amount_cents"],
        )
    )


def _reconcile(context: ActionContext) -> Result:
    record = store.refund_find(context.idempotency_key)
    return _refunded(record) if record else Unknown("no refund carries this idempotency key")


refund_fee = ActionDefinition(
    name="demo.refund_fee",
    recovery_mode="non_atomic",
    title="Refund the permit fee",
    input_schema=object_schema(
        {
            "payment_reference": TEXT,
            "application_id": TEXT,
            "amount_cents": {"type": "integer", "minimum": 0, "maximum": 10_000_000},
            "currency": {"enum": ["EUR"]},
        }
    ),
    output_schema=REFUNDED,
    preview=_preview,
    execute=_execute,
    reconcile=_reconcile,
    checks=(
        VerificationCheck(
            "refund-search",
            "Search the payment provider's dashboard for refunds of the payment reference in "
            "the preview; note the refund reference if there is one.",
            automatic=lambda c: (
                "Refund {refund_reference} was made at {refunded_at}.".format(**record)
                if (record := store.refund_find(c.idempotency_key))
                else "No refund carries this compensation's idempotency key."
            ),
        ),
    ),
)
