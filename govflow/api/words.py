"""States in words, for people reading an integration's logs."""

from __future__ import annotations

from typing import Any

from govflow.engine.models import Instance, InstanceStatus, Token, TokenState, WaitKind

_WAITING = {
    WaitKind.TIMER: "waiting for its timer",
    WaitKind.TRIGGER: "waiting for a message",
    WaitKind.APPROVAL: "waiting for a person to approve or reject it",
    WaitKind.EXTERNAL: "waiting for an external worker to complete it",
    WaitKind.POLL: "waiting for the provider's answer (the provider owns the outcome; "
    "the engine asks again)",
    WaitKind.RETRY: "waiting to be tried again after a failure (back-off)",
    WaitKind.JOIN: "waiting for the other parallel branches to arrive",
}


def step_in_words(token: Token, node: dict[str, Any]) -> str:
    """One sentence on where a step stands."""
    state = token.state
    if state == TokenState.READY and token.wait_kind in (WaitKind.POLL, WaitKind.RETRY):
        when = f" at {token.not_before.isoformat()}" if token.not_before else ""
        if token.wait_kind == WaitKind.POLL:
            return (
                "waiting for the provider's answer (the provider owns the outcome); "
                f"asked again{when}"
            )
        return f"failed, and tried again{when} (back-off)"
    if state == TokenState.READY and token.wait_kind == WaitKind.LINKED:
        when = f" at {token.not_before.isoformat()}" if token.not_before else ""
        return (
            "waiting for a linked run in another module (that module owns its outcome); "
            f"asked again{when}"
        )
    if state == TokenState.READY:
        return "ready to run; a worker picks it up"
    if state == TokenState.EXECUTING:
        return "running now"
    if state == TokenState.WAITING:
        text = _WAITING.get(token.wait_kind, "waiting")
        if token.wait_kind == WaitKind.TRIGGER and node.get("message"):
            text = f"waiting for the message {node['message']!r}"
        elif token.wait_kind == WaitKind.EXTERNAL and node.get("topic"):
            text += f" (topic {node['topic']!r})"
        return text
    if state == TokenState.OUTCOME_UNKNOWN:
        return (
            "stopped: the outcome is unknown, so the effect may or may not have happened. "
            "An operator records effect confirmed or effect absent with evidence, and a "
            "second person approves it; nothing is retried until then"
        )
    if state == TokenState.COMPLETED:
        return "completed"
    if state == TokenState.FAILED:
        return f"failed: {token.reason}" if token.reason else "failed"
    if state == TokenState.CANCELLED:
        return "cancelled"
    return state


def instance_in_words(instance: Instance) -> str:
    """One sentence on where the instance stands, with the engine's reason when it has one."""
    label = InstanceStatus(instance.status).label if instance.status else ""
    if instance.status == InstanceStatus.RUNNING:
        text = "Running: workers are advancing it."
    elif instance.status == InstanceStatus.WAITING:
        text = "Waiting for a timer, a message, a person, a provider or a worker."
    elif instance.status == InstanceStatus.BLOCKED:
        text = "Blocked: it needs an operator before it can move on."
    else:
        text = f"{label}."
    if instance.reason:
        text += f" {instance.reason}"
    return text
