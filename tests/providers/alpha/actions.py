"""Actions of the test provider, one of each recovery mode."""

from __future__ import annotations

import dataclasses

from govflow.engine.provider import (
    ActionDefinition,
    Compensate,
    Failed,
    Pending,
    Succeeded,
    Unknown,
    VerificationCheck,
)

from . import effects

SCHEMA = {
    "type": "object",
    "properties": {"value": {"type": "string"}},
    "required": ["value"],
    "additionalProperties": True,
}
CHECK = (VerificationCheck("store", "Look the idempotency key up in the alpha effect store."),)


def _scripted(name: str):
    queue = effects.SCRIPT.get(name)
    return queue.pop(0) if queue else None


def _preview(data):
    effects.pause_point("preview")
    return {"will": "write", "value": data.get("value")}


def _effect(context):
    scripted = _scripted(context.action)
    if scripted == "raise_before":
        raise ConnectionError("provider unreachable")
    if isinstance(scripted, (Failed, Pending)):
        return scripted
    effects.apply_effect(context.idempotency_key, context.action, dict(context.input))
    effects.pause_point("after_effect")
    if scripted == "raise_after":
        raise TimeoutError("timed out waiting for the answer")
    if scripted is not None:
        return scripted
    return Succeeded({"stored": context.input["value"], "key": context.idempotency_key})


def _poll(context):
    scripted = _scripted(context.action + ":poll")
    if scripted is not None:
        return scripted
    return Succeeded({"stored": context.input["value"], "paid": True})


def _reconcile(context):
    if effects.effect_exists(context.idempotency_key):
        return Succeeded({"stored": context.input["value"]})
    return Unknown("not in the store")


def _atomic(context):
    from .models import Note

    scripted = _scripted(context.action)
    Note.objects.create(instance_id=context.instance_id, text=context.input["value"])
    effects.pause_point("in_atomic_step")  # inside the step's transaction, rows locked
    if scripted == "raise":
        raise RuntimeError("atomic provider failed")
    if scripted is not None:
        return scripted
    return Succeeded({"noted": context.input["value"]})


write = ActionDefinition(
    name="alpha.write",
    recovery_mode="non_atomic",
    title="Write to the alpha store",
    input_schema=SCHEMA,
    preview=_preview,
    execute=_effect,
    poll=_poll,
    reconcile=_reconcile,
    checks=CHECK,
    retry_budget=2,
    retry_backoff=0.05,
)
note = ActionDefinition(
    name="alpha.note",
    recovery_mode="atomic",
    title="Note in the engine's database",
    input_schema=SCHEMA,
    preview=_preview,
    execute=_atomic,
    retry_budget=2,
    retry_backoff=0.05,
)
restore = ActionDefinition(
    name="alpha.restore",
    recovery_mode="snapshot_restore",
    title="Restore a snapshot",
    input_schema=SCHEMA,
    preview=_preview,
    execute=_effect,
    checks=CHECK,
)
publish = ActionDefinition(
    name="alpha.publish",
    recovery_mode="irreversible",
    title="Publish irreversibly",
    input_schema=SCHEMA,
    preview=_preview,
    execute=_effect,
    checks=CHECK,
)
write_settled = dataclasses.replace(
    write,
    name="alpha.write_settled",
    title="Write to the alpha store (its reconcile settles an uncertain step)",
    reconcile_settles=True,
)
# Compensation (the saga): alpha.charge is undone by alpha.undo, automatically;
# alpha.charge_checked only after an operator's request and a second person's approval.
undo = dataclasses.replace(write, name="alpha.undo", title="Undo a write in the alpha store")
charge = dataclasses.replace(
    write,
    name="alpha.charge",
    title="Charge in the alpha store (compensated by alpha.undo)",
    compensate=Compensate(
        action="alpha.undo", input={"value": "output.stored", "charged": "input.value"}
    ),
)
charge_checked = dataclasses.replace(
    charge,
    name="alpha.charge_checked",
    title="Charge in the alpha store (its undo needs two people)",
    compensate=Compensate(
        action="alpha.undo", input={"value": "output.stored"}, approval="operator"
    ),
)
ALL = (write, note, restore, publish, write_settled, undo, charge, charge_checked)
