"""Turning engine rows into the dicts the response serializers shape. Reads only."""

from __future__ import annotations

import json
from typing import Any

from govflow.engine.linked_models import LinkedRun, LinkedState
from govflow.engine.models import Definition, Instance, Token, TokenState, TriggerDelivery
from recovery.api import OperationState, Verification

from .. import selectors
from ..words import instance_in_words, step_in_words


def definition_summary(view, definition: Definition) -> dict[str, Any]:
    return {
        "key": definition.key,
        "version": definition.version,
        "title": definition.title,
        "fingerprint": definition.fingerprint,
        "published_at": definition.published_at,
        "url": view.url("definition-version", definition.key, definition.version),
    }


def definition_detail(view, definition: Definition) -> dict[str, Any]:
    document = selectors.definition_document(definition)
    refusal = selectors.definition_refusal(definition)
    return {
        **definition_summary(view, definition),
        "versions": selectors.definition_versions(definition.key),
        "runnable": not refusal,
        "not_runnable_because": refusal,
        "variables_schema": document.get("variables"),
        "document": document,
        "contracts": selectors.definition_contracts(definition),
    }


def instance_summary(view, instance: Instance) -> dict[str, Any]:
    definition = instance.definition
    return {
        "id": instance.pk,
        "url": view.url("instance-detail", instance.pk),
        "definition": {
            "key": definition.key,
            "version": definition.version,
            "fingerprint": instance.definition_fp,
        },
        "tenant": instance.tenant,
        "status": instance.status,
        "status_text": instance_in_words(instance),
        "reason": instance.reason,
        "created_at": instance.created_at,
        "updated_at": instance.updated_at,
        "completed_at": instance.completed_at,
    }


_WAITS = (TokenState.WAITING, TokenState.READY)


def step(token: Token, nodes: dict[str, Any]) -> dict[str, Any]:
    node = nodes.get(token.node_id, {})
    return {
        "id": token.pk,
        "node": token.node_id,
        "type": node.get("type", ""),
        "title": node.get("title", ""),
        "ordinal": token.ordinal,
        "state": token.state,
        "state_text": step_in_words(token, node),
        "waiting_for": token.wait_kind if token.state in _WAITS else "",
        "attempt": token.attempt,
        "not_before": token.not_before,
        "reason": token.reason,
        "created_at": token.created_at,
        "updated_at": token.updated_at,
    }


def instance_detail(view, instance: Instance) -> dict[str, Any]:
    nodes = selectors.instance_nodes(instance)
    return {
        **instance_summary(view, instance),
        "variables": instance.variables,
        "steps": [step(t, nodes) for t in selectors.instance_steps(instance)],
        "linked_runs": [linked_run(r) for r in selectors.instance_linked_runs(instance)],
    }


def linked_run(run: LinkedRun) -> dict[str, Any]:
    """A linked run's descriptor as the API shows it: outputs only once it succeeded."""
    return {
        "node": run.node_id,
        "start_step": run.start_token_id,
        "watch_step": run.watch_token_id,
        "module": run.provider,
        "run_reference": run.run_ref,
        "state": run.state,
        "conclusive": bool(run.concluded),
        "outputs": run.outputs if run.state == LinkedState.SUCCEEDED else None,
        "reason_code": run.reason_code,
        "looks": run.polls,
        "last_looked_at": run.described_at,
        "started_at": run.started_at,
        "cancel_requested_at": run.cancel_requested_at,
    }


def handoff(view, token: Token, decision: Any) -> dict[str, Any]:
    instance = token.instance
    node = selectors.instance_nodes(instance).get(token.node_id, {})
    uncertain = token.state == TokenState.OUTCOME_UNKNOWN
    return {
        "id": token.pk,
        "url": view.url("handoff-detail", token.pk),
        "kind": "outcome_unknown" if uncertain else "pending_provider",
        "instance": instance.pk,
        "instance_url": view.url("instance-detail", instance.pk),
        "tenant": instance.tenant,
        "step": token.node_id,
        "title": node.get("title", ""),
        "action": node.get("action", ""),
        "state_text": step_in_words(token, node),
        "since": token.updated_at,
        "next_poll_at": None if uncertain else token.not_before,
        "decision": None
        if decision is None
        else {
            "id": decision.pk,
            "kind": decision.kind,
            "state": decision.state,
            "requested_at": decision.requested_at,
            "result_fp": decision.result_fp,
        },
    }


def delivery(view, found: TriggerDelivery, delivery_id: str, tenant: str) -> dict[str, Any]:
    token = found.token
    handed = token is not None and token.instance.tenant == tenant
    return {
        "delivery_id": delivery_id,
        "url": view.url("trigger-delivery-detail", delivery_id),
        "message": found.message,
        "correlation": found.correlation,
        "state": found.state,
        "delivered_to": {
            "instance": token.instance_id,
            "step": token.node_id,
            "url": view.url("instance-detail", token.instance_id),
        }
        if handed
        else None,
        "received_at": found.received_at,
        "consumed_at": found.consumed_at,
    }


def operation(op: Any) -> dict[str, Any]:
    return {
        "key": op.key,
        "step": op.step_id,
        "action": op.action,
        "recovery_mode": op.recovery_mode,
        "state": op.state,
        "state_text": OperationState(op.state).label if op.state in OperationState else op.state,
        "ordinal": op.ordinal,
        "fence": op.fence,
        "revision": op.revision,
        "chain_seq": op.chain_seq,
        "definition_fp": op.definition_fp,
        "input_fp": op.input_fp,
        "preview_fp": op.preview_fp,
        "access_fp": op.access_fp,
        "idempotency_fp": op.idempotency_fp,
        "result_fp": op.result_fp,
        "recorded_at": op.recorded_at,
        "updated_at": op.updated_at,
    }


def checkpoint(cp: Any) -> dict[str, Any]:
    return {
        "seq": cp.seq,
        "kind": cp.kind,
        "fact": _fact(cp.fact),
        "fact_fp": cp.fact_fp,
        "prev_link": cp.prev_link,
        "link": cp.link,
        "key_id": cp.key_id,
        "projection_fp": cp.projection_fp,
        "recorded_at": cp.recorded_at,
    }


def _fact(text: str) -> dict[str, Any]:
    # A fact edited into something unreadable is shown as such (verification names it).
    try:
        fact = json.loads(text)
    except ValueError:
        fact = None
    return fact if isinstance(fact, dict) else {"unreadable": "the stored fact is not an object"}


def verification(instance: Instance, result: Verification) -> dict[str, Any]:
    return {
        "instance": instance.pk,
        "ok": result.ok,
        "length": result.length,
        "position": result.position,
        "reason": result.reason,
        "projection_seq": result.projection_seq,
    }
