"""Rate limits per API key (and per signed-in user; per address for anonymous calls).

Rates come from settings read on every request (``GOVFLOW_API_RATE``,
``GOVFLOW_API_ANON_RATE``, e.g. ``"1200/min"``), so a changed setting applies without a
restart of the throttle classes. Counts live in Django's default cache: with the default
local-memory cache each web process counts on its own (docs/integrations.md).
"""

from __future__ import annotations

from django.conf import settings
from rest_framework.throttling import SimpleRateThrottle

from .auth import principal_of


class _SettingsRate(SimpleRateThrottle):
    setting = ""
    default = ""

    def get_rate(self) -> str | None:
        rate = getattr(settings, self.setting, self.default)
        return rate or None  # empty: no limit


class KeyRateThrottle(_SettingsRate):
    """One bucket per API key or signed-in user."""

    scope = "api"
    setting = "GOVFLOW_API_RATE"
    default = "1200/min"

    def get_cache_key(self, request, view) -> str | None:
        principal = principal_of(request)
        if principal is None:
            return None
        return f"govflow-api-throttle:{principal.throttle_ident}"


class AnonRateThrottle(_SettingsRate):
    """Anonymous calls (the schema, its viewers, the problem catalogue), per address."""

    scope = "anon"
    setting = "GOVFLOW_API_ANON_RATE"
    default = "120/min"

    def get_cache_key(self, request, view) -> str | None:
        if principal_of(request) is not None:
            return None
        return f"govflow-api-throttle:anon:{self.get_ident(request)}"
