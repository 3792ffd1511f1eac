"""One instance's steps by their state, in SQL whose plan no table statistics change.

Every read here names the instance, whose steps the ``(instance, ordinal)`` index holds
together, and filters them by state with :func:`db.one_of`: a condition the steps'
``(state, not_before)`` index cannot serve, so the planner never reads every instance's
steps in a state to find one instance's (ADR 0065). Reads only.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from django.db import connection

from recovery.api import model_columns

from .db import engine_dialect, one_of
from .models import Token
from .states import TOKEN_ACTIVE, TokenState, WaitKind

__all__ = ["active_select", "runnable_select", "state_is"]

_ACTIVE = sorted(str(state) for state in TOKEN_ACTIVE)


def state_is(*states: str) -> tuple[str, list[str]]:
    """A step's state is one of ``states`` (:func:`db.one_of` on the state column)."""
    return one_of("state", [str(state) for state in states])


def active_select(instance_id: int, lead: str = "") -> tuple[str, list[Any]]:
    """The instance's active steps, every column (``model_columns``); ``lead``: select-list
    items put first."""
    states, params = state_is(*_ACTIVE)
    return (
        f"SELECT {lead}{model_columns(Token)} FROM {_table()} WHERE instance_id = %s AND {states}",
        [instance_id, *params],
    )


def runnable_select(
    instance_id: int, blocked: Collection[int], *, asks: bool = False, select: str | None = None
) -> tuple[str, list[Any]]:
    """The instance's ready steps that may run now (the database clock), not in
    ``blocked``; with ``asks``, also its uncertain steps whose provider is due to be asked
    (the reconciliation ladder). ``select``: the select list (every column unless given)."""
    now = engine_dialect().now
    ready, params = state_is(TokenState.READY)
    due = f"({ready} AND (not_before IS NULL OR not_before <= {now}))"
    if asks:
        unknown, more = state_is(TokenState.OUTCOME_UNKNOWN)
        due = f"({due} OR ({unknown} AND wait_kind = %s AND not_before <= {now}))"
        params += [*more, WaitKind.RECONCILE.value]
    sql = (
        f"SELECT {select or model_columns(Token)} FROM {_table()} WHERE instance_id = %s AND {due}"
    )
    params.insert(0, instance_id)
    if blocked:
        sql += f" AND id NOT IN ({', '.join('%s' for _ in blocked)})"
        params += list(blocked)
    return sql, params


def _table() -> str:
    return connection.ops.quote_name(Token._meta.db_table)
