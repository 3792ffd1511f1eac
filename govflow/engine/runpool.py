"""Several claimed instance runs at once in one worker process (ADR 0041).

django-q2 gives a worker process one task at a time, and a run spends most of its time
waiting on PostgreSQL (round trips, WAL flushes). With ``GOVFLOW_WORKER_RUNS`` = K > 1 (on
PostgreSQL), the ``advance`` task of claimed runs does not run them: it hands each claim
it carries (ADR 0069) to a free one of the process's K run threads, waiting for one while
all are busy, and returns as soon as a thread is free again, so django-q2's worker takes
its next task when it can start it, and K runs overlap their waits. A worker whose
threads are all busy takes no task: the others take it. With K = 1 (and always on SQLite)
``advance`` runs the instance itself, as before.

What stays as it was:

1. **Authority.** Each run takes its claim's lease over under its own thread's holder name
   (``host:pid:thread+pg``) and writes on its own fence; a stale holder changes nothing.
   The process's liveness lock (ADR 0022) speaks for all its threads: a killed process's K
   instances are taken over at once, a paused one's when their leases run out, and its
   fences refuse whatever its threads write after it resumes.
2. **Connections.** Django's connections are per thread: each run thread keeps its own
   across runs, with the cluster's options (no health check, the idle-in-transaction
   limit: ``cluster.py``), asks ``close_old_connections`` before each run as django-q2's
   worker does before each task, and closes it when the thread ends. The keepalive thread
   (``services/keepalive.py``) renews the leases of every run's provider calls.
3. **django-q2's timeout still bounds a run.** A run that outlives ``Q_CLUSTER['timeout']``
   ends its worker process, as django-q2 ends a worker whose task outlives it; the
   sentinel starts a new one and the liveness lock hands its instances over at once.
4. **Recycling and stopping** (``Q_CLUSTER['recycle']``, ``max_rss``, a cluster's stop) let
   the runs in flight finish: the run threads are not daemons, so the process waits for
   them at its exit (each run starts no step after ``GOVFLOW_RUN_BUDGET``); a killed
   process leaves its instances to takeover, as ever.
5. **Failures are recorded.** A run that fails unexpectedly is logged and stored as a
   failed django-q2 task, as the worker stores one.

The pool exists only in the worker processes of a ``qcluster`` (:func:`run_pool_enable`,
called by ``cluster_run`` before the cluster forks); elsewhere (tests, django-q2's sync
mode, a shell) ``advance`` runs the instance itself.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field

from django.db import close_old_connections, connections
from django.utils import timezone

from recovery.api import shared_commits_enable

from .conf import shared_commit_wait, worker_runs
from .db import application_named
from .queue import ADVANCE, ADVANCE_GROUP, Claim
from .services.keepalive import keepalive
from .services.runtime import instance_run

__all__ = ["RunPool", "run_pool", "run_pool_disable", "run_pool_enable"]

log = logging.getLogger("govflow.engine")

IDLE_CHECK = 0.5
"""Seconds an idle run thread waits for a claim before it looks whether its process is
ending (its main thread has returned): then it ends too."""

WATCH_EVERY = 1.0
"""Seconds between the watchdog's looks at the runs in flight."""

EXIT_TIMEOUT = 75
"""The exit status of a worker process whose run outlived django-q2's timeout."""


@dataclass
class _Running:
    instance_id: int
    since: float = field(default_factory=time.monotonic)


class RunPool:
    """K run threads of one worker process, the claims waiting for them, a watchdog."""

    def __init__(self, size: int, *, timeout: float | None) -> None:
        self.size = size
        self.timeout = timeout
        self.free = threading.Semaphore(size)
        self.claims: queue.SimpleQueue[Claim | None] = queue.SimpleQueue()
        self.running: dict[int, _Running] = {}  # thread ident -> its run
        self.lock = threading.Lock()
        self.pid = os.getpid()
        # The runs' chained steps commit together (ADR 0062): the first waits for the runs
        # that are not in a provider call (each such call is one keepalive watch).
        shared_commits_enable(
            company=lambda: len(self.running) - keepalive.watching(), wait=shared_commit_wait()
        )
        self.threads = [
            threading.Thread(target=self._serve, name=f"govflow-run-{n}", daemon=False)
            for n in range(size)
        ]
        for thread in self.threads:
            thread.start()
        if timeout:
            threading.Thread(target=self._watch, name="govflow-run-watchdog", daemon=True).start()

    def submit(self, claim: Claim) -> None:
        """Hand ``claim`` to a run thread; wait first until one is free."""
        self.free.acquire()
        self.claims.put(claim)

    def wait_free(self) -> None:
        """Return once a run thread is free. ``advance`` returns only then, so its worker
        takes its next task from django-q2's queue only when it can start it at once: a
        worker whose threads are all busy leaves the queue to the others."""
        self.free.acquire()
        self.free.release()

    def close(self) -> None:
        """Let the runs handed over finish, then end the run threads (tests)."""
        for _ in self.threads:
            self.claims.put(None)
        for thread in self.threads:
            thread.join()

    def _serve(self) -> None:
        application_named("worker")  # this thread's connections, as its process's (ADR 0042)
        try:
            while True:
                try:
                    claim = self.claims.get(timeout=IDLE_CHECK)
                except queue.Empty:
                    if not threading.main_thread().is_alive():
                        return  # the process is ending (recycled, stopped)
                    continue
                if claim is None:
                    return
                try:
                    self._run(claim)
                finally:
                    self.free.release()
        finally:
            connections.close_all()  # this thread's own connections

    def _run(self, claim: Claim) -> None:
        me = threading.get_ident()
        started = timezone.now()
        with self.lock:
            self.running[me] = _Running(claim.instance_id)
        try:
            close_old_connections()  # as django-q2's worker does before each task
            instance_run(instance_id=claim.instance_id, claim=claim)
        except Exception:
            log.exception("instance %s: its run failed", claim.instance_id)
            failure_record(claim, started=started, result=traceback.format_exc())
        finally:
            with self.lock:
                self.running.pop(me, None)

    def oldest(self) -> _Running | None:
        with self.lock:
            return min(self.running.values(), key=lambda run: run.since, default=None)

    def _watch(self) -> None:
        while True:
            time.sleep(WATCH_EVERY)
            run = self.oldest()
            if run is not None and time.monotonic() - run.since > self.timeout:
                self.overdue(run)

    def overdue(self, run: _Running) -> None:
        """End this worker process, as django-q2 ends a worker whose task outlived its
        timeout: no thread can be stopped from outside, and a run still going after the
        timeout is stuck (its steps stop starting at ``GOVFLOW_RUN_BUDGET``)."""
        log.critical(
            "instance %s: its run has gone on for over %g s, django-q2's timeout "
            "(Q_CLUSTER['timeout']): this worker process ends, as django-q2 ends a worker "
            "whose task outlives it, and a new one is started. Its instances are taken over "
            "by the next claims (at once on PostgreSQL: its liveness lock ends with it). "
            "Look for a provider call that does not return.",
            run.instance_id,
            self.timeout,
        )
        for handler in logging.getLogger().handlers + log.handlers:
            handler.flush()
        os._exit(EXIT_TIMEOUT)


def failure_record(claim: Claim, *, started, result: str) -> None:
    """Store a failed run as django-q2's worker stores a failed task (its admin lists it)."""
    from django_q.models import Task

    task_id = uuid.uuid4().hex
    try:
        Task.objects.create(
            id=task_id,
            name=f"{ADVANCE_GROUP}-{claim.instance_id}-{task_id[:8]}",
            func=ADVANCE,
            args=(claim.instance_id,),
            kwargs={"fence": claim.fence, "holder": claim.holder, "wakeups": claim.wakeups},
            started=started,
            stopped=timezone.now(),
            result=result,
            group=ADVANCE_GROUP,
            success=False,
            attempt_count=1,
        )
    except Exception:  # never let the record of a failure end the run thread
        log.exception("instance %s: could not store its failed run", claim.instance_id)


class _State:
    enabled = False
    pool: RunPool | None = None


_STATE = _State()
_CREATE = threading.Lock()


def run_pool_enable() -> None:
    """Run claimed instances in run threads in this process's forked workers (``qcluster``)."""
    _STATE.enabled = True


def run_pool_disable() -> None:
    _STATE.enabled = False


def run_pool() -> RunPool | None:
    """This process's pool of run threads (started at first use), or None: one run at a
    time (``GOVFLOW_WORKER_RUNS`` 1, SQLite, or not a ``qcluster`` worker)."""
    if not _STATE.enabled:
        return None
    pool = _STATE.pool
    if pool is not None and pool.pid == os.getpid():
        return pool
    size = worker_runs()
    if size <= 1:
        return None
    with _CREATE:
        if _STATE.pool is None or _STATE.pool.pid != os.getpid():
            from django_q.conf import Conf

            _STATE.pool = RunPool(size, timeout=Conf.TIMEOUT)
        return _STATE.pool
