"""The public provider API: the one module a provider app imports.

Example (in your app's ``apps.py``)::

    from django.apps import AppConfig

    class PermitsConfig(AppConfig):
        name = "permits"

        def ready(self):
            from govflow.engine import provider
            from . import actions
            provider.register(actions.register_application)
"""

from .registry import (
    ActionDefinition,
    RegistryError,
    RegistryFrozen,
    VerificationCheck,
    registry,
)
from .results import ActionContext, Failed, Pending, Result, Succeeded, Unknown

register = registry.register

__all__ = [
    "ActionContext",
    "ActionDefinition",
    "Failed",
    "Pending",
    "RegistryError",
    "RegistryFrozen",
    "Result",
    "Succeeded",
    "Unknown",
    "VerificationCheck",
    "register",
    "registry",
]
