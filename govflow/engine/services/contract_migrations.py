"""Migrating an instance to an action's changed contract: requested, then approved by another.

A provider's release that changes an action's recovery mode, verification checks or input
schema blocks the instances pinned to the old contract (``definitions.
pinned_contracts_refusal``). An operator who has checked that the instance may go on
under the new contract records that, with a rationale; a second person approves it. Only
the approval changes what the instance is pinned to. Request, approval and rejection are
facts on the instance's chain, so the instance's own record of what it was migrated to is
verified against them before it is trusted.
"""

from __future__ import annotations

import json

from django.db import IntegrityError, transaction

from recovery.api import (
    FingerprintKind,
    canonical_bytes,
    fact_append,
    fenced_update_row,
    fingerprint_value,
)

from ..contracts import action_contract, contract_changes
from ..db import clock, engine_commit
from ..errors import EngineConflict, InvalidRequest, NotPermitted
from ..limits import admit_text
from ..linked import resolve_action
from ..models import ContractMigration, Instance, InstanceStatus, MigrationState
from ..projection import instance_subject
from ..queue import instance_mark_runnable
from ..states import TERMINAL_STATUSES
from .instances import InstanceHeld
from .migrated import MIGRATED, approved_contracts
from .routing import derive_status

__all__ = [
    "MIGRATE",
    "approved_contracts",
    "instance_migrate_approve",
    "instance_migrate_reject",
    "instance_migrate_request",
    "migration_candidates",
]

MIGRATE = "engine.migrate_instance"
REQUESTED = "engine.migration_requested"
REJECTED = "engine.migration_rejected"


def _require(actor, doing: str) -> None:
    if not (actor and actor.is_authenticated and actor.is_active and actor.has_perm(MIGRATE)):
        raise NotPermitted(f"{actor} may not {doing}: the permission {MIGRATE!r} is required.")


def pinned_contracts(instance: Instance) -> dict[str, dict]:
    """The contracts ``instance`` runs under: its definition's, with its migrations applied."""
    pinned = json.loads(instance.definition.contracts or "{}")
    return pinned | json.loads(instance.contracts or "{}")


def migration_candidates(instance: Instance) -> list[tuple[str, str]]:
    """The actions of ``instance`` whose provider changed them: (action, what changed)."""
    found = []
    for name, contract in sorted(pinned_contracts(instance).items()):
        action = resolve_action(name)
        change = action and contract_changes(name, contract, action_contract(action))
        if change:
            found.append((name, change))
    return found


def instance_migrate_request(
    *, instance_id: int, action: str, rationale: str, actor
) -> ContractMigration:
    """Request that ``instance_id`` run ``action`` under the provider's current contract.

    Nothing changes until another person approves it. Refused when the action has not
    changed, when the instance has ended, and while another request for the same action
    awaits approval.
    """
    _require(actor, "request a migration")
    rationale = (rationale or "").strip()
    if not rationale:
        raise InvalidRequest(
            "A migration needs a rationale: say why the instance may go on under the "
            "action's new contract (what was checked, with whom)."
        )
    admit_text(rationale, name="rationale", max_length=4000)
    instance, pinned, current = _migratable(instance_id, action)
    try:
        with transaction.atomic():
            migration = ContractMigration.objects.create(
                instance=instance,
                action=action,
                pinned=pinned[action],
                accepted=current,
                rationale=rationale,
                requested_by=actor,
                requested_at=clock(),
            )
            fact_append(
                subject=instance_subject(instance_id),
                kind=REQUESTED,
                fact={
                    "migration": migration.pk,
                    "action": action,
                    "from": pinned[action]["contract_fp"],
                    "to": current["contract_fp"],
                    "requested_by": actor.pk,
                    "rationale_fp": fingerprint_value(FingerprintKind.INPUT, rationale),
                },
            )
    except IntegrityError:
        raise EngineConflict(
            f"A migration of {action} on instance {instance_id} already awaits approval. "
            "Approve or reject that one first."
        ) from None
    migration.refresh_from_db()
    return migration


def _migratable(instance_id: int, action: str) -> tuple[Instance, dict[str, dict], dict]:
    """The instance, its pinned contracts and ``action``'s current one, if it may migrate."""
    instance = Instance.objects.select_related("definition").filter(pk=instance_id).first()
    if instance is None:
        raise InvalidRequest(f"No instance has id {instance_id}.")
    if instance.status in TERMINAL_STATUSES:
        raise EngineConflict(f"Instance {instance_id} is {instance.status}; nothing to migrate.")
    pinned = pinned_contracts(instance)
    if action not in pinned:
        raise InvalidRequest(
            f"{instance.definition} does not use action {action!r}; it uses "
            f"{', '.join(sorted(pinned)) or 'no action'}."
        )
    provided = resolve_action(action)
    if provided is None:
        raise InvalidRequest(
            f"No installed provider registers {action}. A migration accepts a changed "
            "action, not a missing one: install the provider's module."
        )
    current = action_contract(provided)
    if not contract_changes(action, pinned[action], current):
        raise EngineConflict(
            f"{action} has not changed since instance {instance_id} was pinned to it; "
            "there is nothing to migrate."
        )
    return instance, pinned, current


def _open(migration_id: int) -> ContractMigration:
    migration = ContractMigration.objects.filter(pk=migration_id).first()
    if migration is None:
        raise InvalidRequest(f"No migration has id {migration_id}.")
    if migration.state != MigrationState.REQUESTED:
        raise EngineConflict(
            f"Migration {migration_id} is no longer awaiting approval (it was "
            f"{migration.state}). Nothing was changed."
        )
    return migration


def _claim(migration_id: int, state: str, actor, note: str = "") -> None:
    claimed = ContractMigration.objects.filter(
        pk=migration_id, state=MigrationState.REQUESTED
    ).update(state=state, decided_by=actor, decided_at=clock(), note=note)
    if claimed != 1:
        raise EngineConflict(
            f"Migration {migration_id} is no longer awaiting approval (someone else "
            "approved or rejected it). Nothing was changed."
        )


def instance_migrate_approve(*, migration_id: int, actor) -> ContractMigration:
    """Approve another person's migration: the instance is pinned to the accepted contract.

    The instance moves on in its next run (queued in the same commit). Refused when the
    provider changed the action again since the request: reject it and request again.
    """
    _require(actor, "approve a migration")
    migration = _open(migration_id)
    if migration.requested_by_id == actor.pk:
        raise InvalidRequest(
            "The person who requested a migration cannot approve it: a second person must "
            "check that the instance may go on under the new contract."
        )
    provided = resolve_action(migration.action)
    if provided is None or action_contract(provided) != migration.accepted:
        raise EngineConflict(
            f"The provider changed {migration.action} again since migration {migration_id} "
            "was requested, so it no longer says what it would accept. Nothing was changed: "
            "reject it and request a new one."
        )
    with InstanceHeld(migration.instance_id, actor) as run:
        instance = run.instance
        if instance.status in TERMINAL_STATUSES:
            raise EngineConflict(f"Instance {instance.pk} is {instance.status}.")
        with engine_commit():
            _claim(migration_id, MigrationState.APPROVED, actor)
            migrated = json.loads(instance.contracts or "{}")
            migrated[migration.action] = migration.accepted
            fact_append(
                subject=instance_subject(instance.pk),
                kind=MIGRATED,
                fact={
                    "migration": migration.pk,
                    "action": migration.action,
                    "contract": migration.accepted,
                    "requested_by": migration.requested_by_id,
                    "approved_by": actor.pk,
                },
            )
            values = {"contracts": canonical_bytes(migrated).decode(), "updated_at": clock()}
            if instance.status == InstanceStatus.BLOCKED:
                # The next run decides again; an instance still blocked for another reason
                # (an unknown outcome) keeps that reason.
                status = derive_status(run.active.values())
                if status != InstanceStatus.BLOCKED:
                    values.update(status=status, reason="")
            fenced_update_row(Instance, pk=instance.pk, fence=run.fence, values=values)
            instance_mark_runnable(instance.pk)
    migration.refresh_from_db()
    return migration


def instance_migrate_reject(*, migration_id: int, actor, note: str) -> ContractMigration:
    """Reject (or, by its requester, withdraw) a migration; the instance stays as it was."""
    _require(actor, "reject a migration")
    note = (note or "").strip()
    if not note:
        raise InvalidRequest("Say why the migration is rejected, so the requester can act on it.")
    admit_text(note, name="note", max_length=4000)
    migration = _open(migration_id)
    with transaction.atomic():
        _claim(migration_id, MigrationState.REJECTED, actor, note)
        fact_append(
            subject=instance_subject(migration.instance_id),
            kind=REJECTED,
            fact={"migration": migration.pk, "action": migration.action, "rejected_by": actor.pk},
        )
    migration.refresh_from_db()
    return migration
