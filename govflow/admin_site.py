"""The operators' admin site: its home is the work queue, the raw tables are "Records".

The site finds the apps' ``admin`` modules when its registry is first used, not at
``django.setup()`` (ADR 0048): a ``qcluster`` never serves the admin, and importing every
app's admin (forms, desk views, their templates' helpers) cost each cluster start about
0.17 s of CPU before its first step. Whatever uses the registry — the URLconf
(``admin.site.urls``), ``reverse('admin:…')``, the admin's system checks,
``is_registered`` — sees it complete, as with Django's ``AdminConfig``.
"""

import threading

from django.contrib import admin
from django.urls import path
from django.utils.module_loading import autodiscover_modules
from django.utils.translation import gettext_lazy as _


class LazilyDiscoveredSite(admin.AdminSite):
    """An admin site that imports every installed app's ``admin`` module (Django's
    ``autodiscover``) at the first use of its registry, once per process."""

    def __init__(self, name: str = "admin") -> None:
        self._discovery = threading.Lock()
        self._discovered = False
        self._discoverer: int | None = None  # the thread discovering, while it does
        super().__init__(name)

    @property
    def _registry(self) -> dict:
        # The discovering thread's own registrations (and autodiscover's rollback) use the
        # registry as it is; every other use waits until it is complete.
        if not self._discovered and self._discoverer != threading.get_ident():
            self._discover()
        return self._models

    @_registry.setter
    def _registry(self, value: dict) -> None:
        self._models = value

    def _discover(self) -> None:
        with self._discovery:
            if self._discovered:
                return
            self._discoverer = threading.get_ident()
            try:
                autodiscover_modules("admin", register_to=self)
                # A module that failed to import is tried again at the next use, as
                # Django's autodiscover leaves it to the next request.
                self._discovered = True
            finally:
                self._discoverer = None


class GovFlowAdminSite(LazilyDiscoveredSite):
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
