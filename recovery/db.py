"""The few SQL fragments that differ between PostgreSQL and SQLite.

The ledger's hot path is written as plain parameterised SQL (see ``docs/recovery.md``,
"Cost"): it runs for every step of every instance, and the ORM's per-statement overhead
would be most of its cost. Everything else uses the ORM.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from django.db import connection, transaction

GENESIS_LINK = "0" * 64


@dataclass(frozen=True)
class Dialect:
    now: str
    """The database clock, read when the statement runs (not when the transaction began)."""

    plus_seconds: str
    """An expression for "now + %s seconds"; takes one parameter."""

    share_lock: str
    """Locks the fence row in a sub-select until commit, so a new holder cannot take the
    lease between our fence check and our commit (PostgreSQL, READ COMMITTED). SQLite
    serialises writers with ``BEGIN IMMEDIATE`` and needs nothing here."""

    seconds_param: staticmethod


_POSTGRES = Dialect(
    now="clock_timestamp()",
    plus_seconds="(clock_timestamp() + %s * interval '1 second')",
    share_lock="FOR SHARE",
    seconds_param=staticmethod(lambda seconds: float(seconds)),
)
_SQLITE = Dialect(
    now="strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')",
    plus_seconds="strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s)",
    share_lock="",
    seconds_param=staticmethod(lambda seconds: f"{float(seconds):+.6f} seconds"),
)


def dialect() -> Dialect:
    if connection.vendor == "postgresql":
        return _POSTGRES
    if connection.vendor == "sqlite":
        return _SQLITE
    raise NotImplementedError(
        f"The recovery ledger supports PostgreSQL and SQLite, not {connection.vendor}."
    )


_JOINED: ContextVar[bool] = ContextVar("recovery_joined", default=False)


@contextmanager
def joined() -> Iterator[None]:
    """Let the recovery writes in this block join the caller's transaction, no savepoints.

    By default a recovery write nested in a caller's transaction runs in a savepoint, so a
    refused write rolls back alone and the caller may carry on. A caller that rolls back
    its whole transaction on any error anyway (the engine's step commits) saves those
    SAVEPOINT/RELEASE round trips with this block. Needs an open transaction.
    """
    if not connection.in_atomic_block:
        raise RuntimeError("recovery.api.joined() needs an open transaction.")
    token = _JOINED.set(True)
    try:
        yield
    finally:
        _JOINED.reset(token)


def atomic():
    """``transaction.atomic()``, without a savepoint inside :func:`joined`."""
    return transaction.atomic(savepoint=not _JOINED.get())
