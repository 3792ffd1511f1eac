from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class DataflowConfig(AppConfig):
    """The Dataflow demo module: registers its run provider in ``ready()``."""

    name = "govflow.demo.dataflow"
    label = "dataflow"
    verbose_name = _("Dataflow (demo module)")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from govflow.engine import provider

        from .provider import PUBLICATION

        provider.register_run_provider(PUBLICATION)
