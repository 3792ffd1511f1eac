"""External tasks: the rows a worker fetches, locks and reports on (models only).

An ``external_task`` node creates one :class:`ExternalTask` when a token reaches it, in
the same commit. Workers fetch and lock tasks by topic; every report they make — accepted
or refused — is a :class:`TaskReport` on the task's history. The services are
``services/external_queue.py`` (fetch, lock, expiry, transient failure) and
``services/external_results.py`` (completion, dead letters, the desk's retry and cancel).
Persisted values: never rename or reuse one.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _


class TaskState(models.TextChoices):
    OPEN = "open", "Open (fetchable from its next-fetchable time)"
    LOCKED = "locked", "Locked by a worker"
    COMPLETED = "completed", "Completed"
    DEAD = "dead", "Dead letter (needs an operator)"
    RETRIED = "retried", "Retried by an operator (a new task replaced it)"
    CANCELLED = "cancelled", "Cancelled"


TASK_PENDING = (TaskState.OPEN, TaskState.LOCKED)
"""A task in one of these is fetchable once its ``fetchable_at`` has passed."""


class ReportKind(models.TextChoices):
    COMPLETE = "complete", "Complete"
    FAIL_TRANSIENT = "fail_transient", "Transient failure"
    FAIL_PERMANENT = "fail_permanent", "Permanent failure"
    BPMN_ERROR = "bpmn_error", "Business (BPMN) error"
    EXTEND = "extend", "Extend lock"
    RETRY = "retry", "Operator retry"
    CANCEL = "cancel", "Operator cancel"


class Refusal(models.TextChoices):
    """Why a worker's report was refused (and kept as a late result, never applied)."""

    STALE_FENCE = "stale_fence", "Another worker holds the task now (a newer fence)"
    LOCK_EXPIRED = "lock_expired", "The lock expired before the report arrived"
    NOT_HOLDER = "not_holder", "The task is locked by another worker"
    ALREADY_DONE = "already_done", "The task was already completed or dead-lettered"
    NOT_ACTIVE = "not_active", "The task is no longer active (retried or cancelled)"
    NOT_LOCKED = "not_locked", "The task is not locked (it waits in the queue)"


class ExternalTask(models.Model):
    """One unit of work for an external worker, with its lock persisted.

    ``fence`` grows on every lock (and an operator's retry starts above the old task's),
    so a report carrying an older fence is recognisably late. ``fetchable_at`` is when a
    fetch may take it: the retry time of an open task, the lock expiry of a locked one.
    """

    instance = models.ForeignKey(
        "engine.Instance", on_delete=models.CASCADE, related_name="external_tasks"
    )
    token = models.ForeignKey("engine.Token", on_delete=models.CASCADE, related_name="+")
    node_id = models.CharField(max_length=100)
    tenant = models.CharField(max_length=100)
    topic = models.CharField(max_length=100)
    state = models.CharField(max_length=10, choices=TaskState.choices, default=TaskState.OPEN)
    variables = models.JSONField(default=dict, help_text="The input the worker receives.")
    fence = models.BigIntegerField(default=0, help_text="Grows on every lock.")
    worker = models.CharField(max_length=200, blank=True, default="", help_text="Lock owner.")
    locked_at = models.DateTimeField(null=True, blank=True)
    lock_expires_at = models.DateTimeField(null=True, blank=True)
    fetchable_at = models.DateTimeField(help_text="Not fetchable before (database clock).")
    retries_left = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("external task")
        verbose_name_plural = _("external tasks")
        db_table = "engine_external_task"
        indexes = [
            # Fetch-and-lock walks it in order for one topic and stops at its LIMIT.
            models.Index(
                fields=["topic", "fetchable_at", "id"],
                name="engine_task_fetch",
                condition=Q(state__in=["open", "locked"]),
            ),
            models.Index(fields=["instance", "state"], name="engine_task_instance"),
        ]

    def __str__(self) -> str:
        return f"Task {self.pk} on {self.topic} ({self.state})"


class TaskReport(models.Model):
    """What a worker (or an operator) reported on a task: the task's history.

    A refused report is kept with its ``refusal`` and payload — a late result an operator
    can read — and never applied.
    """

    task = models.ForeignKey(ExternalTask, on_delete=models.CASCADE, related_name="reports")
    kind = models.CharField(max_length=16, choices=ReportKind.choices)
    fence = models.BigIntegerField(help_text="The fence the report carried.")
    worker = models.CharField(max_length=200, blank=True, default="")
    refusal = models.CharField(max_length=16, choices=Refusal.choices, blank=True, default="")
    payload = models.JSONField(null=True, blank=True)
    message = models.TextField(blank=True, default="")
    received_at = models.DateTimeField()

    class Meta:
        verbose_name = _("task report")
        verbose_name_plural = _("task reports")
        db_table = "engine_task_report"
        indexes = [models.Index(fields=["task", "received_at"], name="engine_task_report_at")]

    def __str__(self) -> str:
        return f"{self.kind} on task {self.task_id}{' (refused)' if self.refusal else ''}"

    @property
    def applied(self) -> bool:
        return not self.refusal
