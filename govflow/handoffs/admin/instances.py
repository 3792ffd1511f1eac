"""Instances: the list, the operator's page of one instance, and the start page.

Each action view checks its permission (403 otherwise), parses one form, calls one
service and redirects back (POST-redirect-GET). A service's validation error is shown on
the form it came from; a conflict (someone else changed the instance, a lease is held, a
decision was already taken) becomes an error message. The action views are mixins: steps
and decisions in ``step_views``, contract migrations in ``migration_views``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.text import Truncator

from govflow.engine.admin.base import ReadOnlyAdmin, require
from govflow.engine.models import Instance
from govflow.engine.services.instances import instance_start
from govflow.engine.tenancy import scope
from recovery.api import ConflictError, IntegrityViolation, RecoveryValidationError

from ..forms import InstanceStartForm
from .compensation_views import CompensationActions, compensation_context
from .detail import detail_context
from .migration_views import MigrationActions
from .step_views import StepActions

START = "engine.start_instance"


@admin.register(Instance)
class InstanceAdmin(StepActions, MigrationActions, CompensationActions, ReadOnlyAdmin):
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

    def get_queryset(self, request):
        """Only the instances of the user's tenants: another tenant's is not found (404)."""
        return scope(super().get_queryset(request), request.user)

    @admin.display(description="Reason")
    def reason_short(self, obj: Instance) -> str:
        return Truncator(obj.reason).chars(80)

    # -- URLs ---------------------------------------------------------------------------

    def get_urls(self):
        def url(route: str, view: Callable, name: str):
            return path(route, self.admin_site.admin_view(view), name=f"engine_instance_{name}")

        actions = (*StepActions.URLS, *MigrationActions.URLS, *CompensationActions.URLS)
        return [
            url("start/", self.start_view, "start"),
            *(url(route, getattr(self, view), name) for route, view, name in actions),
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

    def history_view(self, request, object_id, extra_context=None):
        """The admin's change history is empty here (nothing is edited through forms): the
        instance's timeline, built from its chain and ledger, is the history."""
        instance = self.get_instance(request, unquote(object_id))
        return redirect(self.detail_url(instance.pk) + "#timeline")

    def render_detail(self, request, instance: Instance, bound: dict | None = None):
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"Instance {instance.pk}: {instance.definition}",
            "object": instance,
            **detail_context(request, instance, bound),
            **compensation_context(request, instance, bound),
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
            # A reload of the page a validation error rendered at this URL: show the
            # instance's page again (never a bare 405).
            return redirect(self.detail_url(instance.pk))
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
