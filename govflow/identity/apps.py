from django.apps import AppConfig


class IdentityConfig(AppConfig):
    name = "govflow.identity"
    label = "identity"
    verbose_name = "Identity and access"

    def ready(self) -> None:
        from . import signals  # noqa: F401  (records lock-outs in the security log)
