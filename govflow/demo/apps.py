from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class DemoConfig(AppConfig):
    """The demo provider module: a building-permit procedure on a demo municipal registry.

    Its actions are registered here, in ``ready()``, the one place a provider registers
    them; its workflows ship in ``workflows/*.json`` (``manage.py load_workflows``).
    """

    name = "govflow.demo"
    label = "govflow_demo"
    verbose_name = _("Demo module")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from govflow.engine import provider

        from .actions import ALL

        for action in ALL:
            provider.register(action)
