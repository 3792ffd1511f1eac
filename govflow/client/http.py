"""The HTTP side of the worker client: one method per external-task endpoint."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import requests

LOST_CODES = frozenset(
    {
        "task-lock-expired",
        "task-fence-stale",
        "task-not-holder",
        "task-already-done",
        "task-not-active",
        "task-not-locked",
    }
)
# Worth sending again (with the same Idempotency-Key): the instance was busy, too many
# requests, or the server failed before it could answer.
_AGAIN = frozenset({409, 429, 500, 502, 503, 504})


class ApiError(Exception):
    """The API answered with a problem (RFC 9457); ``problem`` is its body."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        self.status = status
        self.problem = problem
        self.code = str(problem.get("code", ""))
        super().__init__(f"{status} {self.code}: {problem.get('detail', problem)}")


class LockLost(ApiError):
    """The task is no longer ours: the report was refused (and kept as a late result)."""


class TaskFailure(Exception):
    """Raise from a handler: the work failed. ``permanent`` dead-letters the task at
    once; otherwise it is retried after ``retry_after`` seconds while retries are left."""

    def __init__(
        self, message: str, *, permanent: bool = False, retry_after: float | None = None
    ) -> None:
        self.permanent = permanent
        self.retry_after = retry_after
        super().__init__(message)


class BpmnError(Exception):
    """Raise from a handler: a business error (the work cannot be done as asked)."""

    def __init__(self, code: str, message: str = "", variables: dict | None = None) -> None:
        self.code = code
        self.variables = variables or {}
        super().__init__(message)


@dataclass
class LockedTask:
    """A task this worker locked, as fetch-and-lock answered it."""

    id: int
    fence: int
    topic: str
    instance: int
    step: str
    tenant: str
    variables: dict[str, Any]
    retries_left: int
    lock_expires_at: str
    worker_id: str = ""
    deadline: float = field(default=0.0, repr=False)
    """``time.monotonic()`` by which the lock has surely expired (from when it was asked)."""


def idempotency_key(task: LockedTask, report: str) -> str:
    """The Idempotency-Key of a report: the same for a report sent again, another for
    every task, fence and kind of report. Handlers may use ``task-<id>`` (without the
    fence) as the key of their own side effect: it is the same on every delivery."""
    return f"task-{task.id}-{task.fence}-{report}"


class TaskClient:
    """The external-task endpoints of one GovFlow server, for one API key."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 10.0,
        attempts: int = 5,
        session: requests.Session | None = None,
    ) -> None:
        self.base = base_url.rstrip("/") + "/api/v1/tasks/"
        self.timeout = timeout
        self.attempts = attempts
        self.session = session or requests.Session()
        self.session.headers["Authorization"] = f"Api-Key {api_key}"

    def _post(self, path: str, body: dict[str, Any], key: str | None) -> dict[str, Any]:
        """POST with the Idempotency-Key ``key``; sent again on a busy or failed server."""
        headers = {"Idempotency-Key": key} if key else {}
        for attempt in range(self.attempts):
            try:
                response = self.session.post(
                    self.base + path, json=body, headers=headers, timeout=self.timeout
                )
            except requests.ConnectionError:
                if attempt + 1 == self.attempts:
                    raise
                time.sleep(min(5.0, 0.2 * 2**attempt))
                continue
            if response.status_code < 400:
                return response.json()
            problem = _problem(response)
            if problem.get("code") in LOST_CODES:
                raise LockLost(response.status_code, problem)
            if response.status_code not in _AGAIN or attempt + 1 == self.attempts:
                raise ApiError(response.status_code, problem)
            wait = response.headers.get("Retry-After")
            time.sleep(min(5.0, float(wait) if wait else 0.2 * 2**attempt))
        raise AssertionError("unreachable")

    def fetch_and_lock(
        self, *, worker_id: str, topics: list[str], lock_duration: float, max_tasks: int = 1
    ) -> list[LockedTask]:
        asked = time.monotonic()
        body = {
            "worker_id": worker_id,
            "topics": topics,
            "lock_duration": lock_duration,
            "max_tasks": max_tasks,
        }
        answer = self._post("fetch-and-lock/", body, None)
        fields = LockedTask.__dataclass_fields__
        return [
            LockedTask(
                **{k: v for k, v in item.items() if k in fields},
                worker_id=worker_id,
                deadline=asked + lock_duration,
            )
            for item in answer["tasks"]
        ]

    def extend_lock(self, task: LockedTask, lock_duration: float) -> None:
        asked = time.monotonic()
        body = {"worker_id": task.worker_id, "fence": task.fence, "lock_duration": lock_duration}
        # Not idempotent on purpose: each renewal is a new request for a new expiry.
        self._post(f"{task.id}/extend-lock/", body, None)
        task.deadline = asked + lock_duration

    def complete(self, task: LockedTask, variables: dict[str, Any]) -> dict[str, Any]:
        body = {"worker_id": task.worker_id, "fence": task.fence, "variables": variables}
        return self._post(f"{task.id}/complete/", body, idempotency_key(task, "complete"))

    def fail(
        self,
        task: LockedTask,
        message: str,
        *,
        permanent: bool = False,
        retry_after: float | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "worker_id": task.worker_id,
            "fence": task.fence,
            "kind": "permanent" if permanent else "transient",
            "message": message[:4000] or "(no message)",
        }
        if retry_after is not None:
            body["retry_after"] = retry_after
        return self._post(f"{task.id}/fail/", body, idempotency_key(task, "fail"))

    def bpmn_error(
        self, task: LockedTask, code: str, message: str = "", variables: dict | None = None
    ) -> dict[str, Any]:
        body = {
            "worker_id": task.worker_id,
            "fence": task.fence,
            "error_code": code,
            "message": message[:4000],
            "variables": variables or {},
        }
        return self._post(f"{task.id}/bpmn-error/", body, idempotency_key(task, "bpmn-error"))


def _problem(response: requests.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        body = None
    return body if isinstance(body, dict) else {"detail": response.text[:500]}
