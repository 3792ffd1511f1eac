"""The operators' admin site: its home is the work queue, the raw tables are "Records"."""

from django.contrib import admin
from django.urls import path
from django.utils.translation import gettext_lazy as _


class GovFlowAdminSite(admin.AdminSite):
    site_header = _("GovFlow administration")
    site_title = _("GovFlow")
    index_title = _("Workflows, ledger and recovery")
    # Password, then the code of a second factor for users who have one (docs/security.md).
    login_template = "identity/login.html"

    @property
    def login_form(self):
        from govflow.identity.forms import LoginForm

        return LoginForm

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
        from govflow.identity import views

        return [
            path("records/", self.admin_view(self.records), name="records"),
            path(
                "security/second-factor/",
                self.admin_view(lambda request: views.enrol_view(self, request)),
                name="identity_enrol",
            ),
            path(
                "security/recovery-codes/",
                self.admin_view(lambda request: views.recovery_codes_view(self, request)),
                name="identity_recovery_codes",
            ),
            *super().get_urls(),
        ]
