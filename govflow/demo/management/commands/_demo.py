"""Shared bits of the demo commands (not a command: the name starts with '_')."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError
from django.urls import NoReverseMatch, reverse

from govflow.engine import selectors


def base_url() -> str:
    host = os.environ.get("GOVFLOW_HOST", "127.0.0.1")
    port = os.environ.get("GOVFLOW_PORT", "8000")
    return f"http://{host}:{port}"


def manage_py() -> str:
    """How to call manage.py again, as the user just did (for the hints we print)."""
    python = Path(sys.executable)
    try:
        shown = str(python.relative_to(Path.cwd()))
    except ValueError:
        shown = "python"
    return f"{shown} manage.py"


def admin_url(instance_id: int) -> str:
    try:
        path = reverse("admin:engine_instance_change", args=[instance_id])
    except NoReverseMatch:  # the engine's admin is not installed: the stable admin path
        path = f"/admin/engine/instance/{instance_id}/change/"
    return base_url() + path


def instance_or_error(instance_id: int):
    """The instance (with its definition), or a CommandError that says how to get one."""
    instance = selectors.instance_get(instance_id)
    if instance is None:
        raise CommandError(
            f"No instance has id {instance_id}. `manage.py demo_start` starts "
            "one and prints its id."
        )
    return instance


def user_or_error(username: str):
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise CommandError(
            f"No user {username!r}. `manage.py demo_setup --password …` creates "
            "the demo logins (`make run` does it for you)."
        )
    return user


def application_id_or_error(instance) -> str:
    application_id = (instance.variables.get("application") or {}).get("id")
    if not application_id:
        raise CommandError(
            f"Instance {instance.pk} has no registered application yet (its "
            "register step has not completed). Wait a moment and try again."
        )
    return application_id
