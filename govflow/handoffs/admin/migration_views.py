"""The POST actions that migrate an instance to an action's changed contract.

Request, approve (by another person) or reject; the services are the engine's
(``govflow.engine.services.contract_migrations``: the approval changes what the instance
is pinned to, under its lease). A mixin of
:class:`~govflow.handoffs.admin.instances.InstanceAdmin`.
"""

from __future__ import annotations

from django.http import Http404
from django.utils.translation import gettext as _

from govflow.engine.models import ContractMigration, Instance
from govflow.engine.services.contract_migrations import (
    MIGRATE,
    instance_migrate_approve,
    instance_migrate_reject,
    instance_migrate_request,
)

from ..forms import MigrationRejectForm, MigrationRequestForm


class MigrationActions:
    """Request, approve or reject the migration of an instance to a changed contract."""

    URLS = (
        ("<int:instance_id>/migrations/request/", "migrate_view", "migrate"),
        (
            "<int:instance_id>/migrations/<int:migration_id>/approve/",
            "migration_approve_view",
            "migration_approve",
        ),
        (
            "<int:instance_id>/migrations/<int:migration_id>/reject/",
            "migration_reject_view",
            "migration_reject",
        ),
    )

    def _migration(self, instance: Instance, migration_id: int) -> ContractMigration:
        migration = instance.contract_migrations.filter(pk=migration_id).first()
        if migration is None:
            raise Http404(f"Instance {instance.pk} has no migration {migration_id}.")
        return migration

    def migrate_view(self, request, instance_id: int):
        instance = self.get_instance(request, instance_id, MIGRATE)
        action = request.POST.get("action", "")
        form = MigrationRequestForm(
            request.POST if request.method == "POST" else None,
            actions=[action],
            auto_id=f"id_migrate_{action}_%s",
        )
        return self.act(
            request,
            instance,
            form=form,
            slot=("migrate", action),
            call=lambda: instance_migrate_request(
                instance_id=instance.pk,
                action=form.cleaned_data["action"],
                rationale=form.cleaned_data["rationale"],
                actor=request.user,
            ),
            done=lambda migration: (
                _(
                    "Migration %(pk)s of %(action)s is requested. Another person "
                    "with the migrate permission must approve it before the instance moves on."
                )
                % {"pk": migration.pk, "action": migration.action}
            ),
        )

    def migration_approve_view(self, request, instance_id: int, migration_id: int):
        instance = self.get_instance(request, instance_id, MIGRATE)
        migration = self._migration(instance, migration_id)
        return self.act(
            request,
            instance,
            call=lambda: instance_migrate_approve(migration_id=migration.pk, actor=request.user),
            done=lambda approved: (
                _(
                    "Migration %(pk)s is approved: instance %(instance)s runs "
                    "%(action)s under its current contract and moves on."
                )
                % {"pk": approved.pk, "instance": instance.pk, "action": approved.action}
            ),
        )

    def migration_reject_view(self, request, instance_id: int, migration_id: int):
        instance = self.get_instance(request, instance_id, MIGRATE)
        migration = self._migration(instance, migration_id)
        form = MigrationRejectForm(
            request.POST if request.method == "POST" else None,
            auto_id=f"id_migration_reject_{migration.pk}_%s",
        )
        return self.act(
            request,
            instance,
            form=form,
            slot=("migration_reject", migration.pk),
            call=lambda: instance_migrate_reject(
                migration_id=migration.pk, actor=request.user, note=form.cleaned_data["note"]
            ),
            done=lambda result: (
                _(
                    "Migration %(pk)s is rejected; the instance stays blocked until its "
                    "actions are migrated or it is cancelled."
                )
                % {"pk": migration.pk}
            ),
        )
