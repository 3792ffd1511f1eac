"""The operators' admin site: its home is the work queue, the raw tables are "Records"."""

from django.contrib import admin
from django.urls import path
from django.utils.translation import gettext_lazy as _


class GovFlowAdminSite(admin.AdminSite):
    site_header = _("GovFlow administration")
    site_title = _("GovFlow")
    index_title = _("Workflows, ledger and recovery")

    def index(self, request, extra_context=None):
        """The work queue (govflow.handoffs), not the stock list of tables."""
        from govflow.handoffs.admin.home import queue_view

        return queue_view(self, request, extra_context)

    def records(self, request, extra_context=None):
        """The stock index: every model table, for auditors and administrators."""
        from govflow.handoffs.admin.home import records_allowed

        records_allowed(request)
        context = {"title": _("Records"), **(extra_context or {})}
        return super().index(request, context)

    def get_urls(self):
        return [
            path("records/", self.admin_view(self.records), name="records"),
            *super().get_urls(),
        ]
