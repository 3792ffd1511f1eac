"""The desk's list of rights changes, and the second administrator's confirm and reject.

The list shows waiting grants first; a change's page says what it gives, who asked and
when, and offers *Confirm* and *Reject* (POST views of their own, each permission-checked
and gated on a second factor verified in this login).
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, redirect
from django.urls import path, reverse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from govflow.identity.models import RightsChange, RightsChangeState
from govflow.identity.policy import enrol_hint, is_verified

from .services import (
    RightsChangeError,
    confirm_permission,
    rights_change_confirm,
    rights_change_reject,
)

DECIDERS = ("auth.change_user", "auth.change_group")


def may_see_rights_changes(user) -> bool:
    """Administrators who change users or groups (and superusers) see and decide them."""
    return user.is_active and user.is_staff and any(user.has_perm(p) for p in DECIDERS)


def rights_changes_waiting(user) -> int:
    """How many grants wait for someone other than ``user`` to confirm (0 if not a decider)."""
    if not may_see_rights_changes(user):
        return 0
    return (
        RightsChange.objects.filter(state=RightsChangeState.PENDING)
        .exclude(requested_by=user)
        .exclude(user=user)
        .count()
    )


@admin.register(RightsChange)
class RightsChangeAdmin(admin.ModelAdmin):
    list_display = (
        "pk",
        "what",
        "state",
        "requested_by",
        "requested_at",
        "decided_by",
        "decided_at",
    )
    list_display_links = ("pk", "what")
    list_filter = ("state", "kind")
    list_select_related = (
        "user",
        "group",
        "permission__content_type",
        "requested_by",
        "decided_by",
    )
    readonly_fields = (
        "what",
        "kind",
        "state",
        "requested_by",
        "requested_at",
        "decided_by",
        "decided_at",
        "note",
    )
    fields = readonly_fields
    change_form_template = "admin/identity/rightschange/change_form.html"

    @admin.display(description=gettext_lazy("What it gives"))
    def what(self, obj: RightsChange) -> str:
        return obj.describe()

    def has_view_permission(self, request, obj=None) -> bool:
        return may_see_rights_changes(request.user)

    def has_module_permission(self, request) -> bool:
        return may_see_rights_changes(request.user)

    def has_add_permission(self, request) -> bool:
        return False  # requested from the user and group pages

    def has_change_permission(self, request, obj=None) -> bool:
        return False  # decided with Confirm / Reject only

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # a request and its decision stay, like the trail

    def get_urls(self):
        wrap = self.admin_site.admin_view
        return [
            path(
                "<int:change_id>/confirm/",
                wrap(self.confirm_view),
                name="identity_rightschange_confirm",
            ),
            path(
                "<int:change_id>/reject/",
                wrap(self.reject_view),
                name="identity_rightschange_reject",
            ),
            *super().get_urls(),
        ]

    def change_view(self, request, object_id, form_url="", extra_context=None):
        change = self.get_object(request, object_id)
        context = {
            "pending": change is not None and change.state == RightsChangeState.PENDING,
            "confirm_permission": confirm_permission(change) if change else "",
            **(extra_context or {}),
        }
        return super().change_view(request, object_id, form_url, context)

    def confirm_view(self, request, change_id: int):
        return self._decide(request, change_id, confirm=True)

    def reject_view(self, request, change_id: int):
        return self._decide(request, change_id, confirm=False)

    def _decide(self, request, change_id: int, *, confirm: bool):
        if not may_see_rights_changes(request.user):
            raise PermissionDenied
        change = get_object_or_404(RightsChange, pk=change_id)
        page = reverse("admin:identity_rightschange_change", args=[change.pk])
        if request.method != "POST":
            return redirect(page)  # a GET on a POST-only action goes back to the page
        if not is_verified(request.user):
            messages.error(request, enrol_hint())
            return redirect("admin:identity_enrol")
        try:
            if confirm:
                rights_change_confirm(change_id=change.pk, actor=request.user)
            else:
                note = request.POST.get("note", "").strip()[:2000]
                rights_change_reject(change_id=change.pk, actor=request.user, note=note)
        except RightsChangeError as exc:
            messages.error(request, str(exc))
            return redirect(page)
        done = _("confirmed and applied") if confirm else _("rejected")
        messages.success(
            request,
            _("Rights change #%(id)s (%(what)s) %(done)s; it is recorded on the rights trail.")
            % {"id": change.pk, "what": change.describe(), "done": done},
        )
        return redirect("admin:identity_rightschange_changelist")
