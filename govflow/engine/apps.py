from django.apps import AppConfig
from django.db.models.signals import post_migrate
from django.utils.translation import gettext_lazy as _


class EngineConfig(AppConfig):
    name = "govflow.engine"
    label = "engine"
    verbose_name = _("Workflow engine")

    def ready(self) -> None:
        from recovery.api import projection_register

        from . import checks  # noqa: F401  (registers the system checks)
        from .projection import SUBJECT_TYPE, stored_projection
        from .signals import ensure_sweep_schedule

        projection_register(SUBJECT_TYPE, stored_projection)

        post_migrate.connect(ensure_sweep_schedule, sender=self)
