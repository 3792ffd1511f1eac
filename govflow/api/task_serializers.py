"""Request and response shapes of the external-task endpoints (``/api/v1/tasks/…``)."""

from __future__ import annotations

from rest_framework import serializers

from govflow.engine.models import ReportKind, TaskState
from govflow.engine.services.external_queue import LOCK_SECONDS_MAX, MAX_TASKS
from govflow.engine.services.external_results import RETRY_AFTER_MAX

from .request_shape import RequestShape

TOPIC_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"
WORKER_PATTERN = r"^[\x21-\x7e]{1,200}$"


def _worker():
    return serializers.RegexField(
        WORKER_PATTERN,
        max_length=200,
        help_text="Your worker's id (1-200 visible ASCII characters): the lock's owner.",
    )


def _fence():
    return serializers.IntegerField(
        min_value=1,
        max_value=2**53 - 1,
        help_text="The fence fetch-and-lock gave you with the task: your lock token.",
    )


def _lock_duration(**kw):
    return serializers.FloatField(
        min_value=0.05,
        max_value=LOCK_SECONDS_MAX,
        help_text="How long the lock lasts, in seconds, from now (database clock).",
        **kw,
    )


class FetchAndLockRequest(RequestShape):
    worker_id = _worker()
    topics = serializers.ListField(
        child=serializers.RegexField(TOPIC_PATTERN, max_length=100),
        min_length=1,
        max_length=20,
        help_text="The topics to fetch from; the key needs the scope tasks:<topic> for each.",
    )
    lock_duration = _lock_duration()
    max_tasks = serializers.IntegerField(
        min_value=1, max_value=MAX_TASKS, default=1, help_text="At most this many tasks."
    )


class ExtendLockRequest(RequestShape):
    worker_id = _worker()
    fence = _fence()
    lock_duration = _lock_duration()


class CompleteRequest(RequestShape):
    worker_id = _worker()
    fence = _fence()
    variables = serializers.DictField(
        required=False,
        default=dict,
        help_text="The result, checked against the step's output schema; the step's "
        "output mapping takes the instance's variables from it.",
    )


class FailRequest(RequestShape):
    worker_id = _worker()
    fence = _fence()
    kind = serializers.ChoiceField(
        ["transient", "permanent"],
        help_text="transient: may succeed later (retried while the budget lasts); "
        "permanent: will not (dead-lettered at once).",
    )
    message = serializers.CharField(max_length=4000, help_text="What went wrong, for an operator.")
    retry_after = serializers.FloatField(
        required=False,
        min_value=0,
        max_value=RETRY_AFTER_MAX,
        help_text="transient only: seconds before the task may be fetched again; a "
        "doubling back-off from 10 seconds when left out.",
    )


class BpmnErrorRequest(RequestShape):
    worker_id = _worker()
    fence = _fence()
    error_code = serializers.CharField(max_length=200, help_text="The business error's code.")
    message = serializers.CharField(max_length=4000, required=False, default="")
    variables = serializers.DictField(required=False, default=dict)


class LockedTask(serializers.Serializer):
    id = serializers.IntegerField()
    url = serializers.URLField()
    topic = serializers.CharField()
    fence = serializers.IntegerField(help_text="Your lock token: send it with every report.")
    instance = serializers.IntegerField()
    step = serializers.CharField()
    tenant = serializers.CharField()
    variables = serializers.DictField(help_text="The task's input.")
    retries_left = serializers.IntegerField()
    lock_expires_at = serializers.DateTimeField()


class FetchAndLockResponse(serializers.Serializer):
    tasks = LockedTask(many=True)


class TaskReport(serializers.Serializer):
    kind = serializers.ChoiceField(ReportKind.choices)
    fence = serializers.IntegerField()
    worker = serializers.CharField(allow_blank=True)
    applied = serializers.BooleanField(help_text="false: refused, kept as a late result.")
    refusal = serializers.CharField(allow_blank=True)
    message = serializers.CharField(allow_blank=True)
    # Any JSON value, null included: the schema's "any value" holds null already (with
    # allow_null, drf-spectacular would add a second branch that null also matches).
    payload = serializers.JSONField(
        help_text="What the worker sent with the report (the variables of a completion, "
        "the details of a failure), or null."
    )
    received_at = serializers.DateTimeField()


class Task(serializers.Serializer):
    id = serializers.IntegerField()
    url = serializers.URLField()
    topic = serializers.CharField()
    state = serializers.ChoiceField(TaskState.choices)
    instance = serializers.IntegerField()
    step = serializers.CharField()
    tenant = serializers.CharField()
    fence = serializers.IntegerField()
    worker = serializers.CharField(allow_blank=True, help_text="The lock's owner.")
    lock_expires_at = serializers.DateTimeField(allow_null=True)
    fetchable_at = serializers.DateTimeField(help_text="Not fetchable before (database clock).")
    retries_left = serializers.IntegerField()
    last_error = serializers.CharField(allow_blank=True)
    variables = serializers.DictField()
    reports = TaskReport(many=True, help_text="Every report, oldest first; refused ones too.")
