from django.apps import AppConfig


class EngineConfig(AppConfig):
    name = "govflow.engine"
    label = "engine"
    verbose_name = "Workflow engine"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the system checks)
