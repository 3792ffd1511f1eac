"""Dataflow's runs in the admin, with its own two hands: publish a held run, reconcile."""

from __future__ import annotations

from django.contrib import admin, messages
from django.utils.translation import gettext_lazy as _

from . import services
from .models import DataflowRun, FaultSwitch


@admin.register(DataflowRun)
class DataflowRunAdmin(admin.ModelAdmin):
    list_display = ("reference", "dataset", "rows", "state", "reason_code", "updated_at")
    list_filter = ("state",)
    readonly_fields = [f.name for f in DataflowRun._meta.fields]
    actions = ("publish", "reconcile")

    def has_add_permission(self, request) -> bool:
        return False

    @admin.action(description=_("Publish the selected held runs"))
    def publish(self, request, queryset) -> None:
        for run in queryset:
            services.run_publish(run_id=run.pk)
        messages.success(request, _("Publication tried; see each run's state."))

    @admin.action(description=_("Reconcile the selected runs (look the catalogue up)"))
    def reconcile(self, request, queryset) -> None:
        for run in queryset:
            services.run_reconcile(run_id=run.pk)
        messages.success(request, _("Reconciled; see each run's state."))


@admin.register(FaultSwitch)
class FaultSwitchAdmin(admin.ModelAdmin):
    list_display = ("mode",)
