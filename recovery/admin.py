"""Read-only admin pages for the ledger. Nobody edits facts or evidence by hand."""

from __future__ import annotations

from django.contrib import admin

from .models import Checkpoint, Decision, EvidenceFile, IntegrityIncident, Lease, Operation


class ReadOnlyAdmin(admin.ModelAdmin):
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
    list_display = ("key", "holder", "fence", "acquired_at", "expires_at", "released_at")
    search_fields = ("key", "holder")


@admin.register(IntegrityIncident)
class IntegrityIncidentAdmin(ReadOnlyAdmin):
    list_display = (
        "subject_type",
        "subject_id",
        "position",
        "status",
        "detected_at",
        "resolved_at",
    )
    list_filter = ("status",)
    search_fields = ("subject_id", "reason")


class EvidenceInline(admin.TabularInline):
    model = EvidenceFile
    fields = ("name", "content_type", "size", "fingerprint", "uploaded_at")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Decision)
class DecisionAdmin(ReadOnlyAdmin):
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
