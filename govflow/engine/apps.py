from django.apps import AppConfig
from django.db.models.signals import post_migrate
from django.utils.translation import gettext_lazy as _


class EngineConfig(AppConfig):
    name = "govflow.engine"
    label = "engine"
    verbose_name = _("Workflow engine")

    def ready(self) -> None:
        from recovery.api import incident_listen, projection_register

        from . import checks  # noqa: F401  (registers the system checks)
        from .emit import integrity_incident_opened
        from .projection import SUBJECT_TYPE, stored_projection
        from .signals import ensure_sweep_schedule

        projection_register(SUBJECT_TYPE, stored_projection)
        # An incident the core opens on an instance is announced in that commit (ADR 0032).
        incident_listen(integrity_incident_opened)

        post_migrate.connect(ensure_sweep_schedule, sender=self)
