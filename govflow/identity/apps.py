from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class IdentityConfig(AppConfig):
    name = "govflow.identity"
    label = "identity"
    verbose_name = _("Identity and access")

    def ready(self) -> None:
        from . import signals  # noqa: F401  (records lock-outs in the security log)
