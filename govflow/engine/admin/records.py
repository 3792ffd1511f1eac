"""Read-only lists of the engine's working records: tokens, timers, deliveries, incidents.

They change only through the engine's services; operators act on them from the
instance's page.
"""

from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from ..models import Incident, Timer, Token, TriggerDelivery
from ..tenancy import scope
from .base import ReadOnlyAdmin


def _instance_link(instance_id: int):
    url = reverse("admin:engine_instance_change", args=[instance_id])
    return format_html('<a href="{}">Instance {}</a>', url, instance_id)


class InstanceLinked(ReadOnlyAdmin):
    def get_queryset(self, request):
        """Only rows of the user's tenants' instances (ADR 0018)."""
        return scope(super().get_queryset(request), request.user, "instance__tenant")

    @admin.display(description="Instance", ordering="instance_id")
    def instance_link(self, obj):
        return _instance_link(obj.instance_id)


@admin.register(Token)
class TokenAdmin(InstanceLinked):
    list_display = (
        "instance_link",
        "node_id",
        "ordinal",
        "state",
        "attempt",
        "poll",
        "wait_kind",
        "wait_key",
        "not_before",
        "updated_at",
    )
    list_filter = ("state", "wait_kind")
    search_fields = ("node_id", "wait_key", "operation_key", "=instance__id")
    ordering = ("-updated_at", "-pk")


@admin.register(Timer)
class TimerAdmin(InstanceLinked):
    list_display = ("instance_link", "token", "due_at", "state", "fired_at")
    list_filter = ("state",)
    search_fields = ("=instance__id",)
    ordering = ("due_at", "pk")
    list_select_related = ("token",)


@admin.register(TriggerDelivery)
class TriggerDeliveryAdmin(ReadOnlyAdmin):
    list_display = (
        "delivery_id",
        "message",
        "correlation",
        "state",
        "instance_link",
        "received_at",
        "consumed_at",
    )
    list_filter = ("state", "message")
    search_fields = ("delivery_id", "message", "correlation")
    ordering = ("-received_at", "-pk")
    list_select_related = ("token",)

    def get_queryset(self, request):
        """Only the user's tenants' deliveries (one made for any tenant: administrators')."""
        return scope(super().get_queryset(request), request.user)

    @admin.display(description="Consumed by")
    def instance_link(self, obj: TriggerDelivery):
        return _instance_link(obj.token.instance_id) if obj.token_id else "—"


class ResolvedFilter(admin.SimpleListFilter):
    title = "resolved"
    parameter_name = "resolved"

    def lookups(self, request, model_admin):
        return [("no", "Open"), ("yes", "Resolved")]

    def queryset(self, request, queryset):
        if self.value() in ("yes", "no"):
            return queryset.filter(resolved_at__isnull=self.value() == "no")
        return queryset


@admin.register(Incident)
class IncidentAdmin(InstanceLinked):
    list_display = ("instance_link", "kind", "message", "created_at", "resolved_at")
    list_filter = (ResolvedFilter, "kind")
    search_fields = ("kind", "message", "=instance__id")
    ordering = ("-created_at", "-pk")
