"""The API's reads: querysets and small lookups, every one scoped to a tenant. No writes.

``tenants`` is the caller's: a key's one tenant, a signed-in user's tenants (ADR 0018), or
None for every tenant (a superuser). An object of another tenant is simply not in the
queryset, so the views answer 404 for it exactly as for one that does not exist.
"""

from __future__ import annotations

import json
from typing import Any

from django.db.models import OuterRef, Q, QuerySet

from govflow.engine.contracts import contracts_of, pinned_fingerprint
from govflow.engine.definitions import parse_definition
from govflow.engine.linked import resolve_action
from govflow.engine.linked_models import LinkedRun
from govflow.engine.models import (
    Definition,
    ExternalTask,
    Instance,
    Token,
    TokenState,
    TriggerDelivery,
    WaitKind,
)
from govflow.engine.projection import SUBJECT_TYPE
from govflow.engine.registry import registry
from govflow.engine.services.definitions import start_refusal, trusted_spec
from recovery.api import (
    Subject,
    Verification,
    canonical_bytes,
    chain_verify,
    checkpoints_of,
    decision_awaiting_exists,
    decisions_awaiting,
    operations_of,
)

Tenants = frozenset[str] | None
"""The tenants a caller acts for; None: every tenant."""

# A pending provider's step is ready (or waiting) with wait kind "poll" until it is asked
# again at ``not_before``.
PENDING_PROVIDER = Q(state__in=[TokenState.READY, TokenState.WAITING], wait_kind=WaitKind.POLL)
OUTCOME_UNKNOWN = Q(state=TokenState.OUTCOME_UNKNOWN)


def definitions() -> QuerySet[Definition]:
    return Definition.objects.all()


def definition_get(key: str, version: int | None = None) -> Definition | None:
    """A published version of ``key``, or its latest when ``version`` is None."""
    found = Definition.objects.filter(key=key)
    if version is not None:
        return found.filter(version=version).first()
    return found.order_by("-version").first()


def definition_versions(key: str) -> list[int]:
    return list(
        Definition.objects.filter(key=key).order_by("version").values_list("version", flat=True)
    )


def _stored_object(text: str) -> dict[str, Any]:
    # A row edited into something unreadable reads as empty; definition_refusal says why.
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def definition_document(definition: Definition) -> dict[str, Any]:
    return _stored_object(definition.document)


def definition_contracts(definition: Definition) -> dict[str, Any]:
    return _stored_object(definition.contracts)


def definition_refusal(definition: Definition) -> str:
    """Why new instances of ``definition`` cannot start here now, or ''."""
    try:
        return start_refusal(definition)
    except ValueError:
        return "its stored document is not readable JSON; restore it from the published file"


def instances(tenants: Tenants) -> QuerySet[Instance]:
    found = Instance.objects.select_related("definition")
    return found if tenants is None else found.filter(tenant__in=tenants)


def instance_get(tenants: Tenants, instance_id: int) -> Instance | None:
    return instances(tenants).filter(pk=instance_id).first()


def instance_steps(instance: Instance) -> list[Token]:
    return list(instance.tokens.order_by("ordinal"))


def instance_linked_runs(instance: Instance) -> list[LinkedRun]:
    """The runs its linked_run steps started, in the order they started (reads)."""
    return list(LinkedRun.objects.filter(instance=instance).order_by("started_at", "pk"))


def instance_nodes(instance: Instance) -> dict[str, Any]:
    """The nodes of the instance's definition (empty if its stored bytes were changed)."""
    return dict(trusted_spec(instance.definition).nodes)


def subject_of(instance: Instance) -> Subject:
    return Subject(SUBJECT_TYPE, str(instance.pk))


def instance_operations(instance: Instance) -> QuerySet:
    return operations_of(subject_of(instance))


def instance_checkpoints(instance: Instance) -> QuerySet:
    return checkpoints_of(subject_of(instance))


def instance_verify(instance: Instance) -> Verification:
    """Recompute the instance's chain against its rows (a read: opens no incident)."""
    return chain_verify(subject_of(instance))


def handoffs(tenants: Tenants) -> QuerySet[Token]:
    """Steps that wait for a person or a provider: outcome unknown, or a pending provider."""
    found = Token.objects.filter(OUTCOME_UNKNOWN | PENDING_PROVIDER).select_related(
        "instance", "instance__definition"
    )
    return found if tenants is None else found.filter(instance__tenant__in=tenants)


def awaiting_approval(handoff_tokens: QuerySet[Token], awaiting: bool) -> QuerySet[Token]:
    """Keep the handoffs that have (or have not) a decision awaiting a second person."""
    requested = decision_awaiting_exists(OuterRef("operation_key"))
    return handoff_tokens.filter(requested if awaiting else ~requested)


def open_decisions(tokens: list[Token]) -> dict[str, Any]:
    """The decision awaiting approval for each token's operation, by operation key."""
    return decisions_awaiting(operation_keys=[t.operation_key for t in tokens if t.operation_key])


def delivery_get(stored_id: str) -> TriggerDelivery | None:
    return (
        TriggerDelivery.objects.select_related("token", "token__instance")
        .filter(delivery_id=stored_id)
        .first()
    )


def definition_check(document: Any) -> dict[str, Any]:
    """What publishing ``document`` would do, without publishing it (a read).

    Raises :class:`DefinitionInvalid` listing every problem (the engine's validation
    against the installed providers). Otherwise: the fingerprint it would be published
    with, and whether that key and version is published already (``no``, ``identical``,
    ``conflict``).
    """
    spec = parse_definition(document, registry=registry)
    fp = pinned_fingerprint(document, contracts_of(spec.actions(), resolve_action))
    existing = definition_get(document["key"], document["version"])
    if existing is None:
        published = "no"
    elif existing.fingerprint == fp or (
        not existing.contracts and existing.document == canonical_bytes(document).decode()
    ):
        published = "identical"
    else:
        published = "conflict"
    return {
        "key": document["key"],
        "version": document["version"],
        "fingerprint": fp,
        "published": published,
    }


def task_get(tenants: Tenants, task_id: int) -> ExternalTask | None:
    """An external task visible to a caller of ``tenants`` (None: every tenant's)."""
    qs = ExternalTask.objects.filter(pk=task_id)
    if tenants is not None:
        qs = qs.filter(tenant__in=tenants)
    return qs.first()


def task_reports(task: ExternalTask) -> QuerySet:
    return task.reports.order_by("received_at", "pk")


def topic_known(topic: str) -> bool:
    """Whether a published definition has an ``external_task`` node on ``topic``."""
    if ExternalTask.objects.filter(topic=topic).exists():
        return True
    needle = json.dumps({"topic": topic}, separators=(",", ":"))[1:-1]
    for definition in Definition.objects.filter(document__contains=needle):
        nodes = _stored_object(definition.document).get("nodes") or []
        if any(
            isinstance(n, dict) and n.get("type") == "external_task" and n.get("topic") == topic
            for n in nodes
        ):
            return True
    return False
