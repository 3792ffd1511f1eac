"""Writing an event: the one function the engine calls, inside the transition's commit.

An event row commits or rolls back with the transition that caused it: there is no
"send after commit" that a crash could lose, and a rolled-back transition leaves no event.
Each event takes its instance's next sequence number from :class:`EventCounter` by an
upsert whose row lock orders two commits of the same instance (``models.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.models.functions import Now

from recovery.api import default_db, dialect, insert_row

from .models import Event, EventCounter, EventType

__all__ = ["EventType", "event_parts", "event_record"]

_SAFE = (str, int, bool, type(None))
_TYPES = frozenset(EventType.values)  # ``values`` builds a new list at every access


def event_record(
    *, type: str, instance_id: int, tenant: str, data: Mapping[str, Any] | None = None
) -> Event:
    """Record one event of ``instance_id`` (needs the caller's transaction).

    ``data`` holds ids, names and states only: strings, integers, booleans, None and
    lists of them; anything else (a mapping, a float, an object) is refused, so that no
    input, output or error text travels by mistake.
    """
    event = _event(type, instance_id, tenant, data)
    if connection.vendor == "postgresql":
        _insert_numbered(event)
        return event
    event.seq, event.created_at = _next_seq(instance_id), Now()
    # One statement whose text is built once (``insert_row``), not the ORM's per insert:
    # an instance's events are written in its engine commits (ADR 0039).
    insert_row(event)
    return event


def event_parts(
    *, type: str, instance_id: int, tenant: str, data: Mapping[str, Any] | None = None
) -> tuple[list[str], list[object]]:
    """:func:`event_record`'s writes on PostgreSQL as ``WITH`` parts, not run, and their
    parameters: ``numbered`` (the instance's next sequence number) and ``event`` (the row,
    ``RETURNING id, seq, created_at``), for a caller that sends them in its own statement
    (an instance's start, ADR 0058; an ending, ADR 0059). The same checks of ``data`` first."""
    return list(_numbered_parts()), _numbered_params(_event(type, instance_id, tenant, data))


def _event(type: str, instance_id: int, tenant: str, data: Mapping[str, Any] | None) -> Event:
    if type not in _TYPES:
        raise ValueError(f"{type!r} is not an event type: one of {', '.join(EventType.values)}.")
    body = dict(data or {})
    for name, value in body.items():
        items = value if isinstance(value, list) else [value]
        if not all(isinstance(item, _SAFE) for item in items):
            raise ValueError(
                f"Event data {name!r} must be ids, names or states, not {value!r}: events "
                "never carry inputs, outputs or error texts."
            )
    return Event(type=type, tenant=tenant, instance_id=instance_id, data=body)


def _insert_numbered(event: Event) -> None:
    """The sequence number's upsert and the event's row as one statement (PostgreSQL,
    ADR 0044): the same two writes as :func:`_next_seq` and ``insert_row``, one round trip."""
    db = connections[DEFAULT_DB_ALIAS]
    with db.cursor() as cursor:
        cursor.execute(_numbered_sql(), _numbered_params(event, db))
        event.pk, event.seq, event.created_at = cursor.fetchone()
    event._state.adding = False
    event._state.db = db.alias


def _numbered_params(event: Event, db=None) -> list[object]:
    db = db or default_db()  # once: the fields ask it per value
    params: list[object] = [event.instance_id]
    params += [
        field.get_db_prep_save(getattr(event, field.attname), db) for field in _event_fields()
    ]
    return params


def _event_fields() -> list:
    return [f for f in Event._meta.concrete_fields if f.name not in {"id", "seq", "created_at"}]


@functools.cache
def _numbered_parts() -> tuple[str, str]:
    quote = connection.ops.quote_name
    counter = quote(EventCounter._meta.db_table)
    columns = [quote(f.column) for f in _event_fields()]
    return (
        f"numbered AS (INSERT INTO {counter} (instance_id, last_seq) VALUES (%s, 1) "
        f"ON CONFLICT (instance_id) DO UPDATE SET last_seq = {counter}.last_seq + 1 "
        "RETURNING last_seq)",
        f"event AS (INSERT INTO {quote(Event._meta.db_table)} "
        f"({', '.join(columns)}, seq, created_at) VALUES "
        f"({', '.join('%s' for _ in columns)}, (SELECT last_seq FROM numbered), {dialect().now}) "
        "RETURNING id, seq, created_at)",
    )


@functools.cache
def _numbered_sql() -> str:
    return f"WITH {', '.join(_numbered_parts())} SELECT id, seq, created_at FROM event"


def _next_seq(instance_id: int) -> int:
    """The instance's next sequence number (one upsert; needs the caller's transaction)."""
    table = connection.ops.quote_name(EventCounter._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (instance_id, last_seq) VALUES (%s, 1) "
            f"ON CONFLICT (instance_id) DO UPDATE SET last_seq = {table}.last_seq + 1 "
            "RETURNING last_seq",
            [instance_id],
        )
        return cursor.fetchone()[0]
