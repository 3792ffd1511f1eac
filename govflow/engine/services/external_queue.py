"""External tasks in the queue: created with their step, fetched and locked, extended.

A worker takes tasks with **fetch-and-lock**: one statement picks the oldest fetchable
tasks of its topics (an open task whose retry time has come, or a locked one whose lock
expired), raises each one's fence and writes the worker's lock with an expiry computed by
the database clock (invariant I9). On PostgreSQL the pick is ``FOR UPDATE SKIP LOCKED``:
concurrent workers pass over each other's rows instead of queueing behind them; SQLite
runs the same statement under its single writer (``BEGIN IMMEDIATE``), which serialises
it. A task whose lock expired is fetched again like an open one, with a higher fence, so
whatever its previous holder reports afterwards is recognisably late.

Every report names the task's fence and the worker: :func:`task_held` is the conditional
write all of them start from, and :func:`task_refusal` says why one was refused. A
refused report is kept on the task's history (:func:`report_keep`), never applied.
Completion and failure are in ``external_results``.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction

from ..db import clock, engine_dialect
from ..definitions.limits import DEFAULT_TASK_RETRIES
from ..errors import EngineConflict, InvalidRequest
from ..models import ExternalTask, Refusal, ReportKind, TaskReport, TaskState, Token
from .routing import after_seconds

__all__ = [
    "LOCK_SECONDS_MAX",
    "MAX_TASKS",
    "LockedTask",
    "TaskReportRefused",
    "external_tasks_create",
    "report_keep",
    "task_extend_lock",
    "task_fetch_and_lock",
    "task_held",
    "task_refusal",
]

LOCK_SECONDS_MAX = 3600.0
MAX_TASKS = 100

_REFUSAL_WORDS = {
    Refusal.STALE_FENCE: "another worker has fetched the task since (its fence is now {now}, "
    "yours is {yours}): its lock expired before you reported",
    Refusal.LOCK_EXPIRED: "your lock expired at {expiry} (database clock) before the report "
    "arrived; the task goes back to the queue and another worker will get it",
    Refusal.NOT_HOLDER: "the task is locked by another worker",
    Refusal.ALREADY_DONE: "the task was already {state}: exactly one report ends a task",
    Refusal.NOT_ACTIVE: "the task is no longer active ({state}) and its step does not wait for it",
    Refusal.NOT_LOCKED: "the task is not locked: it waits in the queue until its next "
    "fetchable time ({fetchable})",
}


class TaskReportRefused(EngineConflict):
    """A worker's report on a task was refused; it is kept on the task's history."""

    def __init__(self, message: str, *, refusal: str) -> None:
        self.refusal = refusal
        super().__init__(message)


@dataclass(frozen=True)
class LockedTask:
    """A task a worker locked: what it needs to do the work and report on it."""

    id: int
    fence: int
    topic: str
    instance_id: int
    node_id: str
    tenant: str
    variables: dict[str, Any]
    retries_left: int
    lock_expires_at: dt.datetime


def external_tasks_create(run, items: list[tuple[Token, dict[str, Any]]]) -> None:
    """Create the tasks of tokens that reached an ``external_task`` node (needs the
    caller's commit: the run's, which inserted the tokens)."""
    ExternalTask.objects.bulk_create(
        ExternalTask(
            instance_id=run.instance.pk,
            token_id=token.pk,
            node_id=token.node_id,
            tenant=run.instance.tenant,
            topic=run.spec.nodes[token.node_id]["topic"],
            variables=task_input,
            retries_left=run.spec.nodes[token.node_id].get("retries", DEFAULT_TASK_RETRIES),
            fetchable_at=clock(),
            created_at=clock(),
        )
        for token, task_input in items
    )


def _check_lock_seconds(lock_seconds: float) -> float:
    if (
        not isinstance(lock_seconds, int | float)
        or isinstance(lock_seconds, bool)
        or not 0.05 <= lock_seconds <= LOCK_SECONDS_MAX
    ):
        raise InvalidRequest(
            f"lock_duration must be a number of seconds from 0.05 to {LOCK_SECONDS_MAX:g}."
        )
    return float(lock_seconds)


def _fetch_sql(by_tenant: bool, one_topic: bool) -> str:
    """The fetch-and-lock statement. For one topic the pick is ``topic = %s``, so the
    index (topic, fetchable_at, id) yields the due rows in order and the scan stops at the
    LIMIT; for several it is a list (the due rows of those topics are sorted)."""
    d = engine_dialect()
    table = ExternalTask._meta.db_table
    plus = d.base.plus_seconds
    topic = "= %s" if one_topic else d.id_in
    return (
        f"UPDATE {table} SET state = %s, fence = fence + 1, worker = %s, "
        f"locked_at = {d.now}, lock_expires_at = {plus}, fetchable_at = {plus} "
        f"WHERE id IN (SELECT id FROM {table} WHERE state IN (%s, %s) "
        f"AND topic {topic} {f'AND tenant {d.id_in} ' if by_tenant else ''}"
        f"AND fetchable_at <= {d.now_once} ORDER BY fetchable_at, id LIMIT %s "
        f"{d.skip_locked}) "
        "RETURNING id, fence, topic, instance_id, node_id, tenant, variables, "
        "retries_left, lock_expires_at"
    )


def _locked(row) -> LockedTask:
    values = list(row)
    if isinstance(values[6], str):  # SQLite returns JSON as text
        values[6] = json.loads(values[6])
    if isinstance(values[8], str):  # SQLite: 'YYYY-MM-DD HH:MM:SS.SSS' in UTC
        values[8] = dt.datetime.fromisoformat(values[8])
    if values[8].tzinfo is None:  # SQLite stores UTC without an offset
        values[8] = values[8].replace(tzinfo=dt.UTC)
    return LockedTask(*values)


def task_fetch_and_lock(
    *,
    topics: list[str],
    worker: str,
    lock_seconds: float,
    max_tasks: int = 1,
    tenants: Collection[str] | None = None,
) -> list[LockedTask]:
    """Lock up to ``max_tasks`` fetchable tasks of ``topics`` for ``worker`` (one statement).

    ``tenants`` limits the pick to those tenants' tasks (an API key's one, a signed-in
    user's); None takes every tenant's. Owns its commit (the statement's own). Returns the
    locked tasks, oldest first.
    """
    seconds = _check_lock_seconds(lock_seconds)
    if type(max_tasks) is not int or not 1 <= max_tasks <= MAX_TASKS:
        raise InvalidRequest(f"max_tasks must be a whole number from 1 to {MAX_TASKS}.")
    if not topics or not worker:
        raise InvalidRequest("Name at least one topic and the worker's id.")
    d = engine_dialect()
    param = d.base.seconds_param(seconds)
    params: list[Any] = [TaskState.LOCKED, worker, param, param]
    topics = sorted(set(topics))
    one = len(topics) == 1
    params += [TaskState.OPEN, TaskState.LOCKED, topics[0] if one else d.list_param(topics)]
    params += [d.list_param(sorted(tenants))] if tenants is not None else []
    params.append(max_tasks)
    # One statement is its own transaction (autocommit): no BEGIN and COMMIT round trips.
    # Inside a caller's transaction it joins that one.
    with connection.cursor() as cursor:
        cursor.execute(_fetch_sql(tenants is not None, one), params)
        rows = cursor.fetchall()
    return sorted((_locked(row) for row in rows), key=lambda t: (t.lock_expires_at, t.id))


def task_held(task_id: int, fence: int, worker: str, values: dict[str, Any]) -> bool:
    """The conditional write every report starts from: the task is still locked by
    ``worker`` under ``fence`` and its lock has not expired (database clock). Writes
    ``values`` when it holds; returns whether it did. Needs the caller's commit."""
    return (
        ExternalTask.objects.filter(
            pk=task_id,
            state=TaskState.LOCKED,
            fence=fence,
            worker=worker,
            lock_expires_at__gt=clock(),
        ).update(**values)
        == 1
    )


def task_refusal(
    task_id: int, fence: int, worker: str, *, step_gone: bool = False
) -> TaskReportRefused:
    """Why a report under ``fence`` by ``worker`` is refused now (reads). ``step_gone``:
    the lock held, but the task's step no longer waits for it (cancelled meanwhile)."""
    task = ExternalTask.objects.filter(pk=task_id).first()
    if task is None:
        raise InvalidRequest(f"No external task has id {task_id}.")
    if step_gone:
        refusal = Refusal.NOT_ACTIVE
    elif task.state in (TaskState.COMPLETED, TaskState.DEAD):
        refusal = Refusal.ALREADY_DONE
    elif task.state in (TaskState.RETRIED, TaskState.CANCELLED):
        refusal = Refusal.NOT_ACTIVE
    elif fence != task.fence:
        refusal = Refusal.STALE_FENCE
    elif task.state == TaskState.OPEN:
        refusal = Refusal.NOT_LOCKED
    elif worker != task.worker:
        refusal = Refusal.NOT_HOLDER
    else:
        refusal = Refusal.LOCK_EXPIRED
    words = _REFUSAL_WORDS[refusal].format(
        now=task.fence,
        yours=fence,
        expiry=task.lock_expires_at,
        state=task.get_state_display().split(" (")[0].lower(),
        fetchable=task.fetchable_at,
    )
    return TaskReportRefused(
        f"Task {task_id}: the report was refused because {words}. It was kept on the "
        "task's history as a late result and not applied; do not report on this task "
        "again under this fence.",
        refusal=refusal,
    )


def report_keep(
    *,
    task_id: int,
    kind: str,
    fence: int,
    worker: str,
    refusal: str = "",
    payload: Any = None,
    message: str = "",
) -> TaskReport:
    """Append a report to the task's history (joins the caller's commit, or owns one)."""
    with transaction.atomic():
        return TaskReport.objects.create(
            task_id=task_id,
            kind=kind,
            fence=fence,
            worker=worker[:200],
            refusal=refusal,
            payload=payload,
            message=message[:4000],
            received_at=clock(),
        )


def task_extend_lock(*, task_id: int, fence: int, worker: str, lock_seconds: float) -> None:
    """Extend a live lock to ``lock_seconds`` from now (database clock); owns its commit.

    A lock that already expired is not revived: the task may be another worker's by now.
    """
    seconds = _check_lock_seconds(lock_seconds)
    with transaction.atomic():
        until = after_seconds(seconds)
        if task_held(task_id, fence, worker, {"lock_expires_at": until, "fetchable_at": until}):
            return
    refused = task_refusal(task_id, fence, worker)
    report_keep(
        task_id=task_id,
        kind=ReportKind.EXTEND,
        fence=fence,
        worker=worker,
        refusal=refused.refusal,
        message=str(refused),
    )
    raise refused
