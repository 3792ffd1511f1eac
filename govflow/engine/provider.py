"""The public provider API: the one module a provider app imports.

Example (in your app's ``apps.py``)::

    from django.apps import AppConfig

    class PermitsConfig(AppConfig):
        name = "permits"

        def ready(self):
            from govflow.engine import provider
            from . import actions
            provider.register(actions.register_application)

A provider's own tools (management commands, views) call the engine's services and read
through ``govflow.engine.selectors``; the errors those raise are exported here too, so
nothing else of the engine needs importing.
"""

from .errors import EngineConflict, EngineError, IntegrityStop, InvalidRequest
from .linked import RunDescriptor, RunProvider, run_providers
from .registry import (
    ActionDefinition,
    Compensate,
    RegistryError,
    RegistryFrozen,
    VerificationCheck,
    registry,
)
from .results import ActionContext, Failed, Pending, Result, Succeeded, Unknown

register = registry.register
register_run_provider = run_providers.register

__all__ = [
    "ActionContext",
    "ActionDefinition",
    "Compensate",
    "EngineConflict",
    "EngineError",
    "Failed",
    "IntegrityStop",
    "InvalidRequest",
    "Pending",
    "RegistryError",
    "RegistryFrozen",
    "Result",
    "RunDescriptor",
    "RunProvider",
    "Succeeded",
    "Unknown",
    "VerificationCheck",
    "register",
    "register_run_provider",
    "registry",
    "run_providers",
]
