from django.apps import AppConfig


class AlphaConfig(AppConfig):
    name = "tests.providers.alpha"
    label = "alpha"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from govflow.engine import provider

        from .actions import ALL
        from .effects import pause_after_dataflow_start, pause_after_demo_registration

        for action in ALL:
            provider.register(action)
        pause_after_demo_registration()
        pause_after_dataflow_start()
