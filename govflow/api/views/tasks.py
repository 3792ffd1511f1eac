"""External tasks for workers: fetch and lock, extend the lock, complete, fail, BPMN error.

Thin views over ``govflow.engine.services.external_queue`` and ``external_results``. A
key needs ``tasks:<topic>`` for the topic of every task it fetches or reports on, and
sees only its tenant's tasks (another tenant's task is a 404). A refused report answers
409 with a problem type naming why (``task_problems``); the report is kept on the task's
history, never applied. Send the task id (with the fence and the kind of report) as the
``Idempotency-Key`` of a report, so a report sent again after a lost answer is answered
as the first one was.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import exceptions
from rest_framework.response import Response

from govflow.engine.services import external_queue as queue
from govflow.engine.services import external_results as results

from .. import selectors, task_serializers
from ..idempotency import idempotent
from ..permissions import Authenticated
from ..problems import ApiProblem
from ..schema import IDEMPOTENCY_HEADER, REPLAYED_HEADER, path_id
from ..task_problems import REFUSAL_PROBLEM
from .base import ApiView

TAG = ["External tasks"]
_COMMON = [IDEMPOTENCY_HEADER, REPLAYED_HEADER]
_REFUSED = (
    " A report the task no longer accepts (lock expired, another worker's fence, already "
    "completed) is a 409 whose problem type says why; it is kept on the task's history "
    "and never applied."
)


class TaskView(ApiView):
    """A task endpoint: the scope is ``tasks:<topic>``, checked once the topic is known."""

    permission_classes = [Authenticated]

    def require_topic(self, topic: str) -> None:
        scope = f"tasks:{topic}"
        if self.principal.allows(scope):
            return
        if self.principal.key is not None:
            raise exceptions.PermissionDenied(
                f"This API key lacks the scope {scope!r}, which working on the external "
                "tasks of this topic needs. Ask an administrator to add the topic to the key."
            )
        raise exceptions.PermissionDenied(
            f"{self.principal.label} lacks the permission 'engine.change_externaltask', "
            f"which stands for the scope {scope!r}."
        )

    def task(self, pk: int):
        task = selectors.task_get(self.tenants, pk)
        if task is None:
            raise self.not_found(f"External task {pk}")
        self.require_topic(task.topic)
        return task

    def form(self, serializer_class):
        form = serializer_class(data=self.request.data)
        form.is_valid(raise_exception=True)
        return form.validated_data

    def answer(self, pk: int) -> Response:
        task = selectors.task_get(None, pk)
        return Response(task_serializers.Task(task_detail(self, task)).data)


def refused(exc: queue.TaskReportRefused) -> ApiProblem:
    return ApiProblem(REFUSAL_PROBLEM[exc.refusal], str(exc))


def task_detail(view, task) -> dict:
    return {
        "id": task.pk,
        "url": view.url("task-detail", task.pk),
        "topic": task.topic,
        "state": task.state,
        "instance": task.instance_id,
        "step": task.node_id,
        "tenant": task.tenant,
        "fence": task.fence,
        "worker": task.worker,
        "lock_expires_at": task.lock_expires_at,
        "fetchable_at": task.fetchable_at,
        "retries_left": task.retries_left,
        "last_error": task.last_error,
        "variables": task.variables,
        "reports": [
            {
                "kind": r.kind,
                "fence": r.fence,
                "worker": r.worker,
                "applied": r.applied,
                "refusal": r.refusal,
                "message": r.message,
                "payload": r.payload,
                "received_at": r.received_at,
            }
            for r in selectors.task_reports(task)
        ],
    }


class FetchAndLock(TaskView):
    @extend_schema(
        tags=TAG,
        operation_id="tasks_fetch_and_lock",
        summary="Fetch and lock tasks",
        description=(
            "Locks up to max_tasks fetchable tasks of the topics for your worker, oldest "
            "first, and answers them (an empty list when none is due: ask again later). A "
            "task is fetchable when it is new, when its retry time has come after a "
            "transient failure, or when another worker's lock expired — then with a higher "
            "fence, so that worker's late reports are refused. The lock lasts "
            "lock_duration seconds by the database clock; extend it while you work. "
            "Scope: tasks:<topic> for every topic; an unknown topic is a 404."
        ),
        request=task_serializers.FetchAndLockRequest,
        parameters=_COMMON,
        responses=task_serializers.FetchAndLockResponse,
    )
    @idempotent
    def post(self, request):
        data = self.form(task_serializers.FetchAndLockRequest)
        for topic in data["topics"]:
            self.require_topic(topic)
        for topic in data["topics"]:
            if not selectors.topic_known(topic):
                raise self.not_found(f"The topic {topic!r}")
        locked = queue.task_fetch_and_lock(
            topics=data["topics"],
            worker=data["worker_id"],
            lock_seconds=data["lock_duration"],
            max_tasks=data["max_tasks"],
            tenants=self.tenants,
        )
        tasks = [{**t.__dict__, "url": self.url("task-detail", t.id)} for t in locked]
        for task in tasks:
            task["instance"], task["step"] = task.pop("instance_id"), task.pop("node_id")
        return Response(task_serializers.FetchAndLockResponse({"tasks": tasks}).data)


class TaskDetail(TaskView):
    @extend_schema(
        tags=TAG,
        operation_id="tasks_read",
        summary="Read a task and its history",
        description="The task, its lock, and every report on it — refused (late) ones too. "
        "Scope: tasks:<topic>.",
        parameters=[path_id],
        responses=task_serializers.Task,
    )
    def get(self, request, pk: int):
        return Response(task_serializers.Task(task_detail(self, self.task(pk))).data)


class ExtendLock(TaskView):
    @extend_schema(
        tags=TAG,
        operation_id="tasks_extend_lock",
        summary="Extend a task's lock",
        description="Sets your live lock to expire lock_duration seconds from now. A lock "
        "that expired is not revived (409 task-lock-expired)." + _REFUSED,
        request=task_serializers.ExtendLockRequest,
        parameters=[path_id, *_COMMON],
        responses=task_serializers.Task,
    )
    @idempotent
    def post(self, request, pk: int):
        data = self.form(task_serializers.ExtendLockRequest)
        self.task(pk)
        try:
            queue.task_extend_lock(
                task_id=pk,
                fence=data["fence"],
                worker=data["worker_id"],
                lock_seconds=data["lock_duration"],
            )
        except queue.TaskReportRefused as exc:
            raise refused(exc) from None
        return self.answer(pk)


class Complete(TaskView):
    @extend_schema(
        tags=TAG,
        operation_id="tasks_complete",
        summary="Complete a task",
        description="Completes the task you hold with its result; the waiting step moves "
        "on. Variables that do not match the step's output schema are a 422 (the lock "
        "stays yours)." + _REFUSED,
        request=task_serializers.CompleteRequest,
        parameters=[path_id, *_COMMON],
        responses=task_serializers.Task,
    )
    @idempotent
    def post(self, request, pk: int):
        data = self.form(task_serializers.CompleteRequest)
        self.task(pk)
        try:
            results.task_complete(
                task_id=pk,
                fence=data["fence"],
                worker=data["worker_id"],
                variables=data["variables"],
            )
        except queue.TaskReportRefused as exc:
            raise refused(exc) from None
        return self.answer(pk)


class Fail(TaskView):
    @extend_schema(
        tags=TAG,
        operation_id="tasks_fail",
        summary="Report a failure",
        description="transient: the task returns to the queue, not fetchable before "
        "retry_after seconds, while retries are left; permanent, or none left: the task is "
        "dead-lettered (its step fails, an incident opens for an operator, who retries or "
        "cancels it)." + _REFUSED,
        request=task_serializers.FailRequest,
        parameters=[path_id, *_COMMON],
        responses=task_serializers.Task,
    )
    @idempotent
    def post(self, request, pk: int):
        data = self.form(task_serializers.FailRequest)
        self.task(pk)
        try:
            results.task_fail(
                task_id=pk,
                fence=data["fence"],
                worker=data["worker_id"],
                message=data["message"],
                permanent=data["kind"] == "permanent",
                retry_after=data.get("retry_after"),
            )
        except queue.TaskReportRefused as exc:
            raise refused(exc) from None
        return self.answer(pk)


class BpmnError(TaskView):
    @extend_schema(
        tags=TAG,
        operation_id="tasks_bpmn_error",
        summary="Report a business error",
        description="The work cannot be done as asked (BPMN error): retrying will not help. "
        "The task is dead-lettered with the error code, for an operator." + _REFUSED,
        request=task_serializers.BpmnErrorRequest,
        parameters=[path_id, *_COMMON],
        responses=task_serializers.Task,
    )
    @idempotent
    def post(self, request, pk: int):
        data = self.form(task_serializers.BpmnErrorRequest)
        self.task(pk)
        try:
            results.task_bpmn_error(
                task_id=pk,
                fence=data["fence"],
                worker=data["worker_id"],
                error_code=data["error_code"],
                message=data["message"],
                variables=data["variables"],
            )
        except queue.TaskReportRefused as exc:
            raise refused(exc) from None
        return self.answer(pk)
