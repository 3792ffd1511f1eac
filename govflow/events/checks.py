"""System checks of the outbox's settings (``manage.py check``)."""

from __future__ import annotations

from django.core.checks import Error, register

from .conf import LEASE_TTL, MAX_ATTEMPTS, TIMEOUT
from .signing import keys_problem


@register("govflow")  # govflow.engine.checks.GOVFLOW: a qcluster runs it too
def check_outbox_settings(app_configs=None, **kwargs) -> list[Error]:
    errors = []
    problem = keys_problem()
    if problem:
        errors.append(Error(problem, id="govflow.events.E001"))
    if TIMEOUT.value() * 1.5 >= LEASE_TTL.value():
        errors.append(
            Error(
                f"GOVFLOW_WEBHOOK_TIMEOUT ({TIMEOUT.value():g} s) must be well under "
                f"GOVFLOW_PUBLISHER_LEASE_TTL ({LEASE_TTL.value():g} s): an attempt that "
                "outlasts the lease lets a second publisher send the same event meanwhile.",
                hint="Lower the timeout or raise the lease.",
                id="govflow.events.E002",
            )
        )
    if MAX_ATTEMPTS.value() < 1:
        errors.append(
            Error("GOVFLOW_WEBHOOK_MAX_ATTEMPTS must be at least 1.", id="govflow.events.E003")
        )
    return errors
