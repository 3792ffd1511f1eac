"""The worker loop: fetch and lock, run the handler while the lock is renewed, report.

A handler takes a :class:`~.http.LockedTask` and returns the variables to complete it
with; it raises :class:`~.http.TaskFailure` or :class:`~.http.BpmnError` to say it
failed, and any other exception is reported as a transient failure.

The lock is renewed in the background every third of its duration while the handler
runs. Once renewal is refused (the lock was lost) or the lock's deadline has passed on
this machine's monotonic clock — measured from when the lock was *asked for*, so never
later than the server's expiry — nothing is reported for the task: another worker may
hold it, and its report is the one that counts. :meth:`Worker.stop` (or SIGTERM/SIGINT
with :meth:`Worker.run_forever`) lets the running handler finish and report, then stops
fetching.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from .http import ApiError, BpmnError, LockedTask, LockLost, TaskClient, TaskFailure

log = logging.getLogger("govflow.client")

Handler = Callable[[LockedTask], dict[str, Any] | None]
# Reports are not sent this close to the lock's deadline: the request could arrive late.
SAFETY_MARGIN = 0.5


class Worker:
    """Fetches tasks of ``handlers``' topics and runs the handler of each."""

    def __init__(
        self,
        client: TaskClient,
        worker_id: str,
        handlers: dict[str, Handler],
        *,
        lock_duration: float = 30.0,
        max_tasks: int = 1,
        poll_interval: float = 1.0,
    ) -> None:
        self.client = client
        self.worker_id = worker_id
        self.handlers = dict(handlers)
        self.lock_duration = lock_duration
        self.max_tasks = max_tasks
        self.poll_interval = poll_interval
        self.stopping = threading.Event()
        self.reported: list[tuple[int, str]] = []
        """(task id, what was reported: complete, fail, bpmn-error, lost), in order."""

    def stop(self) -> None:
        """Finish the task at hand (and report it if the lock is still ours), then stop."""
        self.stopping.set()

    def run_forever(self) -> None:
        """Run until SIGTERM or SIGINT (then stop gracefully)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop())
        self.run()

    def run(self) -> None:
        while not self.stopping.is_set():
            if not self.run_once():
                self.stopping.wait(self.poll_interval)

    def run_once(self) -> int:
        """Fetch one batch and work through it; returns how many tasks it got."""
        try:
            tasks = self.client.fetch_and_lock(
                worker_id=self.worker_id,
                topics=sorted(self.handlers),
                lock_duration=self.lock_duration,
                max_tasks=self.max_tasks,
            )
        except (ApiError, OSError) as exc:
            log.warning("fetch-and-lock failed: %s", exc)
            return 0
        for task in tasks:
            self.process(task)
        return len(tasks)

    def process(self, task: LockedTask) -> None:
        """Run the handler under a renewed lock, then report — unless the lock was lost."""
        lost = threading.Event()
        done = threading.Event()
        renewer = threading.Thread(
            target=self._renew, args=(task, lost, done), name=f"lock-{task.id}", daemon=True
        )
        renewer.start()
        try:
            outcome = self._run_handler(task)
        finally:
            done.set()
            renewer.join()
        if lost.is_set() or time.monotonic() > task.deadline - SAFETY_MARGIN:
            log.warning("task %s: the lock was lost; nothing is reported", task.id)
            self.reported.append((task.id, "lost"))
            return
        self._report(task, outcome)

    def _run_handler(self, task: LockedTask):
        try:
            return ("complete", self.handlers[task.topic](task) or {})
        except TaskFailure as exc:
            return ("fail", exc)
        except BpmnError as exc:
            return ("bpmn-error", exc)
        except Exception as exc:
            log.exception("task %s: the handler raised", task.id)
            return ("fail", TaskFailure(f"{type(exc).__name__}: {exc}"))

    def _renew(self, task: LockedTask, lost: threading.Event, done: threading.Event) -> None:
        while not done.wait(self.lock_duration / 3):
            try:
                self.client.extend_lock(task, self.lock_duration)
            except LockLost:
                lost.set()
                return
            except (ApiError, OSError) as exc:  # try again; the deadline still guards
                log.warning("task %s: renewing the lock failed: %s", task.id, exc)

    def _report(self, task: LockedTask, outcome) -> None:
        kind, value = outcome
        try:
            if kind == "complete":
                self.client.complete(task, value)
            elif kind == "bpmn-error":
                self.client.bpmn_error(task, value.code, str(value), value.variables)
            else:
                self.client.fail(
                    task, str(value), permanent=value.permanent, retry_after=value.retry_after
                )
        except LockLost as exc:
            log.warning("task %s: the report was refused: %s", task.id, exc)
            kind = "lost"
        except (ApiError, OSError) as exc:
            log.error("task %s: the report could not be sent: %s", task.id, exc)
            kind = "unsent"
        self.reported.append((task.id, kind))
