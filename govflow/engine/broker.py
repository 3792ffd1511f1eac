"""GovFlow's django-q2 broker: its dequeue claims runnable instances (ADR 0026).

``Q_CLUSTER['broker_class']`` names :class:`ClaimBroker`. django-q2 keeps what it does
well — the sentinel, the worker processes and their recycling and timeouts, the
monitor, the schedules and the admin — and its pusher asks this broker for work as it
asks any broker. The dequeue:

1. claims up to one instance per run the workers run at once (``claim_batch``, ADR 0041)
   with ``queue.instances_claim`` (one statement: the runnable instances no live lease
   holds, their leases taken for the pusher), and hands them to the workers as
   ``advance`` tasks that carry the claims (instance, fence, holder, mark count): where a
   worker process runs several at once, a task carries a share of the dequeue's claims,
   at most one per run thread (``claims_per_task``, ADR 0069), else one. The worker's run
   thread (``runpool.py``) takes each lease over under its own name in the commit that
   loads the instance (``recovery.api.lease_handover``), so the liveness probes judge the
   process that runs it;
2. then takes ordinary tasks from django-q2's own queue, as the ORM broker does (the
   fallback sweep, one-off tasks): they are not instance runs.

Acknowledging a claim does nothing: there is no queue row to delete. What the run did is
in the instance, its tokens and the ledger; a run that ends clears the mark, and a run
that never ends leaves it to the next claim after its lease.
"""

from __future__ import annotations

import functools
import logging
import uuid
from datetime import timedelta
from time import monotonic, sleep
from typing import Any

from django.core.signing import TimestampSigner
from django.db import DEFAULT_DB_ALIAS, connection
from django.utils import timezone
from django_q.brokers.orm import ORM
from django_q.conf import Conf
from django_q.models import OrmQ
from django_q.signing import PickleSerializer

from recovery.api import model_columns, rows_as

from .conf import lease_ttl, worker_runs
from .db import APPLICATION, application_named
from .liveness import worker_name
from .queue import ADVANCE, ADVANCE_GROUP, Claim, instances_claim
from .services.reconnect import DROPPED

log = logging.getLogger("govflow.engine.claim")

CLAIM_ACK = "govflow-claim:"
"""The prefix of a claimed run's ack id: acknowledging it is a no-op."""


def claim_task(claim: Claim, *more: Claim) -> dict[str, Any]:
    """The django-q2 task dict of claimed instance runs (ids and numbers only): ``claim``,
    and ``more`` after it in the same task (ADR 0069). Its name counts the runs it carries:
    ``govflow-advance-<first instance>+<more>-<id>`` (``-<first instance>-`` alone)."""
    task_id = uuid.uuid4().hex
    kwargs: dict[str, Any] = {
        "fence": claim.fence,
        "holder": claim.holder,
        "wakeups": claim.wakeups,
    }
    runs = f"{claim.instance_id}"
    if more:
        kwargs["more"] = [(c.instance_id, c.fence, c.holder, c.wakeups) for c in more]
        runs += f"+{len(more)}"
    return {
        "id": task_id,
        "name": f"{ADVANCE_GROUP}-{runs}-{task_id[:8]}",
        "func": ADVANCE,
        "args": (claim.instance_id,),
        "kwargs": kwargs,
        "group": ADVANCE_GROUP,
        # The run's outcome is the instance's; a failure is still stored.
        "save": False,
        "ack_failure": True,
        "started": timezone.now(),
    }


class ClaimBroker(ORM):
    """django-q2's ORM broker, whose dequeue first claims runnable instances."""

    _queue_looked: float = float("-inf")
    """When this broker last asked django-q2's own queue (monotonic clock)."""
    _named: bool = False

    def dequeue(self) -> list[tuple[Any, str]] | None:
        if not self._named:
            self._named = True
            _pusher_named()
        self.get_connection()  # closes a connection gone stale, as the ORM broker does
        claims = _claim()
        signer = TimestampSigner(key=Conf.SECRET_KEY, salt=Conf.PREFIX)
        size = claims_per_task(len(claims))
        found = [
            (
                f"{CLAIM_ACK}{claims[at].instance_id}:{claims[at].fence}",
                signer.sign_object(
                    claim_task(*claims[at : at + size]),
                    serializer=PickleSerializer,
                    compress=Conf.COMPRESSED,
                ),
            )
            for at in range(0, len(claims), size)
        ]
        if len(claims) < claim_batch() or self._queue_due():
            found.extend(self._queued())
        if found:
            return found
        sleep(Conf.POLL)  # nothing to do: spare the CPU, as the ORM broker does
        return None

    def _queue_due(self) -> bool:
        """While claims fill whole batches, django-q2's own queue is asked once per poll
        interval, not at every dequeue: an ordinary task waits at most ``Conf.POLL`` more,
        as it would behind an idle pusher's pause (ADR 0039)."""
        return monotonic() - self._queue_looked >= Conf.POLL

    def _queued(self) -> list[tuple[Any, str]]:
        """Ordinary tasks of django-q2's queue, claimed as ``ORM.dequeue`` claims them.

        Looked up by one statement whose text is built once, not by a queryset built at
        every dequeue, when the queue is on the default database (where the claim runs).
        """
        self._queue_looked = monotonic()
        queue = OrmQ.objects.using(Conf.ORM)
        if Conf.ORM != DEFAULT_DB_ALIAS:  # django-q2's queue elsewhere: its own query
            tasks = list(queue.filter(key=self.list_key, lock__lt=timezone.now())[: Conf.BULK])
        else:
            with connection.cursor() as cursor:
                now = _lock_param(timezone.now())
                cursor.execute(_queued_sql(), [self.list_key, now, Conf.BULK])
                tasks = rows_as(OrmQ, cursor.fetchall())
        until = timezone.now() + timedelta(seconds=Conf.RETRY)
        return [
            (task.pk, task.payload)
            for task in tasks
            if queue.filter(id=task.id, lock=task.lock).update(lock=until)
        ]

    def acknowledge(self, task_id: Any) -> None:
        if not str(task_id).startswith(CLAIM_ACK):
            super().acknowledge(task_id)

    def fail(self, task_id: Any) -> None:
        if not str(task_id).startswith(CLAIM_ACK):
            super().fail(task_id)


def _pusher_named() -> None:
    """The pusher's connections name it (``db.application_named``), in a ``qcluster``
    whose processes are named: only the pusher dequeues."""
    options = connection.settings_dict.get("OPTIONS", {})
    if options.get("application_name", "").startswith(f"{APPLICATION} "):
        application_named("pusher")


@functools.cache
def _queued_sql() -> str:
    """``ORM.dequeue``'s query of django-q2's queue (a key's tasks whose lock has passed),
    its text built once."""
    meta, quote = OrmQ._meta, connection.ops.quote_name
    key, lock = (quote(meta.get_field(name).column) for name in ("key", "lock"))
    return (
        f"SELECT {model_columns(OrmQ)} FROM {quote(meta.db_table)} "
        f"WHERE {key} = %s AND {lock} < %s LIMIT %s"
    )


def _lock_param(moment):
    return OrmQ._meta.get_field("lock").get_db_prep_value(moment, connection)


def _claim() -> list[Claim]:
    """``instances_claim`` for this cluster, once more on a fresh connection if it died.

    Workers ask no health check before each use of their connection (ADR 0030), so a
    connection that died while idle is found here, at the claim; django-q2's pusher would
    otherwise log the error and pause 10 s. The claim is one statement (one transaction on
    SQLite): a failed one took nothing.
    """
    try:
        return instances_claim(holder=worker_name(), limit=claim_batch(), ttl=lease_ttl())
    except DROPPED as exc:
        if connection.in_atomic_block:
            raise
        log.warning("the claim's database connection was lost (%s); claiming again", exc)
        connection.close()
        return instances_claim(holder=worker_name(), limit=claim_batch(), ttl=lease_ttl())


def claims_per_task(claimed: int) -> int:
    """Claims one ``advance`` task carries, of ``claimed`` claimed at one dequeue (ADR 0069).

    Where worker processes run several instances at once (``worker_runs`` > 1: run
    threads), the dequeue's claims are shared out among the cluster's worker processes, a
    task each, never more than one process runs at once: django-q2's per-task work (the
    pusher's signing, the queues' pickling, the worker's log line and signals, the
    monitor's result) is paid once per task, not once per run. Else (one run at a time, as
    on SQLite) a task carries one claim, so that the runs spread over the processes."""
    runs = worker_runs()
    if runs <= 1 or claimed <= 1:
        return 1
    workers = max(1, int(Conf.WORKERS or 1))
    return min(runs, -(-claimed // workers))  # claimed > 1: at least 1


def claim_batch() -> int:
    """Instances claimed per dequeue: one per run a worker process of the cluster runs at
    once (``workers`` x ``GOVFLOW_WORKER_RUNS``, ADR 0041)."""
    return max(1, int(Conf.WORKERS or 1) * worker_runs(), int(Conf.BULK or 1))
