"""What the driver writes and reads in GovFlow's database: starts, progress, timings.

Everything here runs in the driver after :func:`bench.engine.govflow_side.setup_django`;
times come from the database clock.
"""

from __future__ import annotations

import datetime as dt
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .procs import wait_until

STEPS = 5
ACTION_NODES = tuple(f"s{i}" for i in range(1, STEPS + 1))
"""The five-no-op definition's action nodes (not its ``start`` node)."""
EFFECTS_TABLE = "bench_effect"
"""Where ``bench.effect`` (``make chaos``) writes a row each time it makes its effect:
outside the engine's tables and transactions, on the provider's own connection."""


@dataclass
class Poller:
    """Counts the driver's own queries, to subtract them from the server's counters."""

    queries: int = 0

    def status_counts(self, first: int, last: int) -> dict[str, int]:
        from django.db.models import Count

        from govflow.engine.models import Instance

        self.queries += 1
        rows = (
            Instance.objects.filter(pk__gte=first, pk__lte=last)
            .values_list("status")
            .annotate(n=Count("pk"))
        )
        return {str(status): n for status, n in rows}

    def steps_done(self, first: int, last: int) -> int:
        from govflow.engine.models import Token

        self.queries += 1
        return Token.objects.filter(
            instance_id__gte=first,
            instance_id__lte=last,
            state="completed",
            node_id__in=ACTION_NODES,
        ).count()


SETTLED = ("completed", "blocked", "failed", "cancelled")


def wait_settled(poller: Poller, ids: list[int], *, timeout: float, groups=()) -> dict[str, int]:
    first, last = ids[0], ids[-1]
    counts: dict[str, int] = {}

    def settled() -> bool:
        counts.clear()
        counts.update(poller.status_counts(first, last))
        return sum(counts.get(s, 0) for s in SETTLED) >= len(ids)

    wait_until(settled, timeout=timeout, what=f"{len(ids)} instances to settle", groups=groups)
    return dict(counts)


def span(ids: list[int]) -> tuple[dt.datetime, dt.datetime]:
    """(first created, last completed or blocked) of the instances, database clock."""
    from django.db.models import Max, Min

    from govflow.engine.models import Instance

    qs = Instance.objects.filter(pk__gte=ids[0], pk__lte=ids[-1])
    first = qs.aggregate(t=Min("created_at"))["t"]
    done = qs.filter(status="completed").aggregate(t=Max("completed_at"))["t"]
    other = qs.exclude(status="completed").aggregate(t=Max("updated_at"))["t"]
    return first, max(t for t in (done, other) if t is not None)


def tasks_enqueued() -> int:
    """django-q2 tasks ever enqueued on this database (the queue's id sequence)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(max(id), 0) FROM ("
            "SELECT max(id) AS id FROM django_q_ormq UNION ALL "
            "SELECT last_value FROM django_q_ormq_id_seq WHERE is_called) t"
        )
        return int(cursor.fetchone()[0])


def in_flight(ids: list[int]) -> dict[str, set[int]]:
    """Instances a killed cluster left behind: leased/executing, or with a claimed task."""
    from django.db.models.functions import Now
    from django_q.models import OrmQ
    from django_q.signing import SignedPackage

    from govflow.engine.models import Token
    from recovery.models import Lease

    first, last = ids[0], ids[-1]
    executing = set(
        Token.objects.filter(
            instance_id__gte=first, instance_id__lte=last, state="executing"
        ).values_list("instance_id", flat=True)
    )
    leased = {
        int(key.split(":", 1)[1])
        for key in Lease.objects.filter(
            key__startswith="instance:", holder__isnull=False, expires_at__gt=Now()
        ).values_list("key", flat=True)
    }
    claimed = set()
    for payload in OrmQ.objects.filter(lock__gt=Now()).values_list("payload", flat=True):
        task = SignedPackage.loads(payload)
        if task.get("func") == "govflow.engine.tasks.advance" and task.get("args"):
            claimed.add(int(task["args"][0]))
    inside = set(range(first, last + 1))
    return {
        "executing": executing & inside,
        "leased": leased & inside,
        "claimed": claimed & inside,
    }


def settled_times(ids: set[int], since: dt.datetime) -> float | None:
    """Seconds from ``since`` until the last of ``ids`` settled (database clock)."""
    from django.db.models import Max

    from govflow.engine.models import Instance

    if not ids:
        return None
    qs = Instance.objects.filter(pk__in=ids)
    done = qs.filter(status="completed").aggregate(t=Max("completed_at"))["t"]
    other = qs.exclude(status="completed").aggregate(t=Max("updated_at"))["t"]
    last = max(t for t in (done, other) if t is not None)
    return (last - since).total_seconds()


def first_step_since(ids: list[int], since: dt.datetime) -> float | None:
    """Seconds from ``since`` until the first action step of ``ids`` completed after it
    (the completed token's ``updated_at``, database clock)."""
    from django.db.models import Min

    from govflow.engine.models import Token

    first = Token.objects.filter(
        instance_id__gte=ids[0],
        instance_id__lte=ids[-1],
        state="completed",
        node_id__in=ACTION_NODES,
        updated_at__gte=since,
    ).aggregate(t=Min("updated_at"))["t"]
    return None if first is None else (first - since).total_seconds()


def taken_over_since(ids: set[int], since: dt.datetime) -> tuple[int, float | None]:
    """(how many of ``ids`` were written again after ``since``, seconds until the last).

    For an instance a killed cluster stranded, the first checkpoint its chain got after
    the restart is the new cluster's run of it taking over (``recorded_at``: checkpoints
    are only ever appended). Not a lease's ``acquired_at`` or a token's ``updated_at``:
    those are the latest acquisition and the latest change, which a later run (an
    unknown outcome's reconciliation, say) moves past the takeover."""
    from django.db.models import Min

    from govflow.engine.projection import SUBJECT_TYPE
    from recovery.models import Checkpoint

    firsts = (
        Checkpoint.objects.filter(
            subject_type=SUBJECT_TYPE,
            subject_id__in=[str(pk) for pk in ids],
            recorded_at__gte=since,
        )
        .values("subject_id")
        .annotate(t=Min("recorded_at"))
        .values_list("t", flat=True)
    )
    moments = list(firsts)
    last = max(moments, default=None)
    return len(moments), None if last is None else (last - since).total_seconds()


def held_leases(ids: list[int], pids: set[int] | None = None) -> dict[str, int]:
    """``{key: fence}`` of the live instance leases among ``ids`` (database clock); with
    ``pids``, only those whose holder is one of these processes (a cluster's group)."""
    from django.db.models.functions import Now

    from recovery.models import Lease

    keys = [f"instance:{pk}" for pk in ids]
    rows = Lease.objects.filter(
        key__in=keys, holder__isnull=False, expires_at__gt=Now()
    ).values_list("key", "fence", "holder")
    return {key: fence for key, fence, holder in rows if pids is None or holder_pid(holder) in pids}


def takeover_progress(held: dict[str, int]) -> tuple[set[str], set[str]]:
    """Of the leases a stopped cluster ``held`` ({key: fence}): (taken over: another
    holder's newer fence; released: no holder, the same fence, and no run due).

    A lease released at its fence while its holder is stopped was released by a commit
    the holder had sent before the stop took hold (the instance ended, or waits): there is
    nothing to take over. Released with a run due, another holder's claim is still to
    come, and it counts once taken.
    """
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT l.key, l.fence, l.holder IS NULL AND (i.runnable_at IS NULL "
            "OR i.runnable_at > clock_timestamp()) FROM recovery_lease l "
            "JOIN engine_instance i ON l.key = 'instance:' || i.id WHERE l.key = ANY(%s)",
            [list(held)],
        )
        rows = cursor.fetchall()
    taken = {key for key, fence, _ in rows if fence > held[key]}
    released = {key for key, fence, idle in rows if fence == held[key] and idle}
    return taken, released


def fences_of(keys: list[str]) -> dict[str, int]:
    from recovery.models import Lease

    return dict(Lease.objects.filter(key__in=keys).values_list("key", "fence"))


def sweeper_holder() -> str | None:
    """The holder of the live ``govflow:sweeper`` lease, or None."""
    from django.db.models.functions import Now

    from govflow.engine.services.sweep import SWEEPER
    from recovery.models import Lease

    return (
        Lease.objects.filter(key=SWEEPER, holder__isnull=False, expires_at__gt=Now())
        .values_list("holder", flat=True)
        .first()
    )


def holder_pid(holder: str) -> int | None:
    """The pid in a lease holder ``hostname:pid:thread`` (``worker_name``)."""
    try:
        return int(holder.rsplit(":", 2)[1])
    except (IndexError, ValueError):
        return None


def sweeper_acquired_since(pgid: int, since: dt.datetime) -> float | None:
    """Seconds from ``since`` until the process ``pgid`` took the sweeper lease it holds
    now; None if another process holds it."""
    from govflow.engine.services.sweep import SWEEPER
    from recovery.models import Lease

    row = Lease.objects.filter(key=SWEEPER).values_list("holder", "acquired_at").first()
    if not row or not row[0] or holder_pid(row[0]) != pgid:
        return None
    return (row[1] - since).total_seconds()


def blocked_breakdown(ids: list[int]) -> dict[str, int]:
    from django.db.models import Count

    from govflow.engine.models import Token

    rows = (
        Token.objects.filter(instance_id__gte=ids[0], instance_id__lte=ids[-1])
        .exclude(state="completed")
        .values_list("state")
        .annotate(n=Count("pk"))
    )
    return {str(state): n for state, n in rows}


def create_waiting_timers(definition, count: int) -> list[int]:
    """``count`` instances parked on the definition's timer node, as a run leaves them.

    Rows are written directly (in bulk), in the state the engine's first run leaves an
    instance in: start token completed, the timer token waiting and its timer row
    scheduled. Starting them through workers would take minutes and is not what this
    scenario measures.
    """
    from django.db import transaction
    from django.db.models.functions import Now

    from govflow.engine.models import Instance, Timer, Token

    far = dt.datetime(2099, 1, 1, tzinfo=dt.UTC)
    ids: list[int] = []
    batch = 2000
    for offset in range(0, count, batch):
        n = min(batch, count - offset)
        with transaction.atomic():
            instances = Instance.objects.bulk_create(
                Instance(
                    definition=definition,
                    definition_fp=definition.fingerprint,
                    tenant="default",
                    variables={},
                    access={},
                    status="waiting",
                    next_ordinal=3,
                    created_at=Now(),
                    updated_at=Now(),
                )
                for _ in range(n)
            )
            tokens = []
            for instance in instances:
                tokens.append(
                    Token(
                        instance=instance,
                        node_id="start",
                        ordinal=1,
                        state="completed",
                        created_at=Now(),
                        updated_at=Now(),
                    )
                )
                tokens.append(
                    Token(
                        instance=instance,
                        node_id="wait",
                        ordinal=2,
                        state="waiting",
                        wait_kind="timer",
                        created_at=Now(),
                        updated_at=Now(),
                    )
                )
            Token.objects.bulk_create(tokens)
            Timer.objects.bulk_create(
                Timer(instance=t.instance, token=t, due_at=far) for t in tokens[1::2]
            )
        ids.extend(i.pk for i in instances)
    return sorted(ids)


def make_timers_due(ids: list[int], seconds: float) -> dt.datetime:
    """Move every timer of ``ids`` to one instant ``seconds`` from now; return it."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE engine_timer SET due_at = date_trunc('milliseconds', now()) "
            "+ make_interval(secs => %s) WHERE instance_id BETWEEN %s AND %s "
            "RETURNING due_at",
            [seconds, ids[0], ids[-1]],
        )
        return cursor.fetchone()[0]


def timer_progress(ids: list[int]) -> tuple[int, int]:
    """(timers fired, instances completed)."""
    from govflow.engine.models import Instance, Timer

    fired = Timer.objects.filter(
        instance_id__gte=ids[0], instance_id__lte=ids[-1], state="fired"
    ).count()
    done = Instance.objects.filter(pk__gte=ids[0], pk__lte=ids[-1], status="completed").count()
    return fired, done


def timer_lags(ids: list[int]) -> dict[str, float]:
    """Fire lag (fired_at - due_at) in seconds, from the database.

    Also the firing commits (one per batch of timers: the transactions that wrote the
    rows) and the longest pause between two of them, from the last row one fired to the
    first the next fired: a pause is time when no sweeper was firing although timers
    were due.
    """
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY lag), "
            "percentile_cont(0.99) WITHIN GROUP (ORDER BY lag), max(lag), min(lag), count(*) "
            "FROM (SELECT extract(epoch FROM fired_at - due_at) AS lag FROM engine_timer "
            "WHERE instance_id BETWEEN %s AND %s AND fired_at IS NOT NULL) t",
            [ids[0], ids[-1]],
        )
        p50, p99, worst, best, n = cursor.fetchone()
        # A firing commit is a transaction: the rows it updated share its xmin (fired_at
        # is the database clock at each row, so it differs within one commit).
        cursor.execute(
            "SELECT count(*), coalesce(max(extract(epoch FROM first - previous)), 0) FROM ("
            "SELECT first, lag(last) OVER (ORDER BY first) AS previous FROM ("
            "SELECT min(fired_at) AS first, max(fired_at) AS last FROM engine_timer "
            "WHERE instance_id BETWEEN %s AND %s AND fired_at IS NOT NULL "
            "GROUP BY xmin::text) f) g",
            [ids[0], ids[-1]],
        )
        batches, pause = cursor.fetchone()
    return {
        "p50": float(p50),
        "p99": float(p99),
        "max": float(worst),
        "min": float(best),
        "fired": n,
        "batches": batches,
        "longest_pause": float(pause),
    }


def completed_by(ids: list[int], moment: dt.datetime) -> int:
    from govflow.engine.models import Instance

    return Instance.objects.filter(
        pk__gte=ids[0], pk__lte=ids[-1], status="completed", completed_at__lte=moment
    ).count()


def statements_one_instance(definition) -> dict:
    """Run one instance in-process and count its statements and commits by kind.

    Runs ``instance_run`` here (no cluster may be running on this database), inside
    ``CaptureQueriesContext``; the enqueue of ``instance_start`` is counted apart.
    """
    import re
    from collections import Counter

    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from django_q.models import OrmQ

    from govflow.engine.services.instances import instance_start
    from govflow.engine.services.runtime import instance_run

    with CaptureQueriesContext(connection) as start_ctx:
        instance = instance_start(definition=definition)
    with CaptureQueriesContext(connection) as run_ctx:
        report = instance_run(instance_id=instance.pk)
    OrmQ.objects.all().delete()
    kinds: Counter[str] = Counter()
    for query in run_ctx.captured_queries:
        sql = query["sql"].strip()
        verb = sql.split(None, 1)[0].upper()
        table = re.search(r'(?:FROM|INTO|UPDATE)\s+"?(\w+)"?', sql, re.IGNORECASE)
        kinds[f"{verb} {table.group(1) if table else ''}".strip()] += 1
    return {
        "steps": report.steps,
        "status": str(report.status),
        "run_statements": len(run_ctx.captured_queries),
        "run_commits": kinds.get("COMMIT", 0),
        "start_statements": len(start_ctx.captured_queries),
        "kinds": kinds.most_common(),
    }


def profile_in_process(definition, count: int, out: Path) -> dict:
    """Profile ``instance_run`` over ``count`` instances in this process (CPU clock).

    Returns wall and CPU milliseconds per step (without profiling, then with it) and
    where the CPU time goes: functions by own time, and the engine's entry points by
    cumulative time. The raw profile is written to ``out`` (pstats format).
    """
    import cProfile
    import pstats

    from django_q.models import OrmQ

    from govflow.engine.services.instances import instance_start
    from govflow.engine.services.runtime import instance_run

    def run(ids: list[int]) -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        for pk in ids:
            instance_run(instance_id=pk)
        steps = len(ids) * STEPS
        return (
            (time.perf_counter() - wall) / steps * 1000,
            (time.process_time() - cpu) / steps * 1000,
        )

    plain = [instance_start(definition=definition).pk for _ in range(count)]
    profiled = [instance_start(definition=definition).pk for _ in range(count)]
    OrmQ.objects.all().delete()
    wall_ms, cpu_ms = run(plain)
    profiler = cProfile.Profile(time.process_time)
    profiler.enable()
    run(profiled)
    profiler.disable()
    profiler.dump_stats(str(out))
    stats = pstats.Stats(profiler).stats  # {(file, line, name): (cc, nc, tt, ct, callers)}
    total = sum(entry[2] for entry in stats.values())

    def label(key) -> str:
        path, line, name = key
        for marker in ("site-packages/", "/work/main/", str(Path.cwd()) + "/"):
            if marker in path:
                path = path.split(marker, 1)[1]
        return f"{name} ({path}:{line})"

    own = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)[:10]
    ours = [kv for kv in stats.items() if "/govflow/" in kv[0][0] or "/recovery/" in kv[0][0]]
    cumulative = sorted(ours, key=lambda kv: kv[1][3], reverse=True)[:15]
    packages: dict[str, float] = {}
    for key, entry in stats.items():
        packages[_package(key[0])] = packages.get(_package(key[0]), 0.0) + entry[2]
    return {
        "instances": count,
        "wall_ms": wall_ms,
        "cpu_ms": cpu_ms,
        "own": [(entry[2] / total, label(key)) for key, entry in own],
        "packages": sorted(((t / total, p) for p, t in packages.items()), reverse=True),
        "cumulative": [(entry[3] / total, label(key)) for key, entry in cumulative],
        "file": str(out),
    }


PACKAGES = (
    ("/govflow/", "govflow (engine)"),
    ("/recovery/", "recovery (ledger)"),
    ("site-packages/psycopg", "psycopg"),
    ("site-packages/django/db/", "django.db (ORM, backend)"),
    ("site-packages/django/", "django (other)"),
    ("site-packages/jsonschema", "jsonschema"),
    ("site-packages/blake3", "blake3"),
    ("site-packages/", "other packages"),
)


def _package(path: str) -> str:
    for marker, name in PACKAGES:
        if marker in path:
            return name
    return "Python stdlib and builtins"


def db_now() -> dt.datetime:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def start_instances(definition, count: int, threads: int) -> tuple[list[int], float]:
    """Start ``count`` instances through ``instance_start`` from ``threads`` threads."""
    from django.db import connection

    from govflow.engine.services.instances import instance_start

    def start(chunk: int) -> list[int]:
        try:
            return [instance_start(definition=definition).pk for _ in range(chunk)]
        finally:
            connection.close()

    chunks = [count // threads + (1 if i < count % threads else 0) for i in range(threads)]
    began = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        ids = [pk for part in pool.map(start, chunks) for pk in part]
    return sorted(ids), time.monotonic() - began
