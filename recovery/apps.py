from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class RecoveryConfig(AppConfig):
    name = "recovery"
    verbose_name = _("Recovery ledger")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the system checks)
