"""Firing due timers: the sweep's first commit of each pass, marking their instances runnable.

A timer is a row with its own fence: the sweeper fires it under the ``govflow:sweeper``
lease, by the database clock (invariant I9), with every write conditional on that fence
(I2). How the writes are put into statements differs by database (``EngineDialect``).
"""

from __future__ import annotations

from django.db import connection
from django.db.models import Case, F, When

from recovery.api import Fence, fence_condition, fenced_update, lease_require_live

from ..conf import sweep_timer_batch
from ..db import EngineDialect, clock, engine_commit, engine_dialect
from ..models import Instance, Timer, TimerState, Token, TokenState, WaitKind
from ..queue import keep_place_sql

__all__ = ["fire_statement", "timers_fire", "timers_fire_only"]


def timers_fire(*, fence: Fence, limit: int | None = None) -> int:
    """Fire up to ``limit`` due timers (database clock); how many fired.

    One commit (its own) records the facts — timers fired, tokens ready, their instances
    marked runnable (ADR 0026) — in a statement or a few whatever the number: a worker's
    next claim takes the instances. Raises :class:`StaleFence` (changing nothing) when
    ``fence`` is no longer the sweeper's lease.
    """
    return len(timers_fire_only(fence=fence, limit=limit))


def timers_fire_only(*, fence: Fence, limit: int | None = None) -> list[int]:
    """Fire, ready, mark runnable: :func:`timers_fire`'s commit (its own).

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


def _fire_in_one_statement(d: EngineDialect, fence: Fence, limit: int) -> list[int]:
    """Fire, ready and mark runnable in one statement (:func:`fire_statement`); needs a commit.

    The statement also says whether the lease is still live (a row with no instance when
    it is not), so a pass with nothing due learns of a lost lease without another
    statement; :func:`lease_require_live` then raises the same error any fenced write does.
    """
    sql, params = fire_statement(fence, limit, d)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        fired = [row[0] for row in cursor.fetchall()]
    if None in fired:
        lease_require_live(fence=fence, doing="fire timers")
    return [instance_id for instance_id in fired if instance_id is not None]


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
      touch what it fired. The condition is asked only when a timer is due (``CASE``: a
      sub-select PostgreSQL runs once is run when first needed): its ``FOR SHARE`` locks
      the lease row, and a locked row gives the transaction an id and a WAL flush at
      commit, four a second on an idle cluster (ADR 0042). With nothing due the
      statement writes and locks nothing.
    - ``ready`` makes their tokens ready; ``marked`` marks their instances runnable
      (``runnable_at``, ``wakeups``: ``queue.instances_mark_runnable``; an instance already
      marked keeps its place in line, ADR 0037). The UPDATEs find their rows
      by primary key only (``= ANY(ARRAY(…))``): with a join, or a condition on the token's
      state, the planner may scan every waiting token against the batch when its
      statistics predate a burst of new timers (seconds for 10,000 timers). A token that
      no longer waits on its timer (its instance was cancelled) is left as it was by the
      ``CASE``.
    - the last line adds a row with no instance when the lease is not live (tested
      without a lock: nothing is written on its strength), so that a pass with nothing
      due still learns at once that its lease was lost.
    """
    d = d or engine_dialect()
    live_sql, live_params = fence_condition(fence)
    still_sql, still_params = fence_condition(fence, lock=False)
    timer, token = Timer._meta.db_table, Token._meta.db_table
    instance = Instance._meta.db_table
    waits_on_timer = "state = %s AND wait_kind = %s"
    sql = (
        f"WITH due AS ("
        f"  SELECT id FROM {timer} WHERE state = %s AND due_at <= {d.now_once}"
        f"  ORDER BY due_at LIMIT %s {d.skip_locked}"
        f"), fired AS ("
        f"  UPDATE {timer} SET state = %s, fire_fence = %s, fired_at = {d.now}"
        f"  WHERE id = ANY(ARRAY(SELECT id FROM due))"
        f"    AND CASE WHEN EXISTS (SELECT 1 FROM due) THEN {live_sql} ELSE false END"
        f"  RETURNING token_id, instance_id"
        f"), ready AS ("
        f"  UPDATE {token} SET"
        f"    state = CASE WHEN {waits_on_timer} THEN %s ELSE state END,"
        f"    updated_at = CASE WHEN {waits_on_timer}"
        f"      THEN {d.now} ELSE updated_at END"
        f"  WHERE id = ANY(ARRAY(SELECT token_id FROM fired))"
        f"), marked AS ("
        f"  UPDATE {instance} SET runnable_at = {keep_place_sql(d.now)},"
        f"    wakeups = wakeups + 1"
        f"  WHERE id = ANY(ARRAY(SELECT instance_id FROM fired))"
        f") SELECT instance_id FROM fired"
        f" UNION ALL SELECT NULL WHERE NOT {still_sql}"
    )
    return sql, _fire_params(fence, limit, live_params, still_params)


def _fire_params(
    fence: Fence, limit: int, live_params: list[object], still_params: list[object]
) -> list[object]:
    """:func:`fire_statement`'s parameters, in the order of its placeholders."""
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
        *still_params,
    ]
    return params


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
    fenced_update(
        Instance.objects.filter(pk__in=instance_ids),
        fence=fence,
        # An instance already marked keeps its place in line (queue.KEEP_PLACE).
        runnable_at=Case(When(runnable_at__lte=clock(), then=F("runnable_at")), default=clock()),
        wakeups=F("wakeups") + 1,
    )
    return instance_ids
