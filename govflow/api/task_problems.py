"""The problem types of a refused external-task report (all 409): each names why.

The report was kept on the task's history as a late result and not applied. A worker
that receives one of these has lost the task: it must stop and never report on it again
under that fence.
"""

from __future__ import annotations

from govflow.engine.models import Refusal

_LOST = (
    " The report was kept on the task's history as a late result and not applied. Stop "
    "working on this task; do not send the report again."
)

# (code, status, title, description), in the order of ``problems.PROBLEM_TYPES``.
TASK_PROBLEMS: tuple[tuple[str, int, str, str], ...] = (
    (
        "task-lock-expired",
        409,
        "The task's lock expired",
        "Your lock on the task expired (database clock) before the report arrived; the "
        "task goes back to the queue for another worker." + _LOST,
    ),
    (
        "task-fence-stale",
        409,
        "Another worker holds the task now",
        "The task was fetched again after your lock expired: it has a newer fence than "
        "the one you sent." + _LOST,
    ),
    (
        "task-not-holder",
        409,
        "The task is locked by another worker",
        "The worker id you sent is not the task's lock owner." + _LOST,
    ),
    (
        "task-already-done",
        409,
        "The task was already completed or dead-lettered",
        "Exactly one report ends a task; this one came after it." + _LOST,
    ),
    (
        "task-not-active",
        409,
        "The task is no longer active",
        "An operator retried the task (a new task replaced it) or cancelled its instance, "
        "or its step no longer waits for it." + _LOST,
    ),
    (
        "task-not-locked",
        409,
        "The task is not locked",
        "The task waits in the queue (after a transient failure, until its retry time); "
        "fetch and lock it first." + _LOST,
    ),
)

REFUSAL_PROBLEM = {
    Refusal.LOCK_EXPIRED: "task-lock-expired",
    Refusal.STALE_FENCE: "task-fence-stale",
    Refusal.NOT_HOLDER: "task-not-holder",
    Refusal.ALREADY_DONE: "task-already-done",
    Refusal.NOT_ACTIVE: "task-not-active",
    Refusal.NOT_LOCKED: "task-not-locked",
}
