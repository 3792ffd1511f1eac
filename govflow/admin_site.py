"""The operators' admin site."""

from django.contrib import admin
from django.urls import path


class GovFlowAdminSite(admin.AdminSite):
    site_header = "GovFlow administration"
    site_title = "GovFlow"
    index_title = "Workflows, ledger and recovery"
    # Password, then the code of a second factor for users who have one (docs/security.md).
    login_template = "identity/login.html"

    @property
    def login_form(self):
        from govflow.identity.forms import LoginForm

        return LoginForm

    def get_urls(self):
        from govflow.identity import views

        return [
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
