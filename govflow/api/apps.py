"""App config of the REST API."""

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class ApiConfig(AppConfig):
    name = "govflow.api"
    label = "api"
    verbose_name = _("REST API")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Not the OpenAPI description (``schema``: drf-spectacular and what it loads): it
        # is imported with the API's views, which every schema generation loads through the
        # URLconf, and its API-key extension registers itself then. A process that serves
        # no API (a ``qcluster``) never loads it (ADR 0048).
        from . import rights

        rights.connect()  # keys created and revoked go on the rights trail
