"""What a step reads often and what never changes under it: settings, the thread's connection.

A step asks for a dozen settings and for its thread's connection some twenty times. Django
answers both through layers of Python (the lazy settings object; the connection handler's
thread-critical local), a few µs each time, although neither changes while a process runs
— except in tests, which change settings through ``override_settings`` or pytest-django's
``settings`` fixture. Both send ``setting_changed``, which empties what is kept here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from django.conf import settings
from django.core.signals import setting_changed
from django.db import DEFAULT_DB_ALIAS, connections

__all__ = ["default_db", "kept_made", "kept_setting"]

_KEPT: dict[object, object] = {}
"""Settings by (name, default), and what :func:`kept_made` made by its key."""

T = TypeVar("T")


def kept_setting(name: str, default: object = None) -> object:
    """``getattr(settings, name, default)``, read once and kept until a setting changes.

    For the settings a step reads (leases, limits, the chain's keys, the input's depth):
    Django's lazy settings object answers each read through several Python calls, and a
    step asks a dozen times. ``override_settings`` and pytest-django's ``settings`` fixture
    send ``setting_changed``, which empties the store (:func:`_settings_changed`).
    """
    try:
        return _KEPT[name, default]
    except KeyError:
        value = _KEPT[name, default] = getattr(settings, name, default)
        return value


def kept_made(key: str, make: Callable[[], T]) -> T:
    """``make()``, made once and kept until a setting changes: for what is built from
    settings and asked at every step (the ledger's dialect). ``key`` names it."""
    try:
        return _KEPT[key]  # type: ignore[return-value]
    except KeyError:
        value = _KEPT[key] = make()
        return value


class _ThreadsConnection(threading.local):
    db = None
    generation = -1


_THREADS = _ThreadsConnection()
_GENERATION = [0]


def default_db():
    """``connections[DEFAULT_DB_ALIAS]``: this thread's connection to the default database.

    Kept per thread until a setting changes: Django's handler answers through a
    thread-critical local (several Python calls, a few µs) and a step asks it some twenty
    times, although a thread's connection object is the same for the thread's life (it
    reconnects in place). Sync code only, as every database access is in Django.
    """
    kept = _THREADS
    if kept.generation == _GENERATION[0]:
        return kept.db
    kept.db, kept.generation = connections[DEFAULT_DB_ALIAS], _GENERATION[0]
    return kept.db


def _settings_changed(**kwargs) -> None:
    _KEPT.clear()
    _GENERATION[0] += 1


setting_changed.connect(_settings_changed, dispatch_uid="recovery.kept")
