"""System checks: the registry and the published definitions against it; which checks a
``qcluster`` runs at its start."""

from __future__ import annotations

from django.conf import settings
from django.core import checks
from django.core.checks.registry import registry as check_registry

GOVFLOW = "govflow"
"""The tag of GovFlow's own checks (the recovery core's are tagged ``recovery``): every
check is run by ``manage.py check``; a tagged one also by ``manage.py qcluster``."""

NOT_FOR_WORKERS = frozenset(
    {
        checks.Tags.admin,
        checks.Tags.urls,
        checks.Tags.templates,
        checks.Tags.staticfiles,
        checks.Tags.commands,
    }
)
"""Checks of what a ``qcluster`` never serves or runs: the admin, the URLconf, templates,
static files, and ``migrate``/``makemigrations``' autodetector. The URL checks alone load
the whole web side (the URLconf, every view, the admin's modules, drf-spectacular)."""


def qcluster_check_tags() -> list[str]:
    """The tags of the checks ``manage.py qcluster`` runs before it starts (ADR 0048):
    every tag registered but :data:`NOT_FOR_WORKERS`. Untagged checks are not among them
    (Django selects by tag), so every check of GovFlow's carries a tag
    (``tests/integration/test_worker_start.py``)."""
    return sorted(check_registry.tags_available() - NOT_FOR_WORKERS)


@checks.register(GOVFLOW)
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


@checks.register(GOVFLOW)
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


def _bad_value(setting, raw) -> str:
    """Why ``raw`` is no value for ``setting``, or ''."""
    if setting.type is int:
        ok = type(raw) is int and raw >= 1
    else:
        ok = isinstance(raw, (int, float)) and not isinstance(raw, bool) and 0 < raw < float("inf")
    if ok:
        return ""
    unit = {"bytes": "number of bytes", "seconds": "number of seconds"}.get(
        setting.unit, "whole number"
    )
    return f"{setting.name} is {raw!r}; it must be a positive {unit}."


def _timing_problems(conf) -> list[checks.CheckMessage]:
    found = []
    for longer, shorter in (
        (conf.LEASE_TTL, conf.SWEEP_TICK),
        (conf.SWEEP_LEASE_TTL, conf.SWEEP_TICK),
    ):
        if longer.value() <= shorter.value():
            found.append(
                checks.Error(
                    f"{longer.name} ({longer.value():g} s) is not longer than {shorter.name} "
                    f"({shorter.value():g} s): the lease would run out between two passes "
                    "of the sweep, so its holder loses its authority while it still works.",
                    hint=f"Raise {longer.name} well above {shorter.name} (the defaults are "
                    f"{longer.default} s and {shorter.default} s).",
                    id="engine.E004",
                )
            )
    timeout = (getattr(settings, "Q_CLUSTER", None) or {}).get("timeout")
    for setting in (conf.RUN_BUDGET, conf.SWEEP_DURATION):
        if isinstance(timeout, (int, float)) and setting.value() >= timeout:
            found.append(
                checks.Warning(
                    f"{setting.name} ({setting.value():g} s) is not below django-q2's "
                    f"timeout ({timeout} s): the task is killed before it ends.",
                    hint=f"Keep {setting.name} well below Q_CLUSTER['timeout'].",
                    id="engine.W004",
                )
            )
    return found


@checks.register(GOVFLOW)
def check_settings(app_configs, **kwargs):
    """Every GOVFLOW_* setting has a value of its type and range, and they fit together.

    engine.E001: an input limit is not a positive whole number of bytes; engine.E003: any
    other setting is not a positive number; engine.E004: a lease is not longer than the
    sweep's interval; engine.W003: the start form's variables limit is above Django's
    request body limit; engine.W004: a run or sweep task outlasts django-q2's timeout;
    engine.W005: several runs per worker process asked for on SQLite (ignored).
    """
    from . import conf

    found = []
    for setting in conf.SETTINGS:
        raw = getattr(settings, setting.name, None)
        problem = "" if raw is None else _bad_value(setting, raw)
        if problem:
            found.append(
                checks.Error(
                    problem,
                    hint="Fix the setting, or remove it for the default "
                    f"({setting.shown_default().replace('`', '')}).",
                    id="engine.E001" if setting.unit == "bytes" else "engine.E003",
                )
            )
    if found:
        return found
    found += _timing_problems(conf)
    found += _worker_runs_problems(conf)
    body = getattr(settings, "DATA_UPLOAD_MAX_MEMORY_SIZE", 2621440)
    if body is not None and conf.variables_max_bytes() > body:
        found.append(
            checks.Warning(
                f"GOVFLOW_VARIABLES_MAX_BYTES ({conf.variables_max_bytes()}) is larger than "
                f"DATA_UPLOAD_MAX_MEMORY_SIZE ({body}): Django refuses such a start form "
                "with a bare 400 before GovFlow can say why.",
                hint="Raise DATA_UPLOAD_MAX_MEMORY_SIZE above the variables limit.",
                id="engine.W003",
            )
        )
    return found


def _worker_runs_problems(conf) -> list[checks.CheckMessage]:
    from django.db import connection

    runs = getattr(settings, conf.WORKER_RUNS.name, None)  # the default is 1 on SQLite
    if runs is not None and runs > 1 and connection.vendor != "postgresql":
        return [
            checks.Warning(
                f"GOVFLOW_WORKER_RUNS is {runs}, but the database is {connection.vendor}: "
                "it has one writer at a time, so each worker process runs one instance at "
                "a time and the setting is ignored.",
                hint="Remove GOVFLOW_WORKER_RUNS, or run GovFlow on PostgreSQL to have "
                "several runs at once per worker process.",
                id="engine.W005",
            )
        ]
    return []


@checks.register(GOVFLOW)
def check_compensations(app_configs, **kwargs):
    """Every declared compensating action is registered, and non-atomic."""
    from .registry import compensation_problem, registry

    return [
        checks.Error(
            f"Action {action.name!r}: {compensation_problem(action, registry.get)}.",
            hint="Register the compensating action in its provider's AppConfig.ready(), or "
            "declare another (docs/compensation.md).",
            id="engine.E005",
        )
        for action in registry.all()
        if action.compensate is not None and compensation_problem(action, registry.get)
    ]


@checks.register(GOVFLOW)
def check_claim_broker(app_configs, **kwargs):
    """Instance runs reach the workers only through GovFlow's broker (ADR 0026)."""
    from django.utils.module_loading import import_string

    from .broker import ClaimBroker

    path = getattr(settings, "Q_CLUSTER", {}).get("broker_class", "")
    try:
        broker = import_string(path) if path else None
    except ImportError:
        broker = None
    if isinstance(broker, type) and issubclass(broker, ClaimBroker):
        return []
    return [
        checks.Error(
            f"Q_CLUSTER['broker_class'] is {path or 'not set'!r}: no worker would claim the "
            "instances marked runnable, so no workflow would ever move on.",
            hint="Set Q_CLUSTER['broker_class'] = 'govflow.engine.broker.ClaimBroker' (or a "
            "subclass of it) in the settings the qcluster runs with.",
            id="engine.E006",
        )
    ]
