"""Read-only admin for the demo's case-file notes (the workflow writes them, not people)."""

from django.contrib import admin

from .models import DecisionNote


@admin.register(DecisionNote)
class DecisionNoteAdmin(admin.ModelAdmin):
    list_display = ["recorded_at", "subject", "kind", "instance_id", "step_id"]
    list_filter = ["kind"]
    search_fields = ["subject", "text"]
    readonly_fields = [f.name for f in DecisionNote._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
