"""The operators' admin site."""

from django.contrib import admin


class GovFlowAdminSite(admin.AdminSite):
    site_header = "GovFlow administration"
    site_title = "GovFlow"
    index_title = "Workflows, ledger and recovery"
