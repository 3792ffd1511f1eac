"""An instance's projection under the checkpoint chain (invariant I12).

The engine's rows — an instance's variables and its steps' states — are a projection of
what the ledger decided. Each engine commit that changes them leaves the fingerprint of the
projection it wrote in the instance's checkpoint chain: carried by the commit's last ledger
write, or, when the commit made none, by a ``projection`` checkpoint of its own
(``Run.commit``). A run compares the stored rows with the newest recorded fingerprint
before it moves anything, and ``recovery_verify`` compares them through the reader
registered here, so an edited row is an integrity incident, never a way around a decision.

What the fingerprint covers, and why only that:

- the instance's pinned definition (id and fingerprint), tenant, access context and
  variables — everything a step's input and authority are built from;
- every *active* step (ready, waiting, executing, outcome unknown) by ordinal, node, a
  state class, attempt, poll, operation key and idempotency key. A step that leaves or
  re-enters the active set, changes class, or points at another operation changes it.

``ready`` and ``waiting`` are one class: timers, messages and approvals move a step
between them without the instance lease (and without a checkpoint), and neither state can
dispatch anything the ledger would not also check. Instance status, reasons, payloads of
waiting steps, back-off times and finished steps are not covered (docs/recovery.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from recovery.api import Subject, projection_fingerprint

from .models import Instance, Token, TokenState

SUBJECT_TYPE = "govflow.instance"


def instance_subject(instance_id: int) -> Subject:
    """The recovery subject of an instance: its ledger operations, chain and incidents."""
    return Subject(SUBJECT_TYPE, str(instance_id))


_CLASS = {
    TokenState.READY: "open",
    TokenState.WAITING: "open",
    TokenState.EXECUTING: "executing",
    TokenState.OUTCOME_UNKNOWN: "outcome_unknown",
}
ACTIVE_STATES = tuple(sorted(str(state) for state in _CLASS))


def projection_of(instance: Instance, tokens: Iterable[Token]) -> str:
    """The fingerprint of an instance's projection, from its row and its active tokens."""
    steps = sorted(
        [
            t.ordinal,
            t.node_id,
            _CLASS[t.state],
            t.attempt,
            t.poll,
            t.operation_key or "",
            t.idempotency_key or "",
        ]
        for t in tokens
        if t.state in _CLASS
    )
    value: dict[str, Any] = {
        "definition": [instance.definition_id, instance.definition_fp],
        "tenant": instance.tenant,
        "access": instance.access or {},
        "variables": instance.variables,
        "steps": steps,
    }
    return projection_fingerprint(value)


def stored_projection(subject_id: str) -> str:
    """Recompute an instance's projection from the stored rows ('' if it is gone)."""
    try:
        instance = Instance.objects.get(pk=int(subject_id))
    except (Instance.DoesNotExist, ValueError):
        return ""
    tokens = Token.objects.filter(instance_id=instance.pk, state__in=ACTIVE_STATES)
    return projection_of(instance, tokens)
