"""Published definitions: a read-only list and detail, and an upload page that publishes."""

from __future__ import annotations

import json

from django.contrib import admin, messages
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from recovery.api import ConflictError, IntegrityViolation, RecoveryValidationError

from ..definitions import DefinitionInvalid
from ..forms import DefinitionUploadForm
from ..models import Definition
from ..services.definitions import definition_publish, start_refusal
from .base import ReadOnlyAdmin, pre, require, short

PUBLISH = "engine.publish_definition"


@admin.register(Definition)
class DefinitionAdmin(ReadOnlyAdmin):
    list_display = ("key", "version", "title", "fingerprint_short", "published_at", "published_by")
    list_filter = ("key",)
    search_fields = ("key", "title", "fingerprint", "source")
    ordering = ("key", "-version")
    list_select_related = ("published_by",)
    fields = (
        "key",
        "version",
        "title",
        "fingerprint",
        "source",
        "published_at",
        "published_by",
        "runs_here",
        "contracts_pretty",
        "document_pretty",
    )
    readonly_fields = fields
    change_list_template = "admin/engine/definition/change_list.html"
    change_form_template = "admin/engine/definition/change_form.html"

    @admin.display(description="Fingerprint", ordering="fingerprint")
    def fingerprint_short(self, obj: Definition) -> str:
        return short(obj.fingerprint)

    @admin.display(description="Document")
    def document_pretty(self, obj: Definition):
        try:
            return pre(json.loads(obj.document))
        except (ValueError, RecursionError):
            # Changed in the database ("Runs here" says so), or published before the input
            # guard refused such nesting: shown as stored.
            return format_html('<pre class="govflow-json">{}</pre>', obj.document)

    @admin.display(description="Pinned action contracts")
    def contracts_pretty(self, obj: Definition):
        if not obj.contracts:
            return "None: published before action contracts were pinned."
        return pre(json.loads(obj.contracts))

    @admin.display(description="Runs here")
    def runs_here(self, obj: Definition) -> str:
        reason = start_refusal(obj)
        if reason:
            return f"No: {reason}"
        return (
            "Yes: every action it names is registered. Each is as its provider declared it "
            "when this version was published."
        )

    def get_urls(self):
        info = self.opts.app_label, self.opts.model_name
        return [
            path(
                "upload/",
                self.admin_site.admin_view(self.upload_view),
                name="{}_{}_upload".format(*info),
            ),
            *super().get_urls(),
        ]

    def changelist_view(self, request, extra_context=None):
        extra_context = {"can_publish": request.user.has_perm(PUBLISH), **(extra_context or {})}
        return super().changelist_view(request, extra_context)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        extra_context = {
            "can_start": request.user.has_perm("engine.start_instance"),
            **(extra_context or {}),
        }
        return super().change_view(request, object_id, form_url, extra_context)

    def upload_view(self, request):
        """Publish an uploaded definition file; every problem is listed, nothing half-stored."""
        require(request, PUBLISH)
        problems: list[str] = []
        if request.method == "POST":
            form = DefinitionUploadForm(request.POST, request.FILES)
            if form.is_valid():
                try:
                    definition = definition_publish(
                        document=form.cleaned_data["document"],
                        source=form.cleaned_data["source"],
                        actor=request.user,
                    )
                except DefinitionInvalid as exc:
                    problems = exc.problems
                except (ConflictError, IntegrityViolation) as exc:
                    messages.error(request, str(exc))
                    return redirect(request.path)
                except RecoveryValidationError as exc:
                    form.add_error(None, str(exc))
                else:
                    messages.success(
                        request,
                        f"{definition} is published (fingerprint {short(definition.fingerprint)}).",
                    )
                    return redirect(reverse("admin:engine_definition_change", args=[definition.pk]))
        else:
            form = DefinitionUploadForm()
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Upload definition",
            "form": form,
            "problems": problems,
        }
        return TemplateResponse(request, "admin/engine/definition/upload.html", context)
