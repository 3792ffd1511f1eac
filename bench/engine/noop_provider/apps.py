from django.apps import AppConfig


class NoopProviderConfig(AppConfig):
    name = "bench.engine.noop_provider"
    label = "bench_noop"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from govflow.engine import provider

        from .actions import EFFECT, NOOP

        provider.register(NOOP)
        provider.register(EFFECT)
