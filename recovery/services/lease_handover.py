"""A lease taken on someone else's behalf, handed to the process that does the work.

A claim takes many leases at once (``leases_acquire_sql``); each is then handed to the
thread that runs its subject, so the lease names who holds it now and its fence moves on
(ADR 0026, 0042). :func:`lease_handover_reading` hands it over in the statement of the
reads the new holder starts from (ADR 0060): one round trip, not two.
"""

from __future__ import annotations

from typing import Any

from django.db import connection

from ..db import atomic, dialect
from .leases import _TABLE, Fence, _stale, _validate


def _handover_sql(fence: Fence, holder: str, ttl: float) -> tuple[str, list[Any]]:
    """The conditional ``UPDATE … RETURNING fence`` of a handover, and its parameters."""
    d = dialect()
    return (
        f"UPDATE {_TABLE} SET holder = %s, fence = fence + 1, acquired_at = {d.now}, "
        f"expires_at = {d.plus_seconds} "
        f"WHERE key = %s AND holder = %s AND fence = %s AND expires_at > {d.now} "
        "RETURNING fence",
        [holder, d.seconds_param(ttl), fence.key, fence.holder, fence.fence],
    )


def lease_handover(*, fence: Fence, holder: str, ttl: float) -> Fence:
    """Pass a live lease to ``holder``: fence + 1, expiry renewed by database time.

    For a lease taken on someone else's behalf (a claim that takes many leases, handed to
    the process that does the work), so the lease names the process that holds it now.
    Raises :class:`StaleFence` (changing nothing) when ``fence`` is no longer live.
    """
    _validate(fence.key, holder, ttl)
    sql, params = _handover_sql(fence, holder, ttl)
    with atomic(), connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        raise _stale(fence, "hand the lease over")
    return Fence(key=fence.key, holder=holder, fence=row[0])


def lease_handover_reading(
    *, fence: Fence, holder: str, ttl: float, reads: str, params: list[Any]
) -> tuple[Fence, list[tuple]]:
    """:func:`lease_handover` and the ``reads`` in one statement (PostgreSQL only: the
    handover is a data-modifying ``WITH``): the new fence and the rows ``reads`` selected.

    ``reads`` is a ``SELECT`` (``params`` its parameters) whose first column is never
    NULL. It sees the database as the statement began: the handover is not visible to it,
    so it should not read the lease. Needs the caller's transaction, like any read the
    new holder bases writes on. Raises :class:`StaleFence` when ``fence`` is no longer
    live: then nothing changed and the rows are not returned.
    """
    _validate(fence.key, holder, ttl)
    handover, handover_params = _handover_sql(fence, holder, ttl)
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH handed AS ({handover}) "
            "SELECT h.fence, r.* FROM (SELECT (SELECT fence FROM handed) AS fence) h "
            f"LEFT JOIN ({reads}) r ON TRUE",
            [*handover_params, *params],
        )
        rows = cursor.fetchall()
    if rows[0][0] is None:
        raise _stale(fence, "hand the lease over")
    # No row of the reads: the LEFT JOIN's one row, all NULL past the fence.
    read = [row[1:] for row in rows if row[1] is not None]
    return Fence(key=fence.key, holder=holder, fence=rows[0][0]), read
