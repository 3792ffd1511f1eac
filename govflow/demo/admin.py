"""Read-only admin for the demo's case-file notes (the workflow writes them, not people)."""

from django.contrib import admin
from django.http import Http404

from govflow.engine.tenancy import instances_of

from .models import DecisionNote


@admin.register(DecisionNote)
class DecisionNoteAdmin(admin.ModelAdmin):
    list_display = ["recorded_at", "subject", "kind", "instance_id", "step_id"]
    list_filter = ["kind"]
    search_fields = ["subject", "text"]
    readonly_fields = [f.name for f in DecisionNote._meta.fields]

    def get_queryset(self, request):
        """Only the notes of the user's tenants' instances (ADR 0018)."""
        mine = instances_of(request.user).values("pk")
        return super().get_queryset(request).filter(instance_id__in=mine)

    def _get_obj_does_not_exist_redirect(self, request, opts, object_id):
        raise Http404(f"No decision note has id {object_id}.")

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
