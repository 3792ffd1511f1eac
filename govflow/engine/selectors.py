"""Reads of the engine's records, for the operator pages, the demo commands and the REST API.

Querysets and small values, never writes (HackSoft-style selectors): whoever shows an
instance — an admin page, a management command, an API view — reads it through these, so
they all show the same thing. Writes are the services.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.utils import timezone

from recovery.api import trail_read

from .linked import step_action
from .models import (
    ContractMigration,
    Definition,
    ExternalTask,
    Incident,
    Instance,
    Token,
    TokenState,
    WaitKind,
)
from .projection import instance_subject
from .registry import ActionDefinition
from .services.definitions import trusted_spec
from .states import TERMINAL_STATUSES

__all__ = [
    "TERMINAL_STATUSES",
    "TokenState",
    "WaitKind",
    "action_of",
    "contract_migrations_of",
    "definition_variables_schema",
    "definitions_published",
    "engine_incidents_of",
    "instance_get",
    "instance_is_active",
    "instance_steps",
    "instance_subject",
    "instance_trail",
    "node_of",
    "step_get",
    "step_waiting",
]


def instance_get(instance_id: int) -> Instance | None:
    """The instance with its definition, or None when there is none with that id."""
    return Instance.objects.select_related("definition").filter(pk=instance_id).first()


def instance_is_active(instance: Instance) -> bool:
    """Whether the instance has not ended (it may still run, wait or be blocked)."""
    return instance.status not in TERMINAL_STATUSES


def instance_steps(instance: Instance | int) -> QuerySet[Token]:
    """The steps (tokens) of an instance, in the order they were created."""
    return Token.objects.filter(instance=instance).order_by("ordinal")


def step_get(*, instance_id: int, token_id: int) -> Token | None:
    """Step ``token_id`` of instance ``instance_id``, or None (never another instance's)."""
    return Token.objects.filter(pk=token_id, instance_id=instance_id).first()


def step_waiting(*, instance_id: int, wait_kind: str) -> Token | None:
    """The first step of the instance waiting for ``wait_kind`` (e.g. an approval), or None."""
    return instance_steps(instance_id).filter(state=TokenState.WAITING, wait_kind=wait_kind).first()


def node_of(instance: Instance, token: Token) -> dict[str, Any]:
    """The definition node a step runs (empty when the stored definition no longer verifies)."""
    return dict(trusted_spec(instance.definition).nodes.get(token.node_id, {}))


def action_of(instance: Instance, token: Token) -> ActionDefinition | None:
    """The registered action a step calls, or None (not an action, or not installed)."""
    return step_action(node_of(instance, token))


def engine_incidents_of(instance: Instance) -> QuerySet[Incident]:
    """The engine's own incidents of an instance (why it blocked), newest first."""
    return instance.incidents.order_by("-created_at", "-pk")


def external_tasks_of(instance: Instance) -> list[ExternalTask]:
    """An instance's external tasks, oldest first, each with its ``history`` of reports
    (refused ones too: the late results an operator reads)."""
    tasks = list(instance.external_tasks.order_by("created_at", "pk"))
    for task in tasks:
        task.history = list(task.reports.order_by("received_at", "pk"))
    return tasks


def dead_task_of(token: Token) -> ExternalTask | None:
    """The dead-lettered external task a failed step waits to have retried, or None."""
    return ExternalTask.objects.filter(token_id=token.pk, state="dead").first()


def contract_migrations_of(instance: Instance) -> QuerySet[ContractMigration]:
    """Migrations of an instance to its actions' changed contracts, oldest first."""
    return instance.contract_migrations.select_related("requested_by", "decided_by").order_by(
        "requested_at", "pk"
    )


def definitions_published() -> QuerySet[Definition]:
    """Every published definition, by key and newest version first."""
    return Definition.objects.order_by("key", "-version")


def definition_variables_schema(definition: Definition) -> dict[str, Any] | None:
    """The JSON Schema of the variables ``definition`` starts with (None: any object)."""
    schema = trusted_spec(definition).document.get("variables")
    return dict(schema) if isinstance(schema, dict) else None


def instance_trail(instance: Instance) -> dict[str, Any]:
    """The instance's audit trail as one JSON-ready document: what the chain, the ledger and
    the decisions record (``recovery.api.trail_read``), with the instance it is about.
    ``manage.py recovery_verify --file`` verifies it offline."""
    definition = instance.definition
    return {
        **trail_read(instance_subject(instance.pk)),
        "instance": instance.pk,
        "exported_at": timezone.now().isoformat(),
        "definition": {
            "key": definition.key,
            "version": definition.version,
            "title": definition.title,
            "fingerprint": instance.definition_fp,
        },
        "tenant": instance.tenant,
        "status": instance.status,
        "case": instance.case_map,
    }
