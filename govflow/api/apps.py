"""App config of the REST API."""

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class ApiConfig(AppConfig):
    name = "govflow.api"
    label = "api"
    verbose_name = _("REST API")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The OpenAPI extension for API-key authentication registers itself on import.
        from . import rights, schema  # noqa: F401

        rights.connect()  # keys created and revoked go on the rights trail
