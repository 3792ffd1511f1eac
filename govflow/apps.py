"""App configs of the GovFlow project package."""

from django.contrib.admin.apps import AdminConfig


class GovFlowAdminConfig(AdminConfig):
    """Make GovFlow's admin site the default ``admin.site`` so every app registers on it."""

    default_site = "govflow.admin_site.GovFlowAdminSite"
