from django.apps import AppConfig
from django.db.models.signals import post_migrate


class EngineConfig(AppConfig):
    name = "govflow.engine"
    label = "engine"
    verbose_name = "Workflow engine"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the system checks)
        from .signals import ensure_sweep_schedule

        post_migrate.connect(ensure_sweep_schedule, sender=self)
