"""``govflow.client``: a worker for GovFlow's external tasks, over the REST API.

Plain Python — the standard library and ``requests`` (``pip install govflow[client]``);
nothing of Django. :class:`TaskClient` speaks the endpoints under ``/api/v1/tasks/``;
:class:`Worker` runs the fetch-and-lock loop, renews each lock while its handler runs,
and stops gracefully. ``docs/integrations.md`` ("A worker in Python") has an example.

Guarantees, as the server gives them: exactly one report changes a task's step; a
handler's side effects happen at least once (a task whose lock expired is given to
another worker), so a handler makes its effect idempotent — :func:`idempotency_key`
gives it a key that is the same for every delivery of a task.
"""

from .http import (
    ApiError,
    BpmnError,
    LockedTask,
    LockLost,
    TaskClient,
    TaskFailure,
    idempotency_key,
)
from .worker import Worker

__all__ = [
    "ApiError",
    "BpmnError",
    "LockLost",
    "LockedTask",
    "TaskClient",
    "TaskFailure",
    "Worker",
    "idempotency_key",
]
