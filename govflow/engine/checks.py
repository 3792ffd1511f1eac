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


@checks.register()
def check_input_limits(app_configs, **kwargs):
    """The engine's input limits are positive integers; the start form fits in a request."""
    from django.conf import settings

    from .limits import variables_max_bytes

    found = []
    for name in (
        "GOVFLOW_DEFINITION_MAX_BYTES",
        "GOVFLOW_VARIABLES_MAX_BYTES",
        "GOVFLOW_PAYLOAD_MAX_BYTES",
    ):
        raw = getattr(settings, name, None)
        if raw is not None and (type(raw) is not int or raw < 1):
            found.append(
                checks.Error(
                    f"{name} is {raw!r}; it must be a positive number of bytes.",
                    hint="Fix the setting, or remove it for the default.",
                    id="engine.E001",
                )
            )
    if not found:
        body = getattr(settings, "DATA_UPLOAD_MAX_MEMORY_SIZE", 2621440)
        if body is not None and variables_max_bytes() > body:
            found.append(
                checks.Warning(
                    f"GOVFLOW_VARIABLES_MAX_BYTES ({variables_max_bytes()}) is larger than "
                    f"DATA_UPLOAD_MAX_MEMORY_SIZE ({body}): Django refuses such a start form "
                    "with a bare 400 before GovFlow can say why.",
                    hint="Raise DATA_UPLOAD_MAX_MEMORY_SIZE above the variables limit.",
                    id="engine.W003",
                )
            )
    return found
