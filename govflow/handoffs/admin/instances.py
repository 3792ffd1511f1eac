"""Instances: the list, the operator's page of one instance, and the start page.

Each action view checks its permission (403 otherwise), parses one form, calls one
service and redirects back (POST-redirect-GET). A service's validation error is shown on
the form it came from; a conflict (someone else changed the instance, a lease is held, a
decision was already taken) becomes an error message. The action views are mixins: steps
and decisions in ``step_views``, contract migrations in ``migration_views``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.text import Truncator
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from govflow.engine.admin.base import ReadOnlyAdmin, pretty_json, require
from govflow.engine.models import Instance
from govflow.engine.selectors import definitions_published, instance_subject, instance_trail
from govflow.engine.services.instances import instance_start
from govflow.engine.tenancy import scope, tenant_choices
from recovery.api import ConflictError, IntegrityViolation, RecoveryValidationError

from ..forms import DefinitionPickForm, InstanceStartForm
from ..timeline import instance_timeline_read, timeline_page
from ..words import case_column, case_labels
from .compensation_views import CompensationActions, compensation_context
from .detail import TRAIL, detail_context
from .migration_views import MigrationActions
from .step_views import StepActions

START = "engine.start_instance"


@admin.register(Instance)
class InstanceAdmin(StepActions, MigrationActions, CompensationActions, ReadOnlyAdmin):
    list_display = (
        "case_title",
        "definition_title",
        "tenant",
        "status",
        "case_summary",
        "reason_short",
        "started_by",
        "created_at",
        "updated_at",
    )
    list_display_links = ("case_title",)
    list_filter = ("status", "tenant", "definition__key")
    # case_text: the definition's case fields (applicant, case number, …), lowercased.
    search_fields = ("=id", "tenant", "definition__key", "definition__title", "reason", "case_text")
    date_hierarchy = "created_at"
    list_select_related = ("definition", "started_by")
    ordering = ("-created_at", "-pk")
    change_list_template = "admin/engine/instance/change_list.html"

    def get_queryset(self, request):
        """Only the instances of the user's tenants: another tenant's is not found (404)."""
        return scope(super().get_queryset(request), request.user)

    @admin.display(description=_("Reason"))
    def reason_short(self, obj: Instance) -> str:
        return Truncator(obj.reason).chars(80)

    @admin.display(description=_("Case"), ordering="-pk")
    def case_title(self, obj: Instance) -> str:
        return str(obj)

    @admin.display(description=_("Definition"), ordering="definition__title")
    def definition_title(self, obj: Instance) -> str:
        return obj.definition.title

    @admin.display(description=_("Case fields"))
    def case_summary(self, obj: Instance) -> str:
        labels = case_labels(obj.definition)
        return "; ".join(f"{labels.get(k, k)}: {v}" for k, v in obj.case or ()) or "—"

    def get_list_display(self, request):
        """Filtered to one definition, its case fields are columns of their own."""
        key = request.GET.get("definition__key")
        definition = definitions_published().filter(key=key).first() if key else None
        if definition is None:
            return self.list_display
        columns = [case_column(name, label) for name, label in case_labels(definition).items()]
        head, tail = self.list_display[:4], self.list_display[5:]
        return (*head, *columns, *tail)

    # -- URLs ---------------------------------------------------------------------------

    def get_urls(self):
        def url(route: str, view: Callable, name: str):
            return path(route, self.admin_site.admin_view(view), name=f"engine_instance_{name}")

        actions = (*StepActions.URLS, *MigrationActions.URLS, *CompensationActions.URLS)
        return [
            url("start/", self.start_view, "start"),
            url("<path:object_id>/trail/", self.trail_view, "trail"),
            url("<path:object_id>/timeline/", self.timeline_view, "timeline"),
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
            "title": str(instance),
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
        """Choose a definition (GET), then fill in the form its variables schema generates;
        ``?raw=1`` (or a schema a form cannot express) asks for the variables as JSON."""
        require(request, START)
        tenants = tenant_choices(request.user)
        if not tenants:
            return self._start_page(
                request, {"no_tenant": True, "title": gettext("Start an instance")}
            )
        source = request.POST if request.method == "POST" else request.GET
        pick = DefinitionPickForm(source if "definition" in source else None)
        if not pick.is_bound or not pick.is_valid():
            return self._start_page(request, {"pick": pick, "title": gettext("Start an instance")})
        definition = pick.cleaned_data["definition"]
        form = InstanceStartForm(
            request.POST if request.method == "POST" else None,
            definition=definition,
            tenants=tenants,
            raw=source.get("raw") == "1",
        )
        if request.method == "POST" and form.is_valid():
            instance = self._start(request, form)
            if instance is not None:
                if self.has_view_permission(request, instance):
                    return redirect(self.detail_url(instance.pk))
                return redirect(request.path)
        return self._start_page(
            request,
            {
                "form": form,
                "definition": definition,
                "schema_json": pretty_json(form.schema) if form.raw and form.schema else "",
                "title": gettext("Start: %(definition)s") % {"definition": definition.title},
            },
        )

    def _start(self, request, form) -> Instance | None:
        data = form.cleaned_data
        try:
            instance = instance_start(
                definition=form.definition,
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
                request, gettext("Started %(case)s; a worker will run it.") % {"case": instance}
            )
            return instance
        return None

    def _start_page(self, request, context: dict[str, Any]):
        context = {**self.admin_site.each_context(request), "opts": self.opts, **context}
        return TemplateResponse(request, "admin/engine/instance/start.html", context)

    def trail_view(self, request, object_id):
        """The instance's audit trail as one JSON file (``recovery_verify --file`` checks it)."""
        instance = self.get_instance(request, unquote(object_id), TRAIL)
        body = json.dumps(instance_trail(instance), indent=1, ensure_ascii=False, default=str)
        response = HttpResponse(body.encode(), content_type="application/json; charset=utf-8")
        response["Content-Disposition"] = (
            f'attachment; filename="instance-{instance.pk}-trail.json"'
        )
        response["X-Content-Type-Options"] = "nosniff"
        return response

    def timeline_view(self, request, object_id):
        """The instance's whole timeline, a page at a time (``?page=1`` is the latest; a
        page beyond the last shows the last)."""
        instance = self.get_instance(request, unquote(object_id))
        number = request.GET.get("page", "1")
        entries = instance_timeline_read(instance, instance_subject(instance.pk))
        plain = number.isascii() and number.isdigit()  # "²" is a digit that int() refuses
        timeline = timeline_page(entries, int(number) if plain else 1)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": gettext("Timeline of %(instance)s") % {"instance": instance},
            "instance": instance,
            "timeline": timeline,
        }
        return TemplateResponse(request, "admin/engine/instance/timeline.html", context)

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
