"""The sweeper in a ``qcluster``'s main process (ADR 0005).

GovFlow's ``manage.py qcluster`` starts django-q2's cluster exactly as django-q2 does,
then runs a :class:`SweeperThread` in the main process, which otherwise only waits for
its sentinel. The thread sweeps while it holds the ``govflow:sweeper`` lease and stands
by while another cluster's sweeper holds it, so every cluster is ready to take over within
a lease period. It never waits in django-q2's queue behind the work it creates.

Order matters: the sentinel is forked from the main process, and a fork while another
thread holds a database connection would hand the child a copy of that connection (and
of any lock the thread held). So the main thread closes its connections, the cluster is
started, and only then does the thread start; django-q2 forks nothing else from the main
process afterwards (the sentinel forks the workers).

A :class:`PublisherThread` beside it delivers the event outbox's webhooks
(``govflow.events.publisher``, ADR 0032), fenced by its own ``govflow:publisher`` lease in
the same way: one publishes, the other clusters stand by.

On PostgreSQL each process of the cluster that names itself as a lease holder holds its
liveness lock on a connection of its own (``liveness.py``, ADR 0022), so a sweeper on any
host sees at once that the cluster was killed.
"""

from __future__ import annotations

import logging
import threading
import time

from django.db import connections
from django_q.cluster import Cluster
from django_q.signals import post_spawn

from govflow.events.publisher import Publisher

from .conf import lease_ttl
from .db import application_named
from .liveness import holder_is_dead, liveness_lock_disable, liveness_lock_enable, worker_name
from .runpool import run_pool_disable, run_pool_enable
from .services.sweep import Sweeper

log = logging.getLogger("govflow.engine.sweep")

RESTART_AFTER = 2.0
"""Seconds the thread waits after an unexpected error (the database is unreachable,
say) before it stands by again."""


class SweeperThread(threading.Thread):
    """A standby sweeper for as long as the cluster runs; set ``stop_event`` to end it."""

    def __init__(self, *, stop_event: threading.Event) -> None:
        super().__init__(name="govflow-sweeper", daemon=True)
        self.stop_event = stop_event

    def run(self) -> None:
        application_named("sweeper")
        try:
            self.sweep_until_stopped()
        finally:
            # This thread's own connections: nobody else uses them.
            connections.close_all()

    def sweep_until_stopped(self) -> None:
        """Stand by, sweep while holding the lease, release it when stopped.

        An error (a lost database connection, say) must not end the cluster's sweeper:
        the connection is dropped and the loop starts again after a short pause. The
        lease, if it was held, expires by itself if it could not be released.
        """
        while not self.stop_event.is_set():
            try:
                Sweeper(stop=self.stop_event).run(standby=True)
            except Exception:
                log.exception("the sweeper failed; it stands by again in %g s", RESTART_AFTER)
                for conn in connections.all(initialized_only=True):
                    if not conn.in_atomic_block:
                        conn.close()
                self.stop_event.wait(RESTART_AFTER)


class PublisherThread(threading.Thread):
    """A standby publisher for as long as the cluster runs; set ``stop_event`` to end it.

    Its webhook calls may take up to ``GOVFLOW_WEBHOOK_TIMEOUT`` each, which is why it is
    a thread of its own and not a part of the sweep. Errors are handled as the sweeper's.
    """

    def __init__(self, *, stop_event: threading.Event) -> None:
        super().__init__(name="govflow-publisher", daemon=True)
        self.stop_event = stop_event

    def run(self) -> None:
        application_named("publisher")
        try:
            while not self.stop_event.is_set():
                try:
                    Publisher(
                        holder=worker_name(), stop=self.stop_event, is_dead=holder_is_dead
                    ).run(standby=True)
                except Exception:
                    log.exception("the publisher failed; it stands by again in %g s", RESTART_AFTER)
                    for conn in connections.all(initialized_only=True):
                        if not conn.in_atomic_block:
                            conn.close()
                    self.stop_event.wait(RESTART_AFTER)
        finally:
            connections.close_all()


class SweepingCluster(Cluster):
    """django-q2's cluster; a stop signal also stops the sweeper thread of this process.

    The sweeper is told first, so it releases its lease (and a standby elsewhere takes
    over) while django-q2 still waits for its workers to finish their tasks.
    """

    def __init__(self, *, sweeper_stop: threading.Event) -> None:
        self.sweeper_stop = sweeper_stop
        super().__init__()

    def sig_handler(self, signum, frame) -> None:
        self.sweeper_stop.set()
        super().sig_handler(signum, frame)


def health_checks_off() -> None:
    """No ``CONN_HEALTH_CHECKS`` in this process and the ones it forks (ADR 0030).

    Django's health check is a ``SELECT 1`` before the first statement after every
    ``close_old_connections``: django-q2 calls that before each task, and the pusher before
    each poll, so it cost a round trip per instance run and five a second per idle
    cluster. A worker finds a dead connection at its first statement instead and makes
    that statement's commit again on a fresh one (``runtime``, ``broker``); the web
    processes keep the setting as configured.
    """
    for conn in connections.all(initialized_only=False):
        conn.settings_dict["CONN_HEALTH_CHECKS"] = False
        conn.health_check_enabled = False


def idle_transactions_ended() -> None:
    """PostgreSQL ends a session of this process idle in a transaction for a lease TTL.

    A worker stopped (SIGSTOP, a debugger, a swapped-out host) inside a transaction keeps
    its row locks: the ``FOR SHARE`` on its lease row taken by a fenced write makes the
    next holder's takeover wait for as long as the worker is stopped, though its lease
    expired. With ``idle_in_transaction_session_timeout`` at the lease TTL the server
    ends such a session — and with it the locks — once the lease could have expired; the
    stopped worker's transaction rolls back and it could not have committed anything
    fenced after its lease expired anyway. Set for new connections of this process and
    the ones it forks (ADR 0035); web processes are not changed.
    """
    for conn in connections.all(initialized_only=False):
        if conn.vendor == "postgresql":
            conn.settings_dict["OPTIONS"] = idle_limited(
                conn.settings_dict.get("OPTIONS", {}), seconds=lease_ttl()
            )


def idle_limited(options: dict, *, seconds: float) -> dict:
    """``options`` with ``idle_in_transaction_session_timeout`` at ``seconds`` added to
    the server options (libpq's ``options``), unless they set it already."""
    given = options.get("options", "")
    if "idle_in_transaction_session_timeout" in given:
        return options
    limit = f"-c idle_in_transaction_session_timeout={max(1, round(seconds * 1000))}"
    return {**options, "options": f"{given} {limit}".strip()}


def _worker_named(sender, **kwargs) -> None:
    application_named("worker")


def cluster_run(*, run_once: bool = False, join_timeout: float = 15.0) -> None:
    """Start the cluster as django-q2's ``qcluster`` does, then sweep until it stops."""
    health_checks_off()
    idle_transactions_ended()
    application_named("qcluster")
    post_spawn.connect(_worker_named, dispatch_uid="govflow-worker-named")
    # Every process of the cluster (this one, and the workers forked after this) holds
    # its own liveness lock once it names itself as a lease holder (ADR 0022).
    liveness_lock_enable()
    # Its workers run up to GOVFLOW_WORKER_RUNS claimed instances at once (ADR 0041).
    run_pool_enable()
    try:
        _run(run_once=run_once, join_timeout=join_timeout)
    finally:
        run_pool_disable()
        liveness_lock_disable()


def _run(*, run_once: bool, join_timeout: float) -> None:
    stop = threading.Event()
    cluster = SweepingCluster(sweeper_stop=stop)
    # The sentinel is forked from this process: it must not inherit an open connection.
    connections.close_all()
    cluster.start()
    if run_once:
        cluster.stop()
        return
    if stop.is_set():  # a stop signal came while the cluster was starting
        return
    thread = SweeperThread(stop_event=stop)
    thread.start()
    publisher = PublisherThread(stop_event=stop)
    publisher.start()
    try:
        # django-q2's command returns here and the interpreter waits for the sentinel at
        # exit; this process waits for it here instead. A stop signal runs the cluster's
        # handler in this thread, which returns once the sentinel has stopped.
        while cluster.sentinel.is_alive():
            time.sleep(0.5)
    finally:
        stop.set()
        thread.join(timeout=join_timeout)
        if thread.is_alive():
            log.warning("the sweeper did not stop within %g s; its lease will expire", join_timeout)
        publisher.join(timeout=join_timeout)
        if publisher.is_alive():
            log.warning(
                "the publisher did not stop within %g s; its lease will expire", join_timeout
            )
