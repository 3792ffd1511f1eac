"""App configs of the GovFlow project package."""

from django.contrib.admin.apps import SimpleAdminConfig


class GovFlowAdminConfig(SimpleAdminConfig):
    """Make GovFlow's admin site the default ``admin.site`` so every app registers on it.

    Simple: no ``autodiscover`` in ``ready()``. The site discovers the apps' ``admin``
    modules at the first use of its registry (``admin_site.LazilyDiscoveredSite``, ADR
    0048), so a process that never uses the admin (a ``qcluster``) never imports them.
    """

    default_site = "govflow.admin_site.GovFlowAdminSite"
