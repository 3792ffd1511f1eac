"""``demo.collect_fee``: the permit fee, asked for now and paid later (it answers Pending).

The fee is a payment request in the demo's payment provider (the demo registry), keyed by
the idempotency key the engine hands over: the step waits (``Pending``) and polls until
the citizen has paid, and a repeated dispatch finds the request it already made. Its
compensation is :mod:`.refunds` (``demo.refund_fee``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from govflow.engine.provider import (
    ActionContext,
    ActionDefinition,
    Pending,
    Result,
    Succeeded,
    Unknown,
    VerificationCheck,
)

from . import schemas, store
from .refunds import REFUND_OF_FEE
from .schemas import TEXT, object_schema

POLL_AFTER = 2.0
"""Seconds before the engine asks the payment provider again."""


def _fee_preview(data: Mapping[str, Any]) -> dict[str, Any]:
    amount = store.money(data["amount_cents"], data["currency"])
    return {
        "summary": (
            f"Ask {data['payer']} to pay the permit fee of {amount} for application "
            f"{data['application_id']}; the step waits until the payment is in."
        ),
        "system": "payment provider (demo)",
        "writes": {
            "table": "payments",
            "application_id": data["application_id"],
            "amount_cents": data["amount_cents"],
            "currency": data["currency"],
        },
        "if_repeated": "the existing payment request is reused; the citizen pays once",
    }


def _paid(record: Mapping[str, Any]) -> Succeeded:
    return Succeeded(
        {
            "payment_reference": record["payment_reference"],
            "amount_cents": record["amount_cents"],
            "currency": record["currency"],
            "paid_at": record["paid_at"],
        }
    )


def _fee_execute(context: ActionContext) -> Result:
    data = context.input
    record = store.payment_request(
        key=context.idempotency_key,
        application_id=data["application_id"],
        amount_cents=data["amount_cents"],
        currency=data["currency"],
    )
    if record["status"] == "paid":  # a repeated dispatch after the citizen paid
        return _paid(record)
    return Pending(poll_after=POLL_AFTER)


def _fee_poll(context: ActionContext) -> Result:
    record = store.payment_check(context.idempotency_key)
    if record is None:
        return Unknown("the payment provider has no request under this idempotency key")
    return _paid(record) if record["status"] == "paid" else Pending(poll_after=POLL_AFTER)


def _fee_reconcile(context: ActionContext) -> Result:
    # Read-only. An unpaid request is not an unknown outcome: the provider still owns it.
    record = store.payment_find(context.idempotency_key)
    if record is None:
        return Unknown("the payment provider has no request under this idempotency key")
    return _paid(record) if record["status"] == "paid" else Pending(poll_after=POLL_AFTER)


collect_fee = ActionDefinition(
    name="demo.collect_fee",
    recovery_mode="non_atomic",
    title="Collect the permit fee",
    input_schema=object_schema(
        {
            "application_id": TEXT,
            "payer": TEXT,
            "amount_cents": {"type": "integer", "minimum": 0, "maximum": 10_000_000},
            "currency": {"enum": ["EUR"]},
        }
    ),
    output_schema=schemas.PAID,
    preview=_fee_preview,
    execute=_fee_execute,
    poll=_fee_poll,
    reconcile=_fee_reconcile,
    compensate=REFUND_OF_FEE,
    checks=(
        VerificationCheck(
            "payment-search",
            "Search the payment provider's dashboard for the application number and the "
            "amount in the preview; note the payment reference and whether it is paid.",
            automatic=lambda c: store.finding(
                store.payment_find(c.idempotency_key),
                "Payment request {payment_reference} is {status} ({polls} status checks).",
                "No payment request carries this step's idempotency key.",
            ),
        ),
        VerificationCheck(
            "bank-statement",
            "If the dashboard is unclear, look for the payment reference on today's bank "
            "statement of the municipality's fee account.",
        ),
    ),
)
