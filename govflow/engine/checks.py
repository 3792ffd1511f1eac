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


@checks.register()
def check_definitions_pinned(app_configs, **kwargs):
    from django.db import DatabaseError

    from .services.definitions import definitions_drifted

    try:
        drifted = definitions_drifted()
    except DatabaseError:
        return []  # not migrated yet: nothing is published
    return [
        checks.Warning(
            f"Published definition {key} v{version} no longer matches what it pinned: {problem}",
            hint="Its running instances are blocked with this reason. A provider changed "
            "an action: publish the document as a new version for new instances, and "
            "migrate or cancel the running ones on their admin page. A stored definition "
            "that no longer matches its fingerprint: restore it from the published file.",
            id="engine.W002",
        )
        for key, version, problem in drifted
    ]
