"""System checks: the registry and the published definitions against it."""

from __future__ import annotations

from django.core import checks


@checks.register()
def check_definitions_resolve(app_configs, **kwargs):
    from django.db import DatabaseError

    from .services.definitions import definitions_unresolved

    try:
        broken = definitions_unresolved()
    except DatabaseError:
        return []  # not migrated yet: nothing is published
    return [
        checks.Warning(
            f"Published definition {key} v{version} no longer resolves: {problem}",
            hint="Reinstall the provider app that registers its actions. Its instances are "
            "blocked with this reason until then.",
            id="engine.W001",
        )
        for key, version, problem in broken
    ]
