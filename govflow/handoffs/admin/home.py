"""The admin's home page as a work queue, and the "Records" page (the stock app list).

Used by :class:`govflow.admin_site.GovFlowAdminSite`: ``index`` renders the queue of
:mod:`govflow.handoffs.queue`; ``records`` the stock index (the raw tables) for auditors
and administrators (ADR 0018).
"""

from __future__ import annotations

import datetime as dt

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.template.response import TemplateResponse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from govflow.engine.selectors import definitions_published
from govflow.engine.tenancy import instances_of, sees_records, tenants_of
from govflow.identity.rights.admin_changes import rights_changes_waiting

from ..queue import Filters, Queue

AGES = {
    "1h": dt.timedelta(hours=1),
    "1d": dt.timedelta(days=1),
    "7d": dt.timedelta(days=7),
    "30d": dt.timedelta(days=30),
}


class QueueFilterForm(forms.Form):
    """The queue's filters (GET); a value that does not fit is reported, never a 500."""

    tenant = forms.ChoiceField(label=gettext_lazy("Tenant"), required=False)
    definition = forms.ChoiceField(label=gettext_lazy("Workflow"), required=False)
    action = forms.RegexField(
        label=gettext_lazy("Action"),
        regex=r"^[\w.:-]{1,200}$",
        required=False,
        error_messages={"invalid": gettext_lazy("An action is a name like demo.send_notice.")},
    )
    age = forms.ChoiceField(
        label=gettext_lazy("Older than"),
        required=False,
        choices=[
            ("", gettext_lazy("any age")),
            ("1h", gettext_lazy("1 hour")),
            ("1d", gettext_lazy("1 day")),
            ("7d", gettext_lazy("7 days")),
            ("30d", gettext_lazy("30 days")),
        ],
    )

    def __init__(self, data, *, user) -> None:
        super().__init__(data)
        tenants = tenants_of(user)
        if tenants is None:
            tenants = instances_of(user).order_by().values_list("tenant", flat=True).distinct()
        everyone = [("", _("all my tenants"))]
        self.fields["tenant"].choices = everyone + [(t, t) for t in sorted(set(tenants))]
        keys = sorted(set(definitions_published().values_list("key", flat=True)))
        self.fields["definition"].choices = [("", _("all workflows"))] + [(k, k) for k in keys]

    def filters(self) -> Filters:
        if not self.is_valid():
            return Filters()
        data = self.cleaned_data
        return Filters(
            tenant=data["tenant"],
            definition=data["definition"],
            action=data["action"],
            older_than=AGES.get(data["age"]),
        )


def queue_view(site, request, extra_context=None):
    """The home page: the user's work queue, filtered by the GET parameters."""
    form = QueueFilterForm(request.GET or None, user=request.user)
    if form.is_bound and not form.is_valid():
        problems = "; ".join(
            f"{form.fields[name].label}: {' '.join(errors)}" for name, errors in form.errors.items()
        )
        messages.error(
            request,
            _("These filters could not be used and are ignored: %(problems)s")
            % {"problems": problems},
        )
    has_role = request.user.is_superuser or request.user.has_perm("engine.view_instance")
    sections = Queue(request.user, form.filters()).sections() if has_role else []
    context = {
        **site.each_context(request),
        "title": _("Work queue"),
        "subtitle": None,
        "form": form,
        "sections": sections,
        "has_role": has_role,
        "tenants": tenants_of(request.user),
        "sees_records": sees_records(request.user),
        "rights_waiting": rights_changes_waiting(request.user),
        **(extra_context or {}),
    }
    request.current_app = site.name
    return TemplateResponse(request, "admin/govflow/queue.html", context)


def records_allowed(request) -> None:
    """403 unless the user is an auditor or administrator (or a superuser)."""
    if not sees_records(request.user):
        raise PermissionDenied
