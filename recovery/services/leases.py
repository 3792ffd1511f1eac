"""Leases and fences: who may advance a resource now.

The protocol, in one place:

1. ``lease_acquire`` is one upsert. It succeeds only when the lease row is new, released
   or expired *by the database clock*, and sets ``fence = fence + 1``. The row is never
   deleted, so a fence is strictly greater than every fence issued for that key before,
   including across releases.
2. The holder proves authority on every write by a condition inside that write
   (:func:`fence_condition`): the lease row still names this holder and fence and has not
   expired. A stale holder's write matches no row and raises :class:`StaleFence`.
3. On PostgreSQL that condition also takes a share lock on the lease row until the
   writer commits, so a new holder's upsert waits for an in-flight write of the old
   holder and then sees its result. The lock closes that window; the condition remains
   the proof.
4. ``lease_renew`` and ``lease_release`` are conditional on holder, fence and expiry, so a
   holder whose lease expired can neither extend nor release it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from django.db import connection, transaction
from django.db.models import BooleanField, Model, QuerySet
from django.db.models.expressions import RawSQL
from django.db.models.functions import Now

from .. import chain
from ..db import atomic, dialect, field_saver
from ..errors import LeaseHeld, RecoveryValidationError, StaleFence
from ..kept import default_db
from ..models import Lease

__all__ = [
    "Fence",
    "fence_condition",
    "fenced_update",
    "lease_acquire",
    "lease_live_sql",
    "lease_release",
    "lease_release_if_held",
    "lease_renew",
    "lease_require_live",
    "leases_acquire_sql",
]

_TABLE = Lease._meta.db_table


@dataclass(frozen=True)
class Fence:
    """Proof of a lease: the resource key, the holder and the fence number it was given."""

    key: str
    holder: str
    fence: int

    def __str__(self) -> str:
        return f"{self.key} fence {self.fence} held by {self.holder}"


def _validate(key: str, holder: str, ttl: float) -> None:
    if not key or len(key) > 200:
        raise RecoveryValidationError("A lease key must be 1-200 characters, e.g. 'instance:42'.")
    if not holder or len(holder) > 200:
        raise RecoveryValidationError("A lease holder must be 1-200 characters.")
    if not 0 < ttl <= 86400:
        raise RecoveryValidationError(f"A lease ttl must be in (0, 86400] seconds, not {ttl}.")


def lease_acquire(*, key: str, holder: str, ttl: float) -> Fence:
    """Acquire the lease on ``key`` for ``ttl`` seconds of database time.

    Returns the new :class:`Fence`; raises :class:`LeaseHeld` while another holder's lease
    is unexpired (a holder re-acquiring its own live lease is refused too: renew instead).
    """
    _validate(key, holder, ttl)
    d = dialect()
    sql = (
        f"INSERT INTO {_TABLE} (key, holder, fence, acquired_at, expires_at, released_at) "
        f"VALUES (%s, %s, 1, {d.now}, {d.plus_seconds}, NULL) "
        f"ON CONFLICT (key) DO UPDATE SET holder = excluded.holder, "
        f"fence = {_TABLE}.fence + 1, acquired_at = excluded.acquired_at, "
        f"expires_at = excluded.expires_at, released_at = NULL "
        f"WHERE {_TABLE}.holder IS NULL OR {_TABLE}.expires_at <= {d.now} "
        f"RETURNING fence"
    )
    with atomic(), connection.cursor() as cursor:
        cursor.execute(sql, [key, holder, d.seconds_param(ttl)])
        row = cursor.fetchone()
    if row is None:
        current = Lease.objects.filter(key=key).values_list("holder", "expires_at").first()
        who, until = current if current else ("someone", None)
        raise LeaseHeld(
            f"Lease {key!r} is held by {who} until {until}. Wait for it to expire or be "
            "released; its holder's work is still in progress."
        )
    return Fence(key=key, holder=holder, fence=row[0])


def leases_acquire_sql(
    *, keys: str, params: list[object], holder: str, ttl: float
) -> tuple[str, list[object]]:
    """:func:`lease_acquire` for every key a query of the caller's yields, as one statement.

    ``keys`` is a ``SELECT`` whose column ``key`` is the lease key (``params`` its
    parameters). Returns ``(sql, params)`` of an ``INSERT … ON CONFLICT`` that takes each
    of those leases that is free or expired (fence + 1, expiry by database time) and
    yields ``key, fence`` for each one taken; a lease still held is passed over, not an
    error. For a statement of the caller's (a ``WITH`` item on PostgreSQL), in the
    caller's transaction: a claim that takes many leases at once.
    """
    _validate("keys", holder, ttl)
    d = dialect()
    sql = (
        f"INSERT INTO {_TABLE} (key, holder, fence, acquired_at, expires_at, released_at) "
        f"SELECT wanted.key, %s, 1, {d.now}, {d.plus_seconds}, NULL "
        f"FROM ({keys}) AS wanted WHERE true "
        f"ON CONFLICT (key) DO UPDATE SET holder = excluded.holder, "
        f"fence = {_TABLE}.fence + 1, acquired_at = excluded.acquired_at, "
        f"expires_at = excluded.expires_at, released_at = NULL "
        f"WHERE {_TABLE}.holder IS NULL OR {_TABLE}.expires_at <= {d.now} "
        f"RETURNING key, fence"
    )
    return sql, [holder, d.seconds_param(ttl), *params]


def lease_live_sql(key: str, *, now: str | None = None) -> str:
    """An SQL condition that holds while the lease whose key is the expression ``key`` is
    live, for a query of the caller's; ``now`` is the clock expression (the database
    clock by default). No parameters."""
    return (
        f"EXISTS (SELECT 1 FROM {_TABLE} live WHERE live.key = {key} "
        f"AND live.expires_at > {now or dialect().now})"
    )


def lease_takeable_sql(key: str, *, now: str | None = None) -> str:
    """An SQL condition that holds when the lease whose key is the expression ``key`` could
    be acquired now without waiting: not live, and (PostgreSQL) its row, if any, not
    locked by another transaction — it is locked here instead (``SKIP LOCKED``), so a
    statement of the caller's can take it at once. A transaction that holds the row (a
    stale holder's fenced write, paused mid-commit) is passed over, not waited for.
    No parameters."""
    d = dialect()
    free = f"NOT {lease_live_sql(key, now=now)}"
    if not d.share_lock:  # SQLite: one writer at a time, nobody else holds a row
        return free
    return (
        f"{free} AND (NOT EXISTS (SELECT 1 FROM {_TABLE} lk WHERE lk.key = {key}) "
        f"OR EXISTS (SELECT 1 FROM {_TABLE} lk WHERE lk.key = {key} FOR UPDATE SKIP LOCKED))"
    )


def fence_condition(
    fence: Fence, *, lock: bool = True, part: bool = False
) -> tuple[str, list[object]]:
    """Return ``(sql, params)`` of an EXISTS condition that holds only for a live fence.

    ``lock`` (the default, for a condition on a write) share-locks the lease row until the
    transaction ends, so no new holder takes the lease before the write commits. A
    statement that writes nothing may test the lease with ``lock=False``: on PostgreSQL a
    row lock gives its transaction an id and a WAL flush at commit.

    ``part``: the same look-up as a ``WITH`` part named ``live`` (PostgreSQL), for a
    statement of several fenced row writes that check the lease once, each with the
    condition :data:`LIVE_PART` (``fenced_row_sql(…, live=True)``).
    """
    d = dialect()
    look = (
        f"SELECT 1 FROM {_TABLE} WHERE key = %s AND holder = %s AND fence = %s "
        f"AND expires_at > {d.now} {d.share_lock if lock else ''}"
    )
    sql = f"live AS ({look})" if part else f"EXISTS ({look})"
    return sql, [fence.key, fence.holder, fence.fence]


LIVE_PART = "EXISTS (SELECT 1 FROM live)"
"""The condition of a fenced row write in a statement with ``fence_condition(…, part=True)``."""


def _stale(fence: Fence, doing: str) -> StaleFence:
    return StaleFence(
        f"Cannot {doing}: {fence} is no longer the live lease (it expired or a newer holder "
        "took over). Nothing was changed; the current holder carries on."
    )


def lease_renew(*, fence: Fence, ttl: float) -> Fence:
    """Extend a live lease by ``ttl`` seconds from now (database time)."""
    _validate(fence.key, fence.holder, ttl)
    d = dialect()
    with atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {_TABLE} SET expires_at = {d.plus_seconds} "
            f"WHERE key = %s AND holder = %s AND fence = %s AND expires_at > {d.now}",
            [d.seconds_param(ttl), fence.key, fence.holder, fence.fence],
        )
        if cursor.rowcount != 1:
            raise _stale(fence, "renew the lease")
    return fence


def lease_expire(*, fence: Fence) -> bool:
    """Expire a live lease now because its holder is known to be dead.

    For a caller that has proof (a process of this host that no longer exists), so the
    holder's work is taken over without waiting out the lease. The row keeps its holder
    and fence; the next :func:`lease_acquire` gets fence + 1 as after any expiry.
    Conditional on holder and fence: a lease acquired again meanwhile is left alone.
    Returns whether it expired the lease.
    """
    d = dialect()
    with atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {_TABLE} SET expires_at = {d.now} "
            f"WHERE key = %s AND holder = %s AND fence = %s AND expires_at > {d.now}",
            [fence.key, fence.holder, fence.fence],
        )
        return cursor.rowcount == 1


def lease_release(
    *, fence: Fence, with_parts: tuple[Sequence[str], Sequence[object]] | None = None
) -> None:
    """Release a live lease; its fence stays, so the next holder gets a greater one.

    ``with_parts`` (PostgreSQL): the caller's own last writes as ``WITH`` parts
    (``name AS (…)``) and their parameters, sent in the release's statement, in front of
    it: one round trip. Refused with it (:class:`StaleFence`), they roll back with it."""
    d = dialect()
    sql = (
        f"UPDATE {_TABLE} SET holder = NULL, expires_at = NULL, released_at = {d.now} "
        f"WHERE key = %s AND holder = %s AND fence = %s AND expires_at > {d.now}"
    )
    parts, params = with_parts or ((), ())
    if parts:
        released = f"released AS ({sql} RETURNING 1)"
        sql = f"WITH {', '.join([*parts, released])} SELECT count(*) FROM released"
    with atomic(), default_db().cursor() as cursor:
        cursor.execute(sql, [*params, fence.key, fence.holder, fence.fence])
        if (cursor.fetchone()[0] if parts else cursor.rowcount) != 1:
            raise _stale(fence, "release the lease")
    mark_forget_when_released(fence)


def mark_forget_when_released(fence: Fence) -> None:
    """Once the caller's commit that released ``fence`` commits, forget the run's chain
    mark (``chain.mark_forget``): no later run can use it. After the run's own pending
    mark moves (``step_parts._remember``), made on the same commit before it; rolled back,
    the lease is still the run's and so is its mark."""
    transaction.on_commit(lambda: chain.mark_forget(fence))


def lease_release_if_held(*, fence: Fence) -> bool:
    """Release ``fence`` if it is still live; return False when it had already lapsed."""
    try:
        lease_release(fence=fence)
    except StaleFence:
        return False
    return True


def fenced_update(queryset: QuerySet, *, fence: Fence, **values: object) -> int:
    """Run ``queryset.update(**values)`` only while ``fence`` is the live lease.

    The fence check (:func:`fence_condition`, the same one the ledger's own writes use) is
    part of the UPDATE's own WHERE clause, so it is one conditional write. Raises
    :class:`StaleFence` (changing nothing) when the fence is stale; returns the number of
    rows updated otherwise (which may be 0 if the queryset matches nothing).
    """
    live = _live(fence)
    with atomic():
        count = queryset.filter(live).update(**values)
        if count == 0 and not Lease.objects.filter(live).exists():
            raise _stale(fence, "write")
    return count


def _live(fence: Fence) -> RawSQL:
    sql, params = fence_condition(fence)
    return RawSQL(sql, params, output_field=BooleanField())


def fenced_update_row(
    model: type[Model],
    *,
    pk: object,
    fence: Fence,
    values: Mapping[str, object],
    expect: Mapping[str, object] | None = None,
) -> int:
    """:func:`fenced_update` of one row by primary key, as one plain SQL statement.

    ``UPDATE table SET … WHERE pk = %s [AND field = %s …] AND <fence is live>``: the same
    conditional write, without the ORM's per-statement query building (the engine's hot
    path writes a row or two per step). ``expect`` adds equality conditions (e.g. the
    state the row must still be in). Values are plain field values or ``Now()`` (the
    database clock); any other expression takes the ORM path. Returns 0 or 1; raises
    :class:`StaleFence` when the fence is stale.
    """
    if any(
        hasattr(value, "resolve_expression") and not isinstance(value, Now)
        for value in values.values()
    ):
        queryset = model._default_manager.filter(pk=pk, **(expect or {}))
        return fenced_update(queryset, fence=fence, **values)
    sql, params = fenced_row_sql(model, pk=pk, fence=fence, values=values, expect=expect)
    with atomic(), connection.cursor() as cursor:
        cursor.execute(sql, params)
        count = cursor.rowcount
        if count == 0 and not Lease.objects.filter(_live(fence)).exists():
            raise _stale(fence, "write")
    return count


def fenced_row_sql(
    model: type[Model],
    *,
    pk: object,
    fence: Fence,
    values: Mapping[str, object],
    expect: Mapping[str, object] | None = None,
    live: bool = False,
) -> tuple[str, list[object]]:
    """The statement of :func:`fenced_update_row` as ``(sql, params)``, not executed.

    Values are plain field values or ``Now()`` (the database clock). The text is built
    once per shape of call (:func:`_update_sql`); only the parameters are made each time.
    ``live``: the statement carries ``fence_condition(fence, part=True)``'s part; the row
    names it (:data:`LIVE_PART`) instead of looking the lease up, without its parameters.
    """
    # The connection itself, looked up once: Django's field code asks the connection
    # several questions per value, each a thread-local look-up through the proxy.
    db = default_db()
    shape = tuple((name, isinstance(value, Now)) for name, value in values.items())
    sql, assigned, pk_field, expected = _update_sql(
        model, shape, tuple(expect or ()), db.vendor, live
    )
    params = [
        save(value, db) for save, value in zip(assigned, values.values(), strict=True) if save
    ]
    params.append(pk_field.get_db_prep_value(pk, db))
    params += [
        field.get_db_prep_value(value, db)
        for field, value in zip(expected, (expect or {}).values(), strict=True)
    ]
    return sql, params if live else [*params, *fence_condition(fence)[1]]


def fenced_row_stale(fence: Fence) -> StaleFence | None:
    """After a fenced row write matched nothing: the error if the fence is stale, else None."""
    if Lease.objects.filter(_live(fence)).exists():
        return None
    return _stale(fence, "write")


@functools.lru_cache(maxsize=256)
def _update_sql(model, shape, expect_names, vendor, live=False):
    """The text of :func:`fenced_update_row`'s UPDATE for one shape of call, built once.

    ``shape`` is ``((field name, is Now), …)`` in the order of the values; returns the SQL,
    the saver of each value (``field_saver``; None for a ``Now``), the primary key field
    and the fields of ``expect_names``. The engine writes the same few shapes at every step.
    """
    d = dialect()
    meta = model._meta
    quote = connection.ops.quote_name
    assignments, assigned = [], []
    for name, now in shape:
        field = meta.get_field(name)
        assignments.append(f"{quote(field.column)} = {d.now if now else '%s'}")
        assigned.append(None if now else field_saver(field))
    expected = [meta.get_field(name) for name in expect_names]
    conditions = [f"{quote(meta.pk.column)} = %s"]
    conditions += [f"{quote(field.column)} {d.expected} %s" for field in expected]
    live = LIVE_PART if live else fence_condition(Fence(key="", holder="", fence=1))[0]
    sql = (
        f"UPDATE {quote(meta.db_table)} SET {', '.join(assignments)} "
        f"WHERE {' AND '.join(conditions)} AND {live}"
    )
    return sql, tuple(assigned), meta.pk, tuple(expected)


# -- checks ---------------------------------------------------------------------------


def lease_require_live(*, fence: Fence, doing: str) -> None:
    """Raise :class:`StaleFence` ("Cannot <doing>: …") unless ``fence`` is live now.

    The same condition every fenced write carries (:func:`fence_condition`); inside the
    caller's transaction on PostgreSQL it keeps the lease row share-locked until commit,
    so no new holder takes the lease before the caller's writes commit. Reads only.
    """
    if not Lease.objects.filter(_live(fence)).exists():
        raise _stale(fence, doing)
