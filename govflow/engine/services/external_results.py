"""External tasks reported on: completed, failed, dead-lettered; retried or cancelled.

Exactly one report ever changes a task's step. A completion is applied through the
engine's normal path — under the instance's lease, the task's conditional write
(``external_queue.task_held``: still this worker's lock, this fence, not expired) and the
waiting step's release in **one** commit, after which the runtime applies the variables
through the node's ``output`` mapping. A report that loses that write is refused
(``TaskReportRefused``) and kept on the task's history as a late result.

A transient failure puts the task back in the queue, not fetchable before its retry time
(database clock), while retries are left. A permanent failure, a business (BPMN) error,
or a transient failure with no retry left **dead-letters** the task: its step fails, an
engine incident opens and the instance is blocked until an operator retries the task
(a new task, above the old fence) or cancels the instance.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import F

from ..db import clock
from ..definitions import schema_errors
from ..definitions.limits import DEFAULT_TASK_RETRIES
from ..definitions.schemas import schema_error_text
from ..errors import EngineConflict, InvalidRequest, NotPermitted
from ..limits import admit_json, admit_text, payload_max_bytes
from ..models import ExternalTask, InstanceStatus, ReportKind, TaskState, TokenState
from ..queue import instance_mark_runnable
from .definitions import spec_of
from .external_queue import report_keep, task_held, task_refusal
from .instances import InstanceHeld, instance_cancel
from .routing import Router, after_seconds

__all__ = [
    "INCIDENT_KIND",
    "task_bpmn_error",
    "task_cancel",
    "task_complete",
    "task_fail",
    "task_retry",
]

INCIDENT_KIND = "external_task"
RETRY_AFTER_MAX = 7 * 86400.0


class _Lost(Exception):
    """The conditional write found the lock gone (or the step no longer waits): roll the
    commit back, then refuse."""

    def __init__(self, step_gone: bool = False) -> None:
        self.step_gone = step_gone


def _task(task_id: int) -> ExternalTask:
    task = ExternalTask.objects.filter(pk=task_id).first()
    if task is None:
        raise InvalidRequest(f"No external task has id {task_id}.")
    return task


def _refuse(
    task_id: int, kind: str, fence: int, worker: str, payload: Any, message: str, lost: _Lost
):
    """Keep the refused report on the task's history (its own commit) and raise why."""
    refused = task_refusal(task_id, fence, worker, step_gone=lost.step_gone)
    report_keep(
        task_id=task_id,
        kind=kind,
        fence=fence,
        worker=worker,
        refusal=refused.refusal,
        payload=payload,
        message=f"{message} — {refused}"[:4000] if message else str(refused),
    )
    raise refused


def _checked_variables(run, task: ExternalTask, variables: Any) -> None:
    schema = run.spec.nodes[task.node_id].get("output_schema")
    if not schema:
        return
    errors = schema_errors(schema, variables)
    if errors:
        raise InvalidRequest(
            f"The variables do not match the output schema of step '{task.node_id}': "
            f"{schema_error_text(errors, whole='(variables)')}. Nothing was changed; the "
            "task stays locked to you."
        )


def task_complete(*, task_id: int, fence: int, worker: str, variables: dict[str, Any]) -> None:
    """Complete a locked task with ``variables`` (checked against the node's output
    schema) and release its step, in one commit under the instance's lease (owns it)."""
    if not isinstance(variables, dict):
        raise InvalidRequest("variables must be a JSON object.")
    admit_json(variables, what="variables are malformed", max_bytes=payload_max_bytes())
    task = _task(task_id)
    try:
        with InstanceHeld(task.instance_id, None) as run, run.commit():
            if not task_held(
                task_id, fence, worker, {"state": TaskState.COMPLETED, "ended_at": clock()}
            ):
                raise _Lost
            token = run.active.get(task.token_id)
            if token is None or token.state != TokenState.WAITING:
                raise _Lost(step_gone=True)
            _checked_variables(run, task, variables)
            report_keep(task_id=task_id, kind=ReportKind.COMPLETE, fence=fence, worker=worker)
            run.update_token(token, TokenState.WAITING, state=TokenState.READY, payload=variables)
            run.flush(Router(run))
            instance_mark_runnable(run.instance.pk)
    except _Lost as lost:
        _refuse(task_id, ReportKind.COMPLETE, fence, worker, variables, "", lost)


def _backoff(task: ExternalTask, retries: int) -> float:
    used = max(0, retries - task.retries_left)
    return min(3600.0, 10.0 * 2**used)


def task_fail(
    *,
    task_id: int,
    fence: int,
    worker: str,
    message: str,
    permanent: bool = False,
    retry_after: float | None = None,
) -> ExternalTask:
    """A worker could not do the task. Transient, with retries left: back to the queue,
    not fetchable for ``retry_after`` seconds (a doubling back-off when None); otherwise
    dead-lettered. Owns its commits. Returns the task as it is now."""
    message = admit_text(message or "(no message)", name="message", max_length=4000)
    if retry_after is not None and (
        isinstance(retry_after, bool)
        or not isinstance(retry_after, int | float)
        or not 0 <= retry_after <= RETRY_AFTER_MAX
    ):
        raise InvalidRequest(f"retry_after must be 0 to {RETRY_AFTER_MAX:g} seconds.")
    task = _task(task_id)
    if not permanent and task.retries_left > 0:
        retries = _node_retries(task)
        wait = _backoff(task, retries) if retry_after is None else float(retry_after)
        with transaction.atomic():
            requeued = task_held(
                task_id,
                fence,
                worker,
                {
                    "state": TaskState.OPEN,
                    "worker": "",
                    "lock_expires_at": None,
                    "fetchable_at": after_seconds(wait),
                    "retries_left": F("retries_left") - 1,
                    "last_error": message,
                },
            )
            if requeued:
                kind = ReportKind.FAIL_TRANSIENT
                report_keep(task_id=task_id, kind=kind, fence=fence, worker=worker, message=message)
        if not requeued:
            _refuse(task_id, ReportKind.FAIL_TRANSIENT, fence, worker, None, message, _Lost())
        return _task(task_id)
    kind = ReportKind.FAIL_PERMANENT if permanent else ReportKind.FAIL_TRANSIENT
    why = "failed permanently" if permanent else "failed with no retry left"
    _dead_letter(task, fence, worker, kind, message, None, f"{why}: {message}")
    return _task(task_id)


def _node_retries(task: ExternalTask) -> int:
    node = spec_of(task.instance.definition).nodes[task.node_id]
    return node.get("retries", DEFAULT_TASK_RETRIES)


def task_bpmn_error(
    *,
    task_id: int,
    fence: int,
    worker: str,
    error_code: str,
    message: str = "",
    variables: dict[str, Any] | None = None,
) -> ExternalTask:
    """A business error (BPMN style): the work cannot be done as asked, and retrying will
    not change that. GovFlow definitions have no error boundary events, so the task is
    dead-lettered with the error code for an operator. Owns its commits."""
    error_code = admit_text(error_code, name="error_code", max_length=200)
    message = admit_text(message or "", name="message", max_length=4000, required=False)
    variables = {} if variables is None else variables
    if not isinstance(variables, dict):
        raise InvalidRequest("variables must be a JSON object.")
    admit_json(variables, what="variables are malformed", max_bytes=payload_max_bytes())
    task = _task(task_id)
    payload = {"error_code": error_code, "variables": variables}
    reason = f"reported the business error {error_code!r}" + (f": {message}" if message else "")
    _dead_letter(task, fence, worker, ReportKind.BPMN_ERROR, message, payload, reason)
    return _task(task_id)


def _dead_letter(task, fence: int, worker: str, kind: str, message: str, payload, why: str):
    """Dead-letter a locked task: its step fails, an incident opens, the instance is
    blocked; one commit under the instance's lease (owns it)."""
    text = (
        f"External task {task.pk} (topic {task.topic!r}, step '{task.node_id}') {why}. "
        "It is dead-lettered: retry it from the task's page (a new task) or cancel the "
        "instance."
    )[:2000]
    try:
        with InstanceHeld(task.instance_id, None) as run, run.commit():
            if not task_held(
                task.pk,
                fence,
                worker,
                {"state": TaskState.DEAD, "ended_at": clock(), "last_error": message},
            ):
                raise _Lost
            token = run.active.get(task.token_id)
            if token is None or token.state != TokenState.WAITING:
                raise _Lost(step_gone=True)
            report_keep(
                task_id=task.pk,
                kind=kind,
                fence=fence,
                worker=worker,
                payload=payload,
                message=message,
            )
            run.update_token(token, TokenState.WAITING, state=TokenState.FAILED, reason=text)
            run.active.pop(token.pk, None)
            run.engine_incident_open(token, INCIDENT_KIND, text)
            run.flush(Router(run), status=InstanceStatus.BLOCKED, reason=text)
    except _Lost as lost:
        _refuse(task.pk, kind, fence, worker, payload, message, lost)


def _operator(actor, doing: str) -> None:
    if actor is None or not actor.has_perm("engine.operate_instance"):
        raise NotPermitted(
            f"{actor} may not {doing}: the permission 'engine.operate_instance' is required."
        )


def task_retry(*, task_id: int, actor) -> ExternalTask:
    """Retry a dead-lettered task: a new task (its fence starts above the old one's, its
    retry budget full) and the step waits for it again. One commit under the instance's
    lease (owns it). Returns the new task. The dead letter's engine incident stays open
    until an operator resolves it with what they found, as any engine incident
    (``handoffs.services.incidents``): a retry is an action, not an investigation."""
    _operator(actor, "retry external tasks")
    task = _task(task_id)
    with InstanceHeld(task.instance_id, actor) as run:
        token = run.instance.tokens.filter(pk=task.token_id).first()
        if task.state != TaskState.DEAD or token is None or token.state != TokenState.FAILED:
            raise EngineConflict(
                f"Task {task_id} is {task.state}, not dead-lettered: only a dead letter is "
                "retried. Reload the page."
            )
        with run.commit():
            moved = ExternalTask.objects.filter(pk=task.pk, state=TaskState.DEAD).update(
                state=TaskState.RETRIED
            )
            if moved != 1:
                raise EngineConflict(f"Task {task_id} was retried or cancelled meanwhile.")
            fresh = ExternalTask.objects.create(
                instance_id=task.instance_id,
                token_id=token.pk,
                node_id=task.node_id,
                tenant=task.tenant,
                topic=task.topic,
                variables=task.variables,
                fence=task.fence + 1,
                retries_left=run.spec.nodes[task.node_id].get("retries", DEFAULT_TASK_RETRIES),
                fetchable_at=clock(),
                created_at=clock(),
            )
            report_keep(
                task_id=task.pk,
                kind=ReportKind.RETRY,
                fence=task.fence,
                worker=str(actor),
                message=f"replaced by task {fresh.pk}",
            )
            run.update_token(
                token,
                TokenState.FAILED,
                state=TokenState.WAITING,
                reason=f"retried by {actor}: task {fresh.pk}",
            )
            run.active[token.pk] = token
            run.flush(Router(run), status=InstanceStatus.WAITING, reason="")
    return fresh


def task_cancel(*, task_id: int, actor, reason: str) -> None:
    """Cancel the instance of a dead-lettered task (``instance_cancel``: its tasks too)."""
    _operator(actor, "cancel instances")
    task = _task(task_id)
    if task.state != TaskState.DEAD:
        raise EngineConflict(
            f"Task {task_id} is {task.state}; only a dead letter is cancelled here."
        )
    instance_cancel(instance_id=task.instance_id, actor=actor, reason=reason)
    report_keep(
        task_id=task.pk, kind=ReportKind.CANCEL, fence=task.fence, worker=str(actor), message=reason
    )
