"""Webhooks on the desk: subscriptions (secret shown once) and their deliveries.

Registered by the handoffs app, which knows the desk's tenants (ADR 0018): a user sees
and changes only the subscriptions of their tenants. State changes have their own POST
views and admin actions, each calling one service of ``govflow.events.services``; a GET
on a POST-only URL redirects back (never a bare 405).
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from govflow.engine.admin.base import ReadOnlyAdmin
from govflow.engine.tenancy import scope, tenant_choices
from govflow.events.models import Delivery, Event, EventType, Subscription
from govflow.events.services import (
    REDELIVER,
    DeliveryConflict,
    SubscriptionRefused,
    delivery_redeliver,
    subscription_create,
    subscription_rotate_secret,
    subscription_set_active,
)


class SubscriptionForm(forms.Form):
    name = forms.CharField(label=gettext_lazy("Name"), max_length=100)
    url = forms.CharField(
        label=gettext_lazy("URL"),
        max_length=2000,
        help_text=gettext_lazy("Where events are POSTed: https://, a host with a public address."),
    )
    tenant = forms.ChoiceField(label=gettext_lazy("Tenant"))
    event_types = forms.MultipleChoiceField(
        label=gettext_lazy("Event types"),
        choices=EventType.choices,
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text=gettext_lazy("None ticked: every type."),
    )

    def __init__(self, data=None, *, user) -> None:
        super().__init__(data)
        self.fields["tenant"].choices = [(t, t) for t in tenant_choices(user)]


def _secret_page(modeladmin, request, made, title: str) -> TemplateResponse:
    context = {
        **modeladmin.admin_site.each_context(request),
        "opts": Subscription._meta,
        "title": title,
        "subscription": made.subscription,
        "secret": made.secret,
    }
    response = TemplateResponse(request, "admin/events/subscription/secret.html", context)
    response["Cache-Control"] = "no-store"
    return response


@admin.register(Subscription)
class SubscriptionAdmin(ReadOnlyAdmin):
    list_display = ("name", "tenant", "url", "types", "active", "created_at")
    list_filter = ("active", "tenant")
    search_fields = ("name", "url", "tenant")
    readonly_fields = ("name", "url", "tenant", "event_types", "active", "created_at")
    exclude = ("created_by",)
    actions = ["pause", "resume"]
    change_form_template = "admin/events/subscription/change_form.html"

    def get_queryset(self, request):
        return scope(super().get_queryset(request), request.user)

    def has_add_permission(self, request, obj=None) -> bool:
        # Registered through the service (add_view); changed by the actions and POST
        # views below; never deleted (pause instead: its deliveries stay attributable).
        return request.user.has_perm("events.add_subscription")

    @admin.display(description=gettext_lazy("Event types"))
    def types(self, obj: Subscription) -> str:
        return ", ".join(obj.event_types) or _("every type")

    def get_urls(self):
        wrap = self.admin_site.admin_view
        return [
            path(
                "<int:pk>/rotate-secret/",
                wrap(self.rotate_view),
                name="events_subscription_rotate",
            ),
            *super().get_urls(),
        ]

    def add_view(self, request, form_url="", extra_context=None):
        """Register a webhook; the answer shows its secret once (never stored)."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        form = SubscriptionForm(
            request.POST if request.method == "POST" else None, user=request.user
        )
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            try:
                made = subscription_create(
                    name=data["name"],
                    url=data["url"],
                    tenant=data["tenant"],
                    event_types=data["event_types"],
                    actor=request.user,
                )
            except SubscriptionRefused as exc:
                form.add_error(exc.field if exc.field in form.fields else None, str(exc))
            else:
                title = _("Webhook '%(name)s' registered") % {"name": made.subscription.name}
                return _secret_page(self, request, made, title)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": _("Register a webhook"),
            "form": form,
        }
        return TemplateResponse(request, "admin/events/subscription/add.html", context)

    def rotate_view(self, request, pk: int):
        """POST: a new secret, shown once. GET: back to the subscription's page."""
        subscription = self.get_queryset(request).filter(pk=pk).first()
        if subscription is None:
            raise Http404(_("No webhook subscription has id %(id)s.") % {"id": pk})
        back = reverse("admin:events_subscription_change", args=[pk])
        if request.method != "POST":
            return redirect(back)
        if not request.user.has_perm("events.change_subscription"):
            raise PermissionDenied
        made = subscription_rotate_secret(subscription_id=pk, actor=request.user)
        title = _("New secret for webhook '%(name)s'") % {"name": subscription.name}
        return _secret_page(self, request, made, title)

    def _set_active(self, request, queryset, active: bool) -> int:
        if not request.user.has_perm("events.change_subscription"):
            raise PermissionDenied
        for pk in queryset.values_list("pk", flat=True):
            subscription_set_active(subscription_id=pk, active=active, actor=request.user)
        return queryset.count()

    @admin.action(description=gettext_lazy("Pause the selected webhooks"))
    def pause(self, request, queryset) -> None:
        count = self._set_active(request, queryset, False)
        self.message_user(request, _("%(n)s webhook(s) paused.") % {"n": count}, messages.SUCCESS)

    @admin.action(description=gettext_lazy("Resume the selected webhooks"))
    def resume(self, request, queryset) -> None:
        count = self._set_active(request, queryset, True)
        self.message_user(request, _("%(n)s webhook(s) resumed.") % {"n": count}, messages.SUCCESS)


@admin.register(Delivery)
class DeliveryAdmin(ReadOnlyAdmin):
    list_display = ("event", "subscription", "state", "attempts", "last_outcome", "updated_at")
    list_filter = ("state",)
    list_select_related = ("event", "subscription")
    readonly_fields = (
        "subscription",
        "event",
        "event_id",
        "instance_id",
        "seq",
        "state",
        "attempts",
        "last_outcome",
        "next_attempt_at",
        "created_at",
        "delivered_at",
        "dead_at",
        "redelivered_by",
    )
    fields = readonly_fields
    change_form_template = "admin/events/delivery/change_form.html"

    def get_queryset(self, request):
        return scope(super().get_queryset(request), request.user, "subscription__tenant")

    @admin.display(description=gettext_lazy("event id"))
    def event_id(self, obj: Delivery) -> str:
        return str(obj.event.event_id)

    def get_urls(self):
        wrap = self.admin_site.admin_view
        return [
            path(
                "<int:pk>/redeliver/",
                wrap(self.redeliver_view),
                name="events_delivery_redeliver",
            ),
            *super().get_urls(),
        ]

    def change_view(self, request, object_id, form_url="", extra_context=None):
        extra = {**(extra_context or {}), "may_redeliver": request.user.has_perm(REDELIVER)}
        return super().change_view(request, object_id, form_url, extra)

    def redeliver_view(self, request, pk: int):
        """POST: deliver a dead letter again (same event id). GET: back to its page."""
        delivery = self.get_queryset(request).filter(pk=pk).first()
        if delivery is None:
            raise Http404(_("No webhook delivery has id %(id)s.") % {"id": pk})
        back = reverse("admin:events_delivery_change", args=[pk])
        if request.method != "POST":
            return redirect(back)
        if not request.user.has_perm(REDELIVER):
            raise PermissionDenied
        try:
            delivery_redeliver(delivery_id=pk, actor=request.user)
        except DeliveryConflict:
            messages.error(
                request,
                _(
                    "This delivery is not a dead letter (any more): it was delivered again "
                    "already, or it never failed for good. Nothing was changed."
                ),
            )
        else:
            messages.success(
                request,
                _(
                    "The event will be delivered again shortly, with the same event id; the "
                    "instance's later events for this webhook follow it in order."
                ),
            )
        return redirect(back)


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    """The outbox's events, as written (the *Records*: auditors and administrators)."""

    list_display = ("event_id", "type", "tenant", "instance_id", "seq", "created_at")
    list_filter = ("type",)
    search_fields = ("event_id", "instance_id")
    fields = ("event_id", "type", "tenant", "instance_id", "seq", "data", "created_at")
    readonly_fields = fields

    def get_queryset(self, request):
        return scope(super().get_queryset(request), request.user)
