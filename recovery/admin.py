"""Admin pages for the ledger: read-only, except an incident's four-eyes resolution.

Nobody edits facts or evidence by hand.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import FileResponse, Http404
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext as _

from .admin_pages import evidence_url, incident_context
from .errors import ConflictError, EvidenceCorrupt, RecoveryError, RecoveryValidationError
from .evidence import SIGNATURE_BYTES, inline_type
from .forms import ResolutionRejectForm, ResolutionRequestForm
from .models import Checkpoint, Decision, EvidenceFile, IntegrityIncident, Lease, Operation
from .services.evidence import EVIDENCE_READERS, evidence_open
from .services.resolution_requests import incident_resolve_request
from .services.resolutions import (
    RESOLVE_PERMISSION,
    incident_resolve_approve_via_owner,
    incident_resolve_reject,
    incident_resolve_withdraw,
)
from .subjects import Subject, subject_types, subjects_visible


class ReadOnlyAdmin(admin.ModelAdmin):
    # The fields naming a row's subject (a user sees the subjects it may); None: no subject.
    subject_fields: tuple[str, str] | None = ("subject_type", "subject_id")

    def get_queryset(self, request):
        rows = super().get_queryset(request)
        if self.subject_fields is None:
            return rows if subject_types.visible_to(request.user) is None else rows.none()
        shown = subjects_visible(request.user, *self.subject_fields)
        return rows if shown is None else rows.filter(shown)

    def _get_obj_does_not_exist_redirect(self, request, opts, object_id):
        """A row the user may not see, or that does not exist, is 404 (not a redirect)."""
        raise Http404(f"No {opts.verbose_name} has id {object_id}.")

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Operation)
class OperationAdmin(ReadOnlyAdmin):
    list_display = (
        "key",
        "action",
        "subject_type",
        "subject_id",
        "step_id",
        "state",
        "recovery_mode",
        "ordinal",
        "fence",
        "updated_at",
    )
    list_filter = ("state", "recovery_mode", "action")
    search_fields = ("key", "subject_id", "step_id", "idempotency_fp")
    date_hierarchy = "recorded_at"


@admin.register(Checkpoint)
class CheckpointAdmin(ReadOnlyAdmin):
    list_display = ("subject_type", "subject_id", "seq", "kind", "key_id", "recorded_at")
    list_filter = ("kind", "key_id")
    search_fields = ("subject_id", "link", "fact_fp")
    ordering = ("subject_type", "subject_id", "seq")


@admin.register(Lease)
class LeaseAdmin(ReadOnlyAdmin):
    subject_fields = None  # a lease's key is the host's; a narrowed user sees none
    list_display = ("key", "holder", "fence", "acquired_at", "expires_at", "released_at")
    search_fields = ("key", "holder")


@admin.register(IntegrityIncident)
class IntegrityIncidentAdmin(ReadOnlyAdmin):
    """The incident's page: what broke, the chain now, and its four-eyes resolution.

    Nothing is edited through a model form. Requesting, approving, rejecting and
    withdrawing a resolution each have their own POST view, which checks the view
    permission and ``recovery.resolve_incident`` (403 otherwise), calls one service and
    redirects back to the page.
    """

    list_display = (
        "id",
        "subject_type",
        "subject_id",
        "position",
        "status",
        "detected_at",
        "resolved_at",
    )
    list_display_links = ("id", "subject_type", "subject_id")
    list_filter = ("status",)
    search_fields = ("subject_id", "reason")

    def get_urls(self):
        def url(route: str, view, name: str):
            return path(
                f"<int:incident_id>/resolution/{route}/",
                self.admin_site.admin_view(view),
                name=f"recovery_integrityincident_resolution_{name}",
            )

        return [
            url("request", self.request_view, "request"),
            url("approve", self.approve_view, "approve"),
            url("reject", self.reject_view, "reject"),
            url("withdraw", self.withdraw_view, "withdraw"),
            *super().get_urls(),
        ]

    def change_view(self, request, object_id, form_url="", extra_context=None):
        """The incident's own page (replaces the model form: nothing is edited here)."""
        if request.method not in ("GET", "HEAD"):
            raise PermissionDenied
        return self.render_incident(request, self.get_incident(request, unquote(object_id)))

    def get_incident(self, request, incident_id, *, act: bool = False) -> IntegrityIncident:
        """The incident, once the user may see it (and, with ``act``, resolve it)."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        if act and not request.user.has_perm(RESOLVE_PERMISSION):
            raise PermissionDenied
        incident = self.get_object(request, str(incident_id))
        if incident is None:
            raise Http404(f"No integrity incident has id {incident_id}.")
        return incident

    def render_incident(self, request, incident: IntegrityIncident, bound: dict | None = None):
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"Integrity incident {incident.pk}",
            "object": incident,
            **incident_context(request, incident, bound or {}),
        }
        return TemplateResponse(request, "admin/recovery/integrityincident/detail.html", context)

    def act(self, request, incident_id: int, call, done, *, form=None, slot: str = ""):
        """Check, validate ``form``, run ``call`` (one service), report, redirect back.

        A service's validation error is shown on the form it came from; a conflict (someone
        else acted first) and an approval that resolved nothing become error messages.
        """
        incident = self.get_incident(request, incident_id, act=True)
        if request.method != "POST":
            # A reload of the page a validation error rendered at this URL: show the
            # incident's page again (never a bare 405).
            return redirect(reverse("admin:recovery_integrityincident_change", args=[incident.pk]))
        if form is not None and not form.is_valid():
            return self.render_incident(request, incident, {slot: form})
        try:
            result = call(incident)
        except ConflictError as exc:
            messages.error(request, str(exc))
        except RecoveryValidationError as exc:
            if form is None:
                messages.error(request, str(exc))
            else:
                form.add_error(None, str(exc))
                incident.refresh_from_db()
                return self.render_incident(request, incident, {slot: form})
        except RecoveryError as exc:  # e.g. the chain keys are missing from settings
            messages.error(request, str(exc))
        else:
            if getattr(result, "resolved", True):
                messages.success(request, done(incident, result))
            else:
                messages.error(request, done(incident, result))
        return redirect(reverse("admin:recovery_integrityincident_change", args=[incident.pk]))

    def request_view(self, request, incident_id: int):
        posted = request.method == "POST"
        form = ResolutionRequestForm(
            request.POST if posted else None, request.FILES if posted else None
        )
        return self.act(
            request,
            incident_id,
            form=form,
            slot="request",
            call=lambda incident: incident_resolve_request(
                incident_id=incident.pk,
                requested_by=request.user,
                rationale=form.cleaned_data["rationale"],
                watermark=form.cleaned_data["watermark"],
                evidence=form.cleaned_data["evidence"],
            ),
            done=lambda incident, resolution: (
                _(
                    "Resolution request %(pk)s of incident %(incident)s is recorded. "
                    "Another person with the permission to resolve incidents must check it and "
                    "approve it; approval verifies the chain again."
                )
                % {"pk": resolution.pk, "incident": incident.pk}
            ),
        )

    def approve_view(self, request, incident_id: int):
        return self.act(
            request,
            incident_id,
            call=lambda incident: incident_resolve_approve_via_owner(
                incident_id=incident.pk, actor=request.user
            ),
            done=lambda incident, outcome: outcome.message,
        )

    def reject_view(self, request, incident_id: int):
        form = ResolutionRejectForm(request.POST if request.method == "POST" else None)
        return self.act(
            request,
            incident_id,
            form=form,
            slot="reject",
            call=lambda incident: incident_resolve_reject(
                incident_id=incident.pk, rejected_by=request.user, note=form.cleaned_data["note"]
            ),
            done=lambda incident, resolution: (
                _("Resolution request %(pk)s is rejected; incident %(incident)s stays open.")
                % {"pk": resolution.pk, "incident": incident.pk}
            ),
        )

    def withdraw_view(self, request, incident_id: int):
        return self.act(
            request,
            incident_id,
            call=lambda incident: incident_resolve_withdraw(
                incident_id=incident.pk, withdrawn_by=request.user
            ),
            done=lambda incident, resolution: (
                _("You withdrew resolution request %(pk)s; incident %(incident)s stays open.")
                % {"pk": resolution.pk, "incident": incident.pk}
            ),
        )


class EvidenceInline(admin.TabularInline):
    model = EvidenceFile
    fields = ("open_link", "content_type", "size", "fingerprint", "uploaded_at")
    readonly_fields = fields
    extra = 0
    can_delete = False

    @admin.display(description="File")
    def open_link(self, obj: EvidenceFile):
        return format_html('<a href="{}">{}</a>', evidence_url(obj), obj.name)

    def has_view_permission(self, request, obj=None):
        # Whoever may see a decision sees its evidence (the download checks this too).
        return any(request.user.has_perm(p) for p in EVIDENCE_READERS)

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Decision)
class DecisionAdmin(ReadOnlyAdmin):
    subject_fields = ("operation__subject_type", "operation__subject_id")
    list_display = (
        "id",
        "operation",
        "kind",
        "state",
        "requested_by",
        "decided_by",
        "requested_at",
        "decided_at",
    )
    list_filter = ("kind", "state")
    inlines = [EvidenceInline]

    def get_urls(self):
        view = self.admin_site.admin_view(self.evidence_view)
        return [
            path("evidence/<int:evidence_id>/", view, name="recovery_decision_evidence"),
            *super().get_urls(),
        ]

    def evidence_visible(self, request, evidence_id: int) -> bool:
        """Whether the user may see the subject the evidence file is about (its decision's,
        or the one it is attached to); an unknown id is left to ``evidence_open``."""
        if subject_types.visible_to(request.user) is None:
            return True
        evidence = EvidenceFile.objects.filter(pk=evidence_id).first()
        if evidence is None:
            return True
        if evidence.decision_id is not None:
            return self.get_queryset(request).filter(pk=evidence.decision_id).exists()
        subject = Subject.parse(evidence.attached_to)
        chain = Checkpoint.objects.filter(subject_type=subject.type, subject_id=subject.id)
        return chain.filter(subjects_visible(request.user, "subject_type", "subject_id")).exists()

    def evidence_view(self, request, evidence_id: int):
        """Stream one evidence file, re-hashed first: a download, or with ``?inline=1`` shown
        in the browser when its content is a PNG, JPEG or PDF (sniffed from its bytes, and
        it must be the type recorded at upload); everything else is always a download.

        403 without a permission that shows decisions; a file that is missing or changed
        is not served: the refusal (and the integrity incident it opened) is shown instead.
        """
        if not any(request.user.has_perm(p) for p in EVIDENCE_READERS):
            raise PermissionDenied
        if not self.evidence_visible(request, evidence_id):
            raise Http404(f"No evidence file has id {evidence_id}.")
        try:
            read = evidence_open(evidence_id=evidence_id, user=request.user)
        except EvidenceCorrupt as exc:
            messages.error(request, str(exc))
            back = request.headers.get("referer", "")
            if not url_has_allowed_host_and_scheme(back, {request.get_host()}):
                back = reverse("admin:recovery_integrityincident_change", args=[exc.incident_id])
            return redirect(back)
        except RecoveryValidationError as exc:
            raise Http404(str(exc)) from None
        sniffed = inline_type(read.file.read(SIGNATURE_BYTES))
        read.file.seek(0)
        inline = request.GET.get("inline") == "1" and sniffed == read.evidence.content_type
        response = FileResponse(
            read.file,
            as_attachment=not inline,
            filename=read.evidence.name,
            content_type=sniffed if inline else read.evidence.content_type,
        )
        response["X-Content-Type-Options"] = "nosniff"
        response["Content-Security-Policy"] = "sandbox"
        response["Cache-Control"] = "private, no-store"
        # The fingerprint the bytes were just checked against, for the reader to compare.
        response["X-Evidence-BLAKE3"] = read.evidence.fingerprint
        return response
