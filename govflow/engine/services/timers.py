"""Firing due timers: the sweep's first commit of each pass, and queueing their instances.

A timer is a row with its own fence: the sweeper fires it under the ``govflow:sweeper``
lease, by the database clock (invariant I9), with every write conditional on that fence
(I2). How the writes are put into statements differs by database (``EngineDialect``).
"""

from __future__ import annotations

from django.db import connection

from recovery.api import Fence, fence_condition, fenced_update, lease_require_live

from ..conf import sweep_timer_batch
from ..db import EngineDialect, clock, engine_commit, engine_dialect
from ..models import Instance, Timer, TimerState, Token, TokenState, WaitKind
from ..queue import BULK_BATCH, enqueue_many

__all__ = ["fire_statement", "fired_queue", "timers_fire", "timers_fire_only"]


def timers_fire(*, fence: Fence, limit: int | None = None) -> int:
    """Fire up to ``limit`` due timers (database clock), then queue their instances.

    Two commits, each its own. The first records the facts — timers fired, tokens ready,
    and each instance's ``enqueued_at`` cleared, meaning "needs a task" — in a statement or
    two whatever the number; the second queues one ``advance`` task per instance. A
    sweeper that stops between the two leaves nothing stranded: the next requeue pass
    queues every runnable instance whose ``enqueued_at`` is empty. Raises
    :class:`StaleFence` (changing nothing) when ``fence`` is no longer the sweeper's lease.
    """
    instance_ids = timers_fire_only(fence=fence, limit=limit)
    fired_queue(instance_ids)
    return len(instance_ids)


def timers_fire_only(*, fence: Fence, limit: int | None = None) -> list[int]:
    """The first commit of :func:`timers_fire` (its own): fire, ready, mark unqueued.

    Returns the instances of the fired timers.
    """
    limit = sweep_timer_batch() if limit is None else limit
    d = engine_dialect()
    with engine_commit():
        if d.chained_writes:
            instance_ids = _fire_in_one_statement(d, fence, limit)
        else:
            instance_ids = _fire_statement_by_statement(fence, limit)
        if not instance_ids:
            lease_require_live(fence=fence, doing="fire timers")
    return instance_ids


def fired_queue(instance_ids: list[int]) -> None:
    """Queue the instances of fired timers, a bulk INSERT per commit (each its own)."""
    for start in range(0, len(instance_ids), BULK_BATCH):
        with engine_commit():
            enqueue_many(instance_ids[start : start + BULK_BATCH])


def _fire_in_one_statement(d: EngineDialect, fence: Fence, limit: int) -> list[int]:
    """Fire, ready and unqueue in one statement (:func:`fire_statement`); needs a commit."""
    sql, params = fire_statement(fence, limit, d)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [row[0] for row in cursor.fetchall()]


def fire_statement(
    fence: Fence, limit: int, d: EngineDialect | None = None
) -> tuple[str, list[object]]:
    """The statement that fires up to ``limit`` due timers, as ``(sql, params)``.

    For a database that chains writes in one statement (PostgreSQL):

    - ``due`` locks the earliest due timers. ``SKIP LOCKED`` passes over a timer whose row
      another transaction holds (an operator cancelling its instance): the next pass
      fires it. A locked row was re-checked by the lock, so it is still scheduled and due.
      The clock is read once (``now_once``), so the timers' index bounds the scan.
    - ``fired`` updates them with the fence condition inside the UPDATE: a stale sweeper's
      statement changes nothing at all, and so neither do the two that follow, which only
      touch what it fired.
    - ``ready`` makes their tokens ready; ``unqueued`` clears their instances'
      ``enqueued_at`` ("needs a task": see :func:`timers_fire`). The UPDATEs find their rows
      by primary key only (``= ANY(ARRAY(…))``): with a join, or a condition on the token's
      state, the planner may scan every waiting token against the batch when its
      statistics predate a burst of new timers (seconds for 10,000 timers). A token that
      no longer waits on its timer (its instance was cancelled) is left as it was by the
      ``CASE``.
    """
    d = d or engine_dialect()
    live_sql, live_params = fence_condition(fence)
    timer, token = Timer._meta.db_table, Token._meta.db_table
    instance = Instance._meta.db_table
    waits_on_timer = "state = %s AND wait_kind = %s"
    sql = (
        f"WITH due AS ("
        f"  SELECT id FROM {timer} WHERE state = %s AND due_at <= {d.now_once}"
        f"  ORDER BY due_at LIMIT %s {d.skip_locked}"
        f"), fired AS ("
        f"  UPDATE {timer} SET state = %s, fire_fence = %s, fired_at = {d.now}"
        f"  WHERE id = ANY(ARRAY(SELECT id FROM due)) AND {live_sql}"
        f"  RETURNING token_id, instance_id"
        f"), ready AS ("
        f"  UPDATE {token} SET"
        f"    state = CASE WHEN {waits_on_timer} THEN %s ELSE state END,"
        f"    updated_at = CASE WHEN {waits_on_timer}"
        f"      THEN {d.now} ELSE updated_at END"
        f"  WHERE id = ANY(ARRAY(SELECT token_id FROM fired))"
        f"), unqueued AS ("
        f"  UPDATE {instance} SET enqueued_at = NULL"
        f"  WHERE id = ANY(ARRAY(SELECT instance_id FROM fired))"
        f") SELECT instance_id FROM fired"
    )
    waiting = [TokenState.WAITING.value, WaitKind.TIMER.value]
    params = [
        TimerState.SCHEDULED.value,
        limit,
        TimerState.FIRED.value,
        fence.fence,
        *live_params,
        *waiting,
        TokenState.READY.value,
        *waiting,
    ]
    return sql, params


def _fire_statement_by_statement(fence: Fence, limit: int) -> list[int]:
    """The same writes one statement each (SQLite), every one of them fenced.

    ``BEGIN IMMEDIATE`` serialises writers, so the due rows read here are still due when
    the fenced UPDATEs below run; the fence condition in each still proves the sweeper's
    lease did not lapse in between (by time). Needs the caller's commit.
    """
    due = list(
        Timer.objects.filter(state=TimerState.SCHEDULED, due_at__lte=clock())
        .order_by("due_at")
        .values_list("pk", "token_id", "instance_id")[:limit]
    )
    if not due:
        return []
    fenced_update(
        Timer.objects.filter(pk__in=[d[0] for d in due], state=TimerState.SCHEDULED),
        fence=fence,
        state=TimerState.FIRED,
        fire_fence=fence.fence,
        fired_at=clock(),
    )
    fenced_update(
        Token.objects.filter(
            pk__in=[d[1] for d in due], state=TokenState.WAITING, wait_kind=WaitKind.TIMER
        ),
        fence=fence,
        state=TokenState.READY,
        updated_at=clock(),
    )
    instance_ids = [d[2] for d in due]
    fenced_update(Instance.objects.filter(pk__in=instance_ids), fence=fence, enqueued_at=None)
    return instance_ids
