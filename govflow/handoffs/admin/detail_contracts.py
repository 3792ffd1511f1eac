"""The contract-migration part of an instance's page: the actions a provider changed under
the instance (their pinned contract differs from the accepted one) and their migrations."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from govflow.engine.models import ContractMigration, Instance, MigrationState
from govflow.engine.selectors import contract_migrations_of
from govflow.engine.services.contract_migrations import MIGRATE, migration_candidates

from ..forms import MigrationRejectForm, MigrationRequestForm


@dataclass
class ContractChange:
    action: str
    change: str
    open_migration: ContractMigration | None = None
    request_form: MigrationRequestForm | None = None


@dataclass
class MigrationRow:
    migration: ContractMigration
    reject_form: MigrationRejectForm | None = None
    may_approve: bool = False


def contract_context(request, instance: Instance, active: bool, bound) -> dict[str, Any]:
    """The actions a provider changed under this instance, and their migrations."""
    user = request.user
    migrations = list(contract_migrations_of(instance))
    open_by_action = {m.action: m for m in migrations if m.state == MigrationState.REQUESTED}
    changes = []
    for action, change in migration_candidates(instance) if active else []:
        row = ContractChange(action, change, open_migration=open_by_action.get(action))
        if row.open_migration is None and user.has_perm(MIGRATE):
            row.request_form = bound.get(("migrate", action)) or MigrationRequestForm(
                actions=[action], initial={"action": action}, auto_id=f"id_migrate_{action}_%s"
            )
        changes.append(row)
    rows = []
    for migration in migrations:
        row = MigrationRow(migration)
        if migration.state == MigrationState.REQUESTED and user.has_perm(MIGRATE):
            row.may_approve = migration.requested_by_id != user.pk
            row.reject_form = bound.get(("migration_reject", migration.pk)) or (
                MigrationRejectForm(auto_id=f"id_migration_reject_{migration.pk}_%s")
            )
        rows.append(row)
    return {"contract_changes": changes, "migrations": rows}
