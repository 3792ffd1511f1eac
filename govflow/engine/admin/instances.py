"""Instances: the list, the operator's page of one instance, and its POST-only actions.

Each action view checks its permission (403 otherwise), parses one form, calls one
service and redirects back (POST-redirect-GET). A service's validation error is shown on
the form it came from; a conflict (someone else changed the instance, a lease is held, a
decision was already taken) becomes an error message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseNotAllowed
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.text import Truncator

from recovery.api import ConflictError, IntegrityViolation, RecoveryValidationError, decision_get

from ..forms import (
    ApprovalForm,
    CancelForm,
    HandoffRequestForm,
    InstanceStartForm,
    RejectDecisionForm,
)
from ..migration_forms import MigrationRejectForm, MigrationRequestForm
from ..models import ContractMigration, Instance, Token
from ..services.contract_migrations import (
    MIGRATE,
    instance_migrate_approve,
    instance_migrate_reject,
    instance_migrate_request,
)
from ..services.instances import instance_cancel, instance_start, step_retry
from ..services.waits import approval_decide, handoff_approve, handoff_reject, handoff_request
from .base import ReadOnlyAdmin, require
from .detail import APPROVE, OPERATE, REQUEST, action_of, detail_context, subject_of

START = "engine.start_instance"


@admin.register(Instance)
class InstanceAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "definition",
        "tenant",
        "status",
        "reason_short",
        "started_by",
        "created_at",
        "updated_at",
    )
    list_display_links = ("id", "definition")
    list_filter = ("status", "tenant", "definition__key")
    search_fields = ("=id", "tenant", "definition__key", "reason")
    date_hierarchy = "created_at"
    list_select_related = ("definition", "started_by")
    ordering = ("-created_at", "-pk")
    change_list_template = "admin/engine/instance/change_list.html"

    @admin.display(description="Reason")
    def reason_short(self, obj: Instance) -> str:
        return Truncator(obj.reason).chars(80)

    # -- URLs ---------------------------------------------------------------------------

    def get_urls(self):
        def url(route: str, view: Callable, name: str):
            return path(route, self.admin_site.admin_view(view), name=f"engine_instance_{name}")

        return [
            url("start/", self.start_view, "start"),
            url("<int:instance_id>/cancel/", self.cancel_view, "cancel"),
            url("<int:instance_id>/steps/<int:token_id>/retry/", self.retry_view, "retry"),
            url("<int:instance_id>/steps/<int:token_id>/approval/", self.approval_view, "approval"),
            url("<int:instance_id>/steps/<int:token_id>/handoff/", self.handoff_view, "handoff"),
            url(
                "<int:instance_id>/decisions/<int:decision_id>/approve/",
                self.decision_approve_view,
                "decision_approve",
            ),
            url(
                "<int:instance_id>/decisions/<int:decision_id>/reject/",
                self.decision_reject_view,
                "decision_reject",
            ),
            url("<int:instance_id>/migrations/request/", self.migrate_view, "migrate"),
            url(
                "<int:instance_id>/migrations/<int:migration_id>/approve/",
                self.migration_approve_view,
                "migration_approve",
            ),
            url(
                "<int:instance_id>/migrations/<int:migration_id>/reject/",
                self.migration_reject_view,
                "migration_reject",
            ),
            *super().get_urls(),
        ]

    @staticmethod
    def detail_url(instance_id: int) -> str:
        return reverse("admin:engine_instance_change", args=[instance_id])

    # -- pages --------------------------------------------------------------------------

    def changelist_view(self, request, extra_context=None):
        extra_context = {"can_start": request.user.has_perm(START), **(extra_context or {})}
        return super().changelist_view(request, extra_context)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        """The operator's page of one instance (replaces the model form: nothing is edited)."""
        return self.render_detail(request, self.get_instance(request, unquote(object_id)))

    def render_detail(self, request, instance: Instance, bound: dict | None = None):
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"Instance {instance.pk}: {instance.definition}",
            "object": instance,
            **detail_context(request, instance, bound),
        }
        return TemplateResponse(request, "admin/engine/instance/detail.html", context)

    def get_instance(self, request, instance_id, *perms: str) -> Instance:
        """The instance, once the user may see it and holds ``perms`` (403, then 404)."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        require(request, *perms)
        instance = self.get_object(request, str(instance_id))
        if instance is None:
            raise Http404(f"No instance has id {instance_id}.")
        return instance

    def start_view(self, request):
        require(request, START)
        initial = {"definition": request.GET.get("definition")}
        form = InstanceStartForm(
            request.POST if request.method == "POST" else None, initial=initial
        )
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            try:
                instance = instance_start(
                    definition=data["definition"],
                    tenant=data["tenant"],
                    variables=data["variables"],
                    actor=request.user,
                )
            except (ConflictError, IntegrityViolation) as exc:
                messages.error(request, str(exc))
            except RecoveryValidationError as exc:
                form.add_error(None, str(exc))
            else:
                messages.success(
                    request,
                    f"Instance {instance.pk} of {instance.definition} "
                    "started; a worker will run it.",
                )
                if self.has_view_permission(request, instance):
                    return redirect(self.detail_url(instance.pk))
                return redirect(request.path)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Start an instance",
            "form": form,
        }
        return TemplateResponse(request, "admin/engine/instance/start.html", context)

    # -- actions (POST only) ------------------------------------------------------------

    def act(
        self,
        request,
        instance: Instance,
        call: Callable[[], Any],
        done: Callable[[Any], str],
        *,
        form=None,
        slot: Any = None,
    ):
        """Validate ``form``, run ``call`` (one service) and report, then redirect back."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if form is not None and not form.is_valid():
            return self.render_detail(request, instance, {slot: form})
        try:
            result = call()
        except (ConflictError, IntegrityViolation) as exc:
            messages.error(request, str(exc))
        except RecoveryValidationError as exc:
            if form is None:
                messages.error(request, str(exc))
            else:
                form.add_error(None, str(exc))
                return self.render_detail(request, instance, {slot: form})
        else:
            messages.success(request, done(result))
        return redirect(self.detail_url(instance.pk))

    @staticmethod
    def _post(request):
        return (request.POST, request.FILES) if request.method == "POST" else (None, None)

    def _token(self, instance: Instance, token_id: int) -> Token:
        token = instance.tokens.filter(pk=token_id).first()
        if token is None:
            raise Http404(f"Instance {instance.pk} has no step {token_id}.")
        return token

    def _decision(self, instance: Instance, decision_id: int):
        decision = decision_get(decision_id=decision_id, subject=subject_of(instance))
        if decision is None:
            raise Http404(f"Instance {instance.pk} has no decision {decision_id}.")
        return decision

    def cancel_view(self, request, instance_id: int):
        instance = self.get_instance(request, instance_id, OPERATE)
        form = CancelForm(request.POST if request.method == "POST" else None)
        return self.act(
            request,
            instance,
            form=form,
            slot="cancel",
            call=lambda: instance_cancel(
                instance_id=instance.pk, actor=request.user, reason=form.cleaned_data["reason"]
            ),
            done=lambda _: f"Instance {instance.pk} is cancelled.",
        )

    def retry_view(self, request, instance_id: int, token_id: int):
        instance = self.get_instance(request, instance_id, OPERATE)
        token = self._token(instance, token_id)
        return self.act(
            request,
            instance,
            call=lambda: step_retry(instance_id=instance.pk, token_id=token.pk, actor=request.user),
            done=lambda _: f"Step '{token.node_id}' will be retried (attempt {token.attempt + 1}).",
        )

    def approval_view(self, request, instance_id: int, token_id: int):
        # The node names its own permission; approval_decide checks it and says which.
        instance = self.get_instance(request, instance_id)
        token = self._token(instance, token_id)
        form = ApprovalForm(
            request.POST if request.method == "POST" else None, auto_id=f"id_approval_{token.pk}_%s"
        )
        return self.act(
            request,
            instance,
            form=form,
            slot=("approval", token.pk),
            call=lambda: approval_decide(
                instance_id=instance.pk,
                token_id=token.pk,
                actor=request.user,
                approved=form.cleaned_data["decision"] == "approve",
                note=form.cleaned_data["note"],
            ),
            done=lambda _: (
                f"Your {form.cleaned_data['decision']} of '{token.node_id}' is recorded."
            ),
        )

    def handoff_view(self, request, instance_id: int, token_id: int):
        instance = self.get_instance(request, instance_id, OPERATE, REQUEST)
        token = self._token(instance, token_id)
        action = action_of(instance, token)
        form = HandoffRequestForm(
            *self._post(request),
            checks=action.checks if action else (),
            auto_id=f"id_handoff_{token.pk}_%s",
        )
        return self.act(
            request,
            instance,
            form=form,
            slot=("handoff", token.pk),
            call=lambda: handoff_request(
                instance_id=instance.pk,
                token_id=token.pk,
                actor=request.user,
                kind=form.cleaned_data["kind"],
                rationale=form.cleaned_data["rationale"],
                evidence=form.cleaned_data["evidence"],
                checks=form.check_answers(),
            ),
            done=lambda decision: (
                f"Decision {decision.pk} ({decision.get_kind_display()}) is requested. "
                "Another person with the approve permission must check it and approve it."
            ),
        )

    def decision_approve_view(self, request, instance_id: int, decision_id: int):
        instance = self.get_instance(request, instance_id, APPROVE)
        decision = self._decision(instance, decision_id)
        return self.act(
            request,
            instance,
            call=lambda: handoff_approve(decision_id=decision.pk, actor=request.user),
            done=lambda approved: (
                f"Decision {approved.pk} ({approved.get_kind_display()}) "
                "is approved; the instance moves on."
            ),
        )

    def decision_reject_view(self, request, instance_id: int, decision_id: int):
        instance = self.get_instance(request, instance_id, APPROVE)
        decision = self._decision(instance, decision_id)
        form = RejectDecisionForm(
            request.POST if request.method == "POST" else None,
            auto_id=f"id_reject_{decision.pk}_%s",
        )
        return self.act(
            request,
            instance,
            form=form,
            slot=("reject", decision.pk),
            call=lambda: handoff_reject(
                decision_id=decision.pk, actor=request.user, note=form.cleaned_data["note"]
            ),
            done=lambda _: (
                f"Decision {decision.pk} is rejected; the step still waits for a decision."
            ),
        )

    # -- migrations to an action's changed contract -------------------------------------

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
                f"Migration {migration.pk} of {migration.action} is requested. Another person "
                "with the migrate permission must approve it before the instance moves on."
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
                f"Migration {approved.pk} is approved: instance {instance.pk} runs "
                f"{approved.action} under its current contract and moves on."
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
            done=lambda _: (
                f"Migration {migration.pk} is rejected; the instance stays blocked until its "
                "actions are migrated or it is cancelled."
            ),
        )
