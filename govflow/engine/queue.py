"""Work where it is recorded: instances marked runnable, and claimed by workers (ADR 0026).

The commit that makes an instance runnable (a start, a timer fired, a message taken, a
decision applied, an external task reported, a lease found dead, a run that stopped with
work left) marks it so in the same transaction: :func:`instances_mark_runnable` sets its
``runnable_at`` (database clock) and counts the mark in ``wakeups``. There is no separate
enqueue that could be lost, go stale or multiply.

Claims take the oldest marks first (``ORDER BY runnable_at``): the mark is the instance's
place in line (ADR 0037).

1. **A mark keeps an earlier place.** An instance already marked since an earlier moment
   keeps that moment (:data:`KEEP_PLACE`): a timer, a message or a decision while it
   waited, or its dead worker's lease expired, does not send it behind the instances
   marked since. An instance without a mark, or with a deferred one (below), is marked
   from now.
2. **A run that ended with work left goes to the back**: stopped at its budget
   (:func:`instance_mark_runnable_behind`), or marked again while it ran
   (:func:`runnable_clear` keeps that mark, from the run's end). It had its turn; every
   instance that waited meanwhile goes first.
3. **A deferred mark names its moment** (:func:`instance_mark_runnable_after`,
   :func:`runnable_defer`): a poll due later, a retry after an unexpected error. No claim
   takes the instance before then, unless a mark of rule 1 makes it runnable now.

Workers take runnable instances with :func:`instances_claim`: one statement picks up to
``limit`` of them that no live lease holds (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so
claimers pass each other by) and takes their instance leases in the same statement
(fence + 1, expiry by database time). The mark stays while the instance runs: if its
worker dies, the lease expires (or the sweeper expires it, ADR 0022) and the next claim
takes the instance again, without a sweep. The run clears the mark when it ends with
nothing left to do, and only if nobody marked it again meanwhile (``wakeups`` unchanged).

django-q2 runs the claim as the dequeue of GovFlow's broker (``govflow/engine/broker.py``);
other tasks (the fallback sweep, one-off tasks) still use django-q2's own queue.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import nullcontext
from dataclasses import dataclass

from django.db import connection

from recovery.api import lease_takeable_sql, leases_acquire_sql, sent_alone, untouched

from .db import engine_commit, engine_dialect
from .models import Instance

ADVANCE = "govflow.engine.tasks.advance"
ADVANCE_GROUP = "govflow-advance"
SWEEP = "govflow.engine.tasks.sweep"
SWEEP_GROUP = "govflow-sweep"

# Ids per UPDATE of the marks: 2,000 stay far below PostgreSQL's bind parameter limit.
BULK_BATCH = 2000

_TABLE = Instance._meta.db_table
_KEY = "'instance:' || {}"
"""An instance's lease key in SQL (``run.instance_lease_key``), from its id column."""


KEEP_PLACE = "CASE WHEN runnable_at <= {now} THEN runnable_at ELSE {now} END"
"""``runnable_at`` after a mark (rule 1): an earlier mark is kept; no mark (NULL compares
as unknown) or one in the future (deferred) becomes now. A ``CASE`` and not ``LEAST``:
PostgreSQL's ``LEAST`` passes over NULL, SQLite's ``min()`` returns it."""


def keep_place_sql(now: str) -> str:
    """:data:`KEEP_PLACE` with ``now``, the database clock expression of the statement."""
    return KEEP_PLACE.format(now=now)


@dataclass(frozen=True)
class Claim:
    """An instance a worker claimed: its lease (taken for ``holder``) and its mark count."""

    instance_id: int
    fence: int
    holder: str
    wakeups: int


def instance_mark_runnable(instance_id: int) -> None:
    """Mark one instance runnable (see :func:`instances_mark_runnable`)."""
    instances_mark_runnable([instance_id])


def instances_mark_runnable(instance_ids: Iterable[int]) -> int:
    """Mark instances runnable now (database clock), each keeping an earlier place in
    line if it has one (rule 1 above); needs the caller's commit.

    The commit whose change they act on: the mark commits or rolls back with it. Not
    fenced: a mark is no state of the instance, only a hint that a run is worth claiming,
    and every caller marks under its own authority (the instance's, the sweeper's, a
    delivery's lease) or creates the instance. Returns how many distinct ids were given.
    """
    ids = list(dict.fromkeys(int(pk) for pk in instance_ids))
    d = engine_dialect()
    for start in range(0, len(ids), BULK_BATCH):
        with connection.cursor() as cursor:
            # One list parameter instead of an IN list of thousands: one prepared statement.
            cursor.execute(
                f"UPDATE {_TABLE} SET runnable_at = {keep_place_sql(d.now)}, "
                f"wakeups = wakeups + 1 WHERE id {d.id_in}",
                [d.list_param(ids[start : start + BULK_BATCH])],
            )
    return len(ids)


def instance_mark_runnable_behind(instance_id: int) -> None:
    """Mark one instance runnable from now, behind every instance marked before (rule 2):
    a run that stopped at its budget with work left. Needs the caller's commit."""
    d = engine_dialect()
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {_TABLE} SET runnable_at = {d.now}, wakeups = wakeups + 1 WHERE id = %s",
            [instance_id],
        )


def instance_mark_runnable_after(instance_id: int, seconds: float) -> None:
    """Mark one instance runnable ``seconds`` from now (database clock; rule 3); needs the
    caller's commit. Counted like any mark, so the run that made it does not clear it: a
    pending compensation's next poll (``saga``)."""
    d = engine_dialect()
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {_TABLE} SET runnable_at = {d.base.plus_seconds}, wakeups = wakeups + 1 "
            "WHERE id = %s",
            [d.base.seconds_param(max(0.0, float(seconds))), instance_id],
        )


def runnable_clear(*, instance_id: int, wakeups: int) -> bool:
    """Clear an instance's mark unless it was marked again since ``wakeups`` was read.

    A mark made meanwhile (while the run held the lease) stays, behind the instances that
    waited (rule 2: the instance had its turn; its mark still carried the claimed place),
    unless it is deferred (rule 3). Needs the caller's commit (the run's lease release).
    Returns whether it cleared it.
    """
    d = engine_dialect()
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {_TABLE} SET runnable_at = NULL WHERE id = %s AND wakeups = %s",
            [instance_id, wakeups],
        )
        if cursor.rowcount == 1:
            return True
        cursor.execute(
            f"UPDATE {_TABLE} SET runnable_at = {d.now} WHERE id = %s AND runnable_at <= {d.now}",
            [instance_id],
        )
        return False


def runnable_defer(*, instance_id: int, wakeups: int, seconds: float) -> bool:
    """Move an instance's mark ``seconds`` into the future (rule 3) unless it was marked
    again since ``wakeups`` was read: a run that failed unexpectedly is not claimed again
    at once, in a loop. Needs the caller's commit. Returns whether it moved the mark."""
    d = engine_dialect()
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {_TABLE} SET runnable_at = {d.base.plus_seconds} "
            "WHERE id = %s AND wakeups = %s",
            [d.base.seconds_param(seconds), instance_id, wakeups],
        )
        return cursor.rowcount == 1


def instances_claim(*, holder: str, limit: int, ttl: float) -> list[Claim]:
    """Claim up to ``limit`` runnable instances for ``holder``, their leases taken.

    Owns its commit. On PostgreSQL one statement: pick (``SKIP LOCKED``), lease, return,
    sent alone in autocommit when called outside any transaction (one round trip).
    On SQLite, whose writers take turns (``BEGIN IMMEDIATE``), two in one transaction.
    """
    d = engine_dialect()
    now = d.now_once  # read once: the runnable index bounds the scan by it
    # Not live, and its row not held by a transaction (a paused holder mid-commit):
    # waiting for that row would stall every claim of this cluster.
    takeable = lease_takeable_sql(_KEY.format("i.id"), now=now)
    pick = (
        f"SELECT i.id, i.wakeups FROM {_TABLE} i "
        f"WHERE i.runnable_at <= {now} AND {takeable} "
        f"ORDER BY i.runnable_at LIMIT %s"
    )
    outermost = not connection.in_atomic_block  # a caller's transaction would go on
    with engine_commit(), connection.cursor() as cursor:
        if d.chained_writes:
            leases, params = leases_acquire_sql(
                keys=f"SELECT {_KEY.format('id')} AS key FROM picked",
                params=[],
                holder=holder,
                ttl=ttl,
            )
            # The claim's one statement is the whole commit: sent alone in autocommit,
            # one round trip instead of BEGIN, it and COMMIT (all or nothing by itself).
            with sent_alone() if outermost and untouched() else nullcontext():
                cursor.execute(
                    f"WITH picked AS ({pick} {d.skip_locked}), leased AS ({leases}) "
                    f"SELECT picked.id, picked.wakeups, leased.fence FROM picked "
                    f"JOIN leased ON leased.key = {_KEY.format('picked.id')}",
                    [limit, *params],
                )
            return [Claim(pk, fence, holder, wakeups) for pk, wakeups, fence in cursor.fetchall()]
        cursor.execute(pick, [limit])
        picked = dict(cursor.fetchall())
        if not picked:
            return []
        leases, params = leases_acquire_sql(
            keys=f"SELECT {_KEY.format('value')} AS key FROM json_each(%s)",
            params=[d.list_param(list(picked))],
            holder=holder,
            ttl=ttl,
        )
        cursor.execute(leases, params)
        fences = {key: fence for key, fence in cursor.fetchall()}
    return [
        Claim(pk, fences[f"instance:{pk}"], holder, wakeups)
        for pk, wakeups in picked.items()
        if f"instance:{pk}" in fences
    ]


def enqueue_sweep() -> None:
    """Queue the fallback sweep task (django-q2's ``async_task``: its own write)."""
    from django_q.tasks import async_task

    async_task(SWEEP, group=SWEEP_GROUP)
