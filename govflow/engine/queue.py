"""Enqueueing work for django-q2 workers. Tasks carry ids only.

With the ORM broker on the default database, an enqueue inside a transaction commits or
rolls back with it: work is never queued for a change that did not happen.

``enqueue_many`` writes the packages django-q2's ``async_task`` would write (the same task
dict, signed by ``SignedPackage``), but for any number of instances in one bulk INSERT
into the ORM broker's queue table: ``async_task`` costs an INSERT, a pickle and a
signature per call, which is most of the time the sweep needs to fire thousands of due
timers at once.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from django.core.signing import TimestampSigner
from django.db import connection, connections
from django.utils import timezone

from .db import engine_dialect
from .models import Instance

ADVANCE = "govflow.engine.tasks.advance"
ADVANCE_GROUP = "govflow-advance"
SWEEP = "govflow.engine.tasks.sweep"
SWEEP_GROUP = "govflow-sweep"

# Rows per INSERT into the queue and ids per UPDATE of ``enqueued_at``: 2,000 rows of
# three columns stay far below PostgreSQL's 65,535 bind parameters per statement.
BULK_BATCH = 2000


def enqueue_advance(instance_id: int) -> None:
    """Queue one ``advance`` task (see :func:`enqueue_many`: in the caller's commit)."""
    enqueue_many([instance_id])


def task_package(func: str, *args: Any, group: str) -> dict[str, Any]:
    """The task dict ``async_task(func, *args, group=group)`` builds, before it is signed.

    One difference: the display name is ``<group>-<first argument>-<8 hex digits>``
    (``govflow-advance-42-1f0c9a3b``: which instance, in the admin's task lists) rather
    than django-q2's human hash, which costs more than the rest of the package together.
    """
    from django_q.conf import Conf

    task_id = uuid.uuid4().hex
    label = f"{group}-{args[0]}" if args else group
    task: dict[str, Any] = {
        "id": task_id,
        "name": f"{label}-{task_id[:8]}"[:100],
        "func": func,
        "args": args,
    }
    task["group"] = group
    if Conf.CACHED:
        task["cached"] = Conf.CACHED
    if Conf.ACK_FAILURES:
        task["ack_failure"] = Conf.ACK_FAILURES
    task["kwargs"] = {}
    task["started"] = timezone.now()
    return task


def enqueue_many(instance_ids: Iterable[int]) -> int:
    """Queue one ``advance`` task per distinct instance and stamp their ``enqueued_at``.

    Needs the caller's commit: the one whose change the tasks act on, so that with the
    ORM broker the queue rows commit or roll back with it. Other brokers (and django-q2's
    sync mode) get their packages one by one, through the broker as ``async_task`` would.
    """
    from django_q.brokers import get_broker
    from django_q.brokers.orm import ORM
    from django_q.conf import Conf
    from django_q.signals import pre_enqueue
    from django_q.signing import PickleSerializer
    from django_q.tasks import async_task

    ids = list(dict.fromkeys(int(pk) for pk in instance_ids))
    if not ids:
        return 0
    if Conf.SYNC:
        # Sync mode runs each task in the caller as it is enqueued; keep django-q2's path.
        for instance_id in ids:
            async_task(ADVANCE, instance_id, group=ADVANCE_GROUP)
    else:
        # ``SignedPackage.dumps`` is ``signing.dumps``, which builds this signer per call.
        signer = TimestampSigner(key=Conf.SECRET_KEY, salt=Conf.PREFIX)
        packages = []
        for instance_id in ids:
            task = task_package(ADVANCE, instance_id, group=ADVANCE_GROUP)
            pre_enqueue.send(sender="django_q", task=task)
            packages.append(
                signer.sign_object(task, serializer=PickleSerializer, compress=Conf.COMPRESSED)
            )
        broker = get_broker()
        if isinstance(broker, ORM):
            # What ``ORM.enqueue`` writes, row for row: the lock is "now", so the task is
            # free to be claimed at once.
            _insert_packages(Conf.ORM, broker.list_key or Conf.CLUSTER_NAME, packages)
        else:
            for package in packages:
                broker.enqueue(package)
    for start in range(0, len(ids), BULK_BATCH):
        _stamp_enqueued(ids[start : start + BULK_BATCH])
    return len(ids)


def _insert_packages(alias: str, key: str, packages: list[str]) -> None:
    """Every package in one INSERT with one list parameter, in the caller's transaction."""
    from django_q.models import OrmQ

    connection = connections[alias]
    d = engine_dialect(connection)
    lock = OrmQ._meta.get_field("lock").get_db_prep_value(timezone.now(), connection)
    table = connection.ops.quote_name(OrmQ._meta.db_table)
    for start in range(0, len(packages), BULK_BATCH):
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {table} (key, payload, lock) SELECT %s, value, %s FROM {d.text_rows}",
                [key, lock, d.list_param(packages[start : start + BULK_BATCH])],
            )


def _stamp_enqueued(ids: list[int]) -> None:
    """Stamp the instances' ``enqueued_at`` (database clock), in the caller's transaction.

    Not fenced: ``enqueued_at`` is no state of the instance, only when a task for it was
    last queued (the sweep's hint), and every caller queues under its own authority (the
    instance's, the sweeper's, a delivery's lease) or creates the instance.
    """
    d = engine_dialect()
    with connection.cursor() as cursor:
        # One list parameter instead of an IN list of thousands: one prepared statement.
        cursor.execute(
            f"UPDATE {Instance._meta.db_table} SET enqueued_at = {d.now} WHERE id {d.id_in}",
            [d.list_param(ids)],
        )


def enqueue_sweep() -> None:
    """Queue the fallback sweep task (django-q2's ``async_task``: its own write)."""
    from django_q.tasks import async_task

    async_task(SWEEP, group=SWEEP_GROUP)
