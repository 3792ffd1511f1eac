from django.apps import AppConfig


class BetaConfig(AppConfig):
    name = "tests.providers.beta"
    label = "beta"

    def ready(self) -> None:
        from govflow.engine import provider
        from govflow.engine.provider import ActionDefinition, Succeeded, VerificationCheck

        provider.register(
            ActionDefinition(
                name="beta.stamp",
                recovery_mode="non_atomic",
                title="Stamp a document",
                input_schema={"type": "object"},
                preview=lambda data: {"stamp": True},
                execute=lambda context: Succeeded({"stamped": True}),
                checks=(VerificationCheck("ledger", "Check the stamp ledger."),),
            )
        )
