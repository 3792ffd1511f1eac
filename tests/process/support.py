"""Real ``qcluster`` processes for the process tests: start, kill -9, wait, dump.

A cluster runs in its own session, so its main process, sentinel, pusher, monitor and
workers share one process group, and the test stops all of them at once with
``os.killpg(pgid, SIGKILL)``: killing only the main process can leave the sentinel
running, and killing one idle worker can wedge the cluster (DESIGN.md §7). Starting and
killing the group is :mod:`scripts.procgroup`, shared with the engine benchmark.

The test process and every cluster share the pytest-django test database; the test
polls that database (with timeouts) to see what the workers did.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, TypeVar
from urllib.parse import quote

from django.db import connection
from django.db.models.functions import Now

from scripts.procgroup import ProcessGroup
from tests import waiting

BASE_DIR = Path(__file__).resolve().parents[2]
SWEEPER_LEASE = "govflow:sweeper"
SUBJECT_TYPE = "govflow.instance"

T = TypeVar("T")

# Timings short enough that a killed worker's lease expires and the sweep takes over
# within seconds. Tests override them per cluster.
FAST = {
    "GOVFLOW_LEASE_TTL": "3",
    "GOVFLOW_SWEEP_LEASE_TTL": "2",
    "GOVFLOW_SWEEP_TICK": "0.1",
    "GOVFLOW_SWEEP_FULL_EVERY": "0.5",
    "GOVFLOW_SWEEP_DURATION": "20",
    "GOVFLOW_Q_WORKERS": "2",
    "GOVFLOW_Q_POLL": "0.1",
    # The tests wait for the clusters' INFO lines (a sweeper standing by, a run started),
    # whatever level this process's environment asks for.
    "GOVFLOW_LOG_LEVEL": "INFO",
}


def database_url() -> str:
    """A ``DATABASE_URL`` for the database this test process is connected to right now."""
    s = connection.settings_dict
    user = quote(s.get("USER") or "", safe="")
    password = quote(s.get("PASSWORD") or "", safe="")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = s.get("HOST") or "localhost"
    port = f":{s['PORT']}" if s.get("PORT") else ""
    return f"postgres://{auth}{host}{port}/{quote(s['NAME'], safe='')}"


def wait_for(
    predicate: Callable[[], T],
    *,
    timeout: float,
    what: str,
    interval: float = 0.1,
    explain: Callable[[], str] | None = None,
    check_clusters: bool = True,
) -> T:
    """Poll ``predicate`` until it returns something truthy; fail loudly after ``timeout``
    (or at once if a running cluster died by itself)."""

    def look() -> T:
        if check_clusters:
            Cluster.check_running()
        return predicate()

    return waiting.wait_for(look, timeout=timeout, what=what, interval=interval, explain=explain)


class Cluster(ProcessGroup):
    """One ``manage.py qcluster`` process group."""

    running: ClassVar[list[Cluster]] = []

    def __init__(self, name: str, env: dict[str, str], log_path: Path) -> None:
        super().__init__(
            name,
            [sys.executable, str(BASE_DIR / "manage.py"), "qcluster"],
            env=env,
            cwd=BASE_DIR,
            log=log_path,
        )
        self.env = env
        self.started = time.monotonic()
        Cluster.running.append(self)

    @classmethod
    def check_running(cls) -> None:
        """Fail at once if a cluster the test did not kill has exited (e.g. at import)."""
        for cluster in cls.running:
            code = cluster.proc.poll()
            if code is not None:
                cls.running.remove(cluster)
                raise AssertionError(
                    f"cluster {cluster.name} exited by itself (status "
                    f"{code}):\n{cluster.log_tail()}"
                )

    def alive(self) -> bool:
        return not self.killed and self.proc.poll() is None

    def kill(self, timeout: float = 15) -> None:
        """SIGKILL the whole process group and wait until every member is gone."""
        if self in Cluster.running:
            Cluster.running.remove(self)
        left = super().kill(timeout)
        if left:
            raise AssertionError(
                f"timed out after {timeout:g} s waiting for every process of cluster "
                f"{self.name} to exit (still running: {sorted(left)})"
            )

    def tasks_processed(self, func: str) -> int:
        """How many tasks running ``func`` this cluster's workers picked up (from its log)."""
        text = self.log_path.read_text(errors="replace")
        return sum(1 for line in text.splitlines() if "processing" in line and f"'{func}'" in line)

    def log_tail(self, lines: int = 40) -> str:
        return self.tail(lines)


def sweeper_pid() -> int | None:
    """The pid of the process that holds the live sweeper lease, if any."""
    from recovery.models import Lease

    holder = (
        Lease.objects.filter(key=SWEEPER_LEASE, holder__isnull=False, expires_at__gt=Now())
        .values_list("holder", flat=True)
        .first()
    )
    if not holder:
        return None
    try:
        return int(holder.rsplit(":", 2)[1])
    except (IndexError, ValueError):
        return None


def wait_until_sweeping(cluster: Cluster, timeout: float = 45) -> int:
    """Wait until a worker of ``cluster`` holds the sweeper lease (the cluster is up and
    its start-up sweep, which rehydrates everything, is running)."""
    pid = wait_for(
        lambda: (pid := sweeper_pid()) in cluster.pids() and pid,
        timeout=timeout,
        what=f"cluster {cluster.name} to run the sweep",
        explain=cluster.log_tail,
    )
    print(
        f"[cluster {cluster.name}: sweeping {time.monotonic() - cluster.started:.1f} s after start]"
    )
    return pid


def subject_of(instance_id: int):
    from recovery.api import Subject

    return Subject(SUBJECT_TYPE, str(instance_id))


def operations_of(instance_id: int):
    from recovery.models import Operation

    return Operation.objects.filter(
        subject_type=SUBJECT_TYPE, subject_id=str(instance_id)
    ).order_by("chain_seq")


def checkpoints_of(instance_id: int):
    from recovery.models import Checkpoint

    return Checkpoint.objects.filter(
        subject_type=SUBJECT_TYPE, subject_id=str(instance_id)
    ).order_by("seq")


def snapshot(instance_ids: list[int]) -> dict[str, Any]:
    """Everything that must not change for finished instances, row by row."""
    from govflow.engine.models import Instance, Timer, Token

    return {
        "instances": list(
            Instance.objects.filter(pk__in=instance_ids)
            .order_by("pk")
            .values(
                "pk", "status", "reason", "variables", "next_ordinal", "updated_at", "completed_at"
            )
        ),
        "tokens": list(
            Token.objects.filter(instance_id__in=instance_ids)
            .order_by("instance_id", "ordinal")
            .values()
        ),
        "timers": list(Timer.objects.filter(instance_id__in=instance_ids).order_by("pk").values()),
        "operations": [list(operations_of(i).values()) for i in instance_ids],
        "checkpoints": [list(checkpoints_of(i).values()) for i in instance_ids],
    }


def dump(instance_id: int) -> str:
    """The instance, its tokens, timers, incidents, ledger operations and chain, as text."""
    from govflow.engine.models import Incident, Instance, Timer, Token
    from recovery.api import chain_verify
    from recovery.models import Lease

    out = [f"===== instance {instance_id} ====="]
    instance = (
        Instance.objects.filter(pk=instance_id)
        .values(
            "status",
            "reason",
            "variables",
            "next_ordinal",
            "runnable_at",
            "wakeups",
            "completed_at",
        )
        .first()
    )
    if instance is None:
        return "\n".join([*out, "(no such instance)"])
    out.append(f"status={instance['status']} reason={instance['reason'][:300]!r}")
    out.append(
        f"variables={instance['variables']} next_ordinal={instance['next_ordinal']} "
        f"runnable_at={instance['runnable_at']} wakeups={instance['wakeups']} "
        f"completed_at={instance['completed_at']}"
    )
    lease = Lease.objects.filter(key=f"instance:{instance_id}").values().first()
    out.append(f"lease={lease}")
    out.append("-- tokens")
    for t in Token.objects.filter(instance_id=instance_id).order_by("ordinal"):
        out.append(
            f"  #{t.ordinal} {t.node_id:<10} {t.state:<16} attempt={t.attempt} "
            f"poll={t.poll} wait={t.wait_kind or '-'} op={t.operation_key[:16] or '-'} "
            f"idem={t.idempotency_key[:16] or '-'} reason={t.reason[:200]!r}"
        )
    for timer in Timer.objects.filter(instance_id=instance_id):
        out.append(
            f"  timer {timer.pk}: {timer.state} due={timer.due_at} "
            f"fired={timer.fired_at} fire_fence={timer.fire_fence}"
        )
    for incident in Incident.objects.filter(instance_id=instance_id):
        out.append(f"  incident {incident.kind}: {incident.message[:200]!r}")
    out.append("-- ledger operations")
    for op in operations_of(instance_id):
        out.append(
            f"  {op.key[:20]} step={op.step_id} {op.state:<16} fence={op.fence} "
            f"ordinal={op.ordinal} rev={op.revision} idem_fp={op.idempotency_fp[:12]} "
            f"seq={op.chain_seq}"
        )
    out.append("-- chain")
    for cp in checkpoints_of(instance_id):
        out.append(
            f"  #{cp.seq} {cp.kind:<12} key={cp.key_id} link={cp.link[:12]} fact={cp.fact[:160]}"
        )
    out.append(f"chain_verify: {chain_verify(subject_of(instance_id))}")
    return "\n".join(out)


def status(instance_id: int) -> str:
    from govflow.engine.models import Instance

    return Instance.objects.values_list("status", flat=True).get(pk=instance_id)


STOPPED = ("blocked", "failed", "cancelled")


def wait_status(ws, instance_id: int, wanted: str, timeout: float = 60) -> None:
    """Wait for ``wanted``; waiting for ``completed`` fails at once if the instance stops
    (blocked, failed or cancelled) instead."""

    def reached() -> bool:
        current = status(instance_id)
        if wanted == "completed" and current in STOPPED:
            raise AssertionError(
                f"instance {instance_id} is {current}, not completing\n{ws.report()}"
            )
        return current == wanted

    wait_for(
        reached, timeout=timeout, what=f"instance {instance_id} to be {wanted}", explain=ws.report
    )


def token(instance_id: int, node_id: str):
    from govflow.engine.models import Token

    return Token.objects.get(instance_id=instance_id, node_id=node_id)


def store_calls(key: str) -> int:
    return sum(1 for _ in store_rows("SELECT 1 FROM calls WHERE key = ?", key))


def store_rows(sql: str, *params) -> list[tuple]:
    """Rows of the alpha effect store (the external system), read directly."""
    from tests.providers.alpha import effects

    conn = effects._connect()
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def failed_tasks() -> list[str]:
    """django-q2 tasks that raised (a worker that was killed leaves no row at all)."""
    from django_q.models import Task

    return [f"{t.func}{t.args}: {str(t.result)[:300]}" for t in Task.objects.filter(success=False)]


def assert_completed_cleanly(instance_id: int) -> None:
    from govflow.engine.models import InstanceStatus, Token, TokenState
    from recovery.api import OperationState, chain_verify

    report = dump(instance_id)
    assert status(instance_id) == InstanceStatus.COMPLETED, report
    states = set(Token.objects.filter(instance_id=instance_id).values_list("state", flat=True))
    assert states == {TokenState.COMPLETED}, report
    assert not operations_of(instance_id).filter(state=OperationState.OUTCOME_UNKNOWN).exists(), (
        report
    )
    assert chain_verify(subject_of(instance_id)).ok, report


def queue_mark() -> int:
    """The newest task id in the ORM broker's queue, to wait for tasks enqueued after it.

    Tasks a killed cluster had claimed stay in the queue, locked, until django-q2's
    ``retry`` period ends; a test waiting for "its" tasks must not wait for those.
    Instance runs are not queued (ADR 0026): :func:`queued` counts their marks.
    """
    from django.db.models import Max
    from django_q.models import OrmQ

    return OrmQ.objects.aggregate(mark=Max("pk"))["mark"] or 0


def queued(*, since: int = 0, group: str = "govflow-advance") -> int:
    """Work of ``group`` still to run: for instance runs (``govflow-advance``), the
    instances marked runnable, claimed or not (a run clears its mark when it ends with
    nothing left to do); for other tasks, those newer than ``since`` still in django-q2's
    queue, claimed or not (a task leaves it only once its result is saved)."""
    from django_q.models import OrmQ

    from govflow.engine.models import Instance

    if group == "govflow-advance":
        return Instance.objects.filter(runnable_at__isnull=False).count()
    return sum(1 for row in OrmQ.objects.filter(pk__gt=since) if row.group() == group)


def wait_queue_drained(
    ws, *, since: int = 0, timeout: float = 90, group: str = "govflow-advance"
) -> None:
    wait_for(
        lambda: queued(since=since, group=group) == 0,
        timeout=timeout,
        interval=0.25,
        what=f"every {group} task queued after #{since} to run",
        explain=ws.report,
    )


def db_seconds(seconds: float):
    """A duration to add to or subtract from ``Now()`` in a query (database clock)."""
    import datetime as dt

    from django.db.models import DurationField, Value

    return Value(dt.timedelta(seconds=seconds), output_field=DurationField())
